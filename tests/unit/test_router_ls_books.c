/* test_router_ls_books.c - end-to-end: the books of a kind = llama-server
 * worker serving a model the engine does not run, through the real router
 * process, the llama-server a scripted peer on a real socket
 * (tests/fake_server.h) with two idle slots of 256 tokens.
 *
 * - a granite file (the test model's tensors under another family's
 *   keys): the router reads its cache shape from the metadata, so the
 *   worker's books have a budget (256 cells of every layer's KV row) and a
 *   request reserves its prompt + max_tokens there; a second request that
 *   would overflow the cache waits for the first although a slot is free;
 * - the same file as a hybrid family (lfm2, with a short-convolution
 *   state): its memory is not counted, and both requests go to the
 *   server's two slots at once.
 */
#include "testutil.h"
#include "router_harness.h"
#include "fake_server.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "gguf/gguf_cache.h"
#include "router/router_books.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define HOLD_MS 1500 /* how long the fake holds each completion */
#define MAX_TOKENS 200

static char g_model[512];
static fs_server g_fake;
static atomic_int g_answered;
static atomic_int g_received; /* completions the peer has begun to hold */

/* The test model's file rewritten as family `arch`: every llama.* key
 * under arch.*, the tensors as they are, plus one u32 key (extra, may be
 * NULL). */
static int rewrite_as(const char *arch, const char *extra, const char *out_path)
{
    eng_gguf *g = NULL;
    sw_error err;
    if (eng_gguf_open(g_model, &g, &err))
        return -1;
    eng_gguf_writer *w = eng_gguf_writer_create();
    int rc = w ? 0 : -1;
    for (int64_t i = 0; !rc && i < eng_gguf_n_kv(g); i++) {
        const char *k = eng_gguf_kv_key(g, i);
        char key[256];
        if (!strcmp(k, "general.architecture")) {
            rc = eng_gguf_writer_set_str(w, k, arch);
            continue;
        }
        if (!strncmp(k, "llama.", 6))
            snprintf(key, sizeof key, "%s.%s", arch, k + 6);
        else
            snprintf(key, sizeof key, "%s", k);
        rc = eng_gguf_writer_copy_kv(w, g, i, key);
    }
    if (!rc && extra) {
        char key[256];
        snprintf(key, sizeof key, "%s.%s", arch, extra);
        rc = eng_gguf_writer_set_u32(w, key, 3);
    }
    for (int64_t i = 0; !rc && i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        rc = eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                        t->size_bytes);
    }
    if (!rc)
        rc = eng_gguf_writer_write(w, out_path, &err);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
    return rc ? -1 : 0;
}

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-ls-books.gguf", 71);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    remove(g_model);
    return 0;
}

static void reply_json(int fd, int status, const char *body)
{
    fs_send_reply(fd, status, "application/json", body, strlen(body));
}

static void fake_answer(fs_server *s, int fd, const char *req, const char *body)
{
    (void)s;
    (void)body;
    char method[8] = "", path[64] = "";
    sscanf(req, "%7s %63s", method, path);
    if (!strcmp(path, "/health")) {
        reply_json(fd, 200, "{\"status\":\"ok\"}");
        return;
    }
    if (!strcmp(path, "/slots")) {
        reply_json(fd, 200, "[{\"id\":0,\"n_ctx\":256,\"is_processing\":false},"
                            "{\"id\":1,\"n_ctx\":256,\"is_processing\":false}]");
        return;
    }
    if (!strcmp(path, "/metrics") || !strcmp(path, "/tokenize") ||
        !strcmp(path, "/apply-template")) {
        reply_json(fd, 404, "{\"error\":{\"code\":404,\"message\":\"not here\"}}");
        return;
    }
    /* a completion: held, then answered whole */
    atomic_fetch_add(&g_received, 1);
    usleep(HOLD_MS * 1000);
    atomic_fetch_add(&g_answered, 1);
    reply_json(fd, 200, "{\"id\":\"c\",\"object\":\"text_completion\",\"model\":\"m\","
                        "\"choices\":[{\"index\":0,\"text\":\" ok\",\"finish_reason\":\"stop\"}],"
                        "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,"
                        "\"total_tokens\":6}}");
}

typedef struct client {
    const rh_router *r;
    pthread_t th;
    int status;
} client;

