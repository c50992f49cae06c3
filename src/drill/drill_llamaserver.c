/* drill_llamaserver.c - the drill against a pair of llama-servers
 * (docs/drill.md, A llama-server pair; docs/engines.md, Both tiers): a
 * configuration whose two tiers are kind = llama-server workers the
 * router runs (`command =`), the first in preference order taken as the
 * GPU tier (e.g. -ngl 99) and the next as the CPU tier (-ngl 0), for a
 * model spillway's own engine may not run.
 *
 * What runs, with a failure that is real (SIGKILL of the GPU tier's
 * llama-server, sent by the drill):
 *   s2 a greedy stream killed after its first tokens: one unbroken
 *      stream, resumed on the CPU tier from the token ids sent, equal to
 *      the CPU tier's own continuation from those ids (its /completion
 *      with the token prompt, asked directly), the GPU tier restarted;
 *   s4 concurrent streams while the GPU tier is killed: every one
 *      answered in full, none with an error event, the GPU tier back and
 *      serving.
 * A failure before the first token (s2's first half on spillway workers)
 * is not made here: it needs a fault point inside the worker. What does
 * not run, and why (each scenario is reported as skipped with that
 * reason, never passed): s1 and s3 and s6 read what a spillway worker
 * publishes (device memory, KV bytes, the fault points that make an OOM,
 * calibrated rates); s5 times the kill with a fault point inside a
 * spillway worker.
 */
#include "drill/drill_impl.h"

#include "common/alloc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define LS_PROMPT "Once upon a time"
#define LS_TOKENS 200   /* a stream long enough to be killed in the middle */
#define LS_KILL_AFTER 5 /* tokens the client has when the GPU tier is killed */
#define LS_STREAMS 4    /* s4's concurrent streams */

int dr__ls_pick_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* The two worker sections: the user's commands at the drill's ports. */
static void ls_workers_ini(const drill *d, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "[worker gpu]\nkind = llama-server\nurl = http://127.0.0.1:%d\ncommand = %s\n%s"
             "\n[worker cpu]\nkind = llama-server\nurl = http://127.0.0.1:%d\ncommand = %s\n%s",
             d->ls_gpu_port, d->ls_gpu_command, d->ls_gpu_extra, d->ls_cpu_port,
             d->ls_cpu_command, d->ls_cpu_extra);
}

/* Waits until both tiers are ready and resumable (their /tokenize gave
 * the model's ids); false with a failed check otherwise. */
static bool ls_wait_ready(drill *d, dr_scenario *s)
{
    const char *names[2] = {"gpu", "cpu"};
    for (int k = 0; k < 2; k++) {
        bool ok = false;
        for (int i = 0; i < 600 && !ok && !dr_interrupted; i++) {
            json_t *w = dr__router_worker(d->router.address, names[k]);
            json_t *ls = json_object_get(w, "llama_server");
            ok = !strcmp(json_string_value(json_object_get(w, "state")) ?: "", "ready") &&
                 json_is_true(json_object_get(ls, "vocab_checked"));
            bool resumable = json_is_true(json_object_get(ls, "resumable"));
            json_decref(w);
            if (ok && !resumable) {
                dr_check_add(d, s, DR_V_NONE, false, "resumable",
                             "worker %s: its /tokenize does not give the model's token ids: "
                             "its streams cannot be resumed", names[k]);
                return false;
            }
            if (!ok)
                dh_sleep_ms(100);
        }
        if (!ok) {
            dr_check_add(d, s, DR_V_NONE, false, "ready", "worker %s (llama-server) never became "
                         "ready with its vocabulary checked (log: %s)", names[k], d->router.log);
            return false;
        }
    }
    return true;
}

/* Kills the GPU tier's llama-server once the stream has LS_KILL_AFTER
 * tokens (the client stays). */
typedef struct ls_killer {
    drill *d;
    const char *scenario;
    bool killed;
    int tokens_at_kill;
} ls_killer;

