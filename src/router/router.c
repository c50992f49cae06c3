/* router.c - `spillway serve`: supervision, admission, routing, failover.
 *
 * Threads: the main thread accepts client connections (TCP or a unix
 * socket) and starts one thread per connection (capped); the supervisor
 * thread spawns managed workers, reaps and restarts them with back-off and
 * polls every worker's /health. One mutex guards the worker table, the
 * metrics and the event ring. A request's thread predicts its need, picks
 * the first eligible worker in preference order and relays; on `oom` or
 * `worker_crash` it replays (or resumes a stream) on the next eligible
 * worker, per DESIGN.md's replay table.
 */
#include "router/router.h"
#include "router/router_net.h"

#include "common/alloc.h"
#include "common/log.h"
#include "engine/chat_template.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
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

enum { WS_STARTING, WS_READY, WS_DOWN, WS_SUSPECT };
static const char *ws_name(int s)
{
    static const char *n[] = {"starting", "ready", "down", "suspect"};
    return n[s];
}

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
    bool restart_requested;
    int restarts;
    int last_exit;              /* exit status of the last exit, -1 none */
    /* from /health */
    bool on_device;
    int64_t mem_total, mem_used, mem_reserved, mem_free;
    int64_t kv_bpt;
    int32_t ctx_limit;
    double prefill_rate, decode_rate;
    /* metrics */
    uint64_t req_ok, req_client_error, req_failed, tokens;
} rt_worker;

#define RT_EVENTS 128

static struct {
    const rt_config *cfg;
    pthread_mutex_t mu;
    rt_worker w[RT_MAX_WORKERS];
    int order[RT_MAX_WORKERS];  /* preference order */
    int n;
    eng_tokenizer *tok;
    eng_chat_family family;
    volatile sig_atomic_t stop;
    int active_conns;
    uint64_t seq;
    char *events[RT_EVENTS];
    int n_events, next_event;
    uint64_t failovers_oom, failovers_crash, rejected_capacity, rejected_auth, rejected_bad;
    uint64_t requests_total;
    int queued;                 /* requests waiting for a worker now */
    uint64_t lat_buckets[12], ttft_buckets[12];
    uint64_t lat_count, ttft_count;
    double lat_sum, ttft_sum;
} g;

/* Histogram bucket bounds (seconds) for latency and time to first token;
 * the last bucket is +Inf. */
static const double hist_le[11] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};

static void hist_add(uint64_t *buckets, uint64_t *count, double *sum, double v)
{
    int i = 0;
    while (i < 11 && v > hist_le[i])
        i++;
    buckets[i]++;
    (*count)++;
    *sum += v;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- supervisor ------------------------------------------------------- */

static void sup_spawn(rt_worker *w)
{
    const rt_worker_config *c = &w->cfg;
    const rt_config *cfg = g.cfg;
    char a[16][160];
    const char *argv[40];
    int n = 0;
    argv[n++] = "spillway";
    argv[n++] = "worker";
    argv[n++] = "--model";
    argv[n++] = cfg->model_path;
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
    if (c->threads)
        ARG("--threads", "%d", c->threads);
    if (cfg->chat_template[0])
        ARG("--chat-template", "%s", cfg->chat_template);
#undef ARG
    argv[n] = NULL;
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
        execve("/proc/self/exe", (char *const *)argv, (char *const *)envp);
        _exit(127);
    }
    sw_free(envp);
    if (pid < 0) {
        SW_ERROR("router", "worker %s: fork failed: %s", c->name, strerror(errno));
        w->next_start = now_s() + 1;
        return;
    }
    w->pid = pid;
    w->state = WS_STARTING;
    w->started_at = now_s();
    SW_INFO("router", "worker %s: started pid %d (%s), log %s", c->name, (int)pid,
            c->device[0] ? c->device : "cpu", w->log_path);
}

static void sup_health(rt_worker *w)
{
    char *body = NULL;
    int st = rn_get(w->address, "/health", 2000, &body);
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    sw_free(body);
    pthread_mutex_lock(&g.mu);
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
        w->kv_bpt = json_integer_value(json_object_get(j, "kv_bytes_per_token"));
        w->ctx_limit = (int32_t)json_integer_value(json_object_get(j, "ctx_limit"));
        w->prefill_rate = json_number_value(json_object_get(j, "prefill_tokens_per_second"));
        w->decode_rate = json_number_value(json_object_get(j, "decode_tokens_per_second"));
        if (w->state != WS_READY)
            SW_INFO("router", "worker %s: ready", w->cfg.name);
        if (!w->restart_requested)
            w->state = WS_READY;
        w->backoff = 0.25;
    } else if (w->state == WS_READY || w->state == WS_SUSPECT) {
        /* answers, but not ready (draining, failed) or does not answer */
        w->state = w->cfg.managed && w->pid > 0 ? WS_STARTING : WS_DOWN;
    } else if (!w->cfg.managed) {
        w->state = WS_DOWN;
    }
    w->last_health = now_s();
    pthread_mutex_unlock(&g.mu);
    json_decref(j);
}

/* One supervision pass: reap, restart, health-check what is due. */
static void sup_pass(bool force_health)
{
    double t = now_s();
    for (int i = 0; i < g.n; i++) {
        rt_worker *w = &g.w[i];
        pthread_mutex_lock(&g.mu);
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
                w->backoff = w->backoff * 2 > 10 ? 10 : w->backoff * 2;
                w->restarts++;
            }
        }
        if (w->cfg.managed && w->pid > 0 && w->restart_requested && w->state != WS_DOWN) {
            SW_WARN("router", "worker %s: restarting after an unexpected out-of-memory",
                    w->cfg.name);
            kill(w->pid, SIGTERM);
            w->state = WS_DOWN;
        }
        bool spawn = w->cfg.managed && w->pid == 0 && !g.stop && t >= w->next_start;
        bool due = w->pid > 0 || !w->cfg.managed;
        due = due && (force_health || w->state != WS_READY ||
                      t - w->last_health >= g.cfg->health_interval_ms / 1000.0);
        due = due && !w->restart_requested && !(w->state == WS_DOWN && w->cfg.managed);
        if (spawn)
            sup_spawn(w);
        pthread_mutex_unlock(&g.mu);
        if (!spawn && due)
            sup_health(w);
    }
}

static void stop_workers(void);

static void *sup_thread(void *arg)
{
    while (!g.stop) {
        sup_pass(false);
        usleep(50 * 1000);
    }
    /* Workers this thread restarted die with it (PR_SET_PDEATHSIG is per
     * thread): stop them all here, gracefully, before it ends. */
    stop_workers();
    return NULL;
}

/* ---- events and metrics ---------------------------------------------- */

static void ev_record(json_t *ev)
{
    char *line = json_dumps(ev, JSON_COMPACT);
    if (!line)
        return;
    char path[700];
    snprintf(path, sizeof path, "%s/events.jsonl", g.cfg->state_dir);
    pthread_mutex_lock(&g.mu);
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%s\n", line);
        fclose(f);
    }
    char *copy = sw_strdup(line);
    if (copy) {
        sw_free(g.events[g.next_event]);
        g.events[g.next_event] = copy;
        g.next_event = (g.next_event + 1) % RT_EVENTS;
        if (g.n_events < RT_EVENTS)
            g.n_events++;
    }
    pthread_mutex_unlock(&g.mu);
    free(line);
}

