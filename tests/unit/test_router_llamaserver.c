/* test_router_llamaserver.c - end-to-end: a kind = llama-server worker
 * (docs/engines.md) through the real router process, the llama-server
 * being a scripted peer on a real socket (tests/fake_server.h) that speaks
 * the native shapes of llama.cpp's tools/server/README.md, beside a real
 * spillway CPU worker of the same model.
 *
 * - its /health, /slots and /metrics become the router's figures (a slot
 *   busy with another client's request is not counted on), and its
 *   /tokenize, which gives the model's ids, makes it resumable;
 * - a completion stream goes to POST /completion; after k tokens the peer
 *   dies: the client's one stream has the k tokens, then the CPU worker's
 *   continuation from them, which is exactly what that worker gives when
 *   asked directly to resume from those k tokens;
 * - a chat stream the same way, its messages rendered by /apply-template,
 *   the role said once;
 * - "Context size has been exceeded." mid-stream is an out-of-memory, and
 *   resumed too;
 * - a token that came without its id (tokens_predicted ahead of the ids):
 *   the stream cannot be resumed and ends with an error event;
 * - exceed_context_size_error: the CPU worker answers instead;
 * - a /tokenize with other ids: not resumable; its streams take the OpenAI
 *   endpoint, and a death after text ends the stream with an error event;
 * - two llama-servers as the only workers, the first dying after k tokens:
 *   a greedy stream (completion and chat) is resumed on the second through
 *   its /completion with a token prompt (the prompt's text, then the k
 *   ids), and the client's one stream is the scripted greedy answer,
 *   token for token; a stream under a grammar the sent text leaves, a
 *   sampled and a stop-string stream are not (no spillway worker is
 *   left): each ends with an error event, and the failover event gives
 *   the replay table's reason;
 * - a greedy stream under a `grammar` (cut inside and between words, a
 *   completion and a chat) and under a response_format json_schema (cut
 *   inside a string and between members) is resumed on the second with
 *   the token prompt and the grammar advanced over the sent text, which
 *   is checked by its meaning (it accepts exactly the rests the original
 *   accepts after the text); the first was sent the schema as spillway's
 *   GBNF form of it; a schema with no such form (a multiple) takes the
 *   OpenAI endpoint instead, where a death after text ends the stream;
 * - with a spillway worker after the two, a grammar too ambiguous to be
 *   advanced here and a sampled stream pass the second llama-server by
 *   and are resumed on the spillway worker.
 */
#include "testutil.h"
#include "router_harness.h"
#include "fake_server.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define K 4 /* tokens the fake llama-server sends before it dies */

enum { MODE_KILL, MODE_OOM, MODE_GAP, MODE_CTX };

static char g_model[512];
static eng_gguf *g_gguf;
static eng_tokenizer *g_tok;
static int32_t g_ids[K];
static char g_piece[K][64];
static fs_server g_fake;
static atomic_int g_mode;
/* tokens of g_seq the dying server sends (K unless a test says) */
static atomic_int g_cut = K;
static atomic_bool g_bad_vocab;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_last_path[64];
static char g_last_body[1 << 16];
static char g_first_body[1 << 16]; /* the last /completion body of a server that dies */
static char g_last_template[8192];
/* the greedy answer of the scripted model: g_ids then more ids (N_SEQ in
 * all); the server that answers it in full (NULL: every server dies after
 * K), its /completion requests and the last one's body */
#define N_SEQ 64
static int32_t g_seq[N_SEQ];
static char g_seq_piece[N_SEQ][64];
static int g_n_seq; /* tokens of the answer scripted now */
static fs_server g_fake_b;
static fs_server *g_survivor;
static atomic_int g_survivor_completions;
static char g_survivor_body[1 << 16];

/* The scripted greedy answer: the ids of first (at least k of them) then
 * those of rest, at most N_SEQ. */
static int set_script(const char *first, size_t k, const char *rest)
{
    int32_t *ids = NULL;
    size_t n = 0;
    g_n_seq = 0;
    if (eng_tokenize(g_tok, first, strlen(first), false, false, &ids, &n, NULL) || n < k)
        return -1;
    /* the space an SPM vocabulary puts before a text, when the text has
     * none (a JSON answer begins with its brace) */
    char p0[8] = "";
    size_t skip = 0;
    if (n > 0 && first[0] != ' ' &&
        eng_token_to_bytes(g_tok, ids[0], p0, sizeof p0 - 1) == 1 && p0[0] == ' ')
        skip = 1;
    for (size_t i = skip; i < (rest ? k : n) && g_n_seq < N_SEQ; i++)
        g_seq[g_n_seq++] = ids[i];
    sw_free(ids);
    ids = NULL;
    if (rest) {
        if (eng_tokenize(g_tok, rest, strlen(rest), false, false, &ids, &n, NULL))
            return -1;
        for (size_t i = 0; i < n && g_n_seq < N_SEQ; i++)
            g_seq[g_n_seq++] = ids[i];
        sw_free(ids);
    }
    for (int i = 0; i < g_n_seq; i++) {
        size_t len = eng_token_to_bytes(g_tok, g_seq[i], g_seq_piece[i],
                                        sizeof g_seq_piece[i] - 1);
        g_seq_piece[i][len < sizeof g_seq_piece[i] ? len : sizeof g_seq_piece[i] - 1] = 0;
    }
    return g_n_seq >= 12 ? 0 : -1;
}

/* The answer most cases script: the K ids the dying server sends, then
 * more. */
static int default_script(void)
{
    return set_script(" there was a little dog", K,
                      " and a cat who lived in a small house by the sea");
}

static int setup(void **state)
{
    (void)state;
    if (rh_make_model(g_model, sizeof g_model, "router-llamaserver.gguf", 67))
        return -1;
    if (eng_gguf_open(g_model, &g_gguf, NULL) || eng_tokenizer_load(g_gguf, &g_tok, NULL))
        return -1;
    /* the k tokens the fake generates: ids of the model's vocabulary */
    int32_t *ids = NULL;
    size_t n = 0;
    if (eng_tokenize(g_tok, " there was a little dog", 23, false, false, &ids, &n, NULL) || n < K)
        return -1;
    for (int i = 0; i < K; i++) {
        g_ids[i] = ids[i];
        size_t len = eng_token_to_bytes(g_tok, ids[i], g_piece[i], sizeof g_piece[i] - 1);
        g_piece[i][len < sizeof g_piece[i] ? len : sizeof g_piece[i] - 1] = 0;
    }
    sw_free(ids);
    return default_script();
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    eng_tokenizer_free(g_tok);
    eng_gguf_close(g_gguf);
    remove(g_model);
    return 0;
}

