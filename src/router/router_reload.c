/* router_reload.c - reload without dropping work (docs/router.md,
 * Reload): SIGHUP or POST /v1/spillway/reload reads the configuration
 * file again, with the command-line overrides the router was started
 * with, and applies what differs:
 *   - an added worker gets a slot and the supervisor starts it;
 *   - a removed one drains (admits nothing new, its admitted requests
 *     finish), then it is stopped and its slot is gone;
 *   - a changed one drains, stops and starts again with its new
 *     configuration; a change of preference alone only reorders;
 *   - router settings read per request (keys, limits, time-outs, tools)
 *     take effect for the requests that begin after it; those fixed at
 *     start (listen, state-dir, the model, max-connections, queue-size,
 *     job-workers) are kept and named in the answer.
 * A file that does not load or check changes nothing, and the error names
 * its line and key. The drains end in the supervisor (router_supervisor.c).
 */
#include "router/router-impl.h"
#include "router/router_net.h"

#include "common/alloc.h"
#include "common/log.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* One reload at a time; the retired configurations stay allocated until
 * the router ends, since a request may still read one. */
static pthread_mutex_t reload_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct setting {
    const char *name;   /* as the file spells it */
    size_t off, size;
    bool fixed;         /* fixed at start: a reload keeps the running value */
} setting;

#define SETTING(name, field, fixed) \
    { name, offsetof(rt_config, field), sizeof(((rt_config *)0)->field), fixed }
static const setting settings[] = {
    SETTING("[server] listen", listen, true),
    SETTING("[server] state-dir", state_dir, true),
    SETTING("[model] sections", models, true),
    SETTING("[model] sections", n_models, true),
    SETTING("[model] sections", legacy_model, true),
    SETTING("[server] max-connections", max_connections, true),
    SETTING("[server] queue-size", queue_size, true),
    SETTING("[server] job-workers", job_workers, true),
    SETTING("[server] ledger", ledger, true),
    SETTING("[server] ledger-lease-s", ledger_lease_s, true),
    SETTING("[server] api-keys", api_keys, false),
    SETTING("[server] api-keys", n_keys, false),
    SETTING("[server] max-body", max_body_bytes, false),
    SETTING("[server] max-image-bytes", max_image_bytes, false),
    SETTING("[server] max-attempts", max_attempts, false),
    SETTING("[server] queue-timeout-ms", queue_timeout_ms, false),
    SETTING("[server] http-timeout", http_timeout_s, false),
    SETTING("[server] keepalive-timeout-s", keepalive_timeout_s, false),
    SETTING("[server] keepalive-max-requests", keepalive_max_requests, false),
    SETTING("[server] ledger-retention-s", ledger_retention_s, false),
    SETTING("[server] health-interval-ms", health_interval_ms, false),
    SETTING("[server] hang-timeout-ms", hang_timeout_ms, false),
    SETTING("[server] ready-timeout", ready_timeout_s, false),
    SETTING("[server] idempotency-ttl-s", idempotency_ttl_s, false),
    SETTING("[server] max-tool-steps", max_tool_steps, false),
    SETTING("[server] drain-timeout-s", drain_timeout_s, false),
    SETTING("[server] stop-delay-ms", stop_delay_ms, false),
    SETTING("[tool NAME] sections", tools, false),
    SETTING("[tool NAME] sections", n_tools, false),
};
#undef SETTING

/* Appends name to arr unless it is its last entry already (a setting of
 * two fields is listed once). */
static void list_once(json_t *arr, const char *name)
{
    size_t n = json_array_size(arr);
    if (n && !strcmp(json_string_value(json_array_get(arr, n - 1)), name))
        return;
    json_array_append_new(arr, json_string(name));
}

/* Both configurations come from rt_config_read (zeroed, then written),
 * so their bytes compare. The fixed ones get the running value back. */
static bool diff_settings(const rt_config *cur, rt_config *next, json_t *applied, json_t *fixed)
{
    bool changed = false;
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
        const setting *s = &settings[i];
        const char *a = (const char *)cur + s->off;
        char *b = (char *)next + s->off;
        if (!memcmp(a, b, s->size))
            continue;
        if (s->fixed) {
            memcpy(b, a, s->size);
            list_once(fixed, s->name);
        } else {
            changed = true;
            list_once(applied, s->name);
        }
    }
    return changed;
}

/* Whether a running worker must restart to take configuration b:
 * everything but its preference and place in the file. */
