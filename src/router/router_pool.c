/* router_pool.c - the worker table and the router's books (router_pool.h).
 */
#include "router/router_pool.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

const char *rt_ws_name(int s)
{
    static const char *n[] = {"starting", "ready", "down", "suspect", "draining", "stopped"};
    return s >= 0 && s < 6 ? n[s] : "unknown";
}

int rt_pool_state_locked(const rt_worker *w)
{
    return w->drain != RT_DRAIN_NONE ? WS_DRAINING : w->state;
}

void rt_pool_slot_init_locked(rt_pool *p, int i, const rt_worker_config *wc, int model,
                              const char *state_dir)
{
    rt_worker *w = &p->w[i];
    /* built in locals first: wc may be this slot's own next_cfg */
    rt_worker_config cfg = *wc;
    char address[sizeof w->address], log_path[sizeof w->log_path] = "";
    if (cfg.managed) {
        /* a spillway worker listens where the router says; an engine the
         * router runs, at its url (or a port picked when it first starts:
         * router_supervisor.c) */
        if (RT_KIND_EXTERNAL(cfg.kind))
            snprintf(address, sizeof address, "%s", cfg.url);
        else
            snprintf(address, sizeof address, "unix:%s/%s.sock", state_dir, cfg.name);
        snprintf(log_path, sizeof log_path, "%s/%s.log", state_dir, cfg.name);
    } else {
        snprintf(address, sizeof address, "%s", cfg.url);
    }
    memset(w, 0, sizeof *w);
    w->cfg = cfg;
    w->model = model;
    w->backoff = 0.25;
    w->last_exit = -1;
    w->kv_budget = -1;
    w->kv_reported_budget = -1;
    w->kv_device_capacity = -1;
    w->state = cfg.on_demand ? WS_STOPPED : cfg.managed ? WS_DOWN : WS_STARTING;
    memcpy(w->address, address, sizeof address);
    memcpy(w->log_path, log_path, sizeof log_path);
}

void rt_pool_sort_locked(rt_pool *p)
{
    p->n_live = 0;
    for (int i = 0; i < p->n_slots; i++)
        if (!p->w[i].gone)
            p->order[p->n_live++] = i;
    /* insertion sort: preference, then the place in the file */
    for (int i = 1; i < p->n_live; i++)
        for (int j = i; j > 0; j--) {
            const rt_worker_config *a = &p->w[p->order[j]].cfg, *b = &p->w[p->order[j - 1]].cfg;
            if (a->preference > b->preference ||
                (a->preference == b->preference && a->position >= b->position))
                break;
            int t = p->order[j];
            p->order[j] = p->order[j - 1];
            p->order[j - 1] = t;
        }
}

void rt_pool_init(rt_pool *p, const rt_config *c)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    p->n_slots = c->n_workers;
    for (int i = 0; i < p->n_slots; i++)
        rt_pool_slot_init_locked(p, i, &c->workers[i], rt_config_worker_model(c, &c->workers[i]),
                                 c->state_dir);
    rt_pool_sort_locked(p);
}

void rt_pool_destroy(rt_pool *p) { pthread_mutex_destroy(&p->mu); }

int32_t rt_pool_max_seqs(const rt_worker *w)
{
    /* a spillway worker: its slots, less those other routers' requests
     * held at its last /health (at least one: a worker they fill is held) */
    if (w->cfg.kind == RT_KIND_SPILLWAY && w->slots_max > 0)
        return w->slots_max - w->foreign_seqs > 1 ? w->slots_max - w->foreign_seqs : 1;
    /* llama-server: max-seqs when set, else its /slots count, less the
     * slots other clients of it held at the last poll (at least one: it
     * queues what finds no slot free) */
    if (w->cfg.kind == RT_KIND_LLAMA_SERVER) {
        int32_t n = w->cfg.max_seqs > 0 ? w->cfg.max_seqs : w->slots_max;
        if (n <= 0)
            return 0;
        n -= w->ls_foreign;
        return n < 1 ? 1 : n;
    }
    return w->cfg.max_seqs > 0 ? w->cfg.max_seqs : 0;
}

bool rt_pool_same_device(const rt_worker *a, const rt_worker *b)
{
    return a->cfg.device[0] && strcmp(a->cfg.device, "cpu") && !strcmp(a->cfg.device, b->cfg.device);
}

