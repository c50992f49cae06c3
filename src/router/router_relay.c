/* router_relay.c - one generation request from admission to its end:
 * the exact prompt token count, the choice of worker (preference order,
 * limits, free memory, deadline, bounded queue), the relay of the answer
 * or the SSE stream, and the failover: replay from the start or resume a
 * stream after the tokens already sent (DESIGN.md's replay table).
 */
#include "router/router-impl.h"
#include "router/router_net.h"
#include "worker/worker.h"

#include "common/alloc.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void hist_add(uint64_t *buckets, uint64_t *count, double *sum, double v)
{
    int i = 0;
    while (i < 11 && v > rt__hist_le[i])
        i++;
    buckets[i]++;
    (*count)++;
    *sum += v;
}

/* ---- admission --------------------------------------------------------- */

/* Exact prompt tokens as the worker will count them, or -1 when the body
 * cannot be tokenized here (the worker then validates and answers). */
static long count_prompt(json_t *body, bool chat)
{
    int32_t *ids = NULL;
    size_t n = 0;
    long result = -1;
    if (!chat) {
        json_t *p = json_object_get(body, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1 &&
            (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
            p = json_array_get(p, 0);
        if (json_is_array(p)) /* token ids, as the worker takes them */
            return json_array_size(p) > 0 ? (long)json_array_size(p) : -1;
        if (!json_is_string(p))
            return -1;
        if (eng_tokenize(rt__g.tok, json_string_value(p), json_string_length(p),
                         eng_tokenizer_add_bos(rt__g.tok), false, &ids, &n, NULL) == 0)
            result = (long)n;
        sw_free(ids);
        return result;
    }
    /* the worker's own rendering: template, tool definitions, tool calls
     * and results, content parts (worker.h) */
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0 || json_array_size(msgs) > 100000)
        return -1;
    if (wk_chat_prompt_tokens(rt__g.tok, rt__g.family, body, &n) == SW_OK)
        result = (long)n;
    return result;
}

enum { SKIP_NONE = 0, SKIP_CTX = 1, SKIP_MEM = 2, SKIP_DEADLINE = 4, SKIP_DOWN = 8 };

/* The first worker in preference order, not yet tried, that is ready,
 * fits the need and is predicted to meet the deadline. With a deadline, a
 * worker that reports no rates (start-up calibration off, a kind = openai
 * engine) cannot be predicted at all: it may be a slow cold CPU. It is
 * kept as a fallback, taken (the first such in preference order) only
 * when no worker with rates is predicted to meet the deadline
 * (docs/router.md, Admission and routing: Deadline). */
static int pick_worker(const bool *tried, bool need_resume, long prompt, long max_tokens,
                       long long deadline_ms, int *skipped, double *best_pred_ms)
{
    int found = -1, unknown_rates = -1;
    *skipped = 0;
    *best_pred_ms = -1;
    pthread_mutex_lock(&rt__g.mu);
    for (int k = 0; k < rt__g.n && found < 0; k++) {
        int i = rt__g.order[k];
        rt_worker *w = &rt__g.w[i];
        if (tried[i])
            continue;
        if (w->state != WS_READY) {
            *skipped |= SKIP_DOWN;
            continue;
        }
        if (w->cfg.kind == RT_KIND_OPENAI) {
            if (need_resume)
                continue; /* an external engine cannot resume a stream */
            /* no memory figures: only the configured number of sequences */
            if (w->cfg.max_seqs > 0 && w->inflight >= w->cfg.max_seqs) {
                *skipped |= SKIP_MEM;
                continue;
            }
        }
        long total = prompt < 0 ? 0 : prompt;
        if (w->ctx_limit > 0 && prompt >= w->ctx_limit) {
            *skipped |= SKIP_CTX;
            continue;
        }
        long gen = max_tokens;
        if (w->ctx_limit > 0 && (gen < 0 || total + gen > w->ctx_limit))
            gen = w->ctx_limit - total;
        if (gen < 0)
            gen = 0;
        if (w->on_device && w->kv_bpt > 0 && prompt >= 0) {
            double need = (double)(total + gen) * (double)w->kv_bpt;
            if (need > (double)w->mem_free) {
                *skipped |= SKIP_MEM;
                continue;
            }
        }
        if (deadline_ms >= 0 && w->prefill_rate > 0 && w->decode_rate > 0) {
            double pred = ((double)total / w->prefill_rate + (double)gen / w->decode_rate) * 1000;
            if (*best_pred_ms < 0 || pred < *best_pred_ms)
                *best_pred_ms = pred;
            if (pred > (double)deadline_ms) {
                *skipped |= SKIP_DEADLINE;
                continue;
            }
        } else if (deadline_ms >= 0) {
            if (unknown_rates < 0)
                unknown_rates = i;
            continue;
        }
        found = i;
    }
    /* The chosen worker's slot is taken under the same lock that checked
     * it, so two requests cannot both pass a max-seqs of 1 (attempt()
     * gives it back; release_worker when no attempt follows). */
    int chosen = found >= 0 ? found : unknown_rates;
    if (chosen >= 0)
        rt__g.w[chosen].inflight++;
    pthread_mutex_unlock(&rt__g.mu);
    return chosen;
}

/* Gives back the slot pick_worker took when no attempt follows. */
static void release_worker(int wi)
{
    pthread_mutex_lock(&rt__g.mu);
    rt__g.w[wi].inflight--;
    pthread_mutex_unlock(&rt__g.mu);
}

/* ---- dispatch, relay, failover ---------------------------------------- */

/* Cap on one SSE event from a worker (a token's chunk with logprobs is a
 * few KiB at most). */
#define RT_MAX_EVENT_BYTES ((size_t)4 << 20)

typedef enum { FAIL_NONE, FAIL_OOM, FAIL_CRASH, FAIL_BUSY, FAIL_CLIENT_GONE } fail_kind;

typedef struct relay {
    rt_req *q;
    bool chat, stream;
    bool headers_sent, role_sent, finished;
    int32_t *tokens;
    size_t n_tokens, cap_tokens;
    long long draws;     /* -1 unknown */
    char phase[32];
    char final_worker[64]; /* where the last attempt ran */
    bool client_gone;
    size_t resume_base;    /* tokens sent before this attempt (a resume) */
    size_t text_bytes;     /* completion text the client got (resume.text_bytes) */
    double t_start;        /* monotonic, when the request was read */
    double ttft;           /* seconds to the first token sent, -1 before */
    int status;            /* HTTP status relayed to the client */
    bool content_sent;     /* completion text or a tool call reached the client */
    bool openai;           /* this attempt is on a kind = openai engine */
} relay;

static int client_chunk(relay *r, const char *data, size_t len)
{
    char hex[32];
    int n = snprintf(hex, sizeof hex, "%zx\r\n", len);
    if (rt__sink_write(r->q, hex, (size_t)n) || rt__sink_write(r->q, data, len) ||
        rt__sink_write(r->q, "\r\n", 2))
        return -1;
    if (len == 0)
        rt__chunked_end(r->q); /* the last chunk */
    return 0;
}

/* An agent run's streamed generation (router_agent.c, rt_req.on_event)
 * has no client socket: its filter decides what of each event the client
 * sees. */
static int event_to_agent(relay *r, const char *payload)
{
    return r->q->on_event(r->q, payload);
}

static int client_event(relay *r, const char *payload)
{
    if (!r->headers_sent) {
        char head[600];
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                         "Connection: %s\r\nX-Request-Id: %s\r\nX-Spillway-Worker: %s\r\n"
                         "X-Spillway-Attempts: %d\r\n\r\n",
                         rt__conn_hdr(r->q), r->q->request_id, r->q->worker, r->q->attempts);
        rt__chunked_begin(r->q);
        if (rt__sink_write(r->q, head, (size_t)n))
            return -1;
        r->headers_sent = true;
        r->status = 200;
        if (r->q->cap.on) {
            r->q->cap.status = 200;
            r->q->cap.stream = true;
            r->q->cap.len = 0;
            snprintf(r->q->cap.content_type, sizeof r->q->cap.content_type, "text/event-stream");
        }
    }
    size_t len = strlen(payload);
    char *ev = sw_malloc(len + 9);
    if (!ev)
        return -1;
    memcpy(ev, "data: ", 6);
    memcpy(ev + 6, payload, len);
    memcpy(ev + 6 + len, "\n\n", 2);
    if (r->q->cap.on)
        rt__capture_append(&r->q->cap, ev, len + 8);
    int rc = r->q->on_event ? event_to_agent(r, payload) : client_chunk(r, ev, len + 8);
    sw_free(ev);
    return rc;
}

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
static fail_kind classify_openai(relay *r, const char *text, int status)
{
    if (text_says_oom(text)) {
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
static fail_kind classify_error(json_t *err, relay *r)
{
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *phase = json_string_value(json_object_get(err, "phase"));
    if (code && !strcmp(code, "out_of_memory")) {
        snprintf(r->phase, sizeof r->phase, "%s", phase ? phase : "unknown");
        return FAIL_OOM;
    }
    if (code && (!strcmp(code, "capacity_exceeded") || !strcmp(code, "not_ready") ||
                 !strcmp(code, "draining"))) {
        snprintf(r->phase, sizeof r->phase, "admission");
        return FAIL_BUSY;
    }
    snprintf(r->phase, sizeof r->phase, "generation");
    return FAIL_CRASH;
}

/* Relays one SSE payload; returns FAIL_NONE to go on, or how it ended. */
static fail_kind stream_payload(relay *r, const char *payload, bool *done)
{
    if (!strcmp(payload, "[DONE]")) {
        *done = true;
        if (client_event(r, "[DONE]") || client_chunk(r, "", 0))
            return FAIL_CLIENT_GONE;
        r->finished = true;
        return FAIL_NONE;
    }
    json_t *j = json_loads(payload, 0, NULL);
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
    if (r->chat && json_object_get(delta, "role")) {
        if (r->role_sent) {
            json_decref(j);
            return FAIL_NONE;
        }
        r->role_sent = true;
    }
    json_t *sp = json_object_get(j, "spillway");
    json_t *usage = json_object_get(j, "usage");
    char *rewritten = NULL;
    if (json_is_object(usage) && r->resume_base > 0) {
        /* a resumed worker counts only its new tokens */
        json_int_t base = (json_int_t)r->resume_base;
        json_object_set_new(usage, "completion_tokens",
                            json_integer(json_integer_value(json_object_get(usage, "completion_tokens")) + base));
        json_object_set_new(usage, "total_tokens",
                            json_integer(json_integer_value(json_object_get(usage, "total_tokens")) + base));
        rewritten = json_dumps(j, JSON_COMPACT);
    }
    int sent = client_event(r, rewritten ? rewritten : payload);
    free(rewritten);
    if (sent) {
        json_decref(j);
        return FAIL_CLIENT_GONE;
    }
    /* what the client has: a resumed worker gives back text the failed one
     * held (a possible stop string) from this count on */
    json_t *text = r->chat ? json_object_get(delta, "content") : json_object_get(choice, "text");
    if (json_is_string(text))
        r->text_bytes += json_string_length(text);
    if ((json_is_string(text) && json_string_length(text) > 0) ||
        json_array_size(json_object_get(delta, "tool_calls")) > 0) {
        r->content_sent = true;
        if (r->ttft < 0) /* an engine without token_ids: the first text */
            r->ttft = rt__now_s() - r->t_start;
    }
    json_t *ids = json_object_get(sp, "token_ids");
    if (r->ttft < 0 && json_array_size(ids) > 0)
        r->ttft = rt__now_s() - r->t_start;
    for (size_t i = 0; i < json_array_size(ids); i++) {
        if (r->n_tokens == r->cap_tokens) {
            size_t nc = r->cap_tokens ? r->cap_tokens * 2 : 256;
            int32_t *nt = sw_realloc(r->tokens, nc * sizeof *nt);
            if (!nt)
                break;
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

/* One attempt on worker w, whose slot (inflight) pick_worker took; gives
 * it back. Fills *resp_status for a response relayed as is (4xx,
 * success). */
static fail_kind attempt(relay *r, rt_worker *w, const char *body, size_t body_len)
{
    rn_conn c;
    char hdr[256];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", r->q->request_id);
    const char *path = r->chat ? "/v1/chat/completions" : "/v1/completions";
    r->openai = w->cfg.kind == RT_KIND_OPENAI;
    /* an idle connection to this worker process when there is one; an
     * external engine gets one of its own per request (docs/router.md,
     * Worker connections) */
    rn_target up = {w->address, 0, w->cfg.max_seqs > 0 ? w->cfg.max_seqs : 8, !r->openai};
    pthread_mutex_lock(&rt__g.mu);
    up.generation = (uint64_t)(uint32_t)w->restarts << 32 | (uint32_t)w->pid;
    pthread_mutex_unlock(&rt__g.mu);
    /* no client socket (a job): the job runners' cancel pipe, so a shutdown
     * aborts the worker request (router_jobs.c, rt__jobs_cancel) */
    int rc = rn_request_pooled(&c, &up, "POST", path, hdr, body, body_len,
                               r->q->fd >= 0 ? r->q->fd : rt__job_cancel_fd,
                               rt__g.cfg->http_timeout_s * 1000);
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
        if (c.status >= 500) {
            if (r->openai) {
                fk = classify_openai(r, resp, c.status);
                sw_free(resp);
                goto out;
            }
            json_t *j = json_loads(resp, 0, NULL);
            fk = classify_error(json_object_get(j, "error"), r);
            json_decref(j);
            sw_free(resp);
            goto out;
        }
        if (r->headers_sent) {
            /* a resumed stream refused with a 4xx: the client already has
             * a stream, so the error ends it as an event (never retried) */
            json_t *j = json_loads(resp, 0, NULL);
            char *e = j && json_object_get(j, "error") ? json_dumps(j, JSON_COMPACT) : NULL;
            json_decref(j);
            if (!e) {
                json_t *eo = rt__error_obj(500, "worker_failed", "the worker refused the resume", NULL);
                e = json_dumps(eo, JSON_COMPACT);
                json_decref(eo);
            }
            if (e && (client_event(r, e) || client_event(r, "[DONE]") || client_chunk(r, "", 0)))
                fk = FAIL_CLIENT_GONE;
            free(e);
            sw_free(resp);
            pthread_mutex_lock(&rt__g.mu);
            w->req_client_error++;
            pthread_mutex_unlock(&rt__g.mu);
            goto out;
        }
        /* success or a client error: relayed as is, never retried */
        json_t *j = json_loads(resp, 0, NULL);
        long long toks = json_integer_value(
            json_object_get(json_object_get(j, "usage"), "completion_tokens"));
        json_decref(j);
        pthread_mutex_lock(&rt__g.mu);
        if (c.status == 200) {
            w->req_ok++;
            w->tokens += (uint64_t)toks;
        } else {
            w->req_client_error++;
        }
        pthread_mutex_unlock(&rt__g.mu);
        r->n_tokens = (size_t)toks;
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
        char *sep;
        while (!done && (sep = strstr(start, "\n\n"))) {
            *sep = 0;
            if (!strncmp(start, "data: ", 6)) {
                fk = stream_payload(r, start + 6, &done);
                if (fk != FAIL_NONE)
                    done = true;
            }
            start = sep + 2;
        }
        size_t rest = acc_len - (size_t)(start - acc);
        memmove(acc, start, rest);
        acc_len = rest;
    }
    sw_free(acc);
    if (r->finished) {
        pthread_mutex_lock(&rt__g.mu);
        w->req_ok++;
        w->tokens += r->n_tokens;
        pthread_mutex_unlock(&rt__g.mu);
    }
    if (fk == FAIL_NONE && done)
        rn_body_drain(&c, 1000); /* the last chunk, so the connection can be reused */
out:
    rn_release(&c); /* reused only when the response was read to its end */
    pthread_mutex_lock(&rt__g.mu);
    w->inflight--;
    pthread_mutex_unlock(&rt__g.mu);
    return fk;
}

/* Nesting depth of a JSON text (brackets outside strings), so a deeply
 * nested body is refused before the parser recurses into it. */
static int json_depth(const char *s, size_t n)
{
    int depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '{' || ch == '[') {
            if (++depth > max)
                max = depth;
        } else if (ch == '}' || ch == ']') {
            depth--;
        }
    }
    return max;
}

#define RT_MAX_JSON_DEPTH 32

void rt__handle_generate(rt_req *q, bool chat)
{
    if (json_depth(q->body, q->body_len) > RT_MAX_JSON_DEPTH) {
        pthread_mutex_lock(&rt__g.mu);
        rt__g.rejected_bad++;
        pthread_mutex_unlock(&rt__g.mu);
        rt__send_error(q, 400, "invalid_request", "the body is nested too deeply (at most 32 levels)",
                   NULL, NULL);
        return;
    }
    json_error_t jerr;
    json_t *body = json_loadb(q->body, q->body_len, JSON_REJECT_DUPLICATES, &jerr);
    relay r;
    memset(&r, 0, sizeof r);
    r.q = q;
    r.chat = chat;
    r.draws = -1;
    r.t_start = rt__now_s();
    r.ttft = -1;
    json_t *first_error = NULL;
    double t0 = rt__wall_s(), replay_start = 0;
    if (!body || !json_is_object(body)) {
        pthread_mutex_lock(&rt__g.mu);
        rt__g.rejected_bad++;
        pthread_mutex_unlock(&rt__g.mu);
        rt__send_error(q, 400, body ? "invalid_request" : "invalid_json",
                   body ? "the body must be a JSON object" : jerr.text, NULL, NULL);
        json_decref(body);
        return;
    }
    r.stream = json_is_true(json_object_get(body, "stream"));
    json_t *mt = json_object_get(body, "max_completion_tokens");
    if (!mt)
        mt = json_object_get(body, "max_tokens");
    long max_tokens = json_is_integer(mt) ? (long)json_integer_value(mt) : (chat ? -1 : 16);
    if (q->deadline_ms < 0 && json_is_number(json_object_get(body, "timeout"))) {
        /* the client's number: one outside long long must not be
         * converted (undefined); a negative one means none, as before */
        double ms = json_number_value(json_object_get(body, "timeout")) * 1000;
        q->deadline_ms = ms >= 9e18 ? (long long)9e18 : ms <= -9e18 ? -1 : (long long)ms;
    }
    /* A seed of our own, so that a resumed sampled stream continues the
     * same random stream on the next worker. */
    if (!json_object_get(body, "seed")) {
        pthread_mutex_lock(&rt__g.mu);
        uint64_t s = (uint64_t)(rt__wall_s() * 1e6) ^ (++rt__g.seq * 0x9E3779B97F4A7C15ull);
        pthread_mutex_unlock(&rt__g.mu);
        json_object_set_new(body, "seed", json_integer((json_int_t)(s & 0x7fffffff)));
    }
    long prompt = count_prompt(body, chat);
    bool *tried = q->tried; /* kept across an agent run's steps */
    bool stop_now = false;  /* a worker failed and no replay is wanted */
    long long adm_deadline = rt__g.sabotage.no_deadline ? -1 : q->deadline_ms;
    fail_kind last = FAIL_NONE;
    const char *decision = "none";
    char first_worker[64] = "";
    bool cut_after_text = false; /* an external engine failed mid-stream */
    bool fallback = false;       /* queued as a job (Prefer: respond-async) */
    for (;;) {
        int skipped = 0;
        double pred = -1;
        long remaining = max_tokens < 0 ? -1 : max_tokens - (long)r.n_tokens;
        int wi = stop_now ? -1
                          : pick_worker(tried, r.stream && (r.n_tokens > 0 || r.content_sent),
                                        prompt + (long)r.n_tokens, remaining,
                                        q->attempts == 0 ? adm_deadline : -1, &skipped, &pred);
        if (!stop_now && wi < 0 && q->attempts < rt__g.cfg->max_attempts &&
            (skipped & (SKIP_DOWN | SKIP_MEM)) &&
            !(skipped & SKIP_DEADLINE) && !r.client_gone) {
            /* Wait in the bounded queue while a worker starts or frees
             * memory, as long as the deadline and the queue time-out allow. */
            double limit = rt__g.cfg->queue_timeout_ms / 1000.0;
            if (adm_deadline >= 0 && adm_deadline / 1000.0 < limit)
                limit = adm_deadline / 1000.0;
            pthread_mutex_lock(&rt__g.mu);
            bool room = rt__g.queued < rt__g.cfg->queue_size;
            if (room)
                rt__g.queued++;
            pthread_mutex_unlock(&rt__g.mu);
            double qt0 = rt__now_s();
            if (room)
                SW_INFO("router", "request %s: no worker eligible now, waits up to %.1f s",
                        q->request_id, limit);
            while (room && wi < 0 && rt__now_s() - qt0 < limit && !rt__g.stop) {
                struct pollfd p = {q->fd, POLLRDHUP, 0};
                if (poll(&p, 1, 50) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                    r.client_gone = true;
                    break;
                }
                wi = pick_worker(tried, r.stream && (r.n_tokens > 0 || r.content_sent),
                                        prompt + (long)r.n_tokens, remaining,
                                 q->attempts == 0 ? adm_deadline : -1, &skipped, &pred);
            }
            if (room) {
                pthread_mutex_lock(&rt__g.mu);
                rt__g.queued--;
                pthread_mutex_unlock(&rt__g.mu);
            }
            if (r.client_gone) {
                last = FAIL_CLIENT_GONE;
                break;
            }
        }
        if (stop_now || wi < 0 || q->attempts >= rt__g.cfg->max_attempts) {
            if (wi >= 0)
                release_worker(wi);
            if (r.headers_sent) {
                json_t *e = cut_after_text
                                ? rt__error_obj(500,
                                                last == FAIL_OOM ? "out_of_memory" : "worker_failed",
                                                last == FAIL_OOM
                                                    ? "the engine ran out of memory after text was "
                                                      "sent; an external engine cannot be resumed"
                                                    : "the engine failed after text was sent; an "
                                                      "external engine cannot be resumed",
                                                NULL)
                                : rt__error_obj(500, "worker_failed",
                                                "the request failed on every eligible worker", NULL);
                char *s = json_dumps(e, JSON_COMPACT);
                json_decref(e);
                if (s)
                    client_event(&r, s);
                free(s);
                client_event(&r, "[DONE]");
                client_chunk(&r, "", 0);
            } else if (!stop_now && q->prefer_async &&
                       ((q->attempts == 0 && (skipped & SKIP_DEADLINE)) ||
                        (!(q->attempts == 0 && skipped == SKIP_CTX) &&
                         (last == FAIL_NONE || last == FAIL_BUSY))) &&
                       rt__jobs_accept_async(q, chat) == 0) {
                /* Prefer: respond-async: the capacity_exceeded below
                 * became a job; the client polls it (router_jobs.c) */
                fallback = true;
            } else if (!stop_now && q->attempts == 0 && (skipped & SKIP_DEADLINE)) {
                char msg[256];
                snprintf(msg, sizeof msg,
                         "no worker can finish within the deadline of %lld ms (best prediction %.0f ms)",
                         q->deadline_ms, pred);
                rt__send_error(q, 503, "capacity_exceeded", msg, NULL, "Retry-After: 1\r\n");
            } else if (!stop_now && q->attempts == 0 && skipped == SKIP_CTX) {
                rt__send_error(q, 400, "context_length_exceeded",
                           "the prompt is longer than every worker's context limit", "messages",
                           NULL);
            } else if (last == FAIL_NONE || last == FAIL_BUSY) {
                rt__send_error(q, 503, "capacity_exceeded",
                           "no worker has the capacity for this request now", NULL,
                           "Retry-After: 1\r\n");
            } else {
                rt__send_error(q, 503, "worker_failed",
                           last == FAIL_OOM ? "out of memory on every eligible worker"
                                            : "the request failed on every eligible worker",
                           NULL, "Retry-After: 1\r\n");
            }
            if (q->attempts == 0 && !fallback) {
                pthread_mutex_lock(&rt__g.mu);
                rt__g.rejected_capacity++;
                pthread_mutex_unlock(&rt__g.mu);
            }
            break;
        }
        rt_worker *w = &rt__g.w[wi];
        tried[wi] = true;
        q->attempts++;
        if (!r.headers_sent)
            snprintf(q->worker, sizeof q->worker, "%s", w->cfg.name);
        snprintf(r.final_worker, sizeof r.final_worker, "%s", w->cfg.name);
        if (first_error && !replay_start)
            replay_start = rt__wall_s();
        /* The body of this attempt: resume after the tokens sent. */
        json_t *b = json_deep_copy(body);
        if (r.stream && r.n_tokens > 0 && rt__g.sabotage.no_resume) {
            /* SABOTAGE no-resume: start over; the client sees the sent
             * tokens twice */
            r.n_tokens = 0;
            r.draws = -1;
            r.role_sent = false;
            r.text_bytes = 0;
        }
        if (r.stream && r.n_tokens > 0) {
            json_t *toks = json_array();
            for (size_t i = 0; i < r.n_tokens; i++)
                json_array_append_new(toks, json_integer(r.tokens[i]));
            json_t *res = json_pack("{s:o}", "tokens", toks);
            if (r.draws >= 0)
                json_object_set_new(res, "draws", json_integer(r.draws));
            json_object_set_new(res, "text_bytes", json_integer((json_int_t)r.text_bytes));
            json_object_set_new(b, "resume", res);
            json_object_del(b, "max_completion_tokens");
            if (max_tokens >= 0)
                json_object_set_new(b, "max_tokens", json_integer(remaining < 0 ? 0 : remaining));
        }
        char *bs = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        if (!bs) {
            release_worker(wi);
            rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
            break;
        }
        r.resume_base = r.stream ? r.n_tokens : 0;
        double t_attempt = rt__wall_s();
        last = attempt(&r, w, bs, strlen(bs));
        free(bs);
        if (rt__g.ledger) {
            static const char *const outcome[] = {"ok", "oom", "worker_crash", "busy", "cancelled"};
            const char *oc = last == FAIL_NONE && r.status != 200 ? "client_error" : outcome[last];
            sw_error lerr;
            if (ldg_attempt_add(rt__g.ledger, q->request_id, q->attempts, w->cfg.name, oc,
                                last == FAIL_NONE ? NULL : r.phase, t_attempt, rt__wall_s(), &lerr))
                SW_WARN("router", "request %s: %s", q->request_id, lerr.message);
        }
        if (last == FAIL_NONE || last == FAIL_CLIENT_GONE)
            break;
        if (last == FAIL_BUSY)
            continue;
        /* oom or crash: out of rotation until the supervisor says ready */
        pthread_mutex_lock(&rt__g.mu);
        w->req_failed++;
        if (last == FAIL_OOM) {
            rt__g.failovers_oom++;
            if (strcmp(r.phase, "admission") && w->cfg.managed)
                w->restart_requested = true; /* poisoned: restart */
            if (strcmp(r.phase, "admission"))
                w->state = WS_SUSPECT;
        } else {
            rt__g.failovers_crash++;
            w->state = WS_SUSPECT;
        }
        pthread_mutex_unlock(&rt__g.mu);
        SW_WARN("router", "request %s: %s on worker %s (phase %s, %zu tokens sent); %s",
                q->request_id, last == FAIL_OOM ? "oom" : "worker_crash", w->cfg.name, r.phase,
                r.n_tokens, r.n_tokens ? "resuming" : "replaying");
        if (!first_error) {
            snprintf(first_worker, sizeof first_worker, "%s", w->cfg.name);
            first_error = json_pack("{s:s, s:s, s:s, s:f}", "worker", w->cfg.name, "kind",
                                    last == FAIL_OOM ? "oom" : "worker_crash", "phase", r.phase,
                                    "time", rt__wall_s());
            decision = r.stream && r.n_tokens > 0 ? "resume" : "replay";
        }
        if (w->cfg.kind == RT_KIND_OPENAI && r.stream && r.content_sent) {
            /* no resume on an external engine (no token ids, no resume
             * field): the stream ends with the typed error event */
            cut_after_text = true;
            stop_now = true;
            if (!strcmp(decision, "replay") || !strcmp(decision, "resume"))
                decision = "none (external engine: no resume)";
        }
        if (q->single_pass || rt__g.sabotage.no_replay) {
            /* the caller decides (an agent run replays the whole run), or
             * SABOTAGE no-replay: the failure goes to the client */
            q->worker_failed = true;
            stop_now = true;
            if (!q->single_pass)
                decision = "none (SPILLWAY_SABOTAGE=no-replay)";
        }
    }
    q->completed = r.finished;
    if (first_error && q->defer_event) {
        q->failover_first_error = first_error; /* the agent run records it */
        first_error = NULL;
    }
    if (first_error) {
        const char *reason =
            cut_after_text
                ? "stream with text already sent by an external engine (kind = openai): it "
                  "cannot be resumed, so it ended with an error event"
            : !strcmp(decision, "resume")
                ? "stream with tokens already sent: resumed with the sent tokens and sampler draws"
                : r.stream ? "stream with nothing sent yet: replayed from the start"
                           : "non-streaming request, no tool executed: replayed from the start";
        json_t *ev = json_pack(
            "{s:s, s:f, s:o, s:s, s:s, s:s?, s:f, s:f, s:I, s:i, s:s, s:b, s:b}", "request_id",
            q->request_id, "received_time", t0, "first_error", first_error, "decision", decision,
            "reason", reason, "replay_worker", r.finished ? r.final_worker : NULL, "cpu_start_time",
            replay_start, "completion_time", rt__wall_s(), "tokens", (json_int_t)r.n_tokens,
            "attempts", q->attempts, "outcome",
            r.finished ? "completed" : last == FAIL_CLIENT_GONE ? "cancelled" : "failed",
            "client_connected", last != FAIL_CLIENT_GONE, "stream", r.stream);
        if (ev)
            rt__ev_record(ev);
        json_decref(ev);
    }
    SW_INFO("router", "request %s: %s, worker %s, %d attempt(s), %zu tokens, %.0f ms",
            q->request_id,
            r.finished ? (r.status == 200 ? "ok" : "client error")
            : fallback ? "queued as a job"
            : last == FAIL_CLIENT_GONE ? "cancelled (client left)" : "failed",
            r.final_worker[0] ? r.final_worker : "-", q->attempts, r.n_tokens,
            (rt__now_s() - r.t_start) * 1000);
    if (r.finished && r.status == 200) {
        pthread_mutex_lock(&rt__g.mu);
        hist_add(rt__g.lat_buckets, &rt__g.lat_count, &rt__g.lat_sum, rt__now_s() - r.t_start);
        if (r.ttft >= 0)
            hist_add(rt__g.ttft_buckets, &rt__g.ttft_count, &rt__g.ttft_sum, r.ttft);
        pthread_mutex_unlock(&rt__g.mu);
    }
    sw_free(r.tokens);
    json_decref(body);
}


void rt__dispatch_generate(rt_req *q, bool chat)
{
    /* Only a body that mentions the field is parsed here; the usual one
     * goes straight to the relay (which parses it once). */
    if (q->body && memmem(q->body, q->body_len, "\"tool_execution\"", 16) &&
        json_depth(q->body, q->body_len) <= RT_MAX_JSON_DEPTH) {
        json_t *body = json_loadb(q->body, q->body_len, JSON_REJECT_DUPLICATES, NULL);
        json_t *te = json_object_get(body, "tool_execution");
        if (json_is_object(body) && te) {
            const char *v = json_string_value(te);
            if (!v || (strcmp(v, "server") && strcmp(v, "client"))) {
                rt__send_error(q, 400, "invalid_request",
                               "tool_execution must be \"server\" or \"client\"", "tool_execution",
                               NULL);
            } else if (!strcmp(v, "server")) {
                if (!chat)
                    rt__send_error(q, 400, "invalid_request",
                                   "tool_execution \"server\" needs /v1/chat/completions",
                                   "tool_execution", NULL);
                else
                    rt__handle_agent(q, body);
            } else {
                /* "client": the ordinary OpenAI flow; the worker does not
                 * know the field */
                json_object_del(body, "tool_execution");
                char *s = json_dumps(body, JSON_COMPACT);
                if (s) {
                    size_t n = strlen(s);
                    char *nb = sw_malloc(n + 1);
                    if (nb) {
                        memcpy(nb, s, n + 1);
                        sw_free(q->body);
                        q->body = nb;
                        q->body_len = n;
                    }
                    free(s);
                }
                json_decref(body);
                rt__handle_generate(q, chat);
                return;
            }
            json_decref(body);
            return;
        }
        json_decref(body);
    }
    rt__handle_generate(q, chat);
}

void rt__generate_capture(const char *request_id, bool chat, const char *body, size_t len,
                          long long deadline_ms, rt_capture *out, int *attempts)
{
    rt_req q;
    memset(&q, 0, sizeof q);
    q.fd = -1;
    q.deadline_ms = deadline_ms;
    snprintf(q.method, sizeof q.method, "POST");
    snprintf(q.path, sizeof q.path, "%s", chat ? "/v1/chat/completions" : "/v1/completions");
    snprintf(q.request_id, sizeof q.request_id, "%s", request_id);
    q.cap.on = true;
    q.body = sw_malloc(len + 1);
    if (q.body) {
        memcpy(q.body, body, len);
        q.body[len] = 0;
        q.body_len = len;
        rt__dispatch_generate(&q, chat);
    }
    sw_free(q.body);
    if (!q.cap.status && !q.cap.overflow) {
        /* nothing was answered (out of memory): a server error */
        json_t *e = rt__error_obj(500, "internal_error", "the request produced no response", NULL);
        char *s = json_dumps(e, JSON_COMPACT);
        json_decref(e);
        q.cap.status = 500;
        snprintf(q.cap.content_type, sizeof q.cap.content_type, "application/json");
        if (s)
            rt__capture_append(&q.cap, s, strlen(s));
        free(s);
    }
    *out = q.cap;
    if (attempts)
        *attempts = q.attempts;
}
