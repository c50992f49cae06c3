/* router_stats.c - what the dashboard and `spillway status` read: the
 * activity ring (what ended in each 10 s of the last 10 minutes: answered
 * requests, failed attempts, failovers, tokens, overall and per worker;
 * admissions and their mean queue wait),
 * GET /v1/spillway/stats (one snapshot: the workers as /health shows them,
 * their memory split for a bar, the queue, the ring) and the latest drill
 * report found in the state directory, served read-only.
 *
 * The ring lives in the router (rt_router.stats, under rt_router.mu) and
 * costs one lock per attempt. It is memory only: a restart starts it
 * empty.
 */
#include "router/router-impl.h"

#include "common/alloc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The epoch (plus 1, so 0 is an empty slot) of a monotonic time. */
static int64_t stats_epoch(double mono_s)
{
    return (int64_t)(mono_s / RT_STATS_SLOT_S) + 1;
}

/* With rt->mu held: the slot of the current window, emptied when it held
 * an older one. */
static rt_stats_slot *stats_slot_locked(rt_router *rt)
{
    int64_t e = stats_epoch(rt__now_s());
    rt_stats_slot *s = &rt->stats[e % RT_STATS_SLOTS];
    if (s->epoch != e) {
        memset(s, 0, sizeof *s);
        s->epoch = e;
    }
    return s;
}

void rt__stats_attempt(rt_router *rt, int wi, bool answered, bool failed, uint64_t tokens)
{
    pthread_mutex_lock(&rt->mu);
    rt_stats_slot *s = stats_slot_locked(rt);
    s->requests += answered;
    s->failed += failed;
    s->tokens += tokens;
    if (wi >= 0 && wi < RT_MAX_WORKERS) {
        s->w_requests[wi] += answered;
        s->w_tokens[wi] += tokens;
    }
    pthread_mutex_unlock(&rt->mu);
}

void rt__stats_clear_worker(rt_router *rt, int wi)
{
    if (wi < 0 || wi >= RT_MAX_WORKERS)
        return;
    pthread_mutex_lock(&rt->mu);
    for (int i = 0; i < RT_STATS_SLOTS; i++)
        rt->stats[i].w_requests[wi] = rt->stats[i].w_tokens[wi] = 0;
    pthread_mutex_unlock(&rt->mu);
}

void rt__stats_failover(rt_router *rt)
{
    pthread_mutex_lock(&rt->mu);
    stats_slot_locked(rt)->failovers++;
    pthread_mutex_unlock(&rt->mu);
}

void rt__stats_wait(rt_router *rt, double waited_s)
{
    pthread_mutex_lock(&rt->mu);
    rt_stats_slot *s = stats_slot_locked(rt);
    s->waits++;
    s->wait_s += waited_s;
    pthread_mutex_unlock(&rt->mu);
}

const char *rt__worker_device(const rt_worker_config *c)
{
    if (c->device[0])
        return c->device;
    return rt_config_worker_remote(c) ? "remote" : "cpu";
}

