/* test_worker_calibration.c - end-to-end: the worker's start-up
 * calibration of its prefill/decode rates, and the router's use of rates
 * for a request with a deadline.
 *
 * A worker measures its rates before it reports ready, so /health has
 * them before the first request ("rates_source": "calibration", then
 * "measured" once requests add to them); with --no-calibrate it has none.
 * The calibration is invisible otherwise: the device memory figures after
 * start are those of a worker that did not calibrate, no request or token
 * is counted, the allocations SPILLWAY_FAULT counts are the same (the
 * smallest alloc_fail_after that starts, and the next request's KV block
 * is the first allocation past it), the token faults do not fire, and a
 * device too small for the calibration's KV still starts, without rates.
 * A router with an uncalibrated worker first in preference and a
 * calibrated one second sends a deadline request to the calibrated one,
 * falls back to the unknown one only when the calibrated one is predicted
 * to miss, and a request without a deadline keeps the preference order.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_model[512];
static char g_pool[64];
static char g_spec[96];

/* A request of exactly 4 generated tokens (ignore_eos). */
static const char FOUR_TOKENS[] = "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,"
                                  "\"temperature\":0,\"ignore_eos\":true}";

static int setup(void **state)
{
    (void)state;
    snprintf(g_pool, sizeof g_pool, "wk-calib-%d", (int)getpid());
    snprintf(g_spec, sizeof g_spec, "sim-gpu:%s", g_pool);
    dev_sim_unlink(g_pool, NULL);
    return rh_make_model(g_model, sizeof g_model, "worker-calib.gguf", 11);
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

static json_t *get_json(const char *sock, const char *path)
{
    wc_response r;
    if (wc_request(sock, "GET", path, NULL, 5000, &r) != 0)
        return NULL;
    json_t *j = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    wc_response_free(&r);
    return j;
}

static json_t *health(const wc_worker *w)
{
    json_t *h = get_json(w->socket_path, "/health");
    assert_non_null(h);
    return h;
}

static double num(json_t *h, const char *key)
{
    return json_number_value(json_object_get(h, key));
}

static json_int_t mem_of(json_t *h, const char *key)
{
    json_t *v = json_object_get(json_object_get(h, "memory"), key);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static void assert_source(json_t *h, const char *want)
{
    const char *got = json_string_value(json_object_get(h, "rates_source"));
    assert_non_null(got);
    assert_string_equal(got, want);
}

/* The value of one /metrics line "NAME VALUE" (NAME with its labels). */
/* The worker's /health says its rates were measured on a request, both
 * above zero. */
static void assert_measured(const wc_worker *w)
{
    json_t *h = health(w);
    assert_source(h, "measured");
    assert_true(num(h, "prefill_tokens_per_second") > 0);
    assert_true(num(h, "decode_tokens_per_second") > 0);
    json_decref(h);
}

static long long metric(const wc_worker *w, const char *name)
{
    return rh_metric(w->socket_path, name);
}

static int complete(const wc_worker *w, const char *body, wc_response *out)
{
    return wc_request(w->socket_path, "POST", "/v1/completions", body, 30000, out);
}

/* Rates in /health before any request; "measured" once one ran; none of
 * the start-up work shows in the request and token counters. */
static void test_rates_before_first_request(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1", "--ctx-limit", "512", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, g_model, args, NULL, 30, NULL), 0);
    json_t *h = health(&w);
    assert_true(num(h, "prefill_tokens_per_second") > 0);
    assert_true(num(h, "decode_tokens_per_second") > 0);
    assert_source(h, "calibration");
    assert_int_equal(mem_of(h, "kv_used_bytes"), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(h, "slots"), "active")), 0);
    json_decref(h);
    assert_int_equal(metric(&w, "spillway_worker_prompt_tokens_total"), 0);
    assert_int_equal(metric(&w, "spillway_worker_generated_tokens_total"), 0);
    assert_int_equal(metric(&w, "spillway_worker_requests_total{outcome=\"ok\"}"), 0);
    assert_int_equal(metric(&w, "spillway_worker_requests_total{outcome=\"error\"}"), 0);
    assert_int_equal(metric(&w, "spillway_worker_requests_total{outcome=\"out_of_memory\"}"), 0);

    wc_response r;
    assert_int_equal(complete(&w, FOUR_TOKENS, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    json_int_t prompt_tokens =
        json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    wc_response_free(&r);
    /* the counters hold exactly the request's tokens */
    assert_true(prompt_tokens > 0);
    assert_int_equal(metric(&w, "spillway_worker_prompt_tokens_total"), prompt_tokens);
    assert_int_equal(metric(&w, "spillway_worker_generated_tokens_total"), 4);
    assert_measured(&w);
    assert_int_equal(wc_worker_stop(&w), 0);
}

/* --no-calibrate: no rates until a request measures them. */
static void test_calibration_off(void **state)
{
    (void)state;
    const char *args[] = {"--threads", "1", "--ctx-limit", "512", "--no-calibrate", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, g_model, args, NULL, 30, NULL), 0);
    json_t *h = health(&w);
    assert_true(num(h, "prefill_tokens_per_second") == 0);
    assert_true(num(h, "decode_tokens_per_second") == 0);
    assert_source(h, "none");
    json_decref(h);
    wc_response r;
    assert_int_equal(complete(&w, FOUR_TOKENS, &r), 0);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    assert_measured(&w);
    assert_int_equal(wc_worker_stop(&w), 0);
}

/* The device figures after start, with and without calibration: equal
 * (the scratch sequence's KV blocks went back), the pool empty again once
 * the worker is gone. */
static void test_memory_unchanged(void **state)
{
    (void)state;
    static const char *keys[] = {"used_bytes", "free_bytes", "self_bytes",
                                 "context_device_bytes", "kv_used_bytes"};
    json_int_t figures[2][5];
    for (int pass = 0; pass < 2; pass++) {
        const char *args[] = {"--device", g_spec, "--sim-capacity", "64MiB", "--max-seqs", "2",
                              "--threads", "1", "--ctx-limit", "512", "--policy", "grow",
                              pass ? "--no-calibrate" : NULL, NULL};
        wc_worker w;
        assert_int_equal(wc_worker_start(&w, g_model, args, NULL, 30, NULL), 0);
        json_t *h = health(&w);
        assert_source(h, pass ? "none" : "calibration");
        for (int k = 0; k < 5; k++)
            figures[pass][k] = mem_of(h, keys[k]);
        json_decref(h);
        assert_int_equal(wc_worker_stop(&w), 0);
        dev_sim_unlink(g_pool, NULL);
    }
    for (int k = 0; k < 5; k++) {
        if (figures[0][k] != figures[1][k])
            fail_msg("memory.%s: %lld after calibration, %lld without", keys[k],
                     (long long)figures[0][k], (long long)figures[1][k]);
    }
    assert_true(figures[0][2] > 0); /* the weights are on the device */
    assert_int_equal(figures[0][4], 0);
}

/* The smallest alloc_fail_after:N with which a worker with these options
 * starts (start-up is deterministic). */
static int startup_allocs(const char *const *extra)
{
    int lo = 0, hi = 256;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        char env0[96];
        snprintf(env0, sizeof env0, "SPILLWAY_FAULT=alloc_fail_after:%d", mid);
        const char *env[] = {env0, NULL};
        const char *args[20] = {"--device", g_spec, "--sim-capacity", "64MiB", "--max-seqs", "2",
                                "--threads", "1", "--ctx-limit", "512", "--policy", "reserve"};
        int n = 12;
        for (int i = 0; extra && extra[i]; i++)
            args[n++] = extra[i];
        args[n] = NULL;
        wc_worker w;
        if (wc_worker_start(&w, g_model, args, env, 30, NULL) == 0) {
            wc_worker_stop(&w);
            hi = mid;
        } else {
            lo = mid + 1;
        }
        dev_sim_unlink(g_pool, NULL);
    }
    return lo;
}

