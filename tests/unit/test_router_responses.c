/* test_router_responses.c - end-to-end: OpenAI's Responses API through a
 * real `spillway serve` with real managed workers (one on a sim-gpu pool,
 * one on the CPU) over real sockets.
 *
 * The router takes a Responses body the chat route's way (admission
 * headers, typed 400s, Idempotency-Key replay) and adds what a worker
 * cannot keep: stored responses in its ledger (previous_response_id
 * continues one exactly as the whole conversation sent to the chat route
 * would; store false is never kept; GET and DELETE), and background
 * responses run as durable jobs. A stream whose GPU worker dies after 5
 * tokens is resumed on the CPU worker: the client sees one well-formed
 * Responses stream (responses_check.h) whose text is exactly the
 * uninterrupted answer (one that cannot be resumed anywhere ends with
 * response.failed); a forced function call cut mid-arguments the same
 * way is one function_call item with the uninterrupted arguments. Out of
 * memory at each of the router's allocations for a request gives the
 * answer or a typed 5xx, never a broken stream. The capacity fallback
 * answers from the smaller model, labelled. A thinking family's
 * reasoning item comes through as the worker gives it.
 */
#include "testutil.h"
#include "responses_check.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
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
    snprintf(g_pool, sizeof g_pool, "rt-resp-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    return rh_make_model(g_model, sizeof g_model, "router-responses.gguf", 5);
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

static void start(rh_router *r, const char *name, const char *gpu_fault)
{
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = sim-gpu:%s\nsim-capacity = 64MiB\nmax-seqs = 2\n"
             "threads = 1\nctx-limit = 512\n%s%s%s[worker cpu]\nthreads = 1\nctx-limit = 512\n",
             g_pool, gpu_fault ? "fault = " : "", gpu_fault ? gpu_fault : "",
             gpu_fault ? "\n" : "");
    assert_int_equal(rh_start(r, name, g_model, NULL, workers), 0);
}

static void finish(rh_router *r)
{
    rh_finish(r);
    dev_sim_unlink(g_pool, NULL);
}

/* POST /v1/responses; the answer's JSON (a stream: its body as a JSON
 * string) after checking the status. */
static json_t *post(const rh_router *r, const char *headers, const char *body, int want,
                    wc_response *keep)
{
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/responses", headers, body, &w), 0);
    if (w.status != want)
        fail_msg("status %d, not %d: %s", w.status, want, w.body);
    json_t *j = strstr(w.headers, "text/event-stream") ? json_string(w.body) : rh_body_json(&w);
    if (!j)
        fail_msg("not JSON: %s", w.body);
    if (keep)
        *keep = w;
    else
        wc_response_free(&w);
    return j;
}

static json_t *get(const rh_router *r, const char *method, const char *id, int want)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    wc_response w;
    assert_int_equal(rh_req(r, method, path, NULL, NULL, &w), 0);
    if (w.status != want)
        fail_msg("%s %s: status %d, not %d: %s", method, path, w.status, want, w.body);
    json_t *j = rh_body_json(&w);
    wc_response_free(&w);
    return j;
}

static const char *id_of(const json_t *r)
{
    return json_string_value(json_object_get(r, "id"));
}

/* Whole and streamed, with the router's admission headers; bad bodies
 * are the worker's typed 400s or the router's own; an Idempotency-Key
 * replays the stored Response. */