static bool worker_differs(const rt_worker_config *a, const rt_worker_config *b)
{
    if (a->n_env != b->n_env)
        return true;
    for (int i = 0; i < a->n_env; i++)
        if (strcmp(a->env[i], b->env[i]))
            return true;
    return strcmp(a->name, b->name) || a->managed != b->managed || strcmp(a->url, b->url) ||
           strcmp(a->device, b->device) || a->sim_capacity != b->sim_capacity ||
           a->gpu_layers != b->gpu_layers || a->ctx_limit != b->ctx_limit ||
           a->max_seqs != b->max_seqs || a->reserve != b->reserve ||
           strcmp(a->policy, b->policy) || strcmp(a->kv_type, b->kv_type) || a->threads != b->threads || a->kind != b->kind ||
           a->skip_calibration != b->skip_calibration ||
           a->no_prefix_cache != b->no_prefix_cache || strcmp(a->model, b->model) || strcmp(a->command, b->command) ||
           a->on_demand != b->on_demand || a->idle_timeout_s != b->idle_timeout_s ||
           strcmp(a->ca_file, b->ca_file) || strcmp(a->api_key_env, b->api_key_env) ||
           strcmp(a->mmproj, b->mmproj);
}

/* With the pool's lock: the live slot of worker name, -1 none. */
static int find_live(const rt_pool *p, const char *name)
{
    for (int i = 0; i < p->n_slots; i++)
        if (!p->w[i].gone && !strcmp(p->w[i].cfg.name, name))
            return i;
    return -1;
}

/* With the pool's lock: a slot for an added worker (a gone one first),
 * -1 when all RT_MAX_WORKERS hold a live or draining worker. */
static int free_slot(rt_pool *p, const bool *taken)
{
    for (int i = 0; i < p->n_slots; i++)
        if (p->w[i].gone && !taken[i])
            return i;
    return p->n_slots < RT_MAX_WORKERS ? p->n_slots : -1;
}

static void begin_drain(rt_worker *w, int kind, double now)
{
    if (w->drain == RT_DRAIN_NONE)
        w->drain_since = now;
    w->drain = kind;
}

/* The worker half, with the pool's lock: checked whole first (slots), so
 * that a reload that cannot be applied changes nothing. */
static int apply_workers_locked(rt_router *rt, const rt_config *next, json_t *out, sw_error *err)
{
    rt_pool *p = &rt->pool;
    int slot_of[RT_MAX_WORKERS];
    bool taken[RT_MAX_WORKERS] = {false};
    int n_slots = p->n_slots;
    for (int k = 0; k < next->n_workers; k++) {
        /* next has the running models (fixed at start) */
        if (rt_config_worker_model(next, &next->workers[k]) < 0)
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: model = %s is not a model this router serves "
                                "(model sections need a restart)",
                                next->workers[k].name, next->workers[k].model);
        slot_of[k] = find_live(p, next->workers[k].name);
        if (slot_of[k] >= 0)
            continue;
        int s = free_slot(p, taken);
        if (s < 0 || s >= RT_MAX_WORKERS)
            return sw_error_set(err, SW_EINVAL,
                                "[worker %s]: no free worker slot (at most %d workers, the "
                                "draining ones included); try again when they have stopped",
                                next->workers[k].name, RT_MAX_WORKERS);
        taken[s] = true;
        slot_of[k] = -2 - s; /* to add, into slot s */
        if (s == p->n_slots)
            p->n_slots++; /* for free_slot's next answer; set back below */
    }
    p->n_slots = n_slots;
    json_t *added = json_array(), *removed = json_array(), *restarted = json_array(),
           *kept = json_array();
    double now = rt__now_s();
    for (int k = 0; k < next->n_workers; k++) {
        const rt_worker_config *wc = &next->workers[k];
        if (slot_of[k] <= -2) {
            int s = -2 - slot_of[k];
            rt_pool_slot_init_locked(p, s, wc, rt_config_worker_model(next, wc),
                                     rt->cfg->state_dir);
            if (s >= p->n_slots)
                p->n_slots = s + 1;
            rt__stats_clear_worker(rt, s);
            json_array_append_new(added, json_string(wc->name));
            continue;
        }
        rt_worker *w = &p->w[slot_of[k]];
        const rt_worker_config *running = w->drain == RT_DRAIN_RESTART ? &w->next_cfg : &w->cfg;
        if (worker_differs(running, wc) || w->drain == RT_DRAIN_RESTART) {
            /* a worker already draining to restart takes the newest file */
            w->next_cfg = *wc;
            w->next_model = rt_config_worker_model(next, wc);
            begin_drain(w, RT_DRAIN_RESTART, now);
            json_array_append_new(restarted, json_string(wc->name));
        } else {
            /* the same worker (a remove now undone): only its place */
            w->drain = RT_DRAIN_NONE;
            w->cfg.preference = wc->preference;
            w->cfg.position = wc->position;
            json_array_append_new(kept, json_string(wc->name));
        }
    }
    for (int i = 0; i < p->n_slots; i++) {
        rt_worker *w = &p->w[i];
        bool listed = false;
        for (int k = 0; k < next->n_workers && !listed; k++)
            listed = !strcmp(next->workers[k].name, w->cfg.name);
        if (w->gone || listed || w->drain == RT_DRAIN_REMOVE)
            continue;
        begin_drain(w, RT_DRAIN_REMOVE, now);
        json_array_append_new(removed, json_string(w->cfg.name));
    }
    rt_pool_sort_locked(p);
    json_object_set_new(out, "workers",
                        json_pack("{s:o, s:o, s:o, s:o}", "added", added, "removed", removed,
                                  "restarted", restarted, "unchanged", kept));
    return SW_OK;
}