/* SPILLWAY_FAULT counts what it did without calibration: the same
 * start-up allocations, and with alloc_fail_after at exactly that number
 * the worker still has its calibrated rates while the first request's KV
 * block is refused; one more allowed allocation and the request is served.
 * The token faults (abort, device error at token 0) do not fire at start. */
static void test_fault_counts_unchanged(void **state)
{
    (void)state;
    const char *off[] = {"--no-calibrate", NULL};
    int n_off = startup_allocs(off);
    int n_on = startup_allocs(NULL);
    assert_true(n_off > 0);
    assert_int_equal(n_on, n_off);

    const char *body = "{\"prompt\":\"Hi\",\"max_tokens\":2,\"temperature\":0,\"ignore_eos\":true}";
    for (int extra = 0; extra < 2; extra++) {
        char env0[96];
        snprintf(env0, sizeof env0, "SPILLWAY_FAULT=alloc_fail_after:%d", n_on + extra);
        const char *env[] = {env0, NULL};
        const char *args[] = {"--device", g_spec, "--sim-capacity", "64MiB", "--max-seqs", "2",
                              "--threads", "1", "--ctx-limit", "512", "--policy", "reserve",
                              NULL};
        wc_worker w;
        assert_int_equal(wc_worker_start(&w, g_model, args, env, 30, NULL), 0);
        json_t *h = health(&w);
        assert_source(h, "calibration");
        assert_true(num(h, "decode_tokens_per_second") > 0);
        json_decref(h);
        wc_response r;
        assert_int_equal(complete(&w, body, &r), 0);
        if (extra == 0) {
            assert_int_equal(r.status, 503);
            json_t *j = json_loads(r.body, 0, NULL);
            json_t *e = json_object_get(j, "error");
            assert_string_equal(json_string_value(json_object_get(e, "code")), "out_of_memory");
            json_decref(j);
        } else {
            assert_int_equal(r.status, 200);
        }
        wc_response_free(&r);
        assert_int_equal(wc_worker_stop(&w), 0);
        dev_sim_unlink(g_pool, NULL);
    }

    static const char *const token_faults[] = {"SPILLWAY_FAULT=abort_after_tokens:0",
                                               "SPILLWAY_FAULT=device_error_after_tokens:0"};
    for (int i = 0; i < 2; i++) {
        const char *env[] = {token_faults[i], NULL};
        const char *args[] = {"--threads", "1", "--ctx-limit", "512", NULL};
        wc_worker w;
        int st = 0;
        assert_int_equal(wc_worker_start(&w, g_model, args, env, 30, &st), 0);
        json_t *h = health(&w);
        assert_string_equal(json_string_value(json_object_get(h, "status")), "ready");
        assert_source(h, "calibration");
        json_decref(h);
        assert_int_equal(wc_worker_stop(&w), 0);
    }
}

