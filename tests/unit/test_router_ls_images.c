/* test_router_ls_images.c - end-to-end: image content through the real
 * router process (docs/engines.md, Images through the router), the
 * llama-servers being scripted peers on real sockets (tests/fake_server.h)
 * whose /props says whether they have a vision projector, beside a real
 * spillway CPU worker (which takes text parts only).
 *
 * - a chat with an image_url part (a data: URL) goes only to the
 *   llama-server whose /props says "vision": true, whole and through its
 *   OpenAI endpoint (streamed too: not /apply-template, which would lose
 *   the image); a text chat goes to the first worker, which has none;
 * - a bad image is a typed 400 that no worker sees: not base64, a media
 *   type no projector reads, bytes that are not the type said, over
 *   max-image-bytes, an http(s) URL (the router fetches nothing);
 * - no worker with a projector: 400 images_not_supported, while text is
 *   served as before;
 * - a managed llama-server with mmproj = gets --mmproj PATH after its
 *   command;
 * - [model] image-tokens: each image counted as that many KV tokens (two
 *   of them overfill the slots' context: 400 at once);
 * - an image stream takes the native path: /apply-template renders the
 *   image as the server's media marker, and /completion gets the prompt as
 *   {"prompt_string", "multimodal_data"} with the image's base64;
 * - the projector worker dies before answering: the request is replayed
 *   on the second one, which receives the same image bytes; a greedy
 *   stream that died after text was sent is resumed on the second one,
 *   whose prompt_string is the rendered prompt and the text of the ids
 *   sent, with the same image; the client gets one stream, the whole
 *   answer, one [DONE], no error event; a sampled one ends with an error
 *   event and the second server sees nothing.
 */
#include "testutil.h"
#include "router_harness.h"
#include "fake_server.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* A 1x1 PNG, and the start of a JPEG (FF D8 FF E0 ... "JFIF") */
#define PNG_B64 "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
#define JPEG_B64 "/9j/4AAQSkZJRg=="

enum { FAKE_OK, FAKE_DIE, FAKE_DIE_AFTER_TEXT, FAKE_DIE_AFTER_ODD };

/* One scripted llama-server: what its /props says, how it answers, what
 * it was sent. */
typedef struct fake {
    fs_server s;
    bool vision;
    atomic_int mode;
    atomic_int chats;        /* POST /v1/chat/completions */
    atomic_int templates;    /* POST /apply-template */
    atomic_int completions;  /* POST /completion */
    pthread_mutex_t mu;
    char last_chat[65536];
    char last_completion[65536];
} fake;

/* What /apply-template renders a chat with an image as (the marker where
 * the image was), and the scripted greedy answer after it: ids that
 * tokenize back from their text after the prompt's tail, g_cut of them
 * sent before a server dies (chosen in setup so that the text of the
 * first g_cut tokenizes back to them after the tail too). */
#define RENDERED_IMAGE "<|user|>\nHi<__media__><|assistant|>\n"
#define IMAGE_TAIL "<|assistant|>\n"
#define ANSWER "A small red dot sits on a plain white field"
enum { MAX_ANS = 8 };
static int32_t g_ans[MAX_ANS];
static size_t g_n_ans, g_cut;
static char g_piece[MAX_ANS][64];
/* The answer's first two tokens as three ids whose text does not
 * tokenize back to them: the second split in two vocabulary pieces (" s"
 * and "mall" where the tokenizer makes " small" one token) */
static int32_t g_odd[MAX_ANS];
static size_t g_n_odd;

static char g_model[512];
static eng_gguf *g_gguf;
static eng_tokenizer *g_tok;
static fake g_plain, g_vis, g_vis2;

/* tokenize(tail + text of ids[0..k)) == tokenize(tail) ++ ids[0..k) */
static bool tokenizes_back(size_t k)
{
    char text[1024] = IMAGE_TAIL;
    size_t tl = strlen(IMAGE_TAIL), at = tl;
    for (size_t i = 0; i < k; i++)
        at += eng_token_to_bytes(g_tok, g_ans[i], text + at, sizeof text - at);
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    bool ok = !eng_tokenize(g_tok, text, at, false, true, &a, &na, NULL) &&
              !eng_tokenize(g_tok, text, tl, false, true, &b, &nb, NULL) && na == nb + k &&
              !memcmp(a, b, nb * sizeof *a) && !memcmp(a + nb, g_ans, k * sizeof *a);
    sw_free(a);
    sw_free(b);
    return ok;
}