static void *client_run(void *arg)
{
    client *c = arg;
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":%d}",
             MAX_TOKENS);
    wc_response w;
    c->status = rh_req(c->r, "POST", "/v1/completions", NULL, body, &w) == 0 ? w.status : -1;
    if (c->status >= 0)
        wc_response_free(&w);
    return NULL;
}

/* The ls worker's /health entry once it is ready with its /slots read. */
static json_t *wait_ready(const rh_router *r)
{
    for (int i = 0; i < 300; i++) {
        json_t *h = rh_worker_health(r, "ls");
        json_t *ls = json_object_get(h, "llama_server");
        if (!strcmp(json_string_value(json_object_get(h, "state")) ?: "", "ready") &&
            json_integer_value(json_object_get(ls, "slots")) == 2)
            return h;
        json_decref(h);
        usleep(100 * 1000);
    }
    fail_msg("worker ls never became ready");
    return NULL;
}

/* The router's queue depth now (/v1/spillway/stats), -1 unread. */
static int queue_depth(const rh_router *r)
{
    wc_response w;
    if (rh_req(r, "GET", "/v1/spillway/stats", NULL, NULL, &w))
        return -1;
    json_t *j = rh_body_json(&w);
    int depth = j ? (int)json_integer_value(json_object_get(json_object_get(j, "queue"),
                                                            "depth"))
                  : -1;
    json_decref(j);
    wc_response_free(&w);
    return depth;
}

/* Two requests of prompt + 200 tokens, the second 300 ms after the first.
 * While the first is held by the peer, polled until the second is either
 * admitted beside it (the books' sequences reach 2) or waiting in the
 * queue: how many sequences the books then have on the worker, and the
 * KV bytes reserved. Both end 200. */
static void two_requests(const rh_router *r, int *seqs_during, long long *reserved_during)
{
    atomic_store(&g_answered, 0);
    atomic_store(&g_received, 0);
    client a = {.r = r}, b = {.r = r};
    assert_int_equal(pthread_create(&a.th, NULL, client_run, &a), 0);
    usleep(300 * 1000);
    assert_int_equal(pthread_create(&b.th, NULL, client_run, &b), 0);
    *seqs_during = -1;
    *reserved_during = -1;
    for (int i = 0; i < 400 && atomic_load(&g_answered) == 0; i++) {
        json_t *h = rh_worker_health(r, "ls");
        json_t *books = json_object_get(h, "books");
        int seqs = (int)json_integer_value(json_object_get(books, "seqs"));
        long long reserved = json_integer_value(json_object_get(books, "kv_reserved_bytes"));
        json_decref(h);
        bool held = atomic_load(&g_received) > 0;
        if (held && (seqs == 2 || (seqs == 1 && queue_depth(r) == 1))) {
            *seqs_during = seqs;
            *reserved_during = reserved;
            break;
        }
        usleep(20 * 1000);
    }
    pthread_join(a.th, NULL);
    pthread_join(b.th, NULL);
    assert_int_equal(a.status, 200);
    assert_int_equal(b.status, 200);
    assert_int_equal(atomic_load(&g_answered), 2);
}

static void test_books_from_metadata(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp_path("router-ls-books-granite.gguf"));
    assert_int_equal(rewrite_as("granite", NULL, path), 0);
    fs_start(&g_fake, "ls-books-fake.sock", (size_t)1 << 20, false, fake_answer);
    char workers[1024];
    snprintf(workers, sizeof workers, "[worker ls]\nkind = llama-server\nurl = unix:%s\n",
             g_fake.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "ls-books", path, NULL, workers), 0);

    /* the test model: 2 layers of 2 KV heads of 16, f16 K and V: 256
     * bytes a token; its cache: the slot's 256 cells */
    json_t *h = wait_ready(&r);
    json_t *books = json_object_get(h, "books");
    json_t *rep = json_object_get(h, "reported");
    assert_int_equal(json_integer_value(json_object_get(rep, "kv_block_tokens")), 1);
    assert_int_equal(json_integer_value(json_object_get(rep, "kv_block_device_bytes")), 256);
    assert_int_equal(json_integer_value(json_object_get(books, "kv_budget_bytes")), 256 * 256);
    assert_true(json_is_true(json_object_get(json_object_get(h, "llama_server"), "kv_counted")));
    json_decref(h);

    /* prompt + 200 of 256 cells: the second request does not fit beside
     * the first, whatever the free slot */
    int seqs;
    long long reserved;
    two_requests(&r, &seqs, &reserved);
    assert_int_equal(seqs, 1);
    assert_true(reserved > MAX_TOKENS * 256LL && reserved <= 256 * 256LL);
    h = rh_worker_health(&r, "ls");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(h, "books"),
                                                        "kv_reserved_bytes")),
                     0);
    json_decref(h);
    rh_finish(&r);
    fs_stop(&g_fake);
    remove(path);
}

