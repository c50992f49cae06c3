/* test_router_e2e.c - end-to-end: a real `spillway serve` with real
 * managed workers (one on a sim-gpu pool, one on the CPU) over real
 * sockets (the router listens on a unix socket here).
 *
 * What is covered: admission to the CPU worker and an injected OOM on the
 * GPU worker replayed on the CPU with the same request id; a stream whose
 * GPU worker crashes before the first token (invisible) or after k tokens
 * (resumed on the CPU: one unbroken stream equal to an uninterrupted
 * greedy `spillway run`); a deadline no worker can meet (immediate 503
 * capacity_exceeded with Retry-After, nothing reaches a worker); bad
 * input, missing keys, oversize bodies.
 * Every test stops what it started; workers die with the router
 * (PR_SET_PDEATHSIG) and the router with the test process.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"
#include "modelgen/model_make.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXTOK 512

static char g_model[512];
static char g_pool[64];

static int setup(void **state)
{
    snprintf(g_pool, sizeof g_pool, "rt-e2e-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    return rh_make_model(g_model, sizeof g_model, "router-e2e.gguf", 5);
}

static int teardown(void **state)
{
    rh_stop_all();
    wc_worker_kill_all();
    dev_sim_unlink(g_pool, NULL);
    remove(g_model);
    return 0;
}

static int greedy_ref(const char *prompt, int n, int *tokens)
{
    char nb[16];
    snprintf(nb, sizeof nb, "%d", n);
    const char *args[] = {"-n", nb, "--temp", "0", "--ignore-eos", "-t", "1", NULL};
    return wc_run_tokens(g_model, prompt, args, tokens, MAXTOK);
}

/* Device allocations a grow-policy worker makes at start-up with these
 * options: the smallest N with which SPILLWAY_FAULT=alloc_fail_after:N
 * still starts (start-up is deterministic). */
static int startup_allocs(const char *spec)
{
    int lo = 0, hi = 512;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        char env0[96];
        snprintf(env0, sizeof env0, "SPILLWAY_FAULT=alloc_fail_after:%d", mid);
        const char *env[] = {env0, NULL};
        const char *args[] = {"--device", spec, "--sim-capacity", "64MiB", "--max-seqs", "2",
                              "--threads", "1", "--ctx-limit", "512", "--policy", "grow", NULL};
        wc_worker w;
        int st;
        if (wc_worker_start(&w, g_model, args, env, 30, &st) == 0) {
            wc_worker_stop(&w);
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    dev_sim_unlink(g_pool, NULL);
    return lo;
}

/* The fields OpenAI's API reference marks as required, with their types:
 * completions ("text_completion"), chat ("chat.completion") and their
 * stream chunks. Independent of the worker's code: what a strict client
 * (the official SDKs' models) would reject. */
static void check_openai_shape(json_t *j, bool chat, bool chunk)
{
    assert_true(json_is_object(j));
    assert_true(json_is_string(json_object_get(j, "id")));
    assert_true(json_string_length(json_object_get(j, "id")) > 0);
    assert_true(json_is_integer(json_object_get(j, "created")));
    assert_true(json_is_string(json_object_get(j, "model")));
    const char *object = json_string_value(json_object_get(j, "object"));
    assert_non_null(object);
    assert_string_equal(object, chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                     : "text_completion");
    json_t *choices = json_object_get(j, "choices");
    assert_true(json_is_array(choices));
    if (!chunk)
        assert_int_equal((int)json_array_size(choices), 1);
    for (size_t i = 0; i < json_array_size(choices); i++) {
        json_t *c = json_array_get(choices, i);
        assert_true(json_is_integer(json_object_get(c, "index")));
        json_t *fr = json_object_get(c, "finish_reason");
        assert_non_null(fr); /* required, null while streaming */
        if (!chunk)
            assert_true(json_is_string(fr));
        else
            assert_true(json_is_null(fr) || json_is_string(fr));
        if (json_is_string(fr)) {
            const char *f = json_string_value(fr);
            assert_true(!strcmp(f, "stop") || !strcmp(f, "length") ||
                        !strcmp(f, "content_filter") || !strcmp(f, "tool_calls"));
        }
        if (chat && chunk) {
            assert_true(json_is_object(json_object_get(c, "delta")));
        } else if (chat) {
            json_t *m = json_object_get(c, "message");
            assert_true(json_is_object(m));
            assert_string_equal(json_string_value(json_object_get(m, "role")), "assistant");
            json_t *content = json_object_get(m, "content");
            assert_true(json_is_string(content) || json_is_null(content));
            json_t *refusal = json_object_get(m, "refusal"); /* required, nullable */
            assert_true(json_is_string(refusal) || json_is_null(refusal));
            assert_non_null(json_object_get(c, "logprobs"));
        } else {
            assert_true(json_is_string(json_object_get(c, "text")));
            assert_non_null(json_object_get(c, "logprobs"));
        }
    }
    json_t *u = json_object_get(j, "usage");
    if (!chunk || (u && !json_is_null(u))) {
        assert_true(json_is_object(u));
        assert_true(json_is_integer(json_object_get(u, "prompt_tokens")));
        assert_true(json_is_integer(json_object_get(u, "completion_tokens")));
        assert_true(json_is_integer(json_object_get(u, "total_tokens")));
        assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")),
                         json_integer_value(json_object_get(u, "prompt_tokens")) +
                             json_integer_value(json_object_get(u, "completion_tokens")));
    }
}

/* Every event of a stream but [DONE] has the chunk shape. */
static void check_stream_shape(const wc_response *w, bool chat)
{
    char **evs = NULL;
    int ne = wc_sse_parse(w->body, w->body_len, &evs);
    assert_true(ne >= 2);
    assert_string_equal(evs[ne - 1], "[DONE]");
    for (int i = 0; i < ne - 1; i++) {
        json_t *j = json_loads(evs[i], 0, NULL);
        check_openai_shape(j, chat, true);
        json_decref(j);
    }
    wc_sse_free(evs, ne);
}

/* #1: too big for the GPU worker's free memory -> CPU at admission; then
 * an injected OOM mid-generation on the GPU -> replayed on the CPU. */
