/* test_router_messages.c - end-to-end: Anthropic's Messages API through a
 * real `spillway serve` with real managed workers (one on a sim-gpu pool,
 * one on the CPU).
 *
 * The router relays a Messages request as chat completions and translates
 * what reaches the client, so: its keys (x-api-key or Authorization:
 * Bearer; a wrong one is a 401 authentication_error), its X-Spillway-*
 * headers, answers equal to a worker's own /v1/messages answer, streams
 * read strictly (messages_check.h), stop_sequences, tools with a
 * tool_result round trip, count_tokens by the router's own count, errors
 * in Anthropic's shape, an Idempotency-Key replay of a stream; and the
 * resume: a stream whose GPU worker dies mid-way, resumed on the CPU
 * worker, is one well-formed Messages stream whose text is exactly the
 * uninterrupted answer, also for a thinking model resumed mid-thought;
 * one that cannot be resumed ends with an error event.
 */
#include "testutil.h"
#include "messages_check.h"
#include "router_harness.h"
#include "worker_client.h"

#include "api/messages.h"
#include "common/alloc.h"
#include "router/router-impl.h"
#include "device/device.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char g_model[512];
static char g_pool[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_pool, sizeof g_pool, "rt-msg-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    return rh_make_model(g_model, sizeof g_model, "router-messages.gguf", 5);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    dev_sim_unlink(g_pool, NULL);
    remove(g_model);
    return 0;
}

#define KEY "x-api-key: msg-test-key-1\r\n"

/* The Message of a response: its JSON, or the Message its stream tells
 * (checked strictly). */
static json_t *message_of(const wc_response *w)
{
    if (strstr(w->headers, "text/event-stream")) {
        char why[256] = "";
        json_t *m = mc_stream_message(w->body, w->body_len, why, sizeof why);
        if (!m)
            fail_msg("a malformed Messages stream (%s):\n%s", why, w->body);
        return m;
    }
    json_t *j = rh_body_json(w);
    if (!j)
        fail_msg("not JSON: %s", w->body);
    return j;
}

/* POSTs body (consumed) through the router with headers; the Message. */
static json_t *post(const rh_router *r, const char *path, const char *headers, json_t *body,
                    int want_status, wc_response *keep)
{
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    wc_response w;
    assert_int_equal(rh_req(r, "POST", path, headers, s, &w), 0);
    free(s);
    if (w.status != want_status)
        fail_msg("%s: status %d, not %d: %s", path, w.status, want_status, w.body);
    json_t *m = message_of(&w);
    if (keep)
        *keep = w;
    else
        wc_response_free(&w);
    return m;
}

static const char *error_type(json_t *j)
{
    assert_string_equal(json_string_value(json_object_get(j, "type")), "error");
    return json_string_value(json_object_get(json_object_get(j, "error"), "type"));
}

static json_t *user(const char *text)
{
    return json_pack("[{s:s, s:s}]", "role", "user", "content", text);
}

/* A model may write U+0000 (a byte-fallback token): its chat answer is
 * JSON with "\u0000" in a string, which the translations into Messages
 * take as text, whole and streamed (they once refused the answer as
 * unparsable: a 500, or a streamed delta dropped). */
