/* test_compat.c - what OpenAI clients (and those written for llama-server
 * and vLLM) expect of the answers, on a real worker and through a real
 * router over their sockets: prompt and generated tokens never exceed the
 * context (the last one ends "length"), a context error counts the prompt
 * alone, chat logprobs carry refusal: null, ids are chatcmpl-/cmpl-, a
 * system_fingerprint, json_schema without a name, echo, n > 1 choices
 * (streamed and not), the worker's --alias, and the router's
 * invalid_api_key, request_too_large and /tokenize. */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CTX 256

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "compat.gguf", 17);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    remove(g_model);
    return 0;
}

/* Where requests go: a worker's socket, or a router's. */
typedef struct target {
    const char *sock;
    const rh_router *router; /* NULL: a worker */
} target;

static void post_h(const target *t, const char *path, const char *headers, const char *body,
                   wc_response *w)
{
    if (t->router) {
        assert_int_equal(rh_req(t->router, "POST", path, headers, body, w), 0);
        return;
    }
    char *raw = sw_malloc(strlen(body) + 1024);
    assert_non_null(raw);
    int n = sprintf(raw,
                    "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: %zu"
                    "\r\n\r\n%s",
                    path, headers ? headers : "", strlen(body), body);
    assert_int_equal(wc_raw(t->sock, raw, (size_t)n, 60000, w), 0);
    sw_free(raw);
}

static json_t *post_json(const target *t, const char *path, const char *body, int status)
{
    wc_response w;
    post_h(t, path, NULL, body, &w);
    if (w.status != status)
        fail_msg("%s %s: status %d, expected %d: %s", path, body, w.status, status, w.body);
    json_t *j = json_loads(w.body, 0, NULL);
    assert_non_null(j);
    wc_response_free(&w);
    return j;
}

/* A prompt of n token ids (1..n, each below the vocabulary). */
static char *ids_prompt(int n)
{
    char *s = sw_malloc((size_t)n * 6 + 16);
    assert_non_null(s);
    size_t at = (size_t)sprintf(s, "[");
    for (int i = 0; i < n; i++)
        at += (size_t)sprintf(s + at, "%s%d", i ? "," : "", 3 + i % 1000);
    sprintf(s + at, "]");
    return s;
}

static json_t *usage_of(json_t *j)
{
    return json_object_get(j, "usage");
}

static long long usage_int(json_t *j, const char *key)
{
    return json_integer_value(json_object_get(usage_of(j), key));
}

static const char *finish_of(json_t *j)
{
    return json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason"));
}

/* ---- 1 and 2: the context's last token, and the count in the error ---- */

static void check_context(const target *t)
{
    char body[4096];
    char *p8 = ids_prompt(8);
    /* max_tokens past the context: the generation ends when prompt +
     * generated fill it (8 + 248 = 256), finish "length" */
    const int asks[] = {249, 248, 1000};
    for (size_t k = 0; k < sizeof asks / sizeof asks[0]; k++) {
        for (int stream = 0; stream < 2; stream++) {
            snprintf(body, sizeof body,
                     "{\"prompt\":%s,\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0,"
                     "\"stream\":%s}",
                     p8, asks[k], stream ? "true" : "false");
            wc_response w;
            post_h(t, "/v1/completions", NULL, body, &w);
            assert_int_equal(w.status, 200);
            int ids[CTX + 8];
            char finish[32];
            int n = wc_tokens_of(&w, stream, ids, CTX + 8, NULL, finish, sizeof finish);
            assert_int_equal(n, CTX - 8);
            assert_string_equal(finish, "length");
            wc_response_free(&w);
        }
    }
    /* one below the boundary: max_tokens itself ends it */
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":247,\"ignore_eos\":true,\"temperature\":0}", p8);
    json_t *j = post_json(t, "/v1/completions", body, 200);
    assert_int_equal(usage_int(j, "completion_tokens"), 247);
    assert_int_equal(usage_int(j, "total_tokens"), 255);
    json_decref(j);
    sw_free(p8);

    /* a chat without max_tokens reaches the context exactly */
    j = post_json(t, "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"ignore_eos\":true,"
                  "\"temperature\":0}",
                  200);
    assert_int_equal(usage_int(j, "total_tokens"), CTX);
    assert_string_equal(finish_of(j), "length");
    json_decref(j);

    /* 102 + max_tokens 200 > 256 is not refused: 154 tokens, "length" */
    char *p102 = ids_prompt(102);
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":200,\"ignore_eos\":true,\"temperature\":0}", p102);
    j = post_json(t, "/v1/completions", body, 200);
    assert_int_equal(usage_int(j, "prompt_tokens"), 102);
    assert_int_equal(usage_int(j, "completion_tokens"), CTX - 102);
    assert_string_equal(finish_of(j), "length");
    json_decref(j);
    sw_free(p102);

    /* a prompt that fills the context: no room for one token (400, the
     * prompt's own count); with max_tokens 0 it is answered */
    char *p256 = ids_prompt(CTX);
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":200}", p256);
    j = post_json(t, "/v1/completions", body, 400);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "context_length_exceeded");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "prompt");
    const char *msg = json_string_value(json_object_get(e, "message"));
    if (!strstr(msg, "the prompt has 256 tokens") || strstr(msg, "456"))
        fail_msg("message: %s", msg);
    json_decref(j);
    if (!t->router) { /* the router refuses it before a worker sees it */
        snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":0}", p256);
        j = post_json(t, "/v1/completions", body, 200);
        assert_int_equal(usage_int(j, "completion_tokens"), 0);
        assert_string_equal(finish_of(j), "length");
        json_decref(j);
    }
    sw_free(p256);
    char *p300 = ids_prompt(300);
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":200}", p300);
    j = post_json(t, "/v1/completions", body, 400);
    msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    if (!strstr(msg, "the prompt has 300 tokens") || strstr(msg, "500"))
        fail_msg("message: %s", msg);
    json_decref(j);
    sw_free(p300);
}

