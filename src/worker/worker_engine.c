/* worker_engine.c - the worker's engine thread: admission, continuous
 * batching and everything that touches the model context.
 *
 * One loop: take cancellations and newcomers between steps, then advance
 * every active sequence by one step (a prefill chunk of at most
 * prefill_chunk tokens for a newcomer, one token for the others) in one
 * batched call, and post what happened to the HTTP thread. The per-token
 * step is eng_generate's own (eng_sample_step: logprobs of the raw logits,
 * one draw, under the constraint's mask when there is one), in eng_generate's
 * order (fault hook, step, stop checks, decode), so a worker's tokens equal
 * `spillway run`'s; with several decoding slots, the unconstrained ones'
 * draws are made first, in parallel on the context's threads (wk_presample),
 * and a slot that fails before taking its token gives the draw back, so the
 * result is the same. A constrained request (response_format, a forced tool
 * call) gets the budget that max_tokens and the context leave; it ends as
 * soon as the value is closed, and stop strings do not cut it. Between
 * loading the model and reporting ready it measures the worker's own
 * prefill and decode rates (calibrate), so the router can predict
 * deadlines before the first request.
 */
#include "worker/worker-impl.h"

#include "api/api_responses.h"

#include "common/alloc.h"
#include "common/log.h"
#include "device/fault.h"

#include <math.h>
#include <string.h>

#define MOD "worker"

void wk_req_free(wk_req *req)
{
    if (!req)
        return;
    for (size_t i = 0; i < req->n_stops; i++)
        sw_free(req->stops[i]);
    sw_free(req->stops);
    sw_free(req->bias_ids);
    sw_free(req->bias_values);
    sw_free(req->prompt);
    sw_free(req->text);
    sw_free(req->echo);
    json_decref(req->token_ids);
    json_decref(req->lp);
    eng_constraint_free(req->cons);
    eng_grammar_free(req->grammar);
    for (size_t i = 0; i < req->n_tools; i++)
        sw_free(req->tool_names[i]);
    sw_free(req->tool_names);
    eng_reasoning_free(&req->rs);
    eng_reasoning_delta_free(&req->rd);
    eng_reasoning_text_free(&req->reasoning);
    json_decref(req->responses);
    api_resp_stream_free(req->resp_stream);
    if (req->msg)
        api_msg_stream_free(req->msg);
    sw_free(req->msg);
    wk__embed_free(req->embed);
    sw_free(req);
}

void wk_event_free(wk_event *ev)
{
    if (!ev)
        return;
    sw_free(ev->text);
    json_decref(ev->extra);
    sw_free(ev);
}

int wk_engine_submit(wk_server *s, wk_req *req)
{
    return wk_engine_submit_all(s, &req, 1);
}

int wk_engine_submit_all(wk_server *s, wk_req *const *reqs, int32_t n)
{
    return wk_engine_offer(s, reqs, n, NULL);
}

/* The device KV bytes a request's admission takes at least: its blocks
 * (prompt + max_tokens under reserve, the prompt under grow, within the
 * context), of a sliding-window model's local layers at most their
 * ring's, less the prompt's whole blocks where the prefix cache may hold
 * them already (they are then shared, not taken: whether they are is
 * known only on the engine thread, whose admission is exact). */
static int64_t kv_need_bytes(const wk_server *s, const wk_req *req)
{
    if (req->embed || s->kv_block_tokens <= 0)
        return 0;
    int64_t tokens = req->n_prompt;
    if (s->o.policy == ENG_KV_RESERVE)
        tokens += req->max_tokens;
    if (tokens > s->n_ctx)
        tokens = s->n_ctx;
    int64_t blocks = (tokens + s->kv_block_tokens - 1) / s->kv_block_tokens;
    int64_t sliding_max = eng_context_kv_sliding_blocks_max(s->ctx);
    int64_t beyond = sliding_max > 0 && blocks > sliding_max ? blocks - sliding_max : 0;
    int64_t cached = 0;
    if (sliding_max <= 0 && req->cache_prompt && req->n_resume == 0 &&
        eng_context_prefix_cache_on(s->ctx))
        cached = req->n_prompt / s->kv_block_tokens;
    if (cached > blocks)
        cached = blocks;
    return (blocks - cached) * (int64_t)eng_context_kv_block_device_bytes(s->ctx) -
           beyond * (int64_t)eng_context_kv_sliding_block_device_bytes(s->ctx);
}

