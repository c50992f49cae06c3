/* router_attempt.c - one attempt: one exchange with one upstream (a
 * spillway worker or a kind = openai engine), from the request to the
 * end of its answer, relayed to the sink as it comes, ending in an
 * outcome (router_failover.h) that says how it ended.
 */
#include "router/router_attempt.h"
#include "router/router_llamaserver.h"
#include "router/router_net.h"

#include "api/sse.h"
#include "common/alloc.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Cap on one SSE event from a worker (a token's chunk with logprobs is a
 * few KiB at most). */
#define RT_MAX_EVENT_BYTES ((size_t)4 << 20)

typedef enum { FAIL_NONE, FAIL_OOM, FAIL_CRASH, FAIL_BUSY, FAIL_CLIENT_GONE,
               FAIL_CONTEXT /* llama-server: the prompt is over its context */ } fail_kind;

/* Out-of-memory as other engines word it (kind = openai workers have no
 * typed error code): matched case-insensitively anywhere in the error
 * body or SSE error event. docs/router.md, External upstreams, lists them
 * with the engines that send them. */
static const char *const oom_patterns[] = {
    "out of memory",                 /* CUDA, vLLM "CUDA out of memory", llama.cpp */
    "failed to allocate",            /* llama.cpp / ggml buffers */
    "requires more system memory",   /* Ollama */
    "insufficient memory",           /* Metal, generic */
    "not enough memory",             /* generic, Windows */
    "cudamalloc failed",             /* ggml-cuda */
    "outofdevicememory",             /* Vulkan VK_ERROR_OUT_OF_DEVICE_MEMORY */
    "unable to allocate",            /* ROCm / HIP, numpy-style */
};

static bool text_says_oom(const char *text)
{
    if (!text)
        return false;
    for (size_t i = 0; i < sizeof oom_patterns / sizeof oom_patterns[0]; i++)
        if (strcasestr(text, oom_patterns[i]))
            return true;
    return false;
}

/* An external engine's failure (status >= 500 with text, or an SSE error
 * event's text): oom by the table above, busy for 503 (llama-server
 * "Loading model", overloaded), else a crash-like failure. */
static fail_kind classify_openai(rt_relay *r, const char *text, int status)
{
    /* llama-server's "Context size has been exceeded." is llama_decode
     * finding no room in the KV cache mid-generation: its memory */
    if (r->ls_kind && text && strcasestr(text, "context size has been exceeded"))
        r->ls_kv_full = true; /* its KV cache full: the server released the slots itself */
    if (text_says_oom(text) || r->ls_kv_full) {
        snprintf(r->phase, sizeof r->phase, "%s", r->content_sent ? "decode" : "generation");
        return FAIL_OOM;
    }
    if (status == 503) {
        snprintf(r->phase, sizeof r->phase, "admission");
        return FAIL_BUSY;
    }
    snprintf(r->phase, sizeof r->phase, "generation");
    return FAIL_CRASH;
}

/* Classifies a worker's error object: oom, busy (admission refusals that
 * another worker may not have) or a crash-like server failure. */
static fail_kind classify_error(json_t *err, rt_relay *r)
{
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *phase = json_string_value(json_object_get(err, "phase"));
    if (code && !strcmp(code, "out_of_memory")) {
        snprintf(r->phase, sizeof r->phase, "%s", phase ? phase : "unknown");
        return FAIL_OOM;
    }
    if (code && (!strcmp(code, "worker_full") || !strcmp(code, "capacity_exceeded") ||
                 !strcmp(code, "not_ready") || !strcmp(code, "draining"))) {
        /* worker_full: the worker's own admission refused it at once,
         * before any work (its slots and queue taken, or its KV memory) */
        const char *reason = json_string_value(json_object_get(err, "reason"));
        r->worker_full_memory = !strcmp(code, "worker_full") && reason && !strcmp(reason, "memory");
        snprintf(r->phase, sizeof r->phase, "admission");
        return FAIL_BUSY;
    }
    snprintf(r->phase, sizeof r->phase, "generation");
    return FAIL_CRASH;
}

/* Whether a chat chunk holds anything besides its delta's role: text, a
 * tool call, a finish reason, usage or token ids. */
static bool event_says_more(json_t *j, json_t *choice, json_t *delta)
{
    json_t *content = json_object_get(delta, "content");
    json_t *finish = json_object_get(choice, "finish_reason");
    return (json_is_string(content) && json_string_length(content) > 0) ||
           json_array_size(json_object_get(delta, "tool_calls")) > 0 ||
           (finish && !json_is_null(finish)) || json_is_object(json_object_get(j, "usage")) ||
           json_array_size(json_object_get(json_object_get(j, "spillway"), "token_ids")) > 0;
}

