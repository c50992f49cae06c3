/* test_worker_refusal.c - end-to-end: the worker's own admission
 * (docs/api.md, 503 worker_full), with a real `spillway worker`.
 *
 * A worker whose slots and queue places are taken refuses a newcomer at
 * once, before any work: 503 worker_full with Retry-After, reason
 * "slots" and what is free in headers and in the error object; it counts
 * the refusal (/metrics, /health), never runs more than its slots, and
 * takes the next request once the running one ended. An idle worker
 * refuses nothing, even a request of more choices (n) than it has slots.
 * On a device, a newcomer whose prompt + max_tokens the free KV memory
 * cannot hold while another request runs is refused with reason "memory"
 * and the bytes it needs and that are free.
 */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.seed = 23;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("worker-refusal.gguf"));
    return eng_model_make(&p, g_model, NULL) == 0 && tu_spillway_bin() ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove(g_model);
    wc_worker_kill_all();
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Opens a stream of max_tokens tokens on its own connection and reads
 * until its first event: the request is running. Returns the fd. */
static int stream_open(const wc_worker *w, int max_tokens)
{
    static char buf[1 << 16];
    size_t len = 0;
    char body[256];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":%d,\"stream\":true,"
             "\"ignore_eos\":true,\"temperature\":0}",
             max_tokens);
    int fd = wc_connect(w->socket_path, 20000);
    assert_true(fd >= 0);
    assert_int_equal(wc_send(fd, "POST", "/v1/completions", body), 0);
    buf[0] = '\0';
    while (!strstr(buf, "data: ")) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        assert_true(n > 0);
        len += (size_t)n;
        buf[len] = '\0';
    }
    return fd;
}

static json_t *get_json(const wc_worker *w, const char *path)
{
    wc_response r;
    assert_int_equal(wc_request(w->socket_path, "GET", path, NULL, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_non_null(j);
    wc_response_free(&r);
    return j;
}

/* The error object of a 503 worker_full (asserted), with its headers
 * checked: Retry-After and the free figures. */
static json_t *refusal(const wc_response *r, const char *reason)
{
    char v[64];
    assert_int_equal(r->status, 503);
    assert_true(wc_header(r, "Retry-After", v, sizeof v));
    assert_true(atoi(v) >= 1);
    assert_true(wc_header(r, "X-Spillway-Places-Free", v, sizeof v));
    assert_true(wc_header(r, "X-Spillway-Kv-Free-Bytes", v, sizeof v));
    json_t *j = json_loads(r->body, 0, NULL);
    assert_non_null(j);
    json_t *e = json_incref(json_object_get(j, "error"));
    json_decref(j);
    assert_string_equal(json_string_value(json_object_get(e, "code")), "worker_full");
    assert_string_equal(json_string_value(json_object_get(e, "reason")), reason);
    return e;
}

static void test_full_slots_refused_at_once(void **state)
{
    (void)state;
    static const char *const args[] = {"--threads", "1",           "--max-seqs", "1",
                                       "--max-queue", "0",         NULL};
    static const char *const env[] = {"SPILLWAY_FAULT=stall_ms:20", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, g_model, args, env, 30, NULL), 0);
    int fd = stream_open(&w, 100); /* 100 tokens of 20 ms at least: 2 s */
    wc_response r;
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Hello\",\"max_tokens\":4}", 10000, &r),
                     0);
    json_t *e = refusal(&r, "slots");
    char v[64];
    assert_true(wc_header(&r, "X-Spillway-Places-Free", v, sizeof v));
    assert_string_equal(v, "0");
    assert_int_equal(json_integer_value(json_object_get(e, "places_free")), 0);
    json_decref(e);
    wc_response_free(&r);

    /* at once: the running request is still running (held, its stream
     * open), so the refusal did not wait for it */
    json_t *h = get_json(&w, "/health");
    json_t *slots = json_object_get(h, "slots");
    assert_int_equal(json_integer_value(json_object_get(slots, "accepted")), 1);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(h, "refusals"), "slots")), 1);
    json_decref(h);

    /* the running one ends (its connection closes: cancelled), and the
     * next request is taken */
    close(fd);
    double end = now_s() + 20;
    int st = 0;
    while (now_s() < end) {
        assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                    "{\"prompt\":\"Hello\",\"max_tokens\":4}", 10000, &r),
                         0);
        st = r.status;
        wc_response_free(&r);
        if (st == 200)
            break;
        usleep(50 * 1000);
    }
    assert_int_equal(st, 200);
    h = get_json(&w, "/health");
    slots = json_object_get(h, "slots");
    assert_int_equal(json_integer_value(json_object_get(slots, "max_active_seen")), 1);
    assert_int_equal(json_integer_value(json_object_get(slots, "max_accepted_seen")), 1);
    json_int_t refused = json_integer_value(json_object_get(json_object_get(h, "refusals"), "slots"));
    json_decref(h);
    assert_true(refused >= 1);
    assert_int_equal(wc_request(w.socket_path, "GET", "/metrics", NULL, 5000, &r), 0);
    char line[128];
    snprintf(line, sizeof line, "spillway_worker_refusals_total{reason=\"slots\"} %lld\n",
             (long long)refused);
    assert_non_null(strstr(r.body, line));
    assert_non_null(strstr(r.body, "spillway_worker_slots_max_active_seen 1\n"));
    wc_response_free(&r);

    /* idle: n = 3 choices on one slot and no queue is taken, not refused */
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Hello\",\"max_tokens\":3,\"n\":3}", 20000, &r),
                     0);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 3);
    json_decref(j);
    wc_response_free(&r);
    assert_int_equal(wc_worker_stop(&w), 0);
}