static void reply_json(int fd, int status, const char *body)
{
    fs_send_reply(fd, status, "application/json", body, strlen(body));
}

static void send_event(int fd, const char *payload)
{
    char ev[2048];
    int n = snprintf(ev, sizeof ev, "data: %s\n\n", payload);
    fs_send_all(fd, ev, (size_t)n);
}

/* The native stream: k events with their ids, then the end the mode says. */
static void native_stream(int fd)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Connection: close\r\n\r\n";
    fs_send_all(fd, head, sizeof head - 1);
    int mode = atomic_load(&g_mode);
    int cut = atomic_load(&g_cut);
    for (int i = 0; i < cut; i++) {
        json_t *e = json_pack("{s:i, s:s, s:[i], s:b, s:i, s:i, s:i}", "index", 0, "content",
                              g_seq_piece[i], "tokens", (int)g_seq[i], "stop", 0, "id_slot", 0,
                              "tokens_predicted", i + 1 + (mode == MODE_GAP && i >= 2),
                              "tokens_evaluated", 5);
        char *s = json_dumps(e, JSON_COMPACT);
        send_event(fd, s);
        free(s);
        json_decref(e);
        usleep(20 * 1000);
    }
    if (mode == MODE_OOM)
        send_event(fd, "{\"error\":{\"code\":500,\"message\":\"Context size has been exceeded.\","
                       "\"type\":\"server_error\"}}");
    /* then it dies: the connection ends without the final event */
}

/* The surviving server's /completion: the scripted greedy answer from
 * where the prompt leaves it. A string prompt starts at the first token; a
 * token prompt [text, ids...] (a resume) must be the text the first
 * server had and a start of the answer, which it continues. n_predict
 * tokens, then the final event (stop_type limit). */
static void greedy_stream(int fd, const char *body)
{
    atomic_fetch_add(&g_survivor_completions, 1);
    pthread_mutex_lock(&g_mu);
    snprintf(g_survivor_body, sizeof g_survivor_body, "%s", body);
    pthread_mutex_unlock(&g_mu);
    json_t *b = json_loads(body, 0, NULL);
    json_t *prompt = json_object_get(b, "prompt");
    json_int_t n_predict = json_integer_value(json_object_get(b, "n_predict"));
    size_t start = 0;
    bool ok = json_is_string(prompt);
    if (json_is_array(prompt)) {
        ok = json_is_string(json_array_get(prompt, 0)) &&
             json_array_size(prompt) - 1 <= (size_t)g_n_seq;
        for (size_t i = 1; ok && i < json_array_size(prompt); i++)
            ok = json_integer_value(json_array_get(prompt, i)) == g_seq[i - 1];
        start = json_array_size(prompt) - 1;
    }
    if (!ok || n_predict <= 0 || start + (size_t)n_predict > (size_t)g_n_seq) {
        json_decref(b);
        reply_json(fd, 400, "{\"error\":{\"code\":400,\"message\":\"not the scripted prompt\","
                            "\"type\":\"invalid_request_error\"}}");
        return;
    }
    json_decref(b);
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Connection: close\r\n\r\n";
    fs_send_all(fd, head, sizeof head - 1);
    for (json_int_t i = 0; i < n_predict; i++) {
        json_t *e = json_pack("{s:i, s:s, s:[i], s:b, s:i, s:I, s:i}", "index", 0, "content",
                              g_seq_piece[start + (size_t)i], "tokens",
                              (int)g_seq[start + (size_t)i], "stop", 0, "id_slot", 0,
                              "tokens_predicted", i + 1, "tokens_evaluated", 5);
        char *out = json_dumps(e, JSON_COMPACT);
        send_event(fd, out);
        free(out);
        json_decref(e);
    }
    json_t *e = json_pack("{s:i, s:s, s:[], s:b, s:s, s:I, s:i}", "index", 0, "content", "",
                          "tokens", "stop", 1, "stop_type", "limit", "tokens_predicted",
                          n_predict, "tokens_evaluated", 5 + (int)start);
    char *out = json_dumps(e, JSON_COMPACT);
    send_event(fd, out);
    free(out);
    json_decref(e);
}

/* The OpenAI endpoint's stream (the path a request takes when the
 * vocabulary differs): k chunks of text, then it dies. */
static void openai_stream(int fd)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Connection: close\r\n\r\n";
    fs_send_all(fd, head, sizeof head - 1);
    for (int i = 0; i < K; i++) {
        json_t *e = json_pack("{s:s, s:[{s:s, s:i, s:n, s:n}]}", "object", "text_completion",
                              "choices", "text", g_piece[i], "index", 0, "logprobs",
                              "finish_reason");
        char *s = json_dumps(e, JSON_COMPACT);
        send_event(fd, s);
        free(s);
        json_decref(e);
        usleep(20 * 1000);
    }
}

