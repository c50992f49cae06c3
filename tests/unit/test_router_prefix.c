/* test_router_prefix.c - end-to-end: the router places a request on the
 * worker whose prefix cache likely holds its prompt's start
 * (router_prefix.h). Two equal CPU workers of the same preference (one
 * sequence each) behind a real `spillway serve`: three conversations start
 * at once, so both workers get some; then they grow over three more turns,
 * one request at a time - which preference order alone would all send to
 * the first worker - and each stays on the worker that served its first
 * turn, which
 * takes the earlier turns from its cache
 * (usage.prompt_tokens_details.cached_tokens through the router, in the
 * stream's usage too). */
#include "testutil.h"
#include "bin_testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        return 0;
    return rh_make_model(g_model, sizeof g_model, "router-prefix.gguf", 29);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    wc_worker_kill_all();
    if (g_model[0])
        remove(g_model);
    return 0;
}

/* One chat turn through the router: the worker that answered (from
 * X-Spillway-Worker), the reply's text (sw_free) and cached_tokens. */
static void turn(const rh_router *r, json_t *messages, bool stream, char *worker, size_t cap,
                 char **reply, long long *cached)
{
    char *msgs = json_dumps(messages, JSON_COMPACT);
    size_t n = strlen(msgs) + 256;
    char *body = sw_malloc(n);
    snprintf(body, n,
             "{\"messages\":%s,\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true,"
             "\"stream\":%s,\"stream_options\":{\"include_usage\":true}}",
             msgs, stream ? "true" : "false");
    free(msgs);
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/chat/completions", NULL, body, &w), 0);
    sw_free(body);
    assert_int_equal(w.status, 200);
    assert_true(wc_header(&w, "X-Spillway-Worker", worker, cap));
    int ids[64];
    assert_true(wc_tokens_of(&w, stream, ids, 64, reply, NULL, 0) > 0);
    *cached = -1;
    if (!stream) {
        json_t *j = rh_body_json(&w);
        *cached = json_integer_value(json_object_get(
            json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"),
            "cached_tokens"));
        json_decref(j);
    } else {
        char **ev;
        int ne = wc_sse_parse(w.body, w.body_len, &ev);
        assert_true(ne > 1);
        for (int i = 0; i < ne - 1; i++) {
            json_t *j = json_loads(ev[i], 0, NULL);
            json_t *u = json_object_get(j, "usage");
            if (json_is_object(u))
                *cached = json_integer_value(
                    json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
            json_decref(j);
        }
        wc_sse_free(ev, ne);
    }
    wc_response_free(&w);
}

typedef struct first_turn {
    const rh_router *r;
    json_t *messages;
    char worker[64];
    char *reply;
    long long cached;
} first_turn;

static void *first_turn_run(void *arg)
{
    first_turn *f = arg;
    turn(f->r, f->messages, false, f->worker, sizeof f->worker, &f->reply, &f->cached);
    return NULL;
}

static void test_conversations_stay(void **state)
{
    (void)state;
    if (!btu_spillway_bin_or_skip())
        return;
    rh_router r;
    assert_int_equal(rh_start(&r, "prefix", g_model, NULL,
                              "[worker a]\nthreads = 1\nctx-limit = 1024\nmax-seqs = 1\npreference = 1\n"
                              "[worker b]\nthreads = 1\nctx-limit = 1024\nmax-seqs = 1\npreference = 1\n"),
                     0);
    enum { CONV = 3, TURNS = 4 };
    json_t *conv[CONV];
    char home[CONV][64];
    for (int c = 0; c < CONV; c++) {
        char sys[1024] = "";
        for (int i = 0; i < 12; i++) {
            char part[64];
            snprintf(part, sizeof part, "Conversation %d has its own rules, number %d. ", c, i);
            strcat(sys, part);
        }
        conv[c] = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content", sys, "role",
                            "user", "content", "Begin the story.");
    }
    /* the first turns at once: the two workers share them */
    first_turn ft[CONV];
    pthread_t th[CONV];
    for (int c = 0; c < CONV; c++) {
        ft[c] = (first_turn){.r = &r, .messages = conv[c]};
        assert_int_equal(pthread_create(&th[c], NULL, first_turn_run, &ft[c]), 0);
    }
    int on_a = 0;
    for (int c = 0; c < CONV; c++) {
        pthread_join(th[c], NULL);
        snprintf(home[c], sizeof home[c], "%s", ft[c].worker);
        on_a += !strcmp(home[c], "a");
        json_array_append_new(conv[c],
                              json_pack("{s:s, s:s}", "role", "assistant", "content", ft[c].reply));
        json_array_append_new(conv[c],
                              json_pack("{s:s, s:s}", "role", "user", "content", "Go on, please."));
        sw_free(ft[c].reply);
    }
    printf("first turns: %d on a, %d on b\n", on_a, CONV - on_a);
    assert_true(on_a > 0 && on_a < CONV);
    for (int t = 1; t < TURNS; t++)
        for (int c = 0; c < CONV; c++) {
            char worker[64], *reply = NULL;
            long long cached = -1;
            turn(&r, conv[c], (t + c) % 2, worker, sizeof worker, &reply, &cached);
            if (strcmp(worker, home[c]))
                fail_msg("conversation %d turn %d went to %s, its first turn to %s", c, t, worker,
                         home[c]);
            /* its earlier turns, whole blocks of them, from the cache */
            assert_true(cached >= 16);
            json_array_append_new(conv[c],
                                  json_pack("{s:s, s:s}", "role", "assistant", "content", reply));
            json_array_append_new(conv[c], json_pack("{s:s, s:s}", "role", "user", "content",
                                                     "Go on, please."));
            sw_free(reply);
        }
    for (int c = 0; c < CONV; c++)
        json_decref(conv[c]);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversations_stay),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
