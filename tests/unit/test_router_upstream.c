/* test_router_upstream.c - end-to-end: `[worker NAME] kind = openai`,
 * workers that are other OpenAI-compatible engines (llama-server, Ollama,
 * vLLM) at a url, with a real `spillway serve`.
 *
 * - A real spillway worker started here and configured as kind = openai:
 *   answers pass through, /health shows no memory figures and the
 *   configured ctx-limit, which admission applies.
 * - The same with SPILLWAY_FAULT=abort_after_tokens: a stream that fails
 *   after text was sent is not resumed (an external engine has no resume):
 *   it ends with a typed error event, and the next worker gets nothing.
 * - A small HTTP server thread that answers as those engines do when they
 *   run out of memory (their error texts, status 500, or an SSE error
 *   event) and whose /health is 404 (Ollama has none: /v1/models says it
 *   is up): each request is replayed on the managed CPU worker and the
 *   failover event says oom; an error text that is not about memory says
 *   worker_crash.
 * - A spillway worker that cuts a stream after tokens: the resume is never
 *   sent to the kind = openai engine (it could not take it); a request
 *   with nothing sent yet is replayed there.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-upstream.gguf", 11);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    remove(g_model);
    return 0;
}

/* Waits until the router's /health lists worker name in state want. */
static void wait_worker_state(const rh_router *r, const char *name, const char *want)
{
    double t0 = tu_now_s();
    while (tu_now_s() - t0 < 30) {
        wc_response h;
        if (wc_request(r->sock, "GET", "/health", NULL, 2000, &h) == 0 && h.body) {
            json_t *j = json_loads(h.body, 0, NULL);
            json_t *ws = json_object_get(j, "workers");
            bool ok = false;
            for (size_t i = 0; i < json_array_size(ws); i++) {
                json_t *w = json_array_get(ws, i);
                if (!strcmp(json_string_value(json_object_get(w, "name")) ?: "", name))
                    ok = !strcmp(json_string_value(json_object_get(w, "state")) ?: "", want);
            }
            json_decref(j);
            wc_response_free(&h);
            if (ok)
                return;
        } else {
            wc_response_free(&h);
        }
        usleep(50 * 1000);
    }
    fail_msg("worker %s never reached state %s", name, want);
}

static const char *BODY = "{\"prompt\":\"Once upon a time\",\"max_tokens\":10,\"temperature\":0,"
                          "\"ignore_eos\":true}";
static const char *BODY_STREAM = "{\"prompt\":\"Once upon a time\",\"max_tokens\":10,"
                                 "\"temperature\":0,\"ignore_eos\":true,\"stream\":true}";

/* A spillway worker configured as kind = openai serves through the
 * router; its /health figures are not used (no memory, the configured
 * ctx-limit), and the configured ctx-limit is what admission applies. */