/* ---- downstream responses --------------------------------------------- */

typedef struct rt_req {
    int fd;
    char method[16];
    char path[256];
    char request_id[80];
    char auth[256];
    long long deadline_ms;   /* -1 none */
    char *body;
    size_t body_len;
    char worker[64];
    int attempts;
} rt_req;

static void send_response(rt_req *q, int status, const char *ctype, const char *extra,
                          const char *body, size_t len)
{
    const char *reason = status == 200 ? "OK" : status == 400 ? "Bad Request"
                       : status == 401 ? "Unauthorized" : status == 404 ? "Not Found"
                       : status == 405 ? "Method Not Allowed" : status == 413 ? "Payload Too Large"
                       : status == 503 ? "Service Unavailable" : status >= 500 ? "Server Error" : "Error";
    char head[1536];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\nX-Request-Id: %s\r\n%s%s%s",
                     status, reason, ctype, len, q->request_id, q->worker[0] ? "X-Spillway-Worker: " : "",
                     q->worker[0] ? q->worker : "", q->worker[0] ? "\r\n" : "");
    if (q->attempts > 0 && n > 0 && (size_t)n < sizeof head)
        n += snprintf(head + n, sizeof head - (size_t)n, "X-Spillway-Attempts: %d\r\n", q->attempts);
    if (n > 0 && (size_t)n < sizeof head)
        n += snprintf(head + n, sizeof head - (size_t)n, "%s\r\n", extra ? extra : "");
    if (n > 0 && (size_t)n < sizeof head && rn_write_all(q->fd, head, (size_t)n) == 0 && len)
        rn_write_all(q->fd, body, len);
}

static json_t *error_obj(int status, const char *code, const char *msg, const char *param)
{
    return json_pack("{s:{s:s, s:s, s:s, s:s?}}", "error", "message", msg, "type",
                     status < 500 ? "invalid_request_error" : "server_error", "code", code,
                     "param", param);
}

static void send_error(rt_req *q, int status, const char *code, const char *msg,
                       const char *param, const char *extra)
{
    json_t *e = error_obj(status, code, msg, param);
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    if (s) {
        send_response(q, status, "application/json", extra, s, strlen(s));
        free(s);
    }
}

/* ---- admission --------------------------------------------------------- */

/* Exact prompt tokens as the worker will count them, or -1 when the body
 * cannot be tokenized here (the worker then validates and answers). */
static long count_prompt(json_t *body, bool chat)
{
    int32_t *ids = NULL;
    size_t n = 0;
    long result = -1;
    if (!chat) {
        json_t *p = json_object_get(body, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1)
            p = json_array_get(p, 0);
        if (!json_is_string(p))
            return -1;
        if (eng_tokenize(g.tok, json_string_value(p), json_string_length(p),
                         eng_tokenizer_add_bos(g.tok), false, &ids, &n, NULL) == 0)
            result = (long)n;
        sw_free(ids);
        return result;
    }
    json_t *msgs = json_object_get(body, "messages");
    size_t nm = json_array_size(msgs);
    if (!json_is_array(msgs) || nm == 0 || nm > 100000)
        return -1;
    eng_chat_message *m = sw_calloc(nm, sizeof *m);
    if (!m)
        return -1;
    for (size_t i = 0; i < nm; i++) {
        json_t *e = json_array_get(msgs, i);
        json_t *content = json_object_get(e, "content");
        m[i].role = json_string_value(json_object_get(e, "role"));
        m[i].content = json_is_null(content) ? "" : json_string_value(content);
        if (!m[i].role || !m[i].content)
            goto done;
    }
    char *text = NULL;
    size_t len = 0, nseg = 0;
    eng_chat_segment *segs = NULL;
    if (eng_chat_render_segments(g.family, m, nm, true, &text, &len, &segs, &nseg, NULL) == 0) {
        if (eng_chat_tokenize(g.tok, text, len, segs, nseg,
                              eng_chat_tokenize_add_bos(g.family, eng_tokenizer_add_bos(g.tok)),
                              &ids, &n, NULL) == 0)
            result = (long)n;
        sw_free(ids);
        sw_free(text);
        sw_free(segs);
    }
done:
    sw_free(m);
    return result;
}

enum { SKIP_NONE = 0, SKIP_CTX = 1, SKIP_MEM = 2, SKIP_DEADLINE = 4, SKIP_DOWN = 8 };

/* The first worker in preference order, not yet tried, that is ready,
 * fits the need and is predicted to meet the deadline. */
static int pick_worker(const bool *tried, long prompt, long max_tokens, long long deadline_ms,
                       int *skipped, double *best_pred_ms)
{
    int found = -1;
    *skipped = 0;
    *best_pred_ms = -1;
    pthread_mutex_lock(&g.mu);
    for (int k = 0; k < g.n && found < 0; k++) {
        int i = g.order[k];
        rt_worker *w = &g.w[i];
        if (tried[i])
            continue;
        if (w->state != WS_READY) {
            *skipped |= SKIP_DOWN;
            continue;
        }
        long total = prompt < 0 ? 0 : prompt;
        if (w->ctx_limit > 0 && prompt >= w->ctx_limit) {
            *skipped |= SKIP_CTX;
            continue;
        }
        long gen = max_tokens;
        if (w->ctx_limit > 0 && (gen < 0 || total + gen > w->ctx_limit))
            gen = w->ctx_limit - total;
        if (gen < 0)
            gen = 0;
        if (w->on_device && w->kv_bpt > 0 && prompt >= 0) {
            double need = (double)(total + gen) * (double)w->kv_bpt;
            if (need > (double)w->mem_free) {
                *skipped |= SKIP_MEM;
                continue;
            }
        }
        if (deadline_ms >= 0 && w->prefill_rate > 0 && w->decode_rate > 0) {
            double pred = ((double)total / w->prefill_rate + (double)gen / w->decode_rate) * 1000;
            if (*best_pred_ms < 0 || pred < *best_pred_ms)
                *best_pred_ms = pred;
            if (pred > (double)deadline_ms) {
                *skipped |= SKIP_DEADLINE;
                continue;
            }
        }
        found = i;
    }
    pthread_mutex_unlock(&g.mu);
    return found;
}

/* ---- dispatch, relay, failover ---------------------------------------- */

/* Cap on one SSE event from a worker (a token's chunk with logprobs is a
 * few KiB at most). */
#define RT_MAX_EVENT_BYTES ((size_t)4 << 20)

typedef enum { FAIL_NONE, FAIL_OOM, FAIL_CRASH, FAIL_BUSY, FAIL_CLIENT_GONE } fail_kind;

typedef struct relay {
    rt_req *q;
    bool chat, stream;
    bool headers_sent, role_sent, finished;
    int32_t *tokens;
    size_t n_tokens, cap_tokens;
    long long draws;     /* -1 unknown */
    char phase[32];
    char final_worker[64]; /* where the last attempt ran */
    bool client_gone;
    size_t resume_base;    /* tokens sent before this attempt (a resume) */
    double t_start;        /* monotonic, when the request was read */
    double ttft;           /* seconds to the first token sent, -1 before */
    int status;            /* HTTP status relayed to the client */
} relay;