static void test_admission_and_oom_replay(void **state)
{
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);

    /* What the model and workspace take on the device, to size a pool
     * where 64 KiB (256 tokens of KV) stay free under the reserve. */
    wc_worker probe;
    const char *pargs[] = {"--device", spec, "--sim-capacity", "64MiB", "--max-seqs", "2",
                           "--threads", "1", "--ctx-limit", "2048", NULL};
    assert_int_equal(wc_worker_start(&probe, g_model, pargs, NULL, 30, NULL), 0);
    wc_response h;
    assert_int_equal(wc_request(probe.socket_path, "GET", "/health", NULL, 5000, &h), 0);
    json_t *hj = rh_body_json(&h);
    long long fixed = json_integer_value(json_object_get(json_object_get(hj, "memory"), "self_bytes"));
    json_decref(hj);
    wc_response_free(&h);
    assert_int_equal(wc_worker_stop(&probe), 0);
    dev_sim_unlink(g_pool, NULL);
    assert_true(fixed > 0);
    long long capacity = (long long)((double)(fixed + 65536) / 0.9) + 4096;

    rh_router r;
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = %lld\nmax-seqs = 2\nthreads = 1\n"
             "ctx-limit = 2048\n[worker cpu]\nthreads = 1\nctx-limit = 2048\n",
             spec, capacity);
    assert_int_equal(rh_start(&r, "admit", g_model, NULL, workers), 0);

    int ref[MAXTOK], got[MAXTOK];
    char finish[32];
    /* small: the GPU worker */
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,"
                         "\"ignore_eos\":true}",
                         &w),
                     0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "gpu");
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    wc_response_free(&w);

    /* 1000 tokens of KV (256 KB) do not fit the 64 KiB free: CPU */
    int n_ref = greedy_ref("Once upon a time", 300, ref);
    assert_int_equal(n_ref, 300);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "X-Request-Id: big-one-1\r\n",
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":300,\"temperature\":0,"
                         "\"ignore_eos\":true}",
                         &w),
                     0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "cpu");
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    rh_assert_header(&w, "X-Request-Id", "big-one-1");
    int n = wc_tokens_of(&w, false, got, MAXTOK, NULL, finish, sizeof finish);
    assert_int_equal(n, n_ref);
    assert_memory_equal(got, ref, (size_t)n * sizeof *got);
    wc_response_free(&w);
    /* no failure, so no failover event */
    json_t *ev = rh_events(&r);
    assert_int_equal((int)json_array_size(ev), 0);
    json_decref(ev);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);

    /* Injected OOM: grow policy, device allocations fail after start-up
     * plus one KV block (16 tokens): a 40-token generation of an
     * 8-token prompt fails in decode on the GPU. */
    int startup = startup_allocs(spec);
    assert_true(startup > 0 && startup < 512);
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nmax-seqs = 2\nthreads = 1\n"
             "ctx-limit = 512\npolicy = grow\nfault = alloc_fail_after:%d\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 512\n",
             spec, startup + 1);
    assert_int_equal(rh_start(&r, "oom", g_model, NULL, workers), 0);
    n_ref = greedy_ref("Once upon a time", 40, ref);
    assert_int_equal(n_ref, 40);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "X-Request-Id: oom-replay-7\r\n",
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,"
                         "\"ignore_eos\":true}",
                         &w),
                     0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "cpu");
    rh_assert_header(&w, "X-Spillway-Attempts", "2");
    rh_assert_header(&w, "X-Request-Id", "oom-replay-7");
    json_t *j = rh_body_json(&w);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "cmpl-oom-replay-7");
    check_openai_shape(j, false, false);
    json_decref(j);
    n = wc_tokens_of(&w, false, got, MAXTOK, NULL, finish, sizeof finish);
    assert_int_equal(n, n_ref);
    assert_memory_equal(got, ref, (size_t)n * sizeof *got);
    wc_response_free(&w);

    ev = rh_events(&r);
    assert_int_equal((int)json_array_size(ev), 1);
    json_t *e = json_array_get(ev, 0);
    assert_string_equal(json_string_value(json_object_get(e, "request_id")), "oom-replay-7");
    json_t *fe = json_object_get(e, "first_error");
    assert_string_equal(json_string_value(json_object_get(fe, "worker")), "gpu");
    assert_string_equal(json_string_value(json_object_get(fe, "kind")), "oom");
    assert_string_equal(json_string_value(json_object_get(fe, "phase")), "decode");
    assert_string_equal(json_string_value(json_object_get(e, "decision")), "replay");
    assert_string_equal(json_string_value(json_object_get(e, "outcome")), "completed");
    assert_string_equal(json_string_value(json_object_get(e, "replay_worker")), "cpu");
    assert_true(json_is_true(json_object_get(e, "client_connected")));
    assert_int_equal(json_integer_value(json_object_get(e, "attempts")), 2);
    assert_int_equal(json_integer_value(json_object_get(e, "tokens")), 40);
    json_decref(ev);
    /* the same record in the state directory */
    char path[700];
    snprintf(path, sizeof path, "%s/state/events.jsonl", r.dir);
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"oom-replay-7\""));
    sw_free(text);
    /* the poisoned GPU worker is restarted */
    rh_wait_restarted(&r, "gpu", 1);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

/* A stream through the router: its tokens (strict SSE) and finish. */
static int stream_tokens(const rh_router *r, const char *rid, const char *body, int *got,
                         wc_response *w)
{
    char hdr[128];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", rid);
    assert_int_equal(rh_req(r, "POST", "/v1/completions", hdr, body, w), 0);
    assert_int_equal(w->status, 200);
    char finish[32];
    return wc_tokens_of(w, true, got, MAXTOK, NULL, finish, sizeof finish);
}

/* #2: crash before the first token (invisible) and after k tokens
 * (resumed on the CPU). */
