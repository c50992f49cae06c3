/* router.c - `spillway serve`: start-up and shutdown, plus the router
 * itself (the one rt_router, handed to every part) and the failover
 * event log (router-impl.h lists the other parts).
 *
 * Threads: the connection threads accept client connections (TCP or a
 * unix socket) for themselves and serve each to its end
 * (router_conns.c); the supervisor thread spawns managed workers, reaps
 * and restarts them with back-off and polls every worker's /health into
 * the pool; the job runners run jobs; the main thread waits for
 * SIGTERM/SIGINT. A request's thread admits it through the queue (the
 * router's books), relays it, and on `oom` or `worker_crash` replays it
 * (or resumes a stream) on the next eligible worker, per DESIGN.md's
 * replay table (router_failover.c).
 */
#include "router/router-impl.h"
#include "router/router_net.h"
#include "router/router_tls.h"

#include "common/alloc.h"
#include "common/log.h"
#include "gguf/gguf.h"
#include "api/api.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The router. Only rt_serve (which hands &rt__g to every part) and the
 * signal handler name it: the handler only sets its stop (a lock-free
 * atomic_int, async-signal-safe), which every part polls as rt->stop. */
static rt_router rt__g;

double rt__now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double rt__wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void rt__ev_record(rt_router *rt, json_t *ev)
{
    /* every record names its kind; a failover record is the one built
     * without a type (router_relay.c, router_agent.c) */
    const char *type = json_string_value(json_object_get(ev, "type"));
    if (!type) {
        json_object_set_new(ev, "type", json_string("failover"));
        type = json_string_value(json_object_get(ev, "type"));
        if (!type)
            return;
    }
    char *line = sw_json_dumps(ev, JSON_COMPACT);
    if (!line)
        return;
    char path[700];
    snprintf(path, sizeof path, "%s/events.jsonl", rt->cfg->state_dir);
    pthread_mutex_lock(&rt->mu);
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%s\n", line);
        fclose(f);
    }
    char *copy = sw_strdup(line);
    if (copy) {
        sw_free(rt->events[rt->next_event]);
        rt->events[rt->next_event] = copy;
        snprintf(rt->events_type[rt->next_event], sizeof rt->events_type[0], "%s", type);
        rt->next_event = (rt->next_event + 1) % RT_EVENTS;
        if (rt->n_events < RT_EVENTS)
            rt->n_events++;
        rt->events_total++;
        pthread_cond_broadcast(&rt->events_cond); /* the event streams */
    }
    pthread_mutex_unlock(&rt->mu);
    free(line);
}

void rt__read_switches(rt_router *rt)
{
    const char *sab = getenv("SPILLWAY_SABOTAGE");
    if (sab && *sab) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", sab);
        for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
            if (!strcmp(t, "no-replay"))
                rt->sabotage.no_replay = true;
            else if (!strcmp(t, "no-resume"))
                rt->sabotage.no_resume = true;
            else if (!strcmp(t, "no-tool-ledger"))
                rt->sabotage.no_tool_ledger = true;
            else if (!strcmp(t, "no-restart"))
                rt->sabotage.no_restart = true;
            else if (!strcmp(t, "no-deadline"))
                rt->sabotage.no_deadline = true;
            else
                fprintf(stderr, "spillway serve: SPILLWAY_SABOTAGE: unknown switch '%s' ignored\n", t);
        }
        fprintf(stderr,
                "spillway serve: WARNING: SPILLWAY_SABOTAGE=%s is set: safety features are OFF on "
                "purpose (a drill self-check). Never run like this in production.\n",
                sab);
        SW_WARN("router", "SPILLWAY_SABOTAGE=%s: safety features disabled on purpose", sab);
    }
    /* The router's own faults; the rest of SPILLWAY_FAULT is for devices,
     * and the managed workers get theirs from the configuration, so the
     * variable is not passed on. */
    const char *fault = getenv("SPILLWAY_FAULT");
    if (fault && *fault) {
        if (strstr(fault, "router_exit_after_tool_started"))
            rt->fault_exit_after_tool_started = true;
        if (strstr(fault, "router_exit_after_tool_called"))
            rt->fault_exit_after_tool_called = true;
        if (rt->fault_exit_after_tool_started || rt->fault_exit_after_tool_called) {
            SW_WARN("router", "SPILLWAY_FAULT=%s: the router will exit on purpose", fault);
            unsetenv("SPILLWAY_FAULT");
        }
    }
}

