/* router_demand.c - workers on demand (docs/router.md, Workers on
 * demand): a worker with on-demand = true is stopped (WS_STOPPED) until
 * a request for its model waits in the queue with no worker of that
 * model running or starting; it is stopped again after idle-timeout-s
 * without requests. When its device cannot hold it, the least recently
 * used idle on-demand worker there is stopped first; a worker with
 * requests running never is.
 *
 * What a worker takes on its device when idle (its footprint: weights
 * and workspace) is learned from its /health the first time it runs.
 * Before that the start is tried; a start that fails on a device shared
 * with an idle on-demand worker stops that one and tries again.
 *
 * Runs on the supervisor's thread, once per pass, with the pool's lock.
 */
#include "router/router-impl.h"

#include "common/log.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static void demand_event(rt_router *rt, const rt_worker *w, const char *type, const char *reason,
                         const rt_worker *other)
{
    json_t *ev = json_pack("{s:s, s:s, s:s, s:s, s:f}", "type", type, "worker", w->cfg.name,
                           "model", rt->models[w->model].cfg.name, "reason", reason, "time",
                           rt__wall_s());
    if (!ev)
        return;
    if (other)
        json_object_set_new(ev, "for_worker", json_string(other->cfg.name));
    if (!strcmp(type, "worker_ready"))
        json_object_set_new(ev, "start_seconds", json_real(w->start_seconds));
    rt__ev_record(rt, ev);
    json_decref(ev);
}

/* Whether a request for model m waits in the queue. */
static bool model_waited_for_locked(const rt_router *rt, int m)
{
    for (const rt_waiter *q = rt->queue.head; q; q = q->next)
        if (q->need.model < 0 || q->need.model == m)
            return true;
    return false;
}

/* Whether a worker of model m runs or is on its way (so none needs
 * starting for it). */
static bool model_served_locked(const rt_pool *p, int m)
{
    for (int i = 0; i < p->n_slots; i++) {
        const rt_worker *w = &p->w[i];
        if (!w->gone && w->model == m && w->state != WS_STOPPED && w->drain != RT_DRAIN_STOP &&
            w->drain != RT_DRAIN_REMOVE)
            return true;
    }
    return false;
}

/* The device memory free for a new worker on w's device, by the last
 * /health of the workers running there (-1: none runs there, unknown). */
static int64_t device_free_locked(const rt_pool *p, const rt_worker *w)
{
    int64_t free_bytes = -1;
    for (int i = 0; i < p->n_slots; i++) {
        const rt_worker *o = &p->w[i];
        if (o == w || o->gone || o->pid <= 0 || !o->on_device || !rt_pool_same_device(w, o))
            continue;
        int64_t f = o->mem_free; /* above its reserve */
        if (free_bytes < 0 || f < free_bytes)
            free_bytes = f > 0 ? f : 0;
    }
    return free_bytes;
}

/* The least recently used idle on-demand worker on w's device, or NULL. */
static rt_worker *lru_idle_locked(rt_pool *p, const rt_worker *w)
{
    rt_worker *best = NULL;
    for (int i = 0; i < p->n_slots; i++) {
        rt_worker *o = &p->w[i];
        if (o == w || o->gone || !o->cfg.on_demand || o->pid <= 0 || o->state != WS_READY ||
            o->drain != RT_DRAIN_NONE || o->books.seqs > 0 || !rt_pool_same_device(w, o))
            continue;
        if (!best || o->last_busy < best->last_busy)
            best = o;
    }
    return best;
}

static void stop_worker_locked(rt_router *rt, rt_worker *w, double t, const char *reason,
                               const rt_worker *for_worker)
{
    w->drain = RT_DRAIN_STOP;
    w->drain_since = t;
    w->stop_sent_at = 0;
    if (for_worker) {
        w->evictions++;
        SW_INFO("router", "worker %s: stopped to make room on %s for worker %s", w->cfg.name,
                w->cfg.device, for_worker->cfg.name);
    } else {
        w->idle_stops++;
        SW_INFO("router", "worker %s: idle for %d s; stopping it", w->cfg.name,
                w->cfg.idle_timeout_s);
    }
    demand_event(rt, w, "worker_stopped", reason, for_worker);
}

/* Starts w for a waiting request, or makes room for it first. */
static void start_locked(rt_router *rt, rt_worker *w, double t)
{
    rt_pool *p = &rt->pool;
    /* a device where others run: is there room? */
    int64_t free_bytes = w->on_device || w->cfg.device[0] ? device_free_locked(p, w) : -1;
    bool room = free_bytes < 0 || (w->footprint > 0 ? w->footprint <= free_bytes
                                                    : w->last_exit < 0 || w->ready_once);
    if (!room) {
        rt_worker *victim = lru_idle_locked(p, w);
        if (victim) {
            stop_worker_locked(rt, victim, t, "evicted", w);
            return; /* started once the victim is gone */
        }
        if (w->footprint > 0)
            return; /* it would not fit, and everything there is busy: wait */
    }
    w->state = WS_DOWN; /* the supervisor spawns it now */
    w->next_start = t;
    w->demand_starts++;
    SW_INFO("router", "worker %s: starting for a request of model %s", w->cfg.name,
            rt->models[w->model].cfg.name);
    demand_event(rt, w, "worker_starting", "demand", NULL);
}

void rt__demand_pass_locked(rt_router *rt, double t)
{
    rt_pool *p = &rt->pool;
    for (int i = 0; i < p->n_slots; i++) {
        rt_worker *w = &p->w[i];
        if (w->gone || !w->cfg.on_demand)
            continue;
        if (w->books.seqs > 0 || w->state == WS_STARTING)
            w->last_busy = t;
        if (w->state == WS_READY && w->drain == RT_DRAIN_NONE && w->books.seqs == 0 &&
            t - w->last_busy > w->cfg.idle_timeout_s)
            stop_worker_locked(rt, w, t, "idle", NULL);
    }
    for (int k = 0; k < p->n_live; k++) {
        rt_worker *w = &p->w[p->order[k]];
        if (!w->cfg.on_demand || w->state != WS_STOPPED || w->drain != RT_DRAIN_NONE ||
            t < w->next_start || rt->stop)
            continue;
        if (model_served_locked(p, w->model) || !model_waited_for_locked(rt, w->model))
            continue;
        start_locked(rt, w, t);
    }
}

void rt__demand_ready_locked(rt_router *rt, rt_worker *w)
{
    if (!w->cfg.on_demand)
        return;
    w->start_seconds = rt__now_s() - w->started_at;
    w->last_busy = rt__now_s();
    demand_event(rt, w, "worker_ready", "demand", NULL);
}

void rt__demand_learn_locked(rt_worker *w)
{
    /* idle: what its context holds is weights and workspace */
    if (w->on_device && w->kv_held_bytes == 0 && w->books.seqs == 0 && w->mem_context > 0)
        w->footprint = w->mem_context;
}