static void test_stream_crash(void **state)
{
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    int ref[MAXTOK], got[MAXTOK];
    int n_ref = greedy_ref("Once upon a time", 24, ref);
    assert_int_equal(n_ref, 24);
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,"
                       "\"ignore_eos\":true,\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true}}";
    const int ks[] = {0, 5};
    for (int t = 0; t < 2; t++) {
        rh_router r;
        char workers[1024];
        snprintf(workers, sizeof workers,
                 "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nmax-seqs = 2\nthreads = 1\n"
                 "ctx-limit = 512\nfault = abort_after_tokens:%d,stall_ms:20\n"
                 "[worker cpu]\nthreads = 1\nctx-limit = 512\n",
                 spec, ks[t]);
        assert_int_equal(rh_start(&r, ks[t] ? "stream-k" : "stream-0", g_model, NULL, workers), 0);
        wc_response w;
        char rid[32];
        snprintf(rid, sizeof rid, "stream-crash-%d", ks[t]);
        int n = stream_tokens(&r, rid, body, got, &w);
        assert_int_equal(n, n_ref);
        assert_memory_equal(got, ref, (size_t)n * sizeof *got);
        /* every event carries the same id: cmpl- and the request id */
        char want_id[64];
        snprintf(want_id, sizeof want_id, "cmpl-%s", rid);
        char **evs = NULL;
        int ne = wc_sse_parse(w.body, w.body_len, &evs);
        assert_true(ne > n);
        for (int i = 0; i < ne - 1; i++) {
            json_t *j = json_loads(evs[i], 0, NULL);
            assert_non_null(j);
            assert_null(json_object_get(j, "error"));
            assert_string_equal(json_string_value(json_object_get(j, "id")), want_id);
            json_decref(j);
        }
        assert_string_equal(evs[ne - 1], "[DONE]");
        /* usage counts every token the client got, resumed ones too */
        json_t *u = json_loads(evs[ne - 2], 0, NULL);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(u, "usage"),
                                                            "completion_tokens")),
                         24);
        json_decref(u);
        wc_sse_free(evs, ne);
        rh_assert_header(&w, "X-Request-Id", rid);
        check_stream_shape(&w, false);
        /* k = 0: the headers came from the CPU attempt; k > 0: from the GPU's */
        rh_assert_header(&w, "X-Spillway-Worker", ks[t] ? "gpu" : "cpu");
        wc_response_free(&w);

        json_t *ev = rh_events(&r);
        assert_int_equal((int)json_array_size(ev), 1);
        json_t *e = json_array_get(ev, 0);
        json_t *fe = json_object_get(e, "first_error");
        assert_string_equal(json_string_value(json_object_get(fe, "kind")), "worker_crash");
        assert_string_equal(json_string_value(json_object_get(fe, "worker")), "gpu");
        assert_string_equal(json_string_value(json_object_get(e, "decision")),
                            ks[t] ? "resume" : "replay");
        assert_string_equal(json_string_value(json_object_get(e, "outcome")), "completed");
        assert_string_equal(json_string_value(json_object_get(e, "replay_worker")), "cpu");
        assert_int_equal(json_integer_value(json_object_get(e, "tokens")), 24);
        json_decref(ev);
        /* the crashed worker comes back */
        rh_wait_restarted(&r, "gpu", 1);
        if (ks[t]) {
            /* A chat stream crashes the same way (the restarted worker
             * keeps its fault): one role chunk, and the tokens of an
             * uninterrupted run on the CPU worker itself. */
            const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell a story\"}],"
                               "\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true";
            char body_s[512], body_n[512], cpu_sock[700];
            snprintf(body_s, sizeof body_s, "%s,\"stream\":true}", chat);
            snprintf(body_n, sizeof body_n, "%s}", chat);
            snprintf(cpu_sock, sizeof cpu_sock, "%s/state/cpu.sock", r.dir);
            wc_response d;
            assert_int_equal(wc_request(cpu_sock, "POST", "/v1/chat/completions", body_n, 30000, &d), 0);
            assert_int_equal(d.status, 200);
            int want[MAXTOK];
            char fin[32];
            int n_want = wc_tokens_of(&d, false, want, MAXTOK, NULL, fin, sizeof fin);
            wc_response_free(&d);
            assert_int_equal(n_want, 24);
            assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", "X-Request-Id: chat-k\r\n",
                                 body_s, &w), 0);
            assert_int_equal(w.status, 200);
            n = wc_tokens_of(&w, true, got, MAXTOK, NULL, fin, sizeof fin);
            assert_int_equal(n, n_want);
            assert_memory_equal(got, want, (size_t)n * sizeof *got);
            ne = wc_sse_parse(w.body, w.body_len, &evs);
            int roles = 0;
            for (int i = 0; i < ne - 1; i++) {
                json_t *j = json_loads(evs[i], 0, NULL);
                json_t *delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
                roles += json_object_get(delta, "role") != NULL;
                assert_string_equal(json_string_value(json_object_get(j, "object")),
                                    "chat.completion.chunk");
                json_decref(j);
            }
            wc_sse_free(evs, ne);
            assert_int_equal(roles, 1);
            check_stream_shape(&w, true);
            wc_response_free(&w);
            /* A sampled stream (seed given) resumes the same random
             * stream: the tokens of an uninterrupted run on the CPU. */
            const char *sampled = "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,"
                                  "\"temperature\":0.9,\"top_k\":40,\"seed\":7,\"ignore_eos\":true";
            snprintf(body_s, sizeof body_s, "%s,\"stream\":true}", sampled);
            snprintf(body_n, sizeof body_n, "%s}", sampled);
            assert_int_equal(wc_request(cpu_sock, "POST", "/v1/completions", body_n, 30000, &d), 0);
            assert_int_equal(d.status, 200);
            n_want = wc_tokens_of(&d, false, want, MAXTOK, NULL, fin, sizeof fin);
            wc_response_free(&d);
            assert_int_equal(n_want, 24);
            rh_wait_restarted(&r, "gpu", 2); /* the chat request crashed it again */
            n = stream_tokens(&r, "sampled-k", body_s, got, &w);
            assert_int_equal(n, n_want);
            assert_memory_equal(got, want, (size_t)n * sizeof *got);
            wc_response_free(&w);
            ev = rh_events(&r);
            assert_int_equal((int)json_array_size(ev), 3);
            assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 2), "decision")),
                                "resume");
            json_decref(ev);
            ev = rh_events(&r);
            assert_int_equal((int)json_array_size(ev), 3);
            assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 1), "decision")),
                                "resume");
            json_decref(ev);
            /* A stop string whose start (tokens 3-4's text) is held back
             * when the GPU worker dies after 5 tokens: the resumed stream
             * still gives the client every byte of the uninterrupted text. */
            char *texts[64];
            int ids[64];
            snprintf(body_s, sizeof body_s,
                     "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,"
                     "\"ignore_eos\":true,\"stream\":true}");
            assert_int_equal(wc_request(cpu_sock, "POST", "/v1/completions", body_s, 30000, &d), 0);
            int nc = wc_stream_chunks(&d, texts, ids, 64);
            wc_response_free(&d);
            assert_true(nc > 6 && ids[2] >= 0 && ids[4] >= 0);
            char *full = sw_strdup(texts[nc - 1]);
            char stop[256];
            snprintf(stop, sizeof stop, "%s~#~never", texts[4] + strlen(texts[2]));
            assert_true(strlen(stop) > strlen("~#~never"));
            for (int i = 0; i < nc; i++)
                sw_free(texts[i]);
            json_t *js = json_string(stop);
            char *jstop = json_dumps(js, JSON_ENCODE_ANY);
            json_decref(js);
            snprintf(body_s, sizeof body_s,
                     "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,"
                     "\"ignore_eos\":true,\"stream\":true,\"stop\":[%s]}", jstop);
            free(jstop);
            rh_wait_restarted(&r, "gpu", 3);
            assert_int_equal(rh_req(&r, "POST", "/v1/completions", "X-Request-Id: held-stop\r\n",
                                 body_s, &w), 0);
            assert_int_equal(w.status, 200);
            nc = wc_stream_chunks(&w, texts, ids, 64);
            wc_response_free(&w);
            assert_true(nc > 0);
            assert_string_equal(texts[nc - 1], full);
            for (int i = 0; i < nc; i++)
                sw_free(texts[i]);
            sw_free(full);
            ev = rh_events(&r);
            assert_int_equal((int)json_array_size(ev), 4);
            assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 3), "decision")),
                                "resume");
            json_decref(ev);
        }
        rh_finish(&r);
        dev_sim_unlink(g_pool, NULL);
    }
}