static void fake_answer(fs_server *s, int fd, const char *req, const char *body)
{
    char method[8] = "", path[64] = "";
    sscanf(req, "%7s %63s", method, path);
    if (!strcmp(path, "/health")) {
        reply_json(fd, 200, "{\"status\":\"ok\"}");
        return;
    }
    if (!strcmp(path, "/slots")) {
        reply_json(fd, 200, "[{\"id\":0,\"n_ctx\":256,\"is_processing\":false},"
                            "{\"id\":1,\"n_ctx\":256,\"is_processing\":true}]");
        return;
    }
    if (!strcmp(path, "/metrics")) {
        static const char m[] = "# HELP llamacpp:prompt_tokens_seconds Average prompt throughput\n"
                                "llamacpp:prompt_tokens_seconds 480.5\n"
                                "llamacpp:predicted_tokens_seconds 52.25\n";
        fs_send_reply(fd, 200, "text/plain; version=0.0.4", m, sizeof m - 1);
        return;
    }
    if (!strcmp(path, "/tokenize")) {
        json_t *b = json_loads(body, 0, NULL);
        const char *text = json_string_value(json_object_get(b, "content"));
        int32_t *ids = NULL;
        size_t n = 0;
        json_t *arr = json_array();
        if (text && eng_tokenize(g_tok, text, strlen(text), false, false, &ids, &n, NULL) == 0)
            for (size_t i = 0; i < n; i++)
                json_array_append_new(arr, json_integer(ids[i] + atomic_load(&g_bad_vocab)));
        sw_free(ids);
        json_t *o = json_pack("{s:o}", "tokens", arr);
        char *out = json_dumps(o, JSON_COMPACT);
        reply_json(fd, 200, out);
        free(out);
        json_decref(o);
        json_decref(b);
        return;
    }
    if (!strcmp(path, "/apply-template")) {
        pthread_mutex_lock(&g_mu);
        snprintf(g_last_template, sizeof g_last_template, "%s", body);
        pthread_mutex_unlock(&g_mu);
        reply_json(fd, 200, "{\"prompt\":\"<|user|>\\nHi<|assistant|>\\n\"}");
        return;
    }
    pthread_mutex_lock(&g_mu);
    snprintf(g_last_path, sizeof g_last_path, "%s", path);
    snprintf(g_last_body, sizeof g_last_body, "%s", body);
    pthread_mutex_unlock(&g_mu);
    if (atomic_load(&g_mode) == MODE_CTX) {
        reply_json(fd, 400, "{\"error\":{\"code\":400,\"message\":\"request (300 tokens) exceeds "
                            "the available context size (256 tokens), try increasing it\","
                            "\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":300,"
                            "\"n_ctx\":256}}");
        return;
    }
    if (!strcmp(path, "/completion") && s == g_survivor)
        greedy_stream(fd, body);
    else if (!strcmp(path, "/completion")) {
        pthread_mutex_lock(&g_mu);
        snprintf(g_first_body, sizeof g_first_body, "%s", body);
        pthread_mutex_unlock(&g_mu);
        native_stream(fd);
    }
    else
        openai_stream(fd);
}

/* Waits until worker name's llama_server.vocab_checked, and is ready. */
static json_t *wait_checked(const rh_router *r, const char *name)
{
    for (int i = 0; i < 300; i++) {
        json_t *h = rh_worker_health(r, name);
        json_t *ls = json_object_get(h, "llama_server");
        if (json_is_true(json_object_get(ls, "vocab_checked")) &&
            !strcmp(json_string_value(json_object_get(h, "state")) ?: "", "ready"))
            return h;
        json_decref(h);
        usleep(100 * 1000);
    }
    fail_msg("worker %s: its vocabulary was never checked", name);
    return NULL;
}

/* A stream through the router, asserted 200 and ending with [DONE]: the
 * token ids its chunks carried, its text, how many chunks said the role,
 * the worker header, an error event's code, usage.completion_tokens. */
typedef struct streamed {
    int32_t ids[64];
    int n_ids;
    char text[4096];
    int roles;             /* chunks with delta.role */
    char worker[64];
    char error_code[64];   /* of an error event, "" none */
    json_int_t usage_completion; /* -1 none */
    json_int_t usage_prompt;     /* -1 none */
} streamed;

static void stream_via(const rh_router *r, const char *path, const char *body, bool chat,
                       streamed *out)
{
    memset(out, 0, sizeof *out);
    out->usage_completion = -1;
    out->usage_prompt = -1;
    wc_response w;
    assert_int_equal(rh_req(r, "POST", path, NULL, body, &w), 0);
    assert_int_equal(w.status, 200);
    assert_true(wc_header(&w, "X-Spillway-Worker", out->worker, sizeof out->worker));
    char **ev = NULL;
    int n = wc_sse_parse(w.body, w.body_len, &ev);
    assert_true(n > 0);
    assert_string_equal(ev[n - 1], "[DONE]");
    for (int i = 0; i < n - 1; i++) {
        json_t *j = json_loads(ev[i], 0, NULL);
        assert_non_null(j);
        json_t *err = json_object_get(j, "error");
        if (err)
            snprintf(out->error_code, sizeof out->error_code, "%s",
                     json_string_value(json_object_get(err, "code")) ?: "?");
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *text = chat ? json_object_get(json_object_get(ch, "delta"), "content")
                            : json_object_get(ch, "text");
        if (json_is_string(text))
            strncat(out->text, json_string_value(text), sizeof out->text - strlen(out->text) - 1);
        if (chat && json_object_get(json_object_get(ch, "delta"), "role"))
            out->roles++;
        json_t *ids = json_object_get(json_object_get(j, "spillway"), "token_ids");
        for (size_t k = 0; k < json_array_size(ids) && out->n_ids < 64; k++)
            out->ids[out->n_ids++] = (int32_t)json_integer_value(json_array_get(ids, k));
        json_t *u = json_object_get(j, "usage");
        if (json_is_object(u)) {
            out->usage_completion = json_integer_value(json_object_get(u, "completion_tokens"));
            out->usage_prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
        }
        json_decref(j);
    }
    wc_sse_free(ev, n);
    wc_response_free(&w);
}

/* The last failover event of the router: its decision, the first error's
 * kind and worker, the worker that finished it. */
static void last_failover(const rh_router *r, char *decision, char *kind, char *first_worker,
                          char *final_worker)
{
    json_t *evs = rh_events(r);
    json_t *last = NULL;
    for (size_t i = 0; i < json_array_size(evs); i++)
        if (json_object_get(json_array_get(evs, i), "first_error"))
            last = json_array_get(evs, i);
    assert_non_null(last);
    json_t *fe = json_object_get(last, "first_error");
    snprintf(decision, 64, "%s", json_string_value(json_object_get(last, "decision")) ?: "");
    snprintf(kind, 64, "%s", json_string_value(json_object_get(fe, "kind")) ?: "");
    snprintf(first_worker, 64, "%s", json_string_value(json_object_get(fe, "worker")) ?: "");
    snprintf(final_worker, 64, "%s",
             json_string_value(json_object_get(last, "replay_worker")) ?: "");
    json_decref(evs);
}

static void assert_first_k(const streamed *s)
{
    assert_true(s->n_ids >= K);
    for (int i = 0; i < K; i++)
        assert_int_equal(s->ids[i], g_ids[i]);
    char pieces[512] = "";
    for (int i = 0; i < K; i++)
        strncat(pieces, g_piece[i], sizeof pieces - strlen(pieces) - 1);
    /* the text the client got begins with the pieces the fake sent,
     * relayed as they were */
    assert_memory_equal(s->text, pieces, strlen(pieces));
}

