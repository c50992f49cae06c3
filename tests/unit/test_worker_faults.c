/* test_worker_faults.c - end-to-end: typed memory failures on sim-gpu.
 *
 * Admission (policy reserve): a request whose KV need does not fit under
 * the device's reserve is refused with 503 out_of_memory (phase admission,
 * bytes needed and free) before any work, and nothing stays allocated.
 * Generation (policy grow, SPILLWAY_FAULT=alloc_fail_after:N): the stream
 * whose next KV block cannot be had ends with the typed error event and
 * [DONE], its memory is freed, and a concurrent request completes with the
 * tokens it has alone.
 */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"
#include "modelgen/model_make.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXTOK 512

static char g_model[512];
static char g_pool[64];
static char g_spec[96];

static int setup(void **state)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 5;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("worker-faults.gguf"));
    snprintf(g_pool, sizeof g_pool, "wk-faults-%d", (int)getpid());
    snprintf(g_spec, sizeof g_spec, "sim-gpu:%s", g_pool);
    dev_sim_unlink(g_pool, NULL);
    return eng_model_make(&p, g_model, NULL) == 0 && tu_spillway_bin() ? 0 : -1;
}

static int teardown(void **state)
{
    dev_sim_unlink(g_pool, NULL);
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

static json_t *get_json(const wc_worker *w, const char *path)
{
    wc_response r;
    if (wc_request(w->socket_path, "GET", path, NULL, 5000, &r) != 0)
        return NULL;
    json_t *j = json_loads(r.body, 0, NULL);
    wc_response_free(&r);
    return j;
}

static json_int_t mem(const wc_worker *w, const char *key)
{
    json_t *j = get_json(w, "/health");
    json_int_t v = json_integer_value(json_object_get(json_object_get(j, "memory"), key));
    json_decref(j);
    return v;
}

static void test_admission_refusal(void **state)
{
    wc_worker w;
    char cap_text[32];
    /* First learn what the model and workspace take on the device. */
    const char *probe[] = {"--device", g_spec, "--sim-capacity", "64MiB", "--max-seqs", "2",
                           "--threads", "1", "--ctx-limit", "2048", NULL};
    assert_int_equal(wc_worker_start(&w, g_model, probe, NULL, 30, NULL), 0);
    json_int_t fixed = mem(&w, "self_bytes");
    assert_true(fixed > 0);
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(g_pool, NULL);

    /* A pool where 64 KiB (256 tokens of KV) stay free under the 10%
     * reserve. */
    long long capacity = (long long)((double)(fixed + 65536) / 0.9) + 4096;
    snprintf(cap_text, sizeof cap_text, "%lld", capacity);
    const char *args[] = {"--device", g_spec, "--sim-capacity", cap_text, "--max-seqs", "2",
                          "--threads", "1", "--ctx-limit", "2048", NULL};
    assert_int_equal(wc_worker_start(&w, g_model, args, NULL, 30, NULL), 0);
    json_int_t used0 = mem(&w, "used_bytes"), kv0 = mem(&w, "kv_used_bytes");

    wc_response r;
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,"
                                "\"stream\":true}",
                                10000, &r),
                     0);
    assert_int_equal(r.status, 503);
    char ra[16];
    assert_true(wc_header(&r, "Retry-After", ra, sizeof ra));
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "out_of_memory");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "server_error");
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(json_object_get(e, "param") != NULL);
    assert_string_equal(json_string_value(json_object_get(e, "phase")), "admission");
    json_int_t needed = json_integer_value(json_object_get(e, "bytes_needed"));
    json_int_t free_b = json_integer_value(json_object_get(e, "bytes_free"));
    /* >= 1500 tokens of 256 bytes; about 64 KiB free */
    assert_true(needed >= 1500 * 256);
    assert_true(free_b >= 60000 && free_b <= 70000 + 4096);
    assert_true(free_b < needed);
    json_decref(j);
    wc_response_free(&r);
    /* Nothing was allocated. */
    assert_int_equal(mem(&w, "used_bytes"), used0);
    assert_int_equal(mem(&w, "kv_used_bytes"), kv0);

    /* A request that fits is served, with the tokens of a CPU run. */
    int ref[MAXTOK], got[MAXTOK];
    const char *run_args[] = {"-n", "100", "--temp", "0", "--ignore-eos", NULL};
    int n_ref = wc_run_tokens(g_model, "Once upon a time", run_args, ref, MAXTOK);
    assert_int_equal(n_ref, 100);
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Once upon a time\",\"max_tokens\":100,"
                                "\"temperature\":0,\"ignore_eos\":true}",
                                10000, &r),
                     0);
    assert_int_equal(r.status, 200);
    assert_int_equal(wc_tokens_of(&r, false, got, MAXTOK, NULL, NULL, 0), 100);
    assert_memory_equal(got, ref, sizeof(int) * 100);
    wc_response_free(&r);
    /* what it leaves is its full KV blocks, in the prefix cache (evictable) */
    assert_int_equal(mem(&w, "kv_used_bytes"), kv0);
    assert_true(mem(&w, "kv_cached_bytes") > 0);
    assert_int_equal(mem(&w, "used_bytes"), used0 + mem(&w, "kv_cached_bytes"));

    j = get_json(&w, "/health");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "device"), "kind")),
                        "sim-gpu");
    assert_true(json_is_true(json_object_get(json_object_get(j, "device"), "simulated")));
    json_decref(j);
    assert_int_equal(wc_worker_stop(&w), 0);
    dev_sim_unlink(g_pool, NULL);
}

