/* test_worker_tools.c - end-to-end: tools, tool_choice and response_format
 * on a real `spillway worker` serving a random tiny model, over HTTP.
 *
 * Forced tool calls come back in OpenAI's shape, non-stream and stream
 * (every field checked), and their arguments parse and satisfy the tool's
 * schema (checked here by hand, independently of the worker); json_schema
 * and json_object replies parse and validate; a conversation with an
 * assistant tool call and a tool result is accepted; request shapes are
 * validated with typed 400s naming the param; and a constrained stream
 * resumed after k tokens continues exactly like the uninterrupted one
 * (chunks, token ids, draws); an "auto" reply in the template's call syntax
 * becomes tool_calls (the call put in front with resume, since a random
 * model never writes one). The many-seed acceptance runs are in-process
 * (test_json_schema.c); here a few seeds per case.
 */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static char g_model[512];
static wc_worker g_w;

#define WEATHER_TOOL                                                                            \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather "  \
    "for a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"     \
    "\"string\",\"maxLength\":10},\"days\":{\"type\":\"integer\"},\"units\":{\"enum\":[\"c\"," \
    "\"f\"]}},\"required\":[\"city\",\"days\"]}}}"
#define NOOP_TOOL "{\"type\":\"function\",\"function\":{\"name\":\"noop\"}}"

static int setup(void **state)
{
    (void)state;
    return wc_worker_start_made(&g_w, "worker-tools.gguf", 11, 2048, g_model, sizeof g_model);
}

static int teardown(void **state)
{
    (void)state;
    return wc_worker_stop_made(&g_w, g_model);
}

/* POST with an X-Request-Id (the tool call ids derive from it). */
static void post_id(const char *body, const char *request_id, wc_response *r)
{
    size_t cap = strlen(body) + 512;
    char *raw = sw_malloc(cap);
    int n = snprintf(raw, cap,
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: worker\r\nContent-Type: "
                     "application/json\r\nX-Request-Id: %s\r\nContent-Length: %zu\r\nConnection: "
                     "close\r\n\r\n%s",
                     request_id, strlen(body), body);
    assert_int_equal(wc_raw(g_w.socket_path, raw, (size_t)n, 60000, r), 0);
    sw_free(raw);
}

static json_t *body_json(const wc_response *r)
{
    json_t *j = json_loads(r->body, 0, NULL);
    if (!j)
        fail_msg("not JSON: %s", r->body);
    return j;
}

/* The weather arguments: exactly the schema of WEATHER_TOOL. */
static void check_weather_args(const char *text)
{
    json_t *a = json_loads(text, 0, NULL);
    if (!json_is_object(a))
        fail_msg("arguments are not a JSON object: %s", text);
    json_t *city = json_object_get(a, "city"), *days = json_object_get(a, "days");
    json_t *units = json_object_get(a, "units");
    assert_true(json_is_string(city));
    size_t chars = 0;
    for (const char *c = json_string_value(city); *c; c++)
        chars += ((unsigned char)*c & 0xC0) != 0x80;
    assert_true(chars <= 10);
    assert_true(json_is_integer(days));
    if (units)
        assert_true(json_is_string(units) && (!strcmp(json_string_value(units), "c") ||
                                              !strcmp(json_string_value(units), "f")));
    assert_int_equal(json_object_size(a), 2 + (units != NULL));
    json_decref(a);
}

static void check_call_args(const char *name, const char *args)
{
    if (!strcmp(name, "get_weather")) {
        check_weather_args(args);
    } else {
        assert_string_equal(name, "noop");
        assert_string_equal(args, "{}");
    }
}

/* Non-stream: message {role, content null, refusal null, tool_calls [one call]}, finish
 * tool_calls. Returns the arguments (sw_free) and the name. */