static void test_basic(void **state)
{
    (void)state;
    rh_router r;
    start(&r, "resp-basic", NULL);
    wc_response w;
    const char *body = "{\"input\":\"Once upon a time\",\"max_output_tokens\":12,\"seed\":2}";
    json_t *a = post(&r, NULL, body, 200, &w);
    rh_assert_header(&w, "X-Spillway-Worker", NULL);
    rh_assert_header(&w, "X-Spillway-Model", NULL);
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    wc_response_free(&w);
    assert_string_equal(json_string_value(json_object_get(a, "object")), "response");
    assert_int_equal(strncmp(id_of(a), "resp_", 5), 0);
    char text[4096];
    rc_response_text(a, text, sizeof text);
    assert_true(strlen(text) > 0);

    json_t *s = post(&r, NULL,
                     "{\"input\":\"Once upon a time\",\"max_output_tokens\":12,\"seed\":2,"
                     "\"stream\":true}",
                     200, NULL);
    rc_stream st;
    rc_stream_check(json_string_value(s), &st);
    assert_string_equal(st.text, text);
    assert_true(rc_usage_same(st.response, a));
    rc_stream_free(&st);
    json_decref(s);

    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{\"input\":5}", "input"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search_preview\"}]}", "tools[0]"},
        {"{\"input\":\"x\",\"store\":\"yes\"}", "store"},
        {"{\"input\":\"x\",\"previous_response_id\":7}", "previous_response_id"},
        {"{\"input\":\"x\",\"temperature\":\"hot\"}", "temperature"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":"
         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":"
         "[\"a\"]}}],\"tool_choice\":\"required\",\"max_output_tokens\":2}",
         "max_output_tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *e = post(&r, NULL, bad[i].body, 400, NULL);
        assert_string_equal(
            json_string_value(json_object_get(json_object_get(e, "error"), "param")),
            bad[i].param);
        json_decref(e);
    }
    json_t *e = post(&r, NULL, "not json", 400, NULL);
    json_decref(e);

    /* Idempotency-Key: the second answer is the first, replayed */
    json_t *k1 = post(&r, "Idempotency-Key: resp-key-1\r\n", body, 200, NULL);
    json_t *k2 = post(&r, "Idempotency-Key: resp-key-1\r\n", body, 200, NULL);
    assert_true(json_equal(k1, k2));
    json_decref(k1);
    json_decref(k2);
    /* a stream too: the same Responses events, replayed */
    const char *sb = "{\"input\":\"Once upon a time\",\"max_output_tokens\":6,\"seed\":2,"
                     "\"stream\":true}";
    k1 = post(&r, "Idempotency-Key: resp-key-2\r\n", sb, 200, NULL);
    k2 = post(&r, "Idempotency-Key: resp-key-2\r\n", sb, 200, &w);
    rh_assert_header(&w, "X-Spillway-Idempotent-Replay", "true");
    wc_response_free(&w);
    assert_string_equal(json_string_value(k1), json_string_value(k2));
    rc_stream_check(json_string_value(k2), &st);
    rc_stream_free(&st);
    json_decref(k1);
    json_decref(k2);
    json_decref(a);
    finish(&r);
}

/* previous_response_id: the conversation so far (its input and output
 * items) before the new input, exactly what the chat route gives for the
 * whole conversation; GET, DELETE; store false is never kept. */
