/* drill_scenarios.c - the seed's experiment as six scenarios, each with
 * its pass/fail checks (docs/drill.md describes them for users):
 *
 *   s1 a request too big for the GPU's free memory: `reserve` routes it to
 *      the CPU up front; under `grow` a second model takes the memory
 *      mid-generation, the GPU runs out of memory and the router replays;
 *   s2 streams: the GPU worker crashes before the first token (replayed,
 *      invisibly) and after 5 tokens (resumed: one unbroken stream);
 *   s3 the client hangs up during failover: KV memory back at baseline;
 *   s4 concurrent traffic while the GPU worker is SIGKILLed and while it
 *      runs out of memory: nothing lost, the CPU's own requests untouched,
 *      the GPU worker restarted and serving;
 *   s5 an agent run whose tool the drill serves and counts, with the GPU
 *      worker killed in the generation after the tool call (the run is
 *      replayed): the tool is called once;
 *   s6 a deadline the CPU route cannot meet: an immediate typed 503, and
 *      the same request as a durable job, completed once.
 *
 * Every failure is real: SPILLWAY_FAULT in a managed worker's
 * environment, SIGKILL, device memory taken by the drill itself, a closed
 * socket. Each scenario runs against its own router (a fault stays with a
 * worker across restarts), started from a configuration written into the
 * out directory, so a person can rerun any one by hand.
 */
#include "cli/drill_impl.h"

#include "common/alloc.h"
#include "device/device.h"
#include "router/router.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROMPT "Once upon a time"
#define TIMEOUT_MS 120000
#define BIG_TOKENS 300  /* needs more KV than the GPU keeps free */
#define FREE_TOKENS 256 /* what the second model leaves free on the GPU */

/* ---- bookkeeping ----------------------------------------------------------------- */

static const char *const g_verdict_names[DR_V_COUNT] = {
    "retry_completed_once",
    "identity_preserved",
    "no_duplicated_tool_action",
    "gpu_recovered_without_dropping_requests",
};

const char *dr_verdict_name(dr_verdict_id v)
{
    return v >= 0 && v < DR_V_COUNT ? g_verdict_names[v] : "";
}

const char *dr_state_name(dr_state s)
{
    switch (s) {
    case DR_PASSED: return "passed";
    case DR_FAILED: return "failed";
    case DR_SKIPPED: return "skipped";
    default: return "not_run";
    }
}

const char *dr_verdict_status(const drill *d, dr_verdict_id v)
{
    int seen = 0, failed = 0;
    for (int i = 0; i < DR_N_SCENARIOS; i++)
        for (int k = 0; k < d->scenarios[i].n_checks; k++)
            if (d->scenarios[i].checks[k].verdict == v) {
                seen++;
                failed += !d->scenarios[i].checks[k].passed;
            }
    return failed ? "failed" : seen ? "passed" : "not_tested";
}

bool dr_all_passed(const drill *d)
{
    for (int i = 0; i < DR_N_SCENARIOS; i++)
        if (d->scenarios[i].state == DR_FAILED)
            return false;
    for (int v = 0; v < DR_V_COUNT; v++)
        if (!strcmp(dr_verdict_status(d, (dr_verdict_id)v), "failed"))
            return false;
    return true;
}

dr_request *dr_request_new(drill *d, const char *scenario, const char *id, const char *label)
{
    pthread_mutex_lock(&d->lock);
    dr_request *r = NULL;
    if (d->n_requests < DR_MAX_REQUESTS) {
        r = &d->requests[d->n_requests++];
        memset(r, 0, sizeof *r);
        snprintf(r->scenario, sizeof r->scenario, "%s", scenario);
        snprintf(r->id, sizeof r->id, "%s", id);
        snprintf(r->label, sizeof r->label, "%s", label);
        r->ref_match = -1;
        r->ev_client_connected = -1;
    }
    pthread_mutex_unlock(&d->lock);
    return r;
}

void dr_mark_add(drill *d, const char *scenario, const char *kind, const char *fmt, ...)
{
    pthread_mutex_lock(&d->lock);
    if (d->n_marks < DR_MAX_MARKS) {
        dr_mark *m = &d->marks[d->n_marks++];
        m->time = dh_now();
        snprintf(m->scenario, sizeof m->scenario, "%s", scenario);
        snprintf(m->kind, sizeof m->kind, "%s", kind);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->label, sizeof m->label, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&d->lock);
}

void dr_progress(drill *d, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    double t = d->t_start > 0 ? dh_now() - d->t_start : 0.0;
    if (d->color)
        fprintf(stderr, "\033[2m%6.1fs\033[0m %s\n", t, line);
    else
        fprintf(stderr, "%6.1fs %s\n", t, line);
}

void dr_check_add(drill *d, dr_scenario *s, dr_verdict_id v, bool passed, const char *name,
              const char *fmt, ...)
{
    if (s->n_checks >= DR_MAX_CHECKS)
        return;
    dr_check *c = &s->checks[s->n_checks++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->passed = passed;
    c->verdict = v;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->detail, sizeof c->detail, fmt, ap);
    va_end(ap);
    if (d->color)
        fprintf(stderr, "         %s %s: %s\n", passed ? "\033[32mok  \033[0m" : "\033[31mFAIL\033[0m",
                name, c->detail);
    else
        fprintf(stderr, "         %s %s: %s\n", passed ? "ok  " : "FAIL", name, c->detail);
}

static void skip(drill *d, dr_scenario *s, const char *fmt, ...)
{
    s->state = DR_SKIPPED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->skip_reason, sizeof s->skip_reason, fmt, ap);
    va_end(ap);
    dr_progress(d, "[%s] skipped: %s", s->id, s->skip_reason);
}

static void begin(drill *d, dr_scenario *s)
{
    s->t_start = dh_now();
    snprintf(d->progress_scenario, sizeof d->progress_scenario, "%s", s->id);
    dr_progress(d, "[%s] %s", s->id, s->title);
}

static void finish(drill *d, dr_scenario *s)
{
    s->t_end = dh_now();
    if (s->state == DR_SKIPPED)
        return;
    bool ok = s->n_checks > 0;
    for (int i = 0; i < s->n_checks; i++)
        ok = ok && s->checks[i].passed;
    s->state = ok ? DR_PASSED : DR_FAILED;
    if (d->color)
        dr_progress(d, "[%s] %s", s->id, ok ? "\033[32mpassed\033[0m" : "\033[31mFAILED\033[0m");
    else
        dr_progress(d, "[%s] %s", s->id, ok ? "passed" : "FAILED");
}

void dr_scenarios_init(drill *d)
{
    static const char *const ids[DR_N_SCENARIOS] = {"s1", "s2", "s3", "s4", "s5", "s6"};
    static const char *const titles[DR_N_SCENARIOS] = {
        "a request too big for the GPU: reserve (CPU up front) and grow (OOM, replay)",
        "streaming: GPU failure before the first token and after 5 tokens (resume)",
        "the client hangs up during failover",
        "concurrent traffic while the GPU worker is killed and runs out of memory",
        "an agent run with a server-side tool, GPU worker killed after the tool call",
        "a deadline too short for the CPU route, and the same request as a job",
    };
    static const char *const props[DR_N_SCENARIOS] = {
        "admission keeps the GPU safe; an OOM mid-generation is replayed on the CPU once",
        "a failed stream is replayed (nothing sent) or resumed (k tokens sent) as one stream",
        "a client that leaves is cancelled wherever its request runs; KV memory is freed",
        "a failing GPU worker drops no unrelated request and comes back",
        "a replay never repeats a tool action",
        "degrade with a typed capacity error instead of silent waiting; a job completes once",
    };
    for (int i = 0; i < DR_N_SCENARIOS; i++) {
        dr_scenario *s = &d->scenarios[i];
        memset(s, 0, sizeof *s);
        snprintf(s->id, sizeof s->id, "%s", ids[i]);
        snprintf(s->title, sizeof s->title, "%s", titles[i]);
        snprintf(s->property, sizeof s->property, "%s", props[i]);
    }
}

/* ---- requests ---------------------------------------------------------------------- */

