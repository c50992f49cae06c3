/* router_jobs.c - durable jobs (docs/router.md, Jobs): POST
 * /v1/spillway/jobs stores a chat or completions request in the ledger
 * (committed before the 202 goes out) and a pool of job-workers threads
 * runs it through the same admission, routing and failover as a client
 * request (rt__generate_capture); GET /v1/spillway/jobs/{id} reports it.
 * A generation request that sent Prefer: respond-async and would get 503
 * capacity_exceeded becomes such a job too (rt__jobs_accept_async).
 *
 * Exactly once across restarts: the pool takes every queued or running
 * job from the ledger at start-up (a running one was cut by a crash and
 * runs again: a generation has no effect outside, and an agent run's tool
 * steps are protected by the tool ledger, keyed by the job id); in one
 * process an id is in the in-memory queue at most once, and a runner
 * writes a job's final record once.
 *
 * Shutdown does not wait for a generation: rt__jobs_cancel hangs up the
 * runners' cancel pipe, which every worker request made on a runner
 * thread watches as its "client" (rt__job_cancel_fd), so the relay drops
 * the worker connection (the worker stops the sequence) and the runner
 * puts its job back to queued (ldg_job_requeue; the attempt stays
 * counted). rt__jobs_stop then joins the runners for at most
 * RT_JOB_STOP_GRACE_S and leaves behind one that is stuck elsewhere (a
 * ledger write waiting for a lock, a tool call): its job is still running
 * in the ledger, which the next start takes up the same way.
 *
 * A final record that cannot be written (SQLITE_BUSY past the busy
 * time-out, an I/O error) is tried RT_JOB_FINISH_TRIES times with a
 * growing pause; if it still fails the job stays running in the ledger
 * (never reported done: GET shows it running, the metric does not count
 * it) and runs again at the next start.
 *
 * Several routers sharing a ledger (ldg_shared): a runner holds its job
 * under this router's lease (renewed by router_lease.c) and writes its
 * final record or its give-up with the fence its claim returned; a job
 * another router took over meanwhile (this one's lease ran out) refuses
 * them (SW_ECONFLICT) and the result is dropped: the job completes once,
 * by its current runner. An idle runner claims the oldest queued job, or
 * a running one whose lease ran out (its router died), every
 * RT_JOB_CLAIM_EVERY_S (ldg_job_claim), which replaces the start-up's
 * ldg_job_pending; a final record the ledger cannot take because it is
 * away is tried again until it is back, the job is taken over, or the
 * router stops.
 */
#include "router/router-impl.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define RT_MAX_QUEUED_JOBS 100000
/* Tries of a job whose every attempt met no capacity (503) before it
 * fails, when it has no deadline; with one, it is retried until then. */
#define RT_JOB_BUSY_TRIES 5
/* Writes of a job's final record before giving up on it in this process;
 * each one may already wait the ledger's busy time-out (5 s) for a lock.
 * The pause before try n + 1 is RT_JOB_FINISH_PAUSE_MS << (n - 1). */
#define RT_JOB_FINISH_TRIES 3
#define RT_JOB_FINISH_PAUSE_MS 500
/* How long rt__jobs_stop waits for the runners after the cancel. */
#define RT_JOB_STOP_GRACE_S 2.0
/* A shared ledger: an idle runner looks for a job to claim this often. */
#define RT_JOB_CLAIM_EVERY_S 1.0
/* A shared ledger that is away: the longest pause between two writes of
 * a final record. */
#define RT_JOB_FINISH_PAUSE_MAX_MS 2000

_Thread_local int rt__job_cancel_fd = -1;

typedef struct rt_jobs {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char (*queue)[48];
    size_t head, count, cap;
    pthread_t threads[64];
    bool joined[64];
    int n_threads;
    bool stop;
    /* [0]: what the runners' worker requests watch; [1]: closed by
     * rt__jobs_cancel (-1 then, or when the pipe could not be made) */
    int cancel_pipe[2];
    double cancel_at; /* rt__now_s of the cancel, 0 before */
} rt_jobs;