static bool kill_gpu_at(void *u, dr_request *r, int tokens)
{
    (void)r;
    ls_killer *k = u;
    if (k->killed || tokens < LS_KILL_AFTER)
        return false;
    k->killed = true;
    k->tokens_at_kill = tokens;
    pid_t pid = dr__gpu_pid(k->d->router.address);
    if (pid > 0 && kill(pid, SIGKILL) == 0)
        dr_mark_add(k->d, k->scenario, "sigkill",
                    "SIGKILL to the GPU tier's llama-server (pid %d) after %d tokens", (int)pid,
                    tokens);
    return false;
}

static void ls_body(char *buf, size_t cap, int max_tokens)
{
    snprintf(buf, cap,
             "{\"prompt\":\"" LS_PROMPT "\",\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             max_tokens);
}

/* The CPU tier's own continuation of the prompt after ids[0..k): its
 * /completion with a token prompt (the text, then the ids), greedy, n
 * tokens, asked directly; their count, -1 when it did not answer. */
static int ls_continuation(const drill *d, const int *ids, int k, int n, int *out)
{
    json_t *prompt = json_pack("[s]", LS_PROMPT);
    for (int i = 0; i < k; i++)
        json_array_append_new(prompt, json_integer(ids[i]));
    json_t *b = json_pack("{s:o, s:i, s:i, s:b, s:b, s:b}", "prompt", prompt, "n_predict", n,
                          "temperature", 0, "ignore_eos", 1, "return_tokens", 1, "cache_prompt",
                          0);
    char *body = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    char address[64];
    snprintf(address, sizeof address, "127.0.0.1:%d", d->ls_cpu_port);
    dh_response w;
    int got = -1;
    if (body && dh_exchange(address, "POST", "/completion", "Content-Type: application/json\r\n",
                            body, DR_TIMEOUT_MS, NULL, NULL, &w) == 0) {
        json_t *j = w.status == 200 && w.body ? json_loads(w.body, JSON_ALLOW_NUL, NULL) : NULL;
        json_t *t = json_object_get(j, "tokens");
        if (json_is_array(t)) {
            got = 0;
            for (size_t i = 0; i < json_array_size(t) && got < n; i++)
                out[got++] = (int)json_integer_value(json_array_get(t, i));
        }
        json_decref(j);
        dh_response_free(&w);
    }
    free(body);
    return got;
}

/* The checks of one stream that the GPU tier's death interrupted. */
static void ls_check_resumed(drill *d, dr_scenario *s, dr_request *r, int k_seen)
{
    dr_check_add(d, s, DR_V_COMPLETED_ONCE,
                 r->status == 200 && r->complete && !r->error_code[0] &&
                     r->n_tokens == r->max_tokens,
                 "answered", "%s: status %d%s%s, %d of %d tokens", r->id, r->status,
                 r->error_code[0] ? ", error " : "", r->error_code, r->n_tokens, r->max_tokens);
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, r->framing_ok && r->done_events == 1,
                 "one unbroken stream", "%s: strict SSE %s, %d [DONE]", r->id,
                 r->framing_ok ? "ok" : "BROKEN", r->done_events);
    dr_check_add(d, s, DR_V_COMPLETED_ONCE,
                 r->has_event && !strcmp(r->fe_worker, "gpu") && !strcmp(r->decision, "resume") &&
                     !strcmp(r->outcome, "completed") && !strcmp(r->replay_worker, "cpu"),
                 "resumed on the CPU tier",
                 "%s: first error %s on '%s', decision '%s', outcome '%s', finished on '%s'",
                 r->id, r->has_event ? r->fe_kind : "(no failover event)", r->fe_worker,
                 r->decision, r->outcome, r->replay_worker);
    /* the continuation is the CPU tier's own from the ids the client had
     * when the kill was sent (those, and any the GPU tier sent before it
     * died, are the GPU tier's) */
    int ref[DR_MAX_TOKENS];
    int want = r->n_tokens - k_seen;
    int n = k_seen > 0 && want > 0 ? ls_continuation(d, r->tokens, k_seen, want, ref) : -1;
    bool same = n == want && n > 0 && !memcmp(r->tokens + k_seen, ref, sizeof *ref * (size_t)n);
    r->ref_match = n < 0 ? -1 : same;
    dr_check_add(d, s, DR_V_COMPLETED_ONCE, same,
                 "output equals the CPU tier's own continuation",
                 "%s: tokens %d..%d against its /completion from the first %d ids: %s", r->id,
                 k_seen, r->n_tokens, k_seen,
                 n < 0 ? "it did not answer" : same ? "equal, token for token" : "DIFFERENT");
    dr_check_add(d, s, DR_V_NONE, r->connection_open && r->ev_client_connected != 0,
                 "client connection stayed open", "%s: %s", r->id,
                 r->connection_open ? "one response on one connection" : "the connection broke");
    dr__check_identity(d, s, r);
    r->ok = r->status == 200 && r->complete && same;
}

