/* router_relay.c - one generation request from admission to its end:
 * the body parsed once, the exact prompt token count, admission through
 * the queue (router_queue.h), one attempt after another
 * (router_attempt.h), and after each the failover decision
 * (router_failover.h): done, back to the queue, replay from the start,
 * resume a stream after the tokens sent, or a typed error.
 */
#include "router/router-impl.h"
#include "router/router_attempt.h"
#include "router/router_failover.h"
#include "router/router_image.h"
#include "router/router_llamaserver.h"
#include "router/router_net.h"
#include "router/router_queue.h"
#include "api/api.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "common/log.h"
#include "common/textbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hist_add(uint64_t *buckets, uint64_t *count, double *sum, double v)
{
    int i = 0;
    while (i < 11 && v > rt__hist_le[i])
        i++;
    buckets[i]++;
    (*count)++;
    *sum += v;
}

/* remote = never on model (an index into rt->models; -1: none). */
static bool model_local_only(const rt_router *rt, int model)
{
    return model >= 0 && model < rt->n_models && rt->models[model].cfg.remote_never;
}

static void count(rt_router *rt, uint64_t *counter)
{
    pthread_mutex_lock(&rt->mu);
    (*counter)++;
    pthread_mutex_unlock(&rt->mu);
}

/* Exact prompt tokens as the worker will count them, or -1 when the body
 * cannot be tokenized here (the worker then validates and answers); with
 * prefix (RT_PREFIX_MAX_BLOCKS entries), the chain hashes of its blocks
 * for placement by prefix (router_prefix.h), their count in *n_prefix. */