static void router_config(char *out, size_t cap)
{
    snprintf(out, cap,
             "[worker ls]\nkind = llama-server\nurl = unix:%s\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 256\nmax-seqs = 4\ncalibrate = false\n",
             g_fake.path);
}

static void test_resume_from_llama_server(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    atomic_store(&g_bad_vocab, false);
    atomic_store(&g_mode, MODE_KILL);
    fs_start(&g_fake, "llamaserver-fake.sock", (size_t)1 << 20, false, fake_answer);
    char workers[1024];
    router_config(workers, sizeof workers);
    rh_router r;
    assert_int_equal(rh_start(&r, "llamaserver", g_model, NULL, workers), 0);
    rh_wait_restarted(&r, "cpu", 0);

    /* its /slots, /metrics and /tokenize in the router's /health */
    json_t *h = wait_checked(&r, "ls");
    json_t *ls = json_object_get(h, "llama_server");
    assert_string_equal(json_string_value(json_object_get(h, "kind")), "llama-server");
    assert_true(json_is_true(json_object_get(ls, "resumable")));
    assert_int_equal(json_integer_value(json_object_get(ls, "slots")), 2);
    assert_int_equal(json_integer_value(json_object_get(ls, "slots_busy")), 1);
    assert_int_equal(json_integer_value(json_object_get(h, "ctx_limit")), 256);
    assert_true(json_real_value(json_object_get(h, "decode_tokens_per_second")) == 52.25);
    assert_true(json_real_value(json_object_get(h, "prefill_tokens_per_second")) == 480.5);
    assert_string_equal(json_string_value(json_object_get(h, "rates_source")), "measured");
    /* one of its two slots busy with another client's request: the
     * router counts on the other only */
    assert_int_equal(json_integer_value(json_object_get(ls, "slots_foreign")), 1);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(h, "books"), "max_seqs")),
                     1);
    json_decref(h);

    /* a completion stream: killed after k tokens, resumed on cpu */
    streamed s;
    stream_via(&r, "/v1/completions",
               "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,"
               "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
               false, &s);
    assert_string_equal(s.worker, "ls");
    assert_string_equal(s.error_code, "");
    assert_first_k(&s);
    assert_int_equal(s.n_ids, 12);
    assert_int_equal(s.usage_completion, 12);
    pthread_mutex_lock(&g_mu);
    assert_string_equal(g_last_path, "/completion");
    json_t *nb = json_loads(g_last_body, 0, NULL);
    pthread_mutex_unlock(&g_mu);
    assert_non_null(nb);
    assert_string_equal(json_string_value(json_object_get(nb, "prompt")), "Once upon a time");
    assert_int_equal(json_integer_value(json_object_get(nb, "n_predict")), 12);
    assert_true(json_is_true(json_object_get(nb, "stream")));
    assert_true(json_is_true(json_object_get(nb, "return_tokens")));
    assert_true(json_is_integer(json_object_get(nb, "seed")));
    assert_null(json_object_get(nb, "stream_options"));
    assert_null(json_object_get(nb, "max_tokens"));
    json_decref(nb);
    char decision[64], kind[64], first[64], final[64];
    last_failover(&r, decision, kind, first, final);
    assert_string_equal(decision, "resume");
    assert_string_equal(kind, "worker_crash");
    assert_string_equal(first, "ls");
    assert_string_equal(final, "cpu");

    /* the rest is the CPU worker's own continuation from those k tokens */
    char sock[700], direct[1024];
    rh_worker_sock(&r, "cpu", sock, sizeof sock);
    snprintf(direct, sizeof direct,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":%d,\"temperature\":0,"
             "\"stream\":true,\"resume\":{\"tokens\":[%d,%d,%d,%d]}}",
             12 - K, g_ids[0], g_ids[1], g_ids[2], g_ids[3]);
    wc_response w;
    assert_int_equal(wc_request(sock, "POST", "/v1/completions", direct, 30000, &w), 0);
    assert_int_equal(w.status, 200);
    int want[64];
    int n_want = wc_tokens_of(&w, true, want, 64, NULL, NULL, 0);
    wc_response_free(&w);
    assert_int_equal(n_want, 12 - K);
    for (int i = 0; i < n_want; i++)
        assert_int_equal(s.ids[K + i], want[i]);

    /* a chat stream: /apply-template, then the same */
    rh_wait_restarted(&r, "ls", 0);
    stream_via(&r, "/v1/chat/completions",
               "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":10,"
               "\"temperature\":0,\"stream\":true}",
               true, &s);
    assert_string_equal(s.worker, "ls");
    assert_string_equal(s.error_code, "");
    assert_first_k(&s);
    assert_int_equal(s.n_ids, 10);
    assert_int_equal(s.roles, 1);
    pthread_mutex_lock(&g_mu);
    assert_non_null(strstr(g_last_template, "\"messages\""));
    assert_non_null(strstr(g_last_body, "<|user|>"));
    pthread_mutex_unlock(&g_mu);
    last_failover(&r, decision, kind, first, final);
    assert_string_equal(decision, "resume");
    assert_string_equal(final, "cpu");

    /* "Context size has been exceeded." mid-stream: out of memory, resumed */
    rh_wait_restarted(&r, "ls", 0);
    atomic_store(&g_mode, MODE_OOM);
    stream_via(&r, "/v1/completions",
               "{\"prompt\":\"Once upon a time\",\"max_tokens\":9,\"temperature\":0,"
               "\"stream\":true}",
               false, &s);
    assert_string_equal(s.error_code, "");
    assert_first_k(&s);
    assert_int_equal(s.n_ids, 9);
    last_failover(&r, decision, kind, first, final);
    assert_string_equal(decision, "resume");
    assert_string_equal(kind, "oom");

    /* a token without its id: no resume, the stream ends with an error */
    rh_wait_restarted(&r, "ls", 0);
    atomic_store(&g_mode, MODE_GAP);
    stream_via(&r, "/v1/completions",
               "{\"prompt\":\"Once upon a time\",\"max_tokens\":9,\"temperature\":0,"
               "\"stream\":true}",
               false, &s);
    assert_string_equal(s.error_code, "worker_failed");
    assert_int_equal(s.n_ids, 2); /* the ids before the gap */
    last_failover(&r, decision, kind, first, final);
    assert_string_equal(decision, "none (external engine: no resume)");

    /* exceed_context_size_error: the CPU worker answers */
    rh_wait_restarted(&r, "ls", 0);
    atomic_store(&g_mode, MODE_CTX);
    assert_int_equal(rh_req(&r, "POST", "/v1/completions", NULL,
                            "{\"prompt\":\"Once upon a time\",\"max_tokens\":3}", &w), 0);
    assert_int_equal(w.status, 200);
    rh_assert_header(&w, "X-Spillway-Worker", "cpu");
    rh_assert_header(&w, "X-Spillway-Attempts", "1");
    wc_response_free(&w);
    pthread_mutex_lock(&g_mu);
    assert_string_equal(g_last_path, "/v1/completions"); /* non-stream: the OpenAI endpoint */
    pthread_mutex_unlock(&g_mu);

    rh_finish(&r);
    fs_stop(&g_fake);
}