/* The GPU tier restarted by the router, and serving again. */
static void ls_check_recovered(drill *d, dr_scenario *s)
{
    int restarts = 0;
    char state[16] = "";
    bool back = dr__wait_restarted(d->router.address, "gpu", 1, 120, &restarts, state);
    char id[64], body[512];
    snprintf(id, sizeof id, "%s-after", s->id);
    dr_request *r = dr_request_new(d, s->id, id, "a stream after the GPU tier came back");
    bool served = false;
    if (back && r) {
        ls_body(body, sizeof body, 16);
        dr__send_request(d, d->router.address, r, "/v1/completions", body, NULL, NULL, NULL);
        served = r->status == 200 && r->complete && !strcmp(r->worker, "gpu");
        r->ok = served;
    }
    dr_check_add(d, s, DR_V_GPU_RECOVERED, back && served, "GPU tier back and serving",
                 "restarts %d, state %s; the next stream %s", restarts, state,
                 served ? "was served by gpu" : "was NOT served by gpu");
}

void dr__ls_s2_run(drill *d, dr_scenario *s)
{
    snprintf(s->title, sizeof s->title, "streaming: the GPU tier's llama-server SIGKILLed after "
             "%d tokens (resumed on the CPU tier)", LS_KILL_AFTER);
    dr__begin(d, s);
    char workers[8192], body[512];
    ls_workers_ini(d, workers, sizeof workers);
    if (!dr__start_router(d, s, "s2-llama-server-pair", NULL, workers)) {
        dr__finish(d, s);
        return;
    }
    if (ls_wait_ready(d, s)) {
        dr_request *r = dr_request_new(d, s->id, "s2-ls-stream-kill",
                                       "stream, GPU tier SIGKILLed after 5 tokens: resumed");
        ls_killer k = {.d = d, .scenario = s->id};
        ls_body(body, sizeof body, LS_TOKENS);
        dr_progress(d, "[%s] stream of %d tokens; SIGKILL to the GPU tier after %d", s->id,
                    LS_TOKENS, LS_KILL_AFTER);
        dr__send_request(d, d->router.address, r, "/v1/completions", body, NULL, kill_gpu_at, &k);
        dr__attach_events_wait(d, d->router.address, s->id, 1);
        if (!k.killed)
            dr_check_add(d, s, DR_V_NONE, false, "killed mid-stream",
                         "the stream ended before %d tokens came", LS_KILL_AFTER);
        else if (!r->has_event)
            dr_check_add(d, s, DR_V_NONE, false, "killed mid-stream",
                         "%s: no failover event: the stream ended before the kill took effect "
                         "(a longer stream or a slower model shows it)", r->id);
        else
            ls_check_resumed(d, s, r, k.tokens_at_kill);
        ls_check_recovered(d, s);
    }
    dr__stop_router(d, s);
    dr__finish(d, s);
}

typedef struct ls_stream {
    dr__async_req a;
    ls_killer *killer;
} ls_stream;