static int client_chunk(relay *r, const char *data, size_t len)
{
    char hex[32];
    int n = snprintf(hex, sizeof hex, "%zx\r\n", len);
    if (rn_write_all(r->q->fd, hex, (size_t)n) || rn_write_all(r->q->fd, data, len) ||
        rn_write_all(r->q->fd, "\r\n", 2))
        return -1;
    return 0;
}

static int client_event(relay *r, const char *payload)
{
    if (!r->headers_sent) {
        char head[600];
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                         "Connection: close\r\nX-Request-Id: %s\r\nX-Spillway-Worker: %s\r\n"
                         "X-Spillway-Attempts: %d\r\n\r\n",
                         r->q->request_id, r->q->worker, r->q->attempts);
        if (rn_write_all(r->q->fd, head, (size_t)n))
            return -1;
        r->headers_sent = true;
        r->status = 200;
    }
    size_t len = strlen(payload);
    char *ev = sw_malloc(len + 9);
    if (!ev)
        return -1;
    memcpy(ev, "data: ", 6);
    memcpy(ev + 6, payload, len);
    memcpy(ev + 6 + len, "\n\n", 2);
    int rc = client_chunk(r, ev, len + 8);
    sw_free(ev);
    return rc;
}

/* Classifies a worker's error object: oom, busy (admission refusals that
 * another worker may not have) or a crash-like server failure. */
static fail_kind classify_error(json_t *err, relay *r)
{
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *phase = json_string_value(json_object_get(err, "phase"));
    if (code && !strcmp(code, "out_of_memory")) {
        snprintf(r->phase, sizeof r->phase, "%s", phase ? phase : "unknown");
        return FAIL_OOM;
    }
    if (code && (!strcmp(code, "capacity_exceeded") || !strcmp(code, "not_ready") ||
                 !strcmp(code, "draining"))) {
        snprintf(r->phase, sizeof r->phase, "admission");
        return FAIL_BUSY;
    }
    snprintf(r->phase, sizeof r->phase, "generation");
    return FAIL_CRASH;
}

/* Relays one SSE payload; returns FAIL_NONE to go on, or how it ended. */
static fail_kind stream_payload(relay *r, const char *payload, bool *done)
{
    if (!strcmp(payload, "[DONE]")) {
        *done = true;
        if (client_event(r, "[DONE]") || client_chunk(r, "", 0))
            return FAIL_CLIENT_GONE;
        r->finished = true;
        return FAIL_NONE;
    }
    json_t *j = json_loads(payload, 0, NULL);
    if (!j)
        return FAIL_CRASH;
    fail_kind fk = FAIL_NONE;
    json_t *err = json_object_get(j, "error");
    if (err) {
        fk = classify_error(err, r);
        if (fk == FAIL_BUSY)
            fk = FAIL_CRASH;
        json_decref(j);
        *done = true;
        return fk;
    }
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    json_t *delta = json_object_get(choice, "delta");
    if (r->chat && json_object_get(delta, "role")) {
        if (r->role_sent) {
            json_decref(j);
            return FAIL_NONE;
        }
        r->role_sent = true;
    }
    json_t *sp = json_object_get(j, "spillway");
    json_t *usage = json_object_get(j, "usage");
    char *rewritten = NULL;
    if (json_is_object(usage) && r->resume_base > 0) {
        /* a resumed worker counts only its new tokens */
        json_int_t base = (json_int_t)r->resume_base;
        json_object_set_new(usage, "completion_tokens",
                            json_integer(json_integer_value(json_object_get(usage, "completion_tokens")) + base));
        json_object_set_new(usage, "total_tokens",
                            json_integer(json_integer_value(json_object_get(usage, "total_tokens")) + base));
        rewritten = json_dumps(j, JSON_COMPACT);
    }
    int sent = client_event(r, rewritten ? rewritten : payload);
    free(rewritten);
    if (sent) {
        json_decref(j);
        return FAIL_CLIENT_GONE;
    }
    json_t *ids = json_object_get(sp, "token_ids");
    if (r->ttft < 0 && json_array_size(ids) > 0)
        r->ttft = now_s() - r->t_start;
    for (size_t i = 0; i < json_array_size(ids); i++) {
        if (r->n_tokens == r->cap_tokens) {
            size_t nc = r->cap_tokens ? r->cap_tokens * 2 : 256;
            int32_t *nt = sw_realloc(r->tokens, nc * sizeof *nt);
            if (!nt)
                break;
            r->tokens = nt;
            r->cap_tokens = nc;
        }
        r->tokens[r->n_tokens++] = (int32_t)json_integer_value(json_array_get(ids, i));
    }
    if (json_is_integer(json_object_get(sp, "draws")))
        r->draws = json_integer_value(json_object_get(sp, "draws"));
    json_decref(j);
    return FAIL_NONE;
}

/* One attempt on worker w. Fills *resp_status for a response relayed
 * as is (4xx, success). */