/* #5: a deadline shorter than any worker's predicted time. */
static void test_deadline(void **state)
{
    rh_router r;
    assert_int_equal(rh_start(&r, "deadline", g_model, NULL,
                                  "[worker cpu]\nthreads = 1\nctx-limit = 512\n"),
                     0);
    wc_response w;
    /* one request measures the worker's prefill and decode rates */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}",
                         &w),
                     0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    double t0 = tu_now_s();
    for (;;) {
        json_t *h = rh_worker_health(&r, "cpu");
        bool rates = json_number_value(json_object_get(h, "prefill_tokens_per_second")) > 0 &&
                     json_number_value(json_object_get(h, "decode_tokens_per_second")) > 0;
        json_decref(h);
        if (rates)
            break;
        assert_true(tu_now_s() - t0 < 10);
        usleep(50 * 1000);
    }
    char path[700];
    snprintf(path, sizeof path, "%s/state/cpu.sock", r.dir);
    wc_response m0;
    assert_int_equal(wc_request(path, "GET", "/metrics", NULL, 5000, &m0), 0);

    char code[64];
    /* 400 new tokens cannot be made in 1 ms */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "X-Spillway-Deadline-Ms: 1\r\n",
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":400}", &w),
                     0);
    assert_int_equal(w.status, 503);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "capacity_exceeded");
    rh_assert_header(&w, "Retry-After", NULL);
    wc_response_free(&w);
    /* the body's timeout (seconds) works too */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"timeout\":0.001}",
                         &w),
                     0);
    assert_int_equal(w.status, 503);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "capacity_exceeded");
    wc_response_free(&w);
    /* nothing reached the worker: its request counters did not move */
    wc_response m1;
    assert_int_equal(wc_request(path, "GET", "/metrics", NULL, 5000, &m1), 0);
    assert_string_equal(m0.body, m1.body);
    wc_response_free(&m0);
    wc_response_free(&m1);
    /* a generous deadline is served */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", "X-Spillway-Deadline-Ms: 600000\r\n",
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}", &w),
                     0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    rh_finish(&r);
}

/* #6: bad input, unauthorised, oversize: the 4xx, and the router keeps
 * serving. */
