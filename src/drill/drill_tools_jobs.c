/* drill_tools_jobs.c - the drill's scenarios s5 and s6 (docs/drill.md),
 * the ones that exercise what the router does beyond one generation:
 *
 *   s5 an agent run with a server-side tool that the drill serves and
 *      counts, the GPU worker killed after the tool call: the replayed run
 *      takes the tool's result from the ledger, the tool is called once;
 *   s6 a deadline the CPU route cannot meet (an immediate typed 503), then
 *      the same request as a durable job, completed once.
 *
 * Split from drill_scenarios.c by what the scenarios exercise; the steps
 * they share are in drill_steps.c.
 */
#include "drill/drill_impl.h"

#include "common/alloc.h"
#include "router/router.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

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
                DR_TIMEOUT_MS, NULL, NULL, &w);
    json_t *j = w.status == 200 && w.body ? json_loads(w.body, JSON_ALLOW_NUL, NULL) : NULL;
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
    dr__send_request(a->d, a->address, a->r, "/v1/chat/completions", a->body, NULL, NULL, NULL);
    return NULL;
}

void dr__s5_run(drill *d, dr_scenario *s)
{
    char why[512];
    dr__begin(d, s);
    if (d->attached) {
        dr__skip(d, s,
                 "needs a tool server the router is configured with (the drill starts its own)");
        return;
    }
    if (!router_has_tools(d, why, sizeof why)) {
        dr__skip(d, s, "the router has no server-side tools yet ([tool NAME] sections: %s)", why);
        return;
    }
    if (dr_tool_server_start(&d->tools)) {
        dr_check_add(d, s, DR_V_NONE, false, "tool server", "cannot listen on 127.0.0.1");
        dr__finish(d, s);
        return;
    }
    d->tools.answer_delay_ms = 200;
    char workers[2048], server[1200];
    dr__workers_ini(d, workers, sizeof workers, "reserve", "stall_ms:20", NULL);
    snprintf(server, sizeof server,
             "max-tool-steps = 2\n\n[tool lookup]\ndescription = Looks up a word in the dictionary\n"
             "url = http://127.0.0.1:%d/lookup\n"
             "parameters = " S5_SCHEMA "\nidempotent = false\ntimeout-ms = 10000\n",
             d->tools.port);
    if (!dr__start_router(d, s, "s5-agent", server, workers)) {
        dr_tool_server_stop(&d->tools);
        dr__finish(d, s);
        return;
    }
    dr_router *rt = &d->router;
    if (!worker_has_tool_calls(rt->cpu_sock)) {
        dr__stop_router(d, s);
        dr_tool_server_stop(&d->tools);
        s->n_checks = 0;
        dr__skip(d, s, "the workers do not return tool_calls yet (a forced tool call to the CPU "
                   "worker came back without one)");
        return;
    }
    double cpu0 = dr__worker_ok(rt->cpu_sock);
    long long gkv0 = dr__kv_used(rt->gpu_sock);
    agent_req a = {.d = d, .address = rt->address};
    a.r = dr_request_new(d, s->id, "s5-agent-run", "agent run, GPU killed after the tool call");
    if (!a.r) {
        dr__stop_router(d, s);
        dr_tool_server_stop(&d->tools);
        dr__finish(d, s);
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
    if (called && dr__wait_gpu_busy(rt->gpu_sock, gkv0, 10000)) {
        pid_t pid = dr__gpu_pid(rt->address);
        if (pid > 0 && kill(pid, SIGKILL) == 0) {
            killed = true;
            dr_mark_add(d, s->id, "sigkill", "SIGKILL to the GPU worker (pid %d) during the "
                        "generation after the tool call", (int)pid);
        }
    }
    if (started)
        pthread_join(a.th, NULL);
    dr_request *r = a.r;
    dr__attach_events_wait(d, rt->address, s->id, 0);
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
    double cpu1 = dr__worker_ok(rt->cpu_sock);
    dr_check_add(d, s, DR_V_NONE, cpu1 - cpu0 >= 1, "the CPU worker finished the run",
                 "CPU worker ok %.0f -> %.0f", cpu0, cpu1);
    dr__check_identity(d, s, r);
    if (!r->final_worker[0])
        snprintf(r->final_worker, sizeof r->final_worker, "%s", r->worker);
    r->ok = r->status == 200 && dup == 0;
    dr__stop_router(d, s);
    dr_tool_server_stop(&d->tools);
    dr__finish(d, s);
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

/* The router's metrics once the requests it has answered are all counted:
 * it counts an attempt just after relaying its answer, so a client can read
 * the metrics between the two; read until two reads 100 ms apart agree on
 * router_sum_others (at most 2 s). The text is the caller's (sw_free). */
static char *settled_metrics(const char *address)
{
    char *m = dr__metrics_text(address);
    for (int i = 0; i < 20; i++) {
        dh_sleep_ms(100);
        char *again = dr__metrics_text(address);
        bool same = router_sum_others(m) == router_sum_others(again);
        sw_free(m);
        m = again;
        if (same)
            break;
    }
    return m;
}

static void s6_job(drill *d, dr_scenario *s, const int *ref, int n_ref)
{
    dr_router *rt = &d->router;
    char body[1024], inner[512];
    dr__request_body(inner, sizeof inner, DR_BIG_TOKENS, false);
    snprintf(body, sizeof body, "{\"endpoint\":\"completions\",\"request\":%s}", inner);
    double cpu0 = d->attached ? 0 : dr__worker_ok(rt->cpu_sock);
    double gpu0 = d->attached ? 0 : dr__worker_ok(rt->gpu_sock);
    dr_request *r = dr_request_new(d, s->id, "s6-job", "the same request as a durable job");
    if (!r)
        return;
    r->job = true;
    dh_response w;
    r->t_send = dh_now();
    snprintf(r->path, sizeof r->path, "/v1/spillway/jobs");
    r->max_tokens = DR_BIG_TOKENS;
    dh_exchange(rt->address, "POST", "/v1/spillway/jobs", "X-Request-Id: s6-job\r\n", body,
                DR_TIMEOUT_MS, NULL, NULL, &w);
    char loc[256] = "";
    dh_header(&w, "Location", loc, sizeof loc);
    dh_header(&w, "X-Request-Id", r->rid_out, sizeof r->rid_out);
    json_t *j = w.body ? json_loads(w.body, JSON_ALLOW_NUL, NULL) : NULL;
    snprintf(r->job_id, sizeof r->job_id, "%s", json_string_value(json_object_get(j, "id")) ?: "");
    int submit_status = w.status;
    json_decref(j);
    dh_response_free(&w);
    dr_check_add(d, s, DR_V_NONE, submit_status == 202 && r->job_id[0] && loc[0], "job accepted",
             "status %d, id '%s', Location '%s'", submit_status, r->job_id, loc);
    dr_progress(d, "[%s] job %s submitted; waiting for it", s->id, r->job_id);
    json_t *final = NULL;
    double t0 = dh_now();
    while (r->job_id[0] && dh_now() - t0 < DR_TIMEOUT_MS / 1000 && !dr_interrupted) {
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
    dr__append_tokens(r, json_object_get(json_object_get(resp, "spillway"), "token_ids"));
    json_t *c0 = json_array_get(json_object_get(resp, "choices"), 0);
    dr__append_text(r, json_string_value(json_object_get(c0, "text")));
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
        double cpu1 = dr__worker_ok(rt->cpu_sock), gpu1 = dr__worker_ok(rt->gpu_sock);
        snprintf(r->final_worker, sizeof r->final_worker, "%s",
                 cpu1 > cpu0 ? "cpu" : gpu1 > gpu0 ? "gpu" : "");
        snprintf(r->worker, sizeof r->worker, "%s", r->final_worker);
        dr__compare_ref(d, r, ref, n_ref);
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

void dr__s6_run(drill *d, dr_scenario *s)
{
    char workers[2048], body[512];
    int ref[DR_MAX_TOKENS], n_ref = 0;
    dr__begin(d, s);
    if (!d->attached) {
        dr__workers_ini(d, workers, sizeof workers, "reserve", NULL, NULL);
        if (!dr__start_router(d, s, "s6-deadline", NULL, workers))
            goto done;
        if (dr__reference(d->router.cpu_sock, DR_BIG_TOKENS, ref, &n_ref) ||
            dr__leave_free_tokens(d, &d->router, s->id, DR_FREE_TOKENS)) {
            dr_check_add(d, s, DR_V_NONE, false, "set-up", "reference run or GPU memory failed");
            goto done;
        }
    }
    dr_router *rt = &d->router;
    /* warm-up: each worker measures its rates */
    dr_request *warm = dr_request_new(d, s->id, "s6-warm-up", "warm-up (measures the CPU's rates)");
    dr__request_body(body, sizeof body, d->attached ? 64 : DR_BIG_TOKENS, false);
    dr__send_request(d, rt->address, warm, "/v1/completions", body, NULL, NULL, NULL);
    snprintf(warm->final_worker, sizeof warm->final_worker, "%s", warm->worker);
    warm->ok = warm->status == 200;
    double prefill = 0, decode = 0, t0 = dh_now();
    while (dh_now() - t0 < 10 && !dr_interrupted) {
        json_t *c = dr__router_worker(rt->address, "cpu");
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
    double predicted_ms = (8.0 / prefill + DR_BIG_TOKENS / decode) * 1000.0;
    int deadline_ms = predicted_ms >= 20 ? (int)(predicted_ms / 10) : 1;
    char *m0 = settled_metrics(rt->address); /* the warm-up counted */
    double seen0 = router_sum_others(m0);
    double refused0 = dh_metric(m0, "spillway_router_requests_total{worker=\"none\",outcome=\"capacity_exceeded\"}");
    sw_free(m0);
    char hdr[96];
    snprintf(hdr, sizeof hdr, "X-Spillway-Deadline-Ms: %d\r\n", deadline_ms);
    dr_request *r = dr_request_new(d, s->id, "s6-deadline", "deadline shorter than the CPU route");
    dr__request_body(body, sizeof body, DR_BIG_TOKENS, false);
    dr_progress(d, "[%s] %d tokens within %d ms (the CPU needs about %.0f ms)", s->id,
                DR_BIG_TOKENS, deadline_ms, predicted_ms);
    dr__send_request(d, rt->address, r, "/v1/completions", body, hdr, NULL, NULL);
    char *m1 = dr__metrics_text(rt->address);
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
    dr__check_identity(d, s, r);
    if (router_has_jobs(rt->address)) {
        if (d->attached && dr__reference(rt->address, DR_BIG_TOKENS, ref, &n_ref))
            n_ref = 0;
        s6_job(d, s, ref, n_ref);
    } else {
        dr_progress(d, "[%s] the job half is skipped: the router has no /v1/spillway/jobs yet", s->id);
        snprintf(s->skip_reason, sizeof s->skip_reason,
                 "the job half is skipped: the router has no /v1/spillway/jobs yet (404)");
    }
done:
    dr__stop_router(d, s);
    dr__finish(d, s);
}