static void test_previous_response(void **state)
{
    (void)state;
    rh_router r;
    start(&r, "resp-prev", NULL);
    json_t *a = post(&r, NULL,
                     "{\"instructions\":\"Tell stories.\",\"input\":\"Tell a story\","
                     "\"max_output_tokens\":8,\"temperature\":0,\"ignore_eos\":true}",
                     200, NULL);
    char text_a[4096];
    rc_response_text(a, text_a, sizeof text_a);
    /* a follow-up, streamed */
    char b[1024];
    snprintf(b, sizeof b,
             "{\"previous_response_id\":\"%s\",\"input\":\"Go on\",\"max_output_tokens\":8,"
             "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}",
             id_of(a));
    json_t *s = post(&r, NULL, b, 200, NULL);
    rc_stream st;
    rc_stream_check(json_string_value(s), &st);
    assert_string_equal(json_string_value(json_object_get(st.response, "previous_response_id")),
                        id_of(a));
    /* the same conversation sent whole to the chat route (instructions
     * are not carried over, as OpenAI does) */
    json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}]", "role", "user", "content",
                             "Tell a story", "role", "assistant", "content", text_a, "role",
                             "user", "content", "Go on");
    json_t *cb = json_pack("{s:o, s:i, s:i, s:b}", "messages", msgs, "max_tokens", 8,
                           "temperature", 0, "ignore_eos", 1);
    char *cbs = json_dumps(cb, JSON_COMPACT);
    json_decref(cb);
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, cbs, &w), 0);
    free(cbs);
    assert_int_equal(w.status, 200);
    json_t *c = rh_body_json(&w);
    wc_response_free(&w);
    const char *chat_text = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message"), "content"));
    assert_string_equal(st.text, chat_text);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(st.response, "usage"),
                                                        "input_tokens")),
                     json_integer_value(json_object_get(json_object_get(c, "usage"),
                                                        "prompt_tokens")));
    json_decref(c);
    /* a third turn on the second (the chain grows) */
    snprintf(b, sizeof b,
             "{\"previous_response_id\":\"%s\",\"input\":\"And then?\",\"max_output_tokens\":4}",
             id_of(st.response));
    json_t *third = post(&r, NULL, b, 200, NULL);
    assert_true(json_integer_value(json_object_get(json_object_get(third, "usage"),
                                                   "input_tokens")) >
                json_integer_value(json_object_get(json_object_get(st.response, "usage"),
                                                   "input_tokens")));
    json_decref(third);
    rc_stream_free(&st);
    json_decref(s);

    /* GET gives the stored response back */
    json_t *g = get(&r, "GET", id_of(a), 200);
    assert_true(json_equal(g, a));
    json_decref(g);
    char with_query[256];
    snprintf(with_query, sizeof with_query, "%s?include[]=message.output_text.logprobs",
             id_of(a));
    g = get(&r, "GET", with_query, 200);
    assert_true(json_equal(g, a));
    json_decref(g);

    /* store false: answered, not kept */
    json_t *n = post(&r, NULL, "{\"input\":\"x\",\"max_output_tokens\":2,\"store\":false}", 200,
                     NULL);
    assert_true(json_is_false(json_object_get(n, "store")));
    json_t *e = get(&r, "GET", id_of(n), 404);
    json_decref(e);
    snprintf(b, sizeof b, "{\"previous_response_id\":\"%s\",\"input\":\"y\"}", id_of(n));
    e = post(&r, NULL, b, 404, NULL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "param")),
                        "previous_response_id");
    json_decref(e);
    json_decref(n);

    /* DELETE: gone for GET and for a follow-up */
    json_t *d = get(&r, "DELETE", id_of(a), 200);
    assert_true(json_is_true(json_object_get(d, "deleted")));
    json_decref(d);
    e = get(&r, "GET", id_of(a), 404);
    json_decref(e);
    e = get(&r, "DELETE", id_of(a), 404);
    json_decref(e);
    snprintf(b, sizeof b, "{\"previous_response_id\":\"%s\",\"input\":\"y\"}", id_of(a));
    e = post(&r, NULL, b, 404, NULL);
    json_decref(e);
    e = post(&r, NULL, "{\"previous_response_id\":\"resp_never\",\"input\":\"y\"}", 404, NULL);
    json_decref(e);
    json_decref(a);
    finish(&r);
}

/* background: queued at once, then a durable job; GET shows it done with
 * the answer the same body gives in the foreground. */