static void test_nul_in_answer(void **state)
{
    (void)state;
    const char *chat =
        "{\"id\":\"c1\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
        "\"a\\u0000b\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,"
        "\"completion_tokens\":3,\"total_tokens\":4}}";
    size_t n = 0;
    char *out = rt__messages_body(200, chat, strlen(chat), &n);
    assert_non_null(out);
    assert_non_null(strstr(out, "\"text\":\"a\\u0000b\""));
    sw_free(out);
    const char *chunk =
        "{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\\u0000y\"},"
        "\"finish_reason\":null}]}";
    api_msg_stream st;
    api_msg_stream_init(&st, "m", 1);
    assert_true(api_msg_stream_feed(&st, chunk, strlen(chunk)));
    assert_non_null(st.out);
    assert_non_null(memmem(st.out, st.out_len, "x\\u0000y", 8));
    api_msg_stream_free(&st);

    /* through a router: a worker made to write the byte token 0x00 (id 3 in
     * the test vocabulary) streams it, and the router passes it on as one
     * attempt's answer (it once took the chunk for a broken worker) */
    char workers[512];
    snprintf(workers, sizeof workers, "[worker cpu]\nthreads = 1\nctx-limit = 512\n");
    rh_router r;
    assert_int_equal(rh_start(&r, "messages-nul", g_model, "api-keys = msg-test-key-1\n", workers),
                     0);
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,"
                       "\"temperature\":0,\"stream\":true,\"logit_bias\":{\"3\":100}}";
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions",
                            "Authorization: Bearer msg-test-key-1\r\n", body, &w),
                     0);
    assert_int_equal(w.status, 200);
    if (!strstr(w.body, "\\u0000"))
        fail_msg("no U+0000 in the stream: %s", w.body);
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    wc_response_free(&w);
    rh_finish(&r);
}