static void test_bad_requests(void **state)
{
    rh_router r;
    assert_int_equal(rh_start(&r, "bad", g_model, "api-keys = test-key-0123456789\nmax-body = 4KiB\n",
                                  "[worker cpu]\nthreads = 1\nctx-limit = 512\n"),
                     0);
    const char *auth = "Authorization: Bearer test-key-0123456789\r\n";
    char code[64];
    wc_response w;
    json_t *okj;
    /* /health needs no key */
    assert_int_equal(rh_req(&r, "GET", "/health", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    /* no key, wrong key */
    const char *ok_body = "{\"prompt\":\"Hi\",\"max_tokens\":2}";
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, ok_body, &w), 0);
    assert_int_equal(w.status, 401);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "invalid_api_key");
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions",
                         "Authorization: Bearer test-key-0123456780\r\n", ok_body, &w),
                     0);
    assert_int_equal(w.status, 401);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "GET", "/metrics", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 401);
    wc_response_free(&w);
    /* the models, listed and retrieved, through the router (with the key) */
    assert_int_equal(rh_req(&r, "GET", "/v1/models/spillway-synthetic", auth, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    okj = rh_body_json(&w);
    assert_string_equal(json_string_value(json_object_get(okj, "id")), "spillway-synthetic");
    json_decref(okj);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "GET", "/v1/models/nope", auth, NULL, &w), 0);
    assert_int_equal(w.status, 404);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "model_not_found");
    wc_response_free(&w);
    /* not JSON */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", auth, "{\"prompt\":", &w), 0);
    assert_int_equal(w.status, 400);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "invalid_json");
    json_t *ej = json_object_get(okj = rh_body_json(&w), "error");
    assert_true(json_is_string(json_object_get(ej, "message")));
    assert_string_equal(json_string_value(json_object_get(ej, "type")), "invalid_request_error");
    assert_non_null(json_object_get(ej, "param"));
    json_decref(okj);
    wc_response_free(&w);
    /* an integer past 64 bits outside a schema: the router's own typed
     * 400 naming the field (never rounded) */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", auth,
                            "{\"prompt\":\"Hi\",\"max_tokens\":18446744073709551616}", &w),
                     0);
    assert_int_equal(w.status, 400);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "invalid_request");
    assert_non_null(strstr(w.body, "64 bits"));
    assert_non_null(strstr(w.body, "\"param\":\"max_tokens\""));
    wc_response_free(&w);
    /* the worker's 400 is relayed, never retried */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", auth, "{\"prompt\":7}", &w), 0);
    assert_int_equal(w.status, 400);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "invalid_request");
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", auth,
                         "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", &w),
                     0);
    assert_int_equal(w.status, 400);
    wc_response_free(&w);
    /* nested too deeply */
    char deep[256];
    int dn = snprintf(deep, sizeof deep, "{\"prompt\":\"Hi\",\"x\":");
    for (int i = 0; i < 40; i++)
        deep[dn++] = '[';
    for (int i = 0; i < 40; i++)
        deep[dn++] = ']';
    deep[dn++] = '}';
    deep[dn] = 0;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", auth, deep, &w), 0);
    assert_int_equal(w.status, 400);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "invalid_request");
    wc_response_free(&w);
    /* oversize */
    char *big = sw_malloc(8192);
    assert_non_null(big);
    memset(big, 'a', 8191);
    big[8191] = 0;
    memcpy(big, "{\"prompt\":\"", 11);
    memcpy(big + 8189, "\"}", 2);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", auth, big, &w), 0);
    assert_int_equal(w.status, 413);
    wc_response_free(&w);
    sw_free(big);
    /* unknown path, wrong method, garbage request line */
    assert_int_equal(rh_req(&r, "GET", "/v1/nothing", auth, NULL, &w), 0);
    assert_int_equal(w.status, 404);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "GET", "/v1/completions", auth, NULL, &w), 0);
    assert_int_equal(w.status, 405);
    wc_response_free(&w);
    assert_int_equal(wc_raw(r.sock, "NONSENSE\r\n\r\n", 12, 10000, &w), 0);
    assert_int_equal(w.status, 400);
    wc_response_free(&w);
    /* two Content-Lengths that disagree: which body is meant is ambiguous */
    {
        char raw[512];
        int n = snprintf(raw, sizeof raw,
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: 2\r\n"
                         "Content-Length: 40\r\n\r\n{}",
                         auth);
        assert_int_equal(wc_raw(r.sock, raw, (size_t)n, 10000, &w), 0);
        assert_int_equal(w.status, 400);
        wc_response_free(&w);
    }
    /* still serving, and the metrics count the refusals */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", auth, ok_body, &w), 0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "cpu");
    okj = rh_body_json(&w);
    check_openai_shape(okj, false, false);
    json_decref(okj);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", auth,
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3}",
                         &w),
                     0);
    assert_int_equal(w.status, 200);
    okj = rh_body_json(&w);
    check_openai_shape(okj, true, false);
    json_decref(okj);
    wc_response_free(&w);
    assert_int_equal(rh_req(&r, "GET", "/metrics", auth, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    assert_non_null(strstr(w.body, "spillway_router_requests_total{worker=\"none\",outcome=\"unauthorized\"} 3"));
    assert_non_null(strstr(w.body, "spillway_router_requests_total{worker=\"cpu\",outcome=\"ok\"} 2"));
    assert_non_null(strstr(w.body, "spillway_router_request_duration_seconds_count 2\n"));
    assert_non_null(strstr(w.body, "spillway_router_request_duration_seconds_bucket{le=\"+Inf\"} 2\n"));
    assert_non_null(strstr(w.body, "spillway_router_time_to_first_token_seconds_count 0\n"));
    wc_response_free(&w);
    rh_finish(&r);
}

/* A sim-gpu pool capacity that leaves about free_bytes free under the 10%
 * reserve once a worker with these options has started. */
static long long pool_for_free(const char *spec, long long free_bytes)
{
    wc_worker probe;
    const char *pargs[] = {"--device", spec, "--sim-capacity", "64MiB", "--max-seqs", "4",
                           "--threads", "1", "--ctx-limit", "1024", NULL};
    assert_int_equal(wc_worker_start(&probe, g_model, pargs, NULL, 30, NULL), 0);
    wc_response h;
    assert_int_equal(wc_request(probe.socket_path, "GET", "/health", NULL, 5000, &h), 0);
    json_t *hj = rh_body_json(&h);
    long long fixed =
        json_integer_value(json_object_get(json_object_get(hj, "memory"), "self_bytes"));
    json_decref(hj);
    wc_response_free(&h);
    assert_int_equal(wc_worker_stop(&probe), 0);
    dev_sim_unlink(g_pool, NULL);
    assert_true(fixed > 0);
    return (long long)((double)(fixed + free_bytes) / 0.9) + 4096;
}

typedef struct mixed_req {
    const rh_router *r;
    int index;
    bool big, stream;
    int status;
    int n_tokens;
    int tokens[MAXTOK];
    char worker[64];
    char attempts[16];
    char error[64];
} mixed_req;

static void *mixed_thread(void *arg)
{
    mixed_req *m = arg;
    char body[256], hdr[64];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true,\"stream\":%s}",
             m->big ? 300 : 20, m->stream ? "true" : "false");
    snprintf(hdr, sizeof hdr, "X-Request-Id: mixed-%d\r\n", m->index);
    wc_response w;
    m->n_tokens = -1;
    if (rh_req(m->r, "POST", "/v1/completions", hdr, body, &w) == 0) {
        m->status = w.status;
        char finish[32];
        if (w.status == 200)
            m->n_tokens = wc_tokens_of(&w, m->stream, m->tokens, MAXTOK, NULL, finish,
                                       sizeof finish);
        else
            rh_error_code(&w, m->error, sizeof m->error);
        wc_header(&w, "X-Spillway-Worker", m->worker, sizeof m->worker);
        wc_header(&w, "X-Spillway-Attempts", m->attempts, sizeof m->attempts);
    }
    wc_response_free(&w);
    return NULL;
}

/* #4: 16 concurrent mixed requests while the GPU worker gets SIGKILL:
 * every one completes (replayed or resumed on the CPU) or ends with a
 * typed error, the CPU's own requests are untouched, and the restarted
 * GPU worker serves again. */
