/* router_supervisor.c - the managed workers' lives: spawn (fork/exec of
 * this binary), reap, restart with back-off, restart a worker poisoned by
 * an unexpected out-of-memory, and poll every worker's /health into the
 * worker table the router routes from. Runs on its own thread (and on the
 * main thread during start-up).
 */
#include "router/router-impl.h"
#include "router/router_books.h"
#include "router/router_tls.h"
#include "router/router_llamaserver.h"
#include "router/router_net.h"

#include "common/alloc.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static void sup_spawn(rt_router *rt, rt_worker *w)
{
    const rt_worker_config *c = &w->cfg;
    const rt_model_config *model = &rt->models[w->model].cfg;
    char a[16][160];
    const char *argv[RT_CMD_MAX_ARGS];
    char cmd_buf[4096], exe[1024] = "/proc/self/exe";
    int n = 0;
    if (RT_KIND_EXTERNAL(c->kind)) {
        /* an engine of its own (router_command.c): its url, or a port of
         * ours, picked once and kept across restarts */
        sw_error err;
        sw_error_clear(&err);
        if ((!w->address[0] && rt__pick_port(w->address, sizeof w->address)) ||
            rt__command_argv(w, model->path, cmd_buf, sizeof cmd_buf, argv,
                             RT_CMD_MAX_ARGS - (c->mmproj[0] ? 2 : 0), exe, sizeof exe, &err)) {
            snprintf(w->start_error, sizeof w->start_error, "%s",
                     err.message[0] ? err.message : strerror(errno));
            SW_ERROR("router", "worker %s: cannot start its command: %s", c->name,
                     w->start_error);
            w->next_start = rt__now_s() + 10;
            return;
        }
        if (c->kind == RT_KIND_LLAMA_SERVER) { /* its memory, planned (router_books.c) */
            const rt_model *m = &rt->models[w->model];
            char plan[400];
            int argc = 0;
            while (argc < RT_CMD_MAX_ARGS && argv[argc])
                argc++;
            if (c->mmproj[0]) { /* room left for it above */
                /* its vision projector: image requests go to it
                 * (router_image.c) */
                argv[argc++] = "--mmproj";
                argv[argc++] = c->mmproj;
                argv[argc] = NULL;
            }
            w->ls_planned_kv = rt_books_llama_server_plan(&m->cache, m->weights_bytes, argv,
                                                          argc, plan, sizeof plan);
            SW_INFO("router", "worker %s (llama-server): planned from %s: %s", c->name,
                    model->path, plan);
        }
        goto spawn;
    }
    argv[n++] = "spillway";
    argv[n++] = "worker";
    argv[n++] = "--model";
    argv[n++] = model->path;
    argv[n++] = "--model-id"; /* the router's id: what clients send */
    argv[n++] = model->name;
    argv[n++] = "--listen";
    argv[n++] = w->address;
    int k = 0;
#define ARG(flag, ...)                                      \
    do {                                                    \
        snprintf(a[k], sizeof a[k], __VA_ARGS__);           \
        argv[n++] = flag;                                   \
        argv[n++] = a[k++];                                 \
    } while (0)
    if (c->device[0])
        ARG("--device", "%s", c->device);
    if (c->sim_capacity)
        ARG("--sim-capacity", "%llu", (unsigned long long)c->sim_capacity);
    if (c->gpu_layers != -1)
        ARG("--gpu-layers", "%d", c->gpu_layers);
    if (c->ctx_limit)
        ARG("--ctx-limit", "%d", c->ctx_limit);
    if (c->max_seqs)
        ARG("--max-seqs", "%d", c->max_seqs);
    if (c->reserve >= 0)
        ARG("--reserve", "%g", c->reserve);
    if (c->policy[0])
        ARG("--policy", "%s", c->policy);
    if (c->kv_type[0])
        ARG("--kv-type", "%s", c->kv_type);
    if (c->threads)
        ARG("--threads", "%d", c->threads);
    if (model->chat_template[0])
        ARG("--chat-template", "%s", model->chat_template);
    if (model->reasoning_format[0])
        ARG("--reasoning-format", "%s", model->reasoning_format);
    if (model->pooling[0])
        ARG("--pooling", "%s", model->pooling);
#undef ARG
    if (c->skip_calibration)
        argv[n++] = "--no-calibrate";
    if (c->no_prefix_cache)
        argv[n++] = "--no-prefix-cache";
    /* another worker of this configuration on the same device: a prefix
     * cache only this worker could evict would take memory the books give
     * the other (docs/internals/prefix-cache.md) */
    for (int j = 0; j < rt->pool.n_slots; j++)
        if (&rt->pool.w[j] != w && !rt->pool.w[j].gone && rt_pool_same_device(w, &rt->pool.w[j])) {
            argv[n++] = "--shared-device";
            break;
        }
    argv[n] = NULL;
spawn:;
    /* The environment is built before fork: only async-signal-safe calls
     * happen in the child. */
    size_t ne = 0;
    while (environ[ne])
        ne++;
    const char **envp = sw_calloc(ne + RT_MAX_ENV + 1, sizeof *envp);
    if (!envp)
        return;
    size_t m = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "SPILLWAY_FAULT=", 15))
            envp[m++] = environ[i];
    for (int i = 0; i < c->n_env; i++)
        envp[m++] = c->env[i];
    envp[m] = NULL;
    if (!strncmp(w->address, "unix:", 5))
        unlink(w->address + 5);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(w->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) {
            dup2(nul, 0);
            close(nul);
        }
        execve(exe, (char *const *)argv, (char *const *)envp);
        _exit(127);
    }
    sw_free(envp);
    if (pid < 0) {
        SW_ERROR("router", "worker %s: fork failed: %s", c->name, strerror(errno));
        w->next_start = rt__now_s() + 1;
        return;
    }
    w->pid = pid;
    w->state = WS_STARTING;
    w->started_at = rt__now_s();
    w->last_ok = w->started_at;
    w->ready_once = false;
    w->ls_vocab_checked = w->ls_vocab_same = false; /* a new process: asked again */
    w->ls_props_checked = w->ls_vision = false;
    rt_prefix_clear(&w->prefix);                     /* ... with an empty cache */
    if (RT_KIND_EXTERNAL(c->kind))
        SW_INFO("router", "worker %s: started pid %d (%s, at %s), log %s", c->name, (int)pid, exe,
                w->address, w->log_path);
    else
        SW_INFO("router", "worker %s: started pid %d (%s), log %s", c->name, (int)pid,
                c->device[0] ? c->device : "cpu", w->log_path);
}