static void test_through_router(void **state)
{
    (void)state;
    char workers[512];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = sim-gpu:%s\nsim-capacity = 64MiB\nmax-seqs = 2\n"
             "threads = 1\nctx-limit = 1024\n[worker cpu]\nthreads = 1\nctx-limit = 1024\n",
             g_pool);
    rh_router r;
    assert_int_equal(rh_start(&r, "messages", g_model, "api-keys = msg-test-key-1\n", workers), 0);
    const char *model = "spillway-synthetic";

    /* keys: a wrong x-api-key and none are 401 authentication_error */
    const char *bodies = "{\"model\":\"spillway-synthetic\",\"max_tokens\":2,\"messages\":[{"
                         "\"role\":\"user\",\"content\":\"hi\"}]}";
    const char *bad_keys[] = {"x-api-key: wrong-key-0000\r\n", NULL};
    for (int i = 0; i < 2; i++) {
        wc_response w;
        assert_int_equal(rh_req(&r, "POST", "/v1/messages", bad_keys[i], bodies, &w), 0);
        assert_int_equal(w.status, 401);
        json_t *j = rh_body_json(&w);
        assert_string_equal(error_type(j), "authentication_error");
        json_decref(j);
        wc_response_free(&w);
    }

    /* text: the answer a worker gives itself, with the router's headers;
     * Authorization: Bearer works as x-api-key does */
    wc_response w;
    json_t *m = post(&r, "/v1/messages", "Authorization: Bearer msg-test-key-1\r\n",
                     json_pack("{s:s, s:i, s:f, s:s, s:o}", "model", model, "max_tokens", 12,
                               "temperature", 0.0, "system", "Be brief.", "messages",
                               user("Tell a story")),
                     200, &w);
    rh_assert_header(&w, "X-Spillway-Worker", NULL);
    rh_assert_header(&w, "X-Spillway-Model", model);
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    wc_response_free(&w);
    assert_memory_equal(json_string_value(json_object_get(m, "id")), "msg_", 4);
    char cpu_sock[700];
    rh_worker_sock(&r, "cpu", cpu_sock, sizeof cpu_sock);
    json_t *direct = json_pack("{s:s, s:i, s:f, s:s, s:o}", "model", model, "max_tokens", 12,
                               "temperature", 0.0, "system", "Be brief.", "messages",
                               user("Tell a story"));
    char *direct_body = json_dumps(direct, JSON_COMPACT);
    json_decref(direct);
    wc_response d;
    assert_int_equal(wc_request(cpu_sock, "POST", "/v1/messages", direct_body, 30000, &d), 0);
    free(direct_body);
    assert_int_equal(d.status, 200);
    json_t *dm = rh_body_json(&d);
    wc_response_free(&d);
    assert_true(json_equal(json_object_get(m, "content"), json_object_get(dm, "content")));
    assert_true(json_equal(json_object_get(m, "usage"), json_object_get(dm, "usage")));
    assert_string_equal(json_string_value(json_object_get(m, "stop_reason")),
                        json_string_value(json_object_get(dm, "stop_reason")));
    json_decref(dm);

    /* streamed: the same Message, message_start already with the prompt's
     * count */
    json_t *s = post(&r, "/v1/messages", KEY,
                     json_pack("{s:s, s:i, s:f, s:s, s:o, s:b}", "model", model, "max_tokens",
                               12, "temperature", 0.0, "system", "Be brief.", "messages",
                               user("Tell a story"), "stream", 1),
                     200, &w);
    rh_assert_header(&w, "X-Spillway-Worker", NULL);
    assert_non_null(strstr(w.body, "\"usage\":{\"input_tokens\":"));
    char want_start[96];
    snprintf(want_start, sizeof want_start, "\"usage\":{\"input_tokens\":%lld,",
             (long long)json_integer_value(json_object_get(json_object_get(m, "usage"),
                                                           "input_tokens")));
    char *start_end = strstr(w.body, "event: content_block_start");
    char *in_start = strstr(w.body, want_start);
    assert_true(in_start && start_end && in_start < start_end);
    wc_response_free(&w);
    assert_true(json_equal(json_object_get(s, "content"), json_object_get(m, "content")));
    assert_true(json_equal(json_object_get(s, "usage"), json_object_get(m, "usage")));
    json_decref(s);

    /* count_tokens: the router's count is the worker's */
    json_t *n = post(&r, "/v1/messages/count_tokens", KEY,
                     json_pack("{s:s, s:s, s:o}", "model", model, "system", "Be brief.",
                               "messages", user("Tell a story")),
                     200, NULL);
    assert_int_equal(json_integer_value(json_object_get(n, "input_tokens")),
                     json_integer_value(json_object_get(json_object_get(m, "usage"),
                                                        "input_tokens")));
    json_decref(n);

    /* stop_sequences: the third word of the answer ends it */
    char *full = mc_blocks_text(m, "text");
    const char *wd = strchr(strchr(full + 1, ' ') + 1, ' ');
    const char *we = strchr(wd + 1, ' ');
    char stop[64];
    snprintf(stop, sizeof stop, "%.*s", (int)(we ? we - wd : (long)strlen(wd)), wd);
    for (int stream = 0; stream < 2; stream++) {
        json_t *t = post(&r, "/v1/messages", KEY,
                         json_pack("{s:s, s:i, s:f, s:s, s:o, s:[s], s:b}", "model", model,
                                   "max_tokens", 12, "temperature", 0.0, "system", "Be brief.",
                                   "messages", user("Tell a story"), "stop_sequences", stop,
                                   "stream", stream),
                         200, NULL);
        assert_string_equal(json_string_value(json_object_get(t, "stop_reason")),
                            "stop_sequence");
        assert_string_equal(json_string_value(json_object_get(t, "stop_sequence")), stop);
        char *tt = mc_blocks_text(t, "text");
        assert_int_equal(strlen(tt), (size_t)(strstr(full, stop) - full));
        sw_free(tt);
        json_decref(t);
    }
    sw_free(full);
    json_decref(m);

    /* tools: a forced call streamed, then its result sent back */
    json_t *tools = json_pack("[{s:s, s:s, s:{s:s, s:{s:{s:s, s:i}}, s:[s]}}]", "name",
                              "get_weather", "description", "The weather in a city",
                              "input_schema", "type", "object", "properties", "city", "type",
                              "string", "maxLength", 8, "required", "city");
    json_t *call = post(&r, "/v1/messages", KEY,
                        json_pack("{s:s, s:i, s:O, s:{s:s, s:s}, s:o, s:b}", "model", model,
                                  "max_tokens", 48, "tools", tools, "tool_choice", "type", "tool",
                                  "name", "get_weather", "messages", user("Weather in Paris?"),
                                  "stream", 1),
                        200, NULL);
    assert_string_equal(json_string_value(json_object_get(call, "stop_reason")), "tool_use");
    json_t *block = json_array_get(json_object_get(call, "content"), 0);
    assert_string_equal(json_string_value(json_object_get(block, "type")), "tool_use");
    assert_string_equal(json_string_value(json_object_get(block, "name")), "get_weather");
    assert_true(json_is_string(json_object_get(json_object_get(block, "input"), "city")));
    json_t *turns = json_pack("[{s:s, s:s}, {s:s, s:[O]}, {s:s, s:[{s:s, s:O, s:[{s:s, s:s}]}]}]",
                              "role", "user", "content", "Weather in Paris?", "role",
                              "assistant", "content", block, "role", "user", "content", "type",
                              "tool_result", "tool_use_id", json_object_get(block, "id"),
                              "content", "type", "text", "text", "18 C, sunny");
    json_t *answer = post(&r, "/v1/messages", KEY,
                          json_pack("{s:s, s:i, s:O, s:O}", "model", model, "max_tokens", 6,
                                    "tools", tools, "messages", turns),
                          200, NULL);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(answer, "content"), 0), "type")),
                        "text");
    json_t *counted = post(&r, "/v1/messages/count_tokens", KEY,
                           json_pack("{s:s, s:O, s:O}", "model", model, "tools", tools,
                                     "messages", turns),
                           200, NULL);
    assert_int_equal(json_integer_value(json_object_get(counted, "input_tokens")),
                     json_integer_value(json_object_get(json_object_get(answer, "usage"),
                                                        "input_tokens")));
    json_decref(counted);
    json_decref(answer);
    json_decref(turns);
    json_decref(call);
    json_decref(tools);

    /* errors in Anthropic's shape */
    static const struct {
        const char *path, *body;
        int status;
        const char *type;
    } cases[] = {
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"messages\":[{\"role\":\"user\","
                         "\"content\":\"hi\"}]}", 400, "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,\"messages\":[{"
                         "\"role\":\"tool\",\"content\":\"hi\"}]}", 400,
         "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"unknown-model\",\"max_tokens\":4,\"messages\":[{"
                         "\"role\":\"user\",\"content\":\"hi\"}]}", 404, "not_found_error"},
        {"/v1/messages/count_tokens", "{\"model\":\"unknown-model\",\"messages\":[{"
                                      "\"role\":\"user\",\"content\":\"hi\"}]}", 404,
         "not_found_error"},
        {"/v1/messages", "not json", 400, "invalid_request_error"},
        {"/v1/messages", "{\"model\":\"spillway-synthetic\",\"max_tokens\":4,"
                         "\"stop_sequences\":\"x\",\"messages\":[{\"role\":\"user\","
                         "\"content\":\"hi\"}]}", 400, "invalid_request_error"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(rh_req(&r, "POST", cases[i].path, KEY, cases[i].body, &w), 0);
        if (w.status != cases[i].status)
            fail_msg("case %zu: status %d: %s", i, w.status, w.body);
        json_t *j = rh_body_json(&w);
        assert_non_null(j);
        assert_string_equal(error_type(j), cases[i].type);
        json_decref(j);
        wc_response_free(&w);
    }

    /* Idempotency-Key: the retry of a stream is the same Messages stream */
    const char *ibody = "{\"model\":\"spillway-synthetic\",\"max_tokens\":6,\"stream\":true,"
                        "\"messages\":[{\"role\":\"user\",\"content\":\"again\"}]}";
    wc_response w1, w2;
    assert_int_equal(rh_req(&r, "POST", "/v1/messages", KEY "Idempotency-Key: msg-idem-1\r\n",
                            ibody, &w1), 0);
    assert_int_equal(rh_req(&r, "POST", "/v1/messages", KEY "Idempotency-Key: msg-idem-1\r\n",
                            ibody, &w2), 0);
    assert_int_equal(w1.status, 200);
    assert_int_equal(w2.status, 200);
    rh_assert_header(&w2, "X-Spillway-Idempotent-Replay", "true");
    json_t *m1 = message_of(&w1), *m2 = message_of(&w2);
    assert_true(json_equal(m1, m2));
    json_decref(m1);
    json_decref(m2);
    wc_response_free(&w1);
    wc_response_free(&w2);
    rh_finish(&r);
}