/* The router ran out of memory relaying a stream (its own memory, not the
 * worker's fault): the stream ends here with the error, and nothing is
 * retried (a resume from what the router could not keep would not be the
 * same stream). */
static fail_kind stream_out_of_memory(rt_relay *r, json_t *j, bool *done)
{
    json_decref(j);
    rt_sink_stream_error(r, NULL);
    *done = true;
    return FAIL_CLIENT_GONE;
}

/* Relays one SSE payload; returns FAIL_NONE to go on, or how it ended. */
static fail_kind stream_payload(rt_relay *r, const char *payload, bool *done)
{
    if (!strcmp(payload, "[DONE]")) {
        *done = true;
        if (rt_sink_event(r, "[DONE]") || rt_sink_chunk(r, "", 0))
            return FAIL_CLIENT_GONE;
        r->finished = true;
        return FAIL_NONE;
    }
    json_error_t jerr;
    json_t *j = sw_json_loads(payload, JSON_ALLOW_NUL, &jerr);
    if (!j && sw_json_error_oom(&jerr))
        return stream_out_of_memory(r, NULL, done);
    if (!j)
        return FAIL_CRASH;
    fail_kind fk = FAIL_NONE;
    json_t *err = json_object_get(j, "error");
    if (err && r->openai) {
        fk = classify_openai(r, payload, 500);
        if (fk == FAIL_BUSY)
            fk = FAIL_CRASH;
        json_decref(j);
        *done = true;
        return fk;
    }
    if (err) {
        fk = classify_error(err, r);
        if (fk == FAIL_BUSY)
            fk = FAIL_CRASH;
        json_decref(j);
        *done = true;
        return fk;
    }
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    json_t *delta = json_object_get(choice, "delta");
    bool role_dropped = false;
    json_int_t index = json_integer_value(json_object_get(choice, "index"));
    uint32_t role_bit = index > 0 && index < 32 ? 1u << index : 1u;
    if (r->chat && json_object_get(delta, "role")) {
        if (r->roles_sent & role_bit) {
            /* the client has the role already: a resumed worker's first
             * chunk says it again (and nothing else: dropped), and some
             * engines (Ollama) say it in every chunk, whose text must
             * still go through */
            json_object_del(delta, "role");
            if (!event_says_more(j, choice, delta)) {
                json_decref(j);
                return FAIL_NONE;
            }
            role_dropped = true;
        } else {
            r->roles_sent |= role_bit;
        }
    }
    json_t *sp = json_object_get(j, "spillway");
    json_t *usage = json_object_get(j, "usage");
    char *rewritten = role_dropped ? sw_json_dumps(j, JSON_COMPACT) : NULL;
    if (json_is_object(usage) && r->resume_base > 0) {
        /* a resumed worker counts only its new tokens */
        json_int_t base = (json_int_t)r->resume_base;
        json_object_set_new(usage, "completion_tokens",
                            json_integer(json_integer_value(json_object_get(usage, "completion_tokens")) + base));
        json_object_set_new(usage, "total_tokens",
                            json_integer(json_integer_value(json_object_get(usage, "total_tokens")) + base));
        free(rewritten);
        rewritten = sw_json_dumps(j, JSON_COMPACT);
        if (!rewritten)
            return stream_out_of_memory(r, j, done);
    }
    if (role_dropped && !rewritten)
        return stream_out_of_memory(r, j, done);
    int sent = rt_sink_event(r, rewritten ? rewritten : payload);
    free(rewritten);
    if (sent) {
        json_decref(j);
        return FAIL_CLIENT_GONE;
    }
    /* what the client has: a resumed worker gives back text the failed one
     * held (a possible stop string) from this count on */
    json_t *text = r->chat ? json_object_get(delta, "content") : json_object_get(choice, "text");
    json_t *thought = r->chat ? json_object_get(delta, "reasoning_content") : NULL;
    /* a worker that splits a reply's thought off says how many of the
     * engine's text bytes the chunk stands for (tags and white space it
     * holds or drops make the deltas differ): one token's text, which the
     * worker's engine caps at 4096 bytes; a larger claim is not believed */
    json_t *engine_bytes = json_object_get(sp, "text_bytes");
    if (json_is_integer(engine_bytes) && json_integer_value(engine_bytes) >= 0 &&
        json_integer_value(engine_bytes) <= 4096)
        r->text_bytes += (size_t)json_integer_value(engine_bytes);
    else if (json_is_string(text))
        r->text_bytes += json_string_length(text);
    if ((json_is_string(text) && json_string_length(text) > 0) ||
        (json_is_string(thought) && json_string_length(thought) > 0) ||
        json_array_size(json_object_get(delta, "tool_calls")) > 0) {
        r->content_sent = true;
        if (r->ttft < 0) /* an engine without token_ids: the first text */
            r->ttft = rt__now_s() - r->t_start;
    }
    json_t *ids = json_object_get(sp, "token_ids");
    if (r->ttft < 0 && json_array_size(ids) > 0)
        r->ttft = rt__now_s() - r->t_start;
    json_t *pt = json_object_get(sp, "prefix_tokens");
    if (!r->shared_noted && json_is_integer(pt) && r->prefix) {
        /* the prompt is computed: its cached blocks count once */
        r->shared_noted = true;
        r->shared_moved = rt_queue_shared_attach(&r->q->rt->queue, r->attempt_worker, r->prefix,
                                                 r->n_prefix, (int64_t)json_integer_value(pt),
                                                 &r->shared_registered);
    }
    for (size_t i = 0; i < json_array_size(ids); i++) {
        if (r->n_tokens == r->cap_tokens) {
            size_t nc = r->cap_tokens ? r->cap_tokens * 2 : 256;
            int32_t *nt = sw_realloc(r->tokens, nc * sizeof *nt);
            if (!nt) /* a resume would miss this token */
                return stream_out_of_memory(r, j, done);
            r->tokens = nt;
            r->cap_tokens = nc;
        }
        r->tokens[r->n_tokens++] = (int32_t)json_integer_value(json_array_get(ids, i));
    }
    if (json_is_integer(json_object_get(sp, "draws")))
        r->draws = json_integer_value(json_object_get(sp, "draws"));
    json_decref(j);
    return FAIL_NONE;
}