static char *check_forced_reply(const wc_response *r, char *name, size_t cap)
{
    if (r->status != 200)
        fail_msg("status %d: %s", r->status, r->body);
    json_t *j = body_json(r);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls");
    json_t *msg = json_object_get(choice, "message");
    assert_int_equal(json_object_size(msg), 4);
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_true(json_is_null(json_object_get(msg, "refusal")));
    json_t *calls = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    json_t *c = json_array_get(calls, 0);
    assert_int_equal(json_object_size(c), 3);
    const char *id = json_string_value(json_object_get(c, "id"));
    assert_non_null(id);
    assert_int_equal(strncmp(id, "call_", 5), 0);
    assert_true(strlen(id) > 5);
    assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
    json_t *fn = json_object_get(c, "function");
    assert_int_equal(json_object_size(fn), 2);
    const char *nm = json_string_value(json_object_get(fn, "name"));
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    assert_non_null(nm);
    assert_non_null(args);
    check_call_args(nm, args);
    snprintf(name, cap, "%s", nm);
    char *copy = sw_strdup(args);
    json_decref(j);
    return copy;
}

static void test_forced_nonstream(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 8; seed++) {
        char body[2048], name[64], rid[32];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],"
                 "\"seed\":%d,\"max_tokens\":%d,\"tools\":[" WEATHER_TOOL "," NOOP_TOOL "],"
                 "\"tool_choice\":%s}",
                 seed, 56 + seed * 5,
                 seed % 2 ? "\"required\""
                          : "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}");
        snprintf(rid, sizeof rid, "forced-%d", seed);
        wc_response r;
        post_id(body, rid, &r);
        char *args = check_forced_reply(&r, name, sizeof name);
        if (seed % 2 == 0)
            assert_string_equal(name, "get_weather");
        sw_free(args);
        wc_response_free(&r);
    }
}

/* Stream: strict chunks. Returns the concatenated arguments (sw_free). */
static char *check_forced_stream(const wc_response *r, char *name, size_t cap, char *id,
                                 size_t id_cap, int *n_tokens)
{
    char **ev = NULL;
    assert_int_equal(r->status, 200);
    int n = wc_sse_parse(r->body, r->body_len, &ev);
    assert_true(n >= 4);
    assert_string_equal(ev[n - 1], "[DONE]");
    size_t args_len = 0;
    char *args = sw_calloc(1, 4096);
    int headers = 0;
    *n_tokens = 0;
    for (int i = 0; i < n - 1; i++) {
        json_t *c = json_loads(ev[i], 0, NULL);
        assert_non_null(c);
        assert_string_equal(json_string_value(json_object_get(c, "object")),
                            "chat.completion.chunk");
        json_t *choice = json_array_get(json_object_get(c, "choices"), 0);
        json_t *delta = json_object_get(choice, "delta");
        json_t *fin = json_object_get(choice, "finish_reason");
        *n_tokens += (int)json_array_size(
            json_object_get(json_object_get(c, "spillway"), "token_ids"));
        if (i == 0) {
            assert_int_equal(json_object_size(delta), 2);
            assert_string_equal(json_string_value(json_object_get(delta, "role")), "assistant");
            assert_true(json_is_null(json_object_get(delta, "content")));
        } else if (i == n - 2) {
            assert_string_equal(json_string_value(fin), "tool_calls");
            assert_int_equal(json_object_size(delta), 0);
        } else {
            assert_true(json_is_null(fin));
            json_t *tcs = json_object_get(delta, "tool_calls");
            assert_true(json_object_size(delta) == 0 || (json_object_size(delta) == 1 && tcs));
            if (tcs) {
                assert_int_equal(json_array_size(tcs), 1);
                json_t *tc = json_array_get(tcs, 0);
                json_t *fn = json_object_get(tc, "function");
                assert_int_equal(json_integer_value(json_object_get(tc, "index")), 0);
                assert_true(json_is_integer(json_object_get(tc, "index")));
                if (json_object_get(tc, "id")) {
                    /* the first: index, id, type, function {name, arguments} */
                    headers++;
                    assert_int_equal(headers, 1);
                    assert_int_equal(args_len, 0);
                    assert_int_equal(json_object_size(tc), 4);
                    assert_string_equal(json_string_value(json_object_get(tc, "type")),
                                        "function");
                    snprintf(id, id_cap, "%s", json_string_value(json_object_get(tc, "id")));
                    assert_int_equal(strncmp(id, "call_", 5), 0);
                    assert_int_equal(json_object_size(fn), 2);
                    snprintf(name, cap, "%s", json_string_value(json_object_get(fn, "name")));
                } else {
                    assert_int_equal(headers, 1);
                    assert_int_equal(json_object_size(tc), 2);
                    assert_int_equal(json_object_size(fn), 1);
                }
                const char *frag = json_string_value(json_object_get(fn, "arguments"));
                assert_non_null(frag);
                size_t fl = strlen(frag);
                assert_true(args_len + fl < 4096);
                memcpy(args + args_len, frag, fl);
                args_len += fl;
            }
        }
        json_decref(c);
    }
    assert_int_equal(headers, 1);
    wc_sse_free(ev, n);
    return args;
}