/* The last failover event (json_decref). */
static json_t *last_failover_event(const rh_router *r)
{
    json_t *evs = rh_events(r);
    json_t *last = NULL;
    for (size_t i = 0; i < json_array_size(evs); i++)
        if (json_object_get(json_array_get(evs, i), "first_error"))
            last = json_array_get(evs, i);
    assert_non_null(last);
    json_incref(last);
    json_decref(evs);
    return last;
}

/* A stream on ls1 that dies after K tokens, which the replay table keeps
 * off llama-server: it ends with worker_failed, the survivor never gets
 * it, and the failover event says why (a phrase of its reason). */
static void assert_not_resumed(const rh_router *r, const char *body, const char *reason_has)
{
    rh_wait_restarted(r, "ls1", 0);
    int before = atomic_load(&g_survivor_completions);
    streamed s;
    stream_via(r, "/v1/completions", body, false, &s);
    assert_string_equal(s.worker, "ls1");
    assert_string_equal(s.error_code, "worker_failed");
    assert_int_equal(s.n_ids, K);
    assert_int_equal(atomic_load(&g_survivor_completions), before);
    json_t *ev = last_failover_event(r);
    assert_string_equal(json_string_value(json_object_get(ev, "decision")),
                        "none (llama-server cannot continue it)");
    assert_string_equal(json_string_value(json_object_get(ev, "outcome")), "failed");
    const char *reason = json_string_value(json_object_get(ev, "reason"));
    assert_non_null(reason);
    if (!strstr(reason, reason_has))
        fail_msg("reason \"%s\" lacks \"%s\"", reason, reason_has);
    json_decref(ev);
}

static void test_resume_on_llama_server(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    atomic_store(&g_bad_vocab, false);
    atomic_store(&g_mode, MODE_KILL);
    atomic_store(&g_survivor_completions, 0);
    fs_start(&g_fake, "llamaserver-first.sock", (size_t)1 << 20, false, fake_answer);
    fs_start(&g_fake_b, "llamaserver-second.sock", (size_t)1 << 20, false, fake_answer);
    g_survivor = &g_fake_b;
    char workers[2048];
    snprintf(workers, sizeof workers,
             "[worker ls1]\nkind = llama-server\nurl = unix:%s\n"
             "[worker ls2]\nkind = llama-server\nurl = unix:%s\n",
             g_fake.path, g_fake_b.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "llamaserver-two", g_model, NULL, workers), 0);
    json_decref(wait_checked(&r, "ls1"));
    json_decref(wait_checked(&r, "ls2"));

    /* greedy completion: ls1 dies after K, ls2 continues from the token
     * prompt; the client's one stream is the whole greedy answer */
    streamed s;
    stream_via(&r, "/v1/completions",
               "{\"prompt\":\"Once upon a time\",\"max_tokens\":10,\"temperature\":0,"
               "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
               false, &s);
    assert_string_equal(s.worker, "ls1");
    assert_string_equal(s.error_code, "");
    assert_int_equal(s.n_ids, 10);
    char want[1024] = "";
    for (int i = 0; i < 10; i++) {
        assert_int_equal(s.ids[i], g_seq[i]);
        strncat(want, g_seq_piece[i], sizeof want - strlen(want) - 1);
    }
    assert_string_equal(s.text, want);
    assert_int_equal(s.usage_completion, 10);
    assert_int_equal(s.usage_prompt, 5); /* the prompt's, not the resume's token prompt */
    assert_int_equal(atomic_load(&g_survivor_completions), 1);
    /* what ls2 was asked: the prompt's text, then the K ids; the rest */
    pthread_mutex_lock(&g_mu);
    json_t *nb = json_loads(g_survivor_body, 0, NULL);
    pthread_mutex_unlock(&g_mu);
    json_t *prompt = json_object_get(nb, "prompt");
    assert_int_equal(json_array_size(prompt), 1 + K);
    assert_string_equal(json_string_value(json_array_get(prompt, 0)), "Once upon a time");
    assert_int_equal(json_integer_value(json_object_get(nb, "n_predict")), 10 - K);
    assert_null(json_object_get(nb, "resume"));
    json_decref(nb);
    json_t *ev = last_failover_event(&r);
    json_t *fe = json_object_get(ev, "first_error");
    assert_string_equal(json_string_value(json_object_get(ev, "decision")), "resume");
    assert_string_equal(json_string_value(json_object_get(ev, "outcome")), "completed");
    assert_string_equal(json_string_value(json_object_get(fe, "worker")), "ls1");
    assert_string_equal(json_string_value(json_object_get(fe, "worker_kind")), "llama-server");
    assert_string_equal(json_string_value(json_object_get(ev, "replay_worker")), "ls2");
    assert_string_equal(json_string_value(json_object_get(ev, "replay_worker_kind")),
                        "llama-server");
    assert_non_null(strstr(json_string_value(json_object_get(ev, "reason")),
                           "another llama-server"));
    json_decref(ev);

    /* greedy chat: both render the messages with /apply-template; the
     * role said once */
    rh_wait_restarted(&r, "ls1", 0);
    stream_via(&r, "/v1/chat/completions",
               "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":8,"
               "\"temperature\":0,\"stream\":true}",
               true, &s);
    assert_string_equal(s.error_code, "");
    assert_int_equal(s.n_ids, 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(s.ids[i], g_seq[i]);
    assert_int_equal(s.roles, 1);
    pthread_mutex_lock(&g_mu);
    nb = json_loads(g_survivor_body, 0, NULL);
    pthread_mutex_unlock(&g_mu);
    assert_string_equal(json_string_value(json_array_get(json_object_get(nb, "prompt"), 0)),
                        "<|user|>\nHi<|assistant|>\n");
    json_decref(nb);

    /* what another llama-server cannot continue exactly, with no spillway
     * worker left: the replay table's stop, with its reason */
    /* a grammar the sent text leaves (the scripted server ignored it) */
    assert_not_resumed(&r,
                       "{\"prompt\":\"Once upon a time\",\"max_tokens\":10,\"temperature\":0,"
                       "\"grammar\":\"root ::= [A-Z]+\",\"stream\":true}",
                       "could not be advanced over the sent text");
    assert_not_resumed(&r,
                       "{\"prompt\":\"Once upon a time\",\"max_tokens\":10,\"temperature\":0.7,"
                       "\"seed\":7,\"stream\":true}",
                       "random stream");
    assert_not_resumed(&r,
                       "{\"prompt\":\"Once upon a time\",\"max_tokens\":10,\"temperature\":0,"
                       "\"stop\":[\"zebra\"],\"stream\":true}",
                       "stop strings");

    rh_finish(&r);
    g_survivor = NULL;
    fs_stop(&g_fake_b);
    fs_stop(&g_fake);
}

