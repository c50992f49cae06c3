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
#include "router/router_prefix.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum { WS_STARTING, WS_READY, WS_DOWN, WS_SUSPECT, WS_DRAINING, WS_STOPPED };

const char *rt_ws_name(int state);

/* A reload (router_reload.c) drains a worker before it stops it: its
 * admitted requests finish, no new one is admitted. REMOVE: then it is
 * gone; RESTART: then it starts again with its new configuration. */
enum { RT_DRAIN_NONE, RT_DRAIN_REMOVE, RT_DRAIN_RESTART,
       RT_DRAIN_STOP /* an on-demand worker: idle, or evicted for another */ };

/* What the router has admitted to one worker and not yet seen end. */
typedef struct rt_books {
    int seqs;              /* requests running there now */
    int64_t kv_bytes;      /* KV bytes reserved for them (device part) */
} rt_books;

typedef struct rt_worker {
    rt_worker_config cfg;
    int model;                  /* index into the router's models */
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
    /* a sliding-window model (gemma3): the local layers' share of
     * kv_block_bytes, and the most blocks of that share a sequence holds
     * (kv.sliding_*; 0 when none or not reported: every block whole) */
    int64_t kv_sliding_block_bytes;
    int32_t kv_sliding_blocks_max;
    int64_t kv_held_bytes;      /* device KV the worker holds now */
    rt_prefix_summary prefix;   /* the prompts it was given lately (its
                                   prefix cache's likely contents) */
    rt_prefix_shared shared;    /* prompt blocks its requests in flight hold,
                                   charged once in books.kv_bytes */
    char kv_type[8];            /* its KV cache's element type ("f16", "q8_0",
                                   ...; "" unknown) */
    int64_t kv_cached_bytes;    /* device KV its prefix cache keeps (evictable,
                                   in its budget) */
    int64_t kv_reported_budget; /* the KV it could hold now (kv.budget_bytes), -1 none */
    double prefill_rate, decode_rate;
    char rates_source[16];  /* the worker's /health: none, calibration, measured */
    /* the books, and what /health says they may reach */
    rt_books books;
    int64_t kv_budget;          /* free + the worker's own KV at its last
                                   /health; -1 when memory is not counted */
    bool held;                  /* refused since the last /health: the books
                                   may not grow until it reconciles them */
    int64_t kv_device_capacity; /* on a device other workers share: its KV
                                   memory, measured while all of them were
                                   idle (rt_pool_device_measure_locked); -1
                                   not yet */
    /* a spillway worker's own figures at its last /health: the requests
     * it holds (running or queued) and the device KV they hold, beyond
     * what this router's books admitted there (rt_pool_learn_usage_locked):
     * other routers' requests on a worker they share */
    int32_t foreign_seqs;
    int64_t foreign_kv;
    /* metrics */
    uint64_t req_ok, req_client_error, req_failed, tokens;
    uint64_t refused_memory, refused_slots; /* by the worker: it refused what
                                               the books admitted */
    /* reload (router_reload.c; the supervisor ends the drain) */
    int drain;                  /* RT_DRAIN_* */
    double drain_since;         /* when the drain began */
    double stop_sent_at;        /* SIGTERM sent after the drain; 0 not yet */
    rt_worker_config next_cfg;  /* RT_DRAIN_RESTART: what it starts with */
    int next_model;             /* and the model it then serves */
    bool gone;                  /* a removed worker's slot, free for reuse */
    /* on demand (router_demand.c): stopped (WS_STOPPED) until its model
     * is asked for */
    double last_busy;           /* the last pass it had requests (or its start) */
    int64_t footprint;          /* device bytes it takes idle (weights and
                                   workspace), learned from its /health; 0
                                   unknown */
    uint64_t demand_starts, idle_stops, evictions;
    /* attempts sent to it while remote (rt_config_worker_remote), by
     * route: [0] routine, [1] capacity (router_relay.c, remote_route) */
    uint64_t remote_routes[2];
    double start_seconds;       /* its last start, spawn to ready */
    char start_error[SW_ERROR_MESSAGE_MAX]; /* why its command cannot start, "" none */
    char down_reason[256];      /* why it is not ready, as /health says it; "" none known */
    bool refused;               /* down for a reason that does not pass by itself (its
                                   certificate refused): nothing waits for it */
    /* kind = llama-server (router_llamaserver.c): its vocabulary checked
     * against the model's (POST /tokenize, once per process), and the
     * verdict: its streams go through the native API (token ids kept, so
     * a spillway worker can resume them) only when it matched, and only
     * then does it take a resume itself (a token prompt) */
    bool ls_vocab_checked, ls_vocab_same;
    int32_t ls_slots_busy;      /* /slots: is_processing, at the last poll */
    int32_t ls_foreign;         /* of them, more than the router had running
                                   there: requests of other clients, whose
                                   slots the router does not count on */
    /* kind = llama-server: its /props asked (with the vocabulary, once per
     * process), and whether it said it takes images (modalities.vision) */
    bool ls_props_checked, ls_vision;
    int64_t ls_planned_kv;      /* the KV cache its command asks for, planned
                                   from the model file when the router starts
                                   it (router_books.c); 0 unknown */
} rt_worker;

