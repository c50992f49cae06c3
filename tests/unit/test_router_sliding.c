/* test_router_sliding.c - the router's admission counts a sliding-window
 * model's sequences (gemma3) by what its worker really takes: of the
 * local layers only the blocks their window reaches.
 *
 * A real `spillway serve` with a GPU worker on a sim-gpu pool and a CPU
 * worker, both serving a gemma3 file whose 3 sliding layers of 4 have a
 * window of 16 tokens. The GPU worker's /health publishes the sliding
 * share of a block and the most blocks of it a sequence holds, and the
 * router's /health repeats them. The pool leaves 140 KiB of KV free: a
 * request of about 305 tokens needs 320 KiB counted in whole blocks of
 * every layer (the figure before windowed KV) but 104 KiB by the new one,
 * and goes to the GPU, where the worker's own RESERVE admission takes
 * exactly that; one of about 705 tokens needs 200 KiB and goes to the
 * CPU. While nothing runs the router's books are empty again.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "device/device.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define KiB 1024ll

static char g_model[512];
static char g_pool[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_pool, sizeof g_pool, "rt-swa-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    return rh_make_sliding_model(g_model, sizeof g_model, "router-sliding.gguf", 9);
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

static long long get_int(json_t *o, const char *obj, const char *key)
{
    json_t *v = json_object_get(obj ? json_object_get(o, obj) : o, key);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static void request(const rh_router *r, int max_tokens, const char *want_worker)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true}",
             max_tokens);
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/completions", NULL, body, &w), 0);
    if (w.status != 200)
        fail_msg("%d tokens: status %d: %s", max_tokens, w.status, w.body ? w.body : "");
    rh_assert_header(&w, "X-Spillway-Worker", want_worker);
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    json_t *j = rh_body_json(&w);
    assert_int_equal(get_int(j, "usage", "completion_tokens"), max_tokens);
    json_decref(j);
    wc_response_free(&w);
}

static void test_admission_counts_the_window(void **state)
{
    (void)state;
    char spec[96];
    snprintf(spec, sizeof spec, "sim-gpu:%s", g_pool);

    /* The worker's figures, and what the model and workspace take. */
    wc_worker probe;
    const char *pargs[] = {"--device", spec, "--sim-capacity", "64MiB", "--max-seqs", "2",
                           "--threads", "1", "--ctx-limit", "1024", NULL};
    assert_int_equal(wc_worker_start(&probe, g_model, pargs, NULL, 30, NULL), 0);
    wc_response h;
    assert_int_equal(wc_request(probe.socket_path, "GET", "/health", NULL, 5000, &h), 0);
    json_t *hj = rh_body_json(&h);
    long long fixed = get_int(hj, "memory", "self_bytes");
    /* per token 4 layers x 2 (K, V) x 2 heads x 32 x 2 bytes = 1 KiB */
    assert_int_equal(get_int(hj, NULL, "kv_bytes_per_token"), 1024);
    assert_int_equal(get_int(hj, "kv", "block_tokens"), 16);
    assert_int_equal(get_int(hj, "kv", "block_device_bytes"), 16 * KiB);
    assert_int_equal(get_int(hj, "kv", "sliding_block_device_bytes"), 12 * KiB);
    assert_int_equal(get_int(hj, "kv", "sliding_blocks_max"), 2); /* ceil(15 / 16) + 1 */
    json_decref(hj);
    wc_response_free(&h);
    assert_int_equal(wc_worker_stop(&probe), 0);
    dev_sim_unlink(g_pool, NULL);
    assert_true(fixed > 0);
    long long capacity = (long long)((double)(fixed + 140 * KiB) / 0.9) + 4096;

    rh_router r;
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = %s\nsim-capacity = %lld\nmax-seqs = 2\nthreads = 1\n"
             "ctx-limit = 1024\n[worker cpu]\nthreads = 1\nctx-limit = 1024\n",
             spec, capacity);
    assert_int_equal(rh_start(&r, "sliding", g_model, NULL, workers), 0);
    json_t *gw = rh_worker_health(&r, "gpu");
    assert_int_equal(get_int(gw, "reported", "kv_sliding_block_device_bytes"), 12 * KiB);
    assert_int_equal(get_int(gw, "reported", "kv_sliding_blocks_max"), 2);
    long long budget = get_int(gw, "books", "kv_budget_bytes");
    json_decref(gw);
    /* the prompt is a few tokens: 300 more make 20 blocks, 700 more 44 */
    assert_true(budget > 104 * KiB && budget < 200 * KiB && budget < 320 * KiB);
    request(&r, 300, "gpu");
    request(&r, 700, "cpu");
    gw = rh_worker_health(&r, "gpu");
    assert_int_equal(get_int(gw, "books", "kv_reserved_bytes"), 0);
    assert_int_equal(get_int(gw, "books", "seqs"), 0);
    json_decref(gw);
    rh_finish(&r);
    dev_sim_unlink(g_pool, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_counts_the_window),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