static rt_jobs g_jobs;

static int enqueue(const char *id)
{
    int rc = 0;
    pthread_mutex_lock(&g_jobs.mu);
    if (g_jobs.stop || g_jobs.count >= RT_MAX_QUEUED_JOBS) {
        rc = -1; /* stays queued in the ledger: taken up at the next start */
    } else {
        if (g_jobs.count == g_jobs.cap) {
            size_t nc = g_jobs.cap ? g_jobs.cap * 2 : 64;
            char(*nq)[48] = sw_malloc(nc * sizeof *nq);
            if (!nq) {
                rc = -1;
                goto out;
            }
            for (size_t i = 0; i < g_jobs.count; i++)
                memcpy(nq[i], g_jobs.queue[(g_jobs.head + i) % g_jobs.cap], 48);
            sw_free(g_jobs.queue);
            g_jobs.queue = nq;
            g_jobs.cap = nc;
            g_jobs.head = 0;
        }
        snprintf(g_jobs.queue[(g_jobs.head + g_jobs.count) % g_jobs.cap], 48, "%s", id);
        g_jobs.count++;
        pthread_cond_signal(&g_jobs.cv);
    }
out:
    pthread_mutex_unlock(&g_jobs.mu);
    return rc;
}

/* Whether the runners should give their jobs up (shutdown). */
static bool stopping(rt_router *rt)
{
    pthread_mutex_lock(&g_jobs.mu);
    bool stop = g_jobs.stop;
    pthread_mutex_unlock(&g_jobs.mu);
    return stop || rt->stop;
}

static json_t *error_json(const char *code, const char *msg)
{
    return json_pack("{s:s, s:s, s:s}", "message", msg, "type", "server_error", "code", code);
}

/* Writes the job's final record, tried RT_JOB_FINISH_TRIES times (see
 * the top of the file), or with a shared ledger that is away until it is
 * back; counted and logged as done only once written. fence: the claim's.
 * false when it was not written: the job stays running in the ledger and
 * runs again at the next start, or it was taken over by another router
 * (SW_ECONFLICT: its runner writes the record). */