/* An external engine (kind = openai): ready when GET /health or else
 * GET /v1/models answers 200 (llama-server and vLLM have /health, Ollama
 * only the second). It reports no memory and no rates: admission uses
 * the configured ctx-limit and max-seqs only. */
static void sup_health_openai(rt_router *rt, rt_worker *w)
{
    char *body = NULL;
    int st;
    rt_ls_health ls;
    bool is_ls = w->cfg.kind == RT_KIND_LLAMA_SERVER, props_asked = false;
    if (is_ls) {
        /* llama-server (router_llamaserver.c): /health, /slots, /metrics,
         * and its vocabulary once per process */
        pthread_mutex_lock(&rt->pool.mu);
        bool check = !w->ls_vocab_checked;
        pthread_mutex_unlock(&rt->pool.mu);
        st = rt__ls_health(rt, w->address, w->model, check, &ls);
        props_asked = check;
        if (!check)
            ls.vocab_checked = false; /* the verdict stays */
    } else {
        st = rn_get(w->address, "/health", 2000, &body);
        sw_free(body);
        body = NULL;
        if (st != 200) {
            st = rn_get(w->address, "/v1/models", 2000, &body);
            sw_free(body);
        }
    }
    pthread_mutex_lock(&rt->pool.mu);
    if (st == 200) {
        w->on_device = false;
        w->mem_total = w->mem_used = w->mem_reserved = w->mem_free = 0;
        w->mem_context = 0;
        w->kv_bpt = 0;
        w->ctx_limit = w->cfg.ctx_limit;
        w->prefill_rate = w->decode_rate = 0;
        snprintf(w->rates_source, sizeof w->rates_source, "none");
        if (is_ls) {
            /* ctx-limit and max-seqs when set, else its slots' figures */
            if (!w->ctx_limit)
                w->ctx_limit = ls.n_ctx;
            w->slots_max = ls.slots;
            w->ls_slots_busy = ls.slots_busy;
            w->ls_foreign = ls.slots_busy > w->books.seqs ? ls.slots_busy - w->books.seqs : 0;
            if (ls.prefill_rate > 0 && ls.decode_rate > 0) {
                w->prefill_rate = ls.prefill_rate;
                w->decode_rate = ls.decode_rate;
                snprintf(w->rates_source, sizeof w->rates_source, "measured");
            }
            if (props_asked) {
                /* whether it takes images (router_image.c): its /props */
                if (!w->ls_props_checked || w->ls_vision != ls.vision)
                    SW_INFO("router", "worker %s (llama-server): %s", w->cfg.name,
                            ls.vision ? "it has a vision projector: image requests may go to it"
                            : ls.props_checked ? "its /props says no vision: no image requests"
                                               : "no /props: no image requests go to it");
                w->ls_props_checked = true;
                w->ls_vision = ls.props_checked && ls.vision;
            }
            if (ls.vocab_checked) {
                w->ls_vocab_checked = true;
                w->ls_vocab_same = ls.vocab_same;
                if (ls.vocab_same)
                    SW_INFO("router", "worker %s (llama-server): its vocabulary is the model's: "
                            "its streams can be resumed, and it can resume a greedy one "
                            "another llama-server started", w->cfg.name);
                else
                    SW_WARN("router", "worker %s (llama-server): its /tokenize does not give "
                            "the model's token ids (another vocabulary?): its streams take the "
                            "OpenAI endpoint and cannot be resumed", w->cfg.name);
            }
        }
        rt_pool_reconcile_locked(w);
        if (is_ls) /* its KV counted from the model file (router_books.c) */
            rt_books_llama_server_locked(w, &rt->models[w->model].cache,
                                         !rt->models[w->model].cache_error[0], w->ctx_limit,
                                         w->slots_max, w->ls_planned_kv);
        rt_pool_device_measure_locked(&rt->pool, (int)(w - rt->pool.w));
        if (w->state != WS_READY)
            SW_INFO("router", "worker %s (%s): ready", w->cfg.name,
                    is_ls ? "llama-server" : "openai");
        w->state = WS_READY;
        w->last_ok = rt__now_s();
        w->ready_once = true;
        w->down_reason[0] = 0;
        w->refused = false;
    } else {
        /* an engine the router runs is starting until it answers (or
         * ready-timeout / hang-timeout-ms kill it); one at a url is down,
         * and says why: a refused certificate does not pass by itself */
        w->state = w->cfg.managed && w->pid > 0 ? WS_STARTING : WS_DOWN;
        if (w->state == WS_DOWN) {
            char tls[200];
            if (rn_upstream_failure(w->address, tls, sizeof tls)) {
                snprintf(w->down_reason, sizeof w->down_reason, "TLS: %s", tls);
                w->refused = !strncmp(tls, "certificate verification failed", 31);
            } else {
                snprintf(w->down_reason, sizeof w->down_reason,
                         st < 0 ? "no answer from GET /health or GET /v1/models"
                                : "GET /health and GET /v1/models answered %d",
                         st);
                w->refused = false;
            }
        }
        rn_pool_drop(w->address);
    }
    w->last_health = rt__now_s();
    w->health_now = false;
    pthread_mutex_unlock(&rt->pool.mu);
    rt_queue_kick(&rt->queue);
}