/* Admission counts a chat prompt as the worker renders it: the tool
 * definitions count too. A short message with long tools over the
 * context limit is refused by the router itself (400
 * context_length_exceeded, the worker never asked: its client-error count
 * stays 0); the same message without the tools is served. */
static void test_admission_counts_tools(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "tools-count", g_model, NULL,
                              "[worker cpu]\nthreads = 1\nctx-limit = 256\n"),
                     0);
    char desc[1200];
    memset(desc, 0, sizeof desc);
    for (size_t i = 0; i + 5 < sizeof desc; i += 5)
        memcpy(desc + i, "word ", 5);
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":1,"
             "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
             "\"description\":\"%s\",\"parameters\":{\"type\":\"object\"}}}]}",
             desc);
    wc_response w;
    char code[64];
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL, body, &w), 0);
    assert_int_equal(w.status, 400);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "context_length_exceeded");
    wc_response_free(&w);
    assert_int_equal(rh_metric(r.sock, "spillway_router_requests_total{worker=\"cpu\","
                                       "outcome=\"client_error\"}"),
                     0);
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL,
                            "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                            "\"max_tokens\":1}",
                            &w),
                     0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    rh_finish(&r);
}

/* A grammar (GBNF) passes through the router: a stream whose GPU worker
 * crashes after 3 tokens (sent: each token stalls 20 ms) is resumed on the CPU (the body re-serialized
 * with the resume, the resumed tokens fed through the grammar again) and
 * the whole text still matches it; a grammar that does not parse is the
 * worker's 400, naming the param; a NUL in the prompt passes through. */
static void test_grammar_resumed(void **state)
{
    (void)state;
    char spec[96], workers[512];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nmax-seqs = 2\nthreads = 1\n"
             "ctx-limit = 512\nfault = abort_after_tokens:3,stall_ms:20\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 512\n",
             spec);
    rh_router r;
    assert_int_equal(rh_start(&r, "grammar", g_model, NULL, workers), 0);
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"prompt\":\"Once\",\"max_tokens\":24,\"stream\":true,\"seed\":5,"
                            "\"grammar\":\"root ::= \\\"(\\\" [a-z]{12} \\\")\\\"\"}",
                            &w),
                     0);
    assert_int_equal(w.status, 200);
    int toks[MAXTOK];
    char *text = NULL, finish[32];
    assert_true(wc_tokens_of(&w, true, toks, MAXTOK, &text, finish, sizeof finish) > 3);
    assert_string_equal(finish, "stop");
    bool ok = strlen(text) == 14 && text[0] == '(' && text[13] == ')';
    for (int i = 1; ok && i < 13; i++)
        ok = text[i] >= 'a' && text[i] <= 'z';
    if (!ok)
        fail_msg("not in the grammar: '%s'", text);
    sw_free(text);
    wc_response_free(&w);
    json_t *ev = rh_events(&r);
    assert_int_equal((int)json_array_size(ev), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "decision")),
                        "resume");
    json_decref(ev);
    char code[64];
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"prompt\":\"Once\",\"grammar\":\"root ::= [a-\"}", &w),
                     0);
    assert_int_equal(w.status, 400);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "invalid_request");
    assert_non_null(strstr(w.body, "\"param\":\"grammar\""));
    wc_response_free(&w);
    /* a NUL in the prompt passes through to the worker, which takes it */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"prompt\":\"H\\u0000i\",\"max_tokens\":2}", &w),
                     0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    /* a schema with bounds past 64 bits passes through the router to the
     * worker (here the CPU one, not resumed; a resume's re-serialized body
     * writes the numbers back: sw_json_dumps, checked in test_json_schema) */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"prompt\":\"Once\",\"max_tokens\":40,\"stream\":true,\"seed\":5,"
                            "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
                            "\"name\":\"n\",\"schema\":{\"type\":\"integer\",\"minimum\":"
                            "18446744073709551616,\"maximum\":100000000000000000000000}}}}",
                            &w),
                     0);
    assert_int_equal(w.status, 200);
    assert_true(wc_tokens_of(&w, true, toks, MAXTOK, &text, finish, sizeof finish) > 0);
    assert_string_equal(finish, "stop");
    size_t n = strlen(text);
    if (strspn(text, "0123456789") != n || n < 20 || n > 24 || text[0] == '0' ||
        (n == 20 && strcmp(text, "18446744073709551616") < 0) ||
        (n == 24 && strcmp(text, "100000000000000000000000") > 0))
        fail_msg("outside [2^64, 10^23]: '%s'", text);
    sw_free(text);
    wc_response_free(&w);
    ev = rh_events(&r);
    print_message("  bounds past 64 bits: %zu failover event(s) so far\n", json_array_size(ev));
    json_decref(ev);
    rh_finish(&r);
}

static void test_kill_gpu_under_load(void **state)
{
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    /* 256 tokens of KV free: 300-token requests go to the CPU */
    long long capacity = pool_for_free(spec, 65536);
    rh_router r;
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = %lld\nmax-seqs = 4\nthreads = 1\n"
             "ctx-limit = 1024\nfault = stall_ms:20\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 1024\nmax-seqs = 8\n",
             spec, capacity);
    assert_int_equal(rh_start(&r, "kill", g_model, NULL, workers), 0);
    int ref_small[MAXTOK], ref_big[MAXTOK];
    assert_int_equal(greedy_ref("Once upon a time", 20, ref_small), 20);
    assert_int_equal(greedy_ref("Once upon a time", 300, ref_big), 300);
    json_t *h = rh_worker_health(&r, "gpu");
    pid_t gpu_pid = (pid_t)json_integer_value(json_object_get(h, "pid"));
    json_decref(h);
    assert_true(gpu_pid > 0);

    static mixed_req reqs[16];
    pthread_t th[16];
    for (int i = 0; i < 16; i++) {
        memset(&reqs[i], 0, sizeof reqs[i]);
        reqs[i].r = &r;
        reqs[i].index = i;
        reqs[i].big = i % 4 == 3;
        reqs[i].stream = i % 2 == 0;
        assert_int_equal(pthread_create(&th[i], NULL, mixed_thread, &reqs[i]), 0);
    }
    usleep(150 * 1000);
    assert_int_equal(kill(gpu_pid, SIGKILL), 0);
    for (int i = 0; i < 16; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 16; i++) {
        mixed_req *m = &reqs[i];
        if (m->status != 200) {
            /* a typed error is allowed, never a hang or a lost request */
            if (!m->error[0])
                fail_msg("request %d: status %d without a typed error", i, m->status);
            continue;
        }
        const int *ref = m->big ? ref_big : ref_small;
        int want = m->big ? 300 : 20;
        if (m->n_tokens != want || memcmp(m->tokens, ref, (size_t)want * sizeof *ref))
            fail_msg("request %d (%s, %s): %d tokens, not the greedy run's", i,
                     m->big ? "big" : "small", m->stream ? "stream" : "non-stream", m->n_tokens);
        if (m->big) {
            /* admitted to the CPU from the start and never disturbed */
            assert_string_equal(m->worker, "cpu");
            assert_string_equal(m->attempts, "1");
        }
    }
    rh_wait_restarted(&r, "gpu", 1);
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0}", &w),
                     0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "gpu");
    wc_response_free(&w);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

