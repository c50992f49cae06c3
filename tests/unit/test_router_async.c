/* test_router_async.c - end-to-end: the last row of DESIGN.md's replay
 * table ("CPU route cannot meet the deadline → 503 capacity_exceeded, or
 * queue as a job if the client asked for one") and Expect: 100-continue,
 * with a real `spillway serve`, a real managed CPU worker, real sockets
 * and the real ledger.db read back with SQLite.
 *
 *  - Prefer: respond-async on a request whose deadline no worker can
 *    meet → 202 with the job object, Location and Preference-Applied;
 *    polling the job gives the completion (equal to what the same body
 *    gets served directly, greedy), generated exactly once (one attempt
 *    row, one final write in the ledger); without the header → 503 with
 *    Retry-After; a request that fits is served directly even with the
 *    header; a stream gets the job too; the body's timeout is not the
 *    job's deadline; with an Idempotency-Key a retry gets the same job;
 *    a router whose only worker is down (no capacity now, no deadline
 *    involved) queues the job too, which fails at its own deadline.
 *  - Expect: 100-continue: a raw client waits for the 100, sends the body
 *    and gets the answer (the connection stays usable); a body over
 *    max-body gets 413 without sending it; another expectation gets 417.
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
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_model[512];
static rh_router g_rt;

/* One router, one CPU worker, a small max-body (the 413 case). */
static int setup(void **state)
{
    (void)state;
    if (rh_make_model(g_model, sizeof g_model, "router-async.gguf", 11))
        return -1;
    return rh_start(&g_rt, "async", g_model, "max-body = 4KiB\njob-workers = 1\n",
                    "[worker cpu]\nthreads = 1\nctx-limit = 512\n");
}

static int teardown(void **state)
{
    (void)state;
    int rc = rh_finish_quiet(&g_rt);
    remove(g_model);
    return rc;
}

/* ---- a raw client ------------------------------------------------------- */








/* One request with extra header lines, on its own connection. */
static void request(const char *method, const char *path, const char *extra, const char *body,
                    wc_response *out)
{
    rh_conn c;
    rh_conn_open(&c, g_rt.sock);
    char head[2048];
    size_t bl = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, extra ? extra : "", bl);
    rh_conn_send(&c, head, (size_t)n);
    if (bl)
        rh_conn_send(&c, body, bl);
    rh_conn_read_response(&c, out);
    rh_conn_close(&c);
}


static void assert_header_is(const wc_response *r, const char *name, const char *want)
{
    char v[512];
    if (!want) {
        assert_false(wc_header(r, name, v, sizeof v));
        return;
    }
    assert_true(wc_header(r, name, v, sizeof v));
    assert_string_equal(v, want);
}


/* Polls GET Location until the job ended; returns the job object. */
static json_t *wait_job(const char *location)
{
    double t0 = tu_now_s();
    for (;;) {
        wc_response r;
        request("GET", location, NULL, NULL, &r);
        assert_int_equal(r.status, 200);
        json_t *j = rh_body_json(&r);
        wc_response_free(&r);
        const char *st = json_string_value(json_object_get(j, "state"));
        assert_non_null(st);
        if (!strcmp(st, "succeeded") || !strcmp(st, "failed"))
            return j;
        json_decref(j);
        assert_true(tu_now_s() - t0 < 120);
        usleep(100 * 1000);
    }
}

/* A 202 from the fallback: the job object, its Location and
 * Preference-Applied. Returns the Location (sw_free). */
static char *expect_accepted(const wc_response *r)
{
    if (r->status != 202)
        fprintf(stderr, "expected 202, got %d: %.*s\n", r->status, (int)r->body_len, r->body);
    assert_int_equal(r->status, 202);
    assert_header_is(r, "Preference-Applied", "respond-async");
    char loc[256];
    assert_true(wc_header(r, "Location", loc, sizeof loc));
    json_t *j = rh_body_json(r);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "spillway.job");
    assert_string_equal(json_string_value(json_object_get(j, "state")), "queued");
    const char *id = json_string_value(json_object_get(j, "id"));
    assert_non_null(id);
    char want[256];
    snprintf(want, sizeof want, "/v1/spillway/jobs/%s", id);
    assert_string_equal(loc, want);
    json_decref(j);
    char *out = sw_malloc(strlen(loc) + 1);
    assert_non_null(out);
    memcpy(out, loc, strlen(loc) + 1);
    return out;
}