int wk_engine_offer(wk_server *s, wk_req *const *reqs, int32_t n, wk_room *room)
{
    int64_t need = 0;
    for (int32_t i = 0; i < n; i++)
        need += reqs[i]->kv_need = kv_need_bytes(s, reqs[i]);
    /* the device's free memory above the reserve, read before the lock
     * (the same figure /health gives); none on the CPU */
    int64_t dev_free = -1;
    dev_memory mem;
    if (s->dev && dev_get_kind(s->dev) != DEV_KIND_CPU &&
        dev_memory_info(s->dev, &mem, NULL) == SW_OK) {
        uint64_t reserve = (uint64_t)((double)mem.total_bytes * s->o.reserve);
        dev_free = mem.free_bytes > reserve ? (int64_t)(mem.free_bytes - reserve) : 0;
    }
    int rc = SW_OK;
    pthread_mutex_lock(&s->lock);
    int32_t places = s->n_seqs + s->o.max_queue - s->n_accepted;
    int64_t kv_free = -1;
    if (dev_free >= 0) {
        /* what the requests queued before this one will take first */
        int64_t pending = 0;
        for (const wk_req *q = s->queue_head; q; q = q->next)
            pending += q->kv_need;
        kv_free = dev_free + (int64_t)s->cache.device_bytes_cached - pending;
        if (kv_free < 0)
            kv_free = 0;
    }
    if (s->n_accepted > 0 && n > places) {
        rc = SW_ERANGE;
        s->n_refused_slots++;
    } else if (s->n_accepted > 0 && kv_free >= 0 && need > kv_free) {
        rc = SW_EDEVOOM;
        s->n_refused_memory++;
    } else {
        for (int32_t i = 0; i < n; i++) {
            wk_req *req = reqs[i];
            req->next = NULL;
            if (s->queue_tail)
                s->queue_tail->next = req;
            else
                s->queue_head = req;
            s->queue_tail = req;
            s->n_queued++;
        }
        s->n_accepted += n;
        if (s->n_accepted > s->max_accepted_seen)
            s->max_accepted_seen = s->n_accepted;
        pthread_cond_signal(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    if (room) {
        room->memory = rc == SW_EDEVOOM;
        room->places_free = places > 0 ? places : 0;
        room->kv_free_bytes = kv_free;
        room->kv_need_bytes = need;
    }
    return rc;
}

void wk_engine_cancel(wk_server *s, wk_req *req)
{
    pthread_mutex_lock(&s->lock);
    req->cancelled = true;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* ---- events ---------------------------------------------------------- */

typedef struct ev_list {
    wk_event *head, *tail;
} ev_list;

static wk_event *ev_new(ev_list *l, wk_event_kind kind, wk_req *req)
{
    wk_event *ev = sw_calloc(1, sizeof *ev);
    if (!ev)
        return NULL;
    ev->kind = kind;
    ev->req = req;
    if (l->tail)
        l->tail->next = ev;
    else
        l->head = ev;
    l->tail = ev;
    return ev;
}

/* A final event must never be lost (the request would leak and its client
 * hang), so it is allocated before the work that needs it; this fallback
 * only covers the tiny allocation itself failing: retry until it works. */
static wk_event *ev_new_final(ev_list *l, wk_event_kind kind, wk_req *req)
{
    wk_event *ev;
    while (!(ev = ev_new(l, kind, req)))
        ;
    return ev;
}

/* A token of a request that is not streamed goes to the HTTP thread
 * without waking it, up to this many such events: it collects them with
 * the next event that wakes it (the request's end at the latest). Waking
 * it per token made it take a core from the engine's threads once per
 * token, in the middle of their parallel work. */
#define WK_EV_QUIET_MAX 64

static void post_events(wk_server *s, ev_list *l)
{
    if (!l->head)
        return;
    bool wake = false;
    int32_t quiet = 0;
    for (const wk_event *ev = l->head; ev; ev = ev->next) {
        if (ev->kind == WK_EV_TOKEN && !ev->req->stream)
            quiet++;
        else
            wake = true;
    }
    pthread_mutex_lock(&s->lock);
    /* the requests that ended give their places back before their
     * answers go out (a client that sees one end may send the next) */
    for (const wk_event *ev = l->head; ev; ev = ev->next)
        if ((ev->kind == WK_EV_DONE || ev->kind == WK_EV_ERROR) && s->n_accepted > 0)
            s->n_accepted--;
    if (s->ev_tail)
        s->ev_tail->next = l->head;
    else
        s->ev_head = l->head;
    s->ev_tail = l->tail;
    s->ev_unwoken += quiet;
    if (s->ev_unwoken >= WK_EV_QUIET_MAX)
        wake = true;
    if (wake)
        s->ev_unwoken = 0;
    pthread_mutex_unlock(&s->lock);
    l->head = l->tail = NULL;
    if (wake)
        wk_http_wake(s);
}

static void ev_error(ev_list *l, wk_req *req, int http_status, const char *type, const char *code,
                     json_t *extra, const char *fmt, const char *detail)
{
    wk_event *ev = ev_new_final(l, WK_EV_ERROR, req);
    ev->http_status = http_status;
    ev->type = type;
    ev->code = code;
    ev->extra = extra;
    snprintf(ev->message, sizeof ev->message, fmt, detail ? detail : "");
}

/* ---- slots ----------------------------------------------------------- */

static void slot_release(wk_server *s, int32_t seq)
{
    wk_slot *sl = &s->slots[seq];
    eng_seq_clear(s->ctx, seq);
    eng_sampler_free(sl->sampler);
    sw_free(sl->history);
    sw_free(sl->logits);
    sw_free(sl->logprobs);
    sw_free(sl->held);
    memset(sl, 0, sizeof *sl);
}

/* X-Spillway-Fault (tests; common/alloc.h): the request's engine-side
 * fault scope is current while the engine works for it (admission,
 * sampling, the end), so its allocations there are counted and the
 * header's engine:N fails one. Returns the previous scope, to restore. A
 * failure the code does not report (the held text, an event's text, one
 * inside the constraint) still ends the request with a 500: the thread's
 * failure count is compared before and after. */
static sw_alloc_scope *engine_scope_enter(wk_req *req)
{
    return sw_alloc_scope_swap(req->fault_scoped ? &req->engine_fault_scope : NULL);
}

static bool held_append(wk_slot *sl, const char *text, size_t n)
{
    if (n == 0)
        return true;
    if (sl->held_len + n > sl->held_cap) {
        size_t cap = (sl->held_len + n) * 2 + 64;
        char *p = sw_realloc(sl->held, cap);
        if (!p)
            return false;
        sl->held = p;
        sl->held_cap = cap;
    }
    memcpy(sl->held + sl->held_len, text, n);
    sl->held_len += n;
    return true;
}

/* How much of the held text can be released now. Returns the number of
 * bytes to release and sets *stopped when a stop string was found (the
 * text before it is released, the stop string and everything after never
 * are). Otherwise it keeps back the longest tail that could still become
 * the start of a stop string, so no part of one ever leaks. */
static size_t held_release(const wk_req *req, wk_slot *sl, bool *stopped)
{
    size_t best = SIZE_MAX;
    *stopped = false;
    if (sl->held_len == 0)
        return 0;
    for (size_t i = 0; i < req->n_stops; i++) {
        const char *hit = memmem(sl->held, sl->held_len, req->stops[i], strlen(req->stops[i]));
        if (hit && (size_t)(hit - sl->held) < best) {
            best = (size_t)(hit - sl->held);
            sl->stop_which = (int32_t)i + 1; /* which one: Messages' stop_sequence */
        }
    }
    if (best != SIZE_MAX) {
        *stopped = true;
        return best;
    }
    size_t keep = 0;
    for (size_t i = 0; i < req->n_stops; i++) {
        size_t len = strlen(req->stops[i]);
        for (size_t k = len - 1; k > keep; k--) {
            if (k <= sl->held_len && memcmp(sl->held + sl->held_len - k, req->stops[i], k) == 0) {
                keep = k;
                break;
            }
        }
    }
    return sl->held_len - keep;
}

static void take_held(wk_slot *sl, size_t n, wk_event *ev)
{
    if (n > 0) {
        ev->text = sw_malloc(n);
        if (ev->text) {
            memcpy(ev->text, sl->held, n);
            ev->text_len = n;
        }
    }
    if (sl->held_len > n)
        memmove(sl->held, sl->held + n, sl->held_len - n);
    sl->held_len -= n;
}

static void publish_stats(wk_server *s)
{
    size_t kv = eng_context_kv_bytes_used(s->ctx);
    size_t kv_dev = eng_context_kv_device_bytes_used(s->ctx);
    size_t dev = eng_context_device_bytes(s->ctx);
    int64_t budget = -1;
    dev_memory mem;
    if (s->dev && dev_memory_info(s->dev, &mem, NULL) == SW_OK) {
        uint64_t reserve = (uint64_t)((double)mem.total_bytes * s->o.reserve);
        budget = (int64_t)(mem.free_bytes > reserve ? mem.free_bytes - reserve : 0) + (int64_t)kv_dev;
    }
    int32_t active = 0;
    for (int32_t i = 0; i < s->n_seqs; i++)
        active += s->slots[i].req != NULL;
    eng_prefix_cache_stats cache;
    eng_context_prefix_cache_stats(s->ctx, &cache);
    /* cached blocks are evictable: the KV this worker could hold counts them */
    if (budget >= 0)
        budget += (int64_t)cache.device_bytes_cached;
    pthread_mutex_lock(&s->lock);
    s->cache = cache;
    s->kv_used_bytes = kv;
    s->kv_device_used_bytes = kv_dev;
    s->kv_budget_at_publish = budget;
    s->device_bytes = dev;
    s->slots_active = active;
    if (active > s->max_active_seen)
        s->max_active_seen = active;
    pthread_mutex_unlock(&s->lock);
}

static void count_outcome(wk_server *s, const char *outcome, int32_t n_prompt, int32_t n_gen)
{
    pthread_mutex_lock(&s->lock);
    if (strcmp(outcome, "ok") == 0)
        s->n_ok++;
    else if (strcmp(outcome, "cancelled") == 0)
        s->n_cancelled++;
    else if (strcmp(outcome, "oom") == 0)
        s->n_oom++;
    else
        s->n_error++;
    s->prompt_tokens_total += (uint64_t)(n_prompt > 0 ? n_prompt : 0);
    s->generated_tokens_total += (uint64_t)(n_gen > 0 ? n_gen : 0);
    pthread_mutex_unlock(&s->lock);
}

static void finish_slot(wk_server *s, int32_t seq, ev_list *l, const char *finish)
{
    wk_slot *sl = &s->slots[seq];
    wk_req *req = sl->req;
    sw_alloc_scope *scope_prev = engine_scope_enter(req);
    wk_event *ev = ev_new_final(l, WK_EV_DONE, req);
    long failures = sw_alloc_thread_failures(); /* after the event: it never fails */
    if (strcmp(finish, "cancelled") != 0 && !sl->stop_hit) {
        char buf[16];
        size_t n = eng_detok_flush(&sl->detok, buf, sizeof buf);
        held_append(sl, buf, n);
    }
    if (strcmp(finish, "cancelled") != 0 && !sl->stop_hit && sl->held_len) {
        bool stopped;
        size_t n = held_release(req, sl, &stopped);
        if (!stopped)
            n = sl->held_len; /* the end: a partial stop string is just text */
        else
            finish = "stop";
        take_held(sl, n, ev);
    }
    if (sw_alloc_thread_failures() != failures) {
        /* the last text was lost: the end is an error, not a short answer */
        sw_free(ev->text);
        ev->text = NULL;
        ev->text_len = 0;
        ev->kind = WK_EV_ERROR;
        ev->http_status = 500;
        ev->type = "server_error";
        ev->code = "internal_error";
        snprintf(ev->message, sizeof ev->message, "out of host memory");
        count_outcome(s, "error", req->n_prompt_client, sl->n_generated);
        slot_release(s, seq);
        sw_alloc_scope_swap(scope_prev);
        return;
    }
    ev->finish = finish;
    if (strcmp(finish, "stop") == 0 && sl->stop_which > 0 && (size_t)sl->stop_which <= req->n_stops)
        ev->stop_string = req->stops[sl->stop_which - 1];
    ev->n_generated = sl->n_generated;
    ev->n_cached = sl->n_cached;
    ev->draws = sl->sampler ? eng_sampler_draws(sl->sampler) : req->skip_draws;
    count_outcome(s, strcmp(finish, "cancelled") == 0 ? "cancelled" : "ok", req->n_prompt_client,
                  sl->n_generated);
    slot_release(s, seq);
    sw_alloc_scope_swap(scope_prev);
}

static void fail_slot(wk_server *s, int32_t seq, ev_list *l, int rc, const char *phase,
                      const sw_error *err)
{
    wk_req *req = s->slots[seq].req;
    int32_t n_gen = s->slots[seq].n_generated;
    sw_alloc_scope *scope_prev = engine_scope_enter(req);
    if (rc == SW_EDEVOOM) {
        json_t *extra = json_pack("{s:s, s:i}", "phase", phase, "tokens_generated", n_gen);
        ev_error(l, req, 503, "server_error", "out_of_memory", extra,
                 "device out of memory during %s", phase);
        count_outcome(s, "oom", req->n_prompt_client, n_gen);
    } else {
        ev_error(l, req, 500, "server_error",
                 rc == SW_EDEVICE ? "device_failed" : "internal_error", NULL, "%s",
                 err && err->message[0] ? err->message : sw_strerror(rc));
        count_outcome(s, "error", req->n_prompt_client, n_gen);
    }
    slot_release(s, seq);
    sw_alloc_scope_swap(scope_prev);
}

/* The prefix cache (engine/model.h): a slot that has computed nothing of
 * its prompt yet takes the cached blocks its prompt starts with, at
 * admission (so they are not reserved again) and again before its first
 * prefill chunk (a request admitted with others that share its start finds
 * the blocks the first of them computed meanwhile). Not for a resumed
 * stream, whose replayed tokens must be computed as they were generated,
 * nor when the request says cache_prompt: false. */
static void attach_cached_prefix(wk_server *s, int32_t seq)
{
    wk_slot *sl = &s->slots[seq];
    const wk_req *req = sl->req;
    if (!req->cache_prompt || req->n_resume > 0 || sl->n_prefilled != sl->n_cached)
        return;
    int32_t n = eng_seq_attach_prefix(s->ctx, seq, req->prompt, req->n_prompt);
    sl->n_prefilled += n;
    sl->n_cached += n;
}

/* Admission of a newcomer into a free slot: allocations, then (policy
 * reserve) the whole KV need of prompt + max_tokens, all or nothing. */
static void admit_slot(wk_server *s, wk_req *req, ev_list *l, long failures)
{
    int32_t seq = -1;
    for (int32_t i = 0; i < s->n_seqs; i++) {
        if (!s->slots[i].req) {
            seq = i;
            break;
        }
    }
    wk_slot *sl = &s->slots[seq];
    const eng_hparams *hp = eng_model_hparams(s->model);
    size_t hist = (size_t)req->n_prompt + (size_t)req->max_tokens + 1;
    sw_error err;

    memset(sl, 0, sizeof *sl);
    sl->req = req;
    sl->history = sw_malloc(hist * sizeof(int32_t));
    sl->logits = sw_malloc((size_t)hp->n_vocab * sizeof(float));
    sl->logprobs = req->top_logprobs || req->logprobs
                       ? sw_malloc((size_t)hp->n_vocab * sizeof(float))
                       : NULL;
    sl->sampler = eng_sampler_create(&req->sampling, hp->n_vocab);
    if (!sl->history || !sl->logits || ((req->top_logprobs || req->logprobs) && !sl->logprobs) ||
        !sl->sampler) {
        sw_error_set(&err, SW_ENOMEM, "out of host memory admitting the request");
        fail_slot(s, seq, l, SW_ENOMEM, "admission", &err);
        return;
    }
    eng_sampler_set_draws(sl->sampler, req->skip_draws);
    memcpy(sl->history, req->prompt, (size_t)req->n_prompt * sizeof(int32_t));
    sl->n_history = (size_t)req->n_prompt;
    /* A resumed stream continues the detokenizer where the interrupted one
     * was: bytes of a character cut at the resume point come out with the
     * next token, as they would have. */
    /* Text of the resumed tokens that the client never got (held back as a
     * possible start of a stop string when the first worker failed) is held
     * here again, so it comes out, or stops the reply, as it would have. */
    int64_t resumed_text = 0;
    for (int32_t i = req->n_prompt - req->n_resume; i < req->n_prompt; i++) {
        char buf[4096]; /* as for a sampled token (sample_slot) */
        size_t n = eng_detok_push(s->tok, &sl->detok, req->prompt[i], buf, sizeof buf);
        if (req->resume_text_bytes < 0 || req->cons || req->n_stops == 0)
            continue;
        int64_t skip = req->resume_text_bytes - resumed_text;
        resumed_text += (int64_t)n;
        if (skip < (int64_t)n)
            held_append(sl, buf + (skip > 0 ? skip : 0), n - (size_t)(skip > 0 ? skip : 0));
    }
    eng_seq_clear(s->ctx, seq);
    attach_cached_prefix(s, seq);
    {
        /* reserve: the whole need of prompt + max_tokens; grow: the prompt
         * (prefill would take it anyway), so a prompt that cannot fit is
         * refused before any work under either policy. */
        int64_t need = (int64_t)req->n_prompt;
        if (s->o.policy == ENG_KV_RESERVE)
            need += req->max_tokens;
        if (need > s->n_ctx)
            need = s->n_ctx;
        int rc = eng_seq_reserve(s->ctx, seq, (int32_t)need, &err);
        if (rc == SW_EDEVOOM) {
            dev_memory mem = {0};
            uint64_t free_bytes = 0;
            uint64_t needed = eng_context_kv_sequence_bytes(s->ctx, need);
            if (s->dev && dev_memory_info(s->dev, &mem, NULL) == SW_OK) {
                uint64_t reserve = (uint64_t)((double)mem.total_bytes * s->o.reserve);
                free_bytes = mem.free_bytes > reserve ? mem.free_bytes - reserve : 0;
            }
            json_t *extra = json_pack("{s:s, s:I, s:I, s:i}", "phase", "admission",
                                      "bytes_needed", (json_int_t)needed, "bytes_free",
                                      (json_int_t)free_bytes, "tokens", (int)need);
            char detail[160];
            snprintf(detail, sizeof detail, "%d tokens need %llu bytes of KV memory, %llu are free",
                     (int)need, (unsigned long long)needed, (unsigned long long)free_bytes);
            ev_error(l, req, 503, "server_error", "out_of_memory", extra,
                     "the request does not fit on the device: %s", detail);
            count_outcome(s, "oom", req->n_prompt_client, 0);
            pthread_mutex_lock(&s->lock);
            s->n_rejected++;
            pthread_mutex_unlock(&s->lock);
            slot_release(s, seq);
            return;
        }
        if (rc) {
            fail_slot(s, seq, l, rc, "admission", &err);
            return;
        }
    }
    if (sw_alloc_thread_failures() != failures) { /* the resumed text held back */
        sw_error_set(&err, SW_ENOMEM, "out of host memory admitting the request");
        fail_slot(s, seq, l, SW_ENOMEM, "admission", &err);
        return;
    }
    ev_new_final(l, WK_EV_START, req);
}

static void admit(wk_server *s, wk_req *req, ev_list *l)
{
    sw_alloc_scope *scope_prev = engine_scope_enter(req);
    admit_slot(s, req, l, sw_alloc_thread_failures());
    sw_alloc_scope_swap(scope_prev);
}

/* An embeddings request (worker_embeddings.c), run whole in a free slot's
 * sequence between two steps; its final event either way. False when the
 * device failed (the worker must stop, as after a failed step). */
static bool embed_request(wk_server *s, wk_req *req, ev_list *l)
{
    sw_alloc_scope *scope_prev = engine_scope_enter(req);
    int32_t seq = -1, n_prompt = req->n_prompt_client;
    sw_error err;
    int rc;
    for (int32_t i = 0; i < s->n_seqs && seq < 0; i++)
        if (!s->slots[i].req)
            seq = i;
    sw_error_clear(&err);
    rc = seq < 0 ? sw_error_set(&err, SW_EINTERNAL, "no free sequence") /* not reached: counted */
                 : wk__embed_run(s, req, seq, &err);
    if (rc == SW_OK || rc == SW_ECANCELLED) {
        wk_event *ev = ev_new_final(l, WK_EV_DONE, req);
        ev->finish = rc == SW_OK ? "stop" : "cancelled";
        count_outcome(s, rc == SW_OK ? "ok" : "cancelled", n_prompt, 0);
    } else if (rc == SW_EDEVOOM) {
        json_t *extra = json_pack("{s:s, s:i}", "phase", "admission", "tokens_generated", 0);
        ev_error(l, req, 503, "server_error", "out_of_memory", extra,
                 "the request does not fit on the device: %s", err.message);
        count_outcome(s, "oom", n_prompt, 0);
    } else {
        ev_error(l, req, 500, "server_error",
                 rc == SW_EDEVICE ? "device_failed" : "internal_error", NULL, "%s",
                 err.message[0] ? err.message : sw_strerror(rc));
        count_outcome(s, "error", n_prompt, 0);
    }
    sw_alloc_scope_swap(scope_prev);
    return rc != SW_EDEVICE;
}

/* The batched step: one eng_decode_batch per group of entries whose tokens
 * fit the context's n_batch (one group unless many prefill chunks meet). */
static int decode_step(wk_server *s, const eng_batch_entry *entries, int32_t n, int *status,
                       sw_error *errs)
{
    int32_t n_batch = eng_context_params_get(s->ctx)->n_batch;
    for (int32_t start = 0; start < n;) {
        int32_t end = start, tokens = 0;
        while (end < n && (end == start || tokens + entries[end].n_tokens <= n_batch))
            tokens += entries[end++].n_tokens;
        int rc;
        if (end - start == 1) {
            /* One sequence: the single-sequence path (same results). */
            status[start] = eng_decode(s->ctx, entries[start].seq_id, entries[start].tokens,
                                       entries[start].n_tokens, entries[start].logits,
                                       &errs[start]);
            rc = SW_OK;
        } else {
            rc = eng_decode_batch(s->ctx, entries + start, end - start, status + start,
                                  &errs[start]);
        }
        if (rc) {
            for (int32_t i = start; i < end; i++) {
                status[i] = rc;
                errs[i] = errs[start];
            }
        }
        start = end;
    }
    return SW_OK;
}

/* What eng_sample_step reads for a decoding slot. */
static eng_step_inputs slot_step_inputs(wk_server *s, int32_t seq)
{
    wk_slot *sl = &s->slots[seq];
    wk_req *req = sl->req;
    /* The budget of a constrained reply is what max_tokens and the
     * context still allow. */
    int64_t left = (int64_t)req->max_tokens - sl->n_generated;
    int64_t room = (int64_t)s->n_ctx - eng_seq_length(s->ctx, seq);
    eng_step_inputs in = {
        .sampler = sl->sampler,
        .n_vocab = eng_model_hparams(s->model)->n_vocab,
        .logprobs = sl->logprobs,
        .top_logprobs = req->top_logprobs,
        .constraint = req->cons,
        .budget = left < room ? left : room,
    };
    return in;
}

/* A step's samples drawn ahead, in parallel on the context's threads, for
 * the decoding slots without a constraint (step(), phase 1; a single such
 * slot lends the threads to its draw instead): a draw reads
 * and writes only its own slot (logits, history, sampler, log-probability
 * scratch) and allocates nothing, so it gives the token the one-by-one
 * path would. A constraint's step feeds its automaton and may allocate
 * (under the request's allocation scope): those slots draw in phase 2. */
typedef struct wk_presample {
    bool done;
    bool constraint_end;
    eng_generate_step step;
} wk_presample;

typedef struct wk_presample_job {
    wk_server *s;
    int32_t seqs[WK_MAX_SLOTS];
    wk_presample *pre; /* indexed by seq */
} wk_presample_job;

static void presample_task(void *arg, int32_t item)
{
    wk_presample_job *job = arg;
    int32_t seq = job->seqs[item];
    wk_slot *sl = &job->s->slots[seq];
    wk_presample *pre = &job->pre[seq];
    eng_step_inputs in = slot_step_inputs(job->s, seq);
    sw_error err;
    memset(&pre->step, 0, sizeof pre->step);
    /* without a constraint eng_sample_step cannot fail */
    pre->done = eng_sample_step(&in, sl->logits, sl->history, &sl->n_history, &pre->step,
                                &pre->constraint_end, &err) == SW_OK;
}

static void presample_for_each(void *ctx, int32_t n_items, void (*fn)(void *arg, int32_t item),
                               void *arg)
{
    eng_context_parallel_for(ctx, n_items, fn, arg);
}

/* A slot that fails before taking its drawn token gives the draw back, so
 * its counter and history are what the one-by-one path leaves. */
static void presample_undo(wk_slot *sl, wk_presample *pre)
{
    if (!pre || !pre->done)
        return;
    sl->n_history--;
    eng_sampler_set_draws(sl->sampler, eng_sampler_draws(sl->sampler) - 1);
    pre->done = false;
}

/* One token of a decoding slot: eng_generate's loop body up to the decode,
 * with the token drawn ahead in pre when pre->done. Returns true when the
 * slot continues (its token goes into this step). */
static bool sample_slot_in(wk_server *s, int32_t seq, ev_list *l, long failures,
                           wk_presample *pre)
{
    wk_slot *sl = &s->slots[seq];
    wk_req *req = sl->req;
    if (dev_fault_before_token((int64_t)sl->n_generated) == SW_EDEVICE) {
        sw_error err;
        sw_error_set(&err, SW_EDEVICE, "the device failed (injected by SPILLWAY_FAULT)");
        s->device_error_seen = true;
        presample_undo(sl, pre);
        fail_slot(s, seq, l, SW_EDEVICE, "decode", &err);
        return false;
    }
    wk_event *before = l->tail;
    wk_event *ev = ev_new(l, WK_EV_TOKEN, req);
    if (!ev) {
        sw_error err;
        sw_error_set(&err, SW_ENOMEM, "out of host memory");
        presample_undo(sl, pre);
        fail_slot(s, seq, l, SW_ENOMEM, "decode", &err);
        return false;
    }
    eng_generate_step step;
    bool constraint_end = false;
    sw_error err;
    memset(&step, 0, sizeof step);
    if (pre && pre->done) {
        step = pre->step;
        constraint_end = pre->constraint_end;
    } else {
        eng_step_inputs in = slot_step_inputs(s, seq);
        if (eng_sample_step(&in, sl->logits, sl->history, &sl->n_history, &step,
                            &constraint_end, &err)) {
            fail_slot(s, seq, l, SW_EINTERNAL, "decode", &err);
            return false;
        }
    }
    int32_t token = step.token;
    ev->token = token;
    if (sl->n_generated == 0) /* the prompt is computed: its blocks are in place */
        ev->prefix_tokens = eng_seq_prefix_cached_tokens(s->ctx, seq);
    if (sl->logprobs) {
        ev->logprob = step.logprob;
        ev->n_top = step.n_top;
        memcpy(ev->top, step.top, sizeof ev->top);
    }
    sl->n_generated++;

    char buf[4096];
    size_t n = eng_detok_push(s->tok, &sl->detok, token, buf, sizeof buf);
    bool stopped = false;
    held_append(sl, buf, n);
    /* A constrained reply is never cut by stop strings (they could cut the
     * JSON); it ends when the value is closed. */
    take_held(sl, req->cons ? sl->held_len : held_release(req, sl, &stopped), ev);
    if (sw_alloc_thread_failures() != failures) {
        /* this token's text (or the constraint's step) lost memory: the
         * event is dropped and the request ends with an error */
        if (before)
            before->next = NULL;
        else
            l->head = NULL;
        l->tail = before;
        wk_event_free(ev);
        sw_error_set(&err, SW_ENOMEM, "out of host memory");
        fail_slot(s, seq, l, SW_ENOMEM, "decode", &err);
        return false;
    }
    if (req->cons && constraint_end) {
        finish_slot(s, seq, l, "stop");
        return false;
    }
    if (stopped) {
        sl->stop_hit = true;
        finish_slot(s, seq, l, "stop");
        return false;
    }
    bool end_of_turn = false;
    for (int32_t i = 0; i < req->n_stop_tokens; i++)
        end_of_turn |= token == req->stop_tokens[i];
    if (end_of_turn || (!req->ignore_eos && eng_tokenizer_is_eog(s->tok, token))) {
        finish_slot(s, seq, l, "stop");
        return false;
    }
    /* The context holds the prompt and every generated token, this one
     * included (not yet decoded): it ends when that count reaches n_ctx. */
    if (sl->n_generated >= req->max_tokens || eng_seq_length(s->ctx, seq) + 1 >= s->n_ctx) {
        finish_slot(s, seq, l, "length");
        return false;
    }
    sl->pending_token = token;
    return true;
}

static bool sample_slot(wk_server *s, int32_t seq, ev_list *l, wk_presample *pre)
{
    sw_alloc_scope *scope_prev = engine_scope_enter(s->slots[seq].req);
    bool going = sample_slot_in(s, seq, l, sw_alloc_thread_failures(), pre);
    sw_alloc_scope_swap(scope_prev);
    return going;
}

static bool device_fatal(int rc)
{
    return rc == SW_EDEVICE;
}

/* Runs one step over every active slot. Returns false after a device
 * failure (every request got its error; the worker must exit). */
static bool step(wk_server *s, ev_list *l)
{
    eng_batch_entry entries[WK_MAX_SLOTS];
    int32_t seqs[WK_MAX_SLOTS];
    int status[WK_MAX_SLOTS];
    sw_error errs[WK_MAX_SLOTS];
    bool prefill[WK_MAX_SLOTS];
    int32_t n = 0, n_prefill_tokens = 0, n_decode_tokens = 0;

    /* Phase 1: the decoding slots' samples, in parallel (wk_presample). */
    wk_presample pre[WK_MAX_SLOTS];
    wk_presample_job job = {.s = s, .pre = pre};
    int32_t n_pre = 0;
    for (int32_t seq = 0; seq < s->n_seqs; seq++) {
        wk_slot *sl = &s->slots[seq];
        pre[seq].done = false;
        if (sl->req && sl->decoding && !sl->req->cons)
            job.seqs[n_pre++] = seq;
    }
    if (n_pre > 1) {
        eng_context_parallel_for(s->ctx, n_pre, presample_task, &job);
    } else if (n_pre == 1) {
        /* one slot: its draw splits the vocabulary over the threads instead */
        eng_sampler *sampler = s->slots[job.seqs[0]].sampler;
        eng_sampler_threads threads = {presample_for_each, s->ctx,
                                       eng_context_n_threads(s->ctx)};
        eng_sampler_set_threads(sampler, &threads);
        presample_task(&job, 0);
        eng_sampler_set_threads(sampler, NULL);
    }

    /* Phase 2: each slot in turn (events, text, stops, the batch) */
    for (int32_t seq = 0; seq < s->n_seqs; seq++) {
        wk_slot *sl = &s->slots[seq];
        if (!sl->req)
            continue;
        if (!sl->decoding) {
            /* Prefill: at most one newcomer per step, a chunk of at most
             * prefill_chunk tokens, so a step (what every decoding sequence
             * waits for) stays short however many prompts arrive. Chunks
             * start at multiples of prefill_chunk of the sequence's own
             * prompt, whatever else is running, and resumed tokens are
             * replayed one per step as they were generated: the kernels may
             * round a many-token product differently from a one-token one,
             * and a sequence's results must not depend on its company (8
             * streams together give their solo tokens; a resumed stream
             * continues bit for bit). */
            int32_t fresh = sl->req->n_prompt - sl->req->n_resume;
            if (n_prefill_tokens == 0)
                attach_cached_prefix(s, seq);
            int32_t left = sl->n_prefilled < fresh ? fresh - sl->n_prefilled
                                                   : sl->req->n_prompt - sl->n_prefilled;
            int32_t chunk = sl->n_prefilled < fresh ? left : 1;
            /* after cached tokens, the chunks keep the cold run's
             * boundaries (multiples of prefill_chunk) */
            int32_t to_boundary = s->o.prefill_chunk - sl->n_prefilled % s->o.prefill_chunk;
            if (chunk > to_boundary)
                chunk = to_boundary;
            if (chunk > 1 && n_prefill_tokens > 0)
                continue; /* one prefill chunk per step */
            bool last = sl->n_prefilled + chunk == sl->req->n_prompt;
            entries[n] = (eng_batch_entry){seq, sl->req->prompt + sl->n_prefilled, chunk,
                                           last ? sl->logits : NULL};
            prefill[n] = true;
            n_prefill_tokens += chunk;
        } else {
            if (!sample_slot(s, seq, l, &pre[seq]))
                continue;
            entries[n] = (eng_batch_entry){seq, &sl->pending_token, 1, sl->logits};
            prefill[n] = false;
            n_decode_tokens++;
        }
        seqs[n++] = seq;
    }
    if (n == 0)
        return !s->device_error_seen;
    /* The step's tokens go out before its forward pass when they are all
     * it has to say (a request's start or end goes out after the step,
     * with the stats that show its slot taken or free): a stream's token
     * is sent a forward pass sooner, and the HTTP thread works during the
     * forward pass, whose products balance a thread it delays, not during
     * the next draw. */
    bool only_tokens = true;
    for (const wk_event *ev = l->head; ev; ev = ev->next)
        only_tokens &= ev->kind == WK_EV_TOKEN;
    if (only_tokens)
        post_events(s, l);
    double t0 = eng_now_seconds();
    for (int32_t i = 0; i < n; i++)
        sw_error_clear(&errs[i]);
    decode_step(s, entries, n, status, errs);
    double dt = eng_now_seconds() - t0;
    pthread_mutex_lock(&s->lock);
    /* The step's time is shared between its prefill and decode tokens in
     * proportion; the rates in /health are totals over totals. */
    int32_t total = n_prefill_tokens + n_decode_tokens;
    s->prefill_tokens += n_prefill_tokens;
    s->prefill_seconds += dt * n_prefill_tokens / total;
    s->decode_tokens += n_decode_tokens;
    s->decode_seconds += dt * n_decode_tokens / total;
    pthread_mutex_unlock(&s->lock);

    bool fatal = false;
    for (int32_t i = 0; i < n; i++) {
        int32_t seq = seqs[i];
        wk_slot *sl = &s->slots[seq];
        if (status[i] == SW_ECONTEXT) {
            finish_slot(s, seq, l, "length");
        } else if (status[i]) {
            fatal |= device_fatal(status[i]);
            fail_slot(s, seq, l, status[i], prefill[i] ? "prefill" : "decode", &errs[i]);
        } else if (prefill[i]) {
            sl->n_prefilled += entries[i].n_tokens;
            if (sl->n_prefilled == sl->req->n_prompt) {
                pthread_mutex_lock(&s->lock);
                s->prompt_tokens_computed += (uint64_t)(sl->n_prefilled - sl->n_cached);
                if (sl->n_cached > 0)
                    s->cache_hits++;
                else
                    s->cache_misses++;
                pthread_mutex_unlock(&s->lock);
                sl->decoding = true;
                /* a resumed stream whose tokens fill the context has
                 * no room left (a client's prompt that does was refused) */
                if (sl->req->max_tokens == 0 || sl->req->n_prompt >= s->n_ctx)
                    finish_slot(s, seq, l, "length");
            }
        }
    }
    return !fatal && !s->device_error_seen;
}

static int load(wk_server *s, sw_error *err)
{
    int rc;
    if (s->o.device) {
        dev_options dopts = {.sim_capacity_bytes = s->o.sim_capacity};
        if ((rc = dev_open(s->o.device, &dopts, &s->dev, err)))
            return rc;
    }
    /* layers bound for a real or simulated GPU are uploaded there, not also
     * copied into host memory */
    eng_model_load_params lp = eng_model_load_default_params();
    if (s->dev && dev_get_kind(s->dev) != DEV_KIND_CPU)
        lp.n_device_layers = s->o.gpu_layers;
    if ((rc = eng_model_load_with(s->o.model_path, &lp, &s->model, err)))
        return rc;
    const eng_hparams *hp = eng_model_hparams(s->model);
    eng_context_params cp = eng_context_default_params();
    cp.device = s->dev;
    cp.n_gpu_layers = s->o.gpu_layers;
    cp.kv_policy = s->o.policy;
    cp.kv_type = s->o.kv_type;
    cp.reserve_fraction = s->o.reserve;
    cp.n_threads = s->o.threads;
    cp.n_seq_max = s->o.max_seqs;
    cp.n_ctx = s->o.ctx_limit;
    if (cp.n_ctx <= 0)
        cp.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if ((rc = eng_context_create(s->model, &cp, &s->ctx, err)))
        return rc;
    const eng_context_params *p = eng_context_params_get(s->ctx);

    /* The model's id: the one given (the router's [model NAME]), else
     * general.name, else the file name. */
    if (s->o.model_id)
        snprintf(s->model_id, sizeof s->model_id, "%s", s->o.model_id);
    else
        api_model_id(eng_model_gguf(s->model), s->o.model_path, s->model_id, sizeof s->model_id);
    api_system_fingerprint(s->o.model_path, s->fingerprint, sizeof s->fingerprint);
    s->tok = eng_model_tokenizer(s->model);
    if ((rc = eng_cs_vocab_create(s->tok, &s->cs_vocab, err)))
        return rc;
    eng_chat_source source = ENG_CHAT_FALLBACK_MISSING;
    if ((rc = eng_chat_choose(eng_model_gguf(s->model), s->o.chat_template, &s->chat_family,
                              &source, err)) == SW_EFORMAT) {
        SW_WARN(MOD, "%s: using ChatML", err->message);
        s->chat_family = ENG_CHAT_CHATML;
        source = ENG_CHAT_FALLBACK_UNKNOWN;
    } else if (rc) {
        return rc;
    }
    bool thinks = eng_chat_reasoning_syntax(s->chat_family) != ENG_REASONING_NONE;
    SW_INFO(MOD, "chat template: %s (%s)%s%s", eng_chat_family_name(s->chat_family),
            eng_chat_source_name(source), thinks ? ", reasoning format " : "",
            thinks ? (s->o.reasoning_format == ENG_REASONING_FORMAT_NONE ? "none" : "deepseek")
                   : "");
    s->n_ctx = p->n_ctx;
    if (s->o.prefill_chunk > p->n_batch)
        s->o.prefill_chunk = p->n_batch;
    s->n_seqs = p->n_seq_max < WK_MAX_SLOTS ? p->n_seq_max : WK_MAX_SLOTS;
    s->kv_block_tokens = p->kv_block_tokens;
    s->kv_bytes_per_token = eng_kv_bytes_per_token(hp, p->kv_type);
    s->kv_block_bytes = eng_kv_block_bytes(hp, p->kv_type, p->kv_block_tokens);
    return SW_OK;
}

/* ---- start-up calibration -------------------------------------------- */

/* A worker that has served nothing has no measured rates, so the router
 * could not tell a slow cold worker from a fast one when a request has a
 * deadline (docs/router.md, Admission and routing). Before it reports
 * ready the worker therefore runs a short real measurement through the
 * engine on a scratch sequence: a warm-up chunk (it pages the mapped
 * weights in and fills the caches, so it is not counted unless nothing
 * else could run), up to CALIB_PREFILL_TOKENS prompt tokens in chunks of the worker's own
 * prefill_chunk, then up to CALIB_DECODE_STEPS one-token steps with logits,
 * as a decoding sequence has. The work is capped by tokens and by time: a
 * prompt chunk is cut to what the rate so far predicts fits before
 * CALIB_BUDGET_S, and a step predicted to end past it is not started,
 * except the one decode step without which there is no decode rate. The sequence is cleared afterwards, so the KV blocks, the
 * memory figures and the request and token counters are what they were.
 * Fault injection is suspended on this thread meanwhile: the allocations
 * and tokens SPILLWAY_FAULT counts are those of requests, as before.
 *
 * The figures seed the totals the /health rates are computed from; real
 * traffic adds to them, and the calibration's few tokens soon weigh
 * little. A failure (no KV memory on a small device, no host memory) only
 * means no rates: logged, and the worker starts. */
#define CALIB_WARMUP_TOKENS 8
#define CALIB_PREFILL_TOKENS 48
#define CALIB_DECODE_STEPS 8
#define CALIB_BUDGET_S 0.5

/* Token i of the scratch prompt: ids spread over the vocabulary (the cost
 * of a forward pass does not depend on which ids they are). */
static int32_t calib_token(int32_t i, int32_t n_vocab)
{
    return (int32_t)(((int64_t)i * 7919 + 1) % n_vocab);
}

/* Returns SW_OK (rates seeded, or none after a failure that was logged),
 * or SW_EDEVICE with *err set when the device failed: the context is then
 * unusable and the worker must not report ready. */
static int calibrate(wk_server *s, sw_error *err)
{
    const int32_t seq = 0; /* no request can hold a slot before READY */
    const int32_t n_vocab = eng_model_hparams(s->model)->n_vocab;
    int32_t warmup = CALIB_WARMUP_TOKENS, measured = CALIB_PREFILL_TOKENS;
    int32_t steps = CALIB_DECODE_STEPS;
    int32_t chunk = s->o.prefill_chunk;
    double pre_tokens = 0, pre_s = 0, dec_tokens = 0, dec_s = 0;
    float *logits = NULL;
    int rc = SW_OK;

    if (s->o.skip_calibration) {
        SW_INFO(MOD, "start-up calibration off: no rates until requests measure them");
        return SW_OK;
    }
    /* Fit the context: the warm-up and one decode step at least. */
    if (s->n_ctx < 2) {
        SW_WARN(MOD, "calibration skipped: a context of %d tokens is too small", s->n_ctx);
        return SW_OK;
    }
    if (warmup > s->n_ctx - 1)
        warmup = s->n_ctx - 1;
    if (warmup > chunk)
        warmup = chunk;
    if (steps > s->n_ctx - warmup)
        steps = s->n_ctx - warmup;
    if (measured > s->n_ctx - warmup - steps)
        measured = s->n_ctx - warmup - steps;

    sw_error_clear(err);
    dev_fault_suspend(true);
    logits = sw_malloc((size_t)n_vocab * sizeof(float));
    if (!logits) {
        rc = sw_error_set(err, SW_ENOMEM, "out of host memory for the logits");
        goto fail;
    }
    eng_seq_clear(s->ctx, seq);
    /* All the KV blocks first (whatever the policy): a device too small for
     * them fails here, before any work. */
    if ((rc = eng_seq_reserve(s->ctx, seq, warmup + measured + steps, err)))
        goto fail;

    int32_t pos = 0;
    double t_start = eng_now_seconds();
    int32_t prompt[CALIB_PREFILL_TOKENS]; /* warm-up and chunks are no longer */
    for (int32_t i = 0; i < warmup; i++)
        prompt[i] = calib_token(pos + i, n_vocab);
    if ((rc = eng_decode(s->ctx, seq, prompt, warmup, logits, err)))
        goto fail;
    pos += warmup;
    double t_warm = eng_now_seconds() - t_start;
    double rate = t_warm > 0 ? warmup / t_warm : 0; /* prompt tokens per second so far */

    for (int32_t done = 0; done < measured;) {
        int32_t n = measured - done;
        if (n > chunk)
            n = chunk;
        /* what the rate so far says fits in the time left: a smaller
         * chunk (the warm-up's rate is pessimistic; a warm chunk then
         * corrects it), or nothing */
        double left_s = CALIB_BUDGET_S - (eng_now_seconds() - t_start);
        if (rate > 0 && n > left_s * rate)
            n = left_s > 0 ? (int32_t)(left_s * rate) : 0;
        if (n < 1)
            break;
        for (int32_t i = 0; i < n; i++)
            prompt[i] = calib_token(pos + i, n_vocab);
        double t0 = eng_now_seconds();
        if ((rc = eng_decode(s->ctx, seq, prompt, n, logits, err)))
            goto fail;
        double dt = eng_now_seconds() - t0;
        pos += n;
        done += n;
        pre_tokens += n;
        pre_s += dt;
        rate = pre_s > 0 ? pre_tokens / pre_s : rate;
    }
    if (pre_tokens == 0) {
        /* Nothing but the warm-up fitted in the budget: a pessimistic
         * figure beats none, and traffic soon corrects it. */
        pre_tokens = warmup;
        pre_s = t_warm;
    }

    for (int32_t k = 0; k < steps; k++) {
        double spent = eng_now_seconds() - t_start;
        if (k > 0 && spent + dec_s / dec_tokens > CALIB_BUDGET_S)
            break;
        int32_t token = calib_token(pos, n_vocab);
        double t0 = eng_now_seconds();
        if ((rc = eng_decode(s->ctx, seq, &token, 1, logits, err)))
            goto fail;
        dec_s += eng_now_seconds() - t0;
        dec_tokens += 1;
        pos++;
    }
    eng_seq_clear(s->ctx, seq);
    dev_fault_suspend(false);
    sw_free(logits);

    if (pre_s <= 0 || dec_s <= 0) {
        /* a clock too coarse to see the work: no figure rather than an
         * infinite one */
        SW_WARN(MOD, "calibration measured no time: no rates until requests measure them");
        return SW_OK;
    }
    pthread_mutex_lock(&s->lock);
    s->prefill_tokens = s->calib_prefill_tokens = pre_tokens;
    s->prefill_seconds = pre_s;
    s->decode_tokens = s->calib_decode_tokens = dec_tokens;
    s->decode_seconds = dec_s;
    pthread_mutex_unlock(&s->lock);
    SW_INFO(MOD, "calibration: %.0f prompt tokens at %.1f tokens/s, %.0f decode steps at %.1f "
            "tokens/s (%.0f ms with the warm-up)", pre_tokens, pre_tokens / pre_s, dec_tokens,
            dec_tokens / dec_s, (eng_now_seconds() - t_start) * 1000);
    return SW_OK;

fail:
    eng_seq_clear(s->ctx, seq);
    dev_fault_suspend(false);
    sw_free(logits);
    if (rc == SW_EDEVICE)
        return rc;
    SW_WARN(MOD, "calibration failed, no rates until requests measure them: %s",
            err->message[0] ? err->message : sw_strerror(rc));
    sw_error_clear(err);
    return SW_OK;
}

void *wk_engine_main(void *arg)
{
    wk_server *s = arg;
    sw_error err;
    ev_list l = {0};
    int rc;

    sw_error_clear(&err);
    if ((rc = load(s, &err)) || (rc = calibrate(s, &err))) {
        pthread_mutex_lock(&s->lock);
        s->state = WK_FAILED;
        snprintf(s->fail_message, sizeof s->fail_message, "%s",
                 err.message[0] ? err.message : sw_strerror(rc));
        pthread_mutex_unlock(&s->lock);
        SW_ERROR(MOD, "startup failed: %s", s->fail_message);
        wk_http_wake(s);
        return NULL;
    }
    /* on after calibration: its scratch prompt is nobody's prefix */
    eng_context_set_prefix_cache(s->ctx, s->o.prefix_cache);
    eng_context_set_prefix_cache_retain(s->ctx, !s->o.shared_device);
    publish_stats(s);
    pthread_mutex_lock(&s->lock);
    if (s->state == WK_LOADING)
        s->state = WK_READY;
    pthread_mutex_unlock(&s->lock);
    SW_INFO(MOD, "model %s ready: context %d tokens, %d sequences", s->model_id, s->n_ctx,
            s->n_seqs);
    wk_http_wake(s);

    for (;;) {
        wk_req *newcomers = NULL, **tail = &newcomers;
        bool any_active = false, stop;
        for (int32_t i = 0; i < s->n_seqs; i++)
            any_active |= s->slots[i].req != NULL;

        pthread_mutex_lock(&s->lock);
        while (!s->stop_engine && !any_active && !s->queue_head)
            pthread_cond_wait(&s->cond, &s->lock);
        stop = s->stop_engine;
        /* Cancellations, then as many newcomers as there are free slots. */
        int32_t free_slots = 0;
        for (int32_t i = 0; i < s->n_seqs; i++)
            free_slots += s->slots[i].req == NULL || s->slots[i].req->cancelled;
        while (s->queue_head && free_slots > 0) {
            wk_req *r = s->queue_head;
            s->queue_head = r->next;
            if (!s->queue_head)
                s->queue_tail = NULL;
            s->n_queued--;
            r->next = NULL;
            *tail = r;
            tail = &r->next;
            free_slots--;
        }
        bool cancelled[WK_MAX_SLOTS] = {false};
        for (int32_t i = 0; i < s->n_seqs; i++)
            cancelled[i] = s->slots[i].req && (s->slots[i].req->cancelled || stop);
        bool newcomer_cancelled[WK_MAX_SLOTS] = {false};
        int32_t k = 0;
        for (wk_req *r = newcomers; r && k < WK_MAX_SLOTS; r = r->next, k++)
            newcomer_cancelled[k] = r->cancelled || stop;
        pthread_mutex_unlock(&s->lock);

        for (int32_t i = 0; i < s->n_seqs; i++)
            if (cancelled[i])
                finish_slot(s, i, &l, "cancelled");
        k = 0;
        bool device_ok = true;
        for (wk_req *r = newcomers, *next; r; r = next, k++) {
            next = r->next;
            r->next = NULL;
            if (newcomer_cancelled[k]) {
                wk_event *ev = ev_new_final(&l, WK_EV_DONE, r);
                ev->finish = "cancelled";
                count_outcome(s, "cancelled", r->n_prompt_client, 0);
            } else if (r->embed) {
                device_ok = embed_request(s, r, &l) && device_ok;
            } else {
                admit(s, r, &l);
            }
        }
        if (stop) {
            /* Whatever is still queued gets a final event too. */
            pthread_mutex_lock(&s->lock);
            wk_req *q = s->queue_head;
            bool device_failed = s->device_failed;
            s->queue_head = s->queue_tail = NULL;
            s->n_queued = 0;
            pthread_mutex_unlock(&s->lock);
            for (wk_req *r = q, *next; r; r = next) {
                next = r->next;
                if (device_failed) {
                    ev_error(&l, r, 500, "server_error", "device_failed", NULL, "%s",
                             "the device failed before this request started");
                } else {
                    wk_event *ev = ev_new_final(&l, WK_EV_DONE, r);
                    ev->finish = "cancelled";
                }
            }
            publish_stats(s);
            post_events(s, &l);
            break;
        }
        bool ok = device_ok && step(s, &l);
        publish_stats(s);
        if (ok)
            post_events(s, &l);
        if (!ok) {
            /* An unrecoverable device error: fail everything, then stop.
             * The failure is recorded before the step's events go out, so
             * the HTTP thread, handling them, sees it and exits even when
             * they finish the last live request. */
            for (int32_t i = 0; i < s->n_seqs; i++) {
                if (s->slots[i].req) {
                    sw_error e;
                    sw_error_set(&e, SW_EDEVICE, "the device failed");
                    fail_slot(s, i, &l, SW_EDEVICE, "decode", &e);
                }
            }
            pthread_mutex_lock(&s->lock);
            s->device_failed = true;
            s->state = WK_FAILED;
            snprintf(s->fail_message, sizeof s->fail_message, "unrecoverable device error");
            s->stop_engine = true;
            pthread_mutex_unlock(&s->lock);
            publish_stats(s);
            SW_ERROR(MOD, "unrecoverable device error: exiting with status %d",
                     WK_EXIT_DEVICE_FAILURE);
            post_events(s, &l);
            wk_http_wake(s); /* even with no event left to deliver */
            /* Requests still queued are answered by the loop's stop path. */
        }
    }
    return NULL;
}