/* The text of the first n scripted ids. */
static void seq_text(int n, char *out, size_t cap)
{
    out[0] = 0;
    for (int i = 0; i < n; i++)
        strncat(out, g_seq_piece[i], cap - strlen(out) - 1);
}

/* The grammar ls2 was given checked by its meaning: after the sent text,
 * each rest is accepted by it exactly when the original grammar accepts
 * the text then the rest; some are and some are not. */
static void assert_grammar_after(const char *original, const char *given, const char *sent,
                                 const char *const *rests, size_t n_rests)
{
    eng_gbnf *g = NULL, *d = NULL;
    sw_error err;
    assert_int_equal(eng_gbnf_parse(original, strlen(original), &g, &err), 0);
    if (eng_gbnf_parse(given, strlen(given), &d, &err))
        fail_msg("the grammar given does not parse (%s):\n%s", err.message, given);
    int accepted = 0;
    for (size_t i = 0; i < n_rests; i++) {
        char whole[1024];
        snprintf(whole, sizeof whole, "%s%s", sent, rests[i]);
        bool want = eng_gbnf_match(g, whole, strlen(whole));
        bool got = eng_gbnf_match(d, rests[i], strlen(rests[i]));
        if (want != got)
            fail_msg("after \"%s\", \"%s\" is %s by the grammar given, %s by the original:\n%s",
                     sent, rests[i], got ? "accepted" : "refused", want ? "accepted" : "refused",
                     given);
        accepted += want;
    }
    assert_true(accepted > 0 && (size_t)accepted < n_rests);
    eng_gbnf_free(d);
    eng_gbnf_free(g);
}

/* One constrained stream on ls1, dying after cut tokens, continued on
 * ls2: the client's one stream is the scripted answer (n tokens), and ls2
 * was asked with the token prompt and the grammar advanced over the sent
 * text (checked on rests). */
static void constrained_case(const rh_router *r, const char *path, const char *body, bool chat,
                             int cut, int n, const char *grammar, const char *const *rests,
                             size_t n_rests)
{
    rh_wait_restarted(r, "ls1", 0);
    atomic_store(&g_cut, cut);
    int before = atomic_load(&g_survivor_completions);
    streamed s;
    stream_via(r, path, body, chat, &s);
    atomic_store(&g_cut, K);
    assert_string_equal(s.worker, "ls1");
    assert_string_equal(s.error_code, "");
    assert_int_equal(s.n_ids, n);
    for (int i = 0; i < n; i++)
        assert_int_equal(s.ids[i], g_seq[i]);
    char want[4096];
    seq_text(n, want, sizeof want);
    assert_string_equal(s.text, want);
    if (chat)
        assert_int_equal(s.roles, 1);
    assert_int_equal(atomic_load(&g_survivor_completions), before + 1);
    pthread_mutex_lock(&g_mu);
    json_t *nb = json_loads(g_survivor_body, 0, NULL);
    pthread_mutex_unlock(&g_mu);
    assert_non_null(nb);
    json_t *prompt = json_object_get(nb, "prompt");
    assert_int_equal(json_array_size(prompt), 1 + (size_t)cut);
    for (int i = 0; i < cut; i++)
        assert_int_equal(json_integer_value(json_array_get(prompt, 1 + (size_t)i)), g_seq[i]);
    assert_int_equal(json_integer_value(json_object_get(nb, "n_predict")), n - cut);
    const char *given = json_string_value(json_object_get(nb, "grammar"));
    assert_non_null(given);
    char sent[4096];
    seq_text(cut, sent, sizeof sent);
    assert_grammar_after(grammar, given, sent, rests, n_rests);
    json_decref(nb);
    json_t *ev = last_failover_event(r);
    assert_string_equal(json_string_value(json_object_get(ev, "decision")), "resume");
    assert_string_equal(json_string_value(json_object_get(ev, "replay_worker")), "ls2");
    assert_non_null(strstr(json_string_value(json_object_get(ev, "reason")),
                           "a grammar advanced over the sent text"));
    json_decref(ev);
}

/* Two llama-servers, the first dying mid-stream under a grammar: the
 * second continues from the token prompt with the grammar advanced over
 * the text sent, cut inside a word and between words, in a completion and
 * a chat. */