/* The resume: the GPU worker dies after 5 tokens of a Messages stream and
 * the router resumes it on the CPU worker; the client sees one Messages
 * stream whose text is the uninterrupted answer of the CPU worker. */
static void test_stream_resumed(void **state)
{
    (void)state;
    char workers[512];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = sim-gpu:%s\nsim-capacity = 64MiB\nmax-seqs = 2\n"
             "threads = 1\nctx-limit = 512\nfault = abort_after_tokens:5,stall_ms:20\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 512\n",
             g_pool);
    rh_router r;
    assert_int_equal(rh_start(&r, "messages-resume", g_model, NULL, workers), 0);
    const char *req = "{\"model\":\"spillway-synthetic\",\"max_tokens\":24,\"temperature\":0,"
                      "\"system\":\"Be brief.\",\"messages\":[{\"role\":\"user\",\"content\":"
                      "\"Tell a story\"}]";
    char body_s[512], body_n[512], cpu_sock[700];
    snprintf(body_s, sizeof body_s, "%s,\"stream\":true}", req);
    snprintf(body_n, sizeof body_n, "%s}", req);
    rh_worker_sock(&r, "cpu", cpu_sock, sizeof cpu_sock);
    wc_response d, w;
    assert_int_equal(wc_request(cpu_sock, "POST", "/v1/messages", body_n, 30000, &d), 0);
    assert_int_equal(d.status, 200);
    json_t *want = rh_body_json(&d);
    wc_response_free(&d);
    char *want_text = mc_blocks_text(want, "text");
    assert_true(json_integer_value(json_object_get(json_object_get(want, "usage"),
                                                   "output_tokens")) > 5);

    assert_int_equal(rh_req(&r, "POST", "/v1/messages", NULL, body_s, &w), 0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "gpu"); /* the head came from the first attempt */
    json_t *got = message_of(&w); /* one message_start, each block once, in order */
    int starts = 0;
    for (const char *p = w.body; (p = strstr(p, "event: message_start")); p++)
        starts++;
    assert_int_equal(starts, 1);
    assert_null(strstr(w.body, "event: error"));
    wc_response_free(&w);
    char *got_text = mc_blocks_text(got, "text");
    assert_string_equal(got_text, want_text);
    assert_int_equal(json_array_size(json_object_get(got, "content")), 1);
    assert_string_equal(json_string_value(json_object_get(got, "stop_reason")),
                        json_string_value(json_object_get(want, "stop_reason")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(got, "usage"),
                                                        "output_tokens")),
                     json_integer_value(json_object_get(json_object_get(want, "usage"),
                                                        "output_tokens")));
    sw_free(got_text);
    sw_free(want_text);
    json_decref(got);
    json_decref(want);
    json_t *ev = rh_events(&r);
    assert_int_equal((int)json_array_size(ev), 1);
    json_t *e = json_array_get(ev, 0);
    assert_string_equal(json_string_value(json_object_get(e, "decision")), "resume");
    assert_string_equal(json_string_value(json_object_get(e, "outcome")), "completed");
    assert_string_equal(json_string_value(json_object_get(e, "replay_worker")), "cpu");
    json_decref(ev);
    rh_wait_restarted(&r, "gpu", 1);
    rh_finish(&r);
}

