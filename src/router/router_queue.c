/* router_queue.c - the FIFO admission queue (router_queue.h).
 */
#include "router/router_queue.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

const double rt_qwait_le[RT_QWAIT_BUCKETS - 1] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                   0.25,  0.5,    1,     2.5,  5,     10,  30};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void rt_queue_init(rt_queue *q, rt_pool *p, int cap)
{
    memset(q, 0, sizeof *q);
    q->pool = p;
    q->cap = cap;
    q->win_start = mono_s();
}

uint64_t rt_queue_ticket(rt_queue *q)
{
    return __atomic_add_fetch(&q->next_ticket, 1, __ATOMIC_RELAXED);
}

/* Links w by ticket: a request coming back (refused, replayed) keeps its
 * place ahead of later arrivals. */
static void link_waiter(rt_queue *q, rt_waiter *w)
{
    rt_waiter *after = q->tail;
    while (after && after->ticket > w->ticket)
        after = after->prev;
    w->prev = after;
    w->next = after ? after->next : q->head;
    if (w->next)
        w->next->prev = w;
    else
        q->tail = w;
    if (after)
        after->next = w;
    else
        q->head = w;
    w->queued = true;
    q->depth++;
    if (q->depth > q->peak_depth)
        q->peak_depth = q->depth;
}

static void unlink_waiter(rt_queue *q, rt_waiter *w)
{
    if (!w->queued)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else
        q->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        q->tail = w->prev;
    w->prev = w->next = NULL;
    w->queued = false;
    q->depth--;
}

static void count_admission(rt_queue *q, rt_waiter *w, double now)
{
    if (w->first)
        w->ordinal = ++q->admissions;
    q->win_count++;
    double span = now - q->win_start;
    if (span >= 1.0) {
        double r = (double)q->win_count / span;
        q->rate = q->rate > 0 ? 0.5 * q->rate + 0.5 * r : r;
        q->win_start = now;
        q->win_count = 0;
    }
}

static void grant(rt_queue *q, rt_pool_view *v, rt_waiter *w, const rt_decision *d, double now)
{
    w->grant = *d;
    w->granted = true;
    const rt_worker *wk = &q->pool->w[d->worker];
    w->generation = (uint64_t)(uint32_t)wk->restarts << 32 | (uint32_t)wk->pid;
    /* n > 1: a sequence per choice, at most the worker's (it queues the
     * rest) */
    int32_t max_seqs = 0;
    for (int k = 0; k < v->n; k++)
        if (v->w[k].index == d->worker)
            max_seqs = v->w[k].max_seqs;
    w->grant.seqs = rt_policy_seqs(&w->need, max_seqs);
    rt_pool_take_locked(q->pool, d->worker, d->kv_bytes, w->grant.seqs);
    /* its prompt will be in that worker's prefix cache; the blocks it
     * shares with requests in flight there are held once more */
    if (w->need.prefix) {
        rt_worker *wk_w = &q->pool->w[d->worker];
        rt_prefix_note(&wk_w->prefix, w->need.prefix, w->need.n_prefix);
        for (int i = 0; i < d->shared_blocks; i++) {
            int32_t after;
            rt_shared_take(&wk_w->shared, w->need.prefix[i], &after); /* present: cannot fail */
        }
    }
    int device = -1;
    for (int k = 0; k < v->n; k++)
        if (v->w[k].index == d->worker)
            device = v->w[k].device;
    for (int k = 0; k < v->n; k++) {
        if (v->w[k].index == d->worker)
            v->w[k].seqs += w->grant.seqs;
        if (v->w[k].index == d->worker)
            v->w[k].kv_reserved += d->kv_bytes;
        /* the reservation binds every worker on its device */
        if (device >= 0 && v->w[k].device == device)
            v->w[k].kv_device_room -= d->kv_bytes;
    }
    count_admission(q, w, now);
    unlink_waiter(q, w);
    pthread_cond_signal(&w->cv);
}

/* Whether any ready worker still has a sequence free by the books: when
 * none has, no waiter can be admitted and the pass stops early. */
static bool any_slot(const rt_pool_view *v)
{
    for (int k = 0; k < v->n; k++)
        if (v->w[k].state == WS_READY && !v->w[k].held &&
            (v->w[k].max_seqs <= 0 || v->w[k].seqs < v->w[k].max_seqs))
            return true;
    return false;
}

/* Waiters left after a pass while a ready worker is held (refused, or
 * filled by other routers' requests at its last /health): its /health is
 * asked for at the supervisor's next pass, not at the next interval. The
 * slot another router's request frees there is taken again at once by
 * that router, which learns of it from its own release; this router
 * learns of it only from a /health, so one that waited for its interval
 * could find the worker full at every poll and wait out queue-timeout-ms
 * while the other router's later requests run. Only spillway workers: their
 * /health is cheap and says what other routers use; another engine (a
 * remote service) is asked at its interval as before. */
