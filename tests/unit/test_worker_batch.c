/* test_worker_batch.c - end-to-end: continuous batching and cancellation.
 *
 * 8 concurrent streams on one worker (8 slots, prefill in chunks of 8
 * tokens so newcomers' prefills interleave with the others' decoding) each
 * give exactly the tokens `spillway run` gives for them alone. A client that
 * disconnects mid-stream gets its sequence stopped and its KV memory freed:
 * /health shows the baseline again long before the generation would have
 * ended (tokens are slowed by SPILLWAY_FAULT=stall_ms so that "long before"
 * is measurable without timing assertions on speed).
 */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXTOK 256
#define NSTREAMS 8

static char g_model[512];

static int setup(void **state)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 11;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("worker-batch.gguf"));
    return eng_model_make(&p, g_model, NULL) == 0 && tu_spillway_bin() ? 0 : -1;
}

static int teardown(void **state)
{
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

static json_t *health(const wc_worker *w)
{
    wc_response r;
    if (wc_request(w->socket_path, "GET", "/health", NULL, 5000, &r) != 0)
        return NULL;
    json_t *j = json_loads(r.body, 0, NULL);
    wc_response_free(&r);
    return j;
}

static json_int_t health_int(const wc_worker *w, const char *obj, const char *key)
{
    json_t *j = health(w);
    json_int_t v = json_integer_value(json_object_get(json_object_get(j, obj), key));
    json_decref(j);
    return v;
}

static const char *const prompts[NSTREAMS] = {
    "Once upon a time there was a little dog who liked to run",
    "The cat sat on the mat and looked at the big red ball",
    "In the morning the sun came up over the hill",
    "She said hello to the boy and they went to play",
    "A big tree stood in the park near the old house",
    "The bird sang a song in the blue sky all day",
    "We like to eat apples and go for long walks",
    "Tom and his friend found a box in the garden",
};

static void test_eight_concurrent_streams(void **state)
{
    static const char *const args[] = {"--max-seqs", "8", "--prefill-chunk", "8", "--threads",
                                       "1", "--ctx-limit", "256", NULL};
    static const char *const env[] = {"SPILLWAY_FAULT=stall_ms:1", NULL};
    wc_worker w;
    int ref[NSTREAMS][MAXTOK], n_ref[NSTREAMS];
    int fds[NSTREAMS];
    char *buf[NSTREAMS];
    size_t len[NSTREAMS], cap = 1 << 20;
    bool open_[NSTREAMS];

    /* References: each prompt alone, half greedy, half seeded. */
    for (int i = 0; i < NSTREAMS; i++) {
        char seed[16];
        snprintf(seed, sizeof seed, "%d", 100 + i);
        const char *greedy[] = {"-n", "40", "--temp", "0", "--ignore-eos", NULL};
        const char *seeded[] = {"-n", "40", "--temp", "0.8", "--top-k", "40", "--top-p", "0.95",
                                "--min-p", "0.05", "--seed", seed, "--ignore-eos", NULL};
        n_ref[i] = wc_run_tokens(g_model, prompts[i], i % 2 ? seeded : greedy, ref[i], MAXTOK);
        assert_int_equal(n_ref[i], 40);
    }
    assert_int_equal(wc_worker_start(&w, g_model, args, env, 30, NULL), 0);
    for (int i = 0; i < NSTREAMS; i++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"%s\",\"max_tokens\":40,\"stream\":true,\"ignore_eos\":true,%s,"
                 "\"seed\":%d}",
                 prompts[i],
                 i % 2 ? "\"temperature\":0.8,\"top_k\":40,\"top_p\":0.95,\"min_p\":0.05"
                       : "\"temperature\":0",
                 100 + i);
        fds[i] = wc_connect(w.socket_path, 30000);
        assert_true(fds[i] >= 0);
        assert_int_equal(wc_send(fds[i], "POST", "/v1/completions", body), 0);
        buf[i] = sw_malloc(cap);
        len[i] = 0;
        open_[i] = true;
    }
    /* Read all streams together; once every stream has sent something,
     * the worker must be serving several at once. */
    double end = now_s() + 60;
    int n_open = NSTREAMS;
    bool checked_batching = false;
    json_int_t max_active = 0;
    while (n_open > 0 && now_s() < end) {
        struct pollfd pfd[NSTREAMS];
        for (int i = 0; i < NSTREAMS; i++)
            pfd[i] = (struct pollfd){open_[i] ? fds[i] : -1, POLLIN, 0};
        if (poll(pfd, NSTREAMS, 1000) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < NSTREAMS; i++) {
            if (!open_[i] || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t n = read(fds[i], buf[i] + len[i], cap - len[i] - 1);
            if (n > 0) {
                len[i] += (size_t)n;
            } else {
                open_[i] = false;
                n_open--;
            }
        }
        bool all_started = true;
        for (int i = 0; i < NSTREAMS; i++)
            all_started &= len[i] > 0;
        if (all_started && !checked_batching && n_open == NSTREAMS) {
            max_active = health_int(&w, "slots", "active");
            checked_batching = true;
        }
    }
    assert_int_equal(n_open, 0);
    assert_true(checked_batching);
    assert_true(max_active >= 2);
    for (int i = 0; i < NSTREAMS; i++) {
        wc_response r;
        int got[MAXTOK];
        close(fds[i]);
        assert_int_equal(wc_response_parse(buf[i], len[i], &r), 0);
        assert_int_equal(r.status, 200);
        int n = wc_tokens_of(&r, true, got, MAXTOK, NULL, NULL, 0);
        assert_int_equal(n, n_ref[i]);
        assert_memory_equal(got, ref[i], (size_t)n * sizeof(int));
        wc_response_free(&r);
        sw_free(buf[i]);
    }
    assert_int_equal(health_int(&w, "slots", "active"), 0);
    assert_int_equal(wc_worker_stop(&w), 0);
}

static void test_disconnect_frees_kv(void **state)
{
    static const char *const args[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", "1024",
                                       NULL};
    /* 20 ms per token: the 600-token generation would take 12 s. */
    static const char *const env[] = {"SPILLWAY_FAULT=stall_ms:20", NULL};
    wc_worker w;
    char buf[65536];
    size_t len = 0;

    assert_int_equal(wc_worker_start(&w, g_model, args, env, 30, NULL), 0);
    json_int_t baseline = health_int(&w, "memory", "kv_used_bytes");
    int fd = wc_connect(w.socket_path, 10000);
    assert_true(fd >= 0);
    assert_int_equal(wc_send(fd, "POST", "/v1/completions",
                             "{\"prompt\":\"Once upon a time\",\"max_tokens\":600,\"stream\":true,"
                             "\"ignore_eos\":true,\"temperature\":0}"),
                     0);
    /* Wait for 3 token events. */
    int events = 0;
    while (events < 4 && len < sizeof buf - 1) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        assert_true(n > 0);
        len += (size_t)n;
        buf[len] = '\0';
        events = 0;
        for (char *p = buf; (p = strstr(p, "data: ")); p += 6)
            events++;
    }
    assert_true(health_int(&w, "memory", "kv_used_bytes") > baseline);
    assert_int_equal(health_int(&w, "slots", "active"), 1);
    close(fd);
    double t0 = now_s();
    json_int_t kv = -1, active = -1;
    while (now_s() - t0 < 5) {
        kv = health_int(&w, "memory", "kv_used_bytes");
        active = health_int(&w, "slots", "active");
        if (kv == baseline && active == 0)
            break;
        usleep(5000);
    }
    assert_int_equal(kv, baseline);
    assert_int_equal(active, 0);

    wc_response r;
    assert_int_equal(wc_request(w.socket_path, "GET", "/metrics", NULL, 5000, &r), 0);
    assert_non_null(strstr(r.body, "spillway_worker_requests_total{outcome=\"cancelled\"} 1\n"));
    wc_response_free(&r);

    /* Non-stream clients that give up, two generating and one queued (2
     * slots): nothing was written to them yet, yet all three are cancelled
     * and their memory freed. */
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = wc_connect(w.socket_path, 10000);
        assert_true(fds[i] >= 0);
        assert_int_equal(wc_send(fds[i], "POST", "/v1/completions",
                                 "{\"prompt\":\"Once upon a time\",\"max_tokens\":600,"
                                 "\"ignore_eos\":true,\"temperature\":0}"),
                         0);
    }
    t0 = now_s();
    while (now_s() - t0 < 5 && (health_int(&w, "slots", "queued") != 1 ||
                                health_int(&w, "slots", "active") != 2))
        usleep(5000);
    assert_int_equal(health_int(&w, "slots", "active"), 2);
    assert_true(health_int(&w, "memory", "kv_used_bytes") > baseline);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    t0 = now_s();
    while (now_s() - t0 < 5) {
        kv = health_int(&w, "memory", "kv_used_bytes");
        active = health_int(&w, "slots", "active") + health_int(&w, "slots", "queued");
        if (kv == baseline && active == 0)
            break;
        usleep(5000);
    }
    assert_int_equal(kv, baseline);
    assert_int_equal(active, 0);
    assert_int_equal(wc_request(w.socket_path, "GET", "/metrics", NULL, 5000, &r), 0);
    assert_non_null(strstr(r.body, "spillway_worker_requests_total{outcome=\"cancelled\"} 4\n"));
    wc_response_free(&r);
    /* The worker still serves. */
    assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                "{\"prompt\":\"Hi\",\"max_tokens\":3}", 10000, &r),
                     0);
    assert_int_equal(r.status, 200);
    wc_response_free(&r);
    assert_int_equal(wc_worker_stop(&w), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eight_concurrent_streams),
        cmocka_unit_test(test_disconnect_frees_kv),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