static int script_answer(void)
{
    char text[256];
    snprintf(text, sizeof text, "%s%s", IMAGE_TAIL, ANSWER);
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    bool ok = !eng_tokenize(g_tok, text, strlen(text), false, true, &a, &na, NULL) &&
              !eng_tokenize(g_tok, text, strlen(IMAGE_TAIL), false, true, &b, &nb, NULL) &&
              na > nb;
    g_n_ans = !ok ? 0 : na - nb < MAX_ANS ? na - nb : MAX_ANS;
    if (ok)
        memcpy(g_ans, a + nb, g_n_ans * sizeof *a);
    sw_free(a);
    sw_free(b);
    if (!ok)
        return -1;
    for (size_t i = 0; i < g_n_ans; i++) {
        size_t n = eng_token_to_bytes(g_tok, g_ans[i], g_piece[i], sizeof g_piece[i] - 1);
        g_piece[i][n < sizeof g_piece[i] ? n : sizeof g_piece[i] - 1] = 0;
    }
    for (g_cut = g_n_ans / 2; g_cut >= 2 && !tokenizes_back(g_cut); g_cut--)
        ;
    size_t plen = 0;
    const char *piece = eng_token_piece(g_tok, g_ans[1], &plen);
    g_n_odd = 0;
    for (size_t cut = 1; piece && cut < plen && !g_n_odd; cut++) {
        int32_t left = eng_token_find(g_tok, piece, cut);
        int32_t right = eng_token_find(g_tok, piece + cut, plen - cut);
        if (left >= 0 && right >= 0) {
            g_odd[0] = g_ans[0];
            g_odd[1] = left;
            g_odd[2] = right;
            g_n_odd = 3;
        }
    }
    if (!g_n_odd)
        return -1;
    return g_cut >= 2 && g_cut < g_n_ans ? 0 : -1;
}

static fake *fake_of(fs_server *s)
{
    return s == &g_plain.s ? &g_plain : s == &g_vis.s ? &g_vis : &g_vis2;
}