/* A thinking model's Messages stream resumed mid-thought (two CPU workers
 * of the Qwen3 family, the first dying after 10 tokens inside the thought
 * a grammar forces): one thinking block, then one text block, equal to
 * the uninterrupted answer of the second worker. */
static void test_thinking_resumed(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "messages-think", g_model, NULL,
                              "chat-template = qwen3\n"
                              "[worker a]\nthreads = 1\nctx-limit = 512\n"
                              "fault = abort_after_tokens:10,stall_ms:20\n"
                              "[worker b]\nthreads = 1\nctx-limit = 512\n"),
                     0);
    const char *req =
        "{\"model\":\"spillway-synthetic\",\"max_tokens\":80,\"seed\":4,\"temperature\":1.0,"
        "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"think\"}],"
        "\"grammar\":\"root ::= \\\"<think>\\\\n\\\" [a-z]{20,30} "
        "\\\"\\\\n</think>\\\\n\\\\n\\\" [a-z]{1,6}\"";
    char body_s[600], body_n[600], b_sock[700];
    snprintf(body_s, sizeof body_s, "%s,\"stream\":true}", req);
    snprintf(body_n, sizeof body_n, "%s}", req);
    rh_worker_sock(&r, "b", b_sock, sizeof b_sock);
    wc_response d, w;
    assert_int_equal(wc_request(b_sock, "POST", "/v1/messages", body_n, 30000, &d), 0);
    assert_int_equal(d.status, 200);
    json_t *want = rh_body_json(&d);
    wc_response_free(&d);
    assert_int_equal(rh_req(&r, "POST", "/v1/messages", NULL, body_s, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *got = message_of(&w);
    wc_response_free(&w);
    json_t *content = json_object_get(got, "content");
    assert_int_equal(json_array_size(content), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 0), "type")),
                        "thinking");
    assert_true(json_string_length(json_object_get(json_array_get(content, 0), "thinking")) >=
                20);
    assert_true(json_equal(content, json_object_get(want, "content")));
    json_decref(got);
    json_decref(want);
    json_t *ev = rh_events(&r);
    assert_int_equal((int)json_array_size(ev), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "decision")),
                        "resume");
    json_decref(ev);
    rh_finish(&r);
}

