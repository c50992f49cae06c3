/* test_worker_responses.c - end-to-end: OpenAI's Responses API (POST
 * /v1/responses) on a real `spillway worker` serving a random tiny model,
 * over HTTP.
 *
 * The translation is checked against the chat route it stands for: a
 * Responses body and the chat body it means give the same text, tokens
 * and usage (text and message-list input, instructions, developer
 * messages, content parts, a function_call / function_call_output round
 * trip). Then what a Response adds: its shape, output items (message,
 * function_call, reasoning for a thinking family, forced by a grammar as
 * in test_worker_reasoning.c), status incomplete at max_output_tokens,
 * text.format json_schema (the output parses and satisfies the schema),
 * streams (one well-formed stream whose events add up to the non-stream
 * answer, responses_check.h), bad bodies (typed 400s naming the
 * parameter, then the worker still serves) and out of memory at each of
 * a request's allocations in turn (the unfaulted answer or a typed 5xx; a
 * stream still well formed, ending failed).
 */
#include "testutil.h"
#include "responses_check.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static char g_model[512];
static wc_worker g_w, g_qwen3;

#define WEATHER_TOOL                                                                            \
    "{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Weather for a city\","  \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","       \
    "\"maxLength\":10}},\"required\":[\"city\"],\"additionalProperties\":false}}"
#define WEATHER_TOOL_CHAT                                                                       \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather " \
    "for a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"     \
    "\"string\",\"maxLength\":10}},\"required\":[\"city\"],\"additionalProperties\":false}}}"

static const char *const g_think =
    "root ::= \"<think>\\n\" [a-z]{2,8} \"\\n</think>\\n\\n\" [a-z]{1,6}\n";

static int setup(void **state)
{
    (void)state;
    if (wc_worker_start_made(&g_w, "worker-responses.gguf", 13, 2048, g_model, sizeof g_model))
        return -1;
    const char *const args[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "1024",
                                "--chat-template", "qwen3", NULL};
    return wc_worker_start(&g_qwen3, g_model, args, NULL, 30, NULL);
}

static int teardown(void **state)
{
    (void)state;
    int a = wc_worker_stop(&g_qwen3);
    int b = wc_worker_stop_made(&g_w, g_model);
    return a == 0 && b == 0 ? 0 : -1;
}

/* POSTs body to path; the parsed JSON answer (a stream: the body as a JSON
 * string), after checking the status. */
static json_t *post(const wc_worker *w, const char *path, const char *body, int want_status)
{
    wc_response r;
    assert_int_equal(wc_request(w->socket_path, "POST", path, body, 60000, &r), 0);
    if (r.status != want_status)
        fail_msg("%s: status %d, not %d: %s", path, r.status, want_status, r.body);
    json_t *j = strstr(r.headers, "text/event-stream") ? json_string(r.body)
                                                       : json_loads(r.body, 0, NULL);
    if (!j)
        fail_msg("not JSON: %s", r.body);
    wc_response_free(&r);
    return j;
}

static json_t *post_resp(const char *body)
{
    return post(&g_w, "/v1/responses", body, 200);
}

/* The fields a Response has (OpenAI's reference marks them required). */
static void check_response_shape(const json_t *r)
{
    assert_string_equal(json_string_value(json_object_get(r, "object")), "response");
    assert_int_equal(strncmp(json_string_value(json_object_get(r, "id")), "resp_", 5), 0);
    assert_true(json_is_integer(json_object_get(r, "created_at")));
    assert_true(json_is_string(json_object_get(r, "model")));
    assert_true(json_is_array(json_object_get(r, "output")));
    assert_true(json_is_array(json_object_get(r, "tools")));
    assert_non_null(json_object_get(r, "tool_choice"));
    assert_non_null(json_object_get(r, "error"));
    assert_non_null(json_object_get(r, "incomplete_details"));
    assert_true(json_is_boolean(json_object_get(r, "parallel_tool_calls")));
    json_t *u = json_object_get(r, "usage");
    json_int_t in = json_integer_value(json_object_get(u, "input_tokens"));
    json_int_t out = json_integer_value(json_object_get(u, "output_tokens"));
    assert_true(in > 0);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), in + out);
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(r, "output"), i, item) {
        assert_true(json_is_string(json_object_get(item, "id")));
        const char *type = json_string_value(json_object_get(item, "type"));
        assert_non_null(type);
        if (!strcmp(type, "message")) {
            assert_string_equal(json_string_value(json_object_get(item, "role")), "assistant");
            json_t *part = json_array_get(json_object_get(item, "content"), 0);
            assert_string_equal(json_string_value(json_object_get(part, "type")), "output_text");
            assert_true(json_is_string(json_object_get(part, "text")));
            assert_true(json_is_array(json_object_get(part, "annotations")));
        } else if (!strcmp(type, "function_call")) {
            assert_true(json_is_string(json_object_get(item, "call_id")));
            assert_true(json_is_string(json_object_get(item, "name")));
            assert_true(json_is_string(json_object_get(item, "arguments")));
        } else {
            assert_string_equal(type, "reasoning");
            assert_true(json_is_array(json_object_get(item, "summary")));
        }
    }
}