/* Starts a grow-policy worker on the pool with SPILLWAY_FAULT=fault. */
static int start_grow(wc_worker *w, const char *fault, int *exit_status)
{
    static char env0[128];
    snprintf(env0, sizeof env0, "SPILLWAY_FAULT=%s", fault);
    const char *env[] = {env0, NULL};
    const char *args[] = {"--device", g_spec, "--sim-capacity", "64MiB", "--max-seqs", "4",
                          "--threads", "1", "--ctx-limit", "512", "--policy", "grow", NULL};
    return wc_worker_start(w, g_model, args, env, 30, exit_status);
}

static void read_until_events(int fd, char *buf, size_t *len, size_t cap, int want)
{
    int events = 0;
    while (events < want && *len < cap - 1) {
        ssize_t n = read(fd, buf + *len, cap - 1 - *len);
        assert_true(n > 0);
        *len += (size_t)n;
        buf[*len] = '\0';
        events = 0;
        for (char *p = buf; (p = strstr(p, "data: ")); p += 6)
            events++;
    }
}

static void test_grow_injected_oom(void **state)
{
    wc_worker w;
    char fault[96];
    int st;

    /* How many device allocations does startup make? The smallest N with
     * which the worker starts (the startup path is deterministic). */
    int lo = 0, hi = 1024;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        snprintf(fault, sizeof fault, "alloc_fail_after:%d", mid);
        if (start_grow(&w, fault, &st) == 0) {
            wc_worker_stop(&w);
            hi = mid;
        } else {
            assert_int_equal(st, 1); /* a clean startup failure */
            lo = mid + 1;
        }
    }
    int startup = lo;
    assert_true(startup > 0 && startup < 1024);

    /* Two KV blocks (16 tokens each) after startup: B's and A's first. */
    snprintf(fault, sizeof fault, "alloc_fail_after:%d,stall_ms:10", startup + 2);
    assert_int_equal(start_grow(&w, fault, &st), 0);
    json_int_t kv0 = mem(&w, "kv_used_bytes");

    int ref_b[MAXTOK];
    const char *run_args[] = {"-n", "10", "--temp", "0", "--ignore-eos", NULL};
    int n_ref_b = wc_run_tokens(g_model, "Hi", run_args, ref_b, MAXTOK);
    assert_int_equal(n_ref_b, 10);

    static char buf_a[1 << 16], buf_b[1 << 16];
    size_t len_a = 0, len_b = 0;
    int fb = wc_connect(w.socket_path, 20000), fa = wc_connect(w.socket_path, 20000);
    assert_true(fa >= 0 && fb >= 0);
    assert_int_equal(wc_send(fb, "POST", "/v1/completions",
                             "{\"prompt\":\"Hi\",\"max_tokens\":10,\"stream\":true,"
                             "\"temperature\":0,\"ignore_eos\":true}"),
                     0);
    read_until_events(fb, buf_b, &len_b, sizeof buf_b, 1);
    assert_int_equal(wc_send(fa, "POST", "/v1/completions",
                             "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"stream\":true,"
                             "\"temperature\":0,\"ignore_eos\":true}"),
                     0);
    bool open_a = true, open_b = true;
    double end = now_s() + 30;
    while ((open_a || open_b) && now_s() < end) {
        struct pollfd p[2] = {{open_a ? fa : -1, POLLIN, 0}, {open_b ? fb : -1, POLLIN, 0}};
        if (poll(p, 2, 1000) < 0 && errno != EINTR)
            break;
        if (open_a && p[0].revents) {
            ssize_t n = read(fa, buf_a + len_a, sizeof buf_a - 1 - len_a);
            if (n > 0)
                len_a += (size_t)n;
            else
                open_a = false;
        }
        if (open_b && p[1].revents) {
            ssize_t n = read(fb, buf_b + len_b, sizeof buf_b - 1 - len_b);
            if (n > 0)
                len_b += (size_t)n;
            else
                open_b = false;
        }
    }
    close(fa);
    close(fb);
    assert_false(open_a || open_b);

    /* B completed with its solo tokens. */
    wc_response rb, ra;
    int got[MAXTOK];
    assert_int_equal(wc_response_parse(buf_b, len_b, &rb), 0);
    assert_int_equal(rb.status, 200);
    assert_int_equal(wc_tokens_of(&rb, true, got, MAXTOK, NULL, NULL, 0), 10);
    assert_memory_equal(got, ref_b, sizeof(int) * 10);
    wc_response_free(&rb);

    /* A: a started stream that ends with the typed error, then [DONE]. */
    char **ev;
    assert_int_equal(wc_response_parse(buf_a, len_a, &ra), 0);
    assert_int_equal(ra.status, 200);
    int n = wc_sse_parse(ra.body, ra.body_len, &ev);
    assert_true(n >= 3);
    assert_string_equal(ev[n - 1], "[DONE]");
    json_t *j = json_loads(ev[n - 2], 0, NULL);
    json_t *e = json_object_get(j, "error");
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(e, "code")), "out_of_memory");
    assert_string_equal(json_string_value(json_object_get(e, "phase")), "decode");
    json_decref(j);
    int tokens_before = 0;
    for (int i = 0; i < n - 2; i++) {
        j = json_loads(ev[i], 0, NULL);
        assert_null(json_object_get(j, "error"));
        tokens_before += (int)json_array_size(
            json_object_get(json_object_get(j, "spillway"), "token_ids"));
        json_decref(j);
    }
    assert_true(tokens_before > 0 && tokens_before < 200);
    wc_sse_free(ev, n);
    wc_response_free(&ra);

    /* Everything was given back. */
    assert_int_equal(mem(&w, "kv_used_bytes"), kv0);
    json_t *h = get_json(&w, "/health");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(h, "slots"), "active")), 0);
    assert_string_equal(json_string_value(json_object_get(h, "state")), "ready");
    json_decref(h);

    /* Every further allocation fails now. A's first block (16 tokens) is
     * in the prefix cache, evictable: the next request gets its memory
     * from there (cached blocks never cause a refusal) ... */
    wc_response r;
    assert_true(mem(&w, "kv_cached_bytes") > 0);
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Hi\",\"max_tokens\":5,\"stream\":true}", 10000, &r),
                     0);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    assert_int_equal(mem(&w, "kv_cached_bytes"), 0);
    /* ... and with nothing cached left, under grow the prompt's blocks are
     * taken at admission, so a new request is refused there. */
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Hi\",\"max_tokens\":5,\"stream\":true}", 10000, &r),
                     0);
    assert_int_equal(r.status, 503);
    j = json_loads(r.body, 0, NULL);
    e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "out_of_memory");
    assert_string_equal(json_string_value(json_object_get(e, "phase")), "admission");
    json_decref(j);
    wc_response_free(&r);
    assert_int_equal(mem(&w, "kv_used_bytes"), kv0);
    assert_int_equal(wc_worker_stop(&w), 0);
}