static void request_body(char *buf, size_t cap, int max_tokens, bool stream)
{
    snprintf(buf, cap,
             "{\"prompt\":\"" PROMPT "\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true%s}",
             max_tokens,
             stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
}

/* Counts the token chunks seen so far in a stream body. */
static int stream_token_count(const char *body)
{
    int n = 0;
    for (const char *p = body; (p = strstr(p, "\"token_ids\":[")); p += 13)
        if (p[13] != ']')
            n++;
    return n;
}

typedef bool (*hangup_fn)(void *user, dr_request *r, int tokens_seen);

typedef struct watch {
    dr_request *r;
    hangup_fn hangup;
    void *user;
} watch;

static bool on_body(void *user, const char *body, size_t len)
{
    (void)len;
    watch *w = user;
    int n = w->r->stream ? stream_token_count(body) : 0;
    if (n > 0 && !w->r->t_first_token)
        w->r->t_first_token = dh_now();
    if (w->hangup && w->hangup(w->user, w->r, n)) {
        w->r->client_cancelled = true;
        return true;
    }
    return false;
}

static void append_tokens(dr_request *r, json_t *ids)
{
    for (size_t i = 0; i < json_array_size(ids); i++)
        if (r->n_tokens < DR_MAX_TOKENS)
            r->tokens[r->n_tokens++] = (int)json_integer_value(json_array_get(ids, i));
}

static void append_text(dr_request *r, const char *t)
{
    if (!t)
        return;
    size_t have = strlen(r->text);
    snprintf(r->text + have, sizeof r->text - have, "%s", t);
}

/* Reads the answer the way a strict client does. */
static void parse_answer(dr_request *r, const dh_response *w)
{
    r->status = w->status;
    r->t_headers = w->t_headers;
    r->t_end = w->t_end;
    char buf[80];
    dh_header(w, "X-Request-Id", r->rid_out, sizeof r->rid_out);
    dh_header(w, "X-Spillway-Worker", r->worker, sizeof r->worker);
    if (dh_header(w, "X-Spillway-Attempts", buf, sizeof buf))
        r->attempts = atoi(buf);
    dh_header(w, "Retry-After", r->retry_after, sizeof r->retry_after);
    r->connection_open = !w->broken || r->client_cancelled;
    r->ids_match = true;
    if (!w->body)
        return;
    if (!r->stream || w->status != 200) {
        json_t *j = json_loads(w->body, 0, NULL);
        r->complete = w->complete && j != NULL;
        r->framing_ok = j != NULL;
        json_t *err = json_object_get(j, "error");
        if (err) {
            snprintf(r->error_code, sizeof r->error_code, "%s",
                     json_string_value(json_object_get(err, "code")) ?: "");
        } else if (j) {
            const char *id = json_string_value(json_object_get(j, "id"));
            if (!id || strcmp(id, r->id))
                r->ids_match = false;
            json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
            append_text(r, json_string_value(json_object_get(c0, "text")));
            append_text(r, json_string_value(
                               json_object_get(json_object_get(c0, "message"), "content")));
            snprintf(r->finish, sizeof r->finish, "%s",
                     json_string_value(json_object_get(c0, "finish_reason")) ?: "");
            append_tokens(r, json_object_get(json_object_get(j, "spillway"), "token_ids"));
            json_t *steps = json_object_get(json_object_get(j, "spillway"), "tool_steps");
            r->run_attempts = (int)json_integer_value(
                json_object_get(json_object_get(j, "spillway"), "run_attempts"));
            r->tool_steps = (int)json_array_size(steps);
            for (size_t i = 0; i < json_array_size(steps); i++)
                r->tool_steps_reused +=
                    json_is_true(json_object_get(json_array_get(steps, i), "reused"));
        }
        json_decref(j);
        return;
    }
    char **ev = NULL;
    bool framing = false;
    int n = dh_sse_split(w->body, w->body_len, &ev, &framing);
    r->framing_ok = framing && n >= 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(ev[i], "[DONE]")) {
            r->done_events++;
            continue;
        }
        json_t *j = json_loads(ev[i], 0, NULL);
        if (!j) {
            r->framing_ok = false;
            continue;
        }
        json_t *err = json_object_get(j, "error");
        if (err) {
            snprintf(r->error_code, sizeof r->error_code, "%s",
                     json_string_value(json_object_get(err, "code")) ?: "error");
            json_decref(j);
            continue;
        }
        const char *id = json_string_value(json_object_get(j, "id"));
        if (!id || strcmp(id, r->id))
            r->ids_match = false;
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        append_text(r, json_string_value(json_object_get(c0, "text")));
        append_text(r, json_string_value(json_object_get(json_object_get(c0, "delta"), "content")));
        const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
        if (fr)
            snprintf(r->finish, sizeof r->finish, "%s", fr);
        append_tokens(r, json_object_get(json_object_get(j, "spillway"), "token_ids"));
        json_decref(j);
    }
    dh_sse_free(ev, n > 0 ? n : 0);
    r->complete = w->complete && r->done_events == 1 && !r->error_code[0];
}

/* Sends one request as a client would and records everything it sees. */
static void send_request(drill *d, const char *address, dr_request *r, const char *path,
                         const char *body, const char *extra_headers, hangup_fn hangup,
                         void *user)
{
    (void)d;
    char headers[512];
    snprintf(headers, sizeof headers, "X-Request-Id: %s\r\n%s", r->id,
             extra_headers ? extra_headers : "");
    snprintf(r->path, sizeof r->path, "%s", path);
    r->stream = strstr(body, "\"stream\":true") != NULL;
    const char *mt = strstr(body, "\"max_tokens\":");
    r->max_tokens = mt ? atoi(mt + 13) : 0;
    watch w = {.r = r, .hangup = hangup, .user = user};
    dh_response resp;
    r->t_send = dh_now();
    dh_exchange(address, "POST", path, headers, body, TIMEOUT_MS, on_body, &w, &resp);
    if (resp.status == 0 && !resp.stopped && resp.broken &&
        (resp.t_end - r->t_send) * 1000.0 >= TIMEOUT_MS - 100)
        r->timed_out = true;
    parse_answer(r, &resp);
    if (r->t_first_token == 0 && !r->stream && r->n_tokens > 0)
        r->t_first_token = r->t_end;
    dh_response_free(&resp);
}

/* The reference: the same body, uninterrupted, straight to the CPU worker. */
static int reference(const char *cpu_sock, int max_tokens, int *tokens, int *n_out)
{
    char body[512];
    request_body(body, sizeof body, max_tokens, false);
    dh_response w;
    dh_exchange(cpu_sock, "POST", "/v1/completions", "X-Request-Id: drill-reference\r\n", body,
                TIMEOUT_MS, NULL, NULL, &w);
    int n = 0;
    json_t *j = w.status == 200 && w.body ? json_loads(w.body, 0, NULL) : NULL;
    json_t *ids = json_object_get(json_object_get(j, "spillway"), "token_ids");
    for (size_t i = 0; i < json_array_size(ids) && n < DR_MAX_TOKENS; i++)
        tokens[n++] = (int)json_integer_value(json_array_get(ids, i));
    json_decref(j);
    dh_response_free(&w);
    *n_out = n;
    return n == max_tokens ? 0 : -1;
}

static void compare_ref(drill *d, dr_request *r, const int *ref, int n_ref)
{
    /* On a real GPU the kernels differ from the CPU's, so only what ran
     * on the CPU alone is compared token for token. */
    bool comparable = d->gpu_simulated ||
                      (!r->has_event && !strcmp(r->worker, "cpu") && r->attempts == 1);
    if (!comparable || n_ref <= 0) {
        r->ref_match = -1;
        return;
    }
    r->ref_match = r->n_tokens == n_ref && !memcmp(r->tokens, ref, sizeof *ref * (size_t)n_ref);
}

/* Attaches the router's failover record to each request of a scenario. */
static void attach_events(drill *d, const char *address, const char *scenario)
{
    json_t *j = dh_get_json(address, "/v1/spillway/events", 10000, NULL);
    json_t *data = json_object_get(j, "data");
    for (int i = 0; i < d->n_requests; i++) {
        dr_request *r = &d->requests[i];
        if (strcmp(r->scenario, scenario))
            continue;
        for (size_t k = 0; k < json_array_size(data); k++) {
            json_t *e = json_array_get(data, k);
            const char *rid = json_string_value(json_object_get(e, "request_id"));
            if (!rid || strcmp(rid, r->id))
                continue;
            r->has_event = true;
            json_t *fe = json_object_get(e, "first_error");
            snprintf(r->fe_worker, sizeof r->fe_worker, "%s",
                     json_string_value(json_object_get(fe, "worker")) ?: "");
            snprintf(r->fe_kind, sizeof r->fe_kind, "%s",
                     json_string_value(json_object_get(fe, "kind")) ?: "");
            snprintf(r->fe_phase, sizeof r->fe_phase, "%s",
                     json_string_value(json_object_get(fe, "phase")) ?: "");
            r->fe_time = json_number_value(json_object_get(fe, "time"));
            r->cpu_start_time = json_number_value(json_object_get(e, "cpu_start_time"));
            r->completion_time = json_number_value(json_object_get(e, "completion_time"));
            snprintf(r->decision, sizeof r->decision, "%s",
                     json_string_value(json_object_get(e, "decision")) ?: "");
            snprintf(r->reason, sizeof r->reason, "%s",
                     json_string_value(json_object_get(e, "reason")) ?: "");
            snprintf(r->replay_worker, sizeof r->replay_worker, "%s",
                     json_string_value(json_object_get(e, "replay_worker")) ?: "");
            snprintf(r->outcome, sizeof r->outcome, "%s",
                     json_string_value(json_object_get(e, "outcome")) ?: "");
            r->ev_attempts = (int)json_integer_value(json_object_get(e, "attempts"));
            r->ev_tokens = (int)json_integer_value(json_object_get(e, "tokens"));
            json_t *cc = json_object_get(e, "client_connected");
            r->ev_client_connected = json_is_boolean(cc) ? json_is_true(cc) : -1;
        }
        if (r->has_event && !strcmp(r->outcome, "completed") && r->replay_worker[0])
            snprintf(r->final_worker, sizeof r->final_worker, "%s", r->replay_worker);
        else if (r->worker[0])
            snprintf(r->final_worker, sizeof r->final_worker, "%s", r->worker);
    }
    json_decref(j);
}

/* The router records a failover once the answer is complete, a moment
 * after the client has it: waits until at least min_matched requests of
 * the scenario have their record and the count holds still for 200 ms
 * (5 s at most). */