/* ---- 3 and 5: the answers' shape ---- */

static void check_shape(const target *t)
{
    /* the developer role is the system role: the same prompt, the same
     * greedy reply */
    const char *chat = "{\"messages\":[{\"role\":\"%s\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,"
                       "\"temperature\":0}";
    char body[512];
    json_t *as[2];
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body, chat, k ? "developer" : "system");
        as[k] = post_json(t, "/v1/chat/completions", body, 200);
    }
    assert_true(json_equal(json_object_get(json_object_get(as[0], "usage"), "prompt_tokens"),
                           json_object_get(json_object_get(as[1], "usage"), "prompt_tokens")));
    assert_true(json_equal(json_object_get(json_array_get(json_object_get(as[0], "choices"), 0),
                                           "message"),
                           json_object_get(json_array_get(json_object_get(as[1], "choices"), 0),
                                           "message")));
    json_decref(as[0]);
    json_decref(as[1]);
    snprintf(body, sizeof body, chat, "narrator");
    json_decref(post_json(t, "/v1/chat/completions", body, 400));

    /* chat logprobs: refusal null beside content, streamed and not */
    json_t *j = post_json(t, "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,"
                          "\"logprobs\":true}",
                          200);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    json_t *lp = json_object_get(choice, "logprobs");
    assert_int_equal(json_array_size(json_object_get(lp, "content")), 3);
    assert_true(json_is_null(json_object_get(lp, "refusal")));
    const char *fp = json_string_value(json_object_get(j, "system_fingerprint"));
    assert_non_null(fp);
    assert_true(strncmp(fp, "spillway-", 9) == 0);
    char fingerprint[64];
    snprintf(fingerprint, sizeof fingerprint, "%s", fp);
    assert_true(strncmp(json_string_value(json_object_get(j, "id")), "chatcmpl-", 9) == 0);
    json_decref(j);

    wc_response w;
    post_h(t, "/v1/chat/completions", NULL,
           "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,"
           "\"logprobs\":true,\"stream\":true}",
           &w);
    assert_int_equal(w.status, 200);
    char **evs = NULL;
    int ne = wc_sse_parse(w.body, w.body_len, &evs);
    assert_true(ne >= 5);
    int with_lp = 0;
    for (int i = 0; i < ne - 1; i++) {
        json_t *c = json_loads(evs[i], 0, NULL);
        assert_non_null(c);
        assert_string_equal(json_string_value(json_object_get(c, "system_fingerprint")),
                            fingerprint);
        assert_true(strncmp(json_string_value(json_object_get(c, "id")), "chatcmpl-", 9) == 0);
        json_t *l = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs");
        if (json_is_object(l)) {
            with_lp++;
            assert_int_equal(json_array_size(json_object_get(l, "content")), 1);
            assert_non_null(json_object_get(l, "refusal"));
            assert_true(json_is_null(json_object_get(l, "refusal")));
        }
        json_decref(c);
    }
    assert_int_equal(with_lp, 3);
    wc_sse_free(evs, ne);
    wc_response_free(&w);

    /* the body's id: cmpl- and the request id; X-Request-Id as it was */
    post_h(t, "/v1/completions", "X-Request-Id: compat-id-7\r\n",
           "{\"prompt\":\"Hi\",\"max_tokens\":2}", &w);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Request-Id", "compat-id-7");
    j = json_loads(w.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "cmpl-compat-id-7");
    assert_string_equal(json_string_value(json_object_get(j, "system_fingerprint")), fingerprint);
    json_decref(j);
    wc_response_free(&w);
    if (t->router) { /* the router's own request id, behind cmpl- */
        post_h(t, "/v1/completions", NULL, "{\"prompt\":\"Hi\",\"max_tokens\":2}", &w);
        char rid[128], want[160];
        assert_true(wc_header(&w, "X-Request-Id", rid, sizeof rid));
        assert_true(strncmp(rid, "req-", 4) == 0);
        snprintf(want, sizeof want, "cmpl-%s", rid);
        j = json_loads(w.body, 0, NULL);
        assert_string_equal(json_string_value(json_object_get(j, "id")), want);
        json_decref(j);
        wc_response_free(&w);
    }

    /* json_schema without a name is taken */
    j = post_json(t, "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":40,"
                  "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":"
                  "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}},"
                  "\"required\":[\"a\"]}}}}",
                  200);
    const char *content = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
    json_t *value = json_loads(content, 0, NULL);
    assert_true(json_is_boolean(json_object_get(value, "a")));
    json_decref(value);
    json_decref(j);

    /* echo: the prompt's text before the completion's */
    j = post_json(t, "/v1/completions",
                  "{\"prompt\":\"Once upon\",\"max_tokens\":3,\"temperature\":0,\"echo\":true}",
                  200);
    const char *text = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    json_t *plain = post_json(t, "/v1/completions",
                              "{\"prompt\":\"Once upon\",\"max_tokens\":3,\"temperature\":0}", 200);
    const char *ptext = json_string_value(
        json_object_get(json_array_get(json_object_get(plain, "choices"), 0), "text"));
    char want[512];
    snprintf(want, sizeof want, "Once upon%s", ptext);
    assert_string_equal(text, want);
    assert_int_equal(usage_int(j, "completion_tokens"), 3);
    json_decref(j);
    /* streamed: its first chunk is the prompt's text, the rest as without */
    post_h(t, "/v1/completions", NULL,
           "{\"prompt\":\"Once upon\",\"max_tokens\":3,\"temperature\":0,\"echo\":true,"
           "\"stream\":true}",
           &w);
    assert_int_equal(w.status, 200);
    ne = wc_sse_parse(w.body, w.body_len, &evs);
    assert_true(ne >= 3);
    char all[512] = "";
    for (int i = 0; i < ne - 1; i++) {
        json_t *c = json_loads(evs[i], 0, NULL);
        const char *piece = json_string_value(
            json_object_get(json_array_get(json_object_get(c, "choices"), 0), "text"));
        if (i == 0)
            assert_string_equal(piece, "Once upon");
        if (piece)
            strncat(all, piece, sizeof all - strlen(all) - 1);
        json_decref(c);
    }
    assert_string_equal(all, want);
    wc_sse_free(evs, ne);
    wc_response_free(&w);
    json_decref(plain);
    /* echo of token ids: their text; echo with logprobs: a clear 400 */
    j = post_json(t, "/v1/completions", "{\"prompt\":[5,6,7],\"max_tokens\":1,\"echo\":true}", 200);
    text = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    assert_true(strlen(text) > 0);
    json_decref(j);
    j = post_json(t, "/v1/completions",
                  "{\"prompt\":\"Hi\",\"max_tokens\":1,\"echo\":true,\"logprobs\":1}", 400);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(j, "error"), "param")), "echo");
    json_decref(j);
}