static void sup_health(rt_router *rt, rt_worker *w)
{
    if (RT_KIND_EXTERNAL(w->cfg.kind)) {
        sup_health_openai(rt, w);
        return;
    }
    char *body = NULL;
    /* the books as the /health is asked for (rt_pool_learn_usage_locked) */
    pthread_mutex_lock(&rt->pool.mu);
    int sent_seqs = w->books.seqs;
    int64_t sent_kv = w->books.kv_bytes;
    pthread_mutex_unlock(&rt->pool.mu);
    int st = rn_get(w->address, "/health", 2000, &body);
    json_t *j = body ? sw_json_loads(body, 0, NULL) : NULL;
    sw_free(body);
    pthread_mutex_lock(&rt->pool.mu);
    if (st == 200 && j) {
        json_t *mem = json_object_get(j, "memory");
        json_t *dev = json_object_get(j, "device");
        w->on_device = json_is_object(dev) &&
                       strcmp(json_string_value(json_object_get(dev, "kind")) ?: "cpu", "cpu") &&
                       json_integer_value(json_object_get(mem, "total_bytes")) > 0;
        w->mem_total = json_integer_value(json_object_get(mem, "total_bytes"));
        w->mem_used = json_integer_value(json_object_get(mem, "used_bytes"));
        w->mem_reserved = json_integer_value(json_object_get(mem, "reserved_bytes"));
        w->mem_free = json_integer_value(json_object_get(mem, "free_bytes"));
        w->mem_context = json_integer_value(json_object_get(mem, "context_device_bytes"));
        w->kv_bpt = json_integer_value(json_object_get(j, "kv_bytes_per_token"));
        /* a peer's number: out of range reads as 0 (no limit known) */
        json_int_t ctx = json_integer_value(json_object_get(j, "ctx_limit"));
        w->ctx_limit = ctx > 0 && ctx <= INT32_MAX ? (int32_t)ctx : 0;
        json_int_t smax = json_integer_value(json_object_get(json_object_get(j, "slots"), "max"));
        w->slots_max = smax > 0 && smax <= 4096 ? (int32_t)smax : 0;
        /* the books' units (a worker of an older version has none: its
         * memory is then not counted, only its sequences) */
        json_t *kv = json_object_get(j, "kv");
        json_int_t bt = json_integer_value(json_object_get(kv, "block_tokens"));
        json_int_t bb = json_integer_value(json_object_get(kv, "block_device_bytes"));
        json_int_t held = json_integer_value(json_object_get(kv, "device_used_bytes"));
        w->kv_block_tokens = bt > 0 && bt <= 65536 ? (int32_t)bt : 0;
        w->kv_block_bytes = bb > 0 ? (int64_t)bb : 0;
        w->kv_held_bytes = held > 0 ? (int64_t)held : 0;
        json_int_t cached = json_integer_value(json_object_get(kv, "device_cached_bytes"));
        w->kv_cached_bytes = cached > 0 ? (int64_t)cached : 0;
        const char *kt = json_string_value(json_object_get(j, "kv_type"));
        snprintf(w->kv_type, sizeof w->kv_type, "%s",
                 kt && (!strcmp(kt, "f16") || !strcmp(kt, "f32") || !strcmp(kt, "q8_0") ||
                        !strcmp(kt, "q4_0"))
                     ? kt
                     : "");
        /* a sliding-window model's local layers: counted only when the
         * share is a part of the block and the cap is one a context has */
        json_int_t sb = json_integer_value(json_object_get(kv, "sliding_block_device_bytes"));
        json_int_t sm = json_integer_value(json_object_get(kv, "sliding_blocks_max"));
        bool sliding = sb > 0 && sb <= bb && sm > 0 && sm <= (1 << 24);
        w->kv_sliding_block_bytes = sliding ? (int64_t)sb : 0;
        w->kv_sliding_blocks_max = sliding ? (int32_t)sm : 0;
        json_t *budget = json_object_get(kv, "budget_bytes");
        w->kv_reported_budget = json_is_integer(budget) ? (int64_t)json_integer_value(budget) : -1;
        w->prefill_rate = json_number_value(json_object_get(j, "prefill_tokens_per_second"));
        w->decode_rate = json_number_value(json_object_get(j, "decode_tokens_per_second"));
        /* one of the words docs/api.md lists, else none: any other text
         * (from a worker of another version, or not a spillway worker at
         * all) cut to the field could end inside a UTF-8 character, and
         * the router's /health (json_pack) would then drop the worker */
        const char *rs = json_string_value(json_object_get(j, "rates_source"));
        snprintf(w->rates_source, sizeof w->rates_source, "%s",
                 rs && (!strcmp(rs, "calibration") || !strcmp(rs, "measured")) ? rs : "none");
        if (w->state != WS_READY)
            SW_INFO("router", "worker %s: ready", w->cfg.name);
        if (!w->ready_once)
            rt__demand_ready_locked(rt, w);
        if (!w->restart_requested)
            w->state = WS_READY;
        rt_pool_reconcile_locked(w);
        {
            /* what it holds, other routers' requests included: "accepted"
             * (running or queued), else active + queued */
            json_t *sl = json_object_get(j, "slots");
            json_t *acc = json_object_get(sl, "accepted");
            json_int_t n = json_is_integer(acc)
                               ? json_integer_value(acc)
                               : json_integer_value(json_object_get(sl, "active")) +
                                     json_integer_value(json_object_get(sl, "queued"));
            int own = w->books.seqs > sent_seqs ? w->books.seqs : sent_seqs;
            int64_t own_kv = w->books.kv_bytes > sent_kv ? w->books.kv_bytes : sent_kv;
            rt_pool_learn_usage_locked(w, n > 0 && n <= 1 << 20 ? (int32_t)n : 0,
                                       w->kv_held_bytes, own, own_kv);
        }
        rt__demand_learn_locked(w);
        rt_pool_device_measure_locked(&rt->pool, (int)(w - rt->pool.w));
        w->backoff = 0.25;
        w->last_ok = rt__now_s();
        w->ready_once = true;
        w->down_reason[0] = 0;
    } else if (w->state == WS_READY || w->state == WS_SUSPECT) {
        /* answers, but not ready (draining, failed) or does not answer */
        w->state = w->cfg.managed && w->pid > 0 ? WS_STARTING : WS_DOWN;
        rn_pool_drop(w->address);
    } else if (!w->cfg.managed) {
        w->state = WS_DOWN;
    }
    w->last_health = rt__now_s();
    w->health_now = false;
    pthread_mutex_unlock(&rt->pool.mu);
    json_decref(j);
    rt_queue_kick(&rt->queue); /* ready, or a new budget: waiters may fit */
}

