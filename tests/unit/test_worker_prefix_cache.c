/* test_worker_prefix_cache.c - the prefix cache end to end, through real
 * `spillway worker` processes:
 *   - a chat whose conversation grows turn after turn prefills only its
 *     new tokens (usage.prompt_tokens_details.cached_tokens and the
 *     worker's computed-prompt-token counter agree), and every turn's
 *     answer equals a cold worker's (--no-prefix-cache), greedy and
 *     seeded, streamed and not; cache_prompt: false computes it all;
 *   - 8 concurrent requests with a 1,000-token common prefix hold its
 *     blocks once (the shared-blocks gauge, the KV in use) and each answer
 *     equals the cold worker's. */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXTOK 256

static char g_model[512];
static wc_worker g_hot, g_cold;

static int setup(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 17;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("worker-prefix.gguf"));
    if (eng_model_make(&p, g_model, NULL) != 0 || !tu_spillway_bin())
        return -1;
    static const char *const hot[] = {"--max-seqs", "8", "--threads", "1", "--ctx-limit",
                                      "2048", "--prefill-chunk", "64", NULL};
    static const char *const cold[] = {"--max-seqs", "8", "--threads", "1", "--ctx-limit",
                                       "2048", "--prefill-chunk", "64", "--no-prefix-cache",
                                       NULL};
    if (wc_worker_start(&g_hot, g_model, hot, NULL, 30, NULL))
        return -1;
    return wc_worker_start(&g_cold, g_model, cold, NULL, 30, NULL);
}

static int teardown(void **state)
{
    (void)state;
    int a = wc_worker_stop(&g_hot), b = wc_worker_stop(&g_cold);
    remove(g_model);
    wc_worker_kill_all();
    return a == 0 && b == 0 ? 0 : -1;
}