/* ---- 4: n > 1 ---- */

static const char *text_of(json_t *choice, bool chat)
{
    return chat ? json_string_value(json_object_get(json_object_get(choice, "message"), "content"))
                : json_string_value(json_object_get(choice, "text"));
}

static void check_choices(const target *t)
{
    /* non-stream: n choices, each its index; choice i draws with seed + i
     * (so choice 1 of seed 5 is the n = 1 answer of seed 6); usage sums */
    json_t *j = post_json(t, "/v1/completions",
                          "{\"prompt\":\"Once upon\",\"max_tokens\":6,\"n\":4,\"seed\":5,"
                          "\"ignore_eos\":true}",
                          200);
    json_t *choices = json_object_get(j, "choices");
    assert_int_equal(json_array_size(choices), 4);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(json_integer_value(json_object_get(json_array_get(choices, i), "index")),
                         (json_int_t)i);
    assert_int_equal(usage_int(j, "completion_tokens"), 24);
    assert_int_equal(usage_int(j, "total_tokens"), usage_int(j, "prompt_tokens") + 24);
    json_t *one = post_json(t, "/v1/completions",
                            "{\"prompt\":\"Once upon\",\"max_tokens\":6,\"seed\":6,"
                            "\"ignore_eos\":true}",
                            200);
    assert_string_equal(text_of(json_array_get(choices, 1), false),
                        text_of(json_array_get(json_object_get(one, "choices"), 0), false));
    json_decref(one);
    /* the four seeds drew four different continuations here */
    assert_true(strcmp(text_of(json_array_get(choices, 0), false),
                       text_of(json_array_get(choices, 1), false)) != 0);
    json_decref(j);

    /* greedy: every choice is the same answer */
    j = post_json(t, "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":5,"
                  "\"n\":2,\"temperature\":0}",
                  200);
    choices = json_object_get(j, "choices");
    assert_int_equal(json_array_size(choices), 2);
    assert_string_equal(text_of(json_array_get(choices, 0), true),
                        text_of(json_array_get(choices, 1), true));
    json_decref(j);

    /* streamed: the choices' chunks interleave, each with its index; each
     * index gets its role chunk and its finish_reason; one usage chunk
     * (summed) and one [DONE] at the end */
    wc_response w;
    post_h(t, "/v1/chat/completions", NULL,
           "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,"
           "\"n\":3,\"ignore_eos\":true,\"stream\":true,"
           "\"stream_options\":{\"include_usage\":true}}",
           &w);
    assert_int_equal(w.status, 200);
    char **evs = NULL;
    int ne = wc_sse_parse(w.body, w.body_len, &evs);
    assert_true(ne > 3);
    assert_string_equal(evs[ne - 1], "[DONE]");
    int roles[3] = {0}, finishes[3] = {0}, contents[3] = {0}, usages = 0;
    for (int i = 0; i < ne - 1; i++) {
        json_t *c = json_loads(evs[i], 0, NULL);
        assert_non_null(c);
        assert_null(json_object_get(c, "error"));
        json_t *u = json_object_get(c, "usage");
        if (u) {
            usages++;
            assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 12);
            assert_int_equal(i, ne - 2); /* the last event before [DONE] */
        }
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        if (ch) {
            json_int_t k = json_integer_value(json_object_get(ch, "index"));
            assert_true(k >= 0 && k < 3);
            json_t *d = json_object_get(ch, "delta");
            roles[k] += json_object_get(d, "role") != NULL;
            contents[k] += json_string_length(json_object_get(d, "content")) > 0;
            finishes[k] += json_is_string(json_object_get(ch, "finish_reason"));
        }
        json_decref(c);
    }
    assert_int_equal(usages, 1);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(roles[k], 1);
        assert_int_equal(finishes[k], 1);
        assert_true(contents[k] >= 1);
    }
    wc_sse_free(evs, ne);
    wc_response_free(&w);

    /* completions streamed: every index, one [DONE] */
    post_h(t, "/v1/completions", NULL,
           "{\"prompt\":\"Once\",\"max_tokens\":3,\"n\":2,\"ignore_eos\":true,"
           "\"stream\":true}",
           &w);
    assert_int_equal(w.status, 200);
    ne = wc_sse_parse(w.body, w.body_len, &evs);
    int per[2] = {0};
    for (int i = 0; i < ne - 1; i++) {
        json_t *c = json_loads(evs[i], 0, NULL);
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        json_int_t k = json_integer_value(json_object_get(ch, "index"));
        assert_true(k == 0 || k == 1);
        per[k]++;
        json_decref(c);
    }
    assert_int_equal(per[0], 4); /* 3 tokens and the finish chunk */
    assert_int_equal(per[1], 4);
    wc_sse_free(evs, ne);
    wc_response_free(&w);

    /* more than 16: a typed 400 */
    j = post_json(t, "/v1/completions", "{\"prompt\":\"Hi\",\"n\":17}", 400);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(j, "error"), "param")), "n");
    json_decref(j);
}