static const char *chat_text(const json_t *chat)
{
    json_t *msg = json_object_get(json_array_get(json_object_get(chat, "choices"), 0), "message");
    return json_string_value(json_object_get(msg, "content"));
}

static void check_usage_equal(const json_t *resp, const json_t *chat)
{
    json_t *u = json_object_get(resp, "usage"), *cu = json_object_get(chat, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "input_tokens")),
                     json_integer_value(json_object_get(cu, "prompt_tokens")));
    assert_int_equal(json_integer_value(json_object_get(u, "output_tokens")),
                     json_integer_value(json_object_get(cu, "completion_tokens")));
}

/* A string input is one user message; max_output_tokens ends it as
 * incomplete; the text and usage are the chat route's. */
static void test_text_input(void **state)
{
    (void)state;
    json_t *r = post_resp("{\"input\":\"Once upon a time\",\"max_output_tokens\":16,"
                          "\"temperature\":0,\"ignore_eos\":true}");
    check_response_shape(r);
    assert_string_equal(json_string_value(json_object_get(r, "status")), "incomplete");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(r, "incomplete_details"), "reason")),
                        "max_output_tokens");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "usage"),
                                                        "output_tokens")),
                     16);
    assert_int_equal(json_integer_value(json_object_get(r, "max_output_tokens")), 16);
    json_t *c = post(&g_w, "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
                     "\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true}",
                     200);
    char text[4096];
    rc_response_text(r, text, sizeof text);
    assert_string_equal(text, chat_text(c));
    assert_true(strlen(text) > 0);
    check_usage_equal(r, c);
    json_decref(r);
    json_decref(c);
}

/* The prompt tokens the prefix cache supplied: none the first time, the
 * repeated prompt's blocks the second, as input_tokens_details. */
static void test_cached_tokens(void **state)
{
    (void)state;
    const char *body = "{\"input\":\"The quick brown fox jumps over the lazy dog while the "
                       "small cat watches from the old wooden fence and the farmer counts his "
                       "sheep one by one before the long night falls over the quiet valley.\","
                       "\"instructions\":\"Answer as a storyteller would, at length.\","
                       "\"max_output_tokens\":4,\"temperature\":0}";
    json_t *first = post_resp(body), *again = post_resp(body);
    json_t *u1 = json_object_get(first, "usage"), *u2 = json_object_get(again, "usage");
    json_int_t in = json_integer_value(json_object_get(u2, "input_tokens"));
    json_int_t cached = json_integer_value(
        json_object_get(json_object_get(u2, "input_tokens_details"), "cached_tokens"));
    assert_true(cached > 0);
    assert_true(cached < in);
    assert_true(json_integer_value(json_object_get(
                    json_object_get(u1, "input_tokens_details"), "cached_tokens")) < cached);
    json_decref(first);
    json_decref(again);
}

/* A message list with instructions, a developer message and content
 * parts: the chat route's system messages and parts. */