static fail_kind attempt(relay *r, rt_worker *w, const char *body, size_t body_len)
{
    rn_conn c;
    char hdr[256];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", r->q->request_id);
    const char *path = r->chat ? "/v1/chat/completions" : "/v1/completions";
    int rc = rn_request(&c, w->address, "POST", path, hdr, body, body_len, r->q->fd,
                        g.cfg->http_timeout_s * 1000);
    fail_kind fk = FAIL_NONE;
    snprintf(r->phase, sizeof r->phase, "connect");
    if (rc == -2) {
        fk = FAIL_CLIENT_GONE;
        goto out;
    }
    if (rc != 0) {
        if (rc == -3)
            snprintf(r->phase, sizeof r->phase, "before_response");
        fk = FAIL_CRASH;
        goto out;
    }
    if (c.status != 200 || !r->stream) {
        char *resp = NULL;
        size_t len = 0;
        int br = rn_body_all(&c, &resp, &len, (size_t)256 << 20);
        if (br == -2) {
            fk = FAIL_CLIENT_GONE;
            goto out;
        }
        if (br != 0) {
            snprintf(r->phase, sizeof r->phase, "generation");
            fk = FAIL_CRASH;
            goto out;
        }
        if (c.status >= 500) {
            json_t *j = json_loads(resp, 0, NULL);
            fk = classify_error(json_object_get(j, "error"), r);
            json_decref(j);
            sw_free(resp);
            goto out;
        }
        if (r->headers_sent) {
            /* a resumed stream refused with a 4xx: the client already has
             * a stream, so the error ends it as an event (never retried) */
            json_t *j = json_loads(resp, 0, NULL);
            char *e = j && json_object_get(j, "error") ? json_dumps(j, JSON_COMPACT) : NULL;
            json_decref(j);
            if (!e) {
                json_t *eo = error_obj(500, "worker_failed", "the worker refused the resume", NULL);
                e = json_dumps(eo, JSON_COMPACT);
                json_decref(eo);
            }
            if (e && (client_event(r, e) || client_event(r, "[DONE]") || client_chunk(r, "", 0)))
                fk = FAIL_CLIENT_GONE;
            free(e);
            sw_free(resp);
            pthread_mutex_lock(&g.mu);
            w->req_client_error++;
            pthread_mutex_unlock(&g.mu);
            goto out;
        }
        /* success or a client error: relayed as is, never retried */
        json_t *j = json_loads(resp, 0, NULL);
        long long toks = json_integer_value(
            json_object_get(json_object_get(j, "usage"), "completion_tokens"));
        json_decref(j);
        pthread_mutex_lock(&g.mu);
        if (c.status == 200) {
            w->req_ok++;
            w->tokens += (uint64_t)toks;
        } else {
            w->req_client_error++;
        }
        pthread_mutex_unlock(&g.mu);
        r->n_tokens = (size_t)toks;
        r->status = c.status;
        send_response(r->q, c.status, c.content_type[0] ? c.content_type : "application/json",
                      NULL, resp, len);
        sw_free(resp);
        r->finished = true;
        goto out;
    }
    /* SSE: split the de-chunked body into events */
    char *acc = NULL;
    size_t acc_len = 0, acc_cap = 0;
    bool done = false;
    char buf[8192];
    while (!done) {
        long n = rn_body(&c, buf, sizeof buf);
        if (n == -2) {
            fk = FAIL_CLIENT_GONE;
            break;
        }
        if (n <= 0) {
            snprintf(r->phase, sizeof r->phase, "generation");
            fk = FAIL_CRASH; /* the stream ended without [DONE] */
            break;
        }
        if (acc_len + (size_t)n > RT_MAX_EVENT_BYTES) {
            /* no event is that long: a broken worker */
            snprintf(r->phase, sizeof r->phase, "generation");
            fk = FAIL_CRASH;
            break;
        }
        if (acc_len + (size_t)n + 1 > acc_cap) {
            size_t nc = (acc_len + (size_t)n + 1) * 2;
            char *na = sw_realloc(acc, nc);
            if (!na) {
                fk = FAIL_CRASH;
                break;
            }
            acc = na;
            acc_cap = nc;
        }
        memcpy(acc + acc_len, buf, (size_t)n);
        acc_len += (size_t)n;
        acc[acc_len] = 0;
        char *start = acc;
        char *sep;
        while (!done && (sep = strstr(start, "\n\n"))) {
            *sep = 0;
            if (!strncmp(start, "data: ", 6)) {
                fk = stream_payload(r, start + 6, &done);
                if (fk != FAIL_NONE)
                    done = true;
            }
            start = sep + 2;
        }
        size_t rest = acc_len - (size_t)(start - acc);
        memmove(acc, start, rest);
        acc_len = rest;
    }
    sw_free(acc);
    if (r->finished) {
        pthread_mutex_lock(&g.mu);
        w->req_ok++;
        w->tokens += r->n_tokens;
        pthread_mutex_unlock(&g.mu);
    }
out:
    rn_close(&c);
    return fk;
}

/* Nesting depth of a JSON text (brackets outside strings), so a deeply
 * nested body is refused before the parser recurses into it. */
static int json_depth(const char *s, size_t n)
{
    int depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '{' || ch == '[') {
            if (++depth > max)
                max = depth;
        } else if (ch == '}' || ch == ']') {
            depth--;
        }
    }
    return max;
}

#define RT_MAX_JSON_DEPTH 32