json_t *rt__worker_json_locked(const rt_router *rt, const rt_worker *w)
{
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:b, s:i, s:i, s:I, s:I, s:I, s:I, s:f, s:f, s:s, s:i}", "name",
        w->cfg.name, "state", rt_ws_name(rt_pool_state_locked(w)), "device",
        rt__worker_device(&w->cfg), "managed", w->cfg.managed, "pid", (int)w->pid,
        "restarts", w->restarts, "memory_total_bytes", (json_int_t)w->mem_total,
        "memory_free_bytes", (json_int_t)w->mem_free, "kv_bytes_per_token",
        (json_int_t)w->kv_bpt, "memory_used_bytes", (json_int_t)w->mem_used,
        "prefill_tokens_per_second", w->prefill_rate, "decode_tokens_per_second",
        w->decode_rate, "rates_source", w->rates_source[0] ? w->rates_source : "none",
        "ctx_limit", w->ctx_limit > 0 ? w->ctx_limit : w->cfg.ctx_limit);
    if (!o)
        return NULL;
    /* why it is not ready (a refused certificate, an exit, a command that
     * cannot start), when the router knows */
    if (rt_pool_state_locked(w) != WS_READY && (w->down_reason[0] || w->start_error[0]))
        json_object_set_new(o, "reason",
                            json_string(w->start_error[0] ? w->start_error : w->down_reason));
    json_object_set_new(o, "model", json_string(rt->models[w->model].cfg.name));
    if (w->kv_type[0])
        json_object_set_new(o, "kv_type", json_string(w->kv_type));
    json_object_set_new(o, "kind", json_string(w->cfg.kind == RT_KIND_OPENAI ? "openai"
                                               : w->cfg.kind == RT_KIND_LLAMA_SERVER
                                                   ? "llama-server"
                                                   : "spillway"));
    if (w->cfg.kind == RT_KIND_LLAMA_SERVER) {
        /* router_llamaserver.c: its /slots, and whether its streams carry
         * token ids a worker can resume from (and it can take a greedy
         * resume from another llama-server) */
        json_t *ls = json_pack("{s:b, s:b, s:i, s:i, s:i}", "vocab_checked",
                               w->ls_vocab_checked, "resumable", w->ls_vocab_same, "slots",
                               w->slots_max, "slots_busy", w->ls_slots_busy, "slots_foreign",
                               w->ls_foreign);
        /* router_image.c: whether image requests go to it (its /props,
         * or before that its mmproj =); null: not known yet */
        json_object_set_new(ls, "images", w->ls_props_checked ? json_boolean(w->ls_vision)
                                          : w->cfg.mmproj[0]  ? json_true()
                                                              : json_null());
        /* router_books.c: its KV counted from the model file, or why not */
        const rt_model *m = &rt->models[w->model];
        json_object_set_new(ls, "kv_counted", json_boolean(w->kv_budget >= 0));
        if (w->kv_budget < 0)
            json_object_set_new(ls, "kv_not_counted",
                                json_string(m->cache_error[0] ? m->cache_error
                                            : !eng_gguf_cache_countable(&m->cache)
                                                ? m->cache.reason
                                                : "no slot context known yet (/slots)"));
        json_object_set_new(o, "llama_server", ls);
    }
    if (w->cfg.on_demand)
        json_object_set_new(o, "on_demand",
                            json_pack("{s:i, s:I, s:f, s:I, s:I, s:I}", "idle_timeout_s",
                                      w->cfg.idle_timeout_s, "footprint_bytes",
                                      (json_int_t)w->footprint, "start_seconds", w->start_seconds,
                                      "starts", (json_int_t)w->demand_starts, "idle_stops",
                                      (json_int_t)w->idle_stops, "evictions",
                                      (json_int_t)w->evictions));
    /* the router's books beside the worker's own figures */
    json_object_set_new(o, "books",
                        json_pack("{s:i, s:i, s:I, s:I, s:b}", "seqs", w->books.seqs, "max_seqs",
                                  rt_pool_max_seqs(w), "kv_reserved_bytes",
                                  (json_int_t)w->books.kv_bytes, "kv_budget_bytes",
                                  (json_int_t)w->kv_budget, "held", w->held));
    /* other routers' requests on it at its last /health (a shared worker) */
    json_t *books = json_object_get(o, "books");
    json_object_set_new(books, "foreign_seqs", json_integer(w->foreign_seqs));
    json_object_set_new(books, "foreign_kv_bytes", json_integer((json_int_t)w->foreign_kv));
    json_object_set_new(books, "refusals",
                        json_pack("{s:I, s:I}", "slots", (json_int_t)w->refused_slots, "memory",
                                  (json_int_t)w->refused_memory));
    json_object_set_new(o, "reported",
                        json_pack("{s:i, s:i, s:I, s:I, s:I, s:i}", "slots_max", w->slots_max,
                                  "kv_block_tokens", w->kv_block_tokens, "kv_block_device_bytes",
                                  (json_int_t)w->kv_block_bytes, "kv_device_used_bytes",
                                  (json_int_t)w->kv_held_bytes,
                                  "kv_sliding_block_device_bytes",
                                  (json_int_t)w->kv_sliding_block_bytes,
                                  "kv_sliding_blocks_max", w->kv_sliding_blocks_max));
    return o;
}