static void test_worker(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1",     "--max-seqs", "2",     "--ctx-limit",
                          "256",       "--alias", "first,second", "--alias", "third", NULL};
    wc_worker wk;
    assert_int_equal(wc_worker_start(&wk, g_model, args, NULL, 60, NULL), 0);
    target t = {wk.socket_path, NULL};
    check_context(&t);
    check_shape(&t);
    check_choices(&t);
    /* a client that leaves mid-stream: every choice is cancelled, and the
     * worker serves on (it exits cleanly at the end) */
    for (int k = 0; k < 2; k++) {
        int fd = wc_connect(wk.socket_path, 20000);
        assert_true(fd >= 0);
        assert_int_equal(wc_send(fd, "POST", k ? "/v1/chat/completions" : "/v1/completions",
                                 k ? "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                                     "\"n\":3,\"ignore_eos\":true,\"stream\":true}"
                                   : "{\"prompt\":\"Hi\",\"n\":3,\"max_tokens\":200,"
                                     "\"ignore_eos\":true}"),
                         0);
        char head[256];
        if (k)
            assert_true(read(fd, head, sizeof head) > 0); /* the stream began */
        close(fd);
    }
    json_decref(post_json(&t, "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":2,\"n\":2}",
                          200));
    /* a resume continues one choice */
    json_decref(post_json(&t, "/v1/completions",
                          "{\"prompt\":\"Hi\",\"n\":2,\"resume\":{\"tokens\":[5]}}", 400));

    /* --alias: each name answers as "model"; another is still a 404 */
    const char *names[] = {"first", "second", "third"};
    for (int i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"Hi\",\"max_tokens\":1}",
                 names[i]);
        json_decref(post_json(&t, "/v1/completions", body, 200));
    }
    json_t *j = post_json(&t, "/v1/completions",
                          "{\"model\":\"fourth\",\"prompt\":\"Hi\",\"max_tokens\":1}", 404);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(j, "error"), "code")), "model_not_found");
    json_decref(j);
    wc_response w;
    assert_int_equal(wc_request(wk.socket_path, "GET", "/v1/models", NULL, 5000, &w), 0);
    j = json_loads(w.body, 0, NULL);
    json_t *aliases = json_object_get(json_array_get(json_object_get(j, "data"), 0), "aliases");
    assert_int_equal(json_array_size(aliases), 3);
    for (int i = 0; i < 3; i++)
        assert_string_equal(json_string_value(json_array_get(aliases, (size_t)i)), names[i]);
    json_decref(j);
    wc_response_free(&w);
    assert_int_equal(wc_request(wk.socket_path, "GET", "/v1/models/second", NULL, 5000, &w), 0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    assert_int_equal(wc_request(wk.socket_path, "GET", "/v1/models/fourth", NULL, 5000, &w), 0);
    assert_int_equal(w.status, 404);
    wc_response_free(&w);
    assert_int_equal(wc_worker_stop(&wk), 0);
}