static void test_openai_kind_serves(void **state)
{
    (void)state;
    wc_worker eng;
    const char *args[] = {"--threads", "1", "--ctx-limit", "1024", NULL};
    assert_int_equal(wc_worker_start(&eng, g_model, args, NULL, 60, NULL), 0);
    wc_response direct, direct_s;
    assert_int_equal(wc_request(eng.socket_path, "POST", "/v1/completions", BODY, 60000, &direct), 0);
    assert_int_equal(wc_request(eng.socket_path, "POST", "/v1/completions", BODY_STREAM, 60000,
                                &direct_s), 0);
    assert_int_equal(direct.status, 200);
    char *want = NULL, *want_s = NULL, fin[32];
    int toks[64];
    assert_int_equal(wc_tokens_of(&direct, false, toks, 64, &want, fin, sizeof fin), 10);
    assert_int_equal(wc_tokens_of(&direct_s, true, toks, 64, &want_s, fin, sizeof fin), 10);
    wc_response_free(&direct);
    wc_response_free(&direct_s);

    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker eng]\nkind = openai\nurl = unix:%s\nctx-limit = 64\nmax-seqs = 2\n",
             eng.socket_path);
    rh_router r;
    assert_int_equal(rh_start(&r, "serve", g_model, NULL, workers), 0);

    wc_response h;
    assert_int_equal(wc_request(r.sock, "GET", "/health", NULL, 5000, &h), 0);
    json_t *hj = json_loads(h.body, 0, NULL);
    json_t *w0 = json_array_get(json_object_get(hj, "workers"), 0);
    assert_string_equal(json_string_value(json_object_get(w0, "state")), "ready");
    /* the worker's own /health says 1024 and has memory figures: unused */
    assert_int_equal(json_integer_value(json_object_get(w0, "ctx_limit")), 64);
    assert_int_equal(json_integer_value(json_object_get(w0, "kv_bytes_per_token")), 0);
    assert_int_equal(json_integer_value(json_object_get(w0, "memory_total_bytes")), 0);
    json_decref(hj);
    wc_response_free(&h);

    wc_response a;
    assert_int_equal(wc_request(r.sock, "POST", "/v1/completions", BODY, 60000, &a), 0);
    assert_int_equal(a.status, 200);
    char v[64];
    assert_true(wc_header(&a, "X-Spillway-Worker", v, sizeof v));
    assert_string_equal(v, "eng");
    char *got = NULL;
    assert_int_equal(wc_tokens_of(&a, false, toks, 64, &got, fin, sizeof fin), 10);
    assert_string_equal(got, want);
    sw_free(got);
    wc_response_free(&a);

    assert_int_equal(wc_request(r.sock, "POST", "/v1/completions", BODY_STREAM, 60000, &a), 0);
    assert_int_equal(a.status, 200);
    got = NULL;
    assert_int_equal(wc_tokens_of(&a, true, toks, 64, &got, fin, sizeof fin), 10);
    assert_string_equal(got, want_s);
    sw_free(got);
    wc_response_free(&a);

    /* a prompt over the configured ctx-limit (64) is refused at admission
     * although the engine itself would take 1024 */
    char big[4096];
    int n = snprintf(big, sizeof big, "{\"prompt\":\"");
    for (int i = 0; i < 120; i++)
        n += snprintf(big + n, sizeof big - (size_t)n, "once upon a time ");
    snprintf(big + n, sizeof big - (size_t)n, "\",\"max_tokens\":4}");
    assert_int_equal(wc_request(r.sock, "POST", "/v1/completions", big, 60000, &a), 0);
    assert_int_equal(a.status, 400);
    assert_non_null(strstr(a.body, "context_length_exceeded"));
    wc_response_free(&a);

    rh_finish(&r);
    wc_worker_stop(&eng);
    sw_free(want);
    sw_free(want_s);
}

/* An external engine that fails after text was sent: no resume; the
 * stream ends with a typed error event and the CPU worker gets nothing. */
static void test_openai_no_resume(void **state)
{
    (void)state;
    wc_worker eng;
    const char *args[] = {"--threads", "1", "--ctx-limit", "1024", NULL};
    const char *env[] = {"SPILLWAY_FAULT=abort_after_tokens:3,stall_ms:20", NULL};
    assert_int_equal(wc_worker_start(&eng, g_model, args, env, 60, NULL), 0);
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker eng]\nkind = openai\nurl = unix:%s\nctx-limit = 1024\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 1024\n",
             eng.socket_path);
    rh_router r;
    assert_int_equal(rh_start(&r, "noresume", g_model, NULL, workers), 0);
    wait_worker_state(&r, "cpu", "ready");

    wc_response a;
    assert_int_equal(wc_request(r.sock, "POST", "/v1/completions", BODY_STREAM, 60000, &a), 0);
    assert_int_equal(a.status, 200);
    char **ev = NULL;
    int n = wc_sse_parse(a.body, a.body_len, &ev);
    assert_true(n >= 2);
    int text_events = 0, errors = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(ev[i], "[DONE]"))
            continue;
        json_t *j = json_loads(ev[i], 0, NULL);
        assert_non_null(j);
        json_t *e = json_object_get(j, "error");
        if (e) {
            errors++;
            assert_string_equal(json_string_value(json_object_get(e, "code")), "worker_failed");
            assert_string_equal(json_string_value(json_object_get(e, "type")), "server_error");
        } else {
            text_events++;
        }
        json_decref(j);
    }
    wc_sse_free(ev, n);
    assert_int_equal(errors, 1);
    assert_true(text_events >= 1 && text_events < 10); /* cut short, not replayed */
    wc_response_free(&a);

    json_t *evs = rh_events(&r);
    assert_int_equal(json_array_size(evs), 1);
    json_t *e0 = json_array_get(evs, 0);
    assert_string_equal(json_string_value(json_object_get(e0, "outcome")), "failed");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(e0, "first_error"), "worker")), "eng");
    assert_non_null(strstr(json_string_value(json_object_get(e0, "decision")), "no resume"));
    json_decref(evs);
    /* the CPU worker was never asked */
    assert_int_equal(wc_request(r.sock, "GET", "/metrics", NULL, 5000, &a), 0);
    assert_non_null(
        strstr(a.body, "spillway_router_requests_total{worker=\"cpu\",outcome=\"ok\"} 0\n"));
    assert_non_null(
        strstr(a.body, "spillway_router_requests_total{worker=\"cpu\",outcome=\"failed\"} 0\n"));
    wc_response_free(&a);

    rh_finish(&r);
    wc_worker_stop(&eng);
}

