/* drill_steps.c - the steps the drill's scenarios are made of: sending a
 * request the way a strict client does and recording what it saw, the
 * reference run, the router's failover records, reading what the workers
 * and the router publish (/metrics, /health), starting and stopping a
 * scenario's router, taking GPU memory, and the checks several scenarios
 * make. Split from the scenarios themselves (drill_failover.c,
 * drill_tools_jobs.c) so that each reads as its story; declared in
 * drill_impl.h.
 */
#include "drill/drill_impl.h"

#include "common/alloc.h"
#include "device/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROMPT "Once upon a time"

/* ---- requests ---------------------------------------------------------------------- */

void dr__request_body(char *buf, size_t cap, int max_tokens, bool stream)
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

typedef struct watch {
    dr_request *r;
    dr__hangup_fn hangup;
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

void dr__append_tokens(dr_request *r, json_t *ids)
{
    for (size_t i = 0; i < json_array_size(ids); i++)
        if (r->n_tokens < DR_MAX_TOKENS)
            r->tokens[r->n_tokens++] = (int)json_integer_value(json_array_get(ids, i));
}

void dr__append_text(dr_request *r, const char *t)
{
    if (!t)
        return;
    size_t have = strlen(r->text);
    snprintf(r->text + have, sizeof r->text - have, "%s", t);
}

/* A response body's id names the request: OpenAI's chatcmpl-/cmpl- before
 * its X-Request-Id, as the workers give it (or the id itself). */
static bool body_id_is(const char *id, const char *rid)
{
    if (!id)
        return false;
    if (!strncmp(id, "chatcmpl-", 9))
        id += 9;
    else if (!strncmp(id, "cmpl-", 5))
        id += 5;
    return !strcmp(id, rid);
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
        json_t *j = json_loads(w->body, JSON_ALLOW_NUL, NULL);
        r->complete = w->complete && j != NULL;
        r->framing_ok = j != NULL;
        json_t *err = json_object_get(j, "error");
        if (err) {
            snprintf(r->error_code, sizeof r->error_code, "%s",
                     json_string_value(json_object_get(err, "code")) ?: "");
        } else if (j) {
            if (!body_id_is(json_string_value(json_object_get(j, "id")), r->id))
                r->ids_match = false;
            json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
            dr__append_text(r, json_string_value(json_object_get(c0, "text")));
            dr__append_text(r, json_string_value(
                               json_object_get(json_object_get(c0, "message"), "content")));
            snprintf(r->finish, sizeof r->finish, "%s",
                     json_string_value(json_object_get(c0, "finish_reason")) ?: "");
            dr__append_tokens(r, json_object_get(json_object_get(j, "spillway"), "token_ids"));
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
        json_t *j = json_loads(ev[i], JSON_ALLOW_NUL, NULL);
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
        if (!body_id_is(json_string_value(json_object_get(j, "id")), r->id))
            r->ids_match = false;
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        dr__append_text(r, json_string_value(json_object_get(c0, "text")));
        dr__append_text(r, json_string_value(
                               json_object_get(json_object_get(c0, "delta"), "content")));
        const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
        if (fr)
            snprintf(r->finish, sizeof r->finish, "%s", fr);
        dr__append_tokens(r, json_object_get(json_object_get(j, "spillway"), "token_ids"));
        json_decref(j);
    }
    dh_sse_free(ev, n > 0 ? n : 0);
    r->complete = w->complete && r->done_events == 1 && !r->error_code[0];
}

/* Sends one request as a client would and records everything it sees. */
void dr__send_request(drill *d, const char *address, dr_request *r, const char *path,
                      const char *body, const char *extra_headers, dr__hangup_fn hangup,
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
    dh_exchange(address, "POST", path, headers, body, DR_TIMEOUT_MS, on_body, &w, &resp);
    if (resp.status == 0 && !resp.stopped && resp.broken &&
        (resp.t_end - r->t_send) * 1000.0 >= DR_TIMEOUT_MS - 100)
        r->timed_out = true;
    parse_answer(r, &resp);
    if (r->t_first_token == 0 && !r->stream && r->n_tokens > 0)
        r->t_first_token = r->t_end;
    dh_response_free(&resp);
}

/* The reference: the same body, uninterrupted, straight to the CPU worker. */
int dr__reference(const char *cpu_sock, int max_tokens, int *tokens, int *n_out)
{
    char body[512];
    dr__request_body(body, sizeof body, max_tokens, false);
    dh_response w;
    dh_exchange(cpu_sock, "POST", "/v1/completions", "X-Request-Id: drill-reference\r\n", body,
                DR_TIMEOUT_MS, NULL, NULL, &w);
    int n = 0;
    json_t *j = w.status == 200 && w.body ? json_loads(w.body, JSON_ALLOW_NUL, NULL) : NULL;
    json_t *ids = json_object_get(json_object_get(j, "spillway"), "token_ids");
    for (size_t i = 0; i < json_array_size(ids) && n < DR_MAX_TOKENS; i++)
        tokens[n++] = (int)json_integer_value(json_array_get(ids, i));
    json_decref(j);
    dh_response_free(&w);
    *n_out = n;
    return n == max_tokens ? 0 : -1;
}

void dr__compare_ref(drill *d, dr_request *r, const int *ref, int n_ref)
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
void dr__attach_events(drill *d, const char *address, const char *scenario)
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
void dr__attach_events_wait(drill *d, const char *address, const char *scenario,
                            int min_matched)
{
    double t0 = dh_now();
    int last = -1;
    for (;;) {
        dr__attach_events(d, address, scenario);
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

char *dr__metrics_text(const char *address)
{
    dh_response w;
    dh_get(address, "/metrics", 10000, &w);
    char *t = w.status == 200 && w.body ? sw_strdup(w.body) : sw_strdup("");
    dh_response_free(&w);
    return t;
}

double dr__worker_ok(const char *sock)
{
    char *t = dr__metrics_text(sock);
    double v = dh_metric(t, "spillway_worker_requests_total{outcome=\"ok\"}");
    sw_free(t);
    return v;
}

double dr__worker_metric(const char *sock, const char *series)
{
    char *t = dr__metrics_text(sock);
    double v = dh_metric(t, series);
    sw_free(t);
    return v;
}

double dr__worker_requests_all(const char *sock)
{
    char *t = dr__metrics_text(sock);
    double v = dh_metric_sum(t, "spillway_worker_requests_total") +
               dh_metric(t, "spillway_worker_admission_refusals_total");
    sw_free(t);
    return v;
}

json_t *dr__worker_health(const char *sock)
{
    return dh_get_json(sock, "/health", 5000, NULL);
}

long long dr__health_int(json_t *h, const char *obj, const char *key)
{
    json_t *o = obj ? json_object_get(h, obj) : h;
    return json_integer_value(json_object_get(o, key));
}

long long dr__kv_used(const char *sock)
{
    json_t *h = dr__worker_health(sock);
    long long v = h ? dr__health_int(h, "memory", "kv_used_bytes") : -1;
    json_decref(h);
    return v;
}

json_t *dr__router_worker(const char *address, const char *name)
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
bool dr__wait_restarted(const char *address, const char *name, int min_restarts,
                        int timeout_s, int *restarts_out, char *state_out)
{
    double t0 = dh_now();
    while (dh_now() - t0 < timeout_s && !dr_interrupted) {
        json_t *w = dr__router_worker(address, name);
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

bool dr__kv_sliding(const dr_kv_figures *k)
{
    return k->block_tokens > 0 && k->block_bytes > 0 && k->sliding_bytes > 0 &&
           k->sliding_bytes <= k->block_bytes && k->sliding_max > 0;
}

long long dr__kv_bytes_for_tokens(const dr_kv_figures *k, long long tokens)
{
    if (!dr__kv_sliding(k))
        return tokens * k->per_token;
    long long b = (tokens + k->block_tokens - 1) / k->block_tokens;
    return b * k->block_bytes - (b > k->sliding_max ? (b - k->sliding_max) * k->sliding_bytes : 0);
}

long long dr__kv_tokens_fitting(const dr_kv_figures *k, long long bytes)
{
    if (!dr__kv_sliding(k))
        return k->per_token > 0 ? bytes / k->per_token : 0;
    long long b, within = k->sliding_max * k->block_bytes;
    long long past = k->block_bytes - k->sliding_bytes; /* a block beyond the window */
    if (bytes < within)
        b = bytes / k->block_bytes;
    else
        b = past > 0 ? k->sliding_max + (bytes - within) / past : (1ll << 40);
    return b * k->block_tokens;
}

/* The figures of a worker's /health (docs/api.md). */
static dr_kv_figures kv_figures(json_t *h)
{
    dr_kv_figures k = {
        .per_token = dr__health_int(h, NULL, "kv_bytes_per_token"),
        .block_tokens = dr__health_int(h, "kv", "block_tokens"),
        .block_bytes = dr__health_int(h, "kv", "block_device_bytes"),
        .sliding_bytes = dr__health_int(h, "kv", "sliding_block_device_bytes"),
        .sliding_max = dr__health_int(h, "kv", "sliding_blocks_max"),
    };
    return k;
}

/* Takes GPU memory so that about `tokens` tokens of KV stay free there,
 * then waits until the router has seen it. */
int dr__leave_free_tokens(drill *d, dr_router *rt, const char *scenario, int tokens)
{
    json_t *h = dr__worker_health(rt->gpu_sock);
    long long free_bytes = dr__health_int(h, "memory", "free_bytes");
    dr_kv_figures kv = kv_figures(h);
    long long kvpt = kv.per_token;
    json_decref(h);
    if (kvpt <= 0 || free_bytes <= 0)
        return -1;
    /* a sliding-window model's tokens past the window cost less */
    long long keep = dr__kv_bytes_for_tokens(&kv, tokens);
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
        json_t *w = dr__router_worker(rt->address, "gpu");
        long long f = json_integer_value(json_object_get(w, "memory_free_bytes"));
        json_decref(w);
        if (f <= keep + 16 * kvpt)
            return 0;
        dh_sleep_ms(50);
    }
    return -1;
}

pid_t dr__gpu_pid(const char *address)
{
    json_t *w = dr__router_worker(address, "gpu");
    pid_t pid = (pid_t)json_integer_value(json_object_get(w, "pid"));
    json_decref(w);
    return pid;
}

/* Writes the two worker sections of a generated configuration. */
void dr__workers_ini(drill *d, char *buf, size_t cap, const char *policy, const char *gpu_fault,
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

bool dr__start_router(drill *d, dr_scenario *s, const char *name, const char *server_extra,
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

void dr__stop_router(drill *d, dr_scenario *s)
{
    dr_hog_release(d);
    if (d->attached)
        return;
    int st = dr_router_stop(d, &d->router);
    if (st != 0)
        dr_check_add(d, s, DR_V_NONE, false, "router stopped cleanly",
                 "exit status %d (log: %s)", st, d->router.log);
}

void dr__check_identity(drill *d, dr_scenario *s, dr_request *r)
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
void dr__check_failover(drill *d, dr_scenario *s, dr_request *r, const char *want_decision,
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
    dr__check_identity(d, s, r);
}

static void *async_thread(void *arg)
{
    dr__async_req *a = arg;
    dr__send_request(a->d, a->address, a->r, "/v1/completions", a->body,
                     a->headers[0] ? a->headers : NULL, a->hangup, a->user);
    return NULL;
}

bool dr__async_start(dr__async_req *a)
{
    a->started = pthread_create(&a->th, NULL, async_thread, a) == 0;
    return a->started;
}

void dr__async_join(dr__async_req *a)
{
    if (a->started)
        pthread_join(a->th, NULL);
    a->started = false;
}

/* Waits until the GPU worker holds KV memory (a request runs there). */
bool dr__wait_gpu_busy(const char *gpu_sock, long long base_kv, int timeout_ms)
{
    double t0 = dh_now();
    while ((dh_now() - t0) * 1000.0 < timeout_ms && !dr_interrupted) {
        if (dr__kv_used(gpu_sock) > base_kv)
            return true;
        dh_sleep_ms(3);
    }
    return false;
}

/* Takes every byte the GPU worker could still allocate. */
int dr__take_gpu_free(drill *d, const char *gpu_sock, const char *scenario)
{
    json_t *h = dr__worker_health(gpu_sock);
    long long f = dr__health_int(h, "memory", "free_bytes");
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