static long long kv_used(const char *sock)
{
    wc_response w;
    if (wc_request(sock, "GET", "/health", NULL, 5000, &w) != 0)
        return -1;
    json_t *j = rh_body_json(&w);
    long long v = json_integer_value(json_object_get(json_object_get(j, "memory"), "kv_used_bytes"));
    json_decref(j);
    wc_response_free(&w);
    return v;
}

/* #3: the client hangs up while its stream runs on the CPU after a
 * failover: the CPU worker frees the sequence, the GPU worker (restarted)
 * holds no KV, and the event says the client left. */
static void test_cancel_during_failover(void **state)
{
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    rh_router r;
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nthreads = 1\nctx-limit = 512\n"
             "fault = abort_after_tokens:3,stall_ms:20\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 512\nfault = stall_ms:30\n",
             spec);
    assert_int_equal(rh_start(&r, "cancel", g_model, NULL, workers), 0);
    char cpu_sock[700], gpu_sock[700];
    snprintf(cpu_sock, sizeof cpu_sock, "%s/state/cpu.sock", r.dir);
    snprintf(gpu_sock, sizeof gpu_sock, "%s/state/gpu.sock", r.dir);
    long long cpu0 = kv_used(cpu_sock), gpu0 = kv_used(gpu_sock);
    assert_true(cpu0 >= 0 && gpu0 >= 0);

    int fd = wc_connect(r.sock, 20000);
    assert_true(fd >= 0);
    assert_int_equal(wc_send(fd, "POST", "/v1/completions",
                             "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,"
                             "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}"),
                     0);
    /* read until more tokens arrived than the GPU worker could send */
    static char buf[1 << 16];
    size_t len = 0;
    int tokens = 0;
    while (tokens < 8 && len < sizeof buf - 1) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        assert_true(n > 0);
        len += (size_t)n;
        buf[len] = 0;
        tokens = 0;
        for (char *p = buf; (p = strstr(p, "\"token_ids\":[")); p += 13)
            if (p[13] != ']')
                tokens++;
    }
    /* the CPU now runs the resumed request */
    assert_true(kv_used(cpu_sock) > cpu0);
    close(fd);
    double t0 = tu_now_s();
    while (kv_used(cpu_sock) != cpu0) {
        if (tu_now_s() - t0 > 10)
            fail_msg("the CPU worker still holds KV memory after the client left");
        usleep(20 * 1000);
    }
    rh_wait_restarted(&r, "gpu", 1);
    assert_int_equal(kv_used(gpu_sock), gpu0);
    t0 = tu_now_s();
    for (;;) {
        json_t *ev = rh_events(&r);
        json_t *e = json_array_get(ev, 0);
        if (e) {
            assert_string_equal(json_string_value(json_object_get(e, "outcome")), "cancelled");
            assert_true(json_is_false(json_object_get(e, "client_connected")));
            assert_string_equal(json_string_value(json_object_get(e, "decision")), "resume");
            json_decref(ev);
            break;
        }
        json_decref(ev);
        assert_true(tu_now_s() - t0 < 10);
        usleep(20 * 1000);
    }
    /* A non-stream request whose client leaves while its replay runs on
     * the CPU (the GPU worker crashed after 3 tokens) is cancelled there. */
    fd = wc_connect(r.sock, 20000);
    assert_true(fd >= 0);
    assert_int_equal(wc_send(fd, "POST", "/v1/completions",
                             "{\"prompt\":\"Once upon a time\",\"max_tokens\":500,"
                             "\"temperature\":0,\"ignore_eos\":true}"),
                     0);
    t0 = tu_now_s();
    while (kv_used(cpu_sock) == cpu0) { /* replayed on the CPU after the crash */
        assert_true(tu_now_s() - t0 < 10);
        usleep(10 * 1000);
    }
    close(fd);
    t0 = tu_now_s();
    while (kv_used(cpu_sock) != cpu0) {
        if (tu_now_s() - t0 > 10)
            fail_msg("the CPU worker still holds KV memory after the client left");
        usleep(20 * 1000);
    }
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

/* A worker that cannot start (cuda:99: no CUDA in this build, no such GPU
 * in a CUDA one, where cuda:0 would start) stops `spillway serve` with
 * status 1 at once instead of restarting it forever; a bad configuration
 * is status 2. */
static void test_startup_failure(void **state)
{
    char dir[400], cfg[500], text[2400];
    snprintf(dir, sizeof dir, "%s", tu_tmp_path("rt-startfail"));
    mkdir(dir, 0700);
    snprintf(cfg, sizeof cfg, "%s/bad-worker.ini", dir);
    snprintf(text, sizeof text,
             "[server]\nlisten = unix:%s/r.sock\nstate-dir = %s/state\nready-timeout = 60\n"
             "[model]\npath = %s\n[worker gpu]\ndevice = cuda:99\n",
             dir, dir, g_model);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    char *out = NULL;
    int st = -1;
    char *argv[] = {(char *)tu_spillway_bin(), "serve", "--config", cfg, NULL};
    double t0 = tu_now_s();
    assert_int_equal(tu_run_capture(argv, 30, &out, &st), 0);
    sw_free(out);
    assert_int_equal(st, 1);
    assert_true(tu_now_s() - t0 < 30); /* not the 60 s ready time-out */
    f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("[server]\nlisten = 127.0.0.1:0\nmax-attempts = many\n", f);
    fclose(f);
    assert_int_equal(tu_run_capture(argv, 30, &out, &st), 0);
    sw_free(out);
    assert_int_equal(st, 2);
    tu_rm_tree(dir);
}