/* The slots w[0..n_slots) keep their index for the router's life: a
 * request's books and tried[] name a worker by it. A removed worker's
 * slot is marked gone and may later take an added one; order lists the
 * slots that are not gone (n_live), in preference order. */
typedef struct rt_pool {
    pthread_mutex_t mu;
    rt_worker w[RT_MAX_WORKERS];
    int n_slots;
    int order[RT_MAX_WORKERS];  /* preference order, live slots only */
    int n_live;
} rt_pool;

/* for each live slot index i (not gone), in preference order; with the
 * pool's lock held */
#define RT_POOL_FOR_LIVE(p, i)                                                  \
    for (int i##_k = 0, i = 0; i##_k < (p)->n_live && ((i = (p)->order[i##_k]), 1); i##_k++)

/* One worker as the policy sees it: a copy taken under the lock. */
typedef struct rt_worker_view {
    int index;                  /* into rt_pool.w */
    int model;                  /* the model it serves */
    int device;                 /* the first slot on its device (a shared
                                   sim-gpu pool, cuda:N), -1 on the CPU */
    int state;
    int kind;                   /* RT_KIND_* */
    bool remote;                /* rt_config_worker_remote */
    bool ls_resumable;          /* kind = llama-server whose vocabulary is the
                                   model's: it can take a resume's token prompt */
    int images;                 /* whether it takes image content: 1 yes (a
                                   llama-server with a projector, an openai
                                   engine, which says itself), 0 no (a spillway
                                   worker), -1 not known yet (a llama-server
                                   at a url not asked yet) */
    int32_t ctx_limit;          /* 0 unknown */
    int32_t max_seqs;           /* 0 no limit known */
    int seqs;                   /* admitted now (books) */
    bool held;
    bool count_memory;          /* on a device, with block figures */
    int32_t block_tokens;
    int64_t block_bytes;
    int64_t sliding_block_bytes;  /* rt_worker's kv_sliding_* */
    int32_t sliding_blocks_max;
    int64_t kv_budget;
    int64_t kv_reserved;        /* its books */
    int64_t kv_foreign;         /* KV other routers' requests held there
                                   (rt_worker.foreign_kv): taken, but not
                                   for the question whether it could ever fit */
    /* a device other workers share, whose KV memory was measured idle:
     * that memory (what it could hold were nothing admitted) and what is
     * left of it after what the books admitted to every worker there */
    bool shared_device;
    int64_t kv_device_capacity, kv_device_room;
    double prefill_rate, decode_rate;
    const rt_prefix_summary *prefix; /* the worker's; read under the pool's lock */
    const rt_prefix_shared *shared;  /* likewise: blocks its requests in flight hold */
    int32_t preference;         /* its configured preference (the order's key) */
    /* not ready: seconds until it may be (0: any moment, a start or a
     * health check away; a restart's back-off left), -1: not by itself
     * (its certificate refused, its command cannot start) */
    double back_in_s;
} rt_worker_view;

typedef struct rt_pool_view {
    rt_worker_view w[RT_MAX_WORKERS]; /* in preference order */
    int n;
} rt_pool_view;

/* Fills the pool from the configuration (state, addresses, preference
 * order); the lock is initialised here. */
void rt_pool_init(rt_pool *p, const rt_config *c);
/* With p->mu held: slot i made a new worker of configuration wc, serving
 * model (an index into the router's models) (down
 * when managed, else starting; its socket and log under state_dir). */
void rt_pool_slot_init_locked(rt_pool *p, int i, const rt_worker_config *wc, int model,
                              const char *state_dir);
/* With p->mu held: order rebuilt from the live slots, by preference,
 * ties in file order (cfg.position). */
void rt_pool_sort_locked(rt_pool *p);
/* With p->mu held: the state a worker shows (draining while it drains). */
int rt_pool_state_locked(const rt_worker *w);
void rt_pool_destroy(rt_pool *p);

/* Whether two workers draw on one device's memory: the same sim-gpu
 * pool or cuda:N (the CPU is not counted). */
bool rt_pool_same_device(const rt_worker *a, const rt_worker *b);

/* With p->mu held: a snapshot of every worker in preference order. */
void rt_pool_view_locked(const rt_pool *p, rt_pool_view *out);

/* With p->mu held: the sequences a worker may run at once by the books
 * (its reported max-seqs, else the configured one; 0 no limit). */
int32_t rt_pool_max_seqs(const rt_worker *w);

/* With p->mu held: the books take / give back one request's share (its
 * sequences: 1, or its choices with n > 1). */
void rt_pool_take_locked(rt_pool *p, int wi, int64_t kv_bytes, int32_t seqs);
void rt_pool_give_locked(rt_pool *p, int wi, int64_t kv_bytes, int32_t seqs);

/* With p->mu held: a request in flight on worker wi has its first token,
 * so its prompt's blocks (hashes[0..n), router_prefix.h) are computed and
 * held, and the worker said that the first prefix_tokens of them are in
 * blocks of its prefix cache (spillway.prefix_tokens: one block per key,
 * so every request in flight with that start holds the same ones). Those
 * blocks leave the request's reservation for the worker's shared table,
 * which charges each once: a block another request in flight holds
 * already leaves the books. The others (the request's own copies) stay in
 * its reservation. Returns the bytes that left the request's reservation
 * (it gives back that much less at its end) and the blocks it registered,
 * for rt_pool_shared_release. Nothing where memory is not counted or
 * blocks are not of 16 tokens. */
int64_t rt_pool_shared_attach_locked(rt_pool *p, int wi, const uint64_t *hashes, int n,
                                     int64_t prefix_tokens, int *registered);
/* (*registered, on entry: the blocks the grant already registered,
 * rt_decision.shared_blocks; they are skipped.) */
/* ... and at its end: its registered blocks are held once fewer; a block
 * nobody holds any more leaves the books. */
void rt_pool_shared_release_locked(rt_pool *p, int wi, const uint64_t *hashes, int registered);

/* With p->mu held: the worker refused a request the books admitted
 * (memory or slots): it takes nothing more until its next /health, which
 * is asked for now. */
void rt_pool_refused_locked(rt_pool *p, int wi, bool memory);

/* With p->mu held: new /health figures reconcile the books (the budget
 * follows what the device really has free). */
void rt_pool_reconcile_locked(rt_worker *w);
/* With p->mu held, after rt_pool_reconcile_locked: a spillway worker's
 * /health said it holds accepted requests (running or queued) and
 * kv_used device KV bytes; own_seqs and own_kv are the larger of what the
 * books held when the /health was asked for and now (so that the
 * router's own requests that began or ended meanwhile are not taken for
 * another's). What is beyond them belongs to other clients of the worker
 * (other routers): admission counts it as taken until the next /health
 * (rt_pool_max_seqs, rt_pool_view_locked), and a worker they fill is
 * held, as after a refusal. */
void rt_pool_learn_usage_locked(rt_worker *w, int32_t accepted, int64_t kv_used, int own_seqs,
                                int64_t own_kv);
/* With p->mu held, after slot wi's /health: when it shares its device
 * and every worker there is idle (books and reports), the device's KV
 * memory is measured for all of them. */
void rt_pool_device_measure_locked(rt_pool *p, int wi);

#endif
