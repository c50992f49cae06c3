/* worker_embeddings.c - POST /v1/embeddings on the worker (docs/api.md,
 * Embeddings).
 *
 * The HTTP thread reads the body (api_embeddings.c tokenizes the inputs,
 * as the router counts them), checks every field with a typed 400 and
 * queues the request like a completion. The engine thread takes it when a
 * slot is free and runs it whole, between two batched steps: each input as
 * its own sequence in that slot (eng_embed), one after another, the KV
 * blocks of the longest input reserved first so a request that cannot fit
 * is refused (503 out_of_memory) before any work, as a prompt is. The
 * vectors go back in the request; the HTTP thread writes the answer, float
 * arrays or base64 (little-endian float32, what OpenAI's SDK decodes).
 *
 * While it runs, the other slots' generation waits: the step after it
 * goes on where they were. A request of many long inputs holds them for
 * its whole prefill.
 */
#include "worker/worker-impl.h"

#include "api/api_embeddings.h"
#include "common/alloc.h"
#include "device/fault.h"
#include "engine/embed.h"

#include <event2/http.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct wk_embed {
    api_embed_inputs in;
    int pooling;       /* eng_pooling: mean, cls or last */
    bool base64;
    int32_t dim;       /* n_embd */
    float *vectors;    /* (in.n, dim), written by the engine thread */
};

void wk__embed_free(wk_embed *e)
{
    if (!e)
        return;
    api_embed_inputs_free(&e->in);
    sw_free(e->vectors);
    sw_free(e);
}

int32_t wk__embed_prompt_tokens(const wk_embed *e)
{
    return e->in.n_tokens > INT32_MAX ? INT32_MAX : (int32_t)e->in.n_tokens;
}

/* The pooling this worker embeds with: --pooling, else the file's; -1
 * when neither gives one vector per text. */
static int worker_pooling(const wk_server *s)
{
    int p = s->o.pooling >= 0 ? s->o.pooling : eng_model_pooling(s->model);
    return p == ENG_POOLING_MEAN || p == ENG_POOLING_CLS || p == ENG_POOLING_LAST ? p : -1;
}

/* Everything but the input, then the input: false with *p set. */
static bool parse(wk_server *s, json_t *body, wk_embed *e, api_error *p)
{
    const eng_hparams *hp = eng_model_hparams(s->model);
    json_t *v = json_object_get(body, "model");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return api_bad(p, "model", "'model' must be a string");
        if (!wk__model_name_is(s, json_string_value(v))) {
            p->status = 404;
            p->code = "model_not_found";
            return api_bad(p, "model", "this worker serves '%s', not '%.200s'", s->model_id,
                           json_string_value(v));
        }
    }
    v = json_object_get(body, "encoding_format");
    if (v && !json_is_null(v)) {
        const char *f = json_string_value(v);
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            return api_bad(p, "encoding_format",
                           "'encoding_format' must be \"float\" or \"base64\"");
        e->base64 = !strcmp(f, "base64");
    }
    v = json_object_get(body, "dimensions");
    if (v && !json_is_null(v)) {
        /* the vector is the model's width; a model trained to be cut
         * shorter (Matryoshka) says so nowhere in a GGUF file, so no
         * other length is offered */
        if (!json_is_integer(v) || json_integer_value(v) != hp->n_embd)
            return api_bad(p, "dimensions",
                           "'dimensions' must be %d, this model's embedding width (it is not "
                           "trained to be cut shorter)", (int)hp->n_embd);
    }
    v = json_object_get(body, "user");
    if (v && !json_is_null(v) && !json_is_string(v))
        return api_bad(p, "user", "'user' must be a string");
    if (!eng_embed_supported(s->ctx)) {
        return api_bad(p, "model", "this worker runs every layer and the output head on its CUDA "
                                "device, where embeddings are not available; a split profile "
                                "(--gpu-layers below the model's layers) or a CPU worker serves "
                                "them");
    }
    e->pooling = worker_pooling(s);
    if (e->pooling < 0)
        return api_bad(p, "model",
                       "this model gives no embedding of a text: its file declares no pooling "
                       "(%s.pooling_type %s); start the worker with --pooling mean, cls or last",
                       hp->architecture, eng_pooling_name(eng_model_pooling(s->model)));
    if (!api_embed_inputs_parse(s->tok, body, &e->in, p))
        return false;
    for (int32_t i = 0; i < e->in.n; i++) {
        if (e->in.v[i].n_ids > s->n_ctx) {
            p->status = 400;
            p->code = "context_length_exceeded";
            return api_bad(p, "input", "input[%d] has %d tokens, over the context of %d tokens",
                           (int)i, (int)e->in.v[i].n_ids, (int)s->n_ctx);
        }
        for (int32_t t = 0; t < e->in.v[i].n_ids; t++)
            if (e->in.v[i].ids[t] >= hp->n_vocab)
                return api_bad(p, "input", "input[%d][%d] is token id %d, outside the model's "
                               "vocabulary of %d", (int)i, (int)t, (int)e->in.v[i].ids[t],
                               (int)hp->n_vocab);
    }
    e->dim = hp->n_embd;
    return true;
}