void rt__fault_scope_begin(rt_req *q, const char *value)
{
    long fail_at;
    if (q->fault_scoped || !sw_alloc_fault_header_enabled())
        return;
    if (!sw_alloc_scope_parse(value, &fail_at)) {
        SW_WARN("router", "X-Spillway-Fault: '%.80s' ignored (alloc_fail_after:N)", value);
        return;
    }
    sw_alloc_scope_init(&q->fault_scope, fail_at);
    q->fault_prev = sw_alloc_scope_swap(&q->fault_scope);
    q->fault_scoped = true;
}

void rt__fault_scope_end(rt_req *q)
{
    if (!q->fault_scoped)
        return;
    sw_alloc_scope_swap(q->fault_prev);
    sw_alloc_scope_publish(&q->fault_scope);
    q->fault_scoped = false;
}

static void on_signal(int sig)
{
    if (sig == SIGHUP)
        rt__g.reload_signal = 1; /* the main thread reloads */
    else if (atomic_exchange(&rt__g.drain_armed, 0))
        rt__g.drain_signal = 1; /* the main thread drains, then stops */
    else
        rt__g.stop = 1;
}


/* Every model's tokenizer and chat family, for counting prompts; the id
 * of a [model] section without a name from the file, as its workers take
 * it (api_model_id). */
static int load_models(rt_router *rt, const rt_config *c)
{
    rt->route_by_model = !c->legacy_model;
    rt->default_model = 0;
    for (int i = 0; i < c->n_models; i++) {
        rt_model *m = &rt->models[i];
        m->cfg = c->models[i];
        if (m->cfg.is_default)
            rt->default_model = i;
        eng_gguf *gg = NULL;
        sw_error err;
        sw_error_clear(&err);
        if (eng_gguf_open(m->cfg.path, &gg, &err) || eng_tokenizer_load(gg, &m->tok, &err) ||
            eng_chat_choose(gg, m->cfg.chat_template[0] ? m->cfg.chat_template : NULL,
                            &m->family, NULL, &err)) {
            fprintf(stderr, "spillway serve: %s: %s\n", m->cfg.path,
                    err.message[0] ? err.message : sw_strerror(err.code));
            eng_gguf_close(gg);
            return -1;
        }
        if (!m->cfg.name[0])
            api_model_id(gg, m->cfg.path, m->cfg.name, sizeof m->cfg.name);
        /* the books of its llama-server workers (router_books.c): a file
         * whose cache cannot be read is still served, by slots only */
        m->cache_error[0] = 0;
        m->weights_bytes = 0;
        for (int64_t t = 0; t < eng_gguf_n_tensors(gg); t++)
            m->weights_bytes += eng_gguf_tensor_at(gg, t)->size_bytes;
        if (eng_gguf_cache_shape_read(gg, &m->cache, &err)) {
            snprintf(m->cache_error, sizeof m->cache_error, "%s", err.message);
            SW_WARN("router", "model %s: its KV memory cannot be counted: %s", m->cfg.name,
                    err.message);
        } else if (!eng_gguf_cache_countable(&m->cache)) {
            SW_INFO("router", "model %s: %s; a llama-server worker of it is admitted by its "
                    "slots", m->cfg.name, m->cache.reason);
        }
        eng_gguf_close(gg);
        rt->n_models = i + 1;
    }
    return 0;
}

static void free_models(rt_router *rt)
{
    for (int i = 0; i < rt->n_models; i++) {
        eng_tokenizer_free(rt->models[i].tok);
        rt->models[i].tok = NULL;
    }
    rt->n_models = 0;
}