static json_t *get_json(const wc_worker *w, const char *path)
{
    wc_response r;
    assert_int_equal(wc_request(w->socket_path, "GET", path, NULL, 10000, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_non_null(j);
    wc_response_free(&r);
    return j;
}

static long long metric(const wc_worker *w, const char *name)
{
    wc_response r;
    assert_int_equal(wc_request(w->socket_path, "GET", "/metrics", NULL, 10000, &r), 0);
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(r.body, key);
    assert_non_null(at);
    long long v = atoll(at + strlen(key));
    wc_response_free(&r);
    return v;
}

static long long cache_figure(const wc_worker *w, const char *name)
{
    json_t *h = get_json(w, "/health");
    json_t *v = json_object_get(json_object_get(h, "prefix_cache"), name);
    assert_true(json_is_integer(v));
    long long x = json_integer_value(v);
    json_decref(h);
    return x;
}

/* The usage object of a response: the body's, or a stream's last chunk
 * that carries one (stream_options.include_usage). A new reference. */
static json_t *usage_of(const wc_response *r, bool stream)
{
    if (!stream) {
        json_t *j = json_loads(r->body, 0, NULL);
        assert_non_null(j);
        json_t *u = json_incref(json_object_get(j, "usage"));
        json_decref(j);
        return u;
    }
    char **ev;
    int n = wc_sse_parse(r->body, r->body_len, &ev);
    assert_true(n >= 2);
    json_t *u = NULL;
    for (int i = 0; i < n - 1; i++) {
        json_t *j = json_loads(ev[i], 0, NULL);
        json_t *x = json_object_get(j, "usage");
        if (json_is_object(x)) {
            json_decref(u);
            u = json_incref(x);
        }
        json_decref(j);
    }
    wc_sse_free(ev, n);
    return u;
}

static json_int_t usage_int(const json_t *u, const char *key)
{
    return json_integer_value(json_object_get(u, key));
}

static json_int_t usage_cached(const json_t *u)
{
    json_t *d = json_object_get(u, "prompt_tokens_details");
    assert_true(json_is_object(d));
    return json_integer_value(json_object_get(d, "cached_tokens"));
}

/* One chat request; its tokens, text (sw_free) and usage (decref). */
static int chat(const wc_worker *w, json_t *messages, const char *sampling, bool stream,
                const char *extra, int *tokens, char **text, json_t **usage)
{
    char *msgs = json_dumps(messages, JSON_COMPACT);
    size_t cap = strlen(msgs) + 512;
    char *body = sw_malloc(cap);
    snprintf(body, cap,
             "{\"messages\":%s,\"max_tokens\":12,\"ignore_eos\":true,%s,\"stream\":%s,"
             "\"stream_options\":{\"include_usage\":true}%s}",
             msgs, sampling, stream ? "true" : "false", extra);
    free(msgs);
    wc_response r;
    assert_int_equal(wc_request(w->socket_path, "POST", "/v1/chat/completions", body, 60000, &r),
                     0);
    sw_free(body);
    assert_int_equal(r.status, 200);
    int n = wc_tokens_of(&r, stream, tokens, MAXTOK, text, NULL, 0);
    assert_true(n > 0);
    *usage = usage_of(&r, stream);
    assert_non_null(*usage);
    wc_response_free(&r);
    return n;
}

static void test_multi_turn(void **state)
{
    (void)state;
    static const char *const sampling[] = {"\"temperature\":0",
                                           "\"temperature\":0.9,\"top_p\":0.95,\"seed\":99"};
    char system[4096] = "";
    for (int i = 0; i < 40; i++)
        strcat(system, "You answer briefly and kindly, in plain words. ");
    json_t *messages = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content", system,
                                 "role", "user", "content", "Tell me a story about a lighthouse.");
    json_int_t last_prompt = 0;
    for (int turn = 1; turn <= 4; turn++) {
        char *reply = NULL;
        for (int s = 0; s < 2; s++)
            for (int stream = 0; stream < 2; stream++) {
                int hot[MAXTOK], cold[MAXTOK];
                char *hot_text, *cold_text;
                json_t *hu, *cu;
                long long computed0 = metric(&g_hot, "spillway_worker_prompt_tokens_computed_total");
                int nh = chat(&g_hot, messages, sampling[s], stream, "", hot, &hot_text, &hu);
                long long computed = metric(&g_hot, "spillway_worker_prompt_tokens_computed_total") -
                                     computed0;
                int nc = chat(&g_cold, messages, sampling[s], stream, "", cold, &cold_text, &cu);
                /* the answer of a cold worker */
                assert_int_equal(nh, nc);
                assert_memory_equal(hot, cold, sizeof(int) * (size_t)nh);
                assert_string_equal(hot_text, cold_text);
                json_int_t prompt = usage_int(hu, "prompt_tokens");
                json_int_t cached = usage_cached(hu);
                assert_int_equal(prompt, usage_int(cu, "prompt_tokens"));
                assert_int_equal(usage_cached(cu), 0);
                /* only the new tokens were computed */
                assert_int_equal(computed, prompt - cached);
                if (turn == 1 && s == 0 && stream == 0) {
                    assert_int_equal(cached, 0);
                } else {
                    /* the earlier turns' prompt, whole blocks of it at least */
                    assert_true(cached >= last_prompt / 16 * 16);
                    assert_true(cached > 0 && cached < prompt);
                    assert_int_equal(cached % 16, 0);
                }
                if (s == 0 && stream == 0)
                    reply = hot_text;
                else
                    sw_free(hot_text);
                sw_free(cold_text);
                json_decref(hu);
                json_decref(cu);
            }
        /* cache_prompt: false computes the whole prompt, same answer */
        {
            int hot[MAXTOK], cold[MAXTOK];
            char *t1, *t2;
            json_t *u1, *u2;
            long long c0 = metric(&g_hot, "spillway_worker_prompt_tokens_computed_total");
            int n1 = chat(&g_hot, messages, sampling[0], false, ",\"cache_prompt\":false", hot, &t1,
                          &u1);
            assert_int_equal(metric(&g_hot, "spillway_worker_prompt_tokens_computed_total") - c0,
                             usage_int(u1, "prompt_tokens"));
            assert_int_equal(usage_cached(u1), 0);
            int n2 = chat(&g_cold, messages, sampling[0], false, "", cold, &t2, &u2);
            assert_int_equal(n1, n2);
            assert_memory_equal(hot, cold, sizeof(int) * (size_t)n1);
            last_prompt = usage_int(u1, "prompt_tokens");
            sw_free(t1);
            sw_free(t2);
            json_decref(u1);
            json_decref(u2);
        }
        json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "assistant", "content",
                                                  reply));
        json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "user", "content",
                                                  "What happened next?"));
        sw_free(reply);
    }
    json_decref(messages);
    assert_true(cache_figure(&g_hot, "hits") > 0);
    assert_int_equal(cache_figure(&g_cold, "hits"), 0);
    json_t *h = get_json(&g_cold, "/health");
    assert_true(json_is_false(json_object_get(json_object_get(h, "prefix_cache"), "enabled")));
    json_decref(h);
}

/* A completion body: the common prefix (token ids), then the request's own. */
static char *shared_prefix_body(int which, int n_prefix, bool seeded)
{
    size_t cap = (size_t)n_prefix * 6 + 512;
    char *body = sw_malloc(cap);
    size_t at = (size_t)snprintf(body, cap, "{\"prompt\":[");
    for (int i = 0; i < n_prefix + 24; i++) {
        int id = i < n_prefix ? 3 + (i * 37) % 1000 : 3 + (i * 53 + which * 101) % 1000;
        at += (size_t)snprintf(body + at, cap - at, "%s%d", i ? "," : "", id);
    }
    snprintf(body + at, cap - at,
             "],\"max_tokens\":48,\"ignore_eos\":true,%s,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             seeded ? "\"temperature\":0.8,\"seed\":5" : "\"temperature\":0");
    return body;
}