static int setup(void **state)
{
    (void)state;
    if (rh_make_model(g_model, sizeof g_model, "router-ls-images.gguf", 71))
        return -1;
    if (eng_gguf_open(g_model, &g_gguf, NULL) || eng_tokenizer_load(g_gguf, &g_tok, NULL))
        return -1;
    return script_answer();
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

static void chat_answer(int fd, fake *f, const char *body)
{
    int mode = atomic_load(&f->mode);
    if (mode == FAKE_DIE)
        return; /* the connection closes without an answer: a crash */
    json_t *b = json_loads(body, 0, NULL);
    bool stream = json_is_true(json_object_get(b, "stream"));
    json_decref(b);
    if (!stream) {
        reply_json(fd, 200, "{\"id\":\"x\",\"object\":\"chat.completion\",\"created\":0,"
                            "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
                            "\"assistant\",\"content\":\"a red dot\"},\"finish_reason\":\"stop\"}],"
                            "\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":3,"
                            "\"total_tokens\":23}}");
        return;
    }
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Connection: close\r\n\r\n";
    static const char c1[] = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":0,"
                             "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":"
                             "\"assistant\",\"content\":\"a red\"},\"finish_reason\":null}]}\n\n";
    static const char c2[] = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":0,"
                             "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                             "\" dot\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    fs_send_all(fd, head, sizeof head - 1);
    fs_send_all(fd, c1, sizeof c1 - 1);
    if (mode == FAKE_DIE_AFTER_TEXT)
        return;
    fs_send_all(fd, c2, sizeof c2 - 1);
}

static void send_event(int fd, json_t *e)
{
    char *p = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    char ev[2048];
    int n = snprintf(ev, sizeof ev, "data: %s\n\n", p ? p : "{}");
    free(p);
    fs_send_all(fd, ev, (size_t)n);
}

/* /completion (the native path): its prompt must be {"prompt_string",
 * "multimodal_data": [the PNG]} whose string is the rendered chat, or
 * the rendered chat and the text of the first k answer ids (a resume);
 * it sends the answer from there, its ids in "tokens", and the final
 * event; dying (FAKE_DIE: nothing; FAKE_DIE_AFTER_TEXT: after g_cut). */
static void completion_answer(int fd, fake *f, const char *body)
{
    int mode = atomic_load(&f->mode);
    if (mode == FAKE_DIE)
        return;
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Connection: close\r\n\r\n";
    if (mode == FAKE_DIE_AFTER_ODD) {
        fs_send_all(fd, head, sizeof head - 1);
        for (size_t i = 0; i < g_n_odd; i++) {
            char piece[64];
            size_t n = eng_token_to_bytes(g_tok, g_odd[i], piece, sizeof piece - 1);
            piece[n < sizeof piece ? n : sizeof piece - 1] = 0;
            send_event(fd, json_pack("{s:i, s:s, s:[i], s:b, s:i, s:I, s:i}", "index", 0,
                                     "content", piece, "tokens", (int)g_odd[i], "stop", 0,
                                     "id_slot", 0, "tokens_predicted", (json_int_t)(i + 1),
                                     "tokens_evaluated", 12));
        }
        return;
    }
    json_t *b = json_loads(body, 0, NULL);
    json_t *p = json_object_get(b, "prompt");
    const char *ps = json_string_value(json_object_get(p, "prompt_string"));
    json_t *mm = json_object_get(p, "multimodal_data");
    size_t start = SIZE_MAX;
    char want[1024];
    size_t at = (size_t)snprintf(want, sizeof want, "%s", RENDERED_IMAGE);
    for (size_t k = 0; ps && k <= g_n_ans; k++) {
        if (!strcmp(ps, want)) {
            start = k;
            break;
        }
        if (k < g_n_ans)
            at += (size_t)snprintf(want + at, sizeof want - at, "%s", g_piece[k]);
    }
    bool image = json_array_size(mm) == 1 &&
                 !strcmp(json_string_value(json_array_get(mm, 0)) ?: "", PNG_B64);
    json_decref(b);
    if (start == SIZE_MAX || !image) {
        reply_json(fd, 400, "{\"error\":{\"code\":400,\"message\":\"not the scripted "
                            "prompt\",\"type\":\"invalid_request_error\"}}");
        return;
    }
    fs_send_all(fd, head, sizeof head - 1);
    size_t end = mode == FAKE_DIE_AFTER_TEXT ? g_cut : g_n_ans;
    for (size_t i = start; i < end; i++) {
        send_event(fd, json_pack("{s:i, s:s, s:[i], s:b, s:i, s:I, s:i}", "index", 0, "content",
                                 g_piece[i], "tokens", (int)g_ans[i], "stop", 0, "id_slot", 0,
                                 "tokens_predicted", (json_int_t)(i - start + 1),
                                 "tokens_evaluated", 12));
        usleep(10 * 1000);
    }
    if (mode == FAKE_DIE_AFTER_TEXT)
        return;
    send_event(fd, json_pack("{s:i, s:s, s:[], s:b, s:s, s:I, s:i}", "index", 0, "content", "",
                             "tokens", "stop", 1, "stop_type", "eos", "tokens_predicted",
                             (json_int_t)(g_n_ans - start), "tokens_evaluated", 12));
}

static void fake_answer(fs_server *s, int fd, const char *req, const char *body)
{
    fake *f = fake_of(s);
    char method[8] = "", path[64] = "";
    sscanf(req, "%7s %63s", method, path);
    if (!strcmp(path, "/health")) {
        reply_json(fd, 200, "{\"status\":\"ok\"}");
    } else if (!strcmp(path, "/slots")) {
        reply_json(fd, 200, "[{\"id\":0,\"n_ctx\":512,\"is_processing\":false},"
                            "{\"id\":1,\"n_ctx\":512,\"is_processing\":false}]");
    } else if (!strcmp(path, "/props")) {
        reply_json(fd, 200, f->vision ? "{\"total_slots\":2,\"modalities\":{\"vision\":true,"
                                        "\"audio\":false}}"
                                      : "{\"total_slots\":2,\"modalities\":{\"vision\":false,"
                                        "\"audio\":false}}");
    } else if (!strcmp(path, "/tokenize")) {
        json_t *b = json_loads(body, 0, NULL);
        const char *text = json_string_value(json_object_get(b, "content"));
        int32_t *ids = NULL;
        size_t n = 0;
        json_t *arr = json_array();
        if (text && eng_tokenize(g_tok, text, strlen(text), false, false, &ids, &n, NULL) == 0)
            for (size_t i = 0; i < n; i++)
                json_array_append_new(arr, json_integer(ids[i]));
        sw_free(ids);
        json_t *o = json_pack("{s:o}", "tokens", arr);
        char *out = json_dumps(o, JSON_COMPACT);
        reply_json(fd, 200, out);
        free(out);
        json_decref(o);
        json_decref(b);
    } else if (!strcmp(path, "/apply-template")) {
        atomic_fetch_add(&f->templates, 1);
        reply_json(fd, 200, strstr(body, "image_url")
                                ? "{\"prompt\":\"<|user|>\\nHi<__media__><|assistant|>\\n\"}"
                                : "{\"prompt\":\"<|user|>\\nHi<|assistant|>\\n\"}");
    } else if (!strcmp(path, "/completion")) {
        atomic_fetch_add(&f->completions, 1);
        pthread_mutex_lock(&f->mu);
        snprintf(f->last_completion, sizeof f->last_completion, "%s", body);
        pthread_mutex_unlock(&f->mu);
        completion_answer(fd, f, body);
    } else if (!strcmp(path, "/v1/chat/completions")) {
        atomic_fetch_add(&f->chats, 1);
        pthread_mutex_lock(&f->mu);
        snprintf(f->last_chat, sizeof f->last_chat, "%s", body);
        pthread_mutex_unlock(&f->mu);
        chat_answer(fd, f, body);
    } else {
        reply_json(fd, 404, "{\"error\":{\"code\":404,\"message\":\"not here\"}}");
    }
}

static void fake_start(fake *f, const char *name, bool vision)
{
    f->vision = vision;
    atomic_store(&f->mode, FAKE_OK);
    atomic_store(&f->chats, 0);
    atomic_store(&f->templates, 0);
    atomic_store(&f->completions, 0);
    pthread_mutex_init(&f->mu, NULL);
    f->last_chat[0] = 0;
    f->last_completion[0] = 0;
    fs_start(&f->s, name, (size_t)1 << 20, false, fake_answer);
}

static void fake_stop(fake *f)
{
    fs_stop(&f->s);
    pthread_mutex_destroy(&f->mu);
}

/* Waits until worker name is ready and its /props was asked (its
 * llama_server.images is a boolean); returns that verdict. */
static bool wait_images(const rh_router *r, const char *name)
{
    for (int i = 0; i < 300; i++) {
        json_t *h = rh_worker_health(r, name);
        json_t *im = json_object_get(json_object_get(h, "llama_server"), "images");
        bool ready = !strcmp(json_string_value(json_object_get(h, "state")) ?: "", "ready");
        bool known = json_is_boolean(im) &&
                     json_is_true(json_object_get(json_object_get(h, "llama_server"),
                                                  "vocab_checked"));
        bool v = json_is_true(im);
        json_decref(h);
        if (ready && known)
            return v;
        usleep(100 * 1000);
    }
    fail_msg("worker %s: its /props was never asked", name);
    return false;
}

/* The temperature chat bodies ask for (0: greedy), and the text of the
 * last stream chat() read, with its [DONE] count. */
static double g_temperature;
static char g_text[1024];
static int g_dones;

/* A chat body: one user message of a text part and an image part whose
 * url is url (NULL: text only). */
static char *chat_body(const char *url, bool stream)
{
    json_t *content = url ? json_pack("[{s:s, s:s}, {s:s, s:{s:s}}]", "type", "text", "text",
                                      "What is in this picture?", "type", "image_url",
                                      "image_url", "url", url)
                          : json_string("Hello there");
    json_t *b = json_pack("{s:[{s:s, s:o}], s:i, s:b, s:f}", "messages", "role", "user",
                          "content", content, "max_tokens", 8, "stream", stream,
                          "temperature", g_temperature);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* POST /v1/chat/completions; the status, the worker header into worker
 * and the error code into code ("" none). */
static int chat(const rh_router *r, const char *url, bool stream, char *worker, char *code)
{
    char *body = chat_body(url, stream);
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/chat/completions", NULL, body, &w), 0);
    free(body);
    worker[0] = code[0] = 0;
    wc_header(&w, "X-Spillway-Worker", worker, 64);
    if (w.status != 200) {
        rh_error_code(&w, code, 64);
    } else if (stream) {
        char **ev = NULL;
        int n = wc_sse_parse(w.body, w.body_len, &ev);
        assert_true(n > 0);
        assert_string_equal(ev[n - 1], "[DONE]");
        g_text[0] = 0;
        g_dones = 0;
        for (int i = 0; i < n; i++) {
            if (!strcmp(ev[i], "[DONE]")) {
                g_dones++;
                continue;
            }
            json_t *j = json_loads(ev[i], 0, NULL);
            assert_non_null(j);
            json_t *e = json_object_get(j, "error");
            if (e)
                snprintf(code, 64, "%s", json_string_value(json_object_get(e, "code")) ?: "?");
            const char *c = json_string_value(json_object_get(
                json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta"),
                "content"));
            if (c)
                snprintf(g_text + strlen(g_text), sizeof g_text - strlen(g_text), "%s", c);
            json_decref(j);
        }
        wc_sse_free(ev, n);
    }
    int st = w.status;
    wc_response_free(&w);
    return st;
}

/* The image url of the last chat f received ("" none). */
static void last_image_url(fake *f, char *out, size_t cap)
{
    pthread_mutex_lock(&f->mu);
    json_t *b = json_loads(f->last_chat, 0, NULL);
    pthread_mutex_unlock(&f->mu);
    json_t *part = json_array_get(
        json_object_get(json_array_get(json_object_get(b, "messages"), 0), "content"), 1);
    const char *url = json_string_value(json_object_get(json_object_get(part, "image_url"), "url"));
    snprintf(out, cap, "%s", url ? url : "");
    json_decref(b);
}

/* The last /completion body f received: its prompt_string and its
 * multimodal_data's first entry ("" none). */
static void last_completion(fake *f, char *prompt, size_t pcap, char *data, size_t dcap)
{
    pthread_mutex_lock(&f->mu);
    json_t *b = json_loads(f->last_completion, 0, NULL);
    pthread_mutex_unlock(&f->mu);
    json_t *p = json_object_get(b, "prompt");
    const char *ps = json_string_value(json_object_get(p, "prompt_string"));
    const char *d = json_string_value(json_array_get(json_object_get(p, "multimodal_data"), 0));
    snprintf(prompt, pcap, "%s", ps ? ps : "");
    snprintf(data, dcap, "%s", d ? d : "");
    json_decref(b);
}

/* The whole scripted answer, or its first k pieces. */
static void answer_text(size_t k, char *out, size_t cap)
{
    out[0] = 0;
    for (size_t i = 0; i < k; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s", g_piece[i]);
}

/* base64 of n bytes: the PNG signature, then zeros */
static char *fake_png_b64(size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char *raw = calloc(n, 1);
    memcpy(raw, "\x89PNG\r\n\x1a\n", 8);
    char *out = malloc(n / 3 * 4 + 8);
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        unsigned v = (unsigned)raw[i] << 16 | (unsigned)raw[i + 1] << 8 | raw[i + 2];
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = tab[v >> 6 & 63];
        out[o++] = tab[v & 63];
    }
    assert_int_equal(i, n); /* n a multiple of 3 */
    out[o] = 0;
    free(raw);
    return out;
}

static void test_images_go_to_the_projector(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    fake_start(&g_plain, "ls-img-plain.sock", false);
    fake_start(&g_vis, "ls-img-vis.sock", true);
    char workers[2048];
    snprintf(workers, sizeof workers,
             "[worker plain]\nkind = llama-server\nurl = unix:%s\n"
             "[worker vis]\nkind = llama-server\nurl = unix:%s\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 256\nmax-seqs = 2\ncalibrate = false\n",
             g_plain.s.path, g_vis.s.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "ls-images", g_model, "max-image-bytes = 1KiB\n", workers), 0);
    rh_wait_restarted(&r, "cpu", 0);
    assert_false(wait_images(&r, "plain"));
    assert_true(wait_images(&r, "vis"));

    char worker[64], code[64];
    /* text: the first worker in preference order */
    assert_int_equal(chat(&r, NULL, false, worker, code), 200);
    assert_string_equal(worker, "plain");
    assert_int_equal(atomic_load(&g_plain.chats), 1);

    /* an image: only the worker with a projector, the body whole */
    const char *png = "data:image/png;base64," PNG_B64;
    assert_int_equal(chat(&r, png, false, worker, code), 200);
    assert_string_equal(worker, "vis");
    assert_int_equal(atomic_load(&g_vis.chats), 1);
    char got[4096];
    last_image_url(&g_vis, got, sizeof got);
    assert_string_equal(got, png);
    const char *jpeg = "data:image/jpeg;base64," JPEG_B64;
    assert_int_equal(chat(&r, jpeg, false, worker, code), 200);
    assert_string_equal(worker, "vis");
    last_image_url(&g_vis, got, sizeof got);
    assert_string_equal(got, jpeg);

    /* streamed: the native path, /apply-template (the image rendered as
     * the server's marker) and /completion with the image's base64 */
    int templates = atomic_load(&g_vis.templates);
    assert_int_equal(chat(&r, png, true, worker, code), 200);
    assert_string_equal(worker, "vis");
    assert_string_equal(code, "");
    assert_int_equal(atomic_load(&g_vis.chats), 2);
    assert_int_equal(atomic_load(&g_vis.templates), templates + 1);
    assert_int_equal(atomic_load(&g_vis.completions), 1);
    char prompt[2048], data[4096], want[2048];
    last_completion(&g_vis, prompt, sizeof prompt, data, sizeof data);
    assert_string_equal(prompt, RENDERED_IMAGE);
    assert_string_equal(data, PNG_B64);
    answer_text(g_n_ans, want, sizeof want);
    assert_string_equal(g_text, want);
    assert_int_equal(g_dones, 1);

    /* bad images: typed 400s, and no worker saw them */
    struct {
        const char *url, *code;
    } bad[] = {
        {"data:image/png;base64,@@@@", "invalid_image"},
        {"data:image/png;base64,iVBORw0KGgo", "invalid_image"}, /* not a multiple of 4 */
        {"data:image/png," PNG_B64, "invalid_image"},           /* not base64 */
        {"data:text/plain;base64,aGVsbG8=", "invalid_image"},
        {"data:image/webp;base64,UklGRg==", "invalid_image"},
        {"data:image/png;base64," JPEG_B64, "invalid_image"},  /* JPEG bytes */
        {"file:///etc/passwd", "invalid_image"},
        {"https://example.com/cat.png", "image_url_not_supported"},
        {"http://127.0.0.1/cat.png", "image_url_not_supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(chat(&r, bad[i].url, false, worker, code), 400);
        assert_string_equal(code, bad[i].code);
    }
    /* over max-image-bytes (1 KiB decoded) */
    char *b64 = fake_png_b64(1026);
    char *big = malloc(strlen(b64) + 40);
    sprintf(big, "data:image/png;base64,%s", b64);
    assert_int_equal(chat(&r, big, false, worker, code), 400);
    assert_string_equal(code, "image_too_large");
    free(big);
    free(b64);
    b64 = fake_png_b64(1023);
    big = malloc(strlen(b64) + 40);
    sprintf(big, "data:image/png;base64,%s", b64);
    assert_int_equal(chat(&r, big, false, worker, code), 200); /* just under */
    free(big);
    free(b64);
    /* image_url without a url */
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL,
                            "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                            "\"image_url\",\"image_url\":{}}]}]}",
                            &w),
                     0);
    assert_int_equal(w.status, 400);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "invalid_image");
    wc_response_free(&w);
    assert_int_equal(atomic_load(&g_vis.chats), 3);
    assert_int_equal(atomic_load(&g_plain.chats), 1);

    /* the CPU worker (text parts only) never had one */
    char sock[700];
    rh_worker_sock(&r, "cpu", sock, sizeof sock);
    assert_int_equal(rh_metric_labeled(sock, "spillway_worker_requests_total",
                                       "outcome=\"error\""),
                     0);
    assert_int_equal(rh_metric_labeled(sock, "spillway_worker_requests_total",
                                       "outcome=\"ok\""),
                     0);

    rh_finish(&r);
    fake_stop(&g_plain);
    fake_stop(&g_vis);
}