/* One native event of a llama-server stream: translated into the
 * chunks the client asked for, each relayed as a spillway worker's
 * (router_llamaserver.c). */
static fail_kind native_payload(rt_relay *r, const char *payload, bool *done)
{
    char *out[RT_LS_MAX_OUT];
    int n = 0;
    char etext[512];
    int rc = rt__ls_translate(r, payload, out, &n, etext, sizeof etext);
    fail_kind fk = FAIL_NONE;
    for (int i = 0; i < n; i++) {
        if (fk == FAIL_NONE && !*done)
            fk = stream_payload(r, out[i], done);
        free(out[i]);
    }
    if (fk != FAIL_NONE || *done)
        return fk;
    if (rc == 1) {
        fk = classify_openai(r, etext, 500);
        *done = true;
        return fk == FAIL_BUSY ? FAIL_CRASH : fk;
    }
    if (rc < 0) {
        snprintf(r->phase, sizeof r->phase, "generation");
        *done = true;
        return FAIL_CRASH;
    }
    return FAIL_NONE;
}

/* usage.completion_tokens of a JSON answer, found without parsing it
 * (the last such key: usage comes after the choices, whose text is a
 * JSON string and so cannot hold the key's quotes unescaped); 0 when
 * absent. */
static size_t completion_tokens(const char *resp, size_t len)
{
    static const char key[] = "\"completion_tokens\"";
    const char *at = NULL;
    for (const char *p = resp; (p = memmem(p, len - (size_t)(p - resp), key, sizeof key - 1));
         p += sizeof key - 1)
        at = p;
    if (!at)
        return 0;
    at += sizeof key - 1;
    while (at < resp + len && (*at == ' ' || *at == ':'))
        at++;
    long long v = at < resp + len ? strtoll(at, NULL, 10) : 0;
    return v > 0 ? (size_t)v : 0;
}

/* One exchange with worker w (the books hold its reservation; the caller
 * gives it back). */