static void test_hybrid_by_slots(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    char path[512];
    snprintf(path, sizeof path, "%s", tu_tmp_path("router-ls-books-lfm2.gguf"));
    assert_int_equal(rewrite_as("lfm2", "shortconv.l_cache", path), 0);
    fs_start(&g_fake, "ls-books-fake.sock", (size_t)1 << 20, false, fake_answer);
    char workers[1024];
    snprintf(workers, sizeof workers, "[worker ls]\nkind = llama-server\nurl = unix:%s\n",
             g_fake.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "ls-books-hybrid", path, NULL, workers), 0);
    json_t *h = wait_ready(&r);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(h, "books"),
                                                        "kv_budget_bytes")),
                     -1);
    json_t *ls = json_object_get(h, "llama_server");
    assert_false(json_is_true(json_object_get(ls, "kv_counted")));
    assert_non_null(strstr(json_string_value(json_object_get(ls, "kv_not_counted")) ?: "",
                           "lfm2 is hybrid: its recurrent state"));
    json_decref(h);
    /* not counted: both go to its two slots at once */
    int seqs;
    long long reserved;
    two_requests(&r, &seqs, &reserved);
    assert_int_equal(seqs, 2);
    assert_int_equal(reserved, 0);
    rh_finish(&r);
    fs_stop(&g_fake);
    remove(path);
}

/* The memory of a llama-server planned from its command before it
 * starts: a granite-shaped file of 8 layers of 4 KV heads of 96 (12 KiB a
 * token) with -c 8192 -np 2 takes the 96 MiB of KV the real llama-server
 * reports for it; a sliding family's window cells; a hybrid is not
 * planned. */
static void test_plan_before_start(void **state)
{
    (void)state;
    eng_gguf_cache_shape s;
    memset(&s, 0, sizeof s);
    snprintf(s.architecture, sizeof s.architecture, "granite");
    s.n_layer = s.n_layer_kv = 8;
    s.k_elements_global = s.v_elements_global = 8 * 4 * 96;
    s.n_ctx_train = 2048;
    char line[400];
    const char *argv[] = {"llama-server", "-m", "m.gguf", "-c", "8192", "-np", "2", "--port",
                          "1"};
    assert_int_equal(rt_books_llama_server_plan(&s, 64 << 20, argv, 9, line, sizeof line),
                     96LL << 20);
    assert_non_null(strstr(line, "weights 64.0 MiB + KV 96.0 MiB (8192 cells, 2 slots"));
    /* no -c: the trained context; no -np: 4 slots */
    assert_int_equal(rt_books_llama_server_plan(&s, 0, argv, 3, line, sizeof line),
                     2048LL * 12288);
    /* q8_0 for both */
    const char *q8[] = {"llama-server", "--ctx-size", "4096", "-ctk", "q8_0", "-ctv", "q8_0"};
    assert_int_equal(rt_books_llama_server_plan(&s, 0, q8, 7, line, sizeof line),
                     4096LL * 2 * 8 * 4 * 96 / 32 * 34);
    /* gpt-oss's shape (4 global, 4 sliding layers over 128 tokens, 8 x 64
     * heads): 32 + 6 MiB at -c 4096 -np 1, as llama-server reports */
    s.n_layer_kv = 8;
    s.n_layer_sliding = 4;
    s.sliding_window = 128;
    s.k_elements_global = s.v_elements_global = 4 * 8 * 64;
    s.k_elements_sliding = s.v_elements_sliding = 4 * 8 * 64;
    const char *oss[] = {"llama-server", "-c", "4096", "-np", "1"};
    assert_int_equal(rt_books_llama_server_plan(&s, 0, oss, 5, line, sizeof line), 38LL << 20);
    s.kind = ENG_GGUF_CACHE_HYBRID;
    snprintf(s.reason, sizeof s.reason, "lfm2 is hybrid");
    assert_int_equal(rt_books_llama_server_plan(&s, 0, oss, 5, line, sizeof line), 0);
    assert_non_null(strstr(line, "KV not planned (lfm2 is hybrid)"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_books_from_metadata),
        cmocka_unit_test(test_hybrid_by_slots),
        cmocka_unit_test(test_plan_before_start),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