/* ---- an engine that runs out of memory ------------------------------- */

/* What the engine thread answers to a POST: status, content type, body. */
typedef struct engine_reply {
    const char *name;
    int status;
    bool sse;
    const char *body;
    const char *kind; /* what the router must call it */
} engine_reply;

/* The error texts as the engines send them (their OpenAI-compatible
 * servers' error JSON; numbers illustrative). */
static const engine_reply g_replies[] = {
    {"llama.cpp", 500, false,
     "{\"error\":{\"code\":500,\"message\":\"ggml_backend_cuda_buffer_type_alloc_buffer: "
     "allocating 1024.00 MiB on device 0: cudaMalloc failed: out of memory\",\"type\":"
     "\"server_error\"}}",
     "oom"},
    {"llama.cpp compute buffers", 500, false,
     "{\"error\":{\"code\":500,\"message\":\"Failed to allocate compute buffers\",\"type\":"
     "\"server_error\"}}",
     "oom"},
    {"vLLM", 500, false,
     "{\"object\":\"error\",\"message\":\"CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; "
     "79.15 GiB total capacity)\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}",
     "oom"},
    {"Ollama", 500, false,
     "{\"error\":{\"message\":\"model requires more system memory (16.0 GiB) than is available "
     "(7.6 GiB)\",\"type\":\"api_error\",\"param\":null,\"code\":null}}",
     "oom"},
    {"llama.cpp stream", 200, true,
     "data: {\"error\":{\"code\":500,\"message\":\"CUDA error: out of memory\",\"type\":"
     "\"server_error\"}}\n\n",
     "oom"},
    {"not memory", 500, false,
     "{\"error\":{\"code\":500,\"message\":\"Internal server error: unexpected end of input\","
     "\"type\":\"server_error\"}}",
     "worker_crash"},
};

typedef struct engine {
    int lfd;
    char path[600];
    atomic_int mode;
    atomic_int posts;
    atomic_bool stop;
    pthread_t th;
} engine;