/* A request that arrives while the only worker restarts waits in the
 * queue and is served once the worker is back. */
static void test_queue_while_restarting(void **state)
{
    rh_router r;
    assert_int_equal(rh_start(&r, "queue", g_model, NULL, "[worker cpu]\nthreads = 1\nctx-limit = 512\n"), 0);
    json_t *h = rh_worker_health(&r, "cpu");
    pid_t pid = (pid_t)json_integer_value(json_object_get(h, "pid"));
    json_decref(h);
    assert_int_equal(kill(pid, SIGKILL), 0);
    /* until the router has seen it go */
    double t0 = tu_now_s();
    bool seen_down = false;
    while (tu_now_s() - t0 < 10 && !seen_down) {
        h = rh_worker_health(&r, "cpu");
        seen_down = strcmp(json_string_value(json_object_get(h, "state")), "ready") != 0;
        json_decref(h);
        if (!seen_down)
            usleep(5 * 1000);
    }
    assert_true(seen_down);
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}", &w),
                     0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    wc_response_free(&w);
    h = rh_worker_health(&r, "cpu");
    assert_true(json_integer_value(json_object_get(h, "restarts")) >= 1);
    json_decref(h);
    rh_finish(&r);
}

/* A worker given by url (not managed): used in its preference place,
 * reported down when it goes away (never restarted by the router), and
 * the managed worker takes its requests. */
static void test_external_worker(void **state)
{
    wc_worker ext;
    const char *args[] = {"--threads", "1", "--ctx-limit", "512", NULL};
    assert_int_equal(wc_worker_start(&ext, g_model, args, NULL, 30, NULL), 0);
    rh_router r;
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker cpu]\nthreads = 1\nctx-limit = 512\npreference = 2\n"
             "[worker ext]\nurl = unix:%s\npreference = 1\n",
             ext.socket_path);
    assert_int_equal(rh_start(&r, "external", g_model, NULL, workers), 0);
    wc_response w;
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}";
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, body, &w), 0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "ext");
    wc_response_free(&w);
    assert_int_equal(wc_worker_stop(&ext), 0);
    /* the next request goes to the managed worker, whether or not the
     * router has noticed yet (a refused connection is a failover) */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, body, &w), 0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "cpu");
    wc_response_free(&w);
    double t0 = tu_now_s();
    for (;;) {
        json_t *h = rh_worker_health(&r, "ext");
        bool down = !strcmp(json_string_value(json_object_get(h, "state")), "down");
        assert_false(json_is_true(json_object_get(h, "managed")));
        json_decref(h);
        if (down)
            break;
        assert_true(tu_now_s() - t0 < 10);
        usleep(20 * 1000);
    }
    rh_finish(&r);
}

/* A stream that cannot be resumed anywhere (the CPU worker's context is
 * too short for prompt + the tokens sent) ends with a typed error event
 * and [DONE], strictly framed, and the router keeps serving. */
static void test_stream_unresumable(void **state)
{
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);
    rh_router r;
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = 64MiB\nthreads = 1\nctx-limit = 512\n"
             "fault = abort_after_tokens:5,stall_ms:20\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 10\n",
             spec);
    assert_int_equal(rh_start(&r, "unresumable", g_model, NULL, workers), 0);
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":20,\"temperature\":0,"
                         "\"ignore_eos\":true,\"stream\":true}",
                         &w),
                     0);
    assert_int_equal(w.status, 200);
    char **evs = NULL;
    int ne = wc_sse_parse(w.body, w.body_len, &evs);
    assert_true(ne >= 3);
    assert_string_equal(evs[ne - 1], "[DONE]");
    json_t *j = json_loads(evs[ne - 2], 0, NULL);
    json_t *e = json_object_get(j, "error");
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(e, "code")), "worker_failed");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "server_error");
    assert_true(json_is_string(json_object_get(e, "message")));
    json_decref(j);
    /* the tokens before the error came from the GPU worker */
    j = json_loads(evs[0], 0, NULL);
    assert_non_null(json_object_get(j, "choices"));
    json_decref(j);
    wc_sse_free(evs, ne);
    wc_response_free(&w);
    json_t *ev = rh_events(&r);
    assert_int_equal((int)json_array_size(ev), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "outcome")),
                        "failed");
    json_decref(ev);
    /* still serving (short requests fit the CPU's context) */
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL, "{\"prompt\":\"Hi\",\"max_tokens\":2}", &w), 0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

/* A worker that stops answering (SIGSTOP: alive but silent) is killed
 * after hang-timeout-ms and restarted. */
static void test_hung_worker(void **state)
{
    rh_router r;
    assert_int_equal(rh_start(&r, "hung", g_model, "hang-timeout-ms = 500\n",
                                  "[worker cpu]\nthreads = 1\nctx-limit = 512\n"),
                     0);
    json_t *h = rh_worker_health(&r, "cpu");
    pid_t pid = (pid_t)json_integer_value(json_object_get(h, "pid"));
    json_decref(h);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    rh_wait_restarted(&r, "cpu", 1);
    h = rh_worker_health(&r, "cpu");
    assert_true((pid_t)json_integer_value(json_object_get(h, "pid")) != pid);
    json_decref(h);
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}", &w),
                     0);
    assert_int_equal(w.status, 200);
    wc_response_free(&w);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_admission_counts_tools),
        cmocka_unit_test(test_admission_and_oom_replay),
        cmocka_unit_test(test_stream_crash),
        cmocka_unit_test(test_grammar_resumed),
        cmocka_unit_test(test_cancel_during_failover),
        cmocka_unit_test(test_kill_gpu_under_load),
        cmocka_unit_test(test_startup_failure),
        cmocka_unit_test(test_queue_while_restarting),
        cmocka_unit_test(test_external_worker),
        cmocka_unit_test(test_stream_unresumable),
        cmocka_unit_test(test_hung_worker),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