static void test_resume_constrained_on_llama_server(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    atomic_store(&g_bad_vocab, false);
    atomic_store(&g_mode, MODE_KILL);
    atomic_store(&g_survivor_completions, 0);
    fs_start(&g_fake, "llamaserver-first4.sock", (size_t)1 << 20, false, fake_answer);
    fs_start(&g_fake_b, "llamaserver-second4.sock", (size_t)1 << 20, false, fake_answer);
    g_survivor = &g_fake_b;
    char workers[2048];
    snprintf(workers, sizeof workers,
             "[worker ls1]\nkind = llama-server\nurl = unix:%s\n"
             "[worker ls2]\nkind = llama-server\nurl = unix:%s\n",
             g_fake.path, g_fake_b.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "llamaserver-grammar", g_model, NULL, workers), 0);
    json_decref(wait_checked(&r, "ls1"));
    json_decref(wait_checked(&r, "ls2"));

    /* words of lower-case letters after spaces, then a full stop (the
     * scripted answer holds a lone space: the tokenizer's prefix) */
    static const char grammar[] = "root ::= word+ \".\"\nword ::= \" \"+ [a-z]+";
    static const char *const rests[] = {"", ".", " dog.", "s.", "dog and a cat.", " .",
                                        "X.", " dog", ".."};
    for (int cut = 3; cut <= 5; cut++) {
        json_t *b = json_pack("{s:s, s:i, s:i, s:s, s:b}", "prompt", "Once upon a time",
                              "max_tokens", 10, "temperature", 0, "grammar", grammar, "stream", 1);
        char *body = json_dumps(b, JSON_COMPACT);
        constrained_case(&r, "/v1/completions", body, false, cut, 10, grammar, rests,
                         sizeof rests / sizeof rests[0]);
        free(body);
        json_decref(b);
    }
    json_t *b = json_pack("{s:[{s:s, s:s}], s:i, s:i, s:s, s:b}", "messages", "role", "user",
                          "content", "Hi", "max_tokens", 9, "temperature", 0, "grammar", grammar,
                          "stream", 1);
    char *body = json_dumps(b, JSON_COMPACT);
    constrained_case(&r, "/v1/chat/completions", body, true, K, 9, grammar, rests,
                     sizeof rests / sizeof rests[0]);
    free(body);
    json_decref(b);

    rh_finish(&r);
    g_survivor = NULL;
    fs_stop(&g_fake_b);
    fs_stop(&g_fake);
}

/* A JSON schema (response_format) on two llama-servers: the first is sent
 * the schema as spillway's GBNF form of it, and the second continues with
 * that grammar advanced over the text sent, cut inside a string and
 * between members. */
static void test_resume_json_schema_on_llama_server(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    static const char schema_text[] =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
        "\"string\"}}},\"required\":[\"name\",\"age\"]}";
    static const char answer[] = "{\"name\":\"Tom the cat\",\"age\":7,\"tags\":[\"small\",\"grey\"]}";
    assert_int_equal(set_script(answer, 0, NULL), 0);
    int n = g_n_seq;
    /* the grammar the router makes of the schema, as a spillway worker
     * compiles it */
    json_t *schema = json_loads(schema_text, 0, NULL);
    eng_grammar *eg = NULL;
    char *gbnf = NULL;
    assert_int_equal(eng_grammar_from_schema(schema, &eg, NULL), 0);
    assert_int_equal(eng_grammar_to_gbnf(eg, &gbnf, NULL), 0);
    eng_grammar_free(eg);
    /* cuts: the first inside the name's value, the first after a member */
    int in_string = 0, between = 0;
    for (int k = 1; k < n && (!in_string || !between); k++) {
        char t[4096];
        seq_text(k, t, sizeof t);
        size_t len = strlen(t);
        if (!in_string && len > 9 && len < 21 && !strncmp(t, answer, len))
            in_string = k;
        if (!between && len > 21 && (t[len - 1] == ',' || t[len - 1] == '7'))
            between = k;
    }
    assert_true(in_string > 0 && between > 0);

    atomic_store(&g_bad_vocab, false);
    atomic_store(&g_mode, MODE_KILL);
    atomic_store(&g_survivor_completions, 0);
    fs_start(&g_fake, "llamaserver-first5.sock", (size_t)1 << 20, false, fake_answer);
    fs_start(&g_fake_b, "llamaserver-second5.sock", (size_t)1 << 20, false, fake_answer);
    g_survivor = &g_fake_b;
    char workers[2048];
    snprintf(workers, sizeof workers,
             "[worker ls1]\nkind = llama-server\nurl = unix:%s\n"
             "[worker ls2]\nkind = llama-server\nurl = unix:%s\n",
             g_fake.path, g_fake_b.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "llamaserver-schema", g_model, NULL, workers), 0);
    json_decref(wait_checked(&r, "ls1"));
    json_decref(wait_checked(&r, "ls2"));

    int cuts[2] = {in_string, between};
    for (int c = 0; c < 2; c++) {
        char sent[4096], suffix[sizeof answer], cut_short[sizeof answer],
            extra[sizeof answer + 1];
        seq_text(cuts[c], sent, sizeof sent);
        assert_true(strlen(sent) < strlen(answer));
        strcpy(suffix, answer + strlen(sent));
        strcpy(cut_short, suffix);
        cut_short[strlen(cut_short) - 1] = 0;
        strcpy(extra, suffix);
        strcat(extra, "}");
        const char *rests[] = {suffix, cut_short, extra, "", "}", " x"};
        json_t *b = json_pack("{s:[{s:s, s:s}], s:i, s:i, s:{s:s, s:{s:s, s:O}}, s:b}",
                              "messages", "role", "user", "content", "Tom?", "max_tokens", n,
                              "temperature", 0, "response_format", "type", "json_schema",
                              "json_schema", "name", "cat", "schema", schema, "stream", 1);
        char *body = json_dumps(b, JSON_COMPACT);
        constrained_case(&r, "/v1/chat/completions", body, true, cuts[c], n, gbnf, rests,
                         sizeof rests / sizeof rests[0]);
        free(body);
        json_decref(b);
        /* the first server was sent the grammar, not the schema */
        pthread_mutex_lock(&g_mu);
        json_t *first = json_loads(g_first_body, 0, NULL);
        pthread_mutex_unlock(&g_mu);
        assert_string_equal(json_string_value(json_object_get(first, "grammar")), gbnf);
        assert_null(json_object_get(first, "response_format"));
        json_decref(first);
    }

    /* a schema with no GBNF form here (a multiple): the OpenAI endpoint,
     * where llama-server reads the schema itself; not resumable, so a
     * death after text ends the stream with an error event */
    rh_wait_restarted(&r, "ls1", 0);
    streamed st;
    stream_via(&r, "/v1/chat/completions",
               "{\"messages\":[{\"role\":\"user\",\"content\":\"Tom?\"}],\"max_tokens\":8,"
               "\"temperature\":0,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
               "{\"name\":\"p\",\"schema\":{\"type\":\"integer\",\"multipleOf\":3}}},"
               "\"stream\":true}",
               true, &st);
    assert_string_equal(st.worker, "ls1");
    assert_string_equal(st.error_code, "worker_failed");
    pthread_mutex_lock(&g_mu);
    assert_string_equal(g_last_path, "/v1/chat/completions");
    json_t *oa = json_loads(g_last_body, 0, NULL);
    pthread_mutex_unlock(&g_mu);
    assert_non_null(json_object_get(oa, "response_format"));
    json_decref(oa);

    rh_finish(&r);
    g_survivor = NULL;
    fs_stop(&g_fake_b);
    fs_stop(&g_fake);
    sw_free(gbnf);
    json_decref(schema);
    assert_int_equal(default_script(), 0);
}