static void handle_generate(rt_req *q, bool chat)
{
    if (json_depth(q->body, q->body_len) > RT_MAX_JSON_DEPTH) {
        pthread_mutex_lock(&g.mu);
        g.rejected_bad++;
        pthread_mutex_unlock(&g.mu);
        send_error(q, 400, "invalid_request", "the body is nested too deeply (at most 32 levels)",
                   NULL, NULL);
        return;
    }
    json_error_t jerr;
    json_t *body = json_loadb(q->body, q->body_len, JSON_REJECT_DUPLICATES, &jerr);
    relay r;
    memset(&r, 0, sizeof r);
    r.q = q;
    r.chat = chat;
    r.draws = -1;
    r.t_start = now_s();
    r.ttft = -1;
    json_t *first_error = NULL;
    double t0 = wall_s(), replay_start = 0;
    if (!body || !json_is_object(body)) {
        pthread_mutex_lock(&g.mu);
        g.rejected_bad++;
        pthread_mutex_unlock(&g.mu);
        send_error(q, 400, body ? "invalid_request" : "invalid_json",
                   body ? "the body must be a JSON object" : jerr.text, NULL, NULL);
        json_decref(body);
        return;
    }
    r.stream = json_is_true(json_object_get(body, "stream"));
    json_t *mt = json_object_get(body, "max_completion_tokens");
    if (!mt)
        mt = json_object_get(body, "max_tokens");
    long max_tokens = json_is_integer(mt) ? (long)json_integer_value(mt) : (chat ? -1 : 16);
    if (q->deadline_ms < 0 && json_is_number(json_object_get(body, "timeout")))
        q->deadline_ms = (long long)(json_number_value(json_object_get(body, "timeout")) * 1000);
    /* A seed of our own, so that a resumed sampled stream continues the
     * same random stream on the next worker. */
    if (!json_object_get(body, "seed")) {
        pthread_mutex_lock(&g.mu);
        uint64_t s = (uint64_t)(wall_s() * 1e6) ^ (++g.seq * 0x9E3779B97F4A7C15ull);
        pthread_mutex_unlock(&g.mu);
        json_object_set_new(body, "seed", json_integer((json_int_t)(s & 0x7fffffff)));
    }
    long prompt = count_prompt(body, chat);
    bool tried[RT_MAX_WORKERS] = {false};
    fail_kind last = FAIL_NONE;
    const char *decision = "none";
    char first_worker[64] = "";
    for (;;) {
        int skipped;
        double pred;
        long remaining = max_tokens < 0 ? -1 : max_tokens - (long)r.n_tokens;
        int wi = pick_worker(tried, prompt + (long)r.n_tokens, remaining,
                             q->attempts == 0 ? q->deadline_ms : -1, &skipped, &pred);
        if (wi < 0 && q->attempts < g.cfg->max_attempts && (skipped & (SKIP_DOWN | SKIP_MEM)) &&
            !(skipped & SKIP_DEADLINE) && !r.client_gone) {
            /* Wait in the bounded queue while a worker starts or frees
             * memory, as long as the deadline and the queue time-out allow. */
            double limit = g.cfg->queue_timeout_ms / 1000.0;
            if (q->deadline_ms >= 0 && q->deadline_ms / 1000.0 < limit)
                limit = q->deadline_ms / 1000.0;
            pthread_mutex_lock(&g.mu);
            bool room = g.queued < g.cfg->queue_size;
            if (room)
                g.queued++;
            pthread_mutex_unlock(&g.mu);
            double qt0 = now_s();
            if (room)
                SW_INFO("router", "request %s: no worker eligible now, waits up to %.1f s",
                        q->request_id, limit);
            while (room && wi < 0 && now_s() - qt0 < limit && !g.stop) {
                struct pollfd p = {q->fd, POLLRDHUP, 0};
                if (poll(&p, 1, 50) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                    r.client_gone = true;
                    break;
                }
                wi = pick_worker(tried, prompt + (long)r.n_tokens, remaining,
                                 q->attempts == 0 ? q->deadline_ms : -1, &skipped, &pred);
            }
            if (room) {
                pthread_mutex_lock(&g.mu);
                g.queued--;
                pthread_mutex_unlock(&g.mu);
            }
            if (r.client_gone) {
                last = FAIL_CLIENT_GONE;
                break;
            }
        }
        if (wi < 0 || q->attempts >= g.cfg->max_attempts) {
            if (r.headers_sent) {
                json_t *e = error_obj(500, "worker_failed",
                                      "the request failed on every eligible worker", NULL);
                char *s = json_dumps(e, JSON_COMPACT);
                json_decref(e);
                if (s)
                    client_event(&r, s);
                free(s);
                client_event(&r, "[DONE]");
                client_chunk(&r, "", 0);
            } else if (q->attempts == 0 && (skipped & SKIP_DEADLINE)) {
                char msg[256];
                snprintf(msg, sizeof msg,
                         "no worker can finish within the deadline of %lld ms (best prediction %.0f ms)",
                         q->deadline_ms, pred);
                send_error(q, 503, "capacity_exceeded", msg, NULL, "Retry-After: 1\r\n");
            } else if (q->attempts == 0 && skipped == SKIP_CTX) {
                send_error(q, 400, "context_length_exceeded",
                           "the prompt is longer than every worker's context limit", "messages",
                           NULL);
            } else if (last == FAIL_NONE || last == FAIL_BUSY) {
                send_error(q, 503, "capacity_exceeded",
                           "no worker has the capacity for this request now", NULL,
                           "Retry-After: 1\r\n");
            } else {
                send_error(q, 503, "worker_failed",
                           last == FAIL_OOM ? "out of memory on every eligible worker"
                                            : "the request failed on every eligible worker",
                           NULL, "Retry-After: 1\r\n");
            }
            if (q->attempts == 0) {
                pthread_mutex_lock(&g.mu);
                g.rejected_capacity++;
                pthread_mutex_unlock(&g.mu);
            }
            break;
        }
        rt_worker *w = &g.w[wi];
        tried[wi] = true;
        q->attempts++;
        if (!r.headers_sent)
            snprintf(q->worker, sizeof q->worker, "%s", w->cfg.name);
        snprintf(r.final_worker, sizeof r.final_worker, "%s", w->cfg.name);
        if (first_error && !replay_start)
            replay_start = wall_s();
        /* The body of this attempt: resume after the tokens sent. */
        json_t *b = json_deep_copy(body);
        if (r.stream && r.n_tokens > 0) {
            json_t *toks = json_array();
            for (size_t i = 0; i < r.n_tokens; i++)
                json_array_append_new(toks, json_integer(r.tokens[i]));
            json_t *res = json_pack("{s:o}", "tokens", toks);
            if (r.draws >= 0)
                json_object_set_new(res, "draws", json_integer(r.draws));
            json_object_set_new(b, "resume", res);
            json_object_del(b, "max_completion_tokens");
            if (max_tokens >= 0)
                json_object_set_new(b, "max_tokens", json_integer(remaining < 0 ? 0 : remaining));
        }
        char *bs = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        if (!bs) {
            send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
            break;
        }
        r.resume_base = r.stream ? r.n_tokens : 0;
        last = attempt(&r, w, bs, strlen(bs));
        free(bs);
        if (last == FAIL_NONE || last == FAIL_CLIENT_GONE)
            break;
        if (last == FAIL_BUSY)
            continue;
        /* oom or crash: out of rotation until the supervisor says ready */
        pthread_mutex_lock(&g.mu);
        w->req_failed++;
        if (last == FAIL_OOM) {
            g.failovers_oom++;
            if (strcmp(r.phase, "admission") && w->cfg.managed)
                w->restart_requested = true; /* poisoned: restart */
            if (strcmp(r.phase, "admission"))
                w->state = WS_SUSPECT;
        } else {
            g.failovers_crash++;
            w->state = WS_SUSPECT;
        }
        pthread_mutex_unlock(&g.mu);
        SW_WARN("router", "request %s: %s on worker %s (phase %s, %zu tokens sent); %s",
                q->request_id, last == FAIL_OOM ? "oom" : "worker_crash", w->cfg.name, r.phase,
                r.n_tokens, r.n_tokens ? "resuming" : "replaying");
        if (!first_error) {
            snprintf(first_worker, sizeof first_worker, "%s", w->cfg.name);
            first_error = json_pack("{s:s, s:s, s:s, s:f}", "worker", w->cfg.name, "kind",
                                    last == FAIL_OOM ? "oom" : "worker_crash", "phase", r.phase,
                                    "time", wall_s());
            decision = r.stream && r.n_tokens > 0 ? "resume" : "replay";
        }
    }
    if (first_error) {
        const char *reason =
            !strcmp(decision, "resume")
                ? "stream with tokens already sent: resumed with the sent tokens and sampler draws"
                : r.stream ? "stream with nothing sent yet: replayed from the start"
                           : "non-streaming request, no tool executed: replayed from the start";
        json_t *ev = json_pack(
            "{s:s, s:f, s:o, s:s, s:s, s:s?, s:f, s:f, s:I, s:i, s:s, s:b, s:b}", "request_id",
            q->request_id, "received_time", t0, "first_error", first_error, "decision", decision,
            "reason", reason, "replay_worker", r.finished ? r.final_worker : NULL, "cpu_start_time",
            replay_start, "completion_time", wall_s(), "tokens", (json_int_t)r.n_tokens,
            "attempts", q->attempts, "outcome",
            r.finished ? "completed" : last == FAIL_CLIENT_GONE ? "cancelled" : "failed",
            "client_connected", last != FAIL_CLIENT_GONE, "stream", r.stream);
        if (ev)
            ev_record(ev);
        json_decref(ev);
    }
    if (r.finished && r.status == 200) {
        pthread_mutex_lock(&g.mu);
        hist_add(g.lat_buckets, &g.lat_count, &g.lat_sum, now_s() - r.t_start);
        if (r.ttft >= 0)
            hist_add(g.ttft_buckets, &g.ttft_count, &g.ttft_sum, r.ttft);
        pthread_mutex_unlock(&g.mu);
    }
    sw_free(r.tokens);
    json_decref(body);
}

/* ---- small routes ----------------------------------------------------- */