static void attach_events_wait(drill *d, const char *address, const char *scenario,
                               int min_matched)
{
    double t0 = dh_now();
    int last = -1;
    for (;;) {
        attach_events(d, address, scenario);
        int n = 0;
        for (int i = 0; i < d->n_requests; i++)
            n += !strcmp(d->requests[i].scenario, scenario) && d->requests[i].has_event;
        if ((n >= min_matched && n == last) || dh_now() - t0 > 5 || dr_interrupted)
            return;
        last = n;
        dh_sleep_ms(200);
    }
}

/* ---- what the workers and the router publish ----------------------------------------- */

static char *metrics_text(const char *address)
{
    dh_response w;
    dh_get(address, "/metrics", 10000, &w);
    char *t = w.status == 200 && w.body ? sw_strdup(w.body) : sw_strdup("");
    dh_response_free(&w);
    return t;
}

static double worker_ok(const char *sock)
{
    char *t = metrics_text(sock);
    double v = dh_metric(t, "spillway_worker_requests_total{outcome=\"ok\"}");
    sw_free(t);
    return v;
}

static double worker_metric(const char *sock, const char *series)
{
    char *t = metrics_text(sock);
    double v = dh_metric(t, series);
    sw_free(t);
    return v;
}

static double worker_requests_all(const char *sock)
{
    char *t = metrics_text(sock);
    double v = dh_metric_sum(t, "spillway_worker_requests_total") +
               dh_metric(t, "spillway_worker_admission_refusals_total");
    sw_free(t);
    return v;
}

static json_t *worker_health(const char *sock)
{
    return dh_get_json(sock, "/health", 5000, NULL);
}

static long long health_int(json_t *h, const char *obj, const char *key)
{
    json_t *o = obj ? json_object_get(h, obj) : h;
    return json_integer_value(json_object_get(o, key));
}

static long long kv_used(const char *sock)
{
    json_t *h = worker_health(sock);
    long long v = h ? health_int(h, "memory", "kv_used_bytes") : -1;
    json_decref(h);
    return v;
}

static json_t *router_worker(const char *address, const char *name)
{
    json_t *h = dh_get_json(address, "/health", 5000, NULL);
    json_t *ws = json_object_get(h, "workers"), *found = NULL;
    for (size_t i = 0; i < json_array_size(ws); i++) {
        const char *n = json_string_value(json_object_get(json_array_get(ws, i), "name"));
        if (n && !strcmp(n, name))
            found = json_incref(json_array_get(ws, i));
    }
    json_decref(h);
    return found;
}

/* Waits until the router reports the worker ready with >= min_restarts;
 * state_out (optional, 16 bytes) receives the last state seen. */
static bool wait_restarted(const char *address, const char *name, int min_restarts,
                           int timeout_s, int *restarts_out, char *state_out)
{
    double t0 = dh_now();
    while (dh_now() - t0 < timeout_s && !dr_interrupted) {
        json_t *w = router_worker(address, name);
        const char *st = json_string_value(json_object_get(w, "state"));
        int restarts = (int)json_integer_value(json_object_get(w, "restarts"));
        bool ok = st && !strcmp(st, "ready") && restarts >= min_restarts;
        if (state_out)
            snprintf(state_out, 16, "%s", st ? st : "?");
        json_decref(w);
        if (restarts_out)
            *restarts_out = restarts;
        if (ok)
            return true;
        dh_sleep_ms(100);
    }
    return false;
}

/* Takes GPU memory so that about `tokens` tokens of KV stay free there,
 * then waits until the router has seen it. */
static int leave_free_tokens(drill *d, dr_router *rt, const char *scenario, int tokens)
{
    json_t *h = worker_health(rt->gpu_sock);
    long long free_bytes = health_int(h, "memory", "free_bytes");
    long long kvpt = health_int(h, NULL, "kv_bytes_per_token");
    json_decref(h);
    if (kvpt <= 0 || free_bytes <= 0)
        return -1;
    long long keep = (long long)tokens * kvpt;
    char why[512];
    if (free_bytes > keep) {
        if (dr_hog_take(d, (uint64_t)(free_bytes - keep), why, sizeof why)) {
            dr_progress(d, "[%s] %s", scenario, why);
            return -1;
        }
        dr_mark_add(d, scenario, "hog", "a second model takes %.1f MiB of the GPU; %d tokens of KV stay free",
                    (double)(free_bytes - keep) / 1048576.0, tokens);
    }
    double t0 = dh_now();
    while (dh_now() - t0 < 10 && !dr_interrupted) {
        json_t *w = router_worker(rt->address, "gpu");
        long long f = json_integer_value(json_object_get(w, "memory_free_bytes"));
        json_decref(w);
        if (f <= keep + 16 * kvpt)
            return 0;
        dh_sleep_ms(50);
    }
    return -1;
}

static pid_t gpu_pid(const char *address)
{
    json_t *w = router_worker(address, "gpu");
    pid_t pid = (pid_t)json_integer_value(json_object_get(w, "pid"));
    json_decref(w);
    return pid;
}

/* Writes the two worker sections of a generated configuration. */
static void workers_ini(drill *d, char *buf, size_t cap, const char *policy, const char *gpu_fault,
                        const char *cpu_fault)
{
    char simcap[64] = "";
    if (d->gpu_simulated)
        snprintf(simcap, sizeof simcap, "sim-capacity = %s\n", d->sim_capacity);
    snprintf(buf, cap,
             "[worker gpu]\ndevice = %s\n%smax-seqs = 4\npolicy = %s\n%s%s%s%s"
             "\n[worker cpu]\ndevice = cpu\nmax-seqs = 8\n%s%s%s%s",
             d->gpu_device, simcap, policy, gpu_fault ? "fault = " : "", gpu_fault ? gpu_fault : "",
             gpu_fault ? "\n" : "", d->gpu_extra, cpu_fault ? "fault = " : "",
             cpu_fault ? cpu_fault : "", cpu_fault ? "\n" : "", d->cpu_extra);
}

void dr_note_sabotage(drill *d)
{
    json_t *h = dh_get_json(d->router.address, "/health", 5000, NULL);
    json_t *sab = json_object_get(h, "sabotage");
    if (json_is_array(sab)) {
        d->router_sabotage_seen = true;
        d->router_sabotage[0] = '\0';
        for (size_t i = 0; i < json_array_size(sab); i++) {
            size_t l = strlen(d->router_sabotage);
            snprintf(d->router_sabotage + l, sizeof d->router_sabotage - l, "%s%s", i ? "," : "",
                     json_string_value(json_array_get(sab, i)) ?: "");
        }
    }
    json_decref(h);
}

static bool start_router(drill *d, dr_scenario *s, const char *name, const char *server_extra,
                         const char *workers)
{
    dr_hog_close(d);
    if (d->pool[0]) {
        /* a fresh pool: each scenario starts from an empty GPU */
        sw_error err;
        dev_sim_unlink(d->pool, &err);
    }
    char why[512];
    dr_progress(d, "[%s] starting the router (%s)", s->id, name);
    if (dr_router_start(d, &d->router, name, server_extra, workers, why, sizeof why)) {
        dr_check_add(d, s, DR_V_NONE, false, "router started", "%s", why);
        return false;
    }
    dr_note_sabotage(d);
    return true;
}

static void stop_router(drill *d, dr_scenario *s)
{
    dr_hog_release(d);
    if (d->attached)
        return;
    int st = dr_router_stop(d, &d->router);
    if (st != 0)
        dr_check_add(d, s, DR_V_NONE, false, "router stopped cleanly",
                 "exit status %d (log: %s)", st, d->router.log);
}

static void check_identity(drill *d, dr_scenario *s, dr_request *r)
{
    if (r->status == 0 && r->client_cancelled) {
        /* hung up before any answer: the router's record carries the id */
        dr_check_add(d, s, DR_V_IDENTITY, r->has_event, "request id preserved",
                     "%s: no answer (the client left first); the router's failover record %s",
                     r->id, r->has_event ? "carries the same id" : "is missing");
        return;
    }
    bool ok = !strcmp(r->rid_out, r->id) && r->ids_match;
    dr_check_add(d, s, DR_V_IDENTITY, ok, "request id preserved",
                 "%s: X-Request-Id out '%s', response ids %s%s", r->id, r->rid_out,
                 r->ids_match ? "all equal" : "differ",
                 r->has_event ? ", failover record under the same id" : "");
}

/* A failed-over request, checked against the seed's criteria. */
static void check_failover(drill *d, dr_scenario *s, dr_request *r, const char *want_decision,
                           const char *want_kind, double cpu_ok_delta, int n_ref)
{
    bool served = r->status == 200 && r->complete && !r->error_code[0];
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, served, "answered",
             "%s: status %d%s%s, %d tokens, finish '%s'", r->id, r->status,
             r->error_code[0] ? ", error " : "", r->error_code, r->n_tokens, r->finish);
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, r->has_event && !strcmp(r->fe_worker, "gpu") &&
                 (!want_kind || !strcmp(r->fe_kind, want_kind)),
             "the GPU failure was seen", "%s: first error %s %s %s", r->id,
             r->has_event ? r->fe_worker : "(no failover event)", r->fe_kind, r->fe_phase);
    dr_check_add(d, s, DR_V_COMPLETED_ONCE,
             r->has_event && !strcmp(r->decision, want_decision) &&
                 !strcmp(r->outcome, "completed") && !strcmp(r->replay_worker, "cpu"),
             "retry decision", "%s: decision '%s' (want '%s'), outcome '%s', finished on '%s'",
             r->id, r->decision, want_decision, r->outcome, r->replay_worker);
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, r->ref_match != 0 && r->n_tokens == n_ref,
             "output equals the uninterrupted run",
             "%s: %d of %d tokens%s", r->id, r->n_tokens, n_ref,
             r->ref_match == 1 ? ", token for token" : r->ref_match < 0 ? " (not compared)" : ", DIFFERENT");
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, cpu_ok_delta == 1.0, "completed once",
             "%s: the CPU worker counted %.0f successful request(s) for it", r->id, cpu_ok_delta);
    dr_check_add(d, s, DR_V_NONE, r->connection_open && r->ev_client_connected != 0,
             "client connection stayed open", "%s: %s", r->id,
             r->connection_open ? "one response on one connection" : "the connection broke");
    check_identity(d, s, r);
}