static void test_forced_stream(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 4; seed++) {
        char body[2048], name[64], name2[64], id[64], rid[32];
        const char *fmt = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],"
                          "\"seed\":%d,\"max_tokens\":80,\"stream\":%s,\"tools\":[" WEATHER_TOOL
                          "," NOOP_TOOL "],\"tool_choice\":\"required\"}";
        snprintf(rid, sizeof rid, "stream-%d", seed);
        wc_response r, rs;
        snprintf(body, sizeof body, fmt, seed, "false");
        post_id(body, rid, &r);
        char *want = check_forced_reply(&r, name, sizeof name);
        snprintf(body, sizeof body, fmt, seed, "true");
        post_id(body, rid, &rs);
        int n_tokens = 0;
        char *got = check_forced_stream(&rs, name2, sizeof name2, id, sizeof id, &n_tokens);
        /* the same seed gives the same call, streamed in pieces */
        assert_string_equal(name2, name);
        assert_string_equal(got, want);
        json_t *j = body_json(&r);
        const char *want_id = json_string_value(json_object_get(json_array_get(
            json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                            "message"),
                            "tool_calls"),
            0), "id"));
        assert_string_equal(id, want_id);
        assert_int_equal(n_tokens, (int)json_array_size(json_object_get(
                                       json_object_get(j, "spillway"), "token_ids")));
        json_decref(j);
        sw_free(want);
        sw_free(got);
        wc_response_free(&r);
        wc_response_free(&rs);
    }
}

/* A small validator for the json_schema case below. */
static void check_profile(const char *text)
{
    json_t *v = json_loads(text, 0, NULL);
    if (!json_is_object(v))
        fail_msg("not an object: %s", text);
    json_t *name = json_object_get(v, "name"), *tags = json_object_get(v, "tags");
    json_t *ok = json_object_get(v, "ok");
    assert_true(json_is_string(name));
    assert_true(json_string_length(name) >= 1 && json_string_length(name) <= 8 * 4);
    assert_true(json_is_array(tags) && json_array_size(tags) <= 2);
    for (size_t i = 0; i < json_array_size(tags); i++) {
        json_t *t = json_array_get(tags, i);
        assert_true(json_is_string(t));
        assert_true(!strcmp(json_string_value(t), "x") || !strcmp(json_string_value(t), "yy"));
    }
    if (ok)
        assert_true(json_is_boolean(ok));
    size_t extra = json_object_size(v) - 2 - (ok != NULL);
    assert_int_equal(extra, 0);
    json_decref(v);
}

#define PROFILE_SCHEMA                                                                          \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,"      \
    "\"maxLength\":8},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"yy\"]},"       \
    "\"maxItems\":2},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"tags\"]}"

static void test_response_format(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 6; seed++) {
        char body[2048];
        wc_response r;
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"A profile\"}],\"seed\":%d,"
                 "\"max_tokens\":%d,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                 "{\"name\":\"profile\",\"strict\":true,\"schema\":" PROFILE_SCHEMA "}}}",
                 seed, 20 + seed * 6);
        post_id(body, "rf", &r);
        assert_int_equal(r.status, 200);
        json_t *j = body_json(&r);
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "stop");
        json_t *msg = json_object_get(choice, "message");
        assert_null(json_object_get(msg, "tool_calls"));
        check_profile(json_string_value(json_object_get(msg, "content")));
        json_decref(j);
        wc_response_free(&r);

        snprintf(body, sizeof body,
                 "{\"prompt\":\"JSON:\",\"seed\":%d,\"max_tokens\":30,"
                 "\"response_format\":{\"type\":\"json_object\"}}", seed);
        assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/completions", body, 60000, &r),
                         0);
        assert_int_equal(r.status, 200);
        j = body_json(&r);
        const char *text = json_string_value(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        json_t *obj = json_loads(text, 0, NULL);
        if (!json_is_object(obj))
            fail_msg("json_object reply is not an object: %s", text);
        json_decref(obj);
        json_decref(j);
        wc_response_free(&r);
    }
}