static void test_no_projector(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    fake_start(&g_plain, "ls-img-plain2.sock", false);
    char workers[2048];
    snprintf(workers, sizeof workers,
             "[worker plain]\nkind = llama-server\nurl = unix:%s\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 256\nmax-seqs = 2\ncalibrate = false\n",
             g_plain.s.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "ls-noproj", g_model, NULL, workers), 0);
    rh_wait_restarted(&r, "cpu", 0);
    assert_false(wait_images(&r, "plain"));
    char worker[64], code[64];
    assert_int_equal(chat(&r, "data:image/png;base64," PNG_B64, false, worker, code), 400);
    assert_string_equal(code, "images_not_supported");
    assert_int_equal(chat(&r, "data:image/png;base64," PNG_B64, true, worker, code), 400);
    assert_string_equal(code, "images_not_supported");
    assert_int_equal(atomic_load(&g_plain.chats), 0);
    assert_int_equal(chat(&r, NULL, false, worker, code), 200);
    assert_string_equal(worker, "plain");
    rh_finish(&r);
    fake_stop(&g_plain);
}

/* A managed llama-server with mmproj = is started with --mmproj PATH
 * after its command's own arguments; an image request is what starts it
 * (on demand). The command only
 * writes its arguments down: it never becomes ready, and the request
 * ends with the queue's time-out. */