/* Non-stream request in a thread (the drill acts while it runs). */
typedef struct async_req {
    drill *d;
    const char *address;
    dr_request *r;
    char body[512];
    char headers[256];
    hangup_fn hangup;
    void *user;
    pthread_t th;
    bool started;
} async_req;

static void *async_thread(void *arg)
{
    async_req *a = arg;
    send_request(a->d, a->address, a->r, "/v1/completions", a->body,
                 a->headers[0] ? a->headers : NULL, a->hangup, a->user);
    return NULL;
}

static bool async_start(async_req *a)
{
    a->started = pthread_create(&a->th, NULL, async_thread, a) == 0;
    return a->started;
}

static void async_join(async_req *a)
{
    if (a->started)
        pthread_join(a->th, NULL);
    a->started = false;
}

/* Waits until the GPU worker holds KV memory (a request runs there). */
static bool wait_gpu_busy(const char *gpu_sock, long long base_kv, int timeout_ms)
{
    double t0 = dh_now();
    while ((dh_now() - t0) * 1000.0 < timeout_ms && !dr_interrupted) {
        if (kv_used(gpu_sock) > base_kv)
            return true;
        dh_sleep_ms(3);
    }
    return false;
}

/* Takes every byte the GPU worker could still allocate. */
static int take_gpu_free(drill *d, const char *gpu_sock, const char *scenario)
{
    json_t *h = worker_health(gpu_sock);
    long long f = health_int(h, "memory", "free_bytes");
    json_decref(h);
    char why[512];
    if (f > 0 && dr_hog_take(d, (uint64_t)f, why, sizeof why)) {
        dr_progress(d, "[%s] %s", scenario, why);
        return -1;
    }
    double b = (double)(f > 0 ? f : 0);
    dr_mark_add(d, scenario, "hog", "a second model takes the GPU's last %.1f %s", b >= 1048576.0 ? b / 1048576.0 : b / 1024.0,
                b >= 1048576.0 ? "MiB" : "KiB");
    return 0;
}

static void s1_run(drill *d, dr_scenario *s)
{
    char workers[2048], body[512];
    int ref[DR_MAX_TOKENS], n_ref = 0;
    begin(d, s);
    if (d->attached) {
        /* Attached: the reserve half only, sized from the router's /health. */
        json_t *g = router_worker(d->router.address, "gpu");
        json_t *c = router_worker(d->router.address, "cpu");
        long long fb = json_integer_value(json_object_get(g, "memory_free_bytes"));
        long long kv = json_integer_value(json_object_get(g, "kv_bytes_per_token"));
        long long cctx = json_integer_value(json_object_get(c, "ctx_limit"));
        json_decref(g);
        json_decref(c);
        long long need = kv > 0 ? fb / kv + 64 : 0;
        if (!kv || !cctx || need + 16 >= cctx || need > DR_MAX_TOKENS) {
            skip(d, s, "attached: needs workers named 'gpu' and 'cpu', and a CPU context "
                       "longer than the GPU's free KV (%lld tokens)", need);
            return;
        }
        dr_request *r = dr_request_new(d, s->id, "s1-reserve-big", "too big for the GPU: CPU up front");
        request_body(body, sizeof body, (int)need, false);
        send_request(d, d->router.address, r, "/v1/completions", body, NULL, NULL, NULL);
        attach_events_wait(d, d->router.address, s->id, 0);
        dr_check_add(d, s, DR_V_NONE, r->status == 200 && r->complete, "answered", "status %d, %d tokens",
                 r->status, r->n_tokens);
        dr_check_add(d, s, DR_V_NONE, !strcmp(r->worker, "cpu") && r->attempts == 1 && !r->has_event,
                 "routed to the CPU up front", "worker '%s', attempts %d%s", r->worker, r->attempts,
                 r->has_event ? ", with a failover" : "");
        check_identity(d, s, r);
        r->ok = r->status == 200;
        finish(d, s);
        return;
    }

    /* reserve: too big for the GPU's free memory -> the CPU, no error */
    workers_ini(d, workers, sizeof workers, "reserve", NULL, NULL);
    if (!start_router(d, s, "s1-reserve", NULL, workers))
        goto done;
    dr_router *rt = &d->router;
    if (reference(rt->cpu_sock, BIG_TOKENS, ref, &n_ref)) {
        dr_check_add(d, s, DR_V_NONE, false, "reference run", "the CPU worker gave %d tokens", n_ref);
        goto done;
    }
    if (leave_free_tokens(d, rt, s->id, FREE_TOKENS)) {
        dr_check_add(d, s, DR_V_NONE, false, "GPU memory taken", "the router did not see it");
        goto done;
    }
    dr_request *small = dr_request_new(d, s->id, "s1-small", "fits the GPU");
    request_body(body, sizeof body, 16, false);
    send_request(d, rt->address, small, "/v1/completions", body, NULL, NULL, NULL);
    small->ok = small->status == 200 && !strcmp(small->worker, "gpu");
    dr_check_add(d, s, DR_V_NONE, small->ok, "a request that fits runs on the GPU",
             "status %d on '%s'", small->status, small->worker);
    double gpu0 = worker_requests_all(rt->gpu_sock), cpu0 = worker_ok(rt->cpu_sock);
    dr_request *big = dr_request_new(d, s->id, "s1-reserve-big",
                                     "reserve: too big for the GPU, CPU up front");
    request_body(body, sizeof body, BIG_TOKENS, false);
    dr_progress(d, "[%s] reserve: %d tokens, %d fit on the GPU", s->id, BIG_TOKENS, FREE_TOKENS);
    send_request(d, rt->address, big, "/v1/completions", body, NULL, NULL, NULL);
    attach_events_wait(d, rt->address, s->id, 0);
    compare_ref(d, big, ref, n_ref);
    double gpu1 = worker_requests_all(rt->gpu_sock), cpu1 = worker_ok(rt->cpu_sock);
    big->ok = big->status == 200 && !strcmp(big->worker, "cpu") && big->attempts == 1;
    dr_check_add(d, s, DR_V_NONE, big->ok && !big->has_event, "routed to the CPU up front",
             "status %d, worker '%s', attempts %d, %s", big->status, big->worker, big->attempts,
             big->has_event ? "a failover happened" : "no failover");
    dr_check_add(d, s, DR_V_NONE, gpu1 == gpu0, "the GPU never saw it",
             "GPU worker requests + refusals %.0f -> %.0f", gpu0, gpu1);
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, cpu1 - cpu0 == 1.0 && big->ref_match != 0 &&
                 big->n_tokens == n_ref,
             "completed once", "CPU worker ok %.0f -> %.0f; %d tokens%s", cpu0, cpu1,
             big->n_tokens, big->ref_match == 1 ? ", equal to the reference" : "");
    check_identity(d, s, big);
    stop_router(d, s);
    if (dr_interrupted)
        goto done;

    /* grow: admitted to the GPU, then a second model takes the memory:
     * out of memory in decode, replayed on the CPU. */
    workers_ini(d, workers, sizeof workers, "grow", "stall_ms:20", NULL);
    if (!start_router(d, s, "s1-grow", NULL, workers))
        goto done;
    rt = &d->router;
    if (reference(rt->cpu_sock, 64, ref, &n_ref)) {
        dr_check_add(d, s, DR_V_NONE, false, "reference run", "the CPU worker gave %d tokens", n_ref);
        goto done;
    }
    long long gkv0 = kv_used(rt->gpu_sock);
    cpu0 = worker_ok(rt->cpu_sock);
    async_req a = {.d = d, .address = rt->address};
    a.r = dr_request_new(d, s->id, "s1-grow-oom", "grow: OOM mid-generation, replayed");
    if (!a.r)
        goto done;
    request_body(a.body, sizeof a.body, 64, false);
    dr_progress(d, "[%s] grow: 64 tokens on the GPU, a second model takes its memory", s->id);
    if (!async_start(&a))
        goto done;
    bool busy = wait_gpu_busy(rt->gpu_sock, gkv0, 20000);
    if (busy)
        take_gpu_free(d, rt->gpu_sock, s->id);
    async_join(&a);
    dr_hog_release(d);
    dr_mark_add(d, s->id, "hog_release", "the second model gives the memory back");
    dr_check_add(d, s, DR_V_NONE, busy, "the request started on the GPU",
             busy ? "KV memory taken on the GPU worker" : "the GPU worker never held it");
    attach_events_wait(d, rt->address, s->id, 1);
    compare_ref(d, a.r, ref, n_ref);
    cpu1 = worker_ok(rt->cpu_sock);
    check_failover(d, s, a.r, "replay", "oom", cpu1 - cpu0, n_ref);
    a.r->ok = a.r->status == 200 && a.r->has_event;
done:
    stop_router(d, s);
    finish(d, s);
}