/* A device with room for the weights and a short request but not for the
 * calibration's KV: the worker starts without rates and serves. */
static void test_calibration_out_of_memory(void **state)
{
    (void)state;
    const char *probe[] = {"--device", g_spec, "--sim-capacity", "64MiB", "--threads", "1",
                           "--ctx-limit", "512", "--max-seqs", "1", "--reserve", "0",
                           "--no-calibrate", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, g_model, probe, NULL, 30, NULL), 0);
    json_t *h = health(&w);
    json_int_t fixed = mem_of(h, "self_bytes");
    json_int_t kv_bpt = json_integer_value(json_object_get(h, "kv_bytes_per_token"));
    json_decref(h);
    assert_true(fixed > 0 && kv_bpt > 0);
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(g_pool, NULL);

    /* room for 40 tokens of KV (two 16-token blocks and a half): a short
     * request fits, the calibration's scratch sequence (more than 40
     * tokens) does not */
    char cap_text[32];
    snprintf(cap_text, sizeof cap_text, "%lld", (long long)(fixed + 40 * kv_bpt));
    const char *args[] = {"--device", g_spec, "--sim-capacity", cap_text, "--threads", "1",
                          "--ctx-limit", "512", "--max-seqs", "1", "--reserve", "0", NULL};
    assert_int_equal(wc_worker_start(&w, g_model, args, NULL, 30, NULL), 0);
    h = health(&w);
    assert_string_equal(json_string_value(json_object_get(h, "status")), "ready");
    assert_source(h, "none");
    assert_true(num(h, "decode_tokens_per_second") == 0);
    assert_int_equal(mem_of(h, "kv_used_bytes"), 0);
    assert_int_equal(mem_of(h, "self_bytes"), fixed);
    json_decref(h);
    wc_response r;
    assert_int_equal(complete(&w, "{\"prompt\":\"Hi\",\"max_tokens\":4,\"temperature\":0}", &r),
                     0);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(g_pool, NULL);
}

static void assert_routed_to(const rh_router *r, const char *headers, const char *body,
                             const char *want_worker)
{
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/completions", headers, body, &w), 0);
    if (w.status != 200)
        fail_msg("status %d, body %s", w.status, w.body ? w.body : "");
    rh_assert_header(&w, "X-Spillway-Worker", want_worker);
    wc_response_free(&w);
}

/* The router: "cold" (calibration off) is first in preference, "warm"
 * (calibrated) second. A deadline request goes to warm, whose rates
 * predict it in time; one warm is predicted to miss falls back to cold,
 * whose rates are unknown; without a deadline the preference order holds. */
static void test_router_prefers_known_rates(void **state)
{
    (void)state;
    rh_router r;
    assert_int_equal(rh_start(&r, "calib", g_model, NULL,
                              "[worker cold]\nthreads = 1\nctx-limit = 512\ncalibrate = false\n"
                              "preference = 1\n"
                              "[worker warm]\nthreads = 1\nctx-limit = 512\npreference = 2\n"),
                     0);
    json_t *cold = rh_worker_health(&r, "cold");
    json_t *warm = rh_worker_health(&r, "warm");
    assert_true(num(cold, "decode_tokens_per_second") == 0);
    assert_true(num(warm, "prefill_tokens_per_second") > 0);
    assert_true(num(warm, "decode_tokens_per_second") > 0);
    /* the router's /health passes on where the rates come from */
    assert_string_equal(json_string_value(json_object_get(cold, "rates_source")), "none");
    assert_string_equal(json_string_value(json_object_get(warm, "rates_source")), "calibration");
    json_decref(cold);
    json_decref(warm);

    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0}";
    /* a generous deadline: warm is predicted to meet it, cold unknown */
    assert_routed_to(&r, "X-Spillway-Deadline-Ms: 600000\r\n", body, "warm");
    assert_routed_to(&r, "X-Spillway-Deadline-Ms: 600000\r\n", body, "warm");
    /* 400 tokens in 1 ms: warm is predicted to miss; cold, unknown, is
     * all that is left */
    assert_routed_to(&r, "X-Spillway-Deadline-Ms: 1\r\n",
                     "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"temperature\":0}",
                     "cold");
    /* without a deadline: the preference order */
    assert_routed_to(&r, NULL, body, "cold");
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rates_before_first_request),
        cmocka_unit_test(test_calibration_off),
        cmocka_unit_test(test_memory_unchanged),
        cmocka_unit_test(test_fault_counts_unchanged),
        cmocka_unit_test(test_calibration_out_of_memory),
        cmocka_unit_test(test_router_prefers_known_rates),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