/* A stream that cannot be resumed anywhere (the CPU worker's context is
 * too short for the prompt and the text sent) ends with an error event
 * (overloaded_error: no worker could finish it) after the text the client
 * has, and nothing after it; the router keeps serving. */
static void test_stream_unresumable(void **state)
{
    (void)state;
    char workers[512];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = sim-gpu:%s\nsim-capacity = 64MiB\nthreads = 1\n"
             "ctx-limit = 512\nfault = abort_after_tokens:5,stall_ms:20\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 10\n",
             g_pool);
    rh_router r;
    assert_int_equal(rh_start(&r, "messages-unresumable", g_model, NULL, workers), 0);
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/messages", NULL,
                            "{\"model\":\"spillway-synthetic\",\"max_tokens\":20,\"stream\":true,"
                            "\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":"
                            "\"Tell a story\"}]}",
                            &w),
                     0);
    assert_int_equal(w.status, 200);
    json_t *e = message_of(&w); /* the stream's grammar holds up to the error */
    assert_string_equal(error_type(e), "overloaded_error");
    assert_true(json_string_length(json_object_get(json_object_get(e, "error"), "message")) > 0);
    json_decref(e);
    assert_non_null(strstr(w.body, "event: message_start"));
    assert_non_null(strstr(w.body, "\"text_delta\""));
    assert_null(strstr(w.body, "event: message_stop"));
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "POST", "/v1/messages", NULL,
                            "{\"model\":\"spillway-synthetic\",\"max_tokens\":2,\"messages\":[{"
                            "\"role\":\"user\",\"content\":\"Hi\"}]}",
                            &w),
                     0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nul_in_answer),
        cmocka_unit_test(test_through_router),
        cmocka_unit_test(test_stream_resumed),
        cmocka_unit_test(test_thinking_resumed),
        cmocka_unit_test(test_stream_unresumable),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
