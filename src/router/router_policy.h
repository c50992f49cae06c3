/* router_policy.h - the routing policy: a pure function from a snapshot
 * of the pool, one request's need and the workers it already tried to a
 * decision: a worker and what to reserve there, or why none can take it.
 * No lock, no I/O, no clock: test_router_policy drives it from tables.
 */
#ifndef SPILLWAY_ROUTER_POLICY_H
#define SPILLWAY_ROUTER_POLICY_H

#include "router/router_pool.h"

#include <stdbool.h>
#include <stdint.h>

/* Why a worker was passed over (bits; one per worker in rt_decision). */
enum {
    RT_SKIP_TRIED = 1,     /* it failed this request already */
    RT_SKIP_DOWN = 2,      /* not ready (starting, down, suspect) */
    RT_SKIP_KIND = 4,      /* a stream to resume, and it cannot resume it */
    RT_SKIP_CTX = 8,       /* the prompt does not fit its context */
    RT_SKIP_SLOTS = 16,    /* every sequence the books allow is taken */
    RT_SKIP_MEM = 32,      /* the KV need does not fit its budget now */
    RT_SKIP_DEADLINE = 64, /* predicted to miss the deadline */
    RT_SKIP_HELD = 128,    /* it refused since its last /health */
    RT_SKIP_MODEL = 256,   /* it serves another model */
    RT_SKIP_REMOTE = 512,  /* remote, and the model says remote = never */
    RT_SKIP_IMAGES = 1024, /* image content, and it takes none (no projector) */
};

typedef struct rt_need {
    int model;             /* the model asked for (rt_worker_view.model);
                              -1 any */
    long prompt;           /* exact prompt tokens; -1 unknown */
    long max_tokens;       /* -1: up to the context */
    long prefill;          /* tokens computed before the answer when more
                              than prompt (an embeddings request's inputs,
                              each its own sequence of at most prompt
                              tokens); 0: prompt */
    int n_choices;         /* n: sequences it runs (each holds prompt +
                              max_tokens); 0 or 1: one */
    bool resume;           /* a stream with tokens sent: needs a resume */
    bool resume_ls;        /* and a llama-server of the model's vocabulary may
                              take it (rt_failover.resume_on_ls) */
    bool local_only;       /* remote = never: no remote worker */
    bool images;           /* image content: only a worker that takes it
                              (rt_worker_view.images) */
    long long deadline_ms; /* -1 none */
    double wait_ms;        /* predicted wait before it starts (deadline) */
    bool idle;             /* judge as if nothing were admitted anywhere
                              and every worker that can come back were
                              ready: could it ever be served? */
    double max_wait_ms;    /* idle: how long it may wait; a worker that is
                              not ready and cannot be back within it (or
                              not by itself) does not count; 0 no bound */
    const uint64_t *prefix; /* the prompt's block hashes (router_prefix.h) */
    int n_prefix;
    bool share;            /* the worker will take its prompt's cached blocks
                              (not a resume, not cache_prompt: false): blocks
                              requests in flight hold are not reserved again */
} rt_need;

/* The sequences a request takes on a worker of max_seqs (0: unknown): one,
 * or with n > 1 one per choice, at most max_seqs (the worker queues the
 * rest of its choices). */
static inline int32_t rt_policy_seqs(const rt_need *need, int32_t max_seqs)
{
    int32_t n = need->n_choices > 1 ? need->n_choices : 1;
    return max_seqs > 0 && n > max_seqs ? max_seqs : n;
}

typedef struct rt_decision {
    int worker;            /* index into rt_pool.w, -1 none */
    int64_t kv_bytes;      /* what to reserve on it (0: memory not counted) */
    int shared_blocks;     /* the prompt's first blocks that requests in flight
                              there hold (the worker's shared table): not in
                              kv_bytes; the grant holds them once more */
    long kv_tokens;        /* the tokens those bytes are for */
    unsigned skipped;      /* union of the reasons below */
    unsigned reason[RT_MAX_WORKERS]; /* by rt_pool.w index; 0: chosen or not reached */
    double best_pred_ms;   /* the best prediction of a worker with rates, -1 none */
    int32_t seqs;          /* the sequences a grant holds (set by the queue):
                              rt_policy_seqs */
    bool rates_unknown;    /* chosen as the fallback: no worker with rates
                              was predicted in time, this one has none */
} rt_decision;

/* The first worker in preference order, not yet tried, that is ready, fits
 * the need (context, the books' sequences and KV budget) and is predicted
 * to meet the deadline. With the prompt's block hashes, a later worker of
 * the same preference (workers an operator ranks alike: replicas) that
 * also fits is taken instead when its summary holds a longer start of the
 * prompt (rt_policy_prefers): preference order itself is never overridden,
 * so a request is not moved to a slower tier for its cache. With a deadline, a worker that reports no rates
 * (calibration off, kind = openai) cannot be predicted: it is taken (the
 * first such) only when no worker with rates is predicted in time. tried
 * is indexed like rt_pool.w (NULL: none). Returns d->worker. */
int rt_policy_decide(const rt_pool_view *v, const rt_need *need, const bool *tried,
                     rt_decision *d);

/* Whether worker b, whose summary holds mb of the prompt's blocks, takes
 * it over a (which holds ma, and comes first in preference order): b is of
 * the same preference and holds more. */
bool rt_policy_prefers(const rt_worker_view *a, int ma, const rt_worker_view *b, int mb);

/* The prompt's first blocks that requests in flight on w hold (its shared
 * table): a request that will take them from the worker's cache does not
 * reserve them again (0 unless need->share, memory counted, 16-token
 * blocks, no sliding layers). */
int rt_policy_shared_blocks(const rt_worker_view *w, const rt_need *need);

/* KV bytes a request of tokens reserves on a worker: whole blocks of its
 * block size, of a sliding-window model's local share no more than
 * sliding_blocks_max (0 when memory is not counted there). */
int64_t rt_policy_kv_bytes(const rt_worker_view *w, long tokens);

#endif