int rt__upstreams_register(const rt_config *c, sw_error *err)
{
    for (int i = 0; i < c->n_workers; i++) {
        const rt_worker_config *w = &c->workers[i];
        if (w->managed || (strncmp(w->url, "https://", 8) && !w->api_key_env[0]))
            continue;
        const char *key = "";
        if (w->api_key_env[0]) {
            /* read once, here: the key lives on in router_tls's table only */
            key = getenv(w->api_key_env);
            if (!key || !key[0])
                return sw_error_set(err, SW_EINVAL,
                                    "[worker %s]: api-key-env = %s, but %s is not set (or "
                                    "empty) in the router's environment",
                                    w->name, w->api_key_env, w->api_key_env);
        }
        int rc = rn_upstream_add(w->url, w->name, w->ca_file, key, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* Takes the state directory for this router: an exclusive flock on
 * <state-dir>/lock, held until rt_serve returns or the process ends
 * (O_CLOEXEC keeps it out of the workers, so a worker that outlives
 * its router does not hold it). Two routers on one directory would share
 * the worker sockets, the ledger and the event log: the second would take
 * the first one's workers. The file holds the holder's pid, for the
 * message; it stays behind (a stale file locks nothing). The descriptor, -2 when another process holds the lock, -1 on
 * another error (both said on stderr). */
static int state_dir_lock(const char *state_dir)
{
    char path[700];
    snprintf(path, sizeof path, "%s/lock", state_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "spillway serve: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        char holder[32] = "";
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        close(fd);
        if (e == EWOULDBLOCK) {
            fprintf(stderr,
                    "spillway serve: state-dir %s is in use by another router%s%s%s; stop it, or "
                    "give this one its own state-dir ([server] state-dir or --state-dir)\n",
                    state_dir, holder[0] ? " (pid " : "", holder, holder[0] ? ")" : "");
            return -2;
        }
        fprintf(stderr, "spillway serve: cannot lock %s: %s\n", path, strerror(e));
        return -1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n)
        SW_WARN("router", "cannot write the pid into %s: %s", path, strerror(errno));
    return fd;
}

int rt_serve(const rt_config *c)
{
    int status = 1, lfd = -1;
    bool sup_started = false;
    pthread_t sup;
    rt_router *rt = &rt__g;
    memset(rt, 0, sizeof *rt);
    rt->cfg = c;
    rt->first_cfg = c;
    pthread_mutex_init(&rt->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&rt->events_cond, &ca);
    pthread_condattr_destroy(&ca);
    rt->started_at = rt__now_s();
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* a reload (done once serving) */
    if (mkdir(c->state_dir, 0700) && errno != EEXIST) {
        fprintf(stderr, "spillway serve: cannot create state-dir %s: %s\n", c->state_dir,
                strerror(errno));
        return 1;
    }
    int lock_fd = state_dir_lock(c->state_dir);
    if (lock_fd < 0)
        return lock_fd == -2 ? 2 : 1;
    rt__read_switches(rt);
    sw_error lerr;
    sw_error_clear(&lerr);
    /* a shared ledger (PostgreSQL) or this state-dir's own (SQLite) */
    if (ldg_open(c->ledger[0] ? c->ledger : c->state_dir, &rt->ledger, &lerr)) {
        fprintf(stderr, "spillway serve: %s\n", lerr.message);
        return lerr.code == SW_EINVAL ? 2 : 1;
    }
    {
        char owner[64];
        snprintf(owner, sizeof owner, "%s", ldg_owner(rt->ledger));
        ldg_set_owner(rt->ledger, owner, c->ledger_lease_s);
    }
    int abandoned = 0;
    if (ldg_idem_recover(rt->ledger, &abandoned, &lerr) == 0 && abandoned)
        SW_WARN("router", "%d Idempotency-Key(s) were running when the router stopped; a retry "
                "with the same body runs them again under their request id", abandoned);
    if (load_models(rt, c)) {
        free_models(rt);
        ldg_close(rt->ledger);
        rt->ledger = NULL;
        return 1;
    }
    if (rt__upstreams_register(c, &lerr)) {
        /* an unset api-key-env variable, an unreadable ca-file: the
         * configuration's fault (2), unless memory ran out */
        fprintf(stderr, "spillway serve: %s\n", lerr.message);
        free_models(rt);
        ldg_close(rt->ledger);
        rt->ledger = NULL;
        return lerr.code == SW_EINVAL ? 2 : 1;
    }
    if (rt__lease_start(rt)) {
        fprintf(stderr, "spillway serve: cannot start the ledger's lease keeper\n");
        free_models(rt);
        ldg_close(rt->ledger);
        rt->ledger = NULL;
        return 1;
    }
    rt_pool_init(&rt->pool, c);
    rt_queue_init(&rt->queue, &rt->pool, c->queue_size);
    /* start everything, wait until every worker is ready */
    double t0 = rt__now_s();
    for (;;) {
        rt__sup_pass(rt, true);
        /* every managed worker, and at least one worker in all: a worker
         * given by url may come up later */
        int ready = 0, managed_waiting = 0, on_demand = 0;
        for (int i = 0; i < rt->pool.n_slots; i++) {
            const rt_worker *w = &rt->pool.w[i];
            ready += w->state == WS_READY;
            on_demand += w->cfg.on_demand;
            managed_waiting += w->cfg.managed && !w->cfg.on_demand && w->state != WS_READY;
        }
        /* workers on demand start later, for their first request */
        if ((ready > 0 || on_demand == rt->pool.n_slots) && managed_waiting == 0)
            break;
        for (int i = 0; i < rt->pool.n_slots; i++)
            if (rt->pool.w[i].start_error[0]) {
                /* a command that cannot run does not get better either */
                fprintf(stderr, "spillway serve: worker %s cannot start: %s\n",
                        rt->pool.w[i].cfg.name, rt->pool.w[i].start_error);
                goto out;
            }
        for (int i = 0; i < rt->pool.n_slots; i++)
            if (rt->pool.w[i].last_exit == 1 || rt->pool.w[i].last_exit == 2) {
                /* a start-up failure (bad model, device or options) does
                 * not get better by restarting */
                fprintf(stderr, "spillway serve: worker %s failed to start (exit status %d); see %s\n",
                        rt->pool.w[i].cfg.name, rt->pool.w[i].last_exit, rt->pool.w[i].log_path);
                goto out;
            }
        if (rt->stop || rt__now_s() - t0 > c->ready_timeout_s) {
            for (int i = 0; i < rt->pool.n_slots; i++) {
                const rt_worker *w = &rt->pool.w[i];
                if (w->state == WS_READY)
                    continue;
                if (w->log_path[0]) /* one the router ran: its log says why */
                    fprintf(stderr, "spillway serve: worker %s did not become ready (log: %s)\n",
                            w->cfg.name, w->log_path);
                else /* one at a url: what its health checks got */
                    fprintf(stderr, "spillway serve: worker %s at %s did not become ready: %s\n",
                            w->cfg.name, w->cfg.url,
                            w->down_reason[0] ? w->down_reason : "no answer yet");
            }
            goto out;
        }
        usleep(50 * 1000);
    }
    char actual[300];
    lfd = rt__listen_on(c->listen, actual, sizeof actual);
    if (lfd < 0) {
        fprintf(stderr, "spillway serve: cannot listen on %s: %s\n", c->listen, strerror(errno));
        goto out;
    }
    if (pthread_create(&sup, NULL, rt__sup_thread, rt) == 0)
        sup_started = true;
    if (rt__jobs_start(rt)) {
        fprintf(stderr, "spillway serve: cannot start the job runners\n");
        goto out;
    }
    for (int k = 0; k < rt->pool.n_live; k++) {
        rt_worker *w = &rt->pool.w[rt->pool.order[k]];
        printf("spillway serve: worker %s on %s%s (%s)\n", w->cfg.name, rt__worker_device(&w->cfg),
               !strncmp(w->cfg.device, "sim-gpu", 7) ? " [simulated]" : "",
               w->cfg.managed ? "managed" : w->cfg.url);
    }
    if (ldg_shared(rt->ledger))
        printf("spillway serve: ledger %s, shared with other routers (owner %s, lease %.0f s)\n",
               ldg_backend(rt->ledger), ldg_owner(rt->ledger), ldg_lease_s(rt->ledger));
    else
        printf("spillway serve: ledger %s in %s\n", ldg_backend(rt->ledger), c->state_dir);
    printf("spillway serve: listening on %s\n", actual);
    if (strncmp(actual, "unix:", 5))
        printf("try: curl http://%s/v1/completions -H 'Content-Type: application/json'%s "
               "-d '{\"prompt\":\"Once upon a time\",\"max_tokens\":32}'\n",
               actual, c->n_keys ? " -H 'Authorization: Bearer YOUR_KEY'" : "");
    fflush(stdout);
    /* the connection threads accept for themselves (router_conns.c) */
    if (rt__conns_start(rt, lfd)) {
        fprintf(stderr, "spillway serve: cannot start the connection threads\n");
        goto out;
    }
    /* stop-delay-ms is read at the signal (a reload may change it) */
    if (rt->cfg->stop_delay_ms > 0)
        atomic_store(&rt->drain_armed, 1);
    double stop_at = 0;
    while (!rt->stop) {
        if (atomic_exchange(&rt->drain_signal, 0)) {
            int delay_ms = rt->cfg->stop_delay_ms;
            atomic_store(&rt->draining, 1);
            stop_at = rt__now_s() + delay_ms / 1000.0;
            SW_INFO("router", "draining: /health answers 503 for %d ms, then the router stops "
                    "(a second SIGTERM stops it now)", delay_ms);
        }
        if (stop_at > 0 && rt__now_s() >= stop_at) {
            rt->stop = 1;
            break;
        }
        if (atomic_exchange(&rt->reload_signal, 0)) {
            json_t *answer = NULL;
            sw_error rerr;
            sw_error_clear(&rerr);
            if (rt__reload(rt, "SIGHUP", &answer, &rerr) == 0)
                json_decref(answer); /* logged there */
        }
        usleep(100 * 1000);
    }
    status = 0;
    pthread_mutex_lock(&rt->mu);
    int running = rt->active_conns;
    pthread_mutex_unlock(&rt->mu);
    SW_INFO("router", "stopping: no new connections; %d running", running);
    rt__events_wake(rt); /* the event streams end now */
    /* jobs do not hold the shutdown up: a running one gives its worker
     * request up now and goes back to queued (router_jobs.c) */
    rt__jobs_cancel(rt);
    rt__conns_close(rt);
    close(lfd);
    if (!strncmp(c->listen, "unix:", 5))
        unlink(c->listen + 5);
    /* let running requests finish (bounded); an event stream's connection
     * is counted in n_streams while it streams */
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&rt->mu);
        int a = rt->active_conns + rt->n_streams;
        pthread_mutex_unlock(&rt->mu);
        if (!a)
            break;
        usleep(50 * 1000);
    }
out:
    rt->stop = 1;
    /* cancelled jobs go back to queued; at most 2 s, then a runner stuck
     * in a ledger write or a tool call is left behind (jobs_left) */
    bool jobs_left = !rt__jobs_stop(rt);
    if (sup_started)
        pthread_join(sup, NULL);
    else
        rt__stop_workers(rt);
    /* Connection threads are detached and the wait above is bounded: one
     * still running may be about to store its Idempotency-Key or a tool
     * step; a job runner left behind may too. Then nothing is freed under
     * that thread: the process ends below. */
    pthread_mutex_lock(&rt->mu);
    bool threads_left = rt->active_conns > 0 || rt->n_streams > 0 || jobs_left;
    pthread_mutex_unlock(&rt->mu);
    if (threads_left) {
        /* Such a thread also reads the configuration (our caller's) and
         * the event ring: returning would free them under it. End the
         * process here instead, all threads at once; the ledger is
         * SQLite in WAL mode, for which this is the same as a SIGKILL
         * mid-write (nothing promised is lost, docs/router.md). */
        SW_WARN("router", "stopped with a request or job thread still busy; exiting now");
        fflush(NULL);
        _exit(status);
    }
    free_models(rt);
    rt__reload_free_retired(rt);
    rt__lease_stop(rt);
    ldg_close(rt->ledger);
    rt->ledger = NULL;
    for (int i = 0; i < RT_EVENTS; i++)
        sw_free(rt->events[i]);
    pthread_cond_destroy(&rt->events_cond);
    close(lock_fd);
    return status;
}