static long count_prompt(const rt_model *m, json_t *body, bool chat, uint64_t *prefix,
                         int *n_prefix)
{
    int32_t *ids = NULL;
    size_t n = 0;
    long result = -1;
    if (n_prefix)
        *n_prefix = 0;
    if (!chat) {
        json_t *p = json_object_get(body, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1 &&
            (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
            p = json_array_get(p, 0);
        if (json_is_array(p)) { /* token ids, as the worker takes them */
            n = json_array_size(p);
            if (n == 0)
                return -1;
            ids = prefix ? sw_malloc(n * sizeof *ids) : NULL;
            for (size_t i = 0; ids && i < n; i++) {
                json_t *t = json_array_get(p, i);
                ids[i] = json_is_integer(t) ? (int32_t)json_integer_value(t) : -1;
            }
            result = (long)n;
        } else if (json_is_string(p) &&
                   eng_tokenize(m->tok, json_string_value(p), json_string_length(p),
                                eng_tokenizer_add_bos(m->tok), false, &ids, &n, NULL) == 0) {
            result = (long)n;
        }
    } else {
        /* the worker's own rendering: template, tool definitions, tool calls
         * and results, content parts (api/api.h) */
        json_t *msgs = json_object_get(body, "messages");
        if (json_is_array(msgs) && json_array_size(msgs) > 0 && json_array_size(msgs) <= 100000 &&
            api_chat_prompt_ids(m->tok, m->family, body, &ids, &n) == SW_OK)
            result = (long)n;
    }
    if (result >= 0 && ids && prefix && n_prefix)
        *n_prefix = rt_prefix_hashes(ids, n, prefix, RT_PREFIX_MAX_BLOCKS);
    sw_free(ids);
    return result;
}

/* count_prompt for a request of n_images images (router_image.c): its
 * text counted with the images left out, and [model] image-tokens for
 * each; -1 (not counted: a whole slot's context is reserved) when that
 * figure is not given. No prefix blocks: the images are not in them. */
static long count_request(const rt_model *m, json_t *body, bool chat, int n_images,
                          uint64_t *prefix, int *n_prefix)
{
    if (n_images == 0)
        return count_prompt(m, body, chat, prefix, n_prefix);
    *n_prefix = 0;
    if (m->cfg.image_tokens <= 0)
        return -1;
    json_t *text = rt__images_stripped(body);
    long n = text ? count_prompt(m, text, chat, NULL, NULL) : -1;
    json_decref(text);
    return n < 0 ? -1 : n + (long)n_images * m->cfg.image_tokens;
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

void rt__retry_after(rt_router *rt, char *buf, size_t cap)
{
    pthread_mutex_lock(&rt->pool.mu);
    int s = rt_queue_retry_after_locked(&rt->queue, rt->cfg->queue_timeout_ms / 1000.0);
    pthread_mutex_unlock(&rt->pool.mu);
    snprintf(buf, cap, "Retry-After: %d\r\n", s);
}

/* The client's body text with "seed": seed as its first member (the
 * body is an object without a top-level seed: generate checked), so the
 * first attempt needs no serialization of the parsed body; NULL when the
 * text does not start as an object. From sw_malloc, so free() frees it,
 * like json_dumps's. */
static char *splice_seed(const char *text, size_t len, json_int_t seed)
{
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n'))
        i++;
    if (i == len || text[i] != '{')
        return NULL;
    size_t j = i + 1;
    while (j < len && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r' || text[j] == '\n'))
        j++;
    bool empty = j < len && text[j] == '}';
    char head[40];
    sw_tb t;
    sw_tb_init(&t, head, sizeof head);
    SW_TB_LIT(&t, "{\"seed\":");
    sw_tb_i64(&t, seed);
    if (!empty)
        SW_TB_LIT(&t, ",");
    size_t rest = len - (i + 1);
    char *out = sw_malloc(t.len + rest + 1);
    if (!out)
        return NULL;
    memcpy(out, head, t.len);
    memcpy(out + t.len, text + i + 1, rest);
    out[t.len + rest] = 0;
    return out;
}

/* The body of the next attempt: after a stream's sent tokens, a resume;
 * else the client's text (with the router's seed when it added one). */
static char *attempt_body(const rt_req *q, json_t *body, const rt_relay *r, long max_tokens,
                          long remaining, bool seed_added)
{
    bool resume = r->stream && r->n_tokens > 0;
    bool text = !resume && q->body && !q->body_edited;
    if (text && !seed_added)
        return sw_strdup(q->body);
    if (text) {
        char *s = splice_seed(q->body, q->body_len,
                              json_integer_value(json_object_get(body, "seed")));
        if (s)
            return s;
    }
    json_t *b = resume ? json_deep_copy(body) : json_incref(body);
    if (!b)
        return NULL;
    if (resume) {
        json_t *toks = json_array();
        for (size_t i = 0; i < r->n_tokens; i++)
            json_array_append_new(toks, json_integer(r->tokens[i]));
        json_t *res = json_pack("{s:o}", "tokens", toks);
        if (r->draws >= 0)
            json_object_set_new(res, "draws", json_integer(r->draws));
        json_object_set_new(res, "text_bytes", json_integer((json_int_t)r->text_bytes));
        json_object_set_new(b, "resume", res);
        json_object_del(b, "max_completion_tokens");
        if (max_tokens >= 0)
            json_object_set_new(b, "max_tokens", json_integer(remaining < 0 ? 0 : remaining));
    }
    char *s = sw_json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* Takes a failed worker out of rotation (restarted when poisoned). */
static void worker_failed(rt_router *rt, int wi, rt_outcome out, const rt_failover *f)
{
    pthread_mutex_lock(&rt->pool.mu);
    rt_worker *w = &rt->pool.w[wi];
    if (f->out_of_rotation)
        w->state = WS_SUSPECT;
    if (f->restart && w->cfg.managed)
        w->restart_requested = true;
    pthread_mutex_unlock(&rt->pool.mu);
    count(rt, out == RT_OUT_OOM ? &rt->failovers_oom : &rt->failovers_crash);
    rt__stats_failover(rt);
}

/* The attempt's ledger row, for requests whose records are promised. */
static void record_attempt(const rt_req *q, const rt_relay *r, int wi, rt_outcome out,
                           double t_start)
{
    rt_router *rt = q->rt;
    if (!rt->ledger || !q->durable)
        return;
    sw_error lerr;
    bool ok = out == RT_OUT_OK || out == RT_OUT_CLIENT_ERROR;
    /* best effort: a ledger that is away does not fail the request */
    int rc = ldg_attempt_add(rt->ledger, q->request_id, q->attempts, rt->pool.w[wi].cfg.name,
                             rt_outcome_name(out), ok ? NULL : r->phase, t_start, rt__wall_s(),
                             &lerr);
    rt__ledger_seen(rt, rc);
    if (rc && (rc != SW_EUNAVAILABLE || rt__ledger_warn_due(rt)))
        SW_WARN("router", "request %s: attempt not recorded: %s", q->request_id, lerr.message);
}

/* The 400 of a prompt no worker's context holds with room for one
 * generated token: the prompt's own count (prompt < 0: not counted here,
 * a llama-server refused it) and the largest context of the model's
 * workers. */
static void send_context_error(rt_req *q, bool chat, long prompt)
{
    rt_router *rt = q->rt;
    int32_t ctx = 0;
    pthread_mutex_lock(&rt->pool.mu);
    RT_POOL_FOR_LIVE(&rt->pool, i)
        if (rt->pool.w[i].model == q->model && rt->pool.w[i].ctx_limit > ctx)
            ctx = rt->pool.w[i].ctx_limit;
    pthread_mutex_unlock(&rt->pool.mu);
    char msg[256];
    if (prompt >= 0 && ctx > 0)
        snprintf(msg, sizeof msg,
                 "the prompt has %ld tokens: %s the largest context of the model's workers, "
                 "%d tokens, which holds the prompt and the completion together",
                 prompt, prompt > ctx ? "more than" : "no completion token fits in", (int)ctx);
    else
        snprintf(msg, sizeof msg, "the prompt is longer than every worker's context limit");
    if (q->embeddings) /* prompt: its longest input (router_embeddings.c) */
        snprintf(msg, sizeof msg, "an input has %ld tokens, more than the largest context of "
                 "the model's workers, %d tokens", prompt, (int)ctx);
    count(rt, &rt->refused_context);
    rt__send_error(q, 400, "context_length_exceeded", msg,
                   q->embeddings ? "input" : chat ? "messages" : "prompt", NULL);
}

/* What the client gets when the request got no (further) worker. Returns
 * true when it became a job (Prefer: respond-async). */
/* The 503 of a request whose only eligible workers are down and cannot be
 * back in time: each one and why, into msg. */
static void down_message(rt_router *rt, const rt_decision *d, char *msg, size_t cap)
{
    size_t n = (size_t)snprintf(msg, cap, "no eligible worker is up or can be back within the "
                                          "wait:");
    pthread_mutex_lock(&rt->pool.mu);
    double now = rt__now_s();
    RT_POOL_FOR_LIVE(&rt->pool, i) {
        const rt_worker *w = &rt->pool.w[i];
        if (!(d->reason[i] & RT_SKIP_DOWN) || n >= cap)
            continue;
        const char *why = w->start_error[0] ? w->start_error
                          : w->down_reason[0] ? w->down_reason : rt_ws_name(w->state);
        char when[64] = "";
        if (w->refused || w->start_error[0])
            snprintf(when, sizeof when, "; that does not pass by itself");
        else if (w->cfg.managed && w->pid == 0 && w->next_start > now)
            snprintf(when, sizeof when, "; it restarts in %.1f s", w->next_start - now);
        n += (size_t)snprintf(msg + n, cap - n, " worker %s is down (%s%s);", w->cfg.name, why,
                              when);
    }
    pthread_mutex_unlock(&rt->pool.mu);
    if (n > 0 && n < cap && msg[n - 1] == ';')
        msg[n - 1] = 0;
}

static bool answer_unadmitted(rt_req *q, rt_relay *r, bool chat, rt_admit_result ar,
                              const rt_waiter *wt, rt_outcome last, bool failed_before)
{
    rt_router *rt = q->rt;
    char ra[48];
    rt__retry_after(rt, ra, sizeof ra);
    /* answered without a worker: counted before the answer goes out, so a
     * client that reads /metrics right after it sees the count */
    bool counted = ar != RT_ADMIT_GONE && !failed_before;
    if (r->headers_sent) {
        if (counted)
            count(rt, &rt->rejected_capacity);
        json_t *e = rt__error_obj(500, "worker_failed",
                                  "the request failed on every eligible worker", NULL);
        rt_sink_stream_error(r, e);
        json_decref(e);
        return false;
    }
    if (ar == RT_ADMIT_GONE)
        return false;
    bool capacity = !failed_before && ar != RT_ADMIT_NEVER && ar != RT_ADMIT_STOPPED;
    if (capacity && q->prefer_async && !q->embeddings && rt__jobs_accept_async(q, chat) == 0)
        return true; /* the 503 below became a job the client polls */
    if (ar == RT_ADMIT_NEVER && !failed_before && (wt->grant.skipped & RT_SKIP_IMAGES) &&
        !(wt->grant.skipped & ~(unsigned)(RT_SKIP_IMAGES | RT_SKIP_MODEL | RT_SKIP_REMOTE))) {
        /* no worker of the model could ever take it: the configuration's
         * answer, not a moment's (router_image.c) */
        char msg[320];
        snprintf(msg, sizeof msg,
                 "no worker of the model '%s' takes images: that needs a llama-server worker "
                 "with a vision projector (mmproj = in its [worker] section, or --mmproj on one "
                 "at a url)",
                 rt->models[q->model].cfg.name);
        count(rt, &rt->rejected_bad);
        rt__send_error(q, 400, "images_not_supported", msg, "messages", NULL);
        return false;
    }
    if (counted)
        count(rt, &rt->rejected_capacity);
    if (ar == RT_ADMIT_NEVER && !failed_before && !(wt->grant.skipped & ~(unsigned)RT_SKIP_MODEL)) {
        /* every worker serves another model (a reload removed this one's) */
        char msg[160];
        snprintf(msg, sizeof msg, "no worker serves the model '%s' now",
                 rt->models[q->model].cfg.name);
        rt__send_error(q, 503, "capacity_exceeded", msg, "model", ra);
        return false;
    }
    if (ar == RT_ADMIT_NEVER && !failed_before && (wt->grant.skipped & RT_SKIP_REMOTE) &&
        !(wt->grant.skipped & ~(unsigned)(RT_SKIP_REMOTE | RT_SKIP_MODEL))) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "the model '%s' has remote = never, and only remote workers serve it",
                 rt->models[q->model].cfg.name);
        rt__send_error(q, 503, "capacity_exceeded", msg, "model", ra);
        return false;
    }
    bool down_only = false; /* a worker that would take it, were it up */
    for (int i = 0; i < RT_MAX_WORKERS && ar == RT_ADMIT_NEVER; i++)
        down_only |= wt->grant.reason[i] == RT_SKIP_DOWN;
    if (ar == RT_ADMIT_NEVER && !failed_before && down_only) {
        /* nothing to wait for: said at once, with each worker's reason */
        char msg[1024];
        down_message(rt, &wt->grant, msg, sizeof msg);
        rt__send_error(q, 503, "capacity_exceeded", msg, NULL, ra);
        return false;
    }
    if (ar == RT_ADMIT_NEVER && !failed_before && (wt->grant.skipped & RT_SKIP_CTX) &&
        !(wt->grant.skipped & ~(unsigned)(RT_SKIP_CTX | RT_SKIP_KIND | RT_SKIP_MODEL))) {
        send_context_error(q, chat, wt->need.prompt);
        return false;
    }
    if (ar == RT_ADMIT_DEADLINE) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "no worker can finish within the deadline of %lld ms (best prediction %.0f ms, "
                 "counting the wait in the queue)",
                 q->deadline_ms, wt->grant.best_pred_ms);
        count(rt, &rt->refused_deadline);
        rt__send_error(q, 503, "capacity_exceeded", msg, NULL, ra);
        return false;
    }
    if (failed_before) {
        rt__send_error(q, 503, "worker_failed",
                       last == RT_OUT_OOM ? "out of memory on every eligible worker"
                                          : "the request failed on every eligible worker",
                       NULL, ra);
        return false;
    }
    const char *msg = ar == RT_ADMIT_FULL      ? "the queue of requests waiting for a worker is full"
                      : ar == RT_ADMIT_NEVER
                          ? "no worker has the memory for this request's KV cache even when idle"
                      : ar == RT_ADMIT_STOPPED ? "the router is shutting down"
                      : q->deadline_ms >= 0
                          ? "no worker had the capacity for this request within its deadline"
                          : "no worker had the capacity for this request within queue-timeout-ms";
    count(rt, ar == RT_ADMIT_FULL ? &rt->refused_queue_full : &rt->refused_queue_timeout);
    rt__send_error(q, 503, "capacity_exceeded", msg, NULL, ra);
    return false;
}

/* A worker's KV cache type by name ("" when unknown or gone). */
static void worker_kv_type(rt_router *rt, const char *name, char *out, size_t cap)
{
    out[0] = '\0';
    pthread_mutex_lock(&rt->pool.mu);
    RT_POOL_FOR_LIVE(&rt->pool, i)
        if (!strcmp(rt->pool.w[i].cfg.name, name))
            snprintf(out, cap, "%s", rt->pool.w[i].kv_type);
    pthread_mutex_unlock(&rt->pool.mu);
}

static const char *kind_name(int kind)
{
    return kind == RT_KIND_OPENAI         ? "openai"
           : kind == RT_KIND_LLAMA_SERVER ? "llama-server"
                                          : "spillway";
}

/* A worker's kind by name (NULL when gone). */
static const char *worker_kind(rt_router *rt, const char *name)
{
    const char *kind = NULL;
    pthread_mutex_lock(&rt->pool.mu);
    RT_POOL_FOR_LIVE(&rt->pool, i)
        if (!strcmp(rt->pool.w[i].cfg.name, name))
            kind = kind_name(rt->pool.w[i].cfg.kind);
    pthread_mutex_unlock(&rt->pool.mu);
    return kind;
}

/* Whether a spillway worker of q's model is left that has not failed it
 * (ready or not: one that restarts can still take it). */
static bool spillway_left(rt_router *rt, const rt_req *q, const bool *tried, int failed,
                          bool images)
{
    bool left = false;
    if (images) /* a spillway worker takes no image (router_policy.c) */
        return false;
    pthread_mutex_lock(&rt->pool.mu);
    RT_POOL_FOR_LIVE(&rt->pool, i) {
        const rt_worker *w = &rt->pool.w[i];
        left |= i != failed && !tried[i] && w->cfg.kind == RT_KIND_SPILLWAY &&
                (!rt->route_by_model || w->model == q->model);
    }
    pthread_mutex_unlock(&rt->pool.mu);
    return left;
}

/* The failover event of a request that failed over at least once. With
 * the KV cache types of the first worker and the one that finished: a
 * replay or resume is token-exact between workers of the same kind and KV
 * type; across types the answer is a valid one, not the same bits. */
static void record_failover(const rt_req *q, const rt_relay *r, json_t *first_error,
                            const rt_failover *first, double t0, double replay_start,
                            rt_outcome last)
{
    char final_kv[8] = "";
    if (r->finished)
        worker_kv_type(q->rt, r->final_worker, final_kv, sizeof final_kv);
    json_t *ev = json_pack(
        "{s:s, s:f, s:o, s:s, s:s, s:s?, s:f, s:f, s:I, s:i, s:s, s:b, s:b}", "request_id",
        q->request_id, "received_time", t0, "first_error", first_error, "decision",
        first->decision, "reason", first->reason, "replay_worker",
        r->finished ? r->final_worker : NULL, "cpu_start_time", replay_start, "completion_time",
        rt__wall_s(), "tokens", (json_int_t)r->n_tokens, "attempts", q->attempts, "outcome",
        r->finished ? "completed" : last == RT_OUT_CLIENT_GONE ? "cancelled" : "failed",
        "client_connected", last != RT_OUT_CLIENT_GONE, "stream", r->stream);
    const char *first_kv = json_string_value(json_object_get(first_error, "kv_type"));
    /* which kind resumed (or replayed) from which: first_error.worker_kind
     * and this (docs/router.md, the replay table) */
    const char *final_kind = r->finished ? worker_kind(q->rt, r->final_worker) : NULL;
    if (ev && final_kind)
        json_object_set_new(ev, "replay_worker_kind", json_string(final_kind));
    if (ev && final_kv[0] && first_kv && first_kv[0]) {
        json_object_set_new(ev, "replay_kv_type", json_string(final_kv));
        json_object_set_new(ev, "same_kv_type", json_boolean(!strcmp(final_kv, first_kv)));
    }
    if (ev)
        rt__ev_record(q->rt, ev);
    json_decref(ev);
}

int rt__model_find(const rt_router *rt, const char *id)
{
    for (int i = 0; i < rt->n_models; i++) {
        const rt_model_config *m = &rt->models[i].cfg;
        if (!strcmp(m->name, id))
            return i;
        for (int a = 0; a < m->n_aliases; a++)
            if (!strcmp(m->aliases[a], id))
                return i;
    }
    return -1;
}

/* The model q asks for into q->model (docs/router.md, Several models):
 * "model" (an id or an alias; an alias is rewritten to the id the
 * workers answer to), else the default. With a [model] section alone the
 * workers check "model" themselves, as they always did. false when q was
 * answered (400, 404 model_not_found listing the ids). */
static bool resolve_model(rt_req *q, json_t *body)
{
    rt_router *rt = q->rt;
    json_t *m = json_object_get(body, "model");
    q->model = q->asked_model = rt->default_model;
    if (!rt->route_by_model || !m || json_is_null(m))
        return true;
    if (!json_is_string(m)) {
        rt__send_error(q, 400, "invalid_request", "'model' must be a string", "model", NULL);
        return false;
    }
    int i = rt__model_find(rt, json_string_value(m));
    if (i < 0) {
        char msg[1024];
        sw_tb t;
        sw_tb_init(&t, msg, sizeof msg);
        SW_TB_LIT(&t, "the model '");
        sw_tb_put(&t, json_string_value(m), json_string_length(m) > 200 ? 200 : json_string_length(m));
        SW_TB_LIT(&t, "' does not exist; this router serves: ");
        for (int k = 0; k < rt->n_models; k++) {
            const rt_model_config *mc = &rt->models[k].cfg;
            if (k)
                SW_TB_LIT(&t, ", ");
            sw_tb_str(&t, mc->name);
            for (int a = 0; a < mc->n_aliases; a++) {
                sw_tb_str(&t, a ? ", " : " (aliases: ");
                sw_tb_str(&t, mc->aliases[a]);
            }
            if (mc->n_aliases)
                SW_TB_LIT(&t, ")");
        }
        rt__send_error(q, 404, "model_not_found", msg, "model", NULL);
        return false;
    }
    q->model = q->asked_model = i;
    if (strcmp(json_string_value(m), rt->models[i].cfg.name)) {
        json_object_set_new(body, "model", json_string(rt->models[i].cfg.name));
        q->body_edited = true;
    }
    return true;
}

const char *const rt__fallback_reasons[RT_FALLBACK_REASONS] = {"queue_full", "deadline",
                                                                "queue_timeout", "no_capacity"};

/* The reason a capacity answer gives (an index into rt__fallback_reasons),
 * -1 for an answer that is not about capacity. */
static int capacity_reason(rt_admit_result ar)
{
    switch (ar) {
    case RT_ADMIT_FULL: return 0;
    case RT_ADMIT_DEADLINE: return 1;
    case RT_ADMIT_TIMEOUT: return 2;
    case RT_ADMIT_NEVER: return 3;
    default: return -1;
    }
}

/* The capacity fallback (docs/router.md, Several models): when the model
 * q is on could not admit it (ar), the next model of the asked model's
 * fallback list, -1 when none is left or q may not fall back (the
 * client's X-Spillway-Fallback: none, output already sent). */
static int next_fallback(const rt_req *q, rt_admit_result ar, int *step)
{
    const rt_router *rt = q->rt;
    if (!rt->route_by_model || q->no_fallback || capacity_reason(ar) < 0)
        return -1;
    const rt_model_config *asked = &rt->models[q->asked_model].cfg;
    while (*step < asked->n_fallback) {
        int to = rt__model_find(rt, asked->fallback[(*step)++]);
        if (to >= 0 && to != q->model)
            return to;
    }
    return -1;
}

/* q moves to model to: its body names it, the event and the metric say
 * why. */
static void fall_back(rt_req *q, json_t *body, int to, rt_admit_result ar, double t0)
{
    rt_router *rt = q->rt;
    int from = q->model, why = capacity_reason(ar);
    const char *reason = rt__fallback_reasons[why];
    json_object_set_new(body, "model", json_string(rt->models[to].cfg.name));
    q->body_edited = true;
    q->model = to;
    pthread_mutex_lock(&rt->mu);
    rt->capacity_fallbacks[from][to][why]++;
    pthread_mutex_unlock(&rt->mu);
    SW_INFO("router", "request %s: model %s cannot take it in time (%s); answered by model %s "
            "(capacity fallback)", q->request_id, rt->models[from].cfg.name, reason,
            rt->models[to].cfg.name);
    json_t *ev = json_pack("{s:s, s:s, s:f, s:f, s:s, s:s, s:s, s:s}", "type",
                           "capacity_fallback", "request_id", q->request_id, "received_time", t0,
                           "time", rt__wall_s(), "from_model", rt->models[from].cfg.name,
                           "to_model", rt->models[to].cfg.name, "reason", reason, "route",
                           "capacity");
    if (ev)
        rt__ev_record(rt, ev);
    json_decref(ev);
}

/* An attempt granted to a remote worker wi: routine when nothing local
 * was passed over for it (the model lives only there, or the remote
 * worker comes first in preference), capacity when a local worker of the
 * model was passed over (busy, full, down, predicted late, failed it) or
 * the request fell back from another model. Counted per worker, and an
 * event (docs/router.md, Remote services over TLS); the route, for the
 * answer's X-Spillway-Remote-Route. */
static const char *remote_route(rt_req *q, int wi, const rt_decision *grant)
{
    rt_router *rt = q->rt;
    bool capacity = q->model != q->asked_model;
    char worker[64];
    pthread_mutex_lock(&rt->pool.mu);
    for (int k = 0; k < rt->pool.n_slots && !capacity; k++)
        capacity = k != wi && (grant->reason[k] & ~(unsigned)RT_SKIP_MODEL) &&
                   !rt_config_worker_remote(&rt->pool.w[k].cfg);
    rt->pool.w[wi].remote_routes[capacity]++;
    snprintf(worker, sizeof worker, "%s", rt->pool.w[wi].cfg.name);
    pthread_mutex_unlock(&rt->pool.mu);
    json_t *ev = json_pack("{s:s, s:s, s:f, s:s, s:s, s:s}", "type", "remote_route",
                           "request_id", q->request_id, "time", rt__wall_s(), "worker", worker,
                           "model", rt->models[q->model].cfg.name, "route",
                           capacity ? "capacity" : "routine");
    if (ev)
        rt__ev_record(rt, ev);
    json_decref(ev);
    return capacity ? "capacity" : "routine";
}

/* Serves one generation request whose body is parsed (owned here). */
static void generate(rt_req *q, bool chat, json_t *body)
{
    rt_router *rt = q->rt;
    if (!resolve_model(q, body)) {
        json_decref(body);
        return;
    }
    /* image content: checked here, before any worker sees it */
    int n_images = 0;
    if (chat && !q->embeddings) {
        const char *code = "invalid_image";
        char msg[256], param[96];
        if (rt__images_check(rt->cfg, body, &n_images, &code, msg, sizeof msg, param,
                             sizeof param)) {
            count(rt, &rt->rejected_bad);
            rt__send_error(q, 400, code, msg, param, NULL);
            json_decref(body);
            return;
        }
    }
    rt_relay r;
    memset(&r, 0, sizeof r);
    r.q = q;
    r.chat = chat;
    r.draws = -1;
    r.t_start = rt__now_s();
    r.ttft = -1;
    double t0 = rt__wall_s(), replay_start = 0;
    r.stream = !q->embeddings && json_is_true(json_object_get(body, "stream"));
    json_t *mt = json_object_get(body, "max_completion_tokens");
    if (!mt)
        mt = json_object_get(body, "max_tokens");
    long max_tokens = json_is_integer(mt) ? (long)json_integer_value(mt) : (chat ? -1 : 16);
    if (q->embeddings)
        max_tokens = 0; /* it generates nothing */
    /* n > 1: that many sequences on one worker (the worker checks the
     * range); never resumed (router_failover.c) */
    json_t *nv = json_object_get(body, "n");
    int n_choices = !q->embeddings && json_is_integer(nv) && json_integer_value(nv) > 1 &&
                            json_integer_value(nv) <= 64
                        ? (int)json_integer_value(nv)
                        : 1;
    if (q->deadline_ms < 0 && json_is_number(json_object_get(body, "timeout"))) {
        /* the client's number: one outside long long must not be
         * converted (undefined); a negative one means none, as before */
        double ms = json_number_value(json_object_get(body, "timeout")) * 1000;
        q->deadline_ms = ms >= 9e18 ? (long long)9e18 : ms <= -9e18 ? -1 : (long long)ms;
    }
    /* A seed of our own, so that a resumed sampled stream continues the
     * same random stream on the next worker. */
    bool seed_added = false;
    if (!q->embeddings && !json_object_get(body, "seed")) {
        seed_added = true;
        uint64_t n = __atomic_add_fetch(&rt->seq, 1, __ATOMIC_RELAXED);
        uint64_t s = (uint64_t)(rt__wall_s() * 1e6) ^ (n * 0x9E3779B97F4A7C15ull);
        json_object_set_new(body, "seed", json_integer((json_int_t)(s & 0x7fffffff)));
    }
    /* the prompt's blocks, for placement by prefix (none: no preference) */
    uint64_t *prefix = sw_malloc(RT_PREFIX_MAX_BLOCKS * sizeof *prefix);
    int n_prefix = 0;
    long prefill = 0; /* an embeddings request's inputs together */
    const rt_model *counted = &rt->models[q->model];
    long prompt = q->embeddings ? rt__embeddings_tokens(counted, body, &prefill)
                                : count_request(counted, body, chat, n_images, prefix, &n_prefix);
    if (q->idem_key[0])
        q->durable = true; /* an Idempotency-Key's attempts are promised */
    bool *tried = q->tried; /* kept across an agent run's steps */
    long long adm_deadline = rt->sabotage.no_deadline ? -1 : q->deadline_ms;
    if (!q->ticket)
        q->ticket = rt_queue_ticket(&rt->queue);
    rt_outcome last = RT_OUT_OK;
    json_t *first_error = NULL;
    rt_failover first = {0};
    bool failed_before = false, fallback = false;
    int fallback_step = 0;
    double t_queued = 0; /* when it joined the queue for its next attempt */
    bool after_refusal = false; /* the last attempt was refused by its worker */
    bool ctx_refused = false; /* a llama-server refused it: over its context */
    /* a stream to resume that another llama-server may take (the replay
     * table's resume_on_ls), and whether a spillway worker sent any of it */
    bool resume_ls = false, spillway_sent = false;
    for (;;) {
        long remaining = max_tokens < 0 ? -1 : max_tokens - (long)r.n_tokens;
        rt_waiter wt;
        memset(&wt, 0, sizeof wt);
        wt.ticket = q->ticket;
        wt.need.model = rt->route_by_model ? q->model : -1;
        wt.need.prompt = prompt < 0 ? -1 : prompt + (long)r.n_tokens;
        wt.need.max_tokens = remaining;
        wt.need.prefill = prefill;
        wt.need.n_choices = n_choices;
        wt.need.prefix = prefix;
        wt.need.n_prefix = prefix ? n_prefix : 0;
        /* the worker takes the prompt's cached blocks, unless it replays a
         * resumed stream's tokens or the client said cache_prompt: false */
        wt.need.share = !(r.stream && r.n_tokens > 0) &&
                        !json_is_false(json_object_get(body, "cache_prompt"));
        wt.need.resume = r.stream && (r.n_tokens > 0 || r.content_sent);
        /* none left to generate: llama-server's n_predict 0 still
         * generates one token, so it does not take such a resume */
        wt.need.resume_ls = wt.need.resume && resume_ls && remaining != 0;
        /* the model asked for and the one answering (a fallback): either's
         * remote = never keeps the request on the machine */
        wt.need.local_only = model_local_only(rt, q->asked_model) ||
                             model_local_only(rt, q->model);
        wt.need.images = n_images > 0;
        wt.need.deadline_ms = q->attempts == 0 && !failed_before ? adm_deadline : -1;
        wt.tried = tried;
        wt.first = q->admission == 0;
        /* the wait is bounded by queue-timeout-ms and what is left of the
         * deadline */
        double limit = rt->cfg->queue_timeout_ms / 1000.0;
        if (after_refusal) {
            /* back in the queue after workers refused it: the time it
             * waits in all is queue-timeout-ms (a refusal never fails it
             * before that) */
            double since = rt__now_s() - t_queued;
            limit = limit > since ? limit - since : 0;
        } else {
            t_queued = rt__now_s();
        }
        after_refusal = false;
        if (adm_deadline >= 0) {
            double left = adm_deadline / 1000.0 - (rt__now_s() - r.t_start);
            if (left < limit)
                limit = left > 0 ? left : 0;
        }
        rt_admit_result ar = RT_ADMIT_NEVER;
        double waited = 0;
        if (q->attempts < rt->cfg->max_attempts)
            ar = rt_queue_admit(&rt->queue, &wt, limit,
                                q->fd >= 0 ? q->fd : rt__job_cancel_fd, &rt->stop, &waited);
        q->queue_ms += waited * 1000;
        if (ar == RT_ADMIT_OK || ar == RT_ADMIT_TIMEOUT)
            rt__stats_wait(rt, waited);
        if (ar != RT_ADMIT_OK) {
            if (ar == RT_ADMIT_GONE)
                last = RT_OUT_CLIENT_GONE;
            /* another model only before anything was sent or tried: a
             * stream is never continued by another model */
            int to = q->attempts == 0 && !failed_before && !r.headers_sent
                         ? next_fallback(q, ar, &fallback_step)
                         : -1;
            if (to >= 0) {
                fall_back(q, body, to, ar, t0);
                prompt = q->embeddings
                             ? rt__embeddings_tokens(&rt->models[q->model], body, &prefill)
                             : count_request(&rt->models[q->model], body, chat, n_images,
                                             prefix, &n_prefix);
                continue;
            }
            if (ar == RT_ADMIT_NEVER && ctx_refused && !failed_before && !r.headers_sent) {
                /* a llama-server said the prompt is over its context, and
                 * no other worker is left to take it */
                send_context_error(q, chat, -1);
                break;
            }
            fallback = answer_unadmitted(q, &r, chat, ar, &wt, last, failed_before);
            break;
        }
        if (wt.first)
            q->admission = wt.ordinal;
        int wi = wt.grant.worker;
        rt_worker *w = &rt->pool.w[wi];
        q->attempts++;
        const char *route = rt_config_worker_remote(&w->cfg) ? remote_route(q, wi, &wt.grant)
                                                             : NULL;
        if (!r.headers_sent) {
            snprintf(q->worker, sizeof q->worker, "%s", w->cfg.name);
            q->remote_route = route;
        }
        snprintf(r.final_worker, sizeof r.final_worker, "%s", w->cfg.name);
        if (first_error && !replay_start)
            replay_start = rt__wall_s();
        if (r.stream && r.n_tokens > 0 && rt->sabotage.no_resume) {
            /* SABOTAGE no-resume: start over; the client sees the sent
             * tokens twice */
            r.n_tokens = 0;
            r.draws = -1;
            r.roles_sent = 0;
            r.text_bytes = 0;
        }
        char *bs = attempt_body(q, body, &r, max_tokens, remaining, seed_added);
        if (!bs) {
            rt_queue_release_shared(&rt->queue, wi, wt.grant.kv_bytes, NULL, prefix,
                                    wt.grant.shared_blocks, wt.grant.seqs);
            if (r.headers_sent) /* a stream began: it ends with the error */
                rt_sink_stream_error(&r, NULL);
            else
                rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
            break;
        }
        r.resume_base = r.stream ? r.n_tokens : 0;
        r.attempt_worker = wi;
        r.prefix = prefix;
        r.n_prefix = prefix ? n_prefix : 0;
        r.shared_noted = false;
        r.shared_registered = wt.grant.shared_blocks; /* held once more since the grant */
        r.shared_moved = 0;
        double t_attempt = rt__wall_s();
        bool refused_memory = false;
        size_t had = r.n_tokens;
        last = rt_attempt_run(&r, wi, wt.generation, bs, strlen(bs), &refused_memory);
        free(bs);
        /* the worker refused what the books admitted (full: other routers'
         * requests, an allocation outside the router): it takes nothing
         * more from this router until its /health or the end of one of
         * this router's requests there; held before the reservation is
         * given back, so that the release's dispatch pass does not send
         * it the next waiter */
        bool worker_refused = last == RT_OUT_REFUSED && !r.refused_context;
        if (worker_refused) {
            pthread_mutex_lock(&rt->pool.mu);
            rt_pool_refused_locked(&rt->pool, wi, refused_memory);
            pthread_mutex_unlock(&rt->pool.mu);
        }
        rt_tally tally = {last == RT_OUT_OK, last == RT_OUT_CLIENT_ERROR,
                          last == RT_OUT_OOM || last == RT_OUT_CRASH,
                          last == RT_OUT_OK ? (uint64_t)(r.stream ? r.n_tokens - had : r.n_tokens) : 0};
        rt_queue_release_shared(&rt->queue, wi, wt.grant.kv_bytes - r.shared_moved, &tally,
                                prefix, r.shared_registered, wt.grant.seqs);
        rt__stats_attempt(rt, wi, tally.ok || tally.client_error, tally.failed, tally.tokens);
        if (last != RT_OUT_REFUSED) /* a refusal is no attempt */
            record_attempt(q, &r, wi, last, t_attempt);
        if (w->cfg.kind == RT_KIND_SPILLWAY && r.n_tokens > had)
            spillway_sent = true;
        bool native_ids = w->cfg.kind == RT_KIND_LLAMA_SERVER && r.ls_native && !r.ls_ids_gap;
        bool resumable = r.stream && r.n_tokens > 0 && native_ids &&
                         (last == RT_OUT_OOM || last == RT_OUT_CRASH);
        sw_free(r.ls_resume_grammar); /* a check below may advance it again */
        r.ls_resume_grammar = NULL;
        r.ls_resume_ids = r.n_tokens;
        rt_failover_in fi = {last,
                             r.stream,
                             r.n_tokens,
                             r.content_sent,
                             w->cfg.kind,
                             RT_TOOL_NONE,
                             q->single_pass,
                             rt->sabotage.no_replay,
                             rt->sabotage.no_resume,
                             native_ids,
                             n_choices > 1,
                             !resumable || spillway_sent ? RT_LSR_SPILLWAY_IDS
                                                         : rt__ls_resume_check(
                                                               body, rt->models[q->model].tok,
                                                               r.tokens, r.n_tokens,
                                                               r.ls_image_tail,
                                                               &r.ls_resume_grammar),
                             resumable && spillway_left(rt, q, tried, wi, n_images > 0),
                             n_images > 0};
        rt_failover f = rt_failover_decide(&fi);
        resume_ls = f.action == RT_FO_RESUME && f.resume_on_ls;
        if (f.action == RT_FO_DONE || f.action == RT_FO_CANCEL)
            break;
        if (f.action == RT_FO_REQUEUE && r.refused_context) {
            /* llama-server: exceed_context_size_error (its slots' n_ctx,
             * which its next /slots poll gives the books): not that
             * worker again; the attempt does not count */
            tried[wi] = true;
            ctx_refused = true;
            q->attempts--;
            SW_INFO("router", "request %s: worker %s refused it: the prompt is over its context "
                    "(n_ctx %d); trying the others", q->request_id, w->cfg.name,
                    (int)r.refused_n_ctx);
            continue;
        }
        if (f.action == RT_FO_REQUEUE) {
            /* the books said it fits and the worker disagreed (held
             * above): the request goes back to its place; the attempt
             * does not count */
            q->attempts--;
            after_refusal = true;
            /* expected where routers share workers (counted in
             * spillway_router_worker_refusals_total): not a warning */
            SW_INFO("router", "request %s: worker %s refused it (%s) although the books had room; "
                    "back to the queue", q->request_id, w->cfg.name,
                    refused_memory ? "memory" : "busy");
            continue;
        }
        /* oom or crash: out of rotation until the supervisor says ready */
        tried[wi] = true;
        failed_before = true;
        if (r.ls_kv_full)
            f.restart = false; /* llama-server's KV cache was full: it is not
                                  poisoned, and a restart reloads the model */
        worker_failed(rt, wi, last, &f);
        SW_WARN("router", "request %s: %s on worker %s (phase %s, %zu tokens sent); %s",
                q->request_id, rt_outcome_name(last), w->cfg.name, r.phase, r.n_tokens,
                f.action == RT_FO_RESUME ? "resuming" : f.action == RT_FO_REPLAY ? "replaying"
                                                                                 : "stopping");
        if (!first_error) {
            first_error = json_pack("{s:s, s:s, s:s, s:f, s:s}", "worker", w->cfg.name, "kind",
                                    rt_outcome_name(last), "phase", r.phase, "time", rt__wall_s(),
                                    "worker_kind", kind_name(w->cfg.kind));
            char kv[8];
            worker_kv_type(rt, w->cfg.name, kv, sizeof kv);
            if (first_error && kv[0])
                json_object_set_new(first_error, "kv_type", json_string(kv));
            first = f;
        } else if (f.action == RT_FO_STOP && first.action != RT_FO_STOP) {
            first.decision = f.decision; /* how it ended, e.g. no resume */
            first.reason = f.reason;
        }
        if (f.action == RT_FO_STOP) {
            if (q->single_pass || rt->sabotage.no_replay)
                q->worker_failed = true; /* the caller (an agent run) decides */
            if (r.headers_sent) {
                json_t *e = RT_KIND_EXTERNAL(w->cfg.kind) && r.content_sent
                                ? rt__error_obj(500, f.error_code,
                                                last == RT_OUT_OOM
                                                    ? "the engine ran out of memory after text was "
                                                      "sent; an external engine cannot be resumed"
                                                    : "the engine failed after text was sent; an "
                                                      "external engine cannot be resumed",
                                                NULL)
                                : rt__error_obj(500, "worker_failed",
                                                "the request failed on every eligible worker",
                                                NULL);
                rt_sink_stream_error(&r, e);
                json_decref(e);
            } else {
                char ra[48];
                rt__retry_after(rt, ra, sizeof ra);
                rt__send_error(q, 503, "worker_failed",
                               last == RT_OUT_OOM ? "out of memory on every eligible worker"
                                                  : "the request failed on every eligible worker",
                               NULL, ra);
            }
            break;
        }
        /* replay or resume: the loop admits it again, keeping its place */
    }
    q->completed = r.finished;
    q->outcome = last;
    if (q->attempts > 0 && r.final_worker[0]) {
        pthread_mutex_lock(&rt->pool.mu);
        RT_POOL_FOR_LIVE(&rt->pool, i)
            if (!strcmp(rt->pool.w[i].cfg.name, r.final_worker))
                q->outcome_kind = rt->pool.w[i].cfg.kind;
        pthread_mutex_unlock(&rt->pool.mu);
    }
    if (first_error && q->defer_event) {
        q->failover_first_error = first_error; /* the agent run records it */
        first_error = NULL;
    }
    if (first_error)
        record_failover(q, &r, first_error, &first, t0, replay_start, last);
    if (sw_log_get_level() <= SW_LOG_INFO) {
        /* a line per request: built without printf's format parsing */
        char line[512];
        sw_tb t;
        sw_tb_init(&t, line, sizeof line);
        SW_TB_LIT(&t, "request ");
        sw_tb_str(&t, q->request_id);
        SW_TB_LIT(&t, ": ");
        sw_tb_str(&t, r.finished ? (r.status == 200 ? "ok" : "client error")
                      : fallback ? "queued as a job"
                      : last == RT_OUT_CLIENT_GONE ? "cancelled (client left)" : "failed");
        SW_TB_LIT(&t, ", worker ");
        sw_tb_str(&t, r.final_worker[0] ? r.final_worker : "-");
        SW_TB_LIT(&t, ", ");
        sw_tb_i64(&t, q->attempts);
        SW_TB_LIT(&t, " attempt(s), ");
        sw_tb_u64(&t, r.n_tokens);
        SW_TB_LIT(&t, " tokens, ");
        sw_tb_u64(&t, (uint64_t)((rt__now_s() - r.t_start) * 1000 + 0.5));
        SW_TB_LIT(&t, " ms");
        SW_INFO("router", "%s", line);
    }
    if (r.finished && r.status == 200) {
        pthread_mutex_lock(&rt->mu);
        hist_add(rt->lat_buckets, &rt->lat_count, &rt->lat_sum, rt__now_s() - r.t_start);
        if (r.ttft >= 0)
            hist_add(rt->ttft_buckets, &rt->ttft_count, &rt->ttft_sum, r.ttft);
        pthread_mutex_unlock(&rt->mu);
    }
    sw_free(r.tokens);
    sw_free(r.ls_image_tail);
    sw_free(r.ls_resume_grammar);
    sw_free(prefix);
    json_decref(body);
}

/* The body as JSON, or a 400 sent (NULL). */
static json_t *parse_body(rt_req *q)
{
    rt_router *rt = q->rt;
    if (json_depth(q->body, q->body_len) > RT_MAX_JSON_DEPTH) {
        count(rt, &rt->rejected_bad);
        rt__send_error(q, 400, "invalid_request", "the body is nested too deeply (at most 32 levels)",
                       NULL, NULL);
        return NULL;
    }
    json_error_t jerr;
    /* \u0000 is JSON (the worker says where it may be); the first attempt
     * forwards the client's text, a resume the body re-serialized, which
     * writes it back as \u0000; a number past 64 bits is kept as a marker
     * that sw_json_dumps writes back as the number (json_big.h) */
    json_t *body = sw_json_loadb_big(q->body, q->body_len,
                                     JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!body && sw_json_error_oom(&jerr)) {
        rt__send_error(q, 500, "internal_error", "out of memory reading the body", NULL, NULL);
        return NULL;
    }
    if (!body && sw_json_error_number_range(&jerr)) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "the body has a number outside what is supported exactly (integers within 64 "
                 "bits, reals within a double's range; 512 characters at most in a JSON "
                 "schema) at line %d, column %d",
                 jerr.line, jerr.column);
        count(rt, &rt->rejected_bad);
        rt__send_error(q, 400, "invalid_request", msg, NULL, NULL);
        return NULL;
    }
    if (!body || !json_is_object(body)) {
        count(rt, &rt->rejected_bad);
        rt__send_error(q, 400, body ? "invalid_request" : "invalid_json",
                       body ? "the body must be a JSON object" : jerr.text, NULL, NULL);
        json_decref(body);
        return NULL;
    }
    /* a number past 64 bits is taken in a JSON schema only (json_big.h) */
    const char *big_at = sw_json_big_field(body);
    if (big_at) {
        char msg[320];
        snprintf(msg, sizeof msg,
                 "'%.64s' has a number outside what is supported exactly (integers within 64 "
                 "bits, reals within a double's range); such numbers are taken only in a JSON "
                 "schema (response_format, a tool's parameters)",
                 big_at);
        count(rt, &rt->rejected_bad);
        rt__send_error(q, 400, "invalid_request", msg, big_at, NULL);
        json_decref(body);
        return NULL;
    }
    return body;
}