static bool never(void *u, dr_request *r, int n)
{
    (void)u;
    (void)r;
    (void)n;
    return false;
}

static void s2_run(drill *d, dr_scenario *s)
{
    begin(d, s);
    if (d->attached) {
        skip(d, s, "needs fault injection in a managed GPU worker (SPILLWAY_FAULT)");
        return;
    }
    static const int ks[2] = {0, 5};
    for (int t = 0; t < 2 && !dr_interrupted; t++) {
        char workers[2048], fault[64], name[32], id[64], body[512];
        int ref[DR_MAX_TOKENS], n_ref = 0;
        snprintf(fault, sizeof fault, "abort_after_tokens:%d,stall_ms:20", ks[t]);
        snprintf(name, sizeof name, "s2-crash-after-%d", ks[t]);
        workers_ini(d, workers, sizeof workers, "reserve", fault, NULL);
        if (!start_router(d, s, name, NULL, workers))
            break;
        dr_router *rt = &d->router;
        if (reference(rt->cpu_sock, 24, ref, &n_ref)) {
            dr_check_add(d, s, DR_V_NONE, false, "reference run", "the CPU worker gave %d tokens", n_ref);
            stop_router(d, s);
            break;
        }
        double cpu0 = worker_ok(rt->cpu_sock);
        snprintf(id, sizeof id, "s2-stream-crash-%d", ks[t]);
        dr_request *r = dr_request_new(d, s->id, id,
                                       ks[t] ? "stream, GPU crash after 5 tokens: resumed"
                                             : "stream, GPU crash before the first token");
        request_body(body, sizeof body, 24, true);
        dr_progress(d, "[%s] stream of 24 tokens, the GPU worker aborts after %d", s->id, ks[t]);
        send_request(d, rt->address, r, "/v1/completions", body, NULL, never, NULL);
        attach_events_wait(d, rt->address, s->id, 1);
        compare_ref(d, r, ref, n_ref);
        double cpu1 = worker_ok(rt->cpu_sock);
        check_failover(d, s, r, ks[t] ? "resume" : "replay", "worker_crash", cpu1 - cpu0, n_ref);
        dr_check_add(d, s, DR_V_COMPLETED_ONCE, r->framing_ok && r->done_events == 1 && !r->error_code[0],
                 "one unbroken stream", "%s: strict SSE %s, %d [DONE], %s", r->id,
                 r->framing_ok ? "ok" : "BROKEN", r->done_events,
                 r->error_code[0] ? r->error_code : "no error event");
        if (ks[t] == 0)
            dr_check_add(d, s, DR_V_NONE, !strcmp(r->worker, "cpu"), "the failure was invisible",
                     "%s: the stream's headers came from '%s'", r->id, r->worker);
        else
            dr_check_add(d, s, DR_V_NONE, !strcmp(r->worker, "gpu") && r->t_first_token > 0 &&
                         r->fe_time > 0 && r->t_first_token <= r->fe_time + 0.5,
                     "tokens were sent before the failure",
                     "%s: started on '%s', first token %.3f s before the failure", r->id,
                     r->worker, r->fe_time - r->t_first_token);
        r->ok = r->status == 200 && r->complete && r->ref_match != 0;
        stop_router(d, s);
    }
    finish(d, s);
}

/* s3: two requests fail over together; the client hangs up on both while
 * their CPU attempts run (the stream once it has more tokens than the GPU
 * worker could send, the other once the stream is there). */
typedef struct cancel_state {
    drill *d;
    const char *cpu_sock;
    volatile bool resumed;    /* the stream got tokens past the GPU's */
    volatile int hung_up;
} cancel_state;

static int cpu_active(const char *cpu_sock)
{
    json_t *h = worker_health(cpu_sock);
    int n = (int)health_int(h, "slots", "active");
    json_decref(h);
    return n;
}

static bool hangup_stream(void *u, dr_request *r, int tokens)
{
    cancel_state *c = u;
    if (tokens < 22) /* the GPU worker sends 20 at most */
        return false;
    c->resumed = true;
    if (cpu_active(c->cpu_sock) < 1)
        return false;
    dr_mark_add(c->d, r->scenario, "cancel", "the client of %s hangs up after %d tokens", r->id,
                tokens);
    c->hung_up++;
    return true;
}

static bool hangup_replay(void *u, dr_request *r, int tokens)
{
    (void)tokens;
    cancel_state *c = u;
    if (!c->resumed || cpu_active(c->cpu_sock) < 1)
        return false;
    dr_mark_add(c->d, r->scenario, "cancel", "the client of %s hangs up during its replay", r->id);
    c->hung_up++;
    return true;
}

static void s3_run(drill *d, dr_scenario *s)
{
    begin(d, s);
    if (d->attached) {
        skip(d, s, "needs fault injection in a managed GPU worker (SPILLWAY_FAULT)");
        return;
    }
    char workers[2048];
    /* 20 slow tokens on the GPU: time enough for both requests to start
     * there before it aborts */
    workers_ini(d, workers, sizeof workers, "reserve", "abort_after_tokens:20,stall_ms:20",
                "stall_ms:30");
    if (!start_router(d, s, "s3-cancel", NULL, workers)) {
        finish(d, s);
        return;
    }
    dr_router *rt = &d->router;
    long long cpu_kv0 = kv_used(rt->cpu_sock), gpu_kv0 = kv_used(rt->gpu_sock);
    uint64_t pool0 = 0;
    bool have_pool = dr_pool_used(d, &pool0) == 0;
    double cancelled0 = worker_metric(rt->cpu_sock, "spillway_worker_requests_total{outcome=\"cancelled\"}");
    cancel_state cs = {.d = d, .cpu_sock = rt->cpu_sock};
    async_req st = {.d = d, .address = rt->address, .hangup = hangup_stream, .user = &cs};
    async_req ns = {.d = d, .address = rt->address, .hangup = hangup_replay, .user = &cs};
    st.r = dr_request_new(d, s->id, "s3-stream-cancel", "stream resumed on the CPU, client leaves");
    ns.r = dr_request_new(d, s->id, "s3-replay-cancel", "replayed on the CPU, client leaves");
    if (!st.r || !ns.r) {
        finish(d, s);
        return;
    }
    request_body(st.body, sizeof st.body, 400, true);
    request_body(ns.body, sizeof ns.body, 500, false);
    dr_progress(d, "[%s] a stream and a request on the GPU; it aborts after 20 tokens; the "
                   "clients hang up while the CPU serves them", s->id);
    async_start(&st);
    async_start(&ns);
    async_join(&st);
    async_join(&ns);
    /* KV memory back at baseline on the CPU worker */
    double t0 = dh_now();
    long long cpu_kv = kv_used(rt->cpu_sock);
    while (cpu_kv != cpu_kv0 && dh_now() - t0 < 10 && !dr_interrupted) {
        dh_sleep_ms(20);
        cpu_kv = kv_used(rt->cpu_sock);
    }
    dr_check_add(d, s, DR_V_NONE, st.r->client_cancelled && ns.r->client_cancelled,
             "the clients hung up during the CPU attempts", "stream: %s, non-stream: %s",
             st.r->client_cancelled ? "hung up" : "did not get that far",
             ns.r->client_cancelled ? "hung up" : "did not get that far");
    dr_check_add(d, s, DR_V_NONE, cpu_kv == cpu_kv0, "CPU worker KV back at baseline",
             "kv_used_bytes %lld (baseline %lld)", cpu_kv, cpu_kv0);
    /* the events say the clients left */
    t0 = dh_now();
    do {
        attach_events(d, rt->address, s->id);
        if (!strcmp(st.r->outcome, "cancelled") && !strcmp(ns.r->outcome, "cancelled"))
            break;
        dh_sleep_ms(50);
    } while (dh_now() - t0 < 10 && !dr_interrupted);
    dr_request *rs[2] = {st.r, ns.r};
    for (int i = 0; i < 2; i++) {
        dr_request *r = rs[i];
        dr_check_add(d, s, DR_V_NONE,
                 r->has_event && !strcmp(r->fe_worker, "gpu") && !strcmp(r->outcome, "cancelled") &&
                     r->ev_client_connected == 0,
                 "cancelled during failover", "%s: first error %s %s, decision '%s', outcome '%s', "
                 "client connected %s", r->id, r->fe_worker, r->fe_kind, r->decision, r->outcome,
                 r->ev_client_connected == 0 ? "no" : r->ev_client_connected == 1 ? "yes" : "?");
        r->ok = r->client_cancelled && !strcmp(r->outcome, "cancelled");
        check_identity(d, s, r);
    }
    double cancelled1 = 0;
    t0 = dh_now();
    do {
        cancelled1 = worker_metric(rt->cpu_sock, "spillway_worker_requests_total{outcome=\"cancelled\"}");
        if (cancelled1 - cancelled0 >= 2)
            break;
        dh_sleep_ms(50);
    } while (dh_now() - t0 < 5 && !dr_interrupted);
    dr_check_add(d, s, DR_V_NONE, cancelled1 - cancelled0 == 2, "the CPU worker cancelled both",
             "cancelled requests %.0f -> %.0f", cancelled0, cancelled1);
    /* The GPU worker died mid-request: its memory must be back, whether
     * it was restarted (its KV at baseline) or not (the pool says so). */
    bool up = wait_restarted(rt->address, "gpu", 1, 15, NULL, NULL);
    if (up) {
        long long g = kv_used(rt->gpu_sock);
        dr_check_add(d, s, DR_V_NONE, g == gpu_kv0, "GPU worker KV back at baseline",
                 "restarted; kv_used_bytes %lld (baseline %lld)", g, gpu_kv0);
    } else {
        uint64_t pool1 = 0;
        bool ok = have_pool && dr_pool_used(d, &pool1) == 0 && pool1 <= pool0;
        dr_check_add(d, s, DR_V_NONE, ok, "GPU memory back at baseline",
                 "not restarted; device memory used %llu bytes (baseline %llu)",
                 (unsigned long long)pool1, (unsigned long long)pool0);
    }
    stop_router(d, s);
    finish(d, s);
}

