/* drill_scenarios.c - the seed's experiment as six scenarios, each with
 * its pass/fail checks (docs/drill.md describes them for users). This file
 * holds their list, the bookkeeping every scenario writes into (requests,
 * marks, checks, verdicts) and the loop that runs them; the scenarios live
 * in drill_failover.c (s1-s4) and drill_tools_jobs.c (s5, s6), the steps
 * they share in drill_steps.c.
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
#include "drill/drill_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

void dr__skip(drill *d, dr_scenario *s, const char *fmt, ...)
{
    s->state = DR_SKIPPED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->skip_reason, sizeof s->skip_reason, fmt, ap);
    va_end(ap);
    dr_progress(d, "[%s] skipped: %s", s->id, s->skip_reason);
}

void dr__begin(drill *d, dr_scenario *s)
{
    s->t_start = dh_now();
    snprintf(d->progress_scenario, sizeof d->progress_scenario, "%s", s->id);
    dr_progress(d, "[%s] %s", s->id, s->title);
}

void dr__finish(drill *d, dr_scenario *s)
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

void dr_run_all(drill *d)
{
    void (*const run[DR_N_SCENARIOS])(drill *, dr_scenario *) = {
        dr__s1_run, dr__s2_run, dr__s3_run, dr__s4_run, dr__s5_run, dr__s6_run};
    /* a llama-server pair: what can be proven without spillway's fault
     * points and figures (drill_llamaserver.c) */
    void (*const run_ls[DR_N_SCENARIOS])(drill *, dr_scenario *) = {
        dr__ls_not_applicable, dr__ls_s2_run, dr__ls_not_applicable,
        dr__ls_s4_run,         dr__ls_not_applicable, dr__ls_not_applicable};
    for (int i = 0; i < DR_N_SCENARIOS && !dr_interrupted; i++)
        (d->ls_pair ? run_ls : run)[i](d, &d->scenarios[i]);
}