static void test_mmproj_argument(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    char args[600], workers[1600];
    snprintf(args, sizeof args, "%s", tu_tmp_path("ls-img-managed.args"));
    remove(args);
    snprintf(workers, sizeof workers,
             "[worker managed]\nkind = llama-server\non-demand = true\n"
             "command = /bin/sh -c 'echo \"$@\" > %s; exec sleep 30' sh {port}\n"
             "mmproj = /models/mmproj-tiny.gguf\n",
             args);
    rh_router r;
    assert_int_equal(rh_start(&r, "ls-mmproj", g_model, "queue-timeout-ms = 1500\n", workers), 0);
    json_t *h = rh_worker_health(&r, "managed");
    assert_true(json_is_true(json_object_get(json_object_get(h, "llama_server"), "images")));
    json_decref(h);
    char worker[64], code[64];
    assert_int_equal(chat(&r, "data:image/png;base64," PNG_B64, false, worker, code), 503);
    char line[256] = "";
    for (int i = 0; i < 100 && !line[0]; i++) {
        FILE *f = fopen(args, "r");
        if (f) {
            if (!fgets(line, sizeof line, f))
                line[0] = 0;
            fclose(f);
        }
        if (!line[0])
            usleep(100 * 1000);
    }
    assert_non_null(strstr(line, " --mmproj /models/mmproj-tiny.gguf"));
    remove(args);
    rh_finish(&r);
}