/* One integer from the ledger (the router keeps it open in WAL mode;
 * reading beside it is supported). */
static long long ledger_int(const char *sql, const char *arg)
{
    char path[700];
    snprintf(path, sizeof path, "%s/state/ledger.db", g_rt.dir);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    if (arg)
        sqlite3_bind_text(st, 1, arg, -1, SQLITE_TRANSIENT);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    long long v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* The text of a text_completion / chat.completion. */
static char *text_of(json_t *resp)
{
    json_t *ch = json_array_get(json_object_get(resp, "choices"), 0);
    const char *t = json_string_value(json_object_get(ch, "text"));
    if (!t)
        t = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
    assert_non_null(t);
    char *s = sw_malloc(strlen(t) + 1);
    assert_non_null(s);
    memcpy(s, t, strlen(t) + 1);
    return s;
}

/* ---- Prefer: respond-async ---------------------------------------------- */

/* No worker finishes anything in the 0 ms deadline these requests get
 * (a tiny model may make 120 tokens in under 1 ms). */
#define BODY_LONG "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0}"
#define BODY_CHAT                                                                              \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":60," \
    "\"temperature\":0,\"stream\":true}"

static void measure_rates(void)
{
    wc_response r;
    request("POST", "/v1/completions", NULL,
            "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}", &r);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    double t0 = tu_now_s();
    for (;;) {
        request("GET", "/health", NULL, NULL, &r);
        json_t *h = rh_body_json(&r);
        wc_response_free(&r);
        json_t *w = json_array_get(json_object_get(h, "workers"), 0);
        bool rates = json_number_value(json_object_get(w, "prefill_tokens_per_second")) > 0 &&
                     json_number_value(json_object_get(w, "decode_tokens_per_second")) > 0;
        json_decref(h);
        if (rates)
            return;
        assert_true(tu_now_s() - t0 < 10);
        usleep(50 * 1000);
    }
}

static void test_respond_async(void **state)
{
    (void)state;
    measure_rates();
    char code[64];
    wc_response r;

    /* the reference: the same body served directly (greedy) */
    request("POST", "/v1/completions", NULL, BODY_LONG, &r);
    assert_int_equal(r.status, 200);
    json_t *ref = rh_body_json(&r);
    char *ref_text = text_of(ref);
    json_decref(ref);
    wc_response_free(&r);

    /* without the preference: 503 capacity_exceeded with Retry-After */
    request("POST", "/v1/completions", "X-Spillway-Deadline-Ms: 0\r\n", BODY_LONG, &r);
    assert_int_equal(r.status, 503);
    assert_string_equal(rh_error_code(&r, code, sizeof code), "capacity_exceeded");
    /* from the queue's drain rate: a whole number of seconds, 1..60 */
    char ra[32];
    assert_true(wc_header(&r, "Retry-After", ra, sizeof ra));
    assert_true(atoi(ra) >= 1 && atoi(ra) <= 60);
    assert_header_is(&r, "Preference-Applied", NULL);
    wc_response_free(&r);
    long long jobs0 = ledger_int("SELECT count(*) FROM jobs", NULL);

    /* with it: a job, stored before the 202 */
    request("POST", "/v1/completions",
            "X-Spillway-Deadline-Ms: 0\r\nPrefer: respond-async, wait=5\r\n", BODY_LONG, &r);
    char *loc = expect_accepted(&r);
    wc_response_free(&r);
    const char *id = loc + strlen("/v1/spillway/jobs/");
    assert_int_equal(ledger_int("SELECT count(*) FROM jobs WHERE id = ?1", id), 1);
    assert_int_equal(ledger_int("SELECT count(*) FROM jobs", NULL), jobs0 + 1);
    json_t *job = wait_job(loc);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    assert_string_equal(json_string_value(json_object_get(job, "endpoint")), "completions");
    assert_null(json_object_get(job, "deadline_ms")); /* runs without the client's deadline */
    json_t *resp = json_object_get(job, "response");
    assert_string_equal(json_string_value(json_object_get(resp, "object")), "text_completion");
    char *t = text_of(resp);
    assert_string_equal(t, ref_text);
    sw_free(t);
    /* polled again: the same stored answer, not a new generation */
    json_t *again = wait_job(loc);
    assert_true(json_equal(json_object_get(again, "response"), resp));
    json_decref(again);
    json_decref(job);
    /* generated exactly once: one attempt, one final write */
    assert_int_equal(ledger_int("SELECT count(*) FROM attempts WHERE request_id = ?1", id), 1);
    assert_int_equal(ledger_int("SELECT finish_writes FROM jobs WHERE id = ?1", id), 1);
    sw_free(loc);

    /* a request that fits is served directly, the preference unused */
    request("POST", "/v1/completions", "Prefer: respond-async\r\n", BODY_LONG, &r);
    assert_int_equal(r.status, 200);
    assert_header_is(&r, "Preference-Applied", NULL);
    assert_header_is(&r, "Location", NULL);
    json_t *direct = rh_body_json(&r);
    t = text_of(direct);
    assert_string_equal(t, ref_text);
    sw_free(t);
    json_decref(direct);
    wc_response_free(&r);
    assert_int_equal(ledger_int("SELECT count(*) FROM jobs", NULL), jobs0 + 1);

    /* the body's timeout is a client deadline too: it triggers the
     * fallback but is not the job's; X-Spillway-Job-Deadline-Ms is */
    request("POST", "/v1/completions",
            "Prefer: respond-async\r\nX-Spillway-Job-Deadline-Ms: 600000\r\n",
            "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,"
            "\"timeout\":0}",
            &r);
    loc = expect_accepted(&r);
    wc_response_free(&r);
    job = wait_job(loc);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    assert_int_equal(json_integer_value(json_object_get(job, "deadline_ms")), 600000);
    t = text_of(json_object_get(job, "response"));
    assert_string_equal(t, ref_text);
    sw_free(t);
    json_decref(job);
    sw_free(loc);
    sw_free(ref_text);
}

/* A stream that asks for respond-async gets the job too; its result is a
 * non-stream chat.completion with the text the stream would carry. */
static void test_respond_async_stream(void **state)
{
    (void)state;
    measure_rates();
    wc_response r;
    /* the reference: the same body without stream, served directly */
    json_t *b = json_loads(BODY_CHAT, 0, NULL);
    json_object_del(b, "stream");
    char *plain = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    request("POST", "/v1/chat/completions", NULL, plain, &r);
    free(plain);
    assert_int_equal(r.status, 200);
    json_t *ref = rh_body_json(&r);
    char *ref_text = text_of(ref);
    json_decref(ref);
    wc_response_free(&r);

    request("POST", "/v1/chat/completions",
            "X-Spillway-Deadline-Ms: 0\r\nPrefer: respond-async\r\n", BODY_CHAT, &r);
    char *loc = expect_accepted(&r);
    char ct[128];
    assert_true(wc_header(&r, "Content-Type", ct, sizeof ct));
    assert_string_equal(ct, "application/json");
    wc_response_free(&r);
    json_t *job = wait_job(loc);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    assert_string_equal(json_string_value(json_object_get(job, "endpoint")), "chat");
    json_t *resp = json_object_get(job, "response");
    assert_string_equal(json_string_value(json_object_get(resp, "object")), "chat.completion");
    char *t = text_of(resp);
    assert_string_equal(t, ref_text);
    sw_free(t);
    json_decref(job);
    sw_free(loc);
    sw_free(ref_text);
}

/* Idempotency-Key with the fallback: the retry gets the same job (same
 * body, same headers, marked as a replay) and no second job exists. */
static void test_respond_async_idempotent(void **state)
{
    (void)state;
    measure_rates();
    wc_response r;
    long long jobs0 = ledger_int("SELECT count(*) FROM jobs", NULL);
    const char *hdr =
        "X-Spillway-Deadline-Ms: 0\r\nPrefer: respond-async\r\nIdempotency-Key: async-key-1\r\n";
    request("POST", "/v1/completions", hdr, BODY_LONG, &r);
    char *loc = expect_accepted(&r);
    char *first = sw_malloc(r.body_len + 1);
    assert_non_null(first);
    memcpy(first, r.body, r.body_len + 1);
    assert_header_is(&r, "X-Spillway-Idempotent-Replay", NULL);
    wc_response_free(&r);

    request("POST", "/v1/completions", hdr, BODY_LONG, &r);
    char *loc2 = expect_accepted(&r);
    assert_string_equal(loc2, loc);
    assert_string_equal(r.body, first);
    assert_header_is(&r, "X-Spillway-Idempotent-Replay", "true");
    wc_response_free(&r);
    assert_int_equal(ledger_int("SELECT count(*) FROM jobs", NULL), jobs0 + 1);

    /* also once the job ran: still the same job, no new one */
    json_t *job = wait_job(loc);
    assert_string_equal(json_string_value(json_object_get(job, "state")), "succeeded");
    json_decref(job);
    request("POST", "/v1/completions", hdr, BODY_LONG, &r);
    char *loc3 = expect_accepted(&r);
    assert_string_equal(loc3, loc);
    wc_response_free(&r);
    assert_int_equal(ledger_int("SELECT count(*) FROM jobs", NULL), jobs0 + 1);
    assert_int_equal(ledger_int("SELECT count(*) FROM attempts WHERE request_id = ?1",
                                loc + strlen("/v1/spillway/jobs/")),
                     1);
    sw_free(loc);
    sw_free(loc2);
    sw_free(loc3);
    sw_free(first);

    /* the metric counts the fallbacks (3 jobs in this file so far, or
     * more when tests run in another order: at least one) */
    request("GET", "/metrics", NULL, NULL, &r);
    const char *m = strstr(r.body, "\nspillway_router_async_fallbacks_total ");
    assert_non_null(m);
    assert_true(strtoull(m + strlen("\nspillway_router_async_fallbacks_total "), NULL, 10) >= 1);
    wc_response_free(&r);
}

/* A stand-in external worker for the router's start-up only: it
 * answers every request (the router's /health polls) with 200 and a JSON
 * object until told to stop; then its socket is gone. */
typedef struct fake_worker {
    int fd;
    char path[700];
    atomic_int stop;
    pthread_t th;
} fake_worker;

static void *fake_thread(void *arg)
{
    fake_worker *fw = arg;
    while (!fw->stop) {
        struct pollfd p = {fw->fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept(fw->fd, NULL, NULL);
        if (c < 0)
            continue;
        char buf[4096];
        struct pollfd pc = {c, POLLIN, 0};
        if (poll(&pc, 1, 1000) > 0 && recv(c, buf, sizeof buf, 0) > 0) {
            static const char body[] = "{\"status\":\"ready\"}";
            char resp[256];
            int n = snprintf(resp, sizeof resp,
                             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                             sizeof body - 1, body);
            if (send(c, resp, (size_t)n, MSG_NOSIGNAL) < 0)
                fw->stop = fw->stop;
        }
        close(c);
    }
    return NULL;
}

static void fake_start(fake_worker *fw, const char *path)
{
    memset(fw, 0, sizeof *fw);
    snprintf(fw->path, sizeof fw->path, "%s", path);
    fw->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fw->fd >= 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    assert_true(strlen(path) < sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    unlink(path);
    assert_int_equal(bind(fw->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fw->fd, 16), 0);
    assert_int_equal(pthread_create(&fw->th, NULL, fake_thread, fw), 0);
}

static void fake_stop(fake_worker *fw)
{
    fw->stop = 1;
    pthread_join(fw->th, NULL);
    close(fw->fd);
    unlink(fw->path);
}

/* "No worker has capacity now" (not a deadline): a second router whose
 * only worker is an external one that answered /health at the start and
 * then went away, so it is down and a request waits out the queue
 * time-out. Without the preference: 503; with it: the job, which (its
 * worker never coming back) fails when its own deadline from
 * X-Spillway-Job-Deadline-Ms passed. */
static void test_respond_async_no_capacity(void **state)
{
    (void)state;
    /* a second router whose one worker answers /health, then goes away */
    char fake_path[700], rest[800];
    snprintf(fake_path, sizeof fake_path, "%s/nocap-worker.sock", g_rt.dir);
    snprintf(rest, sizeof rest, "[worker gone]\nurl = unix:%s\n", fake_path);
    fake_worker fw;
    fake_start(&fw, fake_path);
    rh_router nc;
    assert_int_equal(rh_start(&nc, "nocap", g_model, "queue-timeout-ms = 200\njob-workers = 1\n",
                              rest),
                     0);
    const char *sock = nc.sock;
    /* up with its worker ready; then the worker goes away, and the router
     * is up with none ready once /health answers 503 */
    double t0 = tu_now_s();
    wc_response r;
    for (;;) {
        memset(&r, 0, sizeof r);
        if (wc_request(sock, "GET", "/health", NULL, 2000, &r) == 0 && r.status == 200)
            break;
        wc_response_free(&r);
        assert_true(tu_now_s() - t0 < 30);
        usleep(50 * 1000);
    }
    wc_response_free(&r);
    fake_stop(&fw);
    for (;;) {
        memset(&r, 0, sizeof r);
        if (wc_request(sock, "GET", "/health", NULL, 2000, &r) == 0 && r.status == 503)
            break;
        wc_response_free(&r);
        assert_true(tu_now_s() - t0 < 30);
        usleep(50 * 1000);
    }
    wc_response_free(&r);
    char code[64];
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}";
    assert_int_equal(wc_request(sock, "POST", "/v1/completions", body, 20000, &r), 0);
    assert_int_equal(r.status, 503);
    assert_string_equal(rh_error_code(&r, code, sizeof code), "capacity_exceeded");
    assert_header_is(&r, "Preference-Applied", NULL);
    wc_response_free(&r);

    int fd = wc_connect(sock, 20000);
    assert_true(fd >= 0);
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Prefer: respond-async\r\nX-Spillway-Job-Deadline-Ms: 1500\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    char raw[4096];
    size_t len = 0;
    for (;;) {
        ssize_t k = recv(fd, raw + len, sizeof raw - 1 - len, 0);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    close(fd);
    assert_int_equal(wc_response_parse(raw, len, &r), 0);
    char *loc = expect_accepted(&r);
    wc_response_free(&r);
    /* polled on this router */
    json_t *job = NULL;
    t0 = tu_now_s();
    for (;;) {
        assert_int_equal(wc_request(sock, "GET", loc, NULL, 20000, &r), 0);
        assert_int_equal(r.status, 200);
        job = rh_body_json(&r);
        wc_response_free(&r);
        const char *st = json_string_value(json_object_get(job, "state"));
        if (!strcmp(st, "failed") || !strcmp(st, "succeeded"))
            break;
        json_decref(job);
        assert_true(tu_now_s() - t0 < 60);
        usleep(100 * 1000);
    }
    assert_string_equal(json_string_value(json_object_get(job, "state")), "failed");
    assert_int_equal(json_integer_value(json_object_get(job, "deadline_ms")), 1500);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(job, "error"), "code")),
        "deadline_exceeded");
    json_decref(job);
    sw_free(loc);

    rh_finish(&nc);
}