static void test_memory_refused_while_busy(void **state)
{
    (void)state;
    char dev[64];
    snprintf(dev, sizeof dev, "sim-gpu:refusal-%d", (int)getpid());
    /* a pool of which 10% may be used: a few thousand tokens of KV */
    const char *args[] = {"--threads",   "1",    "--device",   dev, "--sim-capacity", "24MiB",
                          "--reserve",   "0.9",  "--ctx-limit", "4096", "--max-seqs", "4",
                          NULL};
    static const char *const env[] = {"SPILLWAY_FAULT=stall_ms:20", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, g_model, args, env, 30, NULL), 0);
    /* a max_tokens that one request's KV fits in and two do not */
    json_t *h = get_json(&w, "/health");
    json_t *kv = json_object_get(h, "kv");
    json_int_t budget = json_integer_value(json_object_get(kv, "budget_bytes"));
    json_int_t block = json_integer_value(json_object_get(kv, "block_device_bytes"));
    json_int_t block_tokens = json_integer_value(json_object_get(kv, "block_tokens"));
    json_decref(h);
    assert_true(budget > 0 && block > 0 && block_tokens > 0);
    long fit_tokens = (long)(budget / block * block_tokens);
    long max_tokens = fit_tokens * 6 / 10;
    print_message("KV budget %lld bytes: %ld tokens; max_tokens %ld\n", (long long)budget,
                  fit_tokens, max_tokens);
    assert_true(max_tokens > 64 && max_tokens < 4000);

    int fd = stream_open(&w, (int)max_tokens);
    char body[160];
    snprintf(body, sizeof body, "{\"prompt\":\"Hello\",\"max_tokens\":%ld,\"ignore_eos\":true}",
             max_tokens);
    wc_response r;
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions", body, 10000, &r), 0);
    json_t *e = refusal(&r, "memory");
    json_int_t need = json_integer_value(json_object_get(e, "kv_needed_bytes"));
    json_int_t free_b = json_integer_value(json_object_get(e, "kv_free_bytes"));
    assert_true(need > free_b);
    assert_true(free_b >= 0);
    json_decref(e);
    wc_response_free(&r);
    /* a small one still fits beside it */
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Hello\",\"max_tokens\":4}", 20000, &r),
                     0);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    close(fd);
    h = get_json(&w, "/health");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(h, "refusals"), "memory")), 1);
    json_decref(h);
    assert_int_equal(wc_worker_stop(&w), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_slots_refused_at_once),
        cmocka_unit_test(test_memory_refused_while_busy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