static void test_background(void **state)
{
    (void)state;
    rh_router r;
    start(&r, "resp-bg", NULL);
    const char *fg = "{\"input\":\"Tell a story\",\"max_output_tokens\":10,\"temperature\":0,"
                     "\"ignore_eos\":true}";
    json_t *want = post(&r, NULL, fg, 200, NULL);
    json_t *q = post(&r, NULL,
                     "{\"input\":\"Tell a story\",\"max_output_tokens\":10,\"temperature\":0,"
                     "\"ignore_eos\":true,\"background\":true}",
                     200, NULL);
    const char *status = json_string_value(json_object_get(q, "status"));
    assert_true(!strcmp(status, "queued") || !strcmp(status, "in_progress"));
    assert_true(json_is_true(json_object_get(q, "background")));
    assert_int_equal(json_array_size(json_object_get(q, "output")), 0);
    json_t *g = NULL;
    double t0 = tu_now_s();
    for (;;) {
        g = get(&r, "GET", id_of(q), 200);
        status = json_string_value(json_object_get(g, "status"));
        if (strcmp(status, "queued") && strcmp(status, "in_progress"))
            break;
        json_decref(g);
        if (tu_now_s() - t0 > 60)
            fail_msg("the background response did not finish");
        usleep(100 * 1000);
    }
    assert_string_equal(status, "incomplete");
    assert_string_equal(id_of(g), id_of(q));
    char a[4096], b[4096];
    rc_response_text(g, a, sizeof a);
    rc_response_text(want, b, sizeof b);
    assert_string_equal(a, b);
    json_decref(g);
    /* read again: the finished state was stored */
    g = get(&r, "GET", id_of(q), 200);
    rc_response_text(g, a, sizeof a);
    assert_string_equal(a, b);
    json_decref(g);
    /* a follow-up on a background response: refused (400) while its job
     * runs, taken once it finished, never read by GET before */
    json_t *q2 = post(&r, NULL, "{\"input\":\"Tell a story\",\"max_output_tokens\":6,"
                                "\"background\":true}", 200, NULL);
    char fb[256];
    snprintf(fb, sizeof fb, "{\"previous_response_id\":\"%s\",\"input\":\"Go on\","
             "\"max_output_tokens\":4}", id_of(q2));
    t0 = tu_now_s();
    for (;;) {
        wc_response w;
        assert_int_equal(rh_req(&r, "POST", "/v1/responses", NULL, fb, &w), 0);
        int st = w.status;
        if (st != 200 && st != 400)
            fail_msg("follow-up: status %d: %s", st, w.body);
        wc_response_free(&w);
        if (st == 200)
            break;
        if (tu_now_s() - t0 > 60)
            fail_msg("the background response was never continued");
        usleep(100 * 1000);
    }
    json_decref(q2);
    json_t *e = post(&r, NULL, "{\"input\":\"x\",\"background\":true,\"stream\":true}", 400, NULL);
    json_decref(e);
    json_decref(q);
    json_decref(want);
    finish(&r);
}

/* The GPU worker dies after 5 tokens of a Responses stream: resumed on
 * the CPU worker, one well-formed stream with exactly the uninterrupted
 * text, the usage of every token. */