static void test_message_list(void **state)
{
    (void)state;
    json_t *r = post_resp(
        "{\"instructions\":\"You are a test.\",\"input\":[{\"role\":\"developer\",\"content\":"
        "\"Be brief.\"},{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":"
        "\"input_text\",\"text\":\"Tell\"},{\"type\":\"input_text\",\"text\":\" a story\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Once\"}]},"
        "{\"role\":\"user\",\"content\":\"Go on\"}],\"max_output_tokens\":12,\"seed\":4}");
    check_response_shape(r);
    assert_string_equal(json_string_value(json_object_get(r, "instructions")), "You are a test.");
    json_t *c = post(&g_w, "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"system\",\"content\":\"You are a test.\"},"
                     "{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
                     "\"content\":[{\"type\":\"text\",\"text\":\"Tell\"},{\"type\":\"text\","
                     "\"text\":\" a story\"}]},{\"role\":\"assistant\",\"content\":\"Once\"},"
                     "{\"role\":\"user\",\"content\":\"Go on\"}],\"max_tokens\":12,\"seed\":4}",
                     200);
    char text[4096];
    rc_response_text(r, text, sizeof text);
    assert_string_equal(text, chat_text(c));
    check_usage_equal(r, c);
    json_decref(r);
    json_decref(c);
}

/* The stream: well formed, and its events add up to the whole answer of
 * the same seed. */
static void test_stream(void **state)
{
    (void)state;
    const char *base = "{\"input\":\"Once upon a time\",\"max_output_tokens\":20,\"seed\":9";
    char b[256];
    snprintf(b, sizeof b, "%s}", base);
    json_t *whole = post_resp(b);
    snprintf(b, sizeof b, "%s,\"stream\":true}", base);
    json_t *s = post_resp(b);
    rc_stream st;
    rc_stream_check(json_string_value(s), &st);
    char text[4096];
    rc_response_text(whole, text, sizeof text);
    assert_string_equal(st.text, text);
    const char *status = json_string_value(json_object_get(whole, "status"));
    assert_string_equal(st.final_type + 9, status);
    assert_true(rc_usage_same(st.response, whole));
    assert_int_equal(json_array_size(json_object_get(st.response, "output")),
                     json_array_size(json_object_get(whole, "output")));
    check_response_shape(st.response);
    rc_stream_free(&st);
    json_decref(s);
    json_decref(whole);
}

/* A forced function call, whole and streamed; then its output sent back
 * (function_call and function_call_output items) is the chat route's
 * assistant tool_calls and tool message. */
static void test_function_call_round_trip(void **state)
{
    (void)state;
    const char *base = "{\"input\":\"Weather in Paris?\",\"tools\":[" WEATHER_TOOL "],"
                       "\"tool_choice\":{\"type\":\"function\",\"name\":\"get_weather\"},"
                       "\"max_output_tokens\":80,\"seed\":3";
    char b[2048];
    snprintf(b, sizeof b, "%s}", base);
    json_t *r = post_resp(b);
    check_response_shape(r);
    assert_string_equal(json_string_value(json_object_get(r, "status")), "completed");
    json_t *out = json_object_get(r, "output");
    assert_int_equal(json_array_size(out), 1);
    json_t *call = json_array_get(out, 0);
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function_call");
    assert_string_equal(json_string_value(json_object_get(call, "name")), "get_weather");
    const char *call_id = json_string_value(json_object_get(call, "call_id"));
    assert_int_equal(strncmp(call_id, "call_", 5), 0);
    const char *args = json_string_value(json_object_get(call, "arguments"));
    json_t *a = json_loads(args, 0, NULL);
    assert_true(json_is_string(json_object_get(a, "city")));
    assert_int_equal(json_object_size(a), 1);
    json_decref(a);

    snprintf(b, sizeof b, "%s,\"stream\":true}", base);
    json_t *s = post_resp(b);
    rc_stream st;
    rc_stream_check(json_string_value(s), &st);
    assert_string_equal(st.final_type, "response.completed");
    assert_int_equal(st.n_items, 1);
    json_t *scall = json_array_get(json_object_get(st.response, "output"), 0);
    assert_string_equal(json_string_value(json_object_get(scall, "arguments")), args);
    assert_string_equal(json_string_value(json_object_get(scall, "name")), "get_weather");
    rc_stream_free(&st);
    json_decref(s);

    /* the round trip */
    json_t *jargs = json_string(args);
    char *qargs = json_dumps(jargs, JSON_ENCODE_ANY);
    json_decref(jargs);
    snprintf(b, sizeof b,
             "{\"input\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"type\":"
             "\"function_call\",\"call_id\":\"%s\",\"name\":\"get_weather\",\"arguments\":%s},"
             "{\"type\":\"function_call_output\",\"call_id\":\"%s\",\"output\":\"sunny, 21 C\"}],"
             "\"tools\":[" WEATHER_TOOL "],\"tool_choice\":\"none\",\"max_output_tokens\":10,"
             "\"temperature\":0,\"ignore_eos\":true}",
             call_id, qargs, call_id);
    json_t *r2 = post_resp(b);
    check_response_shape(r2);
    json_t *item = json_array_get(json_object_get(r2, "output"), 0);
    assert_string_equal(json_string_value(json_object_get(item, "type")), "message");
    char cb[2048];
    snprintf(cb, sizeof cb,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":"
             "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"%s\",\"type\":\"function\","
             "\"function\":{\"name\":\"get_weather\",\"arguments\":%s}}]},{\"role\":\"tool\","
             "\"tool_call_id\":\"%s\",\"content\":\"sunny, 21 C\"}],\"tools\":[" WEATHER_TOOL_CHAT
             "],\"tool_choice\":\"none\",\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true}",
             call_id, qargs, call_id);
    json_t *c = post(&g_w, "/v1/chat/completions", cb, 200);
    char text[4096];
    rc_response_text(r2, text, sizeof text);
    assert_string_equal(text, chat_text(c));
    check_usage_equal(r2, c);
    free(qargs);
    json_decref(c);
    json_decref(r2);
    json_decref(r);
}