static void test_router(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "compat", g_model, "",
                              "[worker cpu]\nthreads = 1\nmax-seqs = 2\nctx-limit = 256\n"),
                     0);
    target t = {r.sock, &r};
    check_context(&t);
    check_shape(&t);
    check_choices(&t);

    /* /tokenize: the worker's answer */
    const char *tb = "{\"content\":\"Once upon a time\"}";
    wc_response w, ww;
    assert_int_equal(rh_req(&r, "POST", "/tokenize", NULL, tb, &w), 0);
    assert_int_equal(w.status, 200);
    char wsock[700];
    rh_worker_sock(&r, "cpu", wsock, sizeof wsock);
    assert_int_equal(wc_request(wsock, "POST", "/tokenize", tb, 5000, &ww), 0);
    assert_int_equal(ww.status, 200);
    json_t *a = json_loads(w.body, 0, NULL), *b = json_loads(ww.body, 0, NULL);
    assert_true(json_array_size(json_object_get(a, "tokens")) > 0);
    assert_true(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    wc_response_free(&w);
    wc_response_free(&ww);
    assert_int_equal(rh_req(&r, "POST", "/tokenize", NULL, "{\"content\":5}", &w), 0);
    assert_int_equal(w.status, 400);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "GET", "/tokenize", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 405);
    wc_response_free(&w);
    rh_finish(&r);

    /* 401 invalid_api_key, 413 request_too_large (as the worker's) */
    assert_int_equal(rh_start(&r, "compat-keys", g_model,
                              "api-keys = compat-key-0123456789\nmax-body = 4KiB\n",
                              "[worker cpu]\nthreads = 1\nctx-limit = 256\n"),
                     0);
    char code[64];
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, "{\"prompt\":\"Hi\"}", &w), 0);
    assert_int_equal(w.status, 401);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "invalid_api_key");
    wc_response_free(&w);
    char *big = sw_malloc(8192);
    assert_non_null(big);
    memset(big, 'a', 8191);
    big[8191] = 0;
    memcpy(big, "{\"prompt\":\"", 11);
    memcpy(big + 8189, "\"}", 2);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions",
                            "Authorization: Bearer compat-key-0123456789\r\n", big, &w),
                     0);
    assert_int_equal(w.status, 413);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "request_too_large");
    wc_response_free(&w);
    sw_free(big);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker),
        cmocka_unit_test(test_router),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