static void test_stream_resumed(void **state)
{
    (void)state;
    rh_router r;
    start(&r, "resp-resume", "abort_after_tokens:5,stall_ms:20");
    const char *body = "{\"input\":\"Tell a story\",\"max_output_tokens\":24,\"temperature\":0,"
                       "\"ignore_eos\":true";
    char b[512], sock[700];
    snprintf(b, sizeof b, "%s}", body);
    /* the uninterrupted answer: the CPU worker's own */
    rh_worker_sock(&r, "cpu", sock, sizeof sock);
    wc_response d;
    assert_int_equal(wc_request(sock, "POST", "/v1/responses", b, 60000, &d), 0);
    assert_int_equal(d.status, 200);
    json_t *want = json_loads(d.body, 0, NULL);
    wc_response_free(&d);
    char want_text[4096];
    rc_response_text(want, want_text, sizeof want_text);
    assert_true(strlen(want_text) > 0);

    snprintf(b, sizeof b, "%s,\"stream\":true}", body);
    wc_response w;
    json_t *s = post(&r, "X-Request-Id: resp-resumed\r\n", b, 200, &w);
    rh_assert_header(&w, "X-Spillway-Worker", "gpu"); /* the head came from the first attempt */
    wc_response_free(&w);
    rc_stream st;
    rc_stream_check(json_string_value(s), &st);
    assert_string_equal(st.final_type, "response.incomplete");
    assert_string_equal(st.text, want_text);
    assert_int_equal(st.n_items, 1);
    assert_string_equal(id_of(st.response), "resp_resp-resumed");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(st.response, "usage"),
                                                        "output_tokens")),
                     24);
    rc_stream_free(&st);
    json_decref(s);
    json_decref(want);

    json_t *ev = rh_events(&r);
    assert_int_equal((int)json_array_size(ev), 1);
    json_t *e = json_array_get(ev, 0);
    assert_string_equal(json_string_value(json_object_get(e, "decision")), "resume");
    assert_string_equal(json_string_value(json_object_get(e, "outcome")), "completed");
    assert_string_equal(json_string_value(json_object_get(e, "replay_worker")), "cpu");
    json_decref(ev);
    rh_wait_restarted(&r, "gpu", 1);

    /* a forced call's arguments cut after 5 tokens: one function_call
     * item, its arguments the uninterrupted call's */
    const char *call = "{\"input\":\"Weather in Paris?\",\"tools\":[{\"type\":\"function\","
                       "\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                       "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12}},"
                       "\"required\":[\"city\"]}}],\"tool_choice\":\"required\","
                       "\"max_output_tokens\":100,\"temperature\":0";
    snprintf(b, sizeof b, "%s}", call);
    assert_int_equal(wc_request(sock, "POST", "/v1/responses", b, 60000, &d), 0);
    assert_int_equal(d.status, 200);
    want = json_loads(d.body, 0, NULL);
    wc_response_free(&d);
    json_t *wcall = json_array_get(json_object_get(want, "output"), 0);
    assert_string_equal(json_string_value(json_object_get(wcall, "type")), "function_call");
    snprintf(b, sizeof b, "%s,\"stream\":true}", call);
    s = post(&r, "X-Request-Id: resp-call-resumed\r\n", b, 200, NULL);
    rc_stream_check(json_string_value(s), &st);
    assert_string_equal(st.final_type, "response.completed");
    assert_int_equal(st.n_items, 1);
    json_t *got = json_array_get(json_object_get(st.response, "output"), 0);
    assert_string_equal(json_string_value(json_object_get(got, "type")), "function_call");
    assert_string_equal(json_string_value(json_object_get(got, "arguments")),
                        json_string_value(json_object_get(wcall, "arguments")));
    assert_int_equal(strncmp(json_string_value(json_object_get(got, "call_id")), "call_", 5), 0);
    rc_stream_free(&st);
    json_decref(s);
    json_decref(want);
    ev = rh_events(&r);
    assert_int_equal((int)json_array_size(ev), 2);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(ev, 1), "decision")), "resume");
    json_decref(ev);
    rh_wait_restarted(&r, "gpu", 2);
    finish(&r);
}

/* A stream that cannot be resumed anywhere (the CPU worker's context is
 * too short for the prompt and the text sent) ends with response.failed
 * after the text the client has, still one well-formed stream; the
 * router serves on. */
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
    assert_int_equal(rh_start(&r, "resp-unresumable", g_model, NULL, workers), 0);
    json_t *s = post(&r, NULL,
                     "{\"input\":\"Tell a story\",\"max_output_tokens\":20,\"temperature\":0,"
                     "\"ignore_eos\":true,\"stream\":true}",
                     200, NULL);
    rc_stream st;
    rc_stream_check(json_string_value(s), &st);
    assert_string_equal(st.final_type, "response.failed");
    json_t *err = json_object_get(st.response, "error");
    assert_true(json_string_length(json_object_get(err, "code")) > 0);
    assert_true(json_string_length(json_object_get(err, "message")) > 0);
    /* after the text the client had */
    assert_non_null(strstr(json_string_value(s), "response.output_text.delta"));
    rc_stream_free(&st);
    json_decref(s);
    /* not stored: a failed response is nothing to continue */
    json_t *ok = post(&r, NULL, "{\"input\":\"Hi\",\"max_output_tokens\":2}", 200, NULL);
    json_decref(ok);
    finish(&r);
}

/* The capacity fallback: a Responses request alpha's worker can never
 * hold (its context is too short) is answered by beta, labelled so. */