/* 8 streams at once with a 1,000-token common prefix: once they all run,
 * the prefix's 62 full blocks are shared (held once) and the KV in use is
 * one copy of the prefix beside each sequence's own blocks, and every
 * answer is exact. (Under the reserve policy a request admitted before the
 * blocks it will share exist reserves its own for a moment: it gives them
 * back when it takes the shared ones, at its first prefill chunk.) */
static void test_shared_prefix(void **state)
{
    (void)state;
    enum { N = 8, PREFIX = 1000 };
    json_t *h;
    const long long reused0 = cache_figure(&g_hot, "tokens_reused");
    int fds[N];
    char *bufs[N];
    size_t lens[N], cap = 1 << 20;
    bool open_[N];
    for (int i = 0; i < N; i++) {
        char *body = shared_prefix_body(i, PREFIX, i % 2);
        fds[i] = wc_connect(g_hot.socket_path, 60000);
        assert_true(fds[i] >= 0);
        assert_int_equal(wc_send(fds[i], "POST", "/v1/completions", body), 0);
        sw_free(body);
        bufs[i] = sw_malloc(cap);
        lens[i] = 0;
        open_[i] = true;
    }
    /* the smallest KV in use seen while all 8 ran with the prefix shared */
    long long shared_used = -1;
    int n_open = N;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (n_open > 0) {
        struct pollfd p[N];
        for (int i = 0; i < N; i++)
            p[i] = (struct pollfd){open_[i] ? fds[i] : -1, POLLIN, 0};
        assert_true(poll(p, N, 200) >= 0);
        for (int i = 0; i < N; i++) {
            if (!open_[i] || !p[i].revents)
                continue;
            ssize_t n = read(fds[i], bufs[i] + lens[i], cap - 1 - lens[i]);
            if (n > 0) {
                lens[i] += (size_t)n;
            } else {
                open_[i] = false;
                n_open--;
                close(fds[i]);
            }
        }
        h = get_json(&g_hot, "/health");
        long long shared = json_integer_value(
            json_object_get(json_object_get(h, "prefix_cache"), "blocks_shared"));
        long long used = json_integer_value(
            json_object_get(json_object_get(h, "memory"), "kv_used_bytes"));
        long long active = json_integer_value(
            json_object_get(json_object_get(h, "slots"), "active"));
        json_decref(h);
        if (active == N && shared >= 62 && (shared_used < 0 || used < shared_used))
            shared_used = used;
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        assert_true(t.tv_sec - t0.tv_sec < 300);
    }
    /* the prefix's full blocks (1000 / 16 = 62) held once by all, beside
     * each sequence's own (24 + 48 tokens from token 992: at most 6
     * blocks): at most 62 + 8 x 6 blocks, where 8 private copies of the
     * prompt and the answer would hold 8 x 67 */
    json_t *kv = get_json(&g_hot, "/health");
    json_int_t per_token = json_integer_value(json_object_get(kv, "kv_bytes_per_token"));
    json_decref(kv);
    printf("8 streams sharing the prefix: %lld KV bytes in use (%lld blocks)\n", shared_used,
           shared_used / (16 * (long long)per_token));
    assert_true(shared_used > 0);
    assert_true(shared_used <= (long long)(62 + N * 6) * 16 * per_token);
    /* 7 of the 8 took the prefix from the cache */
    assert_true(cache_figure(&g_hot, "tokens_reused") - reused0 >= 7LL * 992);

    for (int i = 0; i < N; i++) {
        wc_response r;
        int got[MAXTOK], want[MAXTOK];
        bufs[i][lens[i]] = '\0';
        assert_int_equal(wc_response_parse(bufs[i], lens[i], &r), 0);
        assert_int_equal(r.status, 200);
        int n = wc_tokens_of(&r, true, got, MAXTOK, NULL, NULL, 0);
        assert_int_equal(n, 48);
        wc_response_free(&r);
        char *body = shared_prefix_body(i, PREFIX, i % 2);
        assert_int_equal(wc_request(g_cold.socket_path, "POST", "/v1/completions", body, 120000,
                                    &r),
                         0);
        sw_free(body);
        assert_int_equal(r.status, 200);
        assert_int_equal(wc_tokens_of(&r, true, want, MAXTOK, NULL, NULL, 0), 48);
        assert_memory_equal(got, want, sizeof(int) * 48);
        wc_response_free(&r);
        sw_free(bufs[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_turn),
        cmocka_unit_test(test_shared_prefix),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