/* With the pool's lock: a worker a reload drains (router_reload.c).
 * Once the books show nothing admitted to it (or drain-timeout-s is
 * over: what still runs there then fails over as from a crash), its
 * process gets SIGTERM (SIGKILL 10 s later); once reaped, or at once for
 * a worker the router does not run, a removed worker's slot is gone and
 * a changed one starts again with its new configuration. */
static void sup_drain_locked(rt_router *rt, int i, double t)
{
    rt_worker *w = &rt->pool.w[i];
    bool overdue = t - w->drain_since > rt->cfg->drain_timeout_s;
    if (w->books.seqs > 0 && !overdue)
        return;
    if (w->cfg.managed && w->pid > 0) {
        if (!w->stop_sent_at) {
            if (w->books.seqs > 0)
                SW_WARN("router", "worker %s: drain-timeout-s passed with %d request(s) running; "
                        "stopping it anyway", w->cfg.name, w->books.seqs);
            SW_INFO("router", "worker %s: drained; stopping pid %d", w->cfg.name, (int)w->pid);
            kill(w->pid, SIGTERM);
            w->stop_sent_at = t;
        } else if (t - w->stop_sent_at > 10) {
            kill(w->pid, SIGKILL);
        }
        int status;
        if (waitpid(w->pid, &status, WNOHANG) != w->pid)
            return;
        w->pid = 0;
    }
    rn_pool_drop(w->address); /* no connection outlives the drain */
    if (w->drain == RT_DRAIN_STOP) {
        /* on demand: stopped until its model is asked for again */
        w->drain = RT_DRAIN_NONE;
        w->state = WS_STOPPED;
        w->on_device = false;
        w->kv_budget = -1;
        w->kv_held_bytes = 0;
        w->kv_cached_bytes = 0;
        w->kv_device_capacity = -1;
        SW_INFO("router", "worker %s: stopped", w->cfg.name);
    } else if (w->drain == RT_DRAIN_REMOVE) {
        SW_INFO("router", "worker %s: removed", w->cfg.name);
        w->gone = true;
        w->drain = RT_DRAIN_NONE;
        w->state = WS_DOWN;
    } else {
        /* the same name and counters, a new configuration and process */
        rt_worker keep = *w;
        rt_pool_slot_init_locked(&rt->pool, i, &keep.next_cfg, keep.next_model,
                                 rt->cfg->state_dir);
        w->restarts = keep.restarts;
        w->req_ok = keep.req_ok;
        w->req_client_error = keep.req_client_error;
        w->req_failed = keep.req_failed;
        w->tokens = keep.tokens;
        w->refused_memory = keep.refused_memory;
        w->refused_slots = keep.refused_slots;
        SW_INFO("router", "worker %s: restarting with its new configuration", w->cfg.name);
    }
    rt_pool_sort_locked(&rt->pool);
}