/* A conversation with an assistant tool call and its result; then the
 * worker's answer (auto: content or a parsed call, both well-formed). */
static void test_tool_conversation(void **state)
{
    (void)state;
    const char *msgs =
        "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":"
        "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":"
        "\\\"Oslo\\\",\\\"days\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"-3 C, snow\"}]";
    char body[4096];
    int prompt_with = 0, prompt_without = 0;
    for (int with_tool = 0; with_tool < 2; with_tool++) {
        wc_response r;
        if (with_tool)
            snprintf(body, sizeof body,
                     "{\"messages\":%s,\"seed\":3,\"max_tokens\":12,\"tools\":[" WEATHER_TOOL "]}",
                     msgs);
        else
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                     "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"}],\"seed\":3,"
                     "\"max_tokens\":12,\"tools\":[" WEATHER_TOOL "]}");
        post_id(body, "conv", &r);
        assert_int_equal(r.status, 200);
        json_t *j = body_json(&r);
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        const char *fin = json_string_value(json_object_get(choice, "finish_reason"));
        json_t *msg = json_object_get(choice, "message");
        if (!strcmp(fin, "tool_calls")) {
            json_t *c = json_array_get(json_object_get(msg, "tool_calls"), 0);
            check_call_args(json_string_value(json_object_get(json_object_get(c, "function"),
                                                              "name")),
                            json_string_value(json_object_get(json_object_get(c, "function"),
                                                              "arguments")));
        } else {
            assert_true(json_is_string(json_object_get(msg, "content")));
            assert_null(json_object_get(msg, "tool_calls"));
        }
        int pt = (int)json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                         "prompt_tokens"));
        *(with_tool ? &prompt_with : &prompt_without) = pt;
        json_decref(j);
        wc_response_free(&r);
    }
    /* the call and the result are in the prompt */
    assert_true(prompt_with > prompt_without + 10);
}

static void expect_400(const char *path, const char *body, const char *code, const char *param)
{
    wc_response r;
    assert_int_equal(wc_request(g_w.socket_path, "POST", path, body, 30000, &r), 0);
    if (r.status != 400)
        fail_msg("%s: status %d: %s", body, r.status, r.body);
    json_t *j = body_json(&r);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    if (strcmp(json_string_value(json_object_get(e, "code")), code) != 0 ||
        strcmp(json_string_value(json_object_get(e, "param")), param) != 0)
        fail_msg("%s: got %s", body, r.body);
    json_decref(j);
    wc_response_free(&r);
}

static void test_bad_requests(void **state)
{
    (void)state;
    const char *chat = "/v1/chat/completions";
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[]}",
               "invalid_request", "tools");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
                     "\"function\",\"function\":{\"name\":\"bad name\"}}]}",
               "invalid_request", "tools");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":["
                     NOOP_TOOL "," NOOP_TOOL "]}",
               "invalid_request", "tools");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                     "\"tool_choice\":\"required\"}",
               "invalid_request", "tool_choice");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[" NOOP_TOOL
                     "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}",
               "invalid_request", "tool_choice");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[" NOOP_TOOL
                     "],\"tool_choice\":\"sometimes\"}",
               "invalid_request", "tool_choice");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
                     "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
                     "\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                     "\"unevaluatedProperties\":false}}}}}],\"tool_choice\":\"required\"}",
               "unsupported_schema", "tools");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
                     "{\"type\":\"xml\"}}",
               "invalid_request", "response_format");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
                     "{\"type\":\"json_schema\",\"json_schema\":{\"name\":7,\"schema\":{}}}}",
               "invalid_request", "response_format");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
                     "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
                     "{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}}}}",
               "unsupported_schema", "response_format");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":3,"
                     "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
                     "\"n\",\"schema\":" PROFILE_SCHEMA "}}}",
               "invalid_request", "max_tokens");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\","
                     "\"content\":\"r\"}]}",
               "invalid_request", "messages");
    expect_400(chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}",
               "invalid_request", "messages");
    expect_400(chat, "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
                     "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}]}",
               "invalid_request", "messages");
    expect_400("/v1/completions", "{\"prompt\":\"x\",\"tools\":[" NOOP_TOOL "]}",
               "invalid_request", "tools");
}