static fail_kind attempt_run(rt_relay *r, const rt_worker *w, uint64_t generation,
                             const char *body, size_t body_len)
{
    rn_conn c;
    char hdr[256];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", r->q->request_id);
    const char *path = r->q->embeddings ? "/v1/embeddings"
                       : r->chat        ? "/v1/chat/completions"
                                        : "/v1/completions";
    r->openai = RT_KIND_EXTERNAL(w->cfg.kind);
    r->ls_kind = w->cfg.kind == RT_KIND_LLAMA_SERVER;
    r->ls_native = false;
    r->refused_context = false;
    r->ls_kv_full = false;
    char *native = NULL;
    if (r->ls_kind && r->stream) {
        /* a stream on a llama-server whose vocabulary is the model's: its
         * native endpoint, whose events carry the token ids */
        pthread_mutex_lock(&r->q->rt->pool.mu);
        bool same = w->ls_vocab_same;
        pthread_mutex_unlock(&r->q->rt->pool.mu);
        char why[160] = "its vocabulary differs from the model's (or was not checked yet)";
        int nr = same ? rt__ls_native_body(r, w->address, body, body_len, &native, why, sizeof why)
                      : 1;
        if (nr == -2)
            return FAIL_CLIENT_GONE;
        if (nr == -1) {
            snprintf(r->phase, sizeof r->phase, "before_response");
            SW_WARN("router", "request %s: worker %s: %s", r->q->request_id, w->cfg.name, why);
            return FAIL_CRASH;
        }
        if (nr == 1 && r->resume_base > 0) {
            /* a resume it cannot take natively (its vocabulary unchecked
             * since a restart): its OpenAI endpoint would start over, so
             * the attempt fails before any work and the stream goes on
             * elsewhere */
            snprintf(r->phase, sizeof r->phase, "before_response");
            SW_WARN("router", "request %s: worker %s cannot take the resume: %s",
                    r->q->request_id, w->cfg.name, why);
            return FAIL_CRASH;
        }
        if (nr == 0) {
            path = "/completion";
            body = native;
            body_len = strlen(native);
            rt__ls_stream_begin(r);
        } else {
            SW_DEBUG("router", "request %s: worker %s: the OpenAI endpoint (not resumable): %s",
                     r->q->request_id, w->cfg.name, why);
        }
    }
    /* an idle connection to this worker process when there is one; an
     * external engine gets one of its own per request (docs/router.md,
     * Worker connections) */
    rn_target up = {w->address, generation, w->cfg.max_seqs > 0 ? w->cfg.max_seqs : 8,
                    !r->openai};
    /* no client socket (a job): the job runners' cancel pipe, so a shutdown
     * aborts the worker request (router_jobs.c, rt__jobs_cancel) */
    int rc = rn_request_pooled(&c, &up, "POST", path, hdr, body, body_len,
                               r->q->fd >= 0 ? r->q->fd : rt__job_cancel_fd,
                               r->q->rt->cfg->http_timeout_s * 1000);
    fail_kind fk = FAIL_NONE;
    snprintf(r->phase, sizeof r->phase, "connect");
    if (rc == -2) {
        fk = FAIL_CLIENT_GONE;
        goto out;
    }
    if (rc != 0) {
        if (rc == -3)
            snprintf(r->phase, sizeof r->phase, "before_response");
        fk = FAIL_CRASH;
        goto out;
    }
    if (c.status < 200 || c.status > 599) {
        /* no final HTTP status (a 1xx, which nothing here asked for, or no
         * number at all): a broken worker, whose answer is never relayed
         * to the client as one */
        snprintf(r->phase, sizeof r->phase, "before_response");
        fk = FAIL_CRASH;
        goto out;
    }
    if (c.status != 200 || !r->stream) {
        char *resp = NULL;
        size_t len = 0;
        int br = rn_body_all(&c, &resp, &len, (size_t)256 << 20);
        if (br == -2) {
            fk = FAIL_CLIENT_GONE;
            goto out;
        }
        if (br != 0) {
            snprintf(r->phase, sizeof r->phase, "generation");
            fk = FAIL_CRASH;
            goto out;
        }
        if (r->ls_kind && c.status == 400 && rt__ls_context_error(resp, &r->refused_n_ctx)) {
            /* its context is smaller than the router counted: another
             * worker may take it (router_relay.c) */
            r->refused_context = true;
            snprintf(r->phase, sizeof r->phase, "admission");
            fk = FAIL_CONTEXT;
            sw_free(resp);
            goto out;
        }
        if (c.status >= 500) {
            if (r->openai) {
                fk = classify_openai(r, resp, c.status);
                sw_free(resp);
                goto out;
            }
            json_t *j = sw_json_loads(resp, 0, NULL);
            fk = classify_error(json_object_get(j, "error"), r);
            json_decref(j);
            sw_free(resp);
            goto out;
        }
        if (r->headers_sent) {
            /* a resumed stream refused with a 4xx: the client already has
             * a stream, so the error ends it as an event (never retried) */
            json_t *j = sw_json_loads(resp, 0, NULL);
            char *e = j && json_object_get(j, "error") ? sw_json_dumps(j, JSON_COMPACT) : NULL;
            json_decref(j);
            if (!e) {
                json_t *eo = rt__error_obj(500, "worker_failed", "the worker refused the resume", NULL);
                e = sw_json_dumps(eo, JSON_COMPACT);
                json_decref(eo);
            }
            if (e && (rt_sink_event(r, e) || rt_sink_event(r, "[DONE]") || rt_sink_chunk(r, "", 0)))
                fk = FAIL_CLIENT_GONE;
            free(e);
            sw_free(resp);
            goto out; /* the stream ended with the worker's error (never retried) */
        }
        /* success or a client error: relayed as is, never retried */
        r->n_tokens = c.status == 200 ? completion_tokens(resp, len) : 0;
        r->status = c.status;
        rt__send_response(r->q, c.status, c.content_type[0] ? c.content_type : "application/json",
                      NULL, resp, len);
        sw_free(resp);
        r->finished = true;
        goto out;
    }
    /* SSE: split the de-chunked body into events */
    char *acc = NULL;
    size_t acc_len = 0, acc_cap = 0;
    bool done = false;
    char buf[8192];
    while (!done) {
        long n = rn_body(&c, buf, sizeof buf);
        if (n == -2) {
            fk = FAIL_CLIENT_GONE;
            break;
        }
        if (n <= 0) {
            snprintf(r->phase, sizeof r->phase, "generation");
            fk = FAIL_CRASH; /* the stream ended without [DONE] */
            break;
        }
        if (acc_len + (size_t)n > RT_MAX_EVENT_BYTES) {
            /* no event is that long: a broken worker */
            snprintf(r->phase, sizeof r->phase, "generation");
            fk = FAIL_CRASH;
            break;
        }
        if (acc_len + (size_t)n + 1 > acc_cap) {
            size_t nc = (acc_len + (size_t)n + 1) * 2;
            char *na = sw_realloc(acc, nc);
            if (!na) {
                fk = FAIL_CRASH;
                break;
            }
            acc = na;
            acc_cap = nc;
        }
        memcpy(acc + acc_len, buf, (size_t)n);
        acc_len += (size_t)n;
        acc[acc_len] = 0;
        char *start = acc;
        api_sse_event ev;
        while (!done && api_sse_next(start, acc_len - (size_t)(start - acc), &ev)) {
            start[ev.text_len] = 0; /* the payload as a string */
            if (ev.data && memchr(ev.data, 0, ev.data_len)) {
                fk = FAIL_CRASH; /* a NUL in a payload: not JSON, not a prefix of it */
                done = true;
            } else if (ev.data) {
                fk = r->ls_native ? native_payload(r, (char *)ev.data, &done)
                                  : stream_payload(r, (char *)ev.data, &done);
                if (fk != FAIL_NONE)
                    done = true;
            }
            start += ev.consumed;
        }
        size_t rest = acc_len - (size_t)(start - acc);
        memmove(acc, start, rest);
        acc_len = rest;
    }
    sw_free(acc);
    if (fk == FAIL_NONE && done)
        rn_body_drain(&c, 1000); /* the last chunk, so the connection can be reused */
out:
    rn_release(&c); /* reused only when the response was read to its end */
    free(native);
    return fk;
}


rt_outcome rt_attempt_run(rt_relay *r, int wi, uint64_t generation, const char *body, size_t len,
                          bool *refused_memory)
{
    /* the configuration and address do not change while the router runs */
    const rt_worker *w = &r->q->rt->pool.w[wi];
    *refused_memory = false;
    r->worker_full_memory = false;
    fail_kind fk = attempt_run(r, w, generation, body, len);
    switch (fk) {
    case FAIL_NONE:
        return r->finished && r->status != 200 ? RT_OUT_CLIENT_ERROR : RT_OUT_OK;
    case FAIL_CLIENT_GONE:
        return RT_OUT_CLIENT_GONE;
    case FAIL_BUSY:
        *refused_memory = r->worker_full_memory;
        return RT_OUT_REFUSED;
    case FAIL_CONTEXT: /* r->refused_context says which */
        return RT_OUT_REFUSED;
    case FAIL_OOM:
        if (!strcmp(r->phase, "admission")) {
            *refused_memory = true; /* refused before any work */
            return RT_OUT_REFUSED;
        }
        return RT_OUT_OOM;
    case FAIL_CRASH:
        break;
    }
    return RT_OUT_CRASH;
}