/* [model] image-tokens: the books count each image as that many KV
 * tokens. Slots of 512 tokens hold a prompt with one image of 300 (and
 * its text), not one with two: that one is over every context, 400 at
 * once, without reaching the server. */
static void test_image_tokens(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    fake_start(&g_vis, "ls-img-tokens.sock", true);
    char workers[1024];
    snprintf(workers, sizeof workers,
             "image-tokens = 300\n[worker vis]\nkind = llama-server\nurl = unix:%s\n",
             g_vis.s.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "ls-imgtok", g_model, NULL, workers), 0);
    assert_true(wait_images(&r, "vis"));
    char worker[64], code[64];
    assert_int_equal(chat(&r, "data:image/png;base64," PNG_B64, false, worker, code), 200);
    assert_int_equal(atomic_load(&g_vis.chats), 1);
    wc_response w;
    assert_int_equal(rh_req(&r, "POST", "/v1/chat/completions", NULL,
                            "{\"messages\":[{\"role\":\"user\",\"content\":["
                            "{\"type\":\"image_url\",\"image_url\":{\"url\":"
                            "\"data:image/png;base64," PNG_B64 "\"}},"
                            "{\"type\":\"image_url\",\"image_url\":{\"url\":"
                            "\"data:image/png;base64," PNG_B64 "\"}}]}],\"max_tokens\":8}",
                            &w),
                     0);
    assert_int_equal(w.status, 400);
    assert_string_equal(rh_error_code(&w, code, sizeof code), "context_length_exceeded");
    wc_response_free(&w);
    assert_int_equal(atomic_load(&g_vis.chats), 1);
    rh_finish(&r);
    fake_stop(&g_vis);
}