/* An unrecoverable device error (injected: device_error_after_tokens) is
 * reported to the request in the stream as a final typed error event, and
 * the worker then exits with status 75 so that its supervisor restarts it. */
static void test_device_failure_exit_status(void **state)
{
    (void)state;
    wc_worker w;
    const char *env[] = {"SPILLWAY_FAULT=device_error_after_tokens:3", NULL};
    const char *args[] = {"--threads", "1", NULL};
    assert_int_equal(wc_worker_start(&w, g_model, args, env, 30, NULL), 0);
    wc_response r;
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"once upon\",\"max_tokens\":10,\"stream\":true}",
                                20000, &r),
                     0);
    assert_int_equal(r.status, 200);
    char **events = NULL;
    int n = wc_sse_parse(r.body, r.body_len, &events);
    assert_true(n >= 2);
    /* Three tokens went out, then the error event, then [DONE]. */
    int tokens = 0;
    bool error_seen = false;
    for (int i = 0; i < n; i++) {
        json_t *j = json_loads(events[i], 0, NULL);
        if (!j)
            continue;
        json_t *e = json_object_get(j, "error");
        if (e) {
            error_seen = true;
            assert_string_equal(json_string_value(json_object_get(e, "code")), "device_failed");
        } else {
            json_t *ids = json_object_get(json_object_get(j, "spillway"), "token_ids");
            tokens += (int)json_array_size(ids);
        }
        json_decref(j);
    }
    assert_true(error_seen);
    assert_int_equal(tokens, 3);
    assert_string_equal(events[n - 1], "[DONE]");
    wc_sse_free(events, n);
    wc_response_free(&r);
    assert_int_equal(wc_worker_wait(&w, 20), 75);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_refusal),
        cmocka_unit_test(test_grow_injected_oom),
        cmocka_unit_test(test_device_failure_exit_status),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