/* s4: concurrent mixed traffic while the GPU worker fails. */
#define S4_MAX 16

static void s4_half(drill *d, dr_scenario *s, bool oom)
{
    char workers[2048], name[32];
    int ref_small[DR_MAX_TOKENS], ref_big[DR_MAX_TOKENS], n_small = 0, n_big = 0;
    const int small_tokens = 40;
    snprintf(name, sizeof name, oom ? "s4-oom" : "s4-kill");
    workers_ini(d, workers, sizeof workers, oom ? "grow" : "reserve", "stall_ms:20", NULL);
    if (!start_router(d, s, name, NULL, workers))
        return;
    dr_router *rt = &d->router;
    if (reference(rt->cpu_sock, small_tokens, ref_small, &n_small) ||
        reference(rt->cpu_sock, BIG_TOKENS, ref_big, &n_big)) {
        dr_check_add(d, s, DR_V_NONE, false, "reference runs", "the CPU worker gave %d and %d tokens",
                 n_small, n_big);
        stop_router(d, s);
        return;
    }
    if (leave_free_tokens(d, rt, s->id, FREE_TOKENS)) {
        dr_check_add(d, s, DR_V_NONE, false, "GPU memory taken", "the router did not see it");
        stop_router(d, s);
        return;
    }
    long long gkv0 = kv_used(rt->gpu_sock);
    double cpu0 = worker_ok(rt->cpu_sock);
    int n = d->quick ? 8 : S4_MAX;
    static async_req reqs[S4_MAX];
    for (int i = 0; i < n; i++) {
        async_req *a = &reqs[i];
        memset(a, 0, sizeof *a);
        a->d = d;
        a->address = rt->address;
        bool big = i % 4 == 3, stream = i % 2 == 0;
        char id[64], label[128];
        snprintf(id, sizeof id, "%s-%02d-%s%s", name, i, big ? "big" : "small", stream ? "-stream" : "");
        snprintf(label, sizeof label, "%s%s", big ? "big (CPU up front)" : "small",
                 stream ? ", stream" : "");
        a->r = dr_request_new(d, s->id, id, label);
        if (!a->r)
            break;
        request_body(a->body, sizeof a->body, big ? BIG_TOKENS : small_tokens, stream);
        if (stream)
            a->hangup = never;
        async_start(a);
    }
    bool busy = wait_gpu_busy(rt->gpu_sock, gkv0, 20000);
    if (busy && !oom) {
        pid_t pid = gpu_pid(rt->address);
        if (pid > 0 && kill(pid, SIGKILL) == 0)
            dr_mark_add(d, s->id, "sigkill", "SIGKILL to the GPU worker (pid %d)", (int)pid);
        else
            busy = false;
    } else if (busy) {
        busy = take_gpu_free(d, rt->gpu_sock, s->id) == 0;
    }
    dr_progress(d, "[%s] %d concurrent requests; the GPU worker %s", s->id, n,
                oom ? "runs out of memory" : "is killed (SIGKILL)");
    for (int i = 0; i < n; i++)
        async_join(&reqs[i]);
    dr_hog_release(d);
    if (oom)
        dr_mark_add(d, s->id, "hog_release", "the second model gives the memory back");
    dr_check_add(d, s, DR_V_GPU_RECOVERED, busy, oom ? "the GPU ran out of memory under load"
                                                 : "the GPU worker was killed under load",
             busy ? "while it held requests" : "it never held a request");
    attach_events_wait(d, rt->address, s->id, 1);
    int lost = 0, wrong = 0, on_cpu = 0, big_disturbed = 0, failovers = 0, id_bad = 0;
    char lost_ids[160] = "", wrong_ids[160] = "";
    for (int i = 0; i < n; i++) {
        dr_request *r = reqs[i].r;
        if (!r)
            continue;
        bool big = strstr(r->id, "-big") != NULL;
        compare_ref(d, r, big ? ref_big : ref_small, big ? n_big : n_small);
        bool served = r->status == 200 && r->complete;
        bool typed = !served && r->status != 0 && r->error_code[0] && !r->timed_out;
        if (!served && !typed) {
            lost++;
            size_t l = strlen(lost_ids);
            snprintf(lost_ids + l, sizeof lost_ids - l, " %s", r->id);
        }
        if (served && r->ref_match == 0) {
            wrong++;
            size_t l = strlen(wrong_ids);
            snprintf(wrong_ids + l, sizeof wrong_ids - l, " %s", r->id);
        }
        if (served && !strcmp(r->final_worker, "cpu"))
            on_cpu++;
        if (big && !(served && !strcmp(r->worker, "cpu") && r->attempts == 1 && !r->has_event))
            big_disturbed++;
        failovers += r->has_event && !strcmp(r->fe_worker, "gpu");
        id_bad += strcmp(r->rid_out, r->id) || !r->ids_match;
        r->ok = served || typed;
    }
    double cpu1 = worker_ok(rt->cpu_sock);
    dr_check_add(d, s, DR_V_GPU_RECOVERED, lost == 0, "no request lost or hung",
             "%d of %d ended without an answer or a typed error%s", lost, n, lost_ids);
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, wrong == 0, "outputs equal the uninterrupted runs",
             "%d answer(s) differ%s", wrong, wrong_ids);
    dr_check_add(d, s, DR_V_GPU_RECOVERED, big_disturbed == 0, "requests on the CPU untouched",
             "%d of the big requests (admitted to the CPU) disturbed", big_disturbed);
    dr_check_add(d, s, DR_V_NONE, failovers > 0, "requests failed over",
             "%d request(s) failed over from the GPU", failovers);
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, cpu1 - cpu0 == (double)on_cpu, "each completed once",
             "the CPU worker completed %.0f, the clients got %d answers from it", cpu1 - cpu0,
             on_cpu);
    dr_check_add(d, s, DR_V_IDENTITY, id_bad == 0, "request ids preserved",
             "%d of %d answers carried another id", id_bad, n);
    int restarts = 0;
    char state[16] = "";
    bool back = wait_restarted(rt->address, "gpu", 1, 30, &restarts, state);
    dr_check_add(d, s, DR_V_GPU_RECOVERED, back, "the GPU worker was restarted",
                 "state '%s', %d restart(s) counted by the router", state, restarts);
    if (back) {
        dr_mark_add(d, s->id, "restart", "the GPU worker is back (%d restart(s))", restarts);
        char id[64], body[512];
        snprintf(id, sizeof id, "%s-after", name);
        dr_request *r = dr_request_new(d, s->id, id, "after the restart");
        request_body(body, sizeof body, 8, false);
        send_request(d, rt->address, r, "/v1/completions", body, NULL, NULL, NULL);
        r->ok = r->status == 200 && !strcmp(r->worker, "gpu");
        dr_check_add(d, s, DR_V_GPU_RECOVERED, r->ok, "the GPU worker serves again",
                 "status %d on '%s'", r->status, r->worker);
        snprintf(r->final_worker, sizeof r->final_worker, "%s", r->worker);
    }
    stop_router(d, s);
}

static void s4_run(drill *d, dr_scenario *s)
{
    begin(d, s);
    if (d->attached) {
        skip(d, s, "needs to kill and starve a managed GPU worker");
        return;
    }
    s4_half(d, s, false);
    if (!dr_interrupted)
        s4_half(d, s, true);
    finish(d, s);
}

/* s5: an agent run with a server-side tool. Once the tool has answered
 * (step 1 is in the ledger) and the next generation runs on the GPU, the
 * drill SIGKILLs the GPU worker: the router replays the whole run on the
 * CPU, and the ledger must give the recorded tool result back instead of
 * calling the tool again. */
static bool router_has_tools(drill *d, char *why, size_t cap)
{
    char path[700];
    snprintf(path, sizeof path, "%s/run/tool-probe.ini", d->out_dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    fprintf(f, "[server]\nmax-tool-steps = 2\n[model]\npath = %s\n[worker cpu]\ndevice = cpu\n"
               "[tool lookup]\ndescription = Looks up a word\nurl = http://127.0.0.1:9/lookup\n"
               "parameters = {\"type\":\"object\"}\n",
            d->model);
    fclose(f);
    static rt_config cfg;
    sw_error err;
    rt_config_defaults(&cfg);
    int rc = rt_config_load(&cfg, path, &err);
    remove(path);
    if (rc)
        snprintf(why, cap, "%s", err.message);
    return rc == 0;
}

#define S5_SCHEMA "{\"type\":\"object\",\"properties\":{\"word\":{\"type\":\"string\"," \
                  "\"maxLength\":8}},\"required\":[\"word\"]}"

/* Whether a worker answers a forced tool call with OpenAI tool_calls. */
static bool worker_has_tool_calls(const char *sock)
{
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"What does spillway mean?\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"lookup\","
        "\"description\":\"Looks up a word\",\"parameters\":" S5_SCHEMA "}}],"
        "\"tool_choice\":\"required\",\"max_tokens\":96,\"temperature\":0}";
    dh_response w;
    dh_exchange(sock, "POST", "/v1/chat/completions", "X-Request-Id: drill-tool-probe\r\n", body,
                TIMEOUT_MS, NULL, NULL, &w);
    json_t *j = w.status == 200 && w.body ? json_loads(w.body, 0, NULL) : NULL;
    json_t *calls = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "tool_calls");
    bool yes = json_array_size(calls) > 0;
    json_decref(j);
    dh_response_free(&w);
    return yes;
}