/* The last failover event's decision into out. */
static void last_decision(const rh_router *r, char *out, size_t cap)
{
    json_t *evs = rh_events(r);
    out[0] = 0;
    for (size_t i = 0; i < json_array_size(evs); i++) {
        json_t *e = json_array_get(evs, i);
        if (json_object_get(e, "first_error"))
            snprintf(out, cap, "%s", json_string_value(json_object_get(e, "decision")) ?: "");
    }
    json_decref(evs);
}

static void test_image_failover(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        skip();
    fake_start(&g_vis, "ls-img-vis1.sock", true);
    fake_start(&g_vis2, "ls-img-vis2.sock", true);
    char workers[2048];
    snprintf(workers, sizeof workers,
             "[worker vis1]\nkind = llama-server\nurl = unix:%s\n"
             "[worker vis2]\nkind = llama-server\nurl = unix:%s\n",
             g_vis.s.path, g_vis2.s.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "ls-imgfail", g_model, NULL, workers), 0);
    assert_true(wait_images(&r, "vis1"));
    assert_true(wait_images(&r, "vis2"));

    char worker[64], code[64], decision[64], sent[4096], got[4096];
    const char *png = "data:image/png;base64," PNG_B64;
    /* vis1 dies before it answers: replayed on vis2 with the same bytes */
    atomic_store(&g_vis.mode, FAKE_DIE);
    assert_int_equal(chat(&r, png, false, worker, code), 200);
    assert_string_equal(worker, "vis2");
    assert_int_equal(atomic_load(&g_vis.chats), 1);
    assert_int_equal(atomic_load(&g_vis2.chats), 1);
    last_image_url(&g_vis, sent, sizeof sent);
    last_image_url(&g_vis2, got, sizeof got);
    assert_string_equal(sent, png);
    assert_string_equal(got, png);
    last_decision(&r, decision, sizeof decision);
    assert_string_equal(decision, "replay");

    /* a stream, nothing sent yet: replayed the same way (the native
     * path: the image's base64 beside the rendered prompt) */
    char prompt[2048], data[4096], want[2048];
    rh_wait_restarted(&r, "vis1", 0);
    assert_int_equal(chat(&r, png, true, worker, code), 200);
    assert_string_equal(code, "");
    assert_int_equal(atomic_load(&g_vis.completions), 1);
    assert_int_equal(atomic_load(&g_vis2.completions), 1);
    last_completion(&g_vis2, prompt, sizeof prompt, data, sizeof data);
    assert_string_equal(prompt, RENDERED_IMAGE);
    assert_string_equal(data, PNG_B64);
    answer_text(g_n_ans, want, sizeof want);
    assert_string_equal(g_text, want);
    assert_int_equal(g_dones, 1);

    /* a greedy stream that died after g_cut tokens: resumed on vis2, whose
     * prompt is the rendered chat and the text sent, with the same image;
     * the client has one stream of the whole answer, one [DONE] */
    rh_wait_restarted(&r, "vis1", 0);
    atomic_store(&g_vis.mode, FAKE_DIE_AFTER_TEXT);
    assert_int_equal(chat(&r, png, true, worker, code), 200);
    assert_string_equal(code, "");
    assert_string_equal(g_text, want);
    assert_int_equal(g_dones, 1);
    assert_int_equal(atomic_load(&g_vis2.completions), 2);
    last_completion(&g_vis2, prompt, sizeof prompt, data, sizeof data);
    char resumed[2048];
    snprintf(resumed, sizeof resumed, "%s", RENDERED_IMAGE);
    answer_text(g_cut, resumed + strlen(resumed), sizeof resumed - strlen(resumed));
    assert_string_equal(prompt, resumed);
    assert_string_equal(data, PNG_B64);
    last_decision(&r, decision, sizeof decision);
    assert_string_equal(decision, "resume");

    /* sampled: no other server can continue its random stream, and no
     * spillway worker takes an image: an error event ends it, and vis2
     * sees nothing */
    rh_wait_restarted(&r, "vis1", 0);
    g_temperature = 0.7;
    assert_int_equal(chat(&r, png, true, worker, code), 200);
    g_temperature = 0;
    assert_string_not_equal(code, "");
    assert_int_equal(g_dones, 1);
    assert_int_equal(atomic_load(&g_vis2.completions), 2);
    last_decision(&r, decision, sizeof decision);
    assert_string_equal(decision, "none (llama-server cannot continue it)");

    /* greedy, but the text sent does not tokenize back to the ids sent
     * (the server would continue from other tokens): vis2 is sent
     * nothing, and an error event ends the stream */
    rh_wait_restarted(&r, "vis1", 0);
    int templates2 = atomic_load(&g_vis2.templates);
    atomic_store(&g_vis.mode, FAKE_DIE_AFTER_ODD);
    assert_int_equal(chat(&r, png, true, worker, code), 200);
    assert_string_not_equal(code, "");
    assert_int_equal(g_dones, 1);
    answer_text(2, want, sizeof want);
    assert_string_equal(g_text, want);
    assert_int_equal(atomic_load(&g_vis2.templates), templates2);
    last_decision(&r, decision, sizeof decision);
    assert_string_equal(decision, "none (llama-server cannot continue it)");
    assert_int_equal(atomic_load(&g_vis2.completions), 2);

    rh_finish(&r);
    fake_stop(&g_vis);
    fake_stop(&g_vis2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_images_go_to_the_projector),
        cmocka_unit_test(test_no_projector),
        cmocka_unit_test(test_mmproj_argument),
        cmocka_unit_test(test_image_tokens),
        cmocka_unit_test(test_image_failover),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