/* text.format json_schema: the text parses and satisfies the schema. */
static void test_json_schema(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 3; seed++) {
        for (int stream = 0; stream < 2; stream++) {
            char b[1024];
            snprintf(b, sizeof b,
                     "{\"input\":\"A person, as JSON\",\"max_output_tokens\":120,\"seed\":%d,"
                     "\"stream\":%s,\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":"
                     "\"person\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":"
                     "{\"name\":{\"type\":\"string\",\"maxLength\":8},\"age\":{\"type\":"
                     "\"integer\"}},\"required\":[\"name\",\"age\"],\"additionalProperties\":"
                     "false}}}}",
                     seed, stream ? "true" : "false");
            json_t *r = post_resp(b);
            char text[4096];
            json_t *resp = r;
            rc_stream st;
            memset(&st, 0, sizeof st);
            if (stream) {
                rc_stream_check(json_string_value(r), &st);
                resp = st.response;
            }
            check_response_shape(resp);
            assert_string_equal(json_string_value(json_object_get(resp, "status")), "completed");
            assert_string_equal(json_string_value(json_object_get(
                                    json_object_get(json_object_get(resp, "text"), "format"),
                                    "type")),
                                "json_schema");
            rc_response_text(resp, text, sizeof text);
            json_t *v = json_loads(text, 0, NULL);
            if (!json_is_object(v))
                fail_msg("seed %d: not a JSON object: %s", seed, text);
            assert_true(json_is_string(json_object_get(v, "name")));
            assert_true(json_is_integer(json_object_get(v, "age")));
            assert_int_equal(json_object_size(v), 2);
            json_decref(v);
            rc_stream_free(&st);
            json_decref(r);
        }
    }
}

/* A thinking family's reply: a reasoning item before the message, whole
 * and streamed alike. */
