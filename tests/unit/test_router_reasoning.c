/* test_router_reasoning.c - end-to-end: a thinking model's stream resumed
 * by the router mid-thought. A real `spillway serve` with two managed CPU
 * workers serving the Qwen3 family (the model's `chat-template` key); the
 * first aborts after 10 tokens of a generation (fault injection), inside
 * the thought the grammar forces, and the router resumes the stream on the
 * second. The client's stream must read as the uninterrupted reply: every
 * thought byte as reasoning_content (the resumed worker's deltas
 * included), the answer as content, nothing twice. A stop string is set,
 * so the resumed worker holds back the resumed text past the client's
 * resume.text_bytes: the router must count the engine's text bytes
 * (spillway.text_bytes), not the split deltas' lengths.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-reasoning.gguf", 7);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    remove(g_model);
    return 0;
}

static const char *const g_body =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"think\"}],\"max_tokens\":80,\"seed\":4,"
    "\"temperature\":1.0,\"stop\":[\"XYZ\"],\"stream\":%s,"
    "\"grammar\":\"root ::= \\\"<think>\\\\n\\\" [a-z]{20,30} "
    "\\\"\\\\n</think>\\\\n\\\\n\\\" [a-z]{1,6}\"}";

static void test_resumed_mid_thought(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "reasoning", g_model, NULL,
                              "chat-template = qwen3\n"
                              "[worker a]\nthreads = 1\nctx-limit = 512\n"
                              "fault = abort_after_tokens:10,stall_ms:20\n"
                              "[worker b]\nthreads = 1\nctx-limit = 512\n"),
                     0);
    char body[512];
    snprintf(body, sizeof body, g_body, "true");
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, body, &w), 0);
    assert_int_equal(w.status, 200);
    char **ev = NULL;
    int n = wc_sse_parse(w.body, strlen(w.body), &ev);
    assert_true(n > 2);
    assert_string_equal(ev[n - 1], "[DONE]");
    char reasoning[256] = "", content[64] = "", finish[32] = "";
    for (int i = 0; i < n - 1; i++) {
        json_t *e = json_loads(ev[i], 0, NULL);
        assert_non_null(e);
        assert_null(json_object_get(e, "error"));
        json_t *c = json_array_get(json_object_get(e, "choices"), 0);
        json_t *d = json_object_get(c, "delta");
        const char *rc = json_string_value(json_object_get(d, "reasoning_content"));
        const char *cc = json_string_value(json_object_get(d, "content"));
        if (rc) {
            assert_string_equal(content, ""); /* the thought comes first */
            snprintf(reasoning + strlen(reasoning), sizeof reasoning - strlen(reasoning), "%s", rc);
        }
        if (cc)
            snprintf(content + strlen(content), sizeof content - strlen(content), "%s", cc);
        if (json_is_string(json_object_get(c, "finish_reason")))
            snprintf(finish, sizeof finish, "%s",
                     json_string_value(json_object_get(c, "finish_reason")));
        json_decref(e);
    }
    wc_sse_free(ev, n);
    wc_response_free(&w);
    assert_string_equal(finish, "stop");
    json_t *events = rh_events(&r);
    assert_int_equal((int)json_array_size(events), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(events, 0), "decision")),
                        "resume");
    json_decref(events);

    /* the same request whole (seeded: the same tokens) */
    snprintf(body, sizeof body, g_body, "false");
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, body, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *j = rh_body_json(&w);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    const char *want_r = json_string_value(json_object_get(msg, "reasoning_content"));
    const char *want_c = json_string_value(json_object_get(msg, "content"));
    assert_non_null(want_r);
    assert_true(strlen(want_r) >= 20 &&
                strspn(want_r, "abcdefghijklmnopqrstuvwxyz") == strlen(want_r));
    assert_string_equal(reasoning, want_r);
    assert_string_equal(content, want_c);
    json_decref(j);
    wc_response_free(&w);
    rh_finish(&r);
}

/* The model's reasoning-format key reaches its workers
 * (--reasoning-format): none leaves the thought in the content; a
 * request's own reasoning_format still wins. */
static void test_model_reasoning_format(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "reasoning-none", g_model, NULL,
                              "chat-template = qwen3\nreasoning-format = none\n"
                              "[worker a]\nthreads = 1\nctx-limit = 512\n"),
                     0);
    char body[512];
    snprintf(body, sizeof body, g_body, "false");
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, body, &w), 0);
    assert_int_equal(w.status, 200);
    json_t *j = rh_body_json(&w);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    assert_null(json_object_get(msg, "reasoning_content"));
    assert_memory_equal(json_string_value(json_object_get(msg, "content")), "<think>\n", 8);
    json_decref(j);
    wc_response_free(&w);
    /* the request's field wins over the worker's default */
    char split[600];
    snprintf(split, sizeof split, "%.*s,\"reasoning_format\":\"deepseek\"}",
             (int)strlen(body) - 1, body);
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, split, &w), 0);
    assert_int_equal(w.status, 200);
    j = rh_body_json(&w);
    msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    assert_true(json_string_length(json_object_get(msg, "reasoning_content")) >= 20);
    json_decref(j);
    wc_response_free(&w);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resumed_mid_thought),
        cmocka_unit_test(test_model_reasoning_format),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