void wk__handle_embeddings(wk_server *s, struct evhttp_request *evreq)
{
    const char *hdr_id = evhttp_find_header(evhttp_request_get_input_headers(evreq),
                                            "X-Request-Id");
    long failures_before = sw_alloc_thread_failures();
    char id[72];
    api_error p;
    json_t *body = NULL;
    wk_req *r = sw_calloc(1, sizeof *r);

    wk__request_id(s, hdr_id, "embd", id, sizeof id);
    if (!r || !(r->embed = sw_calloc(1, sizeof *r->embed))) {
        wk__http_send_error(evreq, 500, "internal_error", NULL, id, "out of memory");
        goto fail;
    }
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->resp_id, sizeof r->resp_id, "%s", id);
    if (!(body = wk__http_read_body(s, evreq, id)))
        goto fail;
    memset(&p, 0, sizeof p);
    if (!json_is_object(body)) {
        wk__http_send_error(evreq, 400, "invalid_request", NULL, id,
                            "the body must be a JSON object");
        goto fail;
    }
    bool parsed = parse(s, body, r->embed, &p);
    if (!parsed || sw_alloc_thread_failures() != failures_before) {
        bool oom = sw_alloc_thread_failures() != failures_before || p.status == 500;
        wk__http_send_error(evreq, oom ? 500 : p.status ? p.status : 400,
                            oom ? "internal_error" : p.code ? p.code : "invalid_request",
                            oom ? NULL : p.param, id, oom ? "out of memory" : p.msg);
        goto fail;
    }
    r->n_prompt_client = wk__embed_prompt_tokens(r->embed);
    r->created = (int64_t)time(NULL);
    r->evreq = evreq;
    json_decref(body);
    if (wk__http_submit(s, r)) /* refused: answered there */
        wk_req_free(r);
    return;
fail:
    json_decref(body);
    wk_req_free(r);
}

int wk__embed_run(wk_server *s, wk_req *r, int32_t seq, sw_error *err)
{
    wk_embed *e = r->embed;
    int rc;
    size_t n = (size_t)e->in.n * (size_t)e->dim;
    if (!(e->vectors = sw_malloc(n * sizeof *e->vectors)))
        return sw_error_set(err, SW_ENOMEM, "out of host memory for %d embeddings", (int)e->in.n);
    eng_seq_clear(s->ctx, seq);
    /* the longest input's blocks first: a request that cannot fit is
     * refused before any work (each input's blocks return to the device
     * when it ends, and nothing else runs meanwhile) */
    if ((rc = eng_seq_reserve(s->ctx, seq, e->in.n_tokens_max, err)))
        return rc;
    for (int32_t i = 0; i < e->in.n; i++) {
        /* SPILLWAY_FAULT (device/fault.h): each input counts as one
         * output, so abort_after_tokens:0 crashes the worker mid-request */
        if ((rc = dev_fault_before_token(i))) {
            sw_error_set(err, rc, "the device failed (injected)");
            break;
        }
        /* a client that left stops the rest of its inputs */
        pthread_mutex_lock(&s->lock);
        bool cancelled = r->cancelled;
        pthread_mutex_unlock(&s->lock);
        if (cancelled) {
            rc = sw_error_set(err, SW_ECANCELLED, "cancelled");
            break;
        }
        if (i > 0 && (rc = eng_seq_reserve(s->ctx, seq, e->in.v[i].n_ids, err)))
            break;
        rc = eng_embed(s->ctx, seq, e->in.v[i].ids, e->in.v[i].n_ids, (eng_pooling)e->pooling,
                       e->vectors + (size_t)i * (size_t)e->dim, err);
        if (rc)
            break;
    }
    eng_seq_clear(s->ctx, seq);
    return rc;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* n floats as little-endian float32 bytes in base64 (sw_malloc; NULL out
 * of memory). */
static char *base64_floats(const float *v, int32_t n)
{
    size_t bytes = (size_t)n * 4, len = (bytes + 2) / 3 * 4;
    unsigned char *raw = sw_malloc(bytes);
    char *out = sw_malloc(len + 1);
    if (!raw || !out) {
        sw_free(raw);
        sw_free(out);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int b = 0; b < 4; b++)
            raw[(size_t)i * 4 + (size_t)b] = (unsigned char)(u >> (8 * b));
    }
    size_t o = 0;
    for (size_t i = 0; i < bytes; i += 3) {
        uint32_t w = (uint32_t)raw[i] << 16;
        if (i + 1 < bytes)
            w |= (uint32_t)raw[i + 1] << 8;
        if (i + 2 < bytes)
            w |= raw[i + 2];
        out[o++] = b64[(w >> 18) & 63];
        out[o++] = b64[(w >> 12) & 63];
        out[o++] = i + 1 < bytes ? b64[(w >> 6) & 63] : '=';
        out[o++] = i + 2 < bytes ? b64[w & 63] : '=';
    }
    out[o] = 0;
    sw_free(raw);
    return out;
}

json_t *wk__embed_answer(wk_server *s, const wk_req *r)
{
    const wk_embed *e = r->embed;
    if (!e->vectors)
        return NULL;
    json_t *data = json_array();
    bool ok = data != NULL;
    for (int32_t i = 0; ok && i < e->in.n; i++) {
        const float *vec = e->vectors + (size_t)i * (size_t)e->dim;
        json_t *emb;
        if (e->base64) {
            char *text = base64_floats(vec, e->dim);
            emb = text ? json_string(text) : NULL;
            sw_free(text);
        } else {
            emb = json_array();
            for (int32_t k = 0; emb && k < e->dim; k++)
                if (json_array_append_new(emb, json_real(vec[k]))) {
                    json_decref(emb);
                    emb = NULL;
                }
        }
        json_t *item = emb ? json_pack("{s:s, s:i, s:o}", "object", "embedding", "index", (int)i,
                                       "embedding", emb)
                           : NULL;
        ok = item && json_array_append_new(data, item) == 0;
    }
    json_t *out = ok ? json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data,
                                 "model", s->model_id, "usage", "prompt_tokens",
                                 (json_int_t)e->in.n_tokens, "total_tokens",
                                 (json_int_t)e->in.n_tokens)
                     : NULL;
    if (!ok)
        json_decref(data);
    return out;
}