void dr__ls_s4_run(drill *d, dr_scenario *s)
{
    snprintf(s->title, sizeof s->title, "concurrent streams while the GPU tier's llama-server is "
             "SIGKILLed");
    dr__begin(d, s);
    char workers[8192];
    ls_workers_ini(d, workers, sizeof workers);
    if (!dr__start_router(d, s, "s4-llama-server-pair", NULL, workers)) {
        dr__finish(d, s);
        return;
    }
    if (ls_wait_ready(d, s)) {
        int n = d->quick ? 2 : LS_STREAMS;
        ls_stream st[LS_STREAMS];
        ls_killer k = {.d = d, .scenario = s->id};
        memset(st, 0, sizeof st);
        dr_progress(d, "[%s] %d concurrent streams of %d tokens; SIGKILL to the GPU tier once "
                    "the first has %d", s->id, n, LS_TOKENS, LS_KILL_AFTER);
        for (int i = 0; i < n; i++) {
            char id[64], label[96];
            snprintf(id, sizeof id, "s4-ls-stream-%d", i);
            snprintf(label, sizeof label, "concurrent stream %d, GPU tier SIGKILLed", i);
            st[i].a.d = d;
            st[i].a.address = d->router.address;
            st[i].a.r = dr_request_new(d, s->id, id, label);
            ls_body(st[i].a.body, sizeof st[i].a.body, LS_TOKENS);
            st[i].a.hangup = i == 0 ? kill_gpu_at : NULL;
            st[i].a.user = i == 0 ? &k : NULL;
            if (st[i].a.r)
                dr__async_start(&st[i].a);
        }
        for (int i = 0; i < n; i++)
            dr__async_join(&st[i].a);
        dr__attach_events_wait(d, d->router.address, s->id, 1);
        int answered = 0, failed_over = 0, resumed = 0;
        for (int i = 0; i < n; i++) {
            dr_request *r = st[i].a.r;
            if (!r)
                continue;
            bool ok = r->status == 200 && r->complete && !r->error_code[0] &&
                      r->framing_ok && r->done_events == 1 && r->n_tokens == LS_TOKENS;
            answered += ok;
            failed_over += r->has_event;
            resumed += r->has_event && !strcmp(r->decision, "resume") &&
                       !strcmp(r->outcome, "completed");
            r->ok = ok;
            dr__check_identity(d, s, r);
        }
        dr_check_add(d, s, DR_V_COMPLETED_ONCE, k.killed && answered == n,
                     "every stream answered in full",
                     "%d of %d streams: 200, %d tokens, one [DONE], no error event%s", answered, n,
                     LS_TOKENS, k.killed ? "" : " (the GPU tier was never killed)");
        dr_check_add(d, s, DR_V_COMPLETED_ONCE, failed_over > 0 && resumed == failed_over,
                     "the interrupted ones resumed",
                     "%d stream(s) had the GPU tier's failure, %d resumed on the CPU tier",
                     failed_over, resumed);
        ls_check_recovered(d, s);
    }
    dr__stop_router(d, s);
    dr__finish(d, s);
}

void dr__ls_not_applicable(drill *d, dr_scenario *s)
{
    static const struct {
        const char *id, *why;
    } reasons[] = {
        {"s1", "not applicable to llama-server workers: the out-of-memory is made with a fault "
               "point inside a spillway worker and with device memory the drill takes from "
               "spillway's device, and admission reads the device memory a spillway worker "
               "reports; llama-server reports none"},
        {"s3", "not applicable to llama-server workers: the check that the cancelled request's "
               "KV memory is back reads the KV bytes a spillway worker reports"},
        {"s5", "not applicable to llama-server workers: the GPU worker is killed at the tool "
               "call by a fault point inside a spillway worker, and an agent run's generations "
               "take llama-server's OpenAI endpoint (tools), which is replayed, not resumed"},
        {"s6", "not applicable to llama-server workers: the deadline is judged from the "
               "prefill and decode rates a spillway worker calibrates at start; a llama-server "
               "has rates only after it served requests (--metrics)"},
    };
    dr__begin(d, s);
    for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++)
        if (!strcmp(s->id, reasons[i].id))
            dr__skip(d, s, "%s", reasons[i].why);
    dr__finish(d, s);
}
