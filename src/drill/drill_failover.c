/* drill_failover.c - the drill's scenarios s1-s4 (docs/drill.md), the
 * ones that fail the GPU worker under requests and check the failover:
 *
 *   s1 a request too big for the GPU's free memory (reserve: the CPU up
 *      front; grow: out of memory mid-generation, replayed);
 *   s2 a stream whose GPU worker crashes before / after its first tokens
 *      (replayed / resumed as one stream);
 *   s3 the client hangs up during failover (KV memory back at baseline);
 *   s4 concurrent traffic while the GPU worker is killed and while it runs
 *      out of memory (nothing lost, the worker restarted).
 *
 * Split from drill_scenarios.c by what the scenarios exercise; the steps
 * they share are in drill_steps.c.
 */
#include "drill/drill_impl.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

void dr__s1_run(drill *d, dr_scenario *s)
{
    char workers[2048], body[512];
    int ref[DR_MAX_TOKENS], n_ref = 0;
    dr__begin(d, s);
    if (d->attached) {
        /* Attached: the reserve half only, sized from the router's /health. */
        json_t *g = dr__router_worker(d->router.address, "gpu");
        json_t *c = dr__router_worker(d->router.address, "cpu");
        long long fb = json_integer_value(json_object_get(g, "memory_free_bytes"));
        long long kv = json_integer_value(json_object_get(g, "kv_bytes_per_token"));
        long long cctx = json_integer_value(json_object_get(c, "ctx_limit"));
        json_t *rep = json_object_get(g, "reported");
        dr_kv_figures fig = {
            .per_token = kv,
            .block_tokens = json_integer_value(json_object_get(rep, "kv_block_tokens")),
            .block_bytes = json_integer_value(json_object_get(rep, "kv_block_device_bytes")),
            .sliding_bytes =
                json_integer_value(json_object_get(rep, "kv_sliding_block_device_bytes")),
            .sliding_max = json_integer_value(json_object_get(rep, "kv_sliding_blocks_max")),
        };
        json_decref(g);
        json_decref(c);
        long long need = kv > 0 ? dr__kv_tokens_fitting(&fig, fb) + 64 : 0;
        if (!kv || !cctx || need + 16 >= cctx || need > DR_MAX_TOKENS) {
            dr__skip(d, s, "attached: needs workers named 'gpu' and 'cpu', and a CPU context "
                       "longer than the GPU's free KV (%lld tokens)", need);
            return;
        }
        dr_request *r = dr_request_new(d, s->id, "s1-reserve-big", "too big for the GPU: CPU up front");
        dr__request_body(body, sizeof body, (int)need, false);
        dr__send_request(d, d->router.address, r, "/v1/completions", body, NULL, NULL, NULL);
        dr__attach_events_wait(d, d->router.address, s->id, 0);
        dr_check_add(d, s, DR_V_NONE, r->status == 200 && r->complete, "answered", "status %d, %d tokens",
                 r->status, r->n_tokens);
        dr_check_add(d, s, DR_V_NONE, !strcmp(r->worker, "cpu") && r->attempts == 1 && !r->has_event,
                 "routed to the CPU up front", "worker '%s', attempts %d%s", r->worker, r->attempts,
                 r->has_event ? ", with a failover" : "");
        dr__check_identity(d, s, r);
        r->ok = r->status == 200;
        dr__finish(d, s);
        return;
    }

    /* reserve: too big for the GPU's free memory -> the CPU, no error */
    dr__workers_ini(d, workers, sizeof workers, "reserve", NULL, NULL);
    if (!dr__start_router(d, s, "s1-reserve", NULL, workers))
        goto done;
    dr_router *rt = &d->router;
    if (dr__reference(rt->cpu_sock, DR_BIG_TOKENS, ref, &n_ref)) {
        dr_check_add(d, s, DR_V_NONE, false, "reference run", "the CPU worker gave %d tokens", n_ref);
        goto done;
    }
    if (dr__leave_free_tokens(d, rt, s->id, DR_FREE_TOKENS)) {
        dr_check_add(d, s, DR_V_NONE, false, "GPU memory taken", "the router did not see it");
        goto done;
    }
    dr_request *small = dr_request_new(d, s->id, "s1-small", "fits the GPU");
    dr__request_body(body, sizeof body, 16, false);
    dr__send_request(d, rt->address, small, "/v1/completions", body, NULL, NULL, NULL);
    small->ok = small->status == 200 && !strcmp(small->worker, "gpu");
    dr_check_add(d, s, DR_V_NONE, small->ok, "a request that fits runs on the GPU",
             "status %d on '%s'", small->status, small->worker);
    double gpu0 = dr__worker_requests_all(rt->gpu_sock), cpu0 = dr__worker_ok(rt->cpu_sock);
    dr_request *big = dr_request_new(d, s->id, "s1-reserve-big",
                                     "reserve: too big for the GPU, CPU up front");
    dr__request_body(body, sizeof body, DR_BIG_TOKENS, false);
    dr_progress(d, "[%s] reserve: %d tokens, %d fit on the GPU", s->id, DR_BIG_TOKENS,
                DR_FREE_TOKENS);
    dr__send_request(d, rt->address, big, "/v1/completions", body, NULL, NULL, NULL);
    dr__attach_events_wait(d, rt->address, s->id, 0);
    dr__compare_ref(d, big, ref, n_ref);
    double gpu1 = dr__worker_requests_all(rt->gpu_sock), cpu1 = dr__worker_ok(rt->cpu_sock);
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
    dr__check_identity(d, s, big);
    dr__stop_router(d, s);
    if (dr_interrupted)
        goto done;

    /* grow: admitted to the GPU, then a second model takes the memory:
     * out of memory in decode, replayed on the CPU. */
    dr__workers_ini(d, workers, sizeof workers, "grow", "stall_ms:20", NULL);
    if (!dr__start_router(d, s, "s1-grow", NULL, workers))
        goto done;
    rt = &d->router;
    if (dr__reference(rt->cpu_sock, 64, ref, &n_ref)) {
        dr_check_add(d, s, DR_V_NONE, false, "reference run", "the CPU worker gave %d tokens", n_ref);
        goto done;
    }
    long long gkv0 = dr__kv_used(rt->gpu_sock);
    cpu0 = dr__worker_ok(rt->cpu_sock);
    dr__async_req a = {.d = d, .address = rt->address};
    a.r = dr_request_new(d, s->id, "s1-grow-oom", "grow: OOM mid-generation, replayed");
    if (!a.r)
        goto done;
    dr__request_body(a.body, sizeof a.body, 64, false);
    dr_progress(d, "[%s] grow: 64 tokens on the GPU, a second model takes its memory", s->id);
    if (!dr__async_start(&a))
        goto done;
    bool busy = dr__wait_gpu_busy(rt->gpu_sock, gkv0, 20000);
    if (busy)
        dr__take_gpu_free(d, rt->gpu_sock, s->id);
    dr__async_join(&a);
    dr_hog_release(d);
    dr_mark_add(d, s->id, "hog_release", "the second model gives the memory back");
    dr_check_add(d, s, DR_V_NONE, busy, "the request started on the GPU",
             busy ? "KV memory taken on the GPU worker" : "the GPU worker never held it");
    dr__attach_events_wait(d, rt->address, s->id, 1);
    dr__compare_ref(d, a.r, ref, n_ref);
    cpu1 = dr__worker_ok(rt->cpu_sock);
    dr__check_failover(d, s, a.r, "replay", "oom", cpu1 - cpu0, n_ref);
    a.r->ok = a.r->status == 200 && a.r->has_event;
done:
    dr__stop_router(d, s);
    dr__finish(d, s);
}