static void handle_health(rt_req *q)
{
    json_t *ws = json_array();
    int ready = 0;
    pthread_mutex_lock(&g.mu);
    for (int k = 0; k < g.n; k++) {
        rt_worker *w = &g.w[g.order[k]];
        ready += w->state == WS_READY;
        json_array_append_new(
            ws, json_pack("{s:s, s:s, s:s, s:b, s:i, s:i, s:I, s:I, s:I, s:I, s:f, s:f, s:i}",
                          "name", w->cfg.name, "state", ws_name(w->state), "device",
                          w->cfg.device[0] ? w->cfg.device : "cpu", "managed", w->cfg.managed,
                          "pid", (int)w->pid, "restarts", w->restarts, "memory_total_bytes",
                          (json_int_t)w->mem_total, "memory_free_bytes", (json_int_t)w->mem_free,
                          "kv_bytes_per_token", (json_int_t)w->kv_bpt, "memory_used_bytes",
                          (json_int_t)w->mem_used, "prefill_tokens_per_second", w->prefill_rate,
                          "decode_tokens_per_second", w->decode_rate, "ctx_limit", w->ctx_limit));
    }
    pthread_mutex_unlock(&g.mu);
    json_t *h = json_pack("{s:s, s:o}", "status", ready ? "ready" : "unavailable", "workers", ws);
    char *s = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    if (s)
        send_response(q, ready ? 200 : 503, "application/json", NULL, s, strlen(s));
    free(s);
}

static void handle_events(rt_req *q)
{
    json_t *arr = json_array();
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < g.n_events; i++) {
        int idx = (g.next_event - g.n_events + i + RT_EVENTS) % RT_EVENTS;
        json_t *e = json_loads(g.events[idx], 0, NULL);
        if (e)
            json_array_append_new(arr, e);
    }
    pthread_mutex_unlock(&g.mu);
    json_t *o = json_pack("{s:s, s:o}", "object", "list", "data", arr);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s)
        send_response(q, 200, "application/json", NULL, s, strlen(s));
    free(s);
}