static int tool_answered_count(dr_tool_server *t)
{
    pthread_mutex_lock(&t->lock);
    int n = t->n_answered;
    pthread_mutex_unlock(&t->lock);
    return n;
}

typedef struct agent_req {
    drill *d;
    const char *address;
    dr_request *r;
    const char *body;
    pthread_t th;
} agent_req;

static void *agent_thread(void *arg)
{
    agent_req *a = arg;
    send_request(a->d, a->address, a->r, "/v1/chat/completions", a->body, NULL, NULL, NULL);
    return NULL;
}

static void s5_run(drill *d, dr_scenario *s)
{
    char why[512];
    begin(d, s);
    if (d->attached) {
        skip(d, s, "needs a tool server the router is configured with (the drill starts its own)");
        return;
    }
    if (!router_has_tools(d, why, sizeof why)) {
        skip(d, s, "the router has no server-side tools yet ([tool NAME] sections: %s)", why);
        return;
    }
    if (dr_tool_server_start(&d->tools)) {
        dr_check_add(d, s, DR_V_NONE, false, "tool server", "cannot listen on 127.0.0.1");
        finish(d, s);
        return;
    }
    d->tools.answer_delay_ms = 200;
    char workers[2048], server[1200];
    workers_ini(d, workers, sizeof workers, "reserve", "stall_ms:20", NULL);
    snprintf(server, sizeof server,
             "max-tool-steps = 2\n\n[tool lookup]\ndescription = Looks up a word in the dictionary\n"
             "url = http://127.0.0.1:%d/lookup\n"
             "parameters = " S5_SCHEMA "\nidempotent = false\ntimeout-ms = 10000\n",
             d->tools.port);
    if (!start_router(d, s, "s5-agent", server, workers)) {
        dr_tool_server_stop(&d->tools);
        finish(d, s);
        return;
    }
    dr_router *rt = &d->router;
    if (!worker_has_tool_calls(rt->cpu_sock)) {
        stop_router(d, s);
        dr_tool_server_stop(&d->tools);
        s->n_checks = 0;
        skip(d, s, "the workers do not return tool_calls yet (a forced tool call to the CPU "
                   "worker came back without one)");
        return;
    }
    double cpu0 = worker_ok(rt->cpu_sock);
    long long gkv0 = kv_used(rt->gpu_sock);
    agent_req a = {.d = d, .address = rt->address};
    a.r = dr_request_new(d, s->id, "s5-agent-run", "agent run, GPU killed after the tool call");
    if (!a.r) {
        stop_router(d, s);
        dr_tool_server_stop(&d->tools);
        finish(d, s);
        return;
    }
    a.body = "{\"messages\":[{\"role\":\"user\",\"content\":\"What does spillway mean?\"}],"
             "\"tool_execution\":\"server\",\"tool_choice\":\"required\",\"max_tokens\":96,"
             "\"temperature\":0}";
    dr_progress(d, "[%s] an agent run; once the tool has answered and the next generation runs "
                   "on the GPU, the GPU worker is killed", s->id);
    bool started = pthread_create(&a.th, NULL, agent_thread, &a) == 0;
    /* the tool answers (step 1 is recorded), then the next generation
     * starts on the GPU: that is when the GPU worker dies. The tool takes
     * 200 ms, so the first generation's KV memory is freed by then and
     * KV taken afterwards is the next generation's. */
    bool called = false, killed = false;
    double t0 = dh_now();
    while (started && !called && dh_now() - t0 < 60 && !dr_interrupted && !a.r->t_end) {
        called = tool_answered_count(&d->tools) > 0;
        if (!called)
            dh_sleep_ms(1);
    }
    if (called && wait_gpu_busy(rt->gpu_sock, gkv0, 10000)) {
        pid_t pid = gpu_pid(rt->address);
        if (pid > 0 && kill(pid, SIGKILL) == 0) {
            killed = true;
            dr_mark_add(d, s->id, "sigkill", "SIGKILL to the GPU worker (pid %d) during the "
                        "generation after the tool call", (int)pid);
        }
    }
    if (started)
        pthread_join(a.th, NULL);
    dr_request *r = a.r;
    attach_events_wait(d, rt->address, s->id, 0);
    dr_tool_call calls[DR_MAX_TOOL_CALLS];
    int n_calls = dr_tool_calls(&d->tools, calls, DR_MAX_TOOL_CALLS);
    int dup = 0, id_bad = 0;
    for (int i = 0; i < n_calls && i < DR_MAX_TOOL_CALLS; i++) {
        dr_mark *m = NULL;
        pthread_mutex_lock(&d->lock);
        if (d->n_marks < DR_MAX_MARKS)
            m = &d->marks[d->n_marks++];
        if (m) {
            m->time = calls[i].time;
            snprintf(m->scenario, sizeof m->scenario, "%s", s->id);
            snprintf(m->kind, sizeof m->kind, "tool_call");
            snprintf(m->label, sizeof m->label, "tool call %d (Idempotency-Key %.100s)", i + 1,
                     calls[i].key);
        }
        pthread_mutex_unlock(&d->lock);
        for (int k = 0; k < i; k++)
            dup += !strcmp(calls[i].key, calls[k].key);
        size_t il = strlen(r->id);
        id_bad += strcmp(calls[i].request_id, r->id) || strncmp(calls[i].key, r->id, il) ||
                  calls[i].key[il] != '/';
    }
    dr_check_add(d, s, DR_V_NONE, r->status == 200 && r->complete, "answered",
                 "status %d%s%s, %d tool step(s) in the answer (%d reused from the ledger)",
                 r->status, r->error_code[0] ? ", error " : "", r->error_code, r->tool_steps,
                 r->tool_steps_reused);
    dr_check_add(d, s, DR_V_NONE, called && killed, "the GPU worker died after the tool call",
                 "tool called: %s; GPU worker killed during the next generation: %s",
                 called ? "yes" : "no", killed ? "yes" : "no");
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, r->run_attempts >= 2 || r->has_event,
                 "the run was replayed", "run attempts %d%s", r->run_attempts,
                 r->has_event ? ", failover record" : "");
    /* more calls than steps in a successful answer would be a repeat under
     * another key; a failed run has no steps to compare with */
    dr_check_add(d, s, DR_V_NO_DUP_TOOL,
                 dup == 0 && n_calls >= 1 && (r->status != 200 || n_calls <= r->tool_steps),
                 "no duplicated tool action",
                 "the tool server saw %d call(s) for %d step(s); %d with an Idempotency-Key "
                 "already seen", n_calls, r->tool_steps, dup);
    dr_check_add(d, s, DR_V_IDENTITY, id_bad == 0 && n_calls >= 1, "tool calls carry the request id",
                 "%d of %d call(s) without X-Request-Id %s and Idempotency-Key %s/<step>", id_bad,
                 n_calls, r->id, r->id);
    double cpu1 = worker_ok(rt->cpu_sock);
    dr_check_add(d, s, DR_V_NONE, cpu1 - cpu0 >= 1, "the CPU worker finished the run",
                 "CPU worker ok %.0f -> %.0f", cpu0, cpu1);
    check_identity(d, s, r);
    if (!r->final_worker[0])
        snprintf(r->final_worker, sizeof r->final_worker, "%s", r->worker);
    r->ok = r->status == 200 && dup == 0;
    stop_router(d, s);
    dr_tool_server_stop(&d->tools);
    finish(d, s);
}

/* s6: a deadline the CPU route cannot meet, then the same request as a job. */
static bool router_has_jobs(const char *address)
{
    dh_response w;
    dh_exchange(address, "POST", "/v1/spillway/jobs", "X-Request-Id: drill-job-probe\r\n", "{}",
                10000, NULL, NULL, &w);
    bool yes = w.status != 0 && w.status != 404 && w.status != 405;
    dh_response_free(&w);
    return yes;
}

static double router_sum_others(const char *metrics)
{
    /* every request a worker saw, whatever the outcome */
    double total = dh_metric_sum(metrics, "spillway_router_requests_total");
    double none = 0.0;
    static const char *const outcomes[] = {"capacity_exceeded", "unauthorized", "bad_request"};
    for (int i = 0; i < 3; i++) {
        char series[128];
        snprintf(series, sizeof series,
                 "spillway_router_requests_total{worker=\"none\",outcome=\"%s\"}", outcomes[i]);
        none += dh_metric(metrics, series);
    }
    return total - none;
}