static void test_reasoning(void **state)
{
    (void)state;
    for (int seed = 1; seed <= 2; seed++) {
        char b[512];
        json_t *g = json_string(g_think);
        char *qg = json_dumps(g, JSON_ENCODE_ANY);
        json_decref(g);
        snprintf(b, sizeof b,
                 "{\"input\":\"think\",\"max_output_tokens\":60,\"seed\":%d,\"temperature\":1,"
                 "\"grammar\":%s}",
                 seed, qg);
        json_t *r = post(&g_qwen3, "/v1/responses", b, 200);
        check_response_shape(r);
        json_t *out = json_object_get(r, "output");
        assert_int_equal(json_array_size(out), 2);
        json_t *rs = json_array_get(out, 0);
        assert_string_equal(json_string_value(json_object_get(rs, "type")), "reasoning");
        json_t *part = json_array_get(json_object_get(rs, "content"), 0);
        assert_string_equal(json_string_value(json_object_get(part, "type")), "reasoning_text");
        const char *thought = json_string_value(json_object_get(part, "text"));
        assert_true(strlen(thought) >= 2 && !strchr(thought, '<'));
        char text[512];
        rc_response_text(r, text, sizeof text);
        assert_true(strlen(text) >= 1 && !strchr(text, '<'));

        snprintf(b, sizeof b,
                 "{\"input\":\"think\",\"max_output_tokens\":60,\"seed\":%d,\"temperature\":1,"
                 "\"grammar\":%s,\"stream\":true}",
                 seed, qg);
        free(qg);
        json_t *s = post(&g_qwen3, "/v1/responses", b, 200);
        rc_stream st;
        rc_stream_check(json_string_value(s), &st);
        assert_string_equal(st.reasoning, thought);
        assert_string_equal(st.text, text);
        assert_int_equal(st.n_items, 2);
        rc_stream_free(&st);
        json_decref(s);
        json_decref(r);
    }
}

/* Bad bodies: typed 400s naming the parameter; the worker serves on. */
static void test_bad_input(void **state)
{
    (void)state;
    static const struct {
        const char *body, *param;
    } cases[] = {
        {"{}", "input"},
        {"{\"input\":5}", "input"},
        {"{\"input\":[]}", "input"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
         "\"image_url\":\"https://x/y.png\"}]}]}",
         "input[0].content"},
        {"{\"input\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "input[0].role"},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input[0].type"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}", "input[0]"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\"}]}",
         "input[0]"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0]"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0]"},
        {"{\"input\":\"x\",\"tool_choice\":{\"type\":\"file_search\"}}", "tool_choice"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\"}}}",
         "text.format.schema"},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
        {"{\"input\":\"x\",\"max_output_tokens\":\"many\"}", "max_output_tokens"},
        {"{\"input\":\"x\",\"instructions\":7}", "instructions"},
        {"{\"input\":\"x\",\"stream\":\"yes\"}", "stream"},
        {"{\"input\":\"x\",\"conversation\":\"conv_1\"}", "conversation"},
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
        {"{\"input\":\"x\",\"background\":true}", "background"},
        {"{\"input\":\"x\",\"temperature\":\"hot\"}", "temperature"},
        {"[1,2]", NULL},
        /* the chat route's refusals name the Responses parameter */
        {"{\"input\":\"x\",\"tools\":[" WEATHER_TOOL "],\"tool_choice\":\"required\","
         "\"max_output_tokens\":3}",
         "max_output_tokens"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
         "\"schema\":{\"type\":\"nonsense\"}}}}",
         "text.format"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *e = post(&g_w, "/v1/responses", cases[i].body, 400);
        json_t *err = json_object_get(e, "error");
        assert_string_equal(json_string_value(json_object_get(err, "type")),
                            "invalid_request_error");
        assert_true(json_is_string(json_object_get(err, "message")));
        if (cases[i].param) {
            const char *p = json_string_value(json_object_get(err, "param"));
            if (!p || strcmp(p, cases[i].param))
                fail_msg("%s: param %s, not %s", cases[i].body, p ? p : "null", cases[i].param);
        }
        json_decref(e);
    }
    wc_response w;
    assert_int_equal(wc_request(g_w.socket_path, "POST", "/v1/responses", "{\"input\":", 10000,
                                &w), 0);
    assert_int_equal(w.status, 400);
    wc_response_free(&w);
    assert_int_equal(wc_request(g_w.socket_path, "GET", "/v1/responses", NULL, 10000, &w), 0);
    assert_int_equal(w.status, 405);
    wc_response_free(&w);
    json_t *r = post_resp("{\"input\":\"still here\",\"max_output_tokens\":4}");
    check_response_shape(r);
    json_decref(r);
}

/* One POST /v1/responses with X-Spillway-Fault: alloc_fail_after:N (N < 0:
 * counted, nothing failed). */