static void handle_metrics(rt_req *q)
{
    size_t cap = 65536, n = 0;
    char *b = sw_malloc(cap);
    if (!b)
        return;
#define OUT(...) \
    do { \
        int k_ = snprintf(b + n, cap - n, __VA_ARGS__); \
        if (k_ > 0 && (size_t)k_ < cap - n) n += (size_t)k_; \
    } while (0)
    pthread_mutex_lock(&g.mu);
    OUT("# TYPE spillway_router_requests_total counter\n");
    for (int i = 0; i < g.n; i++) {
        rt_worker *w = &g.w[i];
        OUT("spillway_router_requests_total{worker=\"%s\",outcome=\"ok\"} %llu\n", w->cfg.name,
            (unsigned long long)w->req_ok);
        OUT("spillway_router_requests_total{worker=\"%s\",outcome=\"client_error\"} %llu\n",
            w->cfg.name, (unsigned long long)w->req_client_error);
        OUT("spillway_router_requests_total{worker=\"%s\",outcome=\"failed\"} %llu\n",
            w->cfg.name, (unsigned long long)w->req_failed);
    }
    OUT("spillway_router_requests_total{worker=\"none\",outcome=\"capacity_exceeded\"} %llu\n",
        (unsigned long long)g.rejected_capacity);
    OUT("spillway_router_requests_total{worker=\"none\",outcome=\"unauthorized\"} %llu\n",
        (unsigned long long)g.rejected_auth);
    OUT("spillway_router_requests_total{worker=\"none\",outcome=\"bad_request\"} %llu\n",
        (unsigned long long)g.rejected_bad);
    OUT("# TYPE spillway_router_failovers_total counter\n");
    OUT("spillway_router_failovers_total{reason=\"oom\"} %llu\n",
        (unsigned long long)g.failovers_oom);
    OUT("spillway_router_failovers_total{reason=\"worker_crash\"} %llu\n",
        (unsigned long long)g.failovers_crash);
    OUT("# TYPE spillway_router_worker_up gauge\n");
    for (int i = 0; i < g.n; i++)
        OUT("spillway_router_worker_up{worker=\"%s\"} %d\n", g.w[i].cfg.name,
            g.w[i].state == WS_READY);
    OUT("# TYPE spillway_router_worker_restarts_total counter\n");
    for (int i = 0; i < g.n; i++)
        OUT("spillway_router_worker_restarts_total{worker=\"%s\"} %d\n", g.w[i].cfg.name,
            g.w[i].restarts);
    OUT("# TYPE spillway_router_device_memory_bytes gauge\n");
    for (int i = 0; i < g.n; i++) {
        OUT("spillway_router_device_memory_bytes{worker=\"%s\",kind=\"total\"} %lld\n",
            g.w[i].cfg.name, (long long)g.w[i].mem_total);
        OUT("spillway_router_device_memory_bytes{worker=\"%s\",kind=\"used\"} %lld\n",
            g.w[i].cfg.name, (long long)g.w[i].mem_used);
        OUT("spillway_router_device_memory_bytes{worker=\"%s\",kind=\"reserved\"} %lld\n",
            g.w[i].cfg.name, (long long)g.w[i].mem_reserved);
    }
    OUT("# TYPE spillway_router_generated_tokens_total counter\n");
    for (int i = 0; i < g.n; i++)
        OUT("spillway_router_generated_tokens_total{worker=\"%s\"} %llu\n", g.w[i].cfg.name,
            (unsigned long long)g.w[i].tokens);
    OUT("# TYPE spillway_router_connections gauge\nspillway_router_connections %d\n",
        g.active_conns);
    OUT("# TYPE spillway_router_queue_depth gauge\nspillway_router_queue_depth %d\n", g.queued);
    for (int h = 0; h < 2; h++) {
        const char *name = h ? "spillway_router_time_to_first_token_seconds"
                             : "spillway_router_request_duration_seconds";
        const uint64_t *hb = h ? g.ttft_buckets : g.lat_buckets;
        uint64_t cum = 0;
        OUT("# TYPE %s histogram\n", name);
        for (int i = 0; i < 12; i++) {
            cum += hb[i];
            if (i < 11)
                OUT("%s_bucket{le=\"%g\"} %llu\n", name, hist_le[i], (unsigned long long)cum);
            else
                OUT("%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
        }
        OUT("%s_sum %.6f\n%s_count %llu\n", name, h ? g.ttft_sum : g.lat_sum, name,
            (unsigned long long)(h ? g.ttft_count : g.lat_count));
    }
    pthread_mutex_unlock(&g.mu);
#undef OUT
    send_response(q, 200, "text/plain; version=0.0.4", NULL, b, n);
    sw_free(b);
}

static void handle_models(rt_req *q)
{
    for (int k = 0; k < g.n; k++) {
        rt_worker *w = &g.w[g.order[k]];
        pthread_mutex_lock(&g.mu);
        bool ready = w->state == WS_READY;
        pthread_mutex_unlock(&g.mu);
        if (!ready)
            continue;
        char *body = NULL;
        if (rn_get(w->address, "/v1/models", 5000, &body) == 200 && body) {
            send_response(q, 200, "application/json", NULL, body, strlen(body));
            sw_free(body);
            return;
        }
        sw_free(body);
    }
    send_error(q, 503, "capacity_exceeded", "no worker is ready", NULL, "Retry-After: 1\r\n");
}

/* ---- connections ------------------------------------------------------ */

static bool auth_ok(const rt_req *q)
{
    if (g.cfg->n_keys == 0)
        return true;
    if (strncasecmp(q->auth, "Bearer ", 7))
        return false;
    const char *k = q->auth + 7;
    for (int i = 0; i < g.cfg->n_keys; i++) {
        const char *want = g.cfg->api_keys[i];
        size_t a = strlen(k), b = strlen(want);
        unsigned diff = (unsigned)(a ^ b);
        for (size_t j = 0; j < b; j++)
            diff |= (unsigned char)want[j] ^ (unsigned char)(j < a ? k[j] : 0);
        if (!diff)
            return true;
    }
    return false;
}

static bool plain_token(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '-' || s[i] == '_' || s[i] == '.' || (s[i] >= '0' && s[i] <= '9') ||
              (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            return false;
    return true;
}

static void serve_conn(int fd)
{
    rt_req q;
    memset(&q, 0, sizeof q);
    q.fd = fd;
    q.deadline_ms = -1;
    struct timeval tv = {g.cfg->http_timeout_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    enum { HEAD_MAX = 16384 };
    double t_read = now_s();
    char *head = sw_malloc(HEAD_MAX + 1);
    size_t hl = 0;
    char *end = NULL;
    if (!head)
        return;
    while (!end) {
        if (hl == HEAD_MAX) {
            snprintf(q.request_id, sizeof q.request_id, "-");
            send_error(&q, 400, "invalid_request", "header block too large", NULL, NULL);
            goto done;
        }
        if (now_s() - t_read > g.cfg->http_timeout_s)
            goto done; /* a client that trickles its request is dropped */
        ssize_t r = recv(fd, head + hl, HEAD_MAX - hl, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            goto done;
        hl += (size_t)r;
        head[hl] = 0;
        end = strstr(head, "\r\n\r\n");
    }
    size_t head_len = (size_t)(end - head) + 4;
    *end = 0;
    char version[16] = "";
    if (sscanf(head, "%15s %255s %15s", q.method, q.path, version) != 3 ||
        strncmp(version, "HTTP/1.", 7)) {
        snprintf(q.request_id, sizeof q.request_id, "-");
        send_error(&q, 400, "invalid_request", "malformed request line", NULL, NULL);
        goto done;
    }
    long long content_length = 0;
    bool chunked = false;
    char rid[256] = "";
    for (char *line = strstr(head, "\r\n"); line; line = strstr(line, "\r\n")) {
        line += 2;
        char *colon = strchr(line, ':');
        char *eol = strstr(line, "\r\n");
        if (!colon || (eol && colon > eol))
            continue;
        size_t nl = (size_t)(colon - line);
        char *v = colon + 1;
        while (*v == ' ')
            v++;
        size_t vl = eol ? (size_t)(eol - v) : strlen(v);
        char val[256];
        snprintf(val, sizeof val, "%.*s", (int)(vl < 255 ? vl : 255), v);
        if (nl == 14 && !strncasecmp(line, "Content-Length", 14))
            content_length = strtoll(val, NULL, 10);
        else if (nl == 17 && !strncasecmp(line, "Transfer-Encoding", 17))
            chunked = true;
        else if (nl == 13 && !strncasecmp(line, "Authorization", 13))
            snprintf(q.auth, sizeof q.auth, "%s", val);
        else if (nl == 12 && !strncasecmp(line, "X-Request-Id", 12))
            snprintf(rid, sizeof rid, "%s", val);
        else if (nl == 22 && !strncasecmp(line, "X-Spillway-Deadline-Ms", 22))
            q.deadline_ms = strtoll(val, NULL, 10);
    }
    if (plain_token(rid)) {
        snprintf(q.request_id, sizeof q.request_id, "%s", rid);
    } else {
        pthread_mutex_lock(&g.mu);
        uint64_t s = ++g.seq;
        pthread_mutex_unlock(&g.mu);
        snprintf(q.request_id, sizeof q.request_id, "req-%d-%llu-%llx", (int)getpid(),
                 (unsigned long long)s, (unsigned long long)(wall_s() * 1000) & 0xffffff);
    }
    if (strcmp(q.path, "/health") && !auth_ok(&q)) {
        pthread_mutex_lock(&g.mu);
        g.rejected_auth++;
        pthread_mutex_unlock(&g.mu);
        send_error(&q, 401, "unauthorized", "missing or wrong API key (Authorization: Bearer)",
                   NULL, "WWW-Authenticate: Bearer\r\n");
        goto done;
    }
    if (chunked) {
        send_error(&q, 411, "invalid_request", "send the body with a Content-Length", NULL, NULL);
        goto done;
    }
    if (content_length < 0 || (unsigned long long)content_length > g.cfg->max_body_bytes) {
        pthread_mutex_lock(&g.mu);
        g.rejected_bad++;
        pthread_mutex_unlock(&g.mu);
        send_error(&q, 413, "invalid_request", "request body too large", NULL, NULL);
        goto done;
    }
    q.body = sw_malloc((size_t)content_length + 1);
    if (!q.body)
        goto done;
    size_t have = hl - head_len;
    if (have > (size_t)content_length)
        have = (size_t)content_length;
    memcpy(q.body, head + head_len, have);
    while (have < (size_t)content_length) {
        if (now_s() - t_read > g.cfg->http_timeout_s)
            goto done;
        ssize_t r = recv(fd, q.body + have, (size_t)content_length - have, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            goto done;
        have += (size_t)r;
    }
    q.body[have] = 0;
    q.body_len = have;
    bool post = !strcmp(q.method, "POST"), get = !strcmp(q.method, "GET");
    if (!strcmp(q.path, "/v1/completions") || !strcmp(q.path, "/v1/chat/completions")) {
        if (!post)
            send_error(&q, 405, "method_not_allowed", "use POST", NULL, NULL);
        else
            handle_generate(&q, !strcmp(q.path, "/v1/chat/completions"));
    } else if (!strcmp(q.path, "/health") || !strcmp(q.path, "/v1/spillway/events") ||
               !strcmp(q.path, "/metrics") || !strcmp(q.path, "/v1/models")) {
        if (!get)
            send_error(&q, 405, "method_not_allowed", "use GET", NULL, NULL);
        else if (q.path[1] == 'h')
            handle_health(&q);
        else if (q.path[1] == 'm')
            handle_metrics(&q);
        else if (!strcmp(q.path, "/v1/models"))
            handle_models(&q);
        else
            handle_events(&q);
    } else {
        send_error(&q, 404, "not_found", "unknown path", NULL, NULL);
    }
done:
    sw_free(q.body);
    sw_free(head);
}

static void *conn_thread(void *arg)
{
    int fd = (int)(intptr_t)arg;
    serve_conn(fd);
    shutdown(fd, SHUT_WR);
    close(fd);
    pthread_mutex_lock(&g.mu);
    g.active_conns--;
    pthread_mutex_unlock(&g.mu);
    return NULL;
}

static void on_signal(int sig)
{
    (void)sig;
    g.stop = 1;
}

static int listen_on(const char *addr, char *actual, size_t cap)
{
    int fd;
    if (!strncmp(addr, "unix:", 5)) {
        struct sockaddr_un sa;
        if (strlen(addr + 5) >= sizeof sa.sun_path)
            return -1;
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, addr + 5, strlen(addr + 5) + 1);
        unlink(sa.sun_path);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 128)) {
            if (fd >= 0)
                close(fd);
            return -1;
        }
        snprintf(actual, cap, "%s", addr);
        return fd;
    }
    char host[256];
    const char *colon = strrchr(addr, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = 0;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, colon + 1, &hints, &res) || !res)
        return -1;
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 128)) {
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char h[128] = "", p[16] = "";
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(actual, cap, "%s:%s", h, p);
    return fd;
}