static bool never(void *u, dr_request *r, int n)
{
    (void)u;
    (void)r;
    (void)n;
    return false;
}

void dr__s2_run(drill *d, dr_scenario *s)
{
    dr__begin(d, s);
    if (d->attached) {
        dr__skip(d, s, "needs fault injection in a managed GPU worker (SPILLWAY_FAULT)");
        return;
    }
    static const int ks[2] = {0, 5};
    for (int t = 0; t < 2 && !dr_interrupted; t++) {
        char workers[2048], fault[64], name[32], id[64], body[512];
        int ref[DR_MAX_TOKENS], n_ref = 0;
        snprintf(fault, sizeof fault, "abort_after_tokens:%d,stall_ms:20", ks[t]);
        snprintf(name, sizeof name, "s2-crash-after-%d", ks[t]);
        dr__workers_ini(d, workers, sizeof workers, "reserve", fault, NULL);
        if (!dr__start_router(d, s, name, NULL, workers))
            break;
        dr_router *rt = &d->router;
        if (dr__reference(rt->cpu_sock, 24, ref, &n_ref)) {
            dr_check_add(d, s, DR_V_NONE, false, "reference run", "the CPU worker gave %d tokens", n_ref);
            dr__stop_router(d, s);
            break;
        }
        double cpu0 = dr__worker_ok(rt->cpu_sock);
        snprintf(id, sizeof id, "s2-stream-crash-%d", ks[t]);
        dr_request *r = dr_request_new(d, s->id, id,
                                       ks[t] ? "stream, GPU crash after 5 tokens: resumed"
                                             : "stream, GPU crash before the first token");
        dr__request_body(body, sizeof body, 24, true);
        dr_progress(d, "[%s] stream of 24 tokens, the GPU worker aborts after %d", s->id, ks[t]);
        dr__send_request(d, rt->address, r, "/v1/completions", body, NULL, never, NULL);
        dr__attach_events_wait(d, rt->address, s->id, 1);
        dr__compare_ref(d, r, ref, n_ref);
        double cpu1 = dr__worker_ok(rt->cpu_sock);
        dr__check_failover(d, s, r, ks[t] ? "resume" : "replay", "worker_crash", cpu1 - cpu0,
                           n_ref);
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
        dr__stop_router(d, s);
    }
    dr__finish(d, s);
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
    json_t *h = dr__worker_health(cpu_sock);
    int n = (int)dr__health_int(h, "slots", "active");
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

void dr__s3_run(drill *d, dr_scenario *s)
{
    dr__begin(d, s);
    if (d->attached) {
        dr__skip(d, s, "needs fault injection in a managed GPU worker (SPILLWAY_FAULT)");
        return;
    }
    char workers[2048];
    /* 20 slow tokens on the GPU: time enough for both requests to start
     * there before it aborts */
    dr__workers_ini(d, workers, sizeof workers, "reserve", "abort_after_tokens:20,stall_ms:20",
                    "stall_ms:30");
    if (!dr__start_router(d, s, "s3-cancel", NULL, workers)) {
        dr__finish(d, s);
        return;
    }
    dr_router *rt = &d->router;
    long long cpu_kv0 = dr__kv_used(rt->cpu_sock), gpu_kv0 = dr__kv_used(rt->gpu_sock);
    uint64_t pool0 = 0;
    bool have_pool = dr_pool_used(d, &pool0) == 0;
    double cancelled0 = dr__worker_metric(rt->cpu_sock, "spillway_worker_requests_total{outcome=\"cancelled\"}");
    cancel_state cs = {.d = d, .cpu_sock = rt->cpu_sock};
    dr__async_req st = {.d = d, .address = rt->address, .hangup = hangup_stream, .user = &cs};
    dr__async_req ns = {.d = d, .address = rt->address, .hangup = hangup_replay, .user = &cs};
    st.r = dr_request_new(d, s->id, "s3-stream-cancel", "stream resumed on the CPU, client leaves");
    ns.r = dr_request_new(d, s->id, "s3-replay-cancel", "replayed on the CPU, client leaves");
    if (!st.r || !ns.r) {
        dr__finish(d, s);
        return;
    }
    dr__request_body(st.body, sizeof st.body, 400, true);
    dr__request_body(ns.body, sizeof ns.body, 500, false);
    dr_progress(d, "[%s] a stream and a request on the GPU; it aborts after 20 tokens; the "
                   "clients hang up while the CPU serves them", s->id);
    dr__async_start(&st);
    dr__async_start(&ns);
    dr__async_join(&st);
    dr__async_join(&ns);
    /* KV memory back at baseline on the CPU worker */
    double t0 = dh_now();
    long long cpu_kv = dr__kv_used(rt->cpu_sock);
    while (cpu_kv != cpu_kv0 && dh_now() - t0 < 10 && !dr_interrupted) {
        dh_sleep_ms(20);
        cpu_kv = dr__kv_used(rt->cpu_sock);
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
        dr__attach_events(d, rt->address, s->id);
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
        dr__check_identity(d, s, r);
    }
    double cancelled1 = 0;
    t0 = dh_now();
    do {
        cancelled1 = dr__worker_metric(rt->cpu_sock, "spillway_worker_requests_total{outcome=\"cancelled\"}");
        if (cancelled1 - cancelled0 >= 2)
            break;
        dh_sleep_ms(50);
    } while (dh_now() - t0 < 5 && !dr_interrupted);
    dr_check_add(d, s, DR_V_NONE, cancelled1 - cancelled0 == 2, "the CPU worker cancelled both",
             "cancelled requests %.0f -> %.0f", cancelled0, cancelled1);
    /* The GPU worker died mid-request: its memory must be back, whether
     * it was restarted (its KV at baseline) or not (the pool says so). */
    bool up = dr__wait_restarted(rt->address, "gpu", 1, 15, NULL, NULL);
    if (up) {
        long long g = dr__kv_used(rt->gpu_sock);
        dr_check_add(d, s, DR_V_NONE, g == gpu_kv0, "GPU worker KV back at baseline",
                 "restarted; kv_used_bytes %lld (baseline %lld)", g, gpu_kv0);
    } else {
        uint64_t pool1 = 0;
        bool ok = have_pool && dr_pool_used(d, &pool1) == 0 && pool1 <= pool0;
        dr_check_add(d, s, DR_V_NONE, ok, "GPU memory back at baseline",
                 "not restarted; device memory used %llu bytes (baseline %llu)",
                 (unsigned long long)pool1, (unsigned long long)pool0);
    }
    dr__stop_router(d, s);
    dr__finish(d, s);
}

/* s4: concurrent mixed traffic while the GPU worker fails. */
#define S4_MAX 16

static void s4_half(drill *d, dr_scenario *s, bool oom)
{
    char workers[2048], name[32];
    int ref_small[DR_MAX_TOKENS], ref_big[DR_MAX_TOKENS], n_small = 0, n_big = 0;
    const int small_tokens = 40;
    snprintf(name, sizeof name, oom ? "s4-oom" : "s4-kill");
    dr__workers_ini(d, workers, sizeof workers, oom ? "grow" : "reserve", "stall_ms:20", NULL);
    if (!dr__start_router(d, s, name, NULL, workers))
        return;
    dr_router *rt = &d->router;
    if (dr__reference(rt->cpu_sock, small_tokens, ref_small, &n_small) ||
        dr__reference(rt->cpu_sock, DR_BIG_TOKENS, ref_big, &n_big)) {
        dr_check_add(d, s, DR_V_NONE, false, "reference runs", "the CPU worker gave %d and %d tokens",
                 n_small, n_big);
        dr__stop_router(d, s);
        return;
    }
    if (dr__leave_free_tokens(d, rt, s->id, DR_FREE_TOKENS)) {
        dr_check_add(d, s, DR_V_NONE, false, "GPU memory taken", "the router did not see it");
        dr__stop_router(d, s);
        return;
    }
    long long gkv0 = dr__kv_used(rt->gpu_sock);
    double cpu0 = dr__worker_ok(rt->cpu_sock);
    int n = d->quick ? 8 : S4_MAX;
    static dr__async_req reqs[S4_MAX];
    for (int i = 0; i < n; i++) {
        dr__async_req *a = &reqs[i];
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
        dr__request_body(a->body, sizeof a->body, big ? DR_BIG_TOKENS : small_tokens, stream);
        if (stream)
            a->hangup = never;
        dr__async_start(a);
    }
    bool busy = dr__wait_gpu_busy(rt->gpu_sock, gkv0, 20000);
    if (busy && !oom) {
        pid_t pid = dr__gpu_pid(rt->address);
        if (pid > 0 && kill(pid, SIGKILL) == 0)
            dr_mark_add(d, s->id, "sigkill", "SIGKILL to the GPU worker (pid %d)", (int)pid);
        else
            busy = false;
    } else if (busy) {
        busy = dr__take_gpu_free(d, rt->gpu_sock, s->id) == 0;
    }
    dr_progress(d, "[%s] %d concurrent requests; the GPU worker %s", s->id, n,
                oom ? "runs out of memory" : "is killed (SIGKILL)");
    for (int i = 0; i < n; i++)
        dr__async_join(&reqs[i]);
    dr_hog_release(d);
    if (oom)
        dr_mark_add(d, s->id, "hog_release", "the second model gives the memory back");
    dr_check_add(d, s, DR_V_GPU_RECOVERED, busy, oom ? "the GPU ran out of memory under load"
                                                 : "the GPU worker was killed under load",
             busy ? "while it held requests" : "it never held a request");
    dr__attach_events_wait(d, rt->address, s->id, 1);
    int lost = 0, wrong = 0, on_cpu = 0, big_disturbed = 0, failovers = 0, id_bad = 0;
    char lost_ids[160] = "", wrong_ids[160] = "";
    for (int i = 0; i < n; i++) {
        dr_request *r = reqs[i].r;
        if (!r)
            continue;
        bool big = strstr(r->id, "-big") != NULL;
        dr__compare_ref(d, r, big ? ref_big : ref_small, big ? n_big : n_small);
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
    double cpu1 = dr__worker_ok(rt->cpu_sock);
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
    bool back = dr__wait_restarted(rt->address, "gpu", 1, 30, &restarts, state);
    dr_check_add(d, s, DR_V_GPU_RECOVERED, back, "the GPU worker was restarted",
                 "state '%s', %d restart(s) counted by the router", state, restarts);
    if (back) {
        dr_mark_add(d, s->id, "restart", "the GPU worker is back (%d restart(s))", restarts);
        char id[64], body[512];
        snprintf(id, sizeof id, "%s-after", name);
        dr_request *r = dr_request_new(d, s->id, id, "after the restart");
        dr__request_body(body, sizeof body, 8, false);
        dr__send_request(d, rt->address, r, "/v1/completions", body, NULL, NULL, NULL);
        r->ok = r->status == 200 && !strcmp(r->worker, "gpu");
        dr_check_add(d, s, DR_V_GPU_RECOVERED, r->ok, "the GPU worker serves again",
                 "status %d on '%s'", r->status, r->worker);
        snprintf(r->final_worker, sizeof r->final_worker, "%s", r->worker);
    }
    dr__stop_router(d, s);
}

void dr__s4_run(drill *d, dr_scenario *s)
{
    dr__begin(d, s);
    if (d->attached) {
        dr__skip(d, s, "needs to kill and starve a managed GPU worker");
        return;
    }
    s4_half(d, s, false);
    if (!dr_interrupted)
        s4_half(d, s, true);
    dr__finish(d, s);
}