static void log_list(const char *what, json_t *arr)
{
    if (!json_array_size(arr))
        return;
    char *s = sw_json_dumps(arr, JSON_COMPACT);
    SW_INFO("router", "reload: %s %s", what, s ? s : "");
    free(s);
}

int rt__reload(rt_router *rt, const char *origin, json_t **answer, sw_error *err)
{
    *answer = NULL;
    pthread_mutex_lock(&reload_mu);
    const rt_config *cur = rt->cfg;
    rt_config *next = sw_malloc(sizeof *next);
    rt_retired *old = NULL;
    json_t *out = json_object(), *applied = json_array(), *fixed = json_array();
    int rc = SW_ENOMEM;
    if (!next || !out || !applied || !fixed) {
        sw_error_set(err, SW_ENOMEM, "out of memory reading the configuration");
        goto fail;
    }
    if (rt->stop) {
        rc = sw_error_set(err, SW_EINVAL, "the router is stopping");
        goto fail;
    }
    rc = rt_config_read(next, cur->config_path, cur->override_listen, cur->override_state_dir,
                        cur->override_model, cur->override_ledger, err);
    if (rc)
        goto fail;
    if ((rc = rt__upstreams_register(next, err)))
        goto fail;
    bool settings_changed = diff_settings(cur, next, applied, fixed);
    /* the running configuration is kept when a new one is published (a
     * request may be reading it): its list node is taken before anything
     * changes */
    if (settings_changed && cur != rt->first_cfg && !(old = sw_malloc(sizeof *old))) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory applying the configuration");
        goto fail;
    }
    pthread_mutex_lock(&rt->pool.mu);
    rc = apply_workers_locked(rt, next, out, err);
    pthread_mutex_unlock(&rt->pool.mu);
    if (rc)
        goto fail;
    json_object_set_new(out, "object", json_string("spillway.reload"));
    json_object_set_new(out, "config", json_string(cur->config_path));
    json_object_set_new(out, "settings",
                        json_pack("{s:O, s:O}", "applied", applied, "need_restart", fixed));
    if (settings_changed) {
        rt->cfg = next; /* published whole: a reader sees the old or the new one */
        if (old) {
            old->cfg = (rt_config *)cur;
            old->next = rt->retired;
            rt->retired = old;
            old = NULL;
        }
        next = NULL;
    }
    pthread_mutex_lock(&rt->mu);
    rt->reloads_ok++;
    pthread_mutex_unlock(&rt->mu);
    rt_queue_kick(&rt->queue);
    SW_INFO("router", "reload (%s) of %s: done", origin, cur->config_path);
    json_t *ws = json_object_get(out, "workers");
    log_list("added", json_object_get(ws, "added"));
    log_list("draining to remove", json_object_get(ws, "removed"));
    log_list("draining to restart", json_object_get(ws, "restarted"));
    log_list("settings applied", applied);
    log_list("settings that need a restart (kept)", fixed);
    sw_free(next);
    json_decref(applied);
    json_decref(fixed);
    *answer = out;
    pthread_mutex_unlock(&reload_mu);
    return SW_OK;
fail:
    pthread_mutex_lock(&rt->mu);
    rt->reloads_failed++;
    pthread_mutex_unlock(&rt->mu);
    SW_WARN("router", "reload (%s) failed, nothing changed: %s", origin,
            err->message[0] ? err->message : sw_strerror(rc));
    sw_free(next);
    sw_free(old);
    json_decref(out);
    json_decref(applied);
    json_decref(fixed);
    pthread_mutex_unlock(&reload_mu);
    return rc ? rc : SW_EINVAL;
}

void rt__reload_free_retired(rt_router *rt)
{
    for (rt_retired *r = rt->retired, *n; r; r = n) {
        n = r->next;
        sw_free(r->cfg);
        sw_free(r);
    }
    rt->retired = NULL;
    if (rt->cfg != rt->first_cfg)
        sw_free((rt_config *)rt->cfg);
    rt->cfg = rt->first_cfg;
}

void rt__handle_reload(rt_req *q)
{
    json_t *out = NULL;
    sw_error err;
    sw_error_clear(&err);
    if (rt__reload(q->rt, "POST /v1/spillway/reload", &out, &err)) {
        rt__send_error(q, err.code == SW_ENOMEM ? 500 : 400,
                       err.code == SW_ENOMEM ? "out_of_memory" : "invalid_config", err.message,
                       NULL, NULL);
        return;
    }
    char *s = sw_json_dumps(out, JSON_COMPACT);
    json_decref(out);
    if (s)
        rt__send_response(q, 200, "application/json", NULL, s, strlen(s));
    else
        rt__send_error(q, 500, "out_of_memory", "out of memory", NULL, NULL);
    free(s);
}