static void ask_held_locked(rt_queue *q)
{
    if (!q->head)
        return;
    RT_POOL_FOR_LIVE(q->pool, i) {
        rt_worker *w = &q->pool->w[i];
        if (w->held && w->cfg.kind == RT_KIND_SPILLWAY && rt_pool_state_locked(w) == WS_READY)
            w->health_now = true;
    }
}

void rt_queue_dispatch_locked(rt_queue *q, double now)
{
    if (!q->head)
        return;
    rt_pool_view v;
    rt_pool_view_locked(q->pool, &v);
    int blocked = 0; /* waiters ahead of the current one left waiting */
    for (rt_waiter *w = q->head, *next; w && any_slot(&v); w = next) {
        next = w->next;
        rt_need need = w->need;
        if (need.deadline_ms >= 0)
            need.wait_ms = (now - w->t_enqueued) * 1000;
        rt_decision d;
        if (rt_policy_decide(&v, &need, w->tried, &d) >= 0) {
            grant(q, &v, w, &d, now);
            if (blocked) {
                /* it passed every blocked waiter ahead of it */
                for (rt_waiter *b = q->head; b && b != next; b = b->next)
                    if (b->ticket < w->ticket)
                        b->passed++;
                q->passes++;
            }
            continue;
        }
        blocked++;
        if (w->passed >= RT_QUEUE_MAX_PASSES)
            break; /* due: nothing behind it goes first any more */
    }
    ask_held_locked(q);
}

static void release_locked(rt_queue *q, int wi, int64_t kv_bytes, const rt_tally *t,
                           int32_t seqs)
{
    rt_pool_give_locked(q->pool, wi, kv_bytes, seqs);
    if (t) {
        rt_worker *w = &q->pool->w[wi];
        /* one of this router's requests ended there: it has a place
         * again, whatever a refusal or other routers' requests said */
        if (t->ok || t->client_error || t->failed)
            w->held = false;
        w->req_ok += t->ok;
        w->req_client_error += t->client_error;
        w->req_failed += t->failed;
        w->tokens += t->tokens;
    }
    rt_queue_dispatch_locked(q, mono_s());
}

void rt_queue_release(rt_queue *q, int wi, int64_t kv_bytes, const rt_tally *t)
{
    pthread_mutex_lock(&q->pool->mu);
    release_locked(q, wi, kv_bytes, t, 1);
    pthread_mutex_unlock(&q->pool->mu);
}

void rt_queue_release_shared(rt_queue *q, int wi, int64_t kv_bytes, const rt_tally *t,
                             const uint64_t *hashes, int registered, int32_t seqs)
{
    pthread_mutex_lock(&q->pool->mu);
    rt_pool_shared_release_locked(q->pool, wi, hashes, registered);
    release_locked(q, wi, kv_bytes, t, seqs);
    pthread_mutex_unlock(&q->pool->mu);
}

int64_t rt_queue_shared_attach(rt_queue *q, int wi, const uint64_t *hashes, int n,
                               int64_t prefix_tokens, int *registered)
{
    pthread_mutex_lock(&q->pool->mu);
    int64_t moved = rt_pool_shared_attach_locked(q->pool, wi, hashes, n, prefix_tokens,
                                                 registered);
    if (moved > 0)
        rt_queue_dispatch_locked(q, mono_s());
    pthread_mutex_unlock(&q->pool->mu);
    return moved;
}

void rt_queue_kick(rt_queue *q)
{
    pthread_mutex_lock(&q->pool->mu);
    rt_queue_dispatch_locked(q, mono_s());
    pthread_mutex_unlock(&q->pool->mu);
}

int rt_queue_retry_after_locked(const rt_queue *q, double fallback_s)
{
    /* the current window counts once it is a second old: after a quiet
     * spell the rate falls instead of keeping the last busy one */
    double rate = q->rate, span = mono_s() - q->win_start;
    if (span >= 1.0)
        rate = 0.5 * rate + 0.5 * (double)q->win_count / span;
    double s = rate > 0 ? ((double)q->depth + 1) / rate : fallback_s;
    if (!(s >= 1))
        return 1;
    return s > 60 ? 60 : (int)ceil(s);
}

static void wait_stats(rt_queue *q, double waited)
{
    int i = 0;
    while (i < RT_QWAIT_BUCKETS - 1 && waited > rt_qwait_le[i])
        i++;
    q->wait_buckets[i]++;
    q->wait_count++;
    q->wait_sum += waited;
}

/* The waiters ahead of w, for its predicted wait. */
static int ahead_of(const rt_queue *q, const rt_waiter *w)
{
    int n = 0;
    for (const rt_waiter *b = q->head; b && b != w; b = b->next)
        n++;
    return n;
}