/* ls1, ls2 and a spillway worker after them: a stream the replay table
 * keeps off llama-server (a grammar, sampled) passes ls2 by and is resumed
 * on the spillway worker; a greedy one goes to ls2, first in order. */
static void test_resume_kept_off_llama_server(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    atomic_store(&g_bad_vocab, false);
    atomic_store(&g_mode, MODE_KILL);
    atomic_store(&g_survivor_completions, 0);
    fs_start(&g_fake, "llamaserver-first3.sock", (size_t)1 << 20, false, fake_answer);
    fs_start(&g_fake_b, "llamaserver-second3.sock", (size_t)1 << 20, false, fake_answer);
    g_survivor = &g_fake_b;
    char workers[2048];
    snprintf(workers, sizeof workers,
             "[worker ls1]\nkind = llama-server\nurl = unix:%s\n"
             "[worker ls2]\nkind = llama-server\nurl = unix:%s\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 256\nmax-seqs = 4\ncalibrate = false\n",
             g_fake.path, g_fake_b.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "llamaserver-three", g_model, NULL, workers), 0);
    rh_wait_restarted(&r, "cpu", 0);
    json_decref(wait_checked(&r, "ls1"));
    json_decref(wait_checked(&r, "ls2"));

    static const char *const bodies[] = {
        /* a grammar too ambiguous for the derivative (each letter may
         * stand for a digit to come: 2^n stacks), which the spillway
         * worker advances itself */
        "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,"
        "\"grammar\":\"root ::= [a-z ] root \\\"0\\\" | [a-z ] root \\\"1\\\" | [a-z ]+\","
        "\"stream\":true}",
        "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0.7,\"seed\":7,"
        "\"stream\":true}",
    };
    static const char *const reason_has[] = {"advances the grammar", "random stream"};
    for (int b = 0; b < 2; b++) {
        rh_wait_restarted(&r, "ls1", 0);
        streamed s;
        stream_via(&r, "/v1/completions", bodies[b], false, &s);
        assert_string_equal(s.error_code, "");
        assert_first_k(&s);
        assert_int_equal(s.n_ids, 8);
        assert_int_equal(atomic_load(&g_survivor_completions), 0);
        json_t *ev = last_failover_event(&r);
        assert_string_equal(json_string_value(json_object_get(ev, "decision")), "resume");
        assert_string_equal(json_string_value(json_object_get(ev, "replay_worker")), "cpu");
        assert_string_equal(json_string_value(json_object_get(ev, "replay_worker_kind")),
                            "spillway");
        const char *reason = json_string_value(json_object_get(ev, "reason"));
        if (!reason || !strstr(reason, reason_has[b]))
            fail_msg("reason \"%s\" lacks \"%s\"", reason ? reason : "", reason_has[b]);
        json_decref(ev);
    }

    /* greedy: ls2 comes before cpu and continues it */
    rh_wait_restarted(&r, "ls1", 0);
    streamed s;
    stream_via(&r, "/v1/completions",
               "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,"
               "\"stream\":true}",
               false, &s);
    assert_string_equal(s.error_code, "");
    for (int i = 0; i < 8; i++)
        assert_int_equal(s.ids[i], g_seq[i]);
    assert_int_equal(atomic_load(&g_survivor_completions), 1);
    json_t *ev = last_failover_event(&r);
    assert_string_equal(json_string_value(json_object_get(ev, "replay_worker")), "ls2");
    json_decref(ev);

    rh_finish(&r);
    g_survivor = NULL;
    fs_stop(&g_fake_b);
    fs_stop(&g_fake);
}

static void test_other_vocabulary(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    atomic_store(&g_bad_vocab, true);
    atomic_store(&g_mode, MODE_KILL);
    fs_start(&g_fake, "llamaserver-fake2.sock", (size_t)1 << 20, false, fake_answer);
    char workers[1024];
    router_config(workers, sizeof workers);
    rh_router r;
    assert_int_equal(rh_start(&r, "llamaserver-vocab", g_model, NULL, workers), 0);
    rh_wait_restarted(&r, "cpu", 0);
    json_t *h = wait_checked(&r, "ls");
    assert_false(json_is_true(json_object_get(json_object_get(h, "llama_server"), "resumable")));
    json_decref(h);
    char *log = tu_read_file(r.log, NULL);
    assert_non_null(log);
    assert_non_null(strstr(log, "does not give the model's token ids"));
    sw_free(log);

    /* its stream takes the OpenAI endpoint; dead after text: an error event */
    streamed s;
    stream_via(&r, "/v1/completions",
               "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,"
               "\"stream\":true}",
               false, &s);
    assert_string_equal(s.worker, "ls");
    assert_string_equal(s.error_code, "worker_failed");
    assert_int_equal(s.n_ids, 0);
    pthread_mutex_lock(&g_mu);
    assert_string_equal(g_last_path, "/v1/completions");
    pthread_mutex_unlock(&g_mu);
    char decision[64], kind[64], first[64], final[64];
    last_failover(&r, decision, kind, first, final);
    assert_string_equal(decision, "none (external engine: no resume)");
    rh_finish(&r);
    fs_stop(&g_fake);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_from_llama_server),
        cmocka_unit_test(test_other_vocabulary),
        cmocka_unit_test(test_resume_on_llama_server),
        cmocka_unit_test(test_resume_kept_off_llama_server),
        cmocka_unit_test(test_resume_constrained_on_llama_server),
        cmocka_unit_test(test_resume_json_schema_on_llama_server),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