static void engine_answer(engine *e, int fd)
{
    char buf[65536];
    size_t n = 0;
    char *end = NULL;
    while (!end && n < sizeof buf - 1) {
        ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (r <= 0)
            return;
        n += (size_t)r;
        buf[n] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    if (!end)
        return;
    const char *cl = strcasestr(buf, "\r\nContent-Length:");
    size_t want = (size_t)(end - buf) + 4 + (cl ? strtoul(cl + 17, NULL, 10) : 0);
    while (n < want && n < sizeof buf - 1) {
        ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (r <= 0)
            return;
        n += (size_t)r;
    }
    char out[4096];
    int m;
    if (!strncmp(buf, "GET /health ", 12)) {
        m = snprintf(out, sizeof out,
                     "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 18\r\n"
                     "Connection: close\r\n\r\n404 page not found");
    } else if (!strncmp(buf, "GET /v1/models ", 15)) {
        const char *b = "{\"object\":\"list\",\"data\":[{\"id\":\"fake\",\"object\":\"model\","
                        "\"created\":0,\"owned_by\":\"library\"}]}";
        m = snprintf(out, sizeof out,
                     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s",
                     strlen(b), b);
    } else {
        atomic_fetch_add(&e->posts, 1);
        const engine_reply *rp = &g_replies[atomic_load(&e->mode)];
        if (rp->sse)
            m = snprintf(out, sizeof out,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Connection: close\r\n\r\n%s",
                         rp->body);
        else
            m = snprintf(out, sizeof out,
                         "HTTP/1.1 %d Internal Server Error\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                         rp->status, strlen(rp->body), rp->body);
    }
    for (int off = 0; off < m;) {
        ssize_t w = send(fd, out + off, (size_t)(m - off), MSG_NOSIGNAL);
        if (w <= 0)
            return;
        off += (int)w;
    }
}

static void *engine_thread(void *arg)
{
    engine *e = arg;
    while (!atomic_load(&e->stop)) {
        struct pollfd p = {e->lfd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept(e->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        engine_answer(e, fd);
        shutdown(fd, SHUT_WR);
        close(fd);
    }
    return NULL;
}

static void engine_start(engine *e, const char *path)
{
    memset(e, 0, sizeof *e);
    snprintf(e->path, sizeof e->path, "%s", path);
    unlink(path);
    e->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(e->lfd >= 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    assert_true(strlen(path) < sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    assert_int_equal(bind(e->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(e->lfd, 16), 0);
    assert_int_equal(pthread_create(&e->th, NULL, engine_thread, e), 0);
}

static void engine_stop(engine *e)
{
    atomic_store(&e->stop, true);
    pthread_join(e->th, NULL);
    close(e->lfd);
    unlink(e->path);
}

static void test_engine_oom_texts_replayed(void **state)
{
    (void)state;
    char epath[600];
    snprintf(epath, sizeof epath, "%s", tu_tmp_path("fake-engine.sock"));
    engine e;
    engine_start(&e, epath);
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker fake]\nkind = openai\nurl = unix:%s\nctx-limit = 1024\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 1024\n",
             epath);
    rh_router r;
    assert_int_equal(rh_start(&r, "oom", g_model, NULL, workers), 0);
    wait_worker_state(&r, "cpu", "ready");
    size_t n_replies = sizeof g_replies / sizeof g_replies[0];
    for (size_t i = 0; i < n_replies; i++) {
        const engine_reply *rp = &g_replies[i];
        atomic_store(&e.mode, (int)i);
        wait_worker_state(&r, "fake", "ready"); /* /health 404, /v1/models 200 */
        int posts = atomic_load(&e.posts);
        char rid[64];
        snprintf(rid, sizeof rid, "up-oom-%zu", i);
        char hdr[128];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", rid);
        char raw[2048];
        const char *body = rp->sse ? BODY_STREAM : BODY;
        int rn = snprintf(raw, sizeof raw,
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s"
                          "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                          hdr, strlen(body), body);
        wc_response a;
        assert_int_equal(wc_raw(r.sock, raw, (size_t)rn, 60000, &a), 0);
        if (a.status != 200)
            fail_msg("%s: status %d: %s", rp->name, a.status, a.body ? a.body : "");
        char v[64];
        assert_true(wc_header(&a, "X-Spillway-Worker", v, sizeof v));
        /* nothing of the engine's reached the client, so even a stream's
         * headers name the worker that answered */
        assert_string_equal(v, "cpu");
        assert_true(wc_header(&a, "X-Spillway-Attempts", v, sizeof v));
        assert_string_equal(v, "2");
        int toks[64];
        char fin[32];
        assert_int_equal(wc_tokens_of(&a, rp->sse, toks, 64, NULL, fin, sizeof fin), 10);
        wc_response_free(&a);
        assert_int_equal(atomic_load(&e.posts), posts + 1); /* the engine was tried once */

        json_t *evs = rh_events(&r);
        json_t *found = NULL;
        for (size_t k = 0; k < json_array_size(evs); k++) {
            json_t *x = json_array_get(evs, k);
            if (!strcmp(json_string_value(json_object_get(x, "request_id")) ?: "", rid))
                found = x;
        }
        if (!found)
            fail_msg("%s: no failover event", rp->name);
        json_t *fe = json_object_get(found, "first_error");
        assert_string_equal(json_string_value(json_object_get(fe, "worker")), "fake");
        if (strcmp(json_string_value(json_object_get(fe, "kind")), rp->kind))
            fail_msg("%s: kind %s, want %s", rp->name,
                     json_string_value(json_object_get(fe, "kind")), rp->kind);
        assert_string_equal(json_string_value(json_object_get(found, "decision")), "replay");
        assert_string_equal(json_string_value(json_object_get(found, "replay_worker")), "cpu");
        assert_string_equal(json_string_value(json_object_get(found, "outcome")), "completed");
        json_decref(evs);
    }
    rh_finish(&r);
    engine_stop(&e);
}

/* ok requests a spillway worker counted (its own /metrics). */
static long worker_ok(const char *sock)
{
    wc_response m;
    assert_int_equal(wc_request(sock, "GET", "/metrics", NULL, 5000, &m), 0);
    const char *k = strstr(m.body, "spillway_worker_requests_total{outcome=\"ok\"} ");
    assert_non_null(k);
    long n = strtol(k + strlen("spillway_worker_requests_total{outcome=\"ok\"} "), NULL, 10);
    wc_response_free(&m);
    return n;
}

/* A stream that a spillway worker cut after tokens were sent needs a
 * resume, which an external engine cannot take: it is never sent there
 * (the stream ends with the error event). A request with nothing sent yet
 * is replayed there as usual. */
static void test_resume_never_goes_to_openai(void **state)
{
    (void)state;
    wc_worker eng;
    const char *args[] = {"--threads", "1", "--ctx-limit", "1024", NULL};
    assert_int_equal(wc_worker_start(&eng, g_model, args, NULL, 60, NULL), 0);
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker sp]\nthreads = 1\nctx-limit = 1024\n"
             "fault = abort_after_tokens:3,stall_ms:20\n"
             "[worker eng]\nkind = openai\nurl = unix:%s\nctx-limit = 1024\n",
             eng.socket_path);
    rh_router r;
    assert_int_equal(rh_start(&r, "noresume2", g_model, NULL, workers), 0);
    wait_worker_state(&r, "sp", "ready");
    long ok0 = worker_ok(eng.socket_path);

    wc_response a;
    assert_int_equal(wc_request(r.sock, "POST", "/v1/completions", BODY_STREAM, 60000, &a), 0);
    assert_int_equal(a.status, 200);
    char v[64];
    assert_true(wc_header(&a, "X-Spillway-Worker", v, sizeof v));
    assert_string_equal(v, "sp");
    assert_non_null(strstr(a.body, "\"error\""));
    wc_response_free(&a);
    assert_int_equal(worker_ok(eng.socket_path), ok0); /* never asked to resume */

    /* nothing sent yet: replayed on the engine */
    wait_worker_state(&r, "sp", "ready");
    assert_int_equal(wc_request(r.sock, "POST", "/v1/completions", BODY, 60000, &a), 0);
    assert_int_equal(a.status, 200);
    assert_true(wc_header(&a, "X-Spillway-Worker", v, sizeof v));
    assert_string_equal(v, "eng");
    int toks[64];
    char fin[32];
    assert_int_equal(wc_tokens_of(&a, false, toks, 64, NULL, fin, sizeof fin), 10);
    wc_response_free(&a);
    assert_int_equal(worker_ok(eng.socket_path), ok0 + 1);
    rh_finish(&r);
    wc_worker_stop(&eng);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_kind_serves),
        cmocka_unit_test(test_openai_no_resume),
        cmocka_unit_test(test_engine_oom_texts_replayed),
        cmocka_unit_test(test_resume_never_goes_to_openai),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