static void post_fault(const wc_worker *w, const char *body, long n, wc_response *out)
{
    char raw[4096];
    int len = snprintf(raw, sizeof raw,
                       "POST /v1/responses HTTP/1.1\r\nHost: worker\r\nContent-Type: "
                       "application/json\r\nX-Spillway-Fault: alloc_fail_after:%ld\r\n"
                       "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                       n, strlen(body), body);
    assert_true(len > 0 && (size_t)len < sizeof raw);
    assert_int_equal(wc_raw(w->socket_path, raw, (size_t)len, 60000, out), 0);
}

/* Out of memory at every allocation the request's thread makes, whole
 * and streamed: the answer is the unfaulted one or a typed 5xx, a stream
 * stays one well-formed stream (ending failed, its sequence numbers
 * without a gap), and the worker serves on and exits cleanly. */
static void test_out_of_memory(void **state)
{
    (void)state;
    static const char *const args[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit",
                                       "1024", "--no-calibrate", NULL};
    static const char *const env[] = {"SPILLWAY_FAULT=fault_header:1", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, g_model, args, env, 60, NULL), 0);
    static const char *const bodies[] = {
        "{\"input\":\"Once upon a time\",\"max_output_tokens\":5,\"seed\":3,"
        "\"instructions\":\"Be brief.\"}",
        "{\"input\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
        "\"max_output_tokens\":5,\"seed\":3,\"stream\":true}",
    };
    for (int b = 0; b < 2; b++) {
        bool stream = b == 1;
        wc_response ref;
        post_fault(&w, bodies[b], -1, &ref);
        assert_int_equal(ref.status, 200);
        char want[8192];
        if (stream) {
            rc_stream st;
            rc_stream_check(ref.body, &st);
            snprintf(want, sizeof want, "%s", st.text);
            rc_stream_free(&st);
        } else {
            json_t *j = json_loads(ref.body, 0, NULL);
            rc_response_text(j, want, sizeof want);
            json_decref(j);
        }
        wc_response_free(&ref);
        long total = rh_metric(w.socket_path, "spillway_fault_scope_allocations");
        assert_true(total > 0);
        int same = 0, failed = 0;
        for (long n = 0; n < total; n++) {
            wc_response r;
            post_fault(&w, bodies[b], n, &r);
            if (r.status == 200 && stream && strstr(r.headers, "text/event-stream")) {
                rc_stream st;
                rc_stream_check(r.body, &st);
                if (!strcmp(st.final_type, "response.failed")) {
                    failed++;
                    assert_string_equal(json_string_value(json_object_get(
                                            json_object_get(st.response, "error"), "code")),
                                        "internal_error");
                } else {
                    same++;
                    assert_string_equal(st.text, want);
                }
                rc_stream_free(&st);
            } else if (r.status == 200) {
                json_t *j = json_loads(r.body, 0, NULL);
                if (!j)
                    fail_msg("allocation %ld: a 200 that is not JSON: %s", n, r.body);
                char text[8192];
                assert_string_equal(json_string_value(json_object_get(j, "object")), "response");
                rc_response_text(j, text, sizeof text);
                assert_string_equal(text, want);
                json_decref(j);
                same++;
            } else {
                if (r.status < 500)
                    fail_msg("allocation %ld: status %d: %s", n, r.status, r.body);
                json_t *j = json_loads(r.body, 0, NULL);
                if (!json_is_object(json_object_get(j, "error")))
                    fail_msg("allocation %ld: a %d without its error: %s", n, r.status, r.body);
                json_decref(j);
                failed++;
            }
            wc_response_free(&r);
        }
        assert_true(failed > 0);
        /* and after all that, the same answer */
        wc_response r;
        post_fault(&w, bodies[b], -1, &r);
        assert_int_equal(r.status, 200);
        wc_response_free(&r);
        (void)same;
    }
    assert_int_equal(wc_worker_stop(&w), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_input),
        cmocka_unit_test(test_cached_tokens),
        cmocka_unit_test(test_message_list),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_function_call_round_trip),
        cmocka_unit_test(test_json_schema),
        cmocka_unit_test(test_reasoning),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