/* One supervision pass: reap, restart, health-check what is due. */
void rt__sup_pass(rt_router *rt, bool force_health)
{
    double t = rt__now_s();
    pthread_mutex_lock(&rt->pool.mu);
    rt__demand_pass_locked(rt, t);
    pthread_mutex_unlock(&rt->pool.mu);
    for (int i = 0;; i++) {
        rt_worker *w = &rt->pool.w[i];
        pthread_mutex_lock(&rt->pool.mu);
        if (i >= rt->pool.n_slots) { /* a reload may add slots */
            pthread_mutex_unlock(&rt->pool.mu);
            break;
        }
        if (w->gone) {
            pthread_mutex_unlock(&rt->pool.mu);
            continue;
        }
        if (w->drain != RT_DRAIN_NONE) {
            sup_drain_locked(rt, i, t);
            pthread_mutex_unlock(&rt->pool.mu);
            continue;
        }
        if (w->cfg.managed && w->pid > 0) {
            int status;
            pid_t r = waitpid(w->pid, &status, WNOHANG);
            if (r == w->pid) {
                SW_WARN("router", "worker %s: pid %d exited (%s %d); restart in %.2f s",
                        w->cfg.name, (int)w->pid, WIFEXITED(status) ? "status" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), w->backoff);
                w->pid = 0;
                w->state = WS_DOWN;
                w->restart_requested = false;
                w->last_exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                w->next_start = t + w->backoff;
                snprintf(w->down_reason, sizeof w->down_reason, "exited (%s %d); restart after "
                         "%.2f s", WIFEXITED(status) ? "status" : "signal",
                         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), w->backoff);
                w->backoff = w->backoff * 2 > 10 ? 10 : w->backoff * 2;
                w->restarts++;
                rn_pool_drop(w->address); /* no connection outlives its process */
                if (w->cfg.on_demand && !w->ready_once) {
                    /* a start that failed (no room on the device?): it is
                     * tried again, after the back-off, for the next request
                     * that waits, once room was made (router_demand.c) */
                    w->state = WS_STOPPED;
                    w->on_device = false;
                    w->kv_budget = -1;
                }
            }
        }
        if (w->cfg.managed && w->pid > 0 && w->restart_requested && w->state != WS_DOWN) {
            SW_WARN("router", "worker %s: restarting after an unexpected out-of-memory",
                    w->cfg.name);
            kill(w->pid, SIGTERM);
            w->state = WS_DOWN;
            rn_pool_drop(w->address);
        }
        if (w->cfg.managed && w->pid > 0 && !w->restart_requested && w->state != WS_DOWN) {
            /* A process that stopped answering (hung, stopped, deadlocked)
             * is killed; the reaping above restarts it. */
            double limit = w->ready_once ? rt->cfg->hang_timeout_ms / 1000.0
                                         : (double)rt->cfg->ready_timeout_s;
            if (t - w->last_ok > limit) {
                SW_WARN("router", "worker %s: no healthy answer for %.1f s; killing pid %d",
                        w->cfg.name, t - w->last_ok, (int)w->pid);
                kill(w->pid, SIGKILL);
                w->state = WS_DOWN;
                rn_pool_drop(w->address);
            }
        }
        bool spawn = w->cfg.managed && w->pid == 0 && !rt->stop && t >= w->next_start &&
                     w->state != WS_STOPPED;
        if (spawn && rt->sabotage.no_restart && w->restarts > 0)
            spawn = false; /* SABOTAGE no-restart: a failed worker stays down */
        bool due = w->pid > 0 || !w->cfg.managed;
        due = due && (force_health || w->state != WS_READY || w->health_now ||
                      t - w->last_health >= rt->cfg->health_interval_ms / 1000.0);
        due = due && !w->restart_requested && !(w->state == WS_DOWN && w->cfg.managed);
        if (spawn)
            sup_spawn(rt, w);
        pthread_mutex_unlock(&rt->pool.mu);
        if (!spawn && due)
            sup_health(rt, w);
    }
}