static int64_t nonneg(int64_t v)
{
    return v > 0 ? v : 0;
}

/* The device memory of a worker as the bar draws it, left to right: the
 * weights with the compute workspace (the worker reports them as one, its
 * context's device bytes less its KV), the KV the worker holds, the KV its
 * prefix cache keeps (held by no request: evictable, free to the books), the rest
 * of what the device has in use (other processes, and this one outside
 * its context), free, the reserve; the books' KV is drawn over the KV
 * part. Each figure is the worker's last /health but the books; a sum
 * that overshoots the total (figures read at different moments) is the
 * bar's to clip. */
static json_t *memory_json_locked(const rt_worker *w)
{
    int64_t kv_used = nonneg(w->kv_held_bytes), kv_cached = nonneg(w->kv_cached_bytes);
    int64_t context = nonneg(w->mem_context);
    return json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "counted",
                     w->on_device && w->mem_total > 0, "total_bytes", (json_int_t)w->mem_total,
                     "weights_bytes", (json_int_t)nonneg(context - kv_used - kv_cached),
                     "kv_used_bytes", (json_int_t)kv_used, "kv_cached_bytes",
                     (json_int_t)kv_cached, "kv_admitted_bytes", (json_int_t)w->books.kv_bytes,
                     "other_bytes", (json_int_t)nonneg(w->mem_used - context), "free_bytes",
                     (json_int_t)nonneg(w->mem_free), "reserve_bytes",
                     (json_int_t)nonneg(w->mem_reserved));
}

/* ---- the latest drill report ----------------------------------------- */

static const char *const drill_files[] = {"report.md", "report.json", "timeline.svg"};
static const char *const drill_types[] = {"text/markdown; charset=utf-8", "application/json",
                                          "image/svg+xml"};

/* The directory right under the state directory whose report.json is the
 * newest (`spillway drill --out STATE/NAME`): its name into name; false
 * when there is none. */
static bool drill_find(const rt_router *rt, char *name, size_t cap, double *mtime)
{
    DIR *d = opendir(rt->cfg->state_dir);
    if (!d)
        return false;
    bool found = false;
    double best = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= cap)
            continue;
        char path[1200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s/report.json", rt->cfg->state_dir, e->d_name);
        if (stat(path, &st) || !S_ISREG(st.st_mode))
            continue;
        double t = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
        if (!found || t > best) {
            found = true;
            best = t;
            snprintf(name, cap, "%s", e->d_name);
        }
    }
    closedir(d);
    *mtime = best;
    return found;
}

static json_t *drill_json(const rt_router *rt)
{
    char name[256];
    double mtime;
    if (!drill_find(rt, name, sizeof name, &mtime))
        return json_null();
    json_t *files = json_object();
    for (size_t i = 0; i < sizeof drill_files / sizeof drill_files[0]; i++) {
        char path[1200], route[64];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s/%s", rt->cfg->state_dir, name, drill_files[i]);
        snprintf(route, sizeof route, "/v1/spillway/drill/%s", drill_files[i]);
        if (!stat(path, &st) && S_ISREG(st.st_mode))
            json_object_set_new(files, drill_files[i], json_string(route));
    }
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", rt->cfg->state_dir, name);
    return json_pack("{s:s, s:f, s:o}", "path", dir, "modified_time", mtime, "files", files);
}

#define RT_DRILL_FILE_MAX ((size_t)16 << 20)

