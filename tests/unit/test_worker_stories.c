/* test_worker_stories.c - end-to-end against the reference engine's
 * recorded outputs: a worker serving ../shared's stories260K streams, for
 * every greedy golden prompt (all at once, so they are batched), exactly the
 * recorded tokens and, concatenated from the SSE chunks, exactly the
 * recorded text (UTF-8 included: no chunk splits a character). Skips when
 * ../shared is absent. */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXP 16

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_golden_batched_streams(void **state)
{
    const char *gpath = tu_shared_path("models/stories260K.golden.json");
    if (!gpath)
        return;
    json_t *golden = json_load_file(gpath, 0, NULL);
    assert_non_null(golden);
    const char *mpath = tu_shared_path("models/stories260K.gguf");
    if (!mpath) {
        json_decref(golden);
        return;
    }
    char model[1024];
    snprintf(model, sizeof model, "%s", mpath);
    json_t *greedy = json_object_get(golden, "greedy");
    size_t n = json_array_size(greedy);
    assert_true(n > 1 && n <= MAXP);

    static const char *const args[] = {"--max-seqs", "8", "--threads", "1", "--ctx-limit", "256",
                                       "--prefill-chunk", "4", NULL};
    wc_worker w;
    assert_int_equal(wc_worker_start(&w, model, args, NULL, 30, NULL), 0);
    int fds[MAXP];
    char *buf[MAXP];
    size_t len[MAXP], cap = 1 << 20;
    bool open_[MAXP];
    for (size_t i = 0; i < n; i++) {
        json_t *g = json_array_get(greedy, i);
        json_t *body = json_pack("{s:O, s:I, s:b, s:f, s:b}", "prompt", json_object_get(g, "prompt"),
                                 "max_tokens",
                                 (json_int_t)json_array_size(json_object_get(g, "tokens")),
                                 "stream", 1, "temperature", 0.0, "ignore_eos", 1);
        char *text = json_dumps(body, JSON_COMPACT);
        fds[i] = wc_connect(w.socket_path, 30000);
        assert_true(fds[i] >= 0);
        assert_int_equal(wc_send(fds[i], "POST", "/v1/completions", text), 0);
        free(text);
        json_decref(body);
        buf[i] = sw_malloc(cap);
        len[i] = 0;
        open_[i] = true;
    }
    size_t n_open = n;
    double end = now_s() + 60;
    while (n_open > 0 && now_s() < end) {
        struct pollfd pfd[MAXP];
        for (size_t i = 0; i < n; i++)
            pfd[i] = (struct pollfd){open_[i] ? fds[i] : -1, POLLIN, 0};
        if (poll(pfd, (nfds_t)n, 1000) < 0 && errno != EINTR)
            break;
        for (size_t i = 0; i < n; i++) {
            if (!open_[i] || !pfd[i].revents)
                continue;
            ssize_t r = read(fds[i], buf[i] + len[i], cap - len[i] - 1);
            if (r > 0) {
                len[i] += (size_t)r;
            } else {
                open_[i] = false;
                n_open--;
            }
        }
    }
    assert_int_equal(n_open, 0);
    for (size_t i = 0; i < n; i++) {
        json_t *g = json_array_get(greedy, i);
        json_t *expect = json_object_get(g, "tokens");
        wc_response r;
        int got[256];
        char *text = NULL;
        close(fds[i]);
        assert_int_equal(wc_response_parse(buf[i], len[i], &r), 0);
        assert_int_equal(r.status, 200);
        int k = wc_tokens_of(&r, true, got, 256, &text, NULL, 0);
        assert_int_equal(k, (int)json_array_size(expect));
        for (int t = 0; t < k; t++)
            if (got[t] != json_integer_value(json_array_get(expect, (size_t)t)))
                fail_msg("prompt %zu: token %d is %d, reference %d", i, t, got[t],
                         (int)json_integer_value(json_array_get(expect, (size_t)t)));
        assert_string_equal(text, json_string_value(json_object_get(g, "text")));
        sw_free(text);
        wc_response_free(&r);
        sw_free(buf[i]);
    }
    assert_int_equal(wc_worker_stop(&w), 0);
    json_decref(golden);
}

static int teardown(void **state)
{
    wc_worker_kill_all();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_batched_streams),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