static void test_capacity_fallback(void **state)
{
    (void)state;
    rh_router r;
    rh_init(&r, "resp-fallback", "", NULL, NULL);
    char cfg[4096];
    snprintf(cfg, sizeof cfg,
             "[server]\nlisten = unix:%s\nstate-dir = %s/state\nhealth-interval-ms = 100\n"
             "ready-timeout = 30\n"
             "[model alpha]\npath = %s\nfallback = beta\n"
             "[model beta]\npath = %s\n"
             "[worker ga]\nmodel = alpha\nthreads = 1\nctx-limit = 16\ncalibrate = false\n"
             "[worker gb]\nmodel = beta\nthreads = 1\nctx-limit = 512\ncalibrate = false\n",
             r.sock, r.dir, g_model, g_model);
    FILE *f = fopen(r.cfg, "w");
    assert_non_null(f);
    fputs(cfg, f);
    fclose(f);
    assert_int_equal(rh_run(&r, NULL), 0);
    const char *bodies[] = {
        "{\"model\":\"alpha\",\"input\":\"Tell a long story about a dog and a cat\","
        "\"max_output_tokens\":4}",
        "{\"model\":\"alpha\",\"input\":\"Tell a long story about a dog and a cat\","
        "\"max_output_tokens\":4,\"stream\":true}",
    };
    for (int b = 0; b < 2; b++) {
        wc_response w;
        json_t *j = post(&r, NULL, bodies[b], 200, &w);
        rh_assert_header(&w, "X-Spillway-Model", "beta");
        rh_assert_header(&w, "X-Spillway-Fallback-From", "alpha");
        wc_response_free(&w);
        rc_stream st;
        memset(&st, 0, sizeof st);
        const json_t *resp = j;
        if (b) {
            rc_stream_check(json_string_value(j), &st);
            resp = st.response;
        }
        assert_string_equal(json_string_value(json_object_get(resp, "model")), "beta");
        rc_stream_free(&st);
        json_decref(j);
    }
    /* X-Spillway-Fallback: none: alpha's own typed answer, naming the
     * Responses parameter (input, not messages) */
    json_t *e = post(&r, "X-Spillway-Fallback: none\r\n", bodies[0], 400, NULL);
    json_t *err = json_object_get(e, "error");
    assert_string_equal(json_string_value(json_object_get(err, "code")),
                        "context_length_exceeded");
    assert_string_equal(json_string_value(json_object_get(err, "param")), "input");
    json_decref(e);
    rh_finish(&r);
}

/* A thinking family's reply through the router: a reasoning item before
 * the message, streamed and whole, as the worker itself answers it. */
static void test_reasoning(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "resp-think", g_model, NULL,
                              "chat-template = qwen3\n" /* the [model] section's */
                              "[worker cpu]\nthreads = 1\nmax-seqs = 2\nctx-limit = 512\n"),
                     0);
    json_t *g = json_string("root ::= \"<think>\\n\" [a-z]{2,8} \"\\n</think>\\n\\n\" [a-z]{1,6}\n");
    char *qg = json_dumps(g, JSON_ENCODE_ANY);
    json_decref(g);
    char b[512], sock[700];
    snprintf(b, sizeof b,
             "{\"input\":\"think\",\"max_output_tokens\":60,\"seed\":2,\"temperature\":1,"
             "\"grammar\":%s}", qg);
    rh_worker_sock(&r, "cpu", sock, sizeof sock);
    wc_response d;
    assert_int_equal(wc_request(sock, "POST", "/v1/responses", b, 60000, &d), 0);
    assert_int_equal(d.status, 200);
    json_t *want = json_loads(d.body, 0, NULL);
    wc_response_free(&d);
    json_t *rs = json_array_get(json_object_get(want, "output"), 0);
    assert_string_equal(json_string_value(json_object_get(rs, "type")), "reasoning");
    const char *thought = json_string_value(
        json_object_get(json_array_get(json_object_get(rs, "content"), 0), "text"));
    assert_non_null(thought);
    char want_text[512];
    rc_response_text(want, want_text, sizeof want_text);

    json_t *whole = post(&r, NULL, b, 200, NULL);
    assert_true(json_equal(json_object_get(json_array_get(json_object_get(whole, "output"), 0),
                                           "content"),
                           json_object_get(rs, "content")));
    json_decref(whole);
    snprintf(b, sizeof b,
             "{\"input\":\"think\",\"max_output_tokens\":60,\"seed\":2,\"temperature\":1,"
             "\"grammar\":%s,\"stream\":true}", qg);
    free(qg);
    json_t *s = post(&r, NULL, b, 200, NULL);
    rc_stream st;
    rc_stream_check(json_string_value(s), &st);
    assert_string_equal(st.reasoning, thought);
    assert_string_equal(st.text, want_text);
    assert_int_equal(st.n_items, 2);
    rc_stream_free(&st);
    json_decref(s);
    json_decref(want);
    rh_finish(&r);
}