void rt__handle_drill(rt_req *q)
{
    rt_router *rt = q->rt;
    if (!strcmp(q->path, "/v1/spillway/drill")) {
        json_t *d = drill_json(rt);
        if (json_is_null(d)) {
            json_decref(d);
            rt__send_error(q, 404, "not_found",
                           "no drill report in the state directory (spillway drill --out "
                           "STATE/NAME writes one there)", NULL, NULL);
            return;
        }
        char *s = sw_json_dumps(d, JSON_COMPACT);
        json_decref(d);
        if (s)
            rt__send_response(q, 200, "application/json", NULL, s, strlen(s));
        free(s);
        return;
    }
    /* only the drill's own three file names: no other path is reachable */
    const char *file = q->path + 19;
    int which = -1;
    for (int i = 0; i < (int)(sizeof drill_files / sizeof drill_files[0]); i++)
        if (!strcmp(file, drill_files[i]))
            which = i;
    char name[256];
    double mtime;
    if (which < 0 || !drill_find(rt, name, sizeof name, &mtime)) {
        rt__send_error(q, 404, "not_found", "no such drill report file", NULL, NULL);
        return;
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/%s/%s", rt->cfg->state_dir, name, drill_files[which]);
    char *body = NULL;
    size_t len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size > RT_DRILL_FILE_MAX)
        goto fail;
    body = sw_malloc((size_t)st.st_size + 1);
    if (!body)
        goto fail;
    while (len < (size_t)st.st_size) {
        ssize_t r = read(fd, body + len, (size_t)st.st_size - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    /* the drill's SVG is shown as an image, never run as a document */
    rt__send_response(q, 200, drill_types[which],
                      "X-Content-Type-Options: nosniff\r\n"
                      "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n",
                      body, len);
    sw_free(body);
    return;
fail:
    if (fd >= 0)
        close(fd);
    sw_free(body);
    rt__send_error(q, 404, "not_found", "the drill report file cannot be read", NULL, NULL);
}

/* ---- GET /v1/spillway/stats ------------------------------------------- */

/* The slot that holds epoch e when it is in the ring (e may be 0 or less
 * in the first 10 minutes after the machine's boot: no slot holds it). */
static const rt_stats_slot *slot_at(const rt_router *rt, int64_t e)
{
    return &rt->stats[((e % RT_STATS_SLOTS) + RT_STATS_SLOTS) % RT_STATS_SLOTS];
}

/* With rt->mu held: series name of the ring, oldest slot first, the last
 * one the current window; field picks a slot's counter. */
static json_t *series_locked(const rt_router *rt, int64_t now_epoch,
                             uint64_t (*field)(const rt_stats_slot *s, int wi), int wi)
{
    json_t *a = json_array();
    for (int64_t e = now_epoch - RT_STATS_SLOTS + 1; e <= now_epoch; e++) {
        const rt_stats_slot *s = slot_at(rt, e);
        json_array_append_new(a, json_integer(s->epoch == e ? (json_int_t)field(s, wi) : 0));
    }
    return a;
}

/* With rt->mu held: the mean queue wait of each slot in milliseconds (0
 * where none ended), in the order of series_locked. */
static json_t *wait_series_locked(const rt_router *rt, int64_t now_epoch)
{
    json_t *a = json_array();
    for (int64_t e = now_epoch - RT_STATS_SLOTS + 1; e <= now_epoch; e++) {
        const rt_stats_slot *s = slot_at(rt, e);
        bool any = s->epoch == e && s->waits > 0;
        json_array_append_new(a, json_real(any ? s->wait_s * 1000 / (double)s->waits : 0.0));
    }
    return a;
}

static uint64_t f_requests(const rt_stats_slot *s, int wi) { (void)wi; return s->requests; }
static uint64_t f_failed(const rt_stats_slot *s, int wi) { (void)wi; return s->failed; }
static uint64_t f_failovers(const rt_stats_slot *s, int wi) { (void)wi; return s->failovers; }
static uint64_t f_tokens(const rt_stats_slot *s, int wi) { (void)wi; return s->tokens; }
static uint64_t f_waits(const rt_stats_slot *s, int wi) { (void)wi; return s->waits; }
static uint64_t f_w_requests(const rt_stats_slot *s, int wi) { return s->w_requests[wi]; }
static uint64_t f_w_tokens(const rt_stats_slot *s, int wi) { return s->w_tokens[wi]; }

void rt__handle_stats(rt_req *q)
{
    rt_router *rt = q->rt;
    double now = rt__now_s();
    int64_t now_epoch = stats_epoch(now);
    json_t *ws = json_array();
    json_t *queue = NULL, *ring = NULL, *totals = NULL;
    int ready = 0;
    uint64_t events_total = 0;
    /* lock order: the pool's, then the router's */
    pthread_mutex_lock(&rt->pool.mu);
    pthread_mutex_lock(&rt->mu);
    for (int k = 0; k < rt->pool.n_live; k++) {
        int wi = rt->pool.order[k];
        const rt_worker *w = &rt->pool.w[wi];
        ready += w->state == WS_READY;
        json_t *o = rt__worker_json_locked(rt, w);
        if (!o)
            continue;
        json_object_set_new(o, "memory", memory_json_locked(w));
        json_object_set_new(o, "series",
                            json_pack("{s:o, s:o}", "requests",
                                      series_locked(rt, now_epoch, f_w_requests, wi), "tokens",
                                      series_locked(rt, now_epoch, f_w_tokens, wi)));
        json_object_set_new(o, "totals",
                            json_pack("{s:I, s:I, s:I, s:I}", "requests_ok",
                                      (json_int_t)w->req_ok, "requests_client_error",
                                      (json_int_t)w->req_client_error, "requests_failed",
                                      (json_int_t)w->req_failed, "tokens", (json_int_t)w->tokens));
        json_array_append_new(ws, o);
    }
    const rt_queue *qu = &rt->queue;
    queue = json_pack("{s:i, s:i, s:I, s:f, s:f, s:f}", "depth", qu->depth, "peak_depth",
                      qu->peak_depth, "wait_count", (json_int_t)qu->wait_count,
                      "wait_seconds_sum", qu->wait_sum, "wait_seconds_mean",
                      qu->wait_count ? qu->wait_sum / (double)qu->wait_count : 0.0,
                      "drain_rate", qu->rate);
    ring = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "requests",
                     series_locked(rt, now_epoch, f_requests, 0), "failed",
                     series_locked(rt, now_epoch, f_failed, 0), "failovers",
                     series_locked(rt, now_epoch, f_failovers, 0), "tokens",
                     series_locked(rt, now_epoch, f_tokens, 0), "admissions",
                     series_locked(rt, now_epoch, f_waits, 0), "queue_wait_ms",
                     wait_series_locked(rt, now_epoch));
    totals = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "failovers_oom",
                       (json_int_t)rt->failovers_oom, "failovers_crash",
                       (json_int_t)rt->failovers_crash, "refused_queue_full",
                       (json_int_t)rt->refused_queue_full, "refused_queue_timeout",
                       (json_int_t)rt->refused_queue_timeout, "refused_deadline",
                       (json_int_t)rt->refused_deadline, "refused_context",
                       (json_int_t)rt->refused_context, "rejected_auth",
                       (json_int_t)rt->rejected_auth);
    {
        /* refusals by workers of what the books admitted, all workers */
        uint64_t worker_refusals = 0;
        RT_POOL_FOR_LIVE(&rt->pool, i)
            worker_refusals += rt->pool.w[i].refused_slots + rt->pool.w[i].refused_memory;
        json_object_set_new(totals, "worker_refusals", json_integer((json_int_t)worker_refusals));
    }
    events_total = rt->events_total;
    int conns = rt->active_conns, streams = rt->n_streams;
    pthread_mutex_unlock(&rt->mu);
    pthread_mutex_unlock(&rt->pool.mu);
    /* the window that is running now ends at the next slot boundary */
    double slot_end_mono = (double)now_epoch * RT_STATS_SLOT_S;
    json_t *o = json_pack(
        "{s:s, s:s, s:f, s:f, s:i, s:i, s:f, s:o, s:o, s:o, s:o, s:I, s:i, s:i, s:o}", "object",
        "spillway.stats", "status", ready ? "ready" : "unavailable", "time", rt__wall_s(),
        "uptime_seconds", now - rt->started_at, "slot_seconds", RT_STATS_SLOT_S, "slots",
        RT_STATS_SLOTS, "series_end_time", rt__wall_s() + (slot_end_mono - now), "series", ring,
        "queue", queue, "totals", totals, "workers", ws, "events_total", (json_int_t)events_total,
        "connections", conns, "event_streams", streams, "drill_report", drill_json(rt));
    json_t *ledger = rt__ledger_json(rt);
    if (o && ledger)
        json_object_set_new(o, "ledger", ledger);
    else
        json_decref(ledger);
    char *s = o ? sw_json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s)
        rt__send_response(q, 200, "application/json", "Cache-Control: no-store\r\n", s, strlen(s));
    else
        rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
    free(s);
}