static int load_tokenizer(const rt_config *c)
{
    eng_gguf *gg = NULL;
    sw_error err;
    sw_error_clear(&err);
    if (eng_gguf_open(c->model_path, &gg, &err) || eng_tokenizer_load(gg, &g.tok, &err) ||
        eng_chat_choose(gg, c->chat_template[0] ? c->chat_template : NULL, &g.family, NULL,
                        &err)) {
        fprintf(stderr, "spillway serve: %s: %s\n", c->model_path,
                err.message[0] ? err.message : sw_strerror(err.code));
        eng_gguf_close(gg);
        return -1;
    }
    eng_gguf_close(gg);
    return 0;
}

static void stop_workers(void)
{
    for (int i = 0; i < g.n; i++)
        if (g.w[i].pid > 0)
            kill(g.w[i].pid, SIGTERM);
    double t = now_s();
    for (int i = 0; i < g.n; i++) {
        while (g.w[i].pid > 0) {
            int st;
            if (waitpid(g.w[i].pid, &st, WNOHANG) == g.w[i].pid) {
                g.w[i].pid = 0;
                break;
            }
            if (now_s() - t > 10) {
                kill(g.w[i].pid, SIGKILL);
                waitpid(g.w[i].pid, &st, 0);
                g.w[i].pid = 0;
                break;
            }
            usleep(20000);
        }
    }
}

int rt_serve(const rt_config *c)
{
    int status = 1, lfd = -1;
    bool sup_started = false;
    pthread_t sup;
    memset(&g, 0, sizeof g);
    g.cfg = c;
    pthread_mutex_init(&g.mu, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (mkdir(c->state_dir, 0700) && errno != EEXIST) {
        fprintf(stderr, "spillway serve: cannot create state-dir %s: %s\n", c->state_dir,
                strerror(errno));
        return 1;
    }
    if (load_tokenizer(c))
        return 1;
    g.n = c->n_workers;
    for (int i = 0; i < g.n; i++) {
        rt_worker *w = &g.w[i];
        w->cfg = c->workers[i];
        w->backoff = 0.25;
        w->last_exit = -1;
        w->state = w->cfg.managed ? WS_DOWN : WS_STARTING;
        if (w->cfg.managed) {
            snprintf(w->address, sizeof w->address, "unix:%s/%s.sock", c->state_dir, w->cfg.name);
            snprintf(w->log_path, sizeof w->log_path, "%s/%s.log", c->state_dir, w->cfg.name);
        } else {
            snprintf(w->address, sizeof w->address, "%s", w->cfg.url);
        }
        g.order[i] = i;
    }
    /* preference order, stable (file order breaks ties) */
    for (int i = 1; i < g.n; i++)
        for (int j = i; j > 0 && g.w[g.order[j]].cfg.preference < g.w[g.order[j - 1]].cfg.preference; j--) {
            int t = g.order[j];
            g.order[j] = g.order[j - 1];
            g.order[j - 1] = t;
        }
    /* start everything, wait until every worker is ready */
    double t0 = now_s();
    for (;;) {
        sup_pass(true);
        /* every managed worker, and at least one worker in all: a worker
         * given by url may come up later */
        int ready = 0, managed_waiting = 0;
        for (int i = 0; i < g.n; i++) {
            ready += g.w[i].state == WS_READY;
            managed_waiting += g.w[i].cfg.managed && g.w[i].state != WS_READY;
        }
        if (ready > 0 && managed_waiting == 0)
            break;
        for (int i = 0; i < g.n; i++)
            if (g.w[i].last_exit == 1 || g.w[i].last_exit == 2) {
                /* a start-up failure (bad model, device or options) does
                 * not get better by restarting */
                fprintf(stderr, "spillway serve: worker %s failed to start (exit status %d); see %s\n",
                        g.w[i].cfg.name, g.w[i].last_exit, g.w[i].log_path);
                goto out;
            }
        if (g.stop || now_s() - t0 > c->ready_timeout_s) {
            for (int i = 0; i < g.n; i++)
                if (g.w[i].state != WS_READY)
                    fprintf(stderr, "spillway serve: worker %s did not become ready (log: %s)\n",
                            g.w[i].cfg.name, g.w[i].log_path[0] ? g.w[i].log_path : g.w[i].address);
            goto out;
        }
        usleep(50 * 1000);
    }
    char actual[300];
    lfd = listen_on(c->listen, actual, sizeof actual);
    if (lfd < 0) {
        fprintf(stderr, "spillway serve: cannot listen on %s: %s\n", c->listen, strerror(errno));
        goto out;
    }
    if (pthread_create(&sup, NULL, sup_thread, NULL) == 0)
        sup_started = true;
    for (int k = 0; k < g.n; k++) {
        rt_worker *w = &g.w[g.order[k]];
        printf("spillway serve: worker %s on %s%s (%s)\n", w->cfg.name,
               w->cfg.device[0] ? w->cfg.device : "cpu",
               !strncmp(w->cfg.device, "sim-gpu", 7) ? " [simulated]" : "",
               w->cfg.managed ? "managed" : w->cfg.url);
    }
    printf("spillway serve: listening on %s\n", actual);
    if (strncmp(actual, "unix:", 5))
        printf("try: curl http://%s/v1/completions -H 'Content-Type: application/json'%s "
               "-d '{\"prompt\":\"Once upon a time\",\"max_tokens\":32}'\n",
               actual, c->n_keys ? " -H 'Authorization: Bearer YOUR_KEY'" : "");
    fflush(stdout);
    while (!g.stop) {
        struct pollfd p = {lfd, POLLIN, 0};
        int n = poll(&p, 1, 200);
        if (n <= 0)
            continue;
        int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (cfd < 0)
            continue;
        pthread_mutex_lock(&g.mu);
        bool full = g.active_conns >= c->max_connections;
        if (!full)
            g.active_conns++;
        pthread_mutex_unlock(&g.mu);
        if (full) {
            static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                                       "Content-Length: 0\r\nConnection: close\r\n\r\n";
            rn_write_all(cfd, busy, sizeof busy - 1);
            close(cfd);
            continue;
        }
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, conn_thread, (void *)(intptr_t)cfd)) {
            close(cfd);
            pthread_mutex_lock(&g.mu);
            g.active_conns--;
            pthread_mutex_unlock(&g.mu);
        }
        pthread_attr_destroy(&attr);
    }
    status = 0;
    close(lfd);
    if (!strncmp(c->listen, "unix:", 5))
        unlink(c->listen + 5);
    /* let running requests finish (bounded) */
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&g.mu);
        int a = g.active_conns;
        pthread_mutex_unlock(&g.mu);
        if (!a)
            break;
        usleep(50 * 1000);
    }
out:
    g.stop = 1;
    if (sup_started)
        pthread_join(sup, NULL);
    else
        stop_workers();
    eng_tokenizer_free(g.tok);
    for (int i = 0; i < RT_EVENTS; i++)
        sw_free(g.events[i]);
    return status;
}