/* With p->mu held: how many live workers share w's device (w included;
 * 1 when it has one of its own or is on the CPU), and what the books
 * admitted to all of them. */
static int device_share(const rt_pool *p, const rt_worker *w, int64_t *reserved)
{
    int n = 0;
    *reserved = 0;
    for (int j = 0; j < p->n_slots; j++) {
        const rt_worker *o = &p->w[j];
        if (o->gone || (o != w && !rt_pool_same_device(w, o)))
            continue;
        n++;
        *reserved += o->books.kv_bytes;
    }
    return n;
}

void rt_pool_device_measure_locked(rt_pool *p, int wi)
{
    rt_worker *w = &p->w[wi];
    int64_t reserved, capacity = INT64_MAX;
    if (device_share(p, w, &reserved) < 2 || reserved > 0)
        return;
    /* idle by the books and by every worker's last report: each budget
     * is then the device's KV memory; the smallest, in case one report
     * is from before another worker's weights were loaded */
    for (int j = 0; j < p->n_slots; j++) {
        const rt_worker *o = &p->w[j];
        if (o->gone || !rt_pool_same_device(w, o))
            continue;
        if (o->kv_budget < 0 || o->kv_held_bytes > 0 || o->books.seqs > 0)
            return;
        if (o->kv_budget < capacity)
            capacity = o->kv_budget;
    }
    for (int j = 0; j < p->n_slots; j++)
        if (!p->w[j].gone && rt_pool_same_device(w, &p->w[j]))
            p->w[j].kv_device_capacity = capacity;
}

void rt_pool_view_locked(const rt_pool *p, rt_pool_view *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* rt__now_s's clock, for next_start */
    double now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    out->n = 0;
    for (int k = 0; k < p->n_live; k++) {
        const rt_worker *w = &p->w[p->order[k]];
        /* a worker being removed takes nothing new, ever: to the policy
         * it is not there (one that drains to restart is only not ready) */
        if (w->drain == RT_DRAIN_REMOVE)
            continue;
        rt_worker_view *v = &out->w[out->n++];
        v->index = p->order[k];
        v->model = w->model;
        v->state = rt_pool_state_locked(w);
        v->kind = w->cfg.kind;
        v->remote = rt_config_worker_remote(&w->cfg);
        v->ls_resumable = w->cfg.kind == RT_KIND_LLAMA_SERVER && w->ls_vocab_same;
        /* images: a llama-server by its /props (before it answered, by its
         * mmproj =), an openai engine as it says itself, never a spillway
         * worker (its engine takes text parts only) */
        v->images = w->cfg.kind == RT_KIND_OPENAI ? 1
                    : w->cfg.kind == RT_KIND_SPILLWAY ? 0
                    : w->ls_props_checked ? w->ls_vision
                    : w->cfg.mmproj[0] ? 1
                                       : -1;
        v->ctx_limit = w->ctx_limit;
        v->max_seqs = rt_pool_max_seqs(w);
        v->seqs = w->books.seqs;
        v->held = w->held;
        v->count_memory = w->kv_budget >= 0 && w->kv_block_tokens > 0 && w->kv_block_bytes > 0;
        v->block_tokens = w->kv_block_tokens;
        v->block_bytes = w->kv_block_bytes;
        v->sliding_block_bytes = w->kv_sliding_block_bytes;
        v->sliding_blocks_max = w->kv_sliding_blocks_max;
        v->kv_budget = w->kv_budget;
        v->kv_reserved = w->books.kv_bytes;
        v->kv_foreign = w->foreign_kv;
        /* Workers on one device (of one model or of several) share it:
         * what the books admitted to all of them must fit its KV memory,
         * measured while it was idle. Each one's own budget still applies
         * (memory another process took); it cannot stand alone, since two
         * workers' reports are from two moments. */
        v->device = -1;
        v->shared_device = false;
        int64_t device_reserved;
        if (device_share(p, w, &device_reserved) > 1) {
            for (int j = 0; j < p->n_slots && v->device < 0; j++)
                if (!p->w[j].gone && rt_pool_same_device(w, &p->w[j]))
                    v->device = j;
            v->shared_device = w->kv_device_capacity >= 0;
            v->kv_device_capacity = w->kv_device_capacity;
            v->kv_device_room = w->kv_device_capacity - device_reserved;
        }
        v->prefill_rate = w->prefill_rate;
        v->decode_rate = w->decode_rate;
        v->back_in_s = 0;
        if (v->state != WS_READY) {
            if (w->refused || w->start_error[0])
                v->back_in_s = -1;
            else if (w->cfg.managed && w->pid == 0 && !w->cfg.on_demand)
                v->back_in_s = w->next_start > now ? w->next_start - now : 0;
        }
        v->prefix = &w->prefix;
        v->shared = &w->shared;
        v->preference = w->cfg.preference;
    }
}

