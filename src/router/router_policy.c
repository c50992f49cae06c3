/* router_policy.c - the routing policy (router_policy.h): which worker
 * takes a request, or why none can now.
 */
#include "router/router_policy.h"

#include <string.h>

int rt_policy_shared_blocks(const rt_worker_view *w, const rt_need *need)
{
    int n = 0;
    if (!need->share || need->idle || !need->prefix || !w->shared || !w->count_memory ||
        w->block_tokens != RT_PREFIX_BLOCK_TOKENS || w->sliding_block_bytes > 0)
        return 0;
    while (n < need->n_prefix && rt_shared_refs(w->shared, need->prefix[n]) > 0)
        n++;
    return n;
}

static int rt_policy_match(const rt_worker_view *w, const rt_need *need)
{
    return rt_prefix_match(w->prefix, need->prefix, need->n_prefix);
}

int64_t rt_policy_kv_bytes(const rt_worker_view *w, long tokens)
{
    if (!w->count_memory || tokens <= 0)
        return 0;
    int64_t blocks = ((int64_t)tokens + w->block_tokens - 1) / w->block_tokens;
    /* a sliding-window model's local layers hold at most their window's
     * blocks, however long the sequence */
    int64_t beyond = w->sliding_block_bytes > 0 && blocks > w->sliding_blocks_max
                         ? blocks - w->sliding_blocks_max
                         : 0;
    return blocks * w->block_bytes - beyond * w->sliding_block_bytes;
}

bool rt_policy_prefers(const rt_worker_view *a, int ma, const rt_worker_view *b, int mb)
{
    return a->preference == b->preference && mb > ma;
}

int rt_policy_decide(const rt_pool_view *v, const rt_need *need, const bool *tried,
                     rt_decision *d)
{
    memset(d, 0, sizeof *d);
    d->worker = -1;
    d->best_pred_ms = -1;
    int unknown_rates = -1;
    int64_t unknown_bytes = 0;
    long unknown_tokens = 0;
    int unknown_shared = 0;
    /* with the prompt's blocks, every worker is looked at: the one chosen
     * so far (k_best) may give way to one that holds more of the prompt */
    const bool by_prefix = need->prefix && need->n_prefix > 0 && !need->idle;
    int k_best = -1, m_best = 0;
    for (int k = 0; k < v->n && (d->worker < 0 || by_prefix); k++) {
        const rt_worker_view *w = &v->w[k];
        unsigned why = 0;
        long prompt = need->prompt < 0 ? 0 : need->prompt;
        /* the tokens the worker may hold: prompt + max_tokens, within its
         * context; an unknown prompt reserves the whole context */
        long tokens = prompt + (need->max_tokens < 0 ? 0 : need->max_tokens);
        if (w->ctx_limit > 0 && (need->prompt < 0 || need->max_tokens < 0 || tokens > w->ctx_limit))
            tokens = w->ctx_limit;
        /* n > 1: one sequence per choice, each with its own KV (their
         * prompt blocks shared or not: counted whole, on the safe side) */
        int64_t bytes = rt_policy_kv_bytes(w, tokens) *
                        (need->n_choices > 1 ? need->n_choices : 1);
        /* no context figure yet and no bound on the tokens (an unknown
         * prompt or max_tokens): the request may hold all the KV memory
         * there is, so it takes the whole budget (it runs alone there) */
        if (w->count_memory && w->ctx_limit <= 0 && (need->prompt < 0 || need->max_tokens < 0))
            bytes = w->kv_budget > bytes ? w->kv_budget : bytes;
        int shared = rt_policy_shared_blocks(w, need);
        bytes -= (int64_t)shared * w->block_bytes;
        if (need->model >= 0 && w->model != need->model)
            why = RT_SKIP_MODEL;
        else if (need->local_only && w->remote)
            why = RT_SKIP_REMOTE;
        else if (need->images && (w->images == 0 || (w->images < 0 && w->state == WS_READY)))
            why = RT_SKIP_IMAGES; /* one not asked yet is judged when it is up */
        else if (tried && tried[w->index])
            why = RT_SKIP_TRIED;
        else if (w->state != WS_READY &&
                 (!need->idle || w->back_in_s < 0 ||
                  (need->max_wait_ms > 0 && w->back_in_s * 1000 > need->max_wait_ms)))
            why = RT_SKIP_DOWN;
        else if (need->resume && RT_KIND_EXTERNAL(w->kind) &&
                 !(need->resume_ls && w->kind == RT_KIND_LLAMA_SERVER && w->ls_resumable))
            why = RT_SKIP_KIND; /* a llama-server takes a resume from a token prompt
                                   only where it continues it exactly */
        else if (w->ctx_limit > 0 && (need->prompt > w->ctx_limit ||
                                      (need->prompt == w->ctx_limit && need->max_tokens != 0)))
            why = RT_SKIP_CTX; /* a prompt that fills the context leaves no room for a
                                  token; one that generates none (embeddings) fits */
        else if (!need->idle && w->held)
            why = RT_SKIP_HELD;
        else if (!need->idle && w->max_seqs > 0 &&
                 w->seqs + rt_policy_seqs(need, w->max_seqs) > w->max_seqs)
            why = RT_SKIP_SLOTS;
        else if (w->count_memory &&
                 (need->idle ? bytes > (w->shared_device ? w->kv_device_capacity : w->kv_budget)
                             : bytes > w->kv_budget - w->kv_reserved - w->kv_foreign ||
                                   (w->shared_device && bytes > w->kv_device_room)))
            why = RT_SKIP_MEM;
        if (!why && need->deadline_ms >= 0) {
            if (w->prefill_rate > 0 && w->decode_rate > 0) {
                long gen = tokens - prompt;
                long work = need->prefill > prompt ? need->prefill : prompt;
                double pred = need->wait_ms + ((double)work / w->prefill_rate +
                                               (double)(gen > 0 ? gen : 0) / w->decode_rate) *
                                                  1000;
                if (d->best_pred_ms < 0 || pred < d->best_pred_ms)
                    d->best_pred_ms = pred;
                if (pred > (double)need->deadline_ms)
                    why = RT_SKIP_DEADLINE;
            } else {
                if (unknown_rates < 0) {
                    unknown_rates = w->index;
                    unknown_bytes = bytes;
                    unknown_tokens = tokens;
                    unknown_shared = shared;
                }
                continue; /* a fallback, not a choice */
            }
        }
        d->reason[w->index] = why;
        d->skipped |= why;
        if (!why) {
            int m = by_prefix && w->prefix ? rt_policy_match(w, need) : 0;
            if (k_best >= 0 && !rt_policy_prefers(&v->w[k_best], m_best, w, m))
                continue;
            k_best = k;
            m_best = m;
            d->worker = w->index;
            d->kv_bytes = bytes;
            d->kv_tokens = tokens;
            d->shared_blocks = shared;
        }
    }
    if (d->worker < 0 && unknown_rates >= 0) {
        d->worker = unknown_rates;
        d->kv_bytes = unknown_bytes;
        d->kv_tokens = unknown_tokens;
        d->shared_blocks = unknown_shared;
        d->rates_unknown = true;
    }
    return d->worker;
}