static bool finish(rt_router *rt, const char *id, int64_t fence, bool ok, const char *response,
                   json_t *error)
{
    char *es = error ? sw_json_dumps(error, JSON_COMPACT) : NULL;
    sw_error err;
    sw_error_clear(&err);
    bool written = false, taken = false;
    for (int t = 1;; t++) {
        int rc = ldg_job_finish(rt->ledger, id, fence, ok ? LDG_JOB_SUCCEEDED : LDG_JOB_FAILED,
                                ok ? response : NULL, es, rt__wall_s(), &err);
        rt__ledger_seen(rt, rc);
        if (rc == 0) {
            written = true;
            break;
        }
        taken = rc == SW_ECONFLICT;
        bool away = rc == SW_EUNAVAILABLE && ldg_shared(rt->ledger) && !stopping(rt);
        if (taken || rc == SW_ENOTFOUND || (t >= RT_JOB_FINISH_TRIES && !away))
            break; /* taken over or gone (nothing to retry), or out of tries */
        int pause_ms = t <= 3 ? RT_JOB_FINISH_PAUSE_MS << (t - 1) : RT_JOB_FINISH_PAUSE_MAX_MS;
        if (pause_ms > RT_JOB_FINISH_PAUSE_MAX_MS)
            pause_ms = RT_JOB_FINISH_PAUSE_MAX_MS;
        if (t < RT_JOB_FINISH_TRIES || !away)
            SW_WARN("router", "job %s: writing its result failed (try %d of %d): %s; again in %d ms",
                    id, t, RT_JOB_FINISH_TRIES, err.message, pause_ms);
        else if (rt__ledger_warn_due(rt))
            SW_WARN("router", "job %s: writing its result failed (try %d): %s; tried again every "
                    "%d ms until the ledger is back", id, t, err.message, pause_ms);
        struct timespec pause = {pause_ms / 1000, (long)(pause_ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
    if (written) {
        pthread_mutex_lock(&rt->mu);
        if (ok)
            rt->jobs_done++;
        else
            rt->jobs_failed++;
        pthread_mutex_unlock(&rt->mu);
        SW_INFO("router", "job %s: %s", id, ok ? "succeeded" : "failed");
    } else if (taken) {
        pthread_mutex_lock(&rt->mu);
        rt->fenced_jobs++;
        pthread_mutex_unlock(&rt->mu);
        SW_WARN("router", "job %s: taken over by another router (this router's lease ran out); "
                "this run's result (%s) is dropped", id, ok ? "succeeded" : "failed");
    } else {
        SW_ERROR("router",
                 "job %s: its result (%s) could not be written to the ledger after %d tries: %s; "
                 "the job stays running there and runs again %s",
                 id, ok ? "succeeded" : "failed", RT_JOB_FINISH_TRIES, err.message,
                 ldg_shared(rt->ledger) ? "once its lease runs out" : "at the next start");
    }
    free(es);
    return written;
}

/* The runner gives the job up unfinished (shutdown): back to queued. */
static void give_up(rt_router *rt, const char *id, int64_t fence)
{
    sw_error err;
    bool requeued = false;
    int rc = ldg_job_requeue(rt->ledger, id, fence, &requeued, &err);
    if (rc == SW_ECONFLICT)
        SW_INFO("router", "job %s: cancelled by the shutdown; another router had taken it over",
                id);
    else if (rc)
        SW_WARN("router", "job %s: cancelled by the shutdown; it stays running in the ledger (%s) "
                "and runs again %s", id, err.message,
                ldg_shared(rt->ledger) ? "once its lease runs out" : "at the next start");
    else if (requeued)
        SW_INFO("router", "job %s: cancelled by the shutdown; queued again for the next start", id);
}

/* Reads a claimed job back; with a shared ledger that is away, again
 * until it is back (the job is this router's: its lease is renewed). */
static int job_read(rt_router *rt, const char *id, ldg_job *j, sw_error *err)
{
    for (;;) {
        bool found = false;
        int rc = ldg_job_get(rt->ledger, id, j, &found, err);
        if (rc == SW_OK && !found)
            rc = sw_error_set(err, SW_ENOTFOUND, "job %s is not in the ledger", id);
        if (rc != SW_EUNAVAILABLE || !ldg_shared(rt->ledger) || stopping(rt))
            return rc;
        usleep(500 * 1000);
    }
}

/* Runs job id, claimed with fence, to its final record (or gives it up
 * at shutdown). */
static void run_claimed(rt_router *rt, const char *id, int64_t fence)
{
    sw_error err;
    ldg_job j;
    if (job_read(rt, id, &j, &err)) {
        SW_ERROR("router", "job %s: cannot read it back: %s", id, err.message);
        if (stopping(rt))
            give_up(rt, id, fence);
        return;
    }
    bool chat = strcmp(j.endpoint, "completions") != 0;
    SW_INFO("router", "job %s: running (start %d)", id, j.attempts);
    uint64_t ticket = 0; /* its place in the queue, kept from one try to the next */
    for (int tries = 1;; tries++) {
        long long deadline = -1;
        if (j.deadline_ms >= 0) {
            double left = j.created + (double)j.deadline_ms / 1000.0 - rt__wall_s();
            if (left <= 0) {
                json_t *e = error_json("deadline_exceeded", "the job's deadline passed before it completed");
                finish(rt, id, fence, false, NULL, e);
                json_decref(e);
                break;
            }
            /* deadline_ms is the client's (up to INT64_MAX): a double
             * past LLONG_MAX must not be converted (undefined) */
            deadline = left * 1000 < 9e18 ? (long long)(left * 1000) : (long long)9e18;
        }
        rt_capture c;
        int attempts = 0;
        rt__generate_capture(rt, id, chat, j.request, strlen(j.request), deadline, &ticket, &c,
                             &attempts);
        json_t *resp = c.body ? sw_json_loadb(c.body, c.len, JSON_ALLOW_NUL, NULL) : NULL;
        const char *code =
            json_string_value(json_object_get(json_object_get(resp, "error"), "code"));
        bool busy = c.status == 503 && code &&
                    (!strcmp(code, "capacity_exceeded") || !strcmp(code, "worker_failed"));
        /* an agent job whose tool ledger is away: the run is tried again
         * (its recorded steps reused) until it is back, not counted */
        bool ledger_down = c.status == 503 && code && !strcmp(code, "ledger_unavailable");
        bool stop = stopping(rt);
        bool more = (busy && !stop && (j.deadline_ms >= 0 || tries < RT_JOB_BUSY_TRIES)) ||
                    (ledger_down && !stop);
        if (c.status == 200 && resp) {
            /* a whole answer, even one that arrived as the shutdown began */
            finish(rt, id, fence, true, c.body, NULL);
        } else if (stop) {
            /* cancelled (or cut short) by the shutdown: whatever it
             * answered is not the job's answer */
            give_up(rt, id, fence);
            more = false;
        } else if (!more) {
            json_t *e = json_incref(json_object_get(resp, "error"));
            if (!e)
                e = error_json("internal_error", "the job produced no readable response");
            finish(rt, id, fence, false, NULL, e);
            json_decref(e);
        }
        json_decref(resp);
        rt__capture_free(&c);
        if (!more)
            break;
        /* no capacity now: the safety route waits and tries again */
        for (int i = 0; i < 10 && !stopping(rt); i++)
            usleep(100 * 1000);
        if (stopping(rt)) {
            give_up(rt, id, fence);
            break;
        }
    }
    ldg_job_free(&j);
}

/* A job from the in-memory queue: claimed (started) first; one that is
 * finished, or run by another router, is left alone. */
static void run_job(rt_router *rt, const char *id)
{
    sw_error err;
    bool claimed = false;
    int64_t fence = 0; /* this run's claim: its final record or give-up carries it */
    int rc = ldg_job_start(rt->ledger, id, rt__wall_s(), &claimed, &fence, &err);
    rt__ledger_seen(rt, rc);
    if (rc) {
        /* still queued in the ledger: a later claim (shared) or the next
         * start runs it */
        if (rc != SW_EUNAVAILABLE || rt__ledger_warn_due(rt))
            SW_ERROR("router", "job %s: %s", id, err.message);
        return;
    }
    if (!claimed)
        return; /* finished already, or another router runs it */
    run_claimed(rt, id, fence);
}

/* A shared ledger: the oldest job no router runs, claimed and run; false
 * when there was none (or the ledger is away). */
static bool claim_and_run(rt_router *rt)
{
    char id[48];
    int64_t fence = 0;
    bool got = false;
    sw_error err;
    sw_error_clear(&err);
    int rc = ldg_job_claim(rt->ledger, rt__wall_s(), id, &fence, &got, &err);
    rt__ledger_seen(rt, rc);
    if (rc) {
        if (rc != SW_EUNAVAILABLE || rt__ledger_warn_due(rt))
            SW_WARN("router", "jobs: no claim: %s", err.message);
        return false;
    }
    if (!got)
        return false;
    pthread_mutex_lock(&rt->mu);
    rt->jobs_claimed++;
    pthread_mutex_unlock(&rt->mu);
    SW_INFO("router", "job %s: claimed from the shared ledger", id);
    run_claimed(rt, id, fence);
    return true;
}

/* arg: the rt_router */
static void *job_thread(void *arg)
{
    rt_router *rt = arg;
    /* every worker request on this thread watches the cancel pipe */
    rt__job_cancel_fd = g_jobs.cancel_pipe[0];
    bool shared = ldg_shared(rt->ledger);
    double claim_at = 0; /* rt__now_s of the next claim (shared); the first at once */
    for (;;) {
        char id[48];
        if (shared && rt__now_s() >= claim_at && !stopping(rt)) {
            if (claim_and_run(rt))
                continue; /* there may be more */
            claim_at = rt__now_s() + RT_JOB_CLAIM_EVERY_S;
        }
        pthread_mutex_lock(&g_jobs.mu);
        /* timed: a SIGTERM only sets rt->stop; no new job starts then */
        while (!g_jobs.stop && !rt->stop && g_jobs.count == 0 &&
               !(shared && rt__now_s() >= claim_at)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&g_jobs.cv, &g_jobs.mu, &ts);
        }
        if (g_jobs.stop || rt->stop) {
            pthread_mutex_unlock(&g_jobs.mu);
            return NULL;
        }
        if (g_jobs.count == 0) { /* time to claim */
            pthread_mutex_unlock(&g_jobs.mu);
            continue;
        }
        memcpy(id, g_jobs.queue[g_jobs.head], 48);
        g_jobs.head = (g_jobs.head + 1) % g_jobs.cap;
        g_jobs.count--;
        pthread_mutex_unlock(&g_jobs.mu);
        run_job(rt, id);
    }
}

int rt__jobs_start(rt_router *rt)
{
    memset(&g_jobs, 0, sizeof g_jobs);
    pthread_mutex_init(&g_jobs.mu, NULL);
    pthread_cond_init(&g_jobs.cv, NULL);
    if (pipe2(g_jobs.cancel_pipe, O_CLOEXEC)) {
        /* the jobs still run; a shutdown then waits (bounded) for them */
        SW_WARN("router", "job runners: no cancel pipe (%s): a shutdown cannot cancel a running job",
                strerror(errno));
        g_jobs.cancel_pipe[0] = g_jobs.cancel_pipe[1] = -1;
    }
    rt->jobs = &g_jobs;
    /* a shared ledger: the runners claim what is queued or abandoned, at
     * once and then every RT_JOB_CLAIM_EVERY_S while idle */
    if (!ldg_shared(rt->ledger)) {
        char(*ids)[48] = NULL;
        size_t n = 0;
        sw_error err;
        if (ldg_job_pending(rt->ledger, &ids, &n, &err)) {
            fprintf(stderr, "spillway serve: %s\n", err.message);
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            enqueue(ids[i]);
        if (n)
            SW_INFO("router", "%zu job(s) from the ledger to complete", n);
        sw_free(ids);
    }
    int want = rt->cfg->job_workers;
    for (int i = 0; i < want && i < 64; i++)
        if (pthread_create(&g_jobs.threads[g_jobs.n_threads], NULL, job_thread, rt) == 0)
            g_jobs.n_threads++;
    return g_jobs.n_threads > 0 ? 0 : -1;
}

void rt__jobs_cancel(rt_router *rt)
{
    if (!rt->jobs)
        return;
    pthread_mutex_lock(&g_jobs.mu);
    if (g_jobs.cancel_at == 0) {
        g_jobs.stop = true;
        g_jobs.cancel_at = rt__now_s();
        pthread_cond_broadcast(&g_jobs.cv);
        /* the hang-up every runner's worker request sees (POLLHUP on [0]) */
        if (g_jobs.cancel_pipe[1] >= 0) {
            close(g_jobs.cancel_pipe[1]);
            g_jobs.cancel_pipe[1] = -1;
        }
    }
    pthread_mutex_unlock(&g_jobs.mu);
}

bool rt__jobs_stop(rt_router *rt)
{
    if (!rt->jobs)
        return true;
    rt__jobs_cancel(rt);
    bool all = true;
    for (int i = 0; i < g_jobs.n_threads; i++) {
        if (g_jobs.joined[i])
            continue;
        double left = g_jobs.cancel_at + RT_JOB_STOP_GRACE_S - rt__now_s();
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (left > 0) {
            long long ns = (long long)ts.tv_nsec + (long long)(left * 1e9);
            ts.tv_sec += (time_t)(ns / 1000000000);
            ts.tv_nsec = (long)(ns % 1000000000);
        }
        if (pthread_timedjoin_np(g_jobs.threads[i], NULL, &ts) == 0) {
            g_jobs.joined[i] = true;
        } else {
            all = false;
        }
    }
    if (!all) {
        /* Stuck in a ledger write or a tool call: left to the process's
         * exit. Its job is running in the ledger (the next start takes it
         * up); the pipe's read end and the ledger stay open for it. */
        SW_WARN("router", "a job runner is still busy %.0f s after the cancel; not waiting for it "
                "(its job runs again at the next start)", RT_JOB_STOP_GRACE_S);
        return false;
    }
    /* A connection thread that outlived the bounded drain may still queue
     * a job (Prefer: respond-async) through enqueue: the mutex stays
     * valid (static storage, not destroyed) and enqueue refuses once stop
     * is set, so the queue can go. */
    pthread_mutex_lock(&g_jobs.mu);
    sw_free(g_jobs.queue);
    g_jobs.queue = NULL;
    g_jobs.head = g_jobs.count = g_jobs.cap = 0;
    if (g_jobs.cancel_pipe[0] >= 0)
        close(g_jobs.cancel_pipe[0]);
    g_jobs.cancel_pipe[0] = -1;
    pthread_mutex_unlock(&g_jobs.mu);
    rt->jobs = NULL;
    return true;
}

/* ---- the HTTP side ------------------------------------------------------ */

static void send_json(rt_req *q, int status, json_t *j, const char *extra)
{
    char *s = j ? sw_json_dumps(j, JSON_COMPACT) : NULL;
    if (s)
        rt__send_response(q, status, "application/json", extra, s, strlen(s));
    else
        rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
    free(s);
}

/* A new job's row: a random id, the endpoint, the request without its
 * stream fields (a job's answer is one JSON document), the deadline and
 * the time; j.request is NULL when memory ran out (the caller frees it). */
static void job_new(ldg_job *j, const char *endpoint, json_t *request, int64_t deadline_ms)
{
    json_object_del(request, "stream");
    json_object_del(request, "stream_options");
    memset(j, 0, sizeof *j);
    uint8_t rnd[12];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        for (size_t i = 0; i < sizeof rnd; i++)
            rnd[i] = (uint8_t)(rand() ^ (int)(rt__wall_s() * 1e6));
    }
    int n = snprintf(j->id, sizeof j->id, "job_");
    for (size_t i = 0; i < sizeof rnd; i++)
        n += snprintf(j->id + n, sizeof j->id - (size_t)n, "%02x", rnd[i]);
    snprintf(j->endpoint, sizeof j->endpoint, "%s", endpoint);
    j->request = sw_json_dumps(request, JSON_COMPACT);
    j->deadline_ms = deadline_ms;
    j->created = rt__wall_s();
}

/* Stores request (a chat or completions body) as a queued job, committed
 * in the ledger, puts it on the in-memory queue and answers q with 202:
 * the job object, Location and the extra header lines. Under an
 * Idempotency-Key (router_idem.c) the key's stored answer is that 202,
 * written in the job's own transaction and so before the client can
 * retry. Returns 0 when the 202 was sent; -1 when the job could not be
 * stored (nothing was sent; err says why). */
static int accept_job(rt_req *q, const char *endpoint, json_t *request, int64_t deadline_ms,
                      const char *extra, sw_error *err)
{
    rt_router *rt = q->rt;
    ldg_job j;
    job_new(&j, endpoint, request, deadline_ms);
    json_t *o = json_pack("{s:s, s:s, s:s, s:I}", "id", j.id, "object", "spillway.job", "state",
                          "queued", "created", (json_int_t)j.created);
    char *answer = o ? sw_json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    int rc = -1;
    if (!j.request || !answer) {
        sw_error_set(err, SW_ENOMEM, "out of memory");
    } else if (ldg_job_insert_idem(rt->ledger, &j, q->cap.on ? q->idem_key : NULL, 202,
                                   "application/json", answer, strlen(answer), err) == 0) {
        /* committed: now it may be promised */
        if (enqueue(j.id))
            SW_WARN("router", "job %s: in-memory queue full or stopping; it runs after a restart", j.id);
        char hdr[256];
        snprintf(hdr, sizeof hdr, "Location: /v1/spillway/jobs/%s\r\n%s", j.id,
                 extra ? extra : "");
        rt__send_response(q, 202, "application/json", hdr, answer, strlen(answer));
        SW_INFO("router", "job %s: queued (%s, request %s)", j.id, endpoint, q->request_id);
        rc = 0;
    }
    free(answer);
    free(j.request);
    return rc;
}

int rt__jobs_submit(rt_router *rt, const char *endpoint, json_t *request, char *id, size_t cap,
                    sw_error *err)
{
    ldg_job j;
    job_new(&j, endpoint, request, -1);
    int rc = -1;
    if (!j.request)
        sw_error_set(err, SW_ENOMEM, "out of memory");
    else if (ldg_job_insert(rt->ledger, &j, err) == 0) {
        if (enqueue(j.id))
            SW_WARN("router", "job %s: in-memory queue full or stopping; it runs after a restart",
                    j.id);
        snprintf(id, cap, "%s", j.id);
        rc = 0;
    }
    free(j.request);
    return rc;
}

static void jobs_post(rt_req *q, bool unused)
{
    (void)unused;
    json_error_t je;
    json_t *body = sw_json_loadb_big(q->body, q->body_len,
                                     JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    json_t *request = json_object_get(body, "request");
    json_t *ep = json_object_get(body, "endpoint");
    json_t *dl = json_object_get(body, "deadline_ms");
    const char *endpoint = ep ? json_string_value(ep) : "chat";
    if (!body && sw_json_error_oom(&je)) {
        rt__send_error(q, 500, "internal_error", "out of memory reading the body", NULL, NULL);
    } else if (!json_is_object(body)) {
        rt__send_error(q, 400, body ? "invalid_request" : "invalid_json",
                       body ? "the body must be a JSON object" : je.text, NULL, NULL);
    } else if (!endpoint || (strcmp(endpoint, "chat") && strcmp(endpoint, "completions"))) {
        rt__send_error(q, 400, "invalid_request", "endpoint must be \"chat\" or \"completions\"",
                       "endpoint", NULL);
    } else if (!json_is_object(request)) {
        rt__send_error(q, 400, "invalid_request", "request must be the chat or completions body",
                       "request", NULL);
    } else if (dl && !json_is_null(dl) && (!json_is_integer(dl) || json_integer_value(dl) < 1)) {
        rt__send_error(q, 400, "invalid_request", "deadline_ms must be a positive integer",
                       "deadline_ms", NULL);
    } else if (!strcmp(endpoint, "completions") && json_object_get(request, "tool_execution")) {
        rt__send_error(q, 400, "invalid_request", "tool_execution needs endpoint \"chat\"",
                       "request", NULL);
    } else {
        sw_error err;
        sw_error_clear(&err);
        if (accept_job(q, endpoint, request,
                       json_is_integer(dl) ? (int64_t)json_integer_value(dl) : -1, NULL, &err))
            rt__ledger_unavailable(q, "the job could not be stored", &err);
    }
    json_decref(body);
}

int rt__jobs_accept_async(rt_req *q, bool chat)
{
    rt_router *rt = q->rt;
    if (!rt->ledger || !rt->jobs || q->fd < 0 || q->responded)
        return -1;
    json_t *request =
        sw_json_loadb_big(q->body, q->body_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
    if (!json_is_object(request)) {
        json_decref(request);
        return -1;
    }
    /* The job runs without the client's deadline (the body's timeout is
     * one too): the client asked to wait for the result elsewhere. Its own
     * optional deadline comes from X-Spillway-Job-Deadline-Ms. */
    json_object_del(request, "timeout");
    sw_error err;
    sw_error_clear(&err);
    char worker[sizeof q->worker];
    memcpy(worker, q->worker, sizeof worker);
    q->worker[0] = 0; /* the 202 names no worker: none ran it */
    int rc = accept_job(q, chat ? "chat" : "completions", request,
                        q->job_deadline_ms > 0 ? (int64_t)q->job_deadline_ms : -1,
                        "Preference-Applied: respond-async\r\n", &err);
    json_decref(request);
    if (rc) {
        SW_ERROR("router", "request %s: cannot queue it as a job: %s", q->request_id, err.message);
        memcpy(q->worker, worker, sizeof worker);
        return -1;
    }
    pthread_mutex_lock(&rt->mu);
    rt->async_fallbacks++;
    pthread_mutex_unlock(&rt->mu);
    SW_INFO("router", "request %s: no capacity now (Prefer: respond-async): queued as a job",
            q->request_id);
    return 0;
}

static void jobs_get(rt_req *q, const char *id)
{
    rt_router *rt = q->rt;
    ldg_job j;
    bool found = false;
    sw_error err;
    if (strlen(id) < sizeof j.id && ldg_job_get(rt->ledger, id, &j, &found, &err)) {
        rt__ledger_unavailable(q, "the ledger could not be read", &err);
        return;
    }
    if (strlen(id) >= sizeof j.id || !found) {
        rt__send_error(q, 404, "not_found", "no such job", NULL, NULL);
        return;
    }
    json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:i}", "id", j.id, "object", "spillway.job",
                          "state", ldg_job_state_name(j.state), "created", (json_int_t)j.created,
                          "attempts", j.attempts);
    json_object_set_new(o, "started", j.started > 0 ? json_integer((json_int_t)j.started) : json_null());
    json_object_set_new(o, "finished",
                        j.finished > 0 ? json_integer((json_int_t)j.finished) : json_null());
    json_object_set_new(o, "endpoint", json_string(j.endpoint));
    if (j.deadline_ms >= 0)
        json_object_set_new(o, "deadline_ms", json_integer((json_int_t)j.deadline_ms));
    if (j.state == LDG_JOB_SUCCEEDED && j.response) {
        json_t *r = sw_json_loads(j.response, JSON_ALLOW_NUL, NULL);
        if (r)
            json_object_set_new(o, "response", r);
    }
    if (j.state == LDG_JOB_FAILED && j.error) {
        json_t *e = sw_json_loads(j.error, 0, NULL);
        if (e)
            json_object_set_new(o, "error", e);
    }
    send_json(q, 200, o, NULL);
    json_decref(o);
    ldg_job_free(&j);
}

void rt__handle_jobs(rt_req *q)
{
    bool post = !strcmp(q->method, "POST"), get = !strcmp(q->method, "GET");
    if (!strcmp(q->path, "/v1/spillway/jobs")) {
        if (!post)
            rt__send_error(q, 405, "method_not_allowed", "use POST", NULL, NULL);
        else
            rt__with_idempotency(q, jobs_post, false);
        return;
    }
    const char *id = q->path + strlen("/v1/spillway/jobs/");
    if (!get)
        rt__send_error(q, 405, "method_not_allowed", "use GET", NULL, NULL);
    else
        jobs_get(q, id);
}