void rt__handle_generate(rt_req *q, bool chat)
{
    json_t *body = parse_body(q);
    if (body)
        generate(q, chat, body);
}

void rt__dispatch_generate(rt_req *q, bool chat)
{
    json_t *body = parse_body(q); /* once per request */
    if (!body)
        return;
    if (!resolve_model(q, body)) { /* before an agent run begins */
        json_decref(body);
        return;
    }
    json_t *te = json_object_get(body, "tool_execution");
    if (te) {
        const char *v = json_string_value(te);
        if (!v || strlen(v) != json_string_length(te) || (strcmp(v, "server") && strcmp(v, "client"))) {
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
            /* "client": the ordinary OpenAI flow; the worker does not know
             * the field */
            json_object_del(body, "tool_execution");
            q->body_edited = true;
            generate(q, chat, body);
            return;
        }
        json_decref(body);
        return;
    }
    generate(q, chat, body);
}

void rt__generate_capture(rt_router *rt, const char *request_id, bool chat, const char *body,
                          size_t len, long long deadline_ms, uint64_t *ticket, rt_capture *out,
                          int *attempts)
{
    rt_req q;
    memset(&q, 0, sizeof q);
    q.rt = rt;
    q.fd = -1;
    q.ticket = *ticket;
    q.deadline_ms = deadline_ms;
    snprintf(q.method, sizeof q.method, "POST");
    snprintf(q.path, sizeof q.path, "%s", chat ? "/v1/chat/completions" : "/v1/completions");
    snprintf(q.request_id, sizeof q.request_id, "%s", request_id);
    q.cap.on = true;
    q.durable = true; /* a job or an agent run's step: its attempts are promised */
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
        char *s = sw_json_dumps(e, JSON_COMPACT);
        json_decref(e);
        q.cap.status = 500;
        snprintf(q.cap.content_type, sizeof q.cap.content_type, "application/json");
        if (s)
            rt__capture_append(&q.cap, s, strlen(s));
        free(s);
    }
    *ticket = q.ticket;
    *out = q.cap;
    if (attempts)
        *attempts = q.attempts;
}