/* Ledger retention (docs/router.md, The ledger): deletes finished rows
 * older than ledger-retention-s. Runs here, between supervision passes,
 * every quarter of the retention (at least 1 s, at most 10 min): each
 * sweep is one short transaction. */
static void sup_ledger_sweep(rt_router *rt, double *last)
{
    if (!rt->ledger)
        return;
    double retention = rt->cfg->ledger_retention_s, t = rt__now_s();
    double every = retention / 4;
    every = every < 1 ? 1 : every > 600 ? 600 : every;
    if (*last > 0 && t - *last < every)
        return;
    *last = t;
    ldg_sweep_counts c;
    sw_error err;
    int rc = ldg_retention_sweep(rt->ledger, rt__wall_s(), retention, &c, &err);
    if (rc) {
        if (rc != SW_EUNAVAILABLE || rt__ledger_warn_due(rt))
            SW_WARN("router", "ledger retention sweep: %s", err.message);
        return;
    }
    pthread_mutex_lock(&rt->mu);
    rt->ledger_swept += (uint64_t)c.jobs + (uint64_t)c.attempts + (uint64_t)c.tool_calls +
                          (uint64_t)c.keys + (uint64_t)c.responses;
    pthread_mutex_unlock(&rt->mu);
    if (c.jobs || c.attempts || c.tool_calls || c.keys || c.responses)
        SW_INFO("router",
                "ledger retention: deleted %d job(s), %d attempt(s), %d tool step(s), "
                "%d expired key(s), %d stored response(s)",
                c.jobs, c.attempts, c.tool_calls, c.keys, c.responses);
}