/* The chunks of a stream after the role chunk, without "created". */
static int stream_chunks(const wc_response *r, json_t **out, int cap)
{
    char **ev = NULL;
    int n = wc_sse_parse(r->body, r->body_len, &ev);
    assert_true(n > 2);
    int k = 0;
    for (int i = 1; i < n - 1 && k < cap; i++) {
        json_t *c = json_loads(ev[i], 0, NULL);
        assert_non_null(c);
        json_object_del(c, "created");
        out[k++] = c;
    }
    wc_sse_free(ev, n);
    return k;
}

/* A constrained stream resumed after k tokens goes on exactly like the
 * uninterrupted one: the same chunks (tool-call deltas or content), token
 * ids and the final draws. */
static void test_resume_constrained(void **state)
{
    (void)state;
    const char *const formats[] = {
        "\"tools\":[" WEATHER_TOOL "," NOOP_TOOL "],\"tool_choice\":\"required\"",
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
        "\"schema\":" PROFILE_SCHEMA "}}",
    };
    for (int f = 0; f < 2; f++) {
        char body[4096];
        const int max_tokens = 70;
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"go\"}],\"seed\":21,"
                 "\"max_tokens\":%d,\"stream\":true,%s}", max_tokens, formats[f]);
        wc_response full;
        post_id(body, "resume-me", &full);
        assert_int_equal(full.status, 200);
        json_t *chunks[256];
        int n = stream_chunks(&full, chunks, 256);
        /* the token ids, one per chunk up to the end */
        int ids[256], n_ids = 0;
        for (int i = 0; i < n; i++) {
            json_t *t = json_object_get(json_object_get(chunks[i], "spillway"), "token_ids");
            for (size_t k = 0; k < json_array_size(t); k++)
                ids[n_ids++] = (int)json_integer_value(json_array_get(t, k));
        }
        assert_true(n_ids > 20);
        const int cuts[] = {3, n_ids / 2, n_ids - 2};
        for (int c = 0; c < 3; c++) {
            int k = cuts[c];
            int len = snprintf(body, sizeof body,
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"go\"}],"
                               "\"seed\":21,\"max_tokens\":%d,\"stream\":true,%s,"
                               "\"resume\":{\"draws\":%d,\"tokens\":[",
                               max_tokens - k, formats[f], k);
            for (int i = 0; i < k; i++)
                len += snprintf(body + len, sizeof body - (size_t)len, "%s%d", i ? "," : "",
                                ids[i]);
            snprintf(body + len, sizeof body - (size_t)len, "]}}");
            wc_response part;
            post_id(body, "resume-me", &part);
            assert_int_equal(part.status, 200);
            json_t *rest[256];
            int m = stream_chunks(&part, rest, 256);
            /* chunks k.. of the full stream (one per token, then the end) */
            assert_int_equal(m, n - k);
            for (int i = 0; i < m; i++) {
                if (!json_equal(rest[i], chunks[k + i])) {
                    char *a = json_dumps(rest[i], JSON_COMPACT);
                    char *b = json_dumps(chunks[k + i], JSON_COMPACT);
                    fail_msg("format %d, resume at %d, chunk %d:\n  %s\n  %s", f, k, i, a, b);
                }
                json_decref(rest[i]);
            }
            wc_response_free(&part);
        }
        for (int i = 0; i < n; i++)
            json_decref(chunks[i]);
        wc_response_free(&full);
    }
}