/* POST /tokenize: relayed to a ready worker of the model ("model" as for a
 * generation; a spillway worker or a llama-server, which take the same
 * {"content", "add_special"}), its answer given back as it is. Not
 * queued and not counted in the books: it holds no sequence. */
void rt__handle_tokenize(rt_req *q)
{
    rt_router *rt = q->rt;
    json_t *body = parse_body(q);
    if (!body)
        return;
    if (!resolve_model(q, body)) {
        json_decref(body);
        return;
    }
    json_decref(body);
    char address[sizeof rt->pool.w[0].address] = "";
    pthread_mutex_lock(&rt->pool.mu);
    RT_POOL_FOR_LIVE(&rt->pool, i) {
        const rt_worker *w = &rt->pool.w[i];
        if (w->model == q->model && rt_pool_state_locked(w) == WS_READY &&
            w->cfg.kind != RT_KIND_OPENAI) {
            snprintf(address, sizeof address, "%s", w->address);
            break;
        }
    }
    pthread_mutex_unlock(&rt->pool.mu);
    if (!address[0]) {
        char ra[48];
        rt__retry_after(rt, ra, sizeof ra);
        rt__send_error(q, 503, "capacity_exceeded", "no worker of the model is ready to tokenize",
                       NULL, ra);
        return;
    }
    rn_conn c;
    char *out = NULL;
    size_t len = 0;
    char hdr[128];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\nContent-Type: application/json\r\n",
             q->request_id);
    int rc = rn_request(&c, address, "POST", "/tokenize", hdr, q->body, q->body_len, q->fd,
                        rt->cfg->http_timeout_s * 1000);
    if (rc == 0 && rn_body_all(&c, &out, &len, rt->cfg->max_body_bytes * 8 + 65536) == 0)
        rt__send_response(q, c.status, c.content_type[0] ? c.content_type : "application/json",
                          NULL, out, len);
    else if (rc != -2)
        rt__send_error(q, 502, "worker_failed", "the worker did not answer /tokenize", NULL, NULL);
    rn_close(&c);
    sw_free(out);
}