void *rt__sup_thread(void *arg)
{
    rt_router *rt = arg;
    double last_sweep = 0;
    while (!rt->stop) {
        rt__sup_pass(rt, false);
        rn_pool_sweep(); /* idle worker connections past RN_POOL_IDLE_MS */
        sup_ledger_sweep(rt, &last_sweep);
        usleep(50 * 1000);
    }
    /* Workers this thread restarted die with it (PR_SET_PDEATHSIG is per
     * thread): stop them all here, gracefully, before it ends. Idle
     * connections to them are closed first. */
    rn_pool_close_all();
    rt__stop_workers(rt);
    return NULL;
}

/* A stopped worker's pid cleared under the pool's lock: /health reads it
 * from the connection threads, which may still be serving. */
static void worker_gone(rt_router *rt, int i)
{
    pthread_mutex_lock(&rt->pool.mu);
    rt->pool.w[i].pid = 0;
    pthread_mutex_unlock(&rt->pool.mu);
}

void rt__stop_workers(rt_router *rt)
{
    pthread_mutex_lock(&rt->pool.mu);
    int n = rt->pool.n_slots; /* a reload on a connection thread may still add one */
    pthread_mutex_unlock(&rt->pool.mu);
    for (int i = 0; i < n; i++)
        if (rt->pool.w[i].pid > 0)
            kill(rt->pool.w[i].pid, SIGTERM);
    double t = rt__now_s();
    for (int i = 0; i < n; i++) {
        while (rt->pool.w[i].pid > 0) {
            int st;
            if (waitpid(rt->pool.w[i].pid, &st, WNOHANG) == rt->pool.w[i].pid) {
                worker_gone(rt, i);
                break;
            }
            if (rt__now_s() - t > 10) {
                kill(rt->pool.w[i].pid, SIGKILL);
                waitpid(rt->pool.w[i].pid, &st, 0);
                worker_gone(rt, i);
                break;
            }
            usleep(20000);
        }
    }
}