/* Out of memory at each of the router's allocations for a request in
 * turn (X-Spillway-Fault, common/alloc.h): a stored response, a stream
 * and a follow-up by previous_response_id each answer the unfaulted
 * text or a typed 5xx, a stream stays one well-formed stream (ending
 * failed), and the router serves on and exits cleanly. */
static void test_out_of_memory(void **state)
{
    (void)state;
    rh_router r;
    rh_init(&r, "resp-oom", g_model, NULL,
            "[worker cpu]\nthreads = 1\nmax-seqs = 2\nctx-limit = 512\n");
    assert_int_equal(rh_run(&r, "SPILLWAY_FAULT=fault_header:1"), 0);
    json_t *first = post(&r, NULL, "{\"input\":\"Hello\",\"max_output_tokens\":3,\"seed\":1}",
                         200, NULL);
    char follow[256];
    snprintf(follow, sizeof follow,
             "{\"previous_response_id\":\"%s\",\"input\":\"Go on\",\"max_output_tokens\":3,"
             "\"seed\":1}", id_of(first));
    const char *const bodies[] = {
        "{\"input\":\"Once upon a time\",\"max_output_tokens\":4,\"seed\":3}",
        "{\"input\":\"Once upon a time\",\"max_output_tokens\":4,\"seed\":3,\"stream\":true}",
        follow,
    };
    for (int b = 0; b < 3; b++) {
        bool stream = b == 1;
        char hdr[128], want[8192];
        snprintf(hdr, sizeof hdr, "X-Spillway-Fault: alloc_fail_after:-1\r\n");
        json_t *ref = post(&r, hdr, bodies[b], 200, NULL);
        rc_stream st;
        if (stream) {
            rc_stream_check(json_string_value(ref), &st);
            snprintf(want, sizeof want, "%s", st.text);
            rc_stream_free(&st);
        } else {
            rc_response_text(ref, want, sizeof want);
        }
        json_decref(ref);
        long total = rh_metric(r.sock, "spillway_fault_scope_allocations");
        assert_true(total > 0);
        int failed = 0;
        for (long n = 0; n < total; n++) {
            snprintf(hdr, sizeof hdr, "X-Spillway-Fault: alloc_fail_after:%ld\r\n", n);
            wc_response w;
            assert_int_equal(rh_req(&r, "POST", "/v1/responses", hdr, bodies[b], &w), 0);
            if (w.status == 200 && strstr(w.headers, "text/event-stream")) {
                rc_stream_check(w.body, &st);
                if (!strcmp(st.final_type, "response.failed"))
                    failed++;
                else
                    assert_string_equal(st.text, want);
                rc_stream_free(&st);
            } else if (w.status == 200) {
                json_t *j = rh_body_json(&w);
                if (!j)
                    fail_msg("allocation %ld: a 200 that is not JSON: %s", n, w.body);
                char text[8192];
                assert_string_equal(json_string_value(json_object_get(j, "object")), "response");
                rc_response_text(j, text, sizeof text);
                assert_string_equal(text, want);
                json_decref(j);
            } else {
                if (w.status < 500)
                    fail_msg("allocation %ld: status %d: %s", n, w.status, w.body);
                failed++;
            }
            wc_response_free(&w);
        }
        assert_true(failed > 0);
    }
    json_decref(first);
    json_t *again = post(&r, NULL, bodies[0], 200, NULL);
    json_decref(again);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_previous_response),
        cmocka_unit_test(test_background),
        cmocka_unit_test(test_stream_resumed),
        cmocka_unit_test(test_stream_unresumable),
        cmocka_unit_test(test_capacity_fallback),
        cmocka_unit_test(test_reasoning),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