/* ---- Expect: 100-continue ----------------------------------------------- */

/* A body over 1 KiB that is a valid request: JSON whitespace pads it. */
static char *padded_body(size_t pad)
{
    const char *a = "{\"prompt\":\"Once upon a time\",";
    const char *b = "\"max_tokens\":4,\"temperature\":0}";
    char *s = sw_malloc(strlen(a) + pad + strlen(b) + 1);
    assert_non_null(s);
    strcpy(s, a);
    memset(s + strlen(a), ' ', pad);
    strcpy(s + strlen(a) + pad, b);
    return s;
}

static void test_expect_continue(void **state)
{
    (void)state;
    wc_response r;
    char *body = padded_body(2000);
    size_t bl = strlen(body);
    /* the reference: the same body sent without Expect */
    request("POST", "/v1/completions", NULL, body, &r);
    assert_int_equal(r.status, 200);
    json_t *ref = rh_body_json(&r);
    char *ref_text = text_of(ref);
    json_decref(ref);
    wc_response_free(&r);

    rh_conn c;
    rh_conn_open(&c, g_rt.sock);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     bl);
    rh_conn_send(&c, head, (size_t)n);
    /* the interim response comes before any body byte was sent */
    static const char want[] = "HTTP/1.1 100 Continue\r\n\r\n";
    while (c.len < sizeof want - 1)
        assert_true(rh_conn_read_more(&c, 20));
    assert_memory_equal(c.buf, want, sizeof want - 1);
    memmove(c.buf, c.buf + sizeof want - 1, c.len - (sizeof want - 1));
    c.len -= sizeof want - 1;
    rh_conn_send(&c, body, bl);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    json_t *j = rh_body_json(&r);
    char *t = text_of(j);
    assert_string_equal(t, ref_text);
    sw_free(t);
    json_decref(j);
    wc_response_free(&r);
    /* the connection goes on: a second request with Expect on it */
    rh_conn_send(&c, head, (size_t)n);
    while (c.len < sizeof want - 1)
        assert_true(rh_conn_read_more(&c, 20));
    assert_memory_equal(c.buf, want, sizeof want - 1);
    memmove(c.buf, c.buf + sizeof want - 1, c.len - (sizeof want - 1));
    c.len -= sizeof want - 1;
    rh_conn_send(&c, body, bl);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    rh_conn_close(&c);

    /* over max-body (4 KiB): 413 at once, the body never sent */
    rh_conn_open(&c, g_rt.sock);
    n = snprintf(head, sizeof head,
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n");
    rh_conn_send(&c, head, (size_t)n);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 413);
    assert_header_is(&r, "Connection", "close");
    wc_response_free(&r);
    assert_int_equal(c.len, 0); /* nothing before it (no 100) and after it */
    assert_false(rh_conn_read_more(&c, 5)); /* closed */
    rh_conn_close(&c);

    /* an expectation the router does not know: 417, the body unread */
    rh_conn_open(&c, g_rt.sock);
    n = snprintf(head, sizeof head,
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\n"
                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                 bl);
    rh_conn_send(&c, head, (size_t)n);
    rh_conn_read_response(&c, &r);
    assert_int_equal(r.status, 417);
    wc_response_free(&r);
    rh_conn_close(&c);

    /* the metric counts the two interim responses (at least) */
    request("GET", "/metrics", NULL, NULL, &r);
    const char *m = strstr(r.body, "\nspillway_router_continues_total ");
    assert_non_null(m);
    assert_true(strtoull(m + strlen("\nspillway_router_continues_total "), NULL, 10) >= 2);
    wc_response_free(&r);
    sw_free(ref_text);
    sw_free(body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_respond_async),
        cmocka_unit_test(test_respond_async_stream),
        cmocka_unit_test(test_respond_async_idempotent),
        cmocka_unit_test(test_respond_async_no_capacity),
        cmocka_unit_test(test_expect_continue),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