/* A lower bound of how long w waits before a sequence of its model is
 * free for it, in ms: the requests queued ahead of it for the same model
 * each run at least their predicted time (prompt at the fastest worker's
 * prefill rate, max_tokens at its decode rate) on one of the model's
 * sequences, and run first (the queue is FIFO); those running now are
 * counted as ending at once. 0 when it cannot be bounded: a worker of the
 * model without rates or without a sequence limit, a request ahead with
 * no max_tokens. */
static double backlog_ms(const rt_queue *q, const rt_waiter *w, const rt_pool_view *v)
{
    double prefill = 0, decode = 0;
    long seqs = 0;
    for (int k = 0; k < v->n; k++) {
        const rt_worker_view *x = &v->w[k];
        if (w->need.model >= 0 && x->model != w->need.model)
            continue;
        if (x->state != WS_READY)
            continue;
        if (x->max_seqs <= 0 || x->prefill_rate <= 0 || x->decode_rate <= 0)
            return 0;
        seqs += x->max_seqs;
        prefill = x->prefill_rate > prefill ? x->prefill_rate : prefill;
        decode = x->decode_rate > decode ? x->decode_rate : decode;
    }
    if (seqs == 0)
        return 0;
    double ms = 0;
    for (const rt_waiter *b = q->head; b && b != w; b = b->next) {
        if (b->need.model != w->need.model)
            continue;
        if (b->need.max_tokens < 0)
            return 0;
        long prompt = b->need.prompt > 0 ? b->need.prompt : 0;
        int n = b->need.n_choices > 1 ? b->need.n_choices : 1;
        ms += n * ((double)prompt / prefill + (double)b->need.max_tokens / decode) * 1000;
    }
    return ms / (double)seqs;
}

rt_admit_result rt_queue_admit(rt_queue *q, rt_waiter *w, double max_wait_s, int client_fd,
                               atomic_int *stop, double *waited_s)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->granted = false;
    w->queued = false;
    w->passed = 0;
    w->prev = w->next = NULL;
    double t0 = mono_s();
    w->t_enqueued = t0;
    *waited_s = 0;
    rt_admit_result res = RT_ADMIT_OK;

    pthread_mutex_lock(&q->pool->mu);
    link_waiter(q, w);
    rt_queue_dispatch_locked(q, t0);
    if (!w->granted) {
        /* could it ever be served, counting its predicted wait? */
        rt_pool_view v;
        rt_pool_view_locked(q->pool, &v);
        rt_need idle = w->need;
        idle.idle = true;
        idle.max_wait_ms = max_wait_s * 1000;
        if (idle.deadline_ms >= 0 && q->rate > 0)
            idle.wait_ms = ahead_of(q, w) / q->rate * 1000;
        /* the deadline known to be missed on arrival: answered now (a
         * capacity fallback, or 503), not after waiting it out */
        if (idle.deadline_ms >= 0) {
            double backlog = backlog_ms(q, w, &v);
            if (backlog > idle.wait_ms)
                idle.wait_ms = backlog;
        }
        rt_decision d;
        if (rt_policy_decide(&v, &idle, w->tried, &d) < 0) {
            w->grant = d;
            res = (d.skipped & RT_SKIP_DEADLINE) ? RT_ADMIT_DEADLINE : RT_ADMIT_NEVER;
        } else if (q->depth > q->cap && w->first) {
            /* a request coming back (refused, replayed) had its place */
            res = RT_ADMIT_FULL;
        }
    }
    if (!w->granted && res == RT_ADMIT_OK) {
        double end = t0 + max_wait_s;
        double next_check = t0 + 0.25;
        while (!w->granted) {
            double now = mono_s();
            if (*stop) {
                res = RT_ADMIT_STOPPED;
                break;
            }
            if (now >= end) {
                res = RT_ADMIT_TIMEOUT;
                break;
            }
            if (client_fd >= 0 && now >= next_check) {
                /* a hang-up while it waits: it leaves the queue */
                struct pollfd p = {client_fd, POLLRDHUP, 0};
                if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                    res = RT_ADMIT_GONE;
                    break;
                }
                next_check = now + 0.25;
            }
            double until = end < next_check || client_fd < 0 ? end : next_check;
            if (until > now + 0.25)
                until = now + 0.25; /* *stop is read at least this often */
            struct timespec ts;
            ts.tv_sec = (time_t)until;
            ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
            int rc = pthread_cond_timedwait(&w->cv, &q->pool->mu, &ts);
            (void)rc;
        }
        /* the loop leaves with res set only while not granted */
    }
    unlink_waiter(q, w);
    *waited_s = mono_s() - t0;
    if (res == RT_ADMIT_OK || res == RT_ADMIT_TIMEOUT)
        wait_stats(q, *waited_s);
    if (res != RT_ADMIT_OK)
        rt_queue_dispatch_locked(q, mono_s()); /* its leaving may unblock others */
    pthread_mutex_unlock(&q->pool->mu);
    pthread_cond_destroy(&w->cv);
    return res;
}