void rt_pool_take_locked(rt_pool *p, int wi, int64_t kv_bytes, int32_t seqs)
{
    p->w[wi].books.seqs += seqs;
    p->w[wi].books.kv_bytes += kv_bytes;
}

void rt_pool_give_locked(rt_pool *p, int wi, int64_t kv_bytes, int32_t seqs)
{
    rt_books *b = &p->w[wi].books;
    b->seqs = b->seqs > seqs ? b->seqs - seqs : 0;
    b->kv_bytes = b->kv_bytes > kv_bytes ? b->kv_bytes - kv_bytes : 0;
}

int64_t rt_pool_shared_attach_locked(rt_pool *p, int wi, const uint64_t *hashes, int n,
                                     int64_t prefix_tokens, int *registered)
{
    rt_worker *w = &p->w[wi];
    const int64_t bb = w->kv_block_bytes;
    int64_t moved = 0;
    int reg = *registered;
    if (!hashes || n <= 0 || bb <= 0 || w->kv_budget < 0 ||
        w->kv_block_tokens != RT_PREFIX_BLOCK_TOKENS || w->kv_sliding_block_bytes > 0)
        return 0;
    const int64_t in_cache = prefix_tokens / RT_PREFIX_BLOCK_TOKENS;
    for (; reg < n && reg < in_cache; reg++) {
        int32_t after;
        if (!rt_shared_take(&w->shared, hashes[reg], &after))
            break;
        moved += bb;
        if (after > 1) /* held by another already: charged once */
            w->books.kv_bytes = w->books.kv_bytes > bb ? w->books.kv_bytes - bb : 0;
    }
    *registered = reg;
    return moved;
}

void rt_pool_shared_release_locked(rt_pool *p, int wi, const uint64_t *hashes, int registered)
{
    rt_worker *w = &p->w[wi];
    for (int i = 0; i < registered; i++)
        if (rt_shared_give(&w->shared, hashes[i]) == 0)
            w->books.kv_bytes = w->books.kv_bytes > w->kv_block_bytes
                                    ? w->books.kv_bytes - w->kv_block_bytes
                                    : 0;
}

void rt_pool_refused_locked(rt_pool *p, int wi, bool memory)
{
    rt_worker *w = &p->w[wi];
    if (memory)
        w->refused_memory++;
    else
        w->refused_slots++;
    w->held = true;
    w->health_now = true;
}

void rt_pool_reconcile_locked(rt_worker *w)
{
    /* The budget is what the worker could hold in KV now: the device's
     * free memory above the reserve plus what its own sequences hold
     * (the router's books cover those). Memory another process takes on
     * the same device (a hog, a second worker) lowers it. */
    if (w->on_device && w->kv_block_tokens > 0 && w->kv_block_bytes > 0)
        w->kv_budget = w->kv_reported_budget >= 0
                           ? w->kv_reported_budget /* taken consistently by the worker */
                           : (w->mem_free > 0 ? w->mem_free : 0) + w->kv_held_bytes;
    else
        w->kv_budget = -1;
    w->held = false;
}

void rt_pool_learn_usage_locked(rt_worker *w, int32_t accepted, int64_t kv_used, int own_seqs,
                                int64_t own_kv)
{
    if (w->cfg.kind != RT_KIND_SPILLWAY) {
        w->foreign_seqs = 0;
        w->foreign_kv = 0;
        return;
    }
    w->foreign_seqs = accepted > own_seqs ? accepted - own_seqs : 0;
    w->foreign_kv = kv_used > own_kv ? kv_used - own_kv : 0;
    /* others fill its slots: nothing more until its next /health, or
     * until one of this router's requests there ends */
    if (w->slots_max > 0 && w->foreign_seqs >= w->slots_max)
        w->held = true;
}
