/* router_queue.h - the one FIFO queue of requests waiting for a worker,
 * and admission through it.
 *
 * Every generation request is admitted here: it takes its place by
 * arrival (its ticket), and a dispatch pass — run whenever capacity may
 * have appeared (books given back, a worker ready, /health reconciled) —
 * walks the queue from its head and reserves a worker in the pool's books
 * for each waiter the policy says fits, then wakes that waiter (its own
 * condition variable; nothing polls for capacity). A waiter that fits no
 * worker now may be passed by later ones that fit, at most
 * RT_QUEUE_MAX_PASSES times; after that nothing behind it is admitted
 * until it is.
 *
 * The queue has no lock of its own: the pool's lock guards it, so the
 * books and the queue change together.
 */
#ifndef SPILLWAY_ROUTER_QUEUE_H
#define SPILLWAY_ROUTER_QUEUE_H

#include "router/router_policy.h"
#include "router/router_pool.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* How often a waiting request may be passed by a later one that fits. */
#define RT_QUEUE_MAX_PASSES 8

/* Queue-wait histogram bounds (seconds); the last bucket is +Inf. */
#define RT_QWAIT_BUCKETS 15
extern const double rt_qwait_le[RT_QWAIT_BUCKETS - 1];

typedef struct rt_waiter {
    uint64_t ticket;            /* arrival order */
    rt_need need;
    const bool *tried;          /* rt_pool.w-indexed, or NULL */
    bool first;                 /* its first admission (counts an ordinal) */
    pthread_cond_t cv;
    bool queued;
    bool granted;
    rt_decision grant;          /* valid when granted: the books hold it */
    uint64_t generation;        /* of the granted worker's process (restarts, pid) */
    uint64_t ordinal;           /* admission ordinal when first granted */
    int passed;
    double t_enqueued;
    struct rt_waiter *prev, *next;
} rt_waiter;

typedef struct rt_queue {
    rt_pool *pool;
    rt_waiter *head, *tail;
    int depth;                  /* waiters linked now */
    int cap;                    /* queue-size */
    uint64_t next_ticket;
    uint64_t admissions;        /* first admissions so far (the ordinal) */
    /* drain rate: admissions per second, smoothed over ~1 s windows */
    double rate, win_start;
    uint64_t win_count;
    /* statistics (under the pool's lock) */
    uint64_t wait_buckets[RT_QWAIT_BUCKETS], wait_count;
    double wait_sum;
    uint64_t passes;            /* a later waiter admitted ahead of one */
    int peak_depth;
} rt_queue;

void rt_queue_init(rt_queue *q, rt_pool *p, int cap);

/* A request's place in arrival order (taken once, kept across attempts). */
uint64_t rt_queue_ticket(rt_queue *q);

typedef enum rt_admit_result {
    RT_ADMIT_OK,         /* w->grant holds a worker reserved in the books */
    RT_ADMIT_NEVER,      /* no worker could take it even idle (w->grant's
                            reasons say why: context, tried, kind) */
    RT_ADMIT_DEADLINE,   /* it cannot start and finish within its deadline */
    RT_ADMIT_FULL,       /* the queue is full (a first admission only: one
                            coming back keeps its place) */
    RT_ADMIT_TIMEOUT,    /* waited max_wait_s (queue time-out or deadline) */
    RT_ADMIT_GONE,       /* the client hung up while it waited */
    RT_ADMIT_STOPPED,    /* the router is stopping */
} rt_admit_result;

/* Admits one request: w->ticket, need, tried and first set by the caller.
 * Waits at most max_wait_s for a worker, watching client_fd (-1 none) for
 * a hang-up and *stop for shutdown. On RT_ADMIT_OK the caller owns the
 * reservation and gives it back with rt_queue_release; *waited_s is the
 * time spent waiting. */
rt_admit_result rt_queue_admit(rt_queue *q, rt_waiter *w, double max_wait_s, int client_fd,
                               atomic_int *stop, double *waited_s);

/* How an attempt ended, for the worker's counters. */
typedef struct rt_tally {
    bool ok, client_error, failed;
    uint64_t tokens;
} rt_tally;

/* Gives back a reservation (worker wi, kv_bytes), counts the attempt
 * (t may be NULL) and lets waiters in. */
void rt_queue_release(rt_queue *q, int wi, int64_t kv_bytes, const rt_tally *t);

/* rt_pool_shared_attach_locked under the pool's lock, then a dispatch
 * pass (the books may have shrunk). */
int64_t rt_queue_shared_attach(rt_queue *q, int wi, const uint64_t *hashes, int n,
                               int64_t prefix_tokens, int *registered);
/* rt_queue_release after rt_pool_shared_release_locked, under one lock,
 * of a grant of seqs sequences (rt_decision.seqs). */
void rt_queue_release_shared(rt_queue *q, int wi, int64_t kv_bytes, const rt_tally *t,
                             const uint64_t *hashes, int registered, int32_t seqs);

/* Capacity may have appeared (a worker ready, /health reconciled). */
void rt_queue_kick(rt_queue *q);

/* With the pool's lock held. */
void rt_queue_dispatch_locked(rt_queue *q, double now);

/* Seconds a client should wait before retrying, from the measured drain
 * rate (the queue's depth over admissions per second), 1..60; fallback_s
 * when nothing was admitted lately. With the pool's lock held. */
int rt_queue_retry_after_locked(const rt_queue *q, double fallback_s);

#endif