/* "auto": a reply that is a call in the family's syntax (ChatML here:
 * Hermes <tool_call>) becomes tool_calls. A tiny random model never writes
 * one, so the call is put in front with `resume` (the resumed tokens are
 * part of the reply) and one more token is generated after it. */
static void test_auto_call_parsed(void **state)
{
    (void)state;
    const char *call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                       "{\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>";
    for (int variant = 0; variant < 3; variant++) {
        /* 0: non-stream, 1: stream, 2: a call of an unknown tool (plain content) */
        const char *text = call;
        if (variant == 2)
            text = "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>";
        json_t *tb = json_pack("{s:s}", "content", text);
        char *tbs = json_dumps(tb, JSON_COMPACT);
        wc_response r;
        assert_int_equal(wc_request(g_w.socket_path, "POST", "/tokenize", tbs, 30000, &r), 0);
        free(tbs);
        json_decref(tb);
        assert_int_equal(r.status, 200);
        json_t *tj = body_json(&r);
        json_t *toks = json_object_get(tj, "tokens");
        char *ids = json_dumps(toks, JSON_COMPACT);
        size_t n_ids = json_array_size(toks);
        json_decref(tj);
        wc_response_free(&r);
        char body[8192];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],\"seed\":1,"
                 "\"max_tokens\":1,\"stream\":%s,\"tools\":[" WEATHER_TOOL "],"
                 "\"resume\":{\"tokens\":%s,\"draws\":%zu}}",
                 variant == 1 ? "true" : "false", ids, n_ids);
        free(ids);
        post_id(body, "auto-call", &r);
        assert_int_equal(r.status, 200);
        json_t *calls = NULL;
        const char *finish = NULL;
        json_t *j = NULL;
        if (variant != 1) {
            j = body_json(&r);
            json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
            finish = json_string_value(json_object_get(choice, "finish_reason"));
            json_t *msg = json_object_get(choice, "message");
            calls = json_object_get(msg, "tool_calls");
            if (variant == 2) {
                assert_null(calls);
                assert_string_not_equal(finish, "tool_calls");
                assert_non_null(strstr(json_string_value(json_object_get(msg, "content")),
                                       "\"nope\""));
            } else {
                assert_true(json_is_null(json_object_get(msg, "content")));
            }
        } else {
            char **ev = NULL;
            int n = wc_sse_parse(r.body, r.body_len, &ev);
            assert_true(n >= 4);
            /* role, the one token (held back: delta {}), the calls, finish, [DONE] */
            json_t *tok_chunk = json_loads(ev[1], 0, NULL);
            assert_int_equal(json_object_size(json_object_get(
                                 json_array_get(json_object_get(tok_chunk, "choices"), 0),
                                 "delta")),
                             0);
            json_decref(tok_chunk);
            j = json_loads(ev[n - 3], 0, NULL);
            calls = json_object_get(json_object_get(
                json_array_get(json_object_get(j, "choices"), 0), "delta"), "tool_calls");
            json_t *fin = json_loads(ev[n - 2], 0, NULL);
            finish = json_string_value(json_object_get(
                json_array_get(json_object_get(fin, "choices"), 0), "finish_reason"));
            assert_string_equal(finish, "tool_calls");
            json_decref(fin);
            finish = "tool_calls";
            json_t *c0 = json_array_get(calls, 0);
            assert_int_equal(json_integer_value(json_object_get(c0, "index")), 0);
            wc_sse_free(ev, n);
        }
        if (variant != 2) {
            assert_string_equal(finish, "tool_calls");
            assert_int_equal(json_array_size(calls), 1);
            json_t *c0 = json_array_get(calls, 0);
            assert_string_equal(json_string_value(json_object_get(c0, "type")), "function");
            assert_int_equal(strncmp(json_string_value(json_object_get(c0, "id")), "call_", 5), 0);
            json_t *fn = json_object_get(c0, "function");
            assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
            assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                                "{\"city\":\"Oslo\",\"days\":2}");
        }
        json_decref(j);
        wc_response_free(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forced_nonstream),
        cmocka_unit_test(test_forced_stream),
        cmocka_unit_test(test_response_format),
        cmocka_unit_test(test_tool_conversation),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_resume_constrained),
        cmocka_unit_test(test_auto_call_parsed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