static void s6_job(drill *d, dr_scenario *s, const int *ref, int n_ref)
{
    dr_router *rt = &d->router;
    char body[1024], inner[512];
    request_body(inner, sizeof inner, BIG_TOKENS, false);
    snprintf(body, sizeof body, "{\"endpoint\":\"completions\",\"request\":%s}", inner);
    double cpu0 = d->attached ? 0 : worker_ok(rt->cpu_sock);
    double gpu0 = d->attached ? 0 : worker_ok(rt->gpu_sock);
    dr_request *r = dr_request_new(d, s->id, "s6-job", "the same request as a durable job");
    if (!r)
        return;
    r->job = true;
    dh_response w;
    r->t_send = dh_now();
    snprintf(r->path, sizeof r->path, "/v1/spillway/jobs");
    r->max_tokens = BIG_TOKENS;
    dh_exchange(rt->address, "POST", "/v1/spillway/jobs", "X-Request-Id: s6-job\r\n", body,
                TIMEOUT_MS, NULL, NULL, &w);
    char loc[256] = "";
    dh_header(&w, "Location", loc, sizeof loc);
    dh_header(&w, "X-Request-Id", r->rid_out, sizeof r->rid_out);
    json_t *j = w.body ? json_loads(w.body, 0, NULL) : NULL;
    snprintf(r->job_id, sizeof r->job_id, "%s", json_string_value(json_object_get(j, "id")) ?: "");
    int submit_status = w.status;
    json_decref(j);
    dh_response_free(&w);
    dr_check_add(d, s, DR_V_NONE, submit_status == 202 && r->job_id[0] && loc[0], "job accepted",
             "status %d, id '%s', Location '%s'", submit_status, r->job_id, loc);
    dr_progress(d, "[%s] job %s submitted; waiting for it", s->id, r->job_id);
    json_t *final = NULL;
    double t0 = dh_now();
    while (r->job_id[0] && dh_now() - t0 < TIMEOUT_MS / 1000 && !dr_interrupted) {
        char path[200];
        snprintf(path, sizeof path, "/v1/spillway/jobs/%s", r->job_id);
        json_t *g = dh_get_json(rt->address, path, 10000, NULL);
        const char *st = json_string_value(json_object_get(g, "state"));
        if (st && (!strcmp(st, "succeeded") || !strcmp(st, "failed"))) {
            final = g;
            break;
        }
        if (st && !strcmp(st, "running") && !r->t_headers)
            r->t_headers = dh_now();
        json_decref(g);
        dh_sleep_ms(100);
    }
    r->t_end = dh_now();
    const char *st = json_string_value(json_object_get(final, "state"));
    snprintf(r->job_state, sizeof r->job_state, "%s", st ?: "timed out");
    r->attempts = (int)json_integer_value(json_object_get(final, "attempts"));
    json_t *resp = json_object_get(final, "response");
    r->status = st && !strcmp(st, "succeeded") ? 200 : 0;
    r->ids_match = true;
    append_tokens(r, json_object_get(json_object_get(resp, "spillway"), "token_ids"));
    json_t *c0 = json_array_get(json_object_get(resp, "choices"), 0);
    append_text(r, json_string_value(json_object_get(c0, "text")));
    snprintf(r->finish, sizeof r->finish, "%s",
             json_string_value(json_object_get(c0, "finish_reason")) ?: "");
    snprintf(r->error_code, sizeof r->error_code, "%s",
             json_string_value(json_object_get(json_object_get(final, "error"), "code")) ?: "");
    r->complete = r->status == 200;
    r->connection_open = true;
    json_decref(final);
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, r->status == 200, "the job completed",
             "state '%s'%s%s after %.1f s, %d attempt(s)", r->job_state,
             r->error_code[0] ? ", error " : "", r->error_code, r->t_end - r->t_send, r->attempts);
    if (!d->attached) {
        double cpu1 = worker_ok(rt->cpu_sock), gpu1 = worker_ok(rt->gpu_sock);
        snprintf(r->final_worker, sizeof r->final_worker, "%s",
                 cpu1 > cpu0 ? "cpu" : gpu1 > gpu0 ? "gpu" : "");
        snprintf(r->worker, sizeof r->worker, "%s", r->final_worker);
        compare_ref(d, r, ref, n_ref);
        dr_check_add(d, s, DR_V_COMPLETED_ONCE,
                 (cpu1 - cpu0) + (gpu1 - gpu0) == 1.0 && r->ref_match != 0 && r->n_tokens == n_ref,
                 "the job completed once",
                 "the workers completed %.0f request(s) for it; %d tokens%s",
                 (cpu1 - cpu0) + (gpu1 - gpu0), r->n_tokens,
                 r->ref_match == 1 ? ", equal to the reference" : "");
    }
    dr_check_add(d, s, DR_V_IDENTITY, !strcmp(r->rid_out, r->id), "request id preserved",
             "%s: X-Request-Id out '%s'", r->id, r->rid_out);
    r->ok = r->status == 200;
}

static void s6_run(drill *d, dr_scenario *s)
{
    char workers[2048], body[512];
    int ref[DR_MAX_TOKENS], n_ref = 0;
    begin(d, s);
    if (!d->attached) {
        workers_ini(d, workers, sizeof workers, "reserve", NULL, NULL);
        if (!start_router(d, s, "s6-deadline", NULL, workers))
            goto done;
        if (reference(d->router.cpu_sock, BIG_TOKENS, ref, &n_ref) ||
            leave_free_tokens(d, &d->router, s->id, FREE_TOKENS)) {
            dr_check_add(d, s, DR_V_NONE, false, "set-up", "reference run or GPU memory failed");
            goto done;
        }
    }
    dr_router *rt = &d->router;
    /* warm-up: each worker measures its rates */
    dr_request *warm = dr_request_new(d, s->id, "s6-warm-up", "warm-up (measures the CPU's rates)");
    request_body(body, sizeof body, d->attached ? 64 : BIG_TOKENS, false);
    send_request(d, rt->address, warm, "/v1/completions", body, NULL, NULL, NULL);
    snprintf(warm->final_worker, sizeof warm->final_worker, "%s", warm->worker);
    warm->ok = warm->status == 200;
    double prefill = 0, decode = 0, t0 = dh_now();
    while (dh_now() - t0 < 10 && !dr_interrupted) {
        json_t *c = router_worker(rt->address, "cpu");
        prefill = json_number_value(json_object_get(c, "prefill_tokens_per_second"));
        decode = json_number_value(json_object_get(c, "decode_tokens_per_second"));
        json_decref(c);
        if (prefill > 0 && decode > 0)
            break;
        dh_sleep_ms(50);
    }
    if (prefill <= 0 || decode <= 0) {
        dr_check_add(d, s, DR_V_NONE, false, "the CPU worker's rates",
                 "the router reports none (a worker named 'cpu' that served a request)");
        goto done;
    }
    double predicted_ms = (8.0 / prefill + BIG_TOKENS / decode) * 1000.0;
    int deadline_ms = predicted_ms >= 20 ? (int)(predicted_ms / 10) : 1;
    char *m0 = metrics_text(rt->address);
    double seen0 = router_sum_others(m0);
    double refused0 = dh_metric(m0, "spillway_router_requests_total{worker=\"none\",outcome=\"capacity_exceeded\"}");
    sw_free(m0);
    char hdr[96];
    snprintf(hdr, sizeof hdr, "X-Spillway-Deadline-Ms: %d\r\n", deadline_ms);
    dr_request *r = dr_request_new(d, s->id, "s6-deadline", "deadline shorter than the CPU route");
    request_body(body, sizeof body, BIG_TOKENS, false);
    dr_progress(d, "[%s] %d tokens within %d ms (the CPU needs about %.0f ms)", s->id, BIG_TOKENS,
                deadline_ms, predicted_ms);
    send_request(d, rt->address, r, "/v1/completions", body, hdr, NULL, NULL);
    char *m1 = metrics_text(rt->address);
    double seen1 = router_sum_others(m1);
    double refused1 = dh_metric(m1, "spillway_router_requests_total{worker=\"none\",outcome=\"capacity_exceeded\"}");
    sw_free(m1);
    double waited = r->t_end - r->t_send;
    r->ok = r->status == 503 && !strcmp(r->error_code, "capacity_exceeded");
    snprintf(r->final_worker, sizeof r->final_worker, "none");
    dr_check_add(d, s, DR_V_NONE, r->ok && r->retry_after[0], "a typed capacity error",
             "status %d, code '%s', Retry-After '%s'", r->status, r->error_code, r->retry_after);
    dr_check_add(d, s, DR_V_NONE, seen1 == seen0 && refused1 == refused0 + 1, "no worker ran it",
             "requests the workers saw %.0f -> %.0f; capacity refusals %.0f -> %.0f", seen0,
             seen1, refused0, refused1);
    dr_check_add(d, s, DR_V_NONE, waited < 10.0, "no silent waiting",
             "answered after %.3f s (the queue would wait up to 10 s)", waited);
    check_identity(d, s, r);
    if (router_has_jobs(rt->address)) {
        if (d->attached && reference(rt->address, BIG_TOKENS, ref, &n_ref))
            n_ref = 0;
        s6_job(d, s, ref, n_ref);
    } else {
        dr_progress(d, "[%s] the job half is skipped: the router has no /v1/spillway/jobs yet", s->id);
        snprintf(s->skip_reason, sizeof s->skip_reason,
                 "the job half is skipped: the router has no /v1/spillway/jobs yet (404)");
    }
done:
    stop_router(d, s);
    finish(d, s);
}

void dr_run_all(drill *d)
{
    void (*const run[DR_N_SCENARIOS])(drill *, dr_scenario *) = {s1_run, s2_run, s3_run,
                                                                  s4_run, s5_run, s6_run};
    for (int i = 0; i < DR_N_SCENARIOS && !dr_interrupted; i++)
        run[i](d, &d->scenarios[i]);
}
