/* router_pool.h - the pool: the worker table the router routes from, with
 * its own lock, and the router's books of what it admitted to each
 * worker (sequences and reserved KV bytes).
 *
 * The supervisor writes a worker's state and its /health figures here;
 * the queue (router_queue.h) takes and gives back capacity in the books;
 * the policy (router_policy.h) decides from a snapshot (rt_pool_view).
 * Every field of rt_worker is guarded by rt_pool.mu.
 */
#ifndef SPILLWAY_ROUTER_POOL_H
#define SPILLWAY_ROUTER_POOL_H

#include "router/router.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum { WS_STARTING, WS_READY, WS_DOWN, WS_SUSPECT };

const char *rt_ws_name(int state);

/* What the router has admitted to one worker and not yet seen end. */
typedef struct rt_books {
    int seqs;              /* requests running there now */
    int64_t kv_bytes;      /* KV bytes reserved for them (device part) */
} rt_books;

typedef struct rt_worker {
    rt_worker_config cfg;
    char address[640];          /* unix:PATH or http://HOST:PORT */
    char log_path[600];
    pid_t pid;
    int state;
    double next_start;
    double backoff;
    double started_at;
    double last_health;
    double last_ok;             /* last /health 200 (or the spawn) */
    bool ready_once;            /* ready since the last spawn */
    bool restart_requested;
    bool health_now;            /* poll /health at the next pass */
    int restarts;
    int last_exit;              /* exit status of the last exit, -1 none */
    /* from /health */
    bool on_device;
    int64_t mem_total, mem_used, mem_reserved, mem_free;
    int64_t mem_context;        /* its context's device bytes (weights,
                                   workspace, KV) */
    int64_t kv_bpt;
    int32_t ctx_limit;
    int32_t slots_max;          /* the worker's max-seqs; 0 unknown */
    int32_t kv_block_tokens;    /* 0 unknown */
    int64_t kv_block_bytes;     /* one block's device part; 0 unknown */
    int64_t kv_held_bytes;      /* device KV the worker holds now */
    int64_t kv_reported_budget; /* the KV it could hold now (kv.budget_bytes), -1 none */
    double prefill_rate, decode_rate;
    char rates_source[16];  /* the worker's /health: none, calibration, measured */
    /* the books, and what /health says they may reach */
    rt_books books;
    int64_t kv_budget;          /* free + the worker's own KV at its last
                                   /health; -1 when memory is not counted */
    bool held;                  /* refused since the last /health: the books
                                   may not grow until it reconciles them */
    /* metrics */
    uint64_t req_ok, req_client_error, req_failed, tokens;
    uint64_t refused_memory, refused_slots; /* by the worker (stay 0) */
} rt_worker;

typedef struct rt_pool {
    pthread_mutex_t mu;
    rt_worker w[RT_MAX_WORKERS];
    int order[RT_MAX_WORKERS];  /* preference order */
    int n;
} rt_pool;

/* One worker as the policy sees it: a copy taken under the lock. */
typedef struct rt_worker_view {
    int index;                  /* into rt_pool.w */
    int state;
    int kind;                   /* RT_KIND_* */
    int32_t ctx_limit;          /* 0 unknown */
    int32_t max_seqs;           /* 0 no limit known */
    int seqs;                   /* admitted now (books) */
    bool held;
    bool count_memory;          /* on a device, with block figures */
    int32_t block_tokens;
    int64_t block_bytes;
    int64_t kv_budget, kv_reserved;
    double prefill_rate, decode_rate;
} rt_worker_view;

typedef struct rt_pool_view {
    rt_worker_view w[RT_MAX_WORKERS]; /* in preference order */
    int n;
} rt_pool_view;

/* Fills the pool from the configuration (state, addresses, preference
 * order); the lock is initialised here. */
void rt_pool_init(rt_pool *p, const rt_config *c);
void rt_pool_destroy(rt_pool *p);

/* With p->mu held: a snapshot of every worker in preference order. */
void rt_pool_view_locked(const rt_pool *p, rt_pool_view *out);

/* With p->mu held: the sequences a worker may run at once by the books
 * (its reported max-seqs, else the configured one; 0 no limit). */
int32_t rt_pool_max_seqs(const rt_worker *w);

/* With p->mu held: the books take / give back one request's share. */
void rt_pool_take_locked(rt_pool *p, int wi, int64_t kv_bytes);
void rt_pool_give_locked(rt_pool *p, int wi, int64_t kv_bytes);

/* With p->mu held: the worker refused a request the books admitted
 * (memory or slots): it takes nothing more until its next /health, which
 * is asked for now. */
void rt_pool_refused_locked(rt_pool *p, int wi, bool memory);

/* With p->mu held: new /health figures reconcile the books (the budget
 * follows what the device really has free). */
void rt_pool_reconcile_locked(rt_worker *w);

#endif
