/* router_agent.c - agent runs: a chat request with "tool_execution":
 * "server" is run as a loop in the router (docs/router.md, Tools):
 * generate on the workers with the configured tools offered → for each
 * tool call: ledger "started" (committed) → POST to the tool with
 * Idempotency-Key <request id>/<step> → ledger "done" with the result
 * (committed) → append the call and its result to the conversation →
 * generate again, until a reply without tool calls or max-tool-steps.
 *
 * Failover: each generation runs single-pass; when its worker fails the
 * whole run is replayed on the next eligible worker, and every step the
 * ledger already holds for this request id is reused instead of calling
 * the tool again ("reused": true). A step started but never finished (a
 * router crash, a tool that timed out or dropped the connection) has an
 * unknown outcome: an idempotent tool is called again with the same
 * Idempotency-Key; any other ends the run with unsafe_to_retry. A job's
 * request id is its job id, so a job cut by a router crash resumes its
 * steps the same way after the restart. Across routers sharing a ledger
 * the step's record is the fence: ldg_tool_started says whether this
 * call created it (first), and a tool that is not idempotent is called
 * only then; a step another router started meanwhile is reused when it
 * is done, else it has an unknown outcome, as above.
 *
 * The whole run shares the client's deadline: each generation is admitted
 * with what is left, each tool call waits at most what is left, and a run
 * whose deadline is spent before a generation or a tool call ends with
 * 504 deadline_exceeded (recorded steps stay recorded). usage sums every
 * generation of the pass that gave the answer. With "stream": true every
 * generation streams from the worker and on_event (rt_req) passes only
 * answer text to the client, as it is generated; a tool-call generation
 * shows nothing. A model's call is checked before the tool is called (a
 * configured tool, a name of at most 63 bytes, arguments valid under the
 * tool's schema, eng_json_validate); a bad one is not called, and the
 * model gets an "error: ..." result so that it can correct itself.
 */
#include "router/router-impl.h"
#include "router/router_net.h"

#include "api/sse.h"
#include "common/alloc.h"
#include "common/log.h"
#include "common/utf8.h"
#include "grammar/json_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tool answers longer than this are cut (they go back into the prompt). */
#define RT_MAX_TOOL_RESULT ((size_t)256 << 10)
/* Calls of an idempotent tool whose outcome stays unknown, per step. */
#define RT_TOOL_TRIES 3
/* Longest tool name (bytes): the config's limit and the ledger's field. */
#define RT_TOOL_NAME_MAX 63

/* The run's client side: the deadline and, for a stream, what reached the
 * client. Once head_sent, an error can only be an SSE event. */
typedef struct agent_run {
    rt_req *client;
    double deadline_at;      /* monotonic seconds, < 0: none */
    long long deadline_ms;   /* as the client gave it (messages) */
    bool stream;
    bool head_sent;          /* the SSE headers went out */
    bool text_sent;          /* answer text reached the client */
    bool ended;              /* the stream ended (an error event, [DONE]) */
    bool error_seen;         /* the generation ended with an error event */
    rt_req *gen;             /* the generation running now (on_event) */
    char stream_id[128];     /* id, created, model of the chunks sent */
    json_t *created, *model;
} agent_run;

/* Milliseconds left before the deadline: -1 none, 0 spent. */
static long long left_ms(const agent_run *a)
{
    if (a->deadline_at < 0)
        return -1;
    double left = (a->deadline_at - rt__now_s()) * 1000;
    if (left <= 0)
        return 0;
    return left >= 9e18 ? (long long)9e18 : left < 1 ? 1 : (long long)left;
}

static const rt_tool_config *find_tool(rt_router *rt, const char *name, const bool *allowed)
{
    for (int i = 0; name && i < rt->cfg->n_tools; i++)
        if (allowed[i] && !strcmp(rt->cfg->tools[i].name, name))
            return &rt->cfg->tools[i];
    return NULL;
}

/* The result goes into the conversation and the step record as a JSON
 * string: one that is not UTF-8 text (json_pack would fail and the tool
 * message would silently go missing) is replaced by an error text. */
static int text_or_error(const rt_tool_config *t, char **result)
{
    json_t *probe = *result ? json_string(*result) : NULL;
    if (*result && !probe) {
        char msg[160];
        snprintf(msg, sizeof msg, "error: the tool %s answered with text that is not UTF-8",
                 t->name);
        sw_free(*result);
        *result = sw_strdup(msg);
    }
    json_decref(probe);
    return 1;
}

/* Copies s into out (cap bytes) as snprintf would, but never cuts a UTF-8
 * sequence in two: the copy goes into JSON strings (json_pack refuses
 * invalid UTF-8, and a call id that vanished from the conversation would
 * leave the tool's result without its call). */
static void copy_utf8(char *out, size_t cap, const char *s)
{
    size_t n = sw_utf8_cut(s, strlen(s), cap - 1);
    memcpy(out, s, n);
    out[n] = 0;
}

/* The tool's answer body, at most RT_MAX_TOOL_RESULT bytes: a longer one
 * is cut (at a UTF-8 boundary) and the rest is not read. The tool
 * answered, so its outcome is known either way; only a connection that
 * breaks before the body's end (or the cap) leaves it unknown, and so
 * does the run's deadline (deadline_at, monotonic seconds; < 0: none)
 * passing while the body still comes: each read waits at most what is
 * left of it, so a tool that sends its answer a little at a time cannot
 * hold the run past the deadline (the per-read time-out alone would let
 * it). 0, or -1 (*out NULL). */
static int read_result(rn_conn *c, double deadline_at, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    char *b = sw_malloc(RT_MAX_TOOL_RESULT + 1);
    if (!b)
        return -1;
    size_t n = 0;
    const int per_read_ms = c->timeout_ms;
    for (;;) {
        if (deadline_at >= 0) {
            double left_ms = (deadline_at - rt__now_s()) * 1000;
            if (left_ms <= 0) {
                sw_free(b);
                return -1;
            }
            c->timeout_ms = left_ms < per_read_ms ? (int)left_ms : per_read_ms;
        }
        /* at the cap, one byte more says whether the answer goes on */
        long r = rn_body(c, b + n, n < RT_MAX_TOOL_RESULT ? RT_MAX_TOOL_RESULT - n : 1);
        if (r < 0) {
            sw_free(b);
            return -1;
        }
        if (r == 0)
            break;
        if (n == RT_MAX_TOOL_RESULT) {
            n = sw_utf8_cut(b, n + (size_t)r, n); /* b[n] is the byte past the cap */
            break;
        }
        n += (size_t)r;
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

/* One POST to the tool. Returns 1 when the outcome is known (*result set:
 * the body of a 2xx, cut at RT_MAX_TOOL_RESULT, or an error text), 0 when
 * unknown (time-out, dropped connection: the tool may or may not have
 * acted). *result: sw_free. */
static int call_tool(rt_router *rt, const rt_tool_config *t, const char *request_id, int step,
                     const char *args, int timeout_ms, double deadline_at, char **result)
{
    char address[600], path[512];
    *result = NULL;
    if (!strncmp(t->url, "unix:", 5)) {
        snprintf(address, sizeof address, "%s", t->url);
        snprintf(path, sizeof path, "/");
    } else {
        const char *slash = strchr(t->url + 7, '/');
        size_t alen = slash ? (size_t)(slash - t->url) : strlen(t->url);
        snprintf(address, sizeof address, "%.*s", (int)alen, t->url);
        snprintf(path, sizeof path, "%s", slash ? slash : "/");
    }
    char hdr[400];
    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s/%d\r\nX-Request-Id: %s\r\n", request_id, step,
             request_id);
    rn_conn c;
    /* the run's deadline bounds the head too (a tool sending it a byte at
     * a time would stretch the per-read time-out) */
    int rc = rn_request_until(&c, address, "POST", path, hdr, args, strlen(args), -1, timeout_ms,
                              deadline_at >= 0 ? deadline_at : 0);
    pthread_mutex_lock(&rt->mu);
    rt->tool_calls++;
    pthread_mutex_unlock(&rt->mu);
    char msg[160];
    if (rc == -1) {
        /* never connected: the tool did not receive the call */
        snprintf(msg, sizeof msg, "error: the tool %s could not be reached", t->name);
        *result = sw_strdup(msg);
        rn_close(&c);
        return 1;
    }
    if (rc != 0) {
        rn_close(&c);
        return 0;
    }
    char *body = NULL;
    size_t len = 0;
    int br = read_result(&c, deadline_at, &body, &len);
    int status = c.status;
    rn_close(&c);
    if (br != 0) {
        sw_free(body);
        return 0;
    }
    if (status >= 200 && status < 300) {
        *result = body ? body : sw_strdup("");
        return text_or_error(t, result);
    }
    snprintf(msg, sizeof msg, "error: the tool %s answered HTTP %d: ", t->name, status);
    size_t ml = strlen(msg), show = sw_utf8_cut(body, len, 200);
    *result = sw_malloc(ml + show + 1);
    if (*result) {
        memcpy(*result, msg, ml);
        if (show)
            memcpy(*result + ml, body, show);
        (*result)[ml + show] = 0;
    }
    sw_free(body);
    return text_or_error(t, result);
}

/* Writes one SSE event (headers first) to the client and the capture. */
static int sse_event(rt_req *q, bool *head_sent, const char *payload)
{
    if (!*head_sent) {
        if (rt__stream_begin(q))
            return -1;
        *head_sent = true;
    }
    size_t len = strlen(payload);
    char hex[32];
    int hn = snprintf(hex, sizeof hex, "%zx\r\n", len + 8);
    if (q->cap.on && (rt__capture_append(&q->cap, "data: ", 6) ||
                      rt__capture_append(&q->cap, payload, len) ||
                      rt__capture_append(&q->cap, "\n\n", 2)))
        return -1;
    if (rt__sink_write(q, hex, (size_t)hn) || rt__sink_write(q, "data: ", 6) ||
        rt__sink_write(q, payload, len) || rt__sink_write(q, "\n\n\r\n", 4))
        return -1;
    return 0;
}

/* Ends the stream: the last chunk, after [DONE]. */
static int sse_end(rt_req *q)
{
    if (rt__sink_write(q, "0\r\n\r\n", 5))
        return -1;
    rt__chunked_end(q);
    return 0;
}

/* The run fails: an HTTP error, or once the stream began an error event
 * (the shape the relay uses after headers: the error object, [DONE]). */
static void run_fail(agent_run *a, int status, const char *code, const char *msg,
                     const char *param, const char *extra)
{
    rt_req *q = a->client;
    if (!a->head_sent) {
        rt__send_error(q, status, code, msg, param, extra);
        return;
    }
    if (a->ended)
        return;
    q->error_code = code;
    json_t *e = rt__error_obj(status, code, msg, param);
    char *s = e ? sw_json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    if (s && sse_event(q, &a->head_sent, s) == 0 && sse_event(q, &a->head_sent, "[DONE]") == 0)
        sse_end(q);
    free(s);
    a->ended = true;
}

static void ledger_fail(agent_run *a, const sw_error *err)
{
    if (!a->head_sent) {
        rt__ledger_unavailable(a->client, "the tool ledger could not be written", err);
        return;
    }
    SW_ERROR("router", "request %s: %s", a->client->request_id, err->message);
    char extra[64];
    snprintf(extra, sizeof extra, "Retry-After: %d\r\n", RT_LEDGER_RETRY_AFTER_S);
    run_fail(a, 503, "ledger_unavailable", "the tool ledger could not be written", NULL, extra);
}

/* A step this run did not claim (ldg_tool_started: not first) because
 * another attempt started it between the look-up and the start (another
 * router running the same key or job): its record, read again; the
 * recorded call wins (into tool_name, call_id, *args). 1 when it is done
 * (*result), 0 when its outcome is unknown, -1 when the ledger failed
 * (err). */
static int step_claimed_elsewhere(rt_router *rt, const char *request_id, int step,
                                  char *tool_name, size_t tool_cap, char **args, char *call_id,
                                  size_t call_cap, char **result, sw_error *err)
{
    ldg_tool_step rec;
    bool found = false;
    if (ldg_tool_get(rt->ledger, request_id, step, &rec, &found, err))
        return -1;
    if (!found)
        return 0;
    copy_utf8(tool_name, tool_cap, rec.tool);
    copy_utf8(call_id, call_cap, rec.call_id);
    if (rec.arguments) {
        sw_free(*args);
        *args = rec.arguments;
        rec.arguments = NULL;
    }
    bool done = rec.state == LDG_TOOL_DONE;
    if (done) {
        *result = rec.result;
        rec.result = NULL;
    }
    ldg_tool_step_free(&rec);
    return done;
}

/* The deadline was spent before what comes next (a generation, a tool
 * call): 504 deadline_exceeded; steps already recorded stay recorded. */
static void deadline_fail(agent_run *a, int n_steps, const char *what)
{
    char msg[300];
    snprintf(msg, sizeof msg,
             "the run's deadline of %lld ms passed before %s (%d tool step(s) recorded)",
             a->deadline_ms, what, n_steps);
    SW_WARN("router", "agent run %s: %s", a->client->request_id, msg);
    run_fail(a, 504, "deadline_exceeded", msg, NULL, NULL);
}

/* Why the model's call cannot be made ("" when it can): the text goes
 * back to the model as the call's result, so that it can correct itself.
 * A name cut by cut_name (it ends in "...", which no configured name can
 * hold) was longer than the limit. */
static void judge_call(const rt_tool_config *t, const char *tool_name, const char *args,
                       const char *request_id, char *why, size_t cap)
{
    why[0] = 0;
    size_t nl = strlen(tool_name);
    if (nl >= 3 && !strcmp(tool_name + nl - 3, "...")) {
        snprintf(why, cap, "error: the tool name %s is longer than %d bytes: no such tool",
                 tool_name, RT_TOOL_NAME_MAX);
        return;
    }
    if (!t) {
        snprintf(why, cap, "error: %s is not an available tool", tool_name);
        return;
    }
    /* duplicate keys are refused: the check would judge the last value of
     * a key, and the tool (which gets the text) may well read the first */
    json_error_t jerr;
    json_t *aj = sw_json_loads(args ? args : "", JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(aj)) {
        snprintf(why, cap, "error: the arguments are not a JSON object%s%.200s",
                 aj ? "" : ": ", aj ? "" : jerr.text);
        json_decref(aj);
        return;
    }
    json_t *schema = sw_json_loads(t->parameters, 0, NULL);
    sw_error verr;
    sw_error_clear(&verr);
    int rc = schema ? eng_json_validate(schema, aj, &verr) : SW_EUNSUPPORTED;
    if (rc == SW_EINVAL)
        snprintf(why, cap, "error: the arguments do not match the parameters schema of %s: %s",
                 t->name, verr.message);
    else if (rc != SW_OK)
        /* a schema outside the checked subset: the tool judges */
        SW_WARN("router", "request %s: the arguments for %s are not checked: %s", request_id,
                t->name, schema ? verr.message : "the schema does not parse");
    json_decref(schema);
    json_decref(aj);
}

/* The outcome of one step: 0 to go on (*result set, *reused), -1 when the
 * run ended (the response was sent). */
static int run_step(agent_run *a, int step, const bool *allowed, char *tool_name, size_t tool_cap,
                    char **args, char *call_id, size_t call_cap, char **result, bool *reused)
{
    rt_req *q = a->client;
    rt_router *rt = q->rt;
    sw_error err;
    sw_error_clear(&err);
    *result = NULL;
    *reused = false;
    bool unknown = false; /* started before, never done */
    if (!rt->sabotage.no_tool_ledger) {
        ldg_tool_step rec;
        bool found = false;
        if (ldg_tool_get(rt->ledger, q->request_id, step, &rec, &found, &err)) {
            ledger_fail(a, &err);
            return -1;
        }
        if (found) {
            /* the recorded call wins over what was generated this time */
            copy_utf8(tool_name, tool_cap, rec.tool);
            copy_utf8(call_id, call_cap, rec.call_id);
            sw_free(*args);
            *args = rec.arguments;
            rec.arguments = NULL;
            if (rec.state == LDG_TOOL_DONE) {
                *result = rec.result;
                rec.result = NULL;
                *reused = true;
                ldg_tool_step_free(&rec);
                pthread_mutex_lock(&rt->mu);
                rt->tool_reused++;
                pthread_mutex_unlock(&rt->mu);
                SW_INFO("router", "request %s: tool step %d (%s) reused from the ledger",
                        q->request_id, step, tool_name);
                return 0;
            }
            ldg_tool_step_free(&rec);
            unknown = true;
        }
    }
    const rt_tool_config *t = find_tool(rt, tool_name, allowed);
    char why[640];
    judge_call(t, tool_name, *args, q->request_id, why, sizeof why);
    if (why[0]) {
        /* nothing to call (never called for this step, whatever the
         * ledger says: a bad call is not made): the error goes back to the
         * model as the result */
        *result = sw_strdup(why);
        bool first = false; /* the same error text whoever records it */
        if (!*result ||
            (!unknown && ldg_tool_started(rt->ledger, q->request_id, step, tool_name, call_id,
                                          *args ? *args : "", rt__wall_s(), &first, &err)) ||
            ldg_tool_done(rt->ledger, q->request_id, step, *result, rt__wall_s(), &err)) {
            if (!*result)
                sw_error_set(&err, SW_ENOMEM, "out of memory");
            ledger_fail(a, &err);
            return -1;
        }
        SW_INFO("router", "request %s: tool step %d not called: %s", q->request_id, step, why);
        return 0;
    }
    if (unknown) {
        if (!t->idempotent) {
            char msg[300];
            snprintf(msg, sizeof msg,
                     "tool step %d (%s) was started but its outcome is unknown, and the tool "
                     "is not idempotent: the run is not retried",
                     step, tool_name);
            SW_WARN("router", "request %s: %s", q->request_id, msg);
            run_fail(a, 502, "unsafe_to_retry", msg, NULL, NULL);
            return -1;
        }
        SW_INFO("router", "request %s: tool step %d (%s) has an unknown outcome; the tool is "
                "idempotent: called again with the same Idempotency-Key",
                q->request_id, step, tool_name);
    }
    if (left_ms(a) == 0) {
        char what[120];
        snprintf(what, sizeof what, "tool step %d (%s) was called", step, tool_name);
        deadline_fail(a, step - 1, what);
        return -1;
    }
    /* committed before the call (a re-call counts in the step's calls) */
    bool first = false; /* whether this call created the step's record */
    if (ldg_tool_started(rt->ledger, q->request_id, step, tool_name, call_id, *args,
                         rt__wall_s(), &first, &err)) {
        ledger_fail(a, &err);
        return -1;
    }
    if (!first && !unknown && !rt->sabotage.no_tool_ledger) {
        /* another attempt started this step since the look-up above */
        int got = step_claimed_elsewhere(rt, q->request_id, step, tool_name, tool_cap, args,
                                         call_id, call_cap, result, &err);
        if (got < 0) {
            ledger_fail(a, &err);
            return -1;
        }
        if (got > 0) {
            *reused = true;
            pthread_mutex_lock(&rt->mu);
            rt->tool_reused++;
            pthread_mutex_unlock(&rt->mu);
            SW_INFO("router", "request %s: tool step %d (%s) was done by another attempt: reused",
                    q->request_id, step, tool_name);
            return 0;
        }
        t = find_tool(rt, tool_name, allowed);
        if (!t || !t->idempotent) {
            char msg[300];
            snprintf(msg, sizeof msg,
                     "tool step %d (%s) was started by another attempt and its outcome is "
                     "unknown, and the tool is not idempotent: it is not called again",
                     step, tool_name);
            SW_WARN("router", "request %s: %s", q->request_id, msg);
            run_fail(a, 502, "unsafe_to_retry", msg, NULL, NULL);
            return -1;
        }
        SW_INFO("router", "request %s: tool step %d (%s) was started by another attempt; the "
                "tool is idempotent: called with the same Idempotency-Key",
                q->request_id, step, tool_name);
    }
    if (rt->fault_exit_after_tool_started) {
        SW_WARN("router", "SPILLWAY_FAULT router_exit_after_tool_started: exiting (status 70)");
        _exit(70);
    }
    int known = 0;
    bool cut_by_deadline = false;
    for (int i = 0; i < RT_TOOL_TRIES && !known; i++) {
        if (i > 0 && !t->idempotent)
            break;
        /* each call waits at most what is left of the run's deadline */
        long long left = left_ms(a);
        if (left == 0) {
            cut_by_deadline = true;
            break;
        }
        int timeout_ms = left > 0 && left < t->timeout_ms ? (int)left : t->timeout_ms;
        if (i > 0)
            SW_INFO("router", "request %s: tool %s gave no answer; idempotent: calling again",
                    q->request_id, t->name);
        known = call_tool(rt, t, q->request_id, step, *args, timeout_ms, a->deadline_at, result);
        if (!known && left_ms(a) == 0)
            cut_by_deadline = true;
    }
    if (rt->fault_exit_after_tool_called) {
        SW_WARN("router", "SPILLWAY_FAULT router_exit_after_tool_called: exiting (status 70)");
        _exit(70);
    }
    if (!known && cut_by_deadline) {
        /* the step stays started: its outcome is unknown */
        char what[160];
        snprintf(what, sizeof what, "tool step %d (%s) answered (its outcome is unknown)", step,
                 t->name);
        deadline_fail(a, step - 1, what);
        return -1;
    }
    if (!known && !t->idempotent) {
        char emsg[300];
        snprintf(emsg, sizeof emsg,
                 "tool step %d (%s): no answer within %d ms (time-out or dropped connection); the "
                 "tool is not idempotent, so it is not called again",
                 step, t->name, t->timeout_ms);
        SW_WARN("router", "request %s: %s", q->request_id, emsg);
        run_fail(a, 502, "unsafe_to_retry", emsg, NULL, NULL);
        return -1;
    }
    char msg[200];
    if (!known) {
        snprintf(msg, sizeof msg, "error: the tool %s did not answer", t->name);
        *result = sw_strdup(msg);
    }
    if (!*result || ldg_tool_done(rt->ledger, q->request_id, step, *result, rt__wall_s(), &err)) {
        if (!*result)
            sw_error_set(&err, SW_ENOMEM, "out of memory");
        ledger_fail(a, &err);
        return -1;
    }
    return 0;
}

/* The envelope of the chunks the client gets: the first streamed chunk's
 * id, created and model (a later generation's chunks are rewritten to
 * them, so the client sees one completion). */
static json_t *chunk_base(const agent_run *a)
{
    return json_pack("{s:s, s:s, s:O?, s:O?}", "id", a->stream_id, "object",
                     "chat.completion.chunk", "created", a->created, "model", a->model);
}

/* on_event of a streamed generation (rt_req.on_event): answer text goes
 * to the client as it comes, after the headers and a role chunk the first
 * time; the rest (the worker's role chunk, held-back empty deltas,
 * tool-call deltas, the finish chunk, usage, [DONE]) stays in the
 * generation's capture, from which the loop reads it. The worker holds
 * text back while a reply could still be a tool call (docs/api.md), so a
 * tool-call generation shows the client nothing. Once text went out, a
 * worker failure must not replay the run (the client would see text
 * again): single_pass is cleared and the relay resumes the stream after
 * the tokens sent, or ends it with an error event, which goes on to the
 * client. */
static int agent_on_event(rt_req *gen, const char *payload)
{
    agent_run *a = gen->on_event_ctx;
    rt_req *q = a->client;
    if (a->ended || !strcmp(payload, "[DONE]"))
        return 0;
    json_t *j = sw_json_loads(payload, 0, NULL);
    if (!j)
        return 0;
    int rc = 0;
    if (json_object_get(j, "error")) {
        a->error_seen = true;
        if (a->text_sent) {
            rc = sse_event(q, &a->head_sent, payload) || sse_event(q, &a->head_sent, "[DONE]") ||
                         sse_end(q)
                     ? -1
                     : 0;
            a->ended = true;
        }
        json_decref(j);
        return rc;
    }
    json_t *delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    json_t *text = json_object_get(delta, "content");
    if (!json_is_string(text) || json_string_length(text) == 0) {
        json_decref(j);
        return 0;
    }
    if (!a->text_sent) {
        copy_utf8(a->stream_id, sizeof a->stream_id,
                  json_string_value(json_object_get(j, "id")) ?: "chatcmpl-agent");
        a->created = json_incref(json_object_get(j, "created"));
        a->model = json_incref(json_object_get(j, "model"));
        snprintf(q->worker, sizeof q->worker, "%s", gen->worker);
        json_t *role = chunk_base(a);
        json_object_set_new(role, "choices",
                            json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", 0, "delta",
                                      "role", "assistant", "content", "", "logprobs",
                                      "finish_reason"));
        char *rs = role ? sw_json_dumps(role, JSON_COMPACT) : NULL;
        json_decref(role);
        int saved = q->attempts; /* the header counts this generation's too */
        q->attempts += gen->attempts;
        rc = rs && sse_event(q, &a->head_sent, rs) == 0 ? 0 : -1;
        q->attempts = saved;
        free(rs);
        a->text_sent = true;
    }
    gen->single_pass = false;
    json_object_del(delta, "role");
    /* only the text: a call in the same chunk (an engine that streams
     * text and then calls, kind = openai) stays in the capture */
    json_object_del(delta, "tool_calls");
    json_object_set_new(j, "id", json_string(a->stream_id));
    json_object_set(j, "created", a->created ? a->created : json_null());
    json_object_set(j, "model", a->model ? a->model : json_null());
    char *out = rc == 0 ? sw_json_dumps(j, JSON_COMPACT) : NULL;
    if (rc == 0)
        rc = out && sse_event(q, &a->head_sent, out) == 0 ? 0 : -1;
    free(out);
    json_decref(j);
    return rc;
}

/* A growing text. The reply of a streamed generation is put together
 * from as many pieces as it had chunks (one token each): appending to a
 * JSON string each time would copy (and re-check as UTF-8) the whole text
 * so far, quadratic in its length, with the capture (64 MiB) as the only
 * bound on what a worker sends. */
typedef struct text_buf {
    char *p;
    size_t len, cap;
} text_buf;

static int text_add(text_buf *b, const char *s, size_t n)
{
    if (n > RT_CAPTURE_MAX - b->len)
        return -1; /* more than the capture could hold: not from it */
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *np = sw_realloc(b->p, nc);
        if (!np)
            return -1;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

/* The JSON string of the text (pieces of valid JSON strings joined, so
 * valid UTF-8); NULL on failure. */
static json_t *text_json(const text_buf *b)
{
    return json_stringn(b->p ? b->p : "", b->len);
}

/* The most tool calls one reply may hold (indices 0..63). */
#define RT_MAX_GATHERED_CALLS 64

/* A streamed reply being put together. */
typedef struct gathered {
    text_buf content;
    size_t n_calls;
    struct {
        json_t *id;
        text_buf name, arguments;
    } calls[RT_MAX_GATHERED_CALLS];
    json_t *finish, *usage;
} gathered;

static void gathered_free(gathered *g)
{
    sw_free(g->content.p);
    for (size_t i = 0; i < g->n_calls; i++) {
        json_decref(g->calls[i].id);
        sw_free(g->calls[i].name.p);
        sw_free(g->calls[i].arguments.p);
    }
    json_decref(g->finish);
    json_decref(g->usage);
}

/* One chunk of a streamed generation into the reply being put together. */
static int gather_chunk(json_t *j, gathered *g)
{
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    json_t *delta = json_object_get(choice, "delta");
    json_t *text = json_object_get(delta, "content");
    if (json_is_string(text) &&
        text_add(&g->content, json_string_value(text), json_string_length(text)))
        return -1;
    json_t *tcs = json_object_get(delta, "tool_calls");
    for (size_t k = 0; k < json_array_size(tcs); k++) {
        json_t *tc = json_array_get(tcs, k);
        json_t *ix = json_object_get(tc, "index");
        json_int_t idx = json_is_integer(ix) ? json_integer_value(ix) : (json_int_t)k;
        if (idx < 0 || idx >= RT_MAX_GATHERED_CALLS || (size_t)idx > g->n_calls)
            return -1;
        if ((size_t)idx == g->n_calls)
            g->n_calls++; /* zeroed with the struct */
        json_t *fn = json_object_get(tc, "function");
        json_t *v;
        if (json_is_string(v = json_object_get(tc, "id"))) {
            json_decref(g->calls[idx].id);
            g->calls[idx].id = json_incref(v);
        }
        if (json_is_string(v = json_object_get(fn, "name")) &&
            text_add(&g->calls[idx].name, json_string_value(v), json_string_length(v)))
            return -1;
        if (json_is_string(v = json_object_get(fn, "arguments")) &&
            text_add(&g->calls[idx].arguments, json_string_value(v), json_string_length(v)))
            return -1;
    }
    json_t *fr = json_object_get(choice, "finish_reason");
    if (json_is_string(fr)) {
        json_decref(g->finish);
        g->finish = json_incref(fr);
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        json_decref(g->usage);
        g->usage = json_incref(u);
    }
    return 0;
}

/* The chat.completion a streamed generation amounts to, read from its
 * capture (the SSE text): the content joined, the tool calls put together
 * by index, finish_reason, usage. NULL when the stream did not finish (no
 * finish_reason or no [DONE]), held an error event or does not parse. */
static json_t *completion_from_sse(const char *body, size_t len)
{
    json_t *first = NULL, *out = NULL;
    gathered *g = sw_calloc(1, sizeof *g);
    bool done = false, bad = !g;
    const char *p = body, *end = body ? body + len : NULL;
    api_sse_event ev;
    while (!bad && p && p < end && api_sse_next(p, (size_t)(end - p), &ev)) {
        if (api_sse_is_done(&ev)) {
            done = true;
        } else if (ev.data) {
            json_t *j = sw_json_loadb(ev.data, ev.data_len, JSON_ALLOW_NUL, NULL);
            if (!j || json_object_get(j, "error") || gather_chunk(j, g))
                bad = true;
            if (!bad && !first)
                first = json_incref(j);
            json_decref(j);
        }
        p += ev.consumed;
    }
    if (!bad && done && g->finish && first) {
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                g->n_calls > 0 && g->content.len == 0 ? json_null()
                                                                      : text_json(&g->content));
        json_t *calls = g->n_calls > 0 ? json_array() : NULL;
        for (size_t i = 0; msg && i < g->n_calls; i++) {
            json_t *call = json_pack("{s:O?, s:s, s:{s:o, s:o}}", "id", g->calls[i].id, "type",
                                     "function", "function", "name", text_json(&g->calls[i].name),
                                     "arguments", text_json(&g->calls[i].arguments));
            if (call && !json_object_get(call, "id"))
                json_object_set_new(call, "id", json_string(""));
            if (!call || json_array_append_new(calls, call))
                bad = true;
        }
        if (msg && calls && !bad)
            json_object_set(msg, "tool_calls", calls);
        if (msg && !bad)
            out = json_pack("{s:O?, s:s, s:O?, s:O?, s:[{s:i, s:O, s:n, s:O}], s:O?}", "id",
                            json_object_get(first, "id"), "object", "chat.completion", "created",
                            json_object_get(first, "created"), "model",
                            json_object_get(first, "model"), "choices", "index", 0, "message", msg,
                            "logprobs", "finish_reason", g->finish, "usage", g->usage);
        json_decref(calls);
        json_decref(msg);
    }
    json_decref(first);
    if (g)
        gathered_free(g);
    sw_free(g);
    return out;
}

/* A streaming agent run whose answer text was not streamed (it had none:
 * a reply that is only tool calls, once max-tool-steps was reached, or an
 * empty one): the answer goes out as chat.completion.chunk events after
 * the loop (the role and the whole content, then the finish reason with
 * the spillway extension, the usage when asked, [DONE]). */
static void send_as_stream(rt_req *q, json_t *final, bool with_usage)
{
    bool head = false;
    json_t *choice = json_array_get(json_object_get(final, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    json_t *base = json_pack("{s:O?, s:s, s:O?, s:O?}", "id", json_object_get(final, "id"),
                             "object", "chat.completion.chunk", "created",
                             json_object_get(final, "created"), "model",
                             json_object_get(final, "model"));
    json_t *delta = json_pack("{s:s}", "role", "assistant");
    json_t *content = json_object_get(msg, "content");
    json_object_set(delta, "content", content ? content : json_null());
    json_t *tcs = json_object_get(msg, "tool_calls");
    if (json_is_array(tcs)) {
        json_t *with_index = json_deep_copy(tcs);
        for (size_t i = 0; i < json_array_size(with_index); i++)
            json_object_set_new(json_array_get(with_index, i), "index", json_integer((json_int_t)i));
        json_object_set_new(delta, "tool_calls", with_index);
    }
    json_t *c1 = json_deep_copy(base);
    json_object_set_new(c1, "choices",
                        json_pack("[{s:i, s:o, s:n, s:n}]", "index", 0, "delta", delta, "logprobs",
                                  "finish_reason"));
    json_t *c2 = json_deep_copy(base);
    json_t *fr = json_object_get(choice, "finish_reason");
    json_object_set_new(c2, "choices",
                        json_pack("[{s:i, s:{}, s:n, s:O?}]", "index", 0, "delta", "logprobs",
                                  "finish_reason", fr));
    json_object_set(c2, "spillway", json_object_get(final, "spillway"));
    json_t *c3 = NULL;
    if (with_usage) {
        c3 = json_deep_copy(base);
        json_object_set_new(c3, "choices", json_array());
        json_object_set(c3, "usage", json_object_get(final, "usage"));
    }
    json_t *evs[3] = {c1, c2, c3};
    bool ok = true;
    for (int i = 0; i < 3 && ok; i++) {
        if (!evs[i])
            continue;
        char *s = sw_json_dumps(evs[i], JSON_COMPACT);
        ok = s && sse_event(q, &head, s) == 0;
        free(s);
    }
    if (ok)
        ok = sse_event(q, &head, "[DONE]") == 0 && sse_end(q) == 0;
    q->completed = ok;
    for (int i = 0; i < 3; i++)
        json_decref(evs[i]);
    json_decref(base);
}

/* The end of a stream whose answer text went out as it was generated:
 * the reply's tool calls if it has any (max-tool-steps reached), the
 * finish chunk with the spillway extension, the usage when asked, [DONE]. */
static void finish_stream(agent_run *a, json_t *final, bool with_usage)
{
    rt_req *q = a->client;
    json_t *choice = json_array_get(json_object_get(final, "choices"), 0);
    json_t *tcs = json_object_get(json_object_get(choice, "message"), "tool_calls");
    json_t *evs[3] = {NULL, chunk_base(a), NULL};
    if (json_array_size(tcs) > 0) {
        json_t *with_index = json_deep_copy(tcs);
        for (size_t i = 0; i < json_array_size(with_index); i++)
            json_object_set_new(json_array_get(with_index, i), "index", json_integer((json_int_t)i));
        evs[0] = chunk_base(a);
        json_object_set_new(evs[0], "choices",
                            json_pack("[{s:i, s:{s:o}, s:n, s:n}]", "index", 0, "delta",
                                      "tool_calls", with_index, "logprobs", "finish_reason"));
    }
    json_object_set_new(evs[1], "choices",
                        json_pack("[{s:i, s:{}, s:n, s:O?}]", "index", 0, "delta", "logprobs",
                                  "finish_reason", json_object_get(choice, "finish_reason")));
    json_object_set(evs[1], "spillway", json_object_get(final, "spillway"));
    if (with_usage) {
        evs[2] = chunk_base(a);
        json_object_set_new(evs[2], "choices", json_array());
        json_object_set(evs[2], "usage", json_object_get(final, "usage"));
    }
    bool ok = evs[1] != NULL;
    for (int i = 0; i < 3 && ok; i++) {
        if (!evs[i])
            continue;
        char *s = sw_json_dumps(evs[i], JSON_COMPACT);
        ok = s && sse_event(q, &a->head_sent, s) == 0;
        free(s);
    }
    if (ok)
        ok = sse_event(q, &a->head_sent, "[DONE]") == 0 && sse_end(q) == 0;
    a->ended = true;
    q->completed = ok;
    for (int i = 0; i < 3; i++)
        json_decref(evs[i]);
}

/* The generation's error response, passed on as the run's answer. A
 * streamed generation that failed after its worker began answering left
 * an error event in its capture: that error goes out as an HTTP error
 * (503, as the relay answers a failure before any text). */
static void forward(agent_run *a, const rt_capture *c)
{
    rt_req *q = a->client;
    if (a->ended)
        return;
    if (c->status > 0 && c->body && !c->stream) {
        if (a->head_sent) {
            json_t *j = sw_json_loadb(c->body, c->len, JSON_ALLOW_NUL, NULL);
            json_t *e = json_object_get(j, "error");
            run_fail(a, c->status,
                     json_string_value(json_object_get(e, "code")) ?: "worker_failed",
                     json_string_value(json_object_get(e, "message")) ?: "the generation failed",
                     NULL, NULL);
            /* run_fail kept the code, which lives in j: error_code holds
             * static strings only (router_idem.c reads it later) */
            q->error_code = NULL;
            json_decref(j);
            return;
        }
        char ra[48];
        rt__retry_after(q->rt, ra, sizeof ra);
        rt__send_response(q, c->status, c->content_type[0] ? c->content_type : "application/json",
                          c->status == 503 ? ra : NULL, c->body, c->len);
        return;
    }
    /* the last error event of the stream, if any */
    const char *ev = NULL, *p = c->body, *end = c->body ? c->body + c->len : NULL;
    size_t ev_len = 0;
    api_sse_event sse;
    while (p && p < end && api_sse_next(p, (size_t)(end - p), &sse)) {
        if (sse.data && sse.data_len > 10 && !strncmp(sse.data, "{\"error\"", 8)) {
            ev = sse.data;
            ev_len = sse.data_len;
        }
        p += sse.consumed;
    }
    json_t *j = ev ? sw_json_loadb(ev, ev_len, JSON_ALLOW_NUL, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    const char *code = json_string_value(json_object_get(e, "code"));
    char cbuf[64];
    snprintf(cbuf, sizeof cbuf, "%s", code ? code : "worker_failed");
    char mbuf[400];
    snprintf(mbuf, sizeof mbuf, "%s",
             json_string_value(json_object_get(e, "message")) ?: "the generation failed");
    json_decref(j);
    if (!a->head_sent) {
        json_t *eo = rt__error_obj(503, cbuf, mbuf, NULL);
        char *s = eo ? sw_json_dumps(eo, JSON_COMPACT) : NULL;
        json_decref(eo);
        char ra[48];
        rt__retry_after(q->rt, ra, sizeof ra);
        if (s)
            rt__send_response(q, 503, "application/json", ra, s, strlen(s));
        else
            rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
        free(s);
        return;
    }
    run_fail(a, 503, "worker_failed", mbuf, NULL, NULL);
}

/* The body's "timeout" (seconds) as the relay reads it, when no
 * X-Spillway-Deadline-Ms came: milliseconds, -1 none. */
static long long body_deadline_ms(json_t *body)
{
    json_t *t = json_object_get(body, "timeout");
    if (!json_is_number(t))
        return -1;
    double ms = json_number_value(t) * 1000;
    return ms >= 9e18 ? (long long)9e18 : ms <= -9e18 ? -1 : (long long)ms;
}

/* A tool name as the run keeps it: one longer than the limit is cut (at
 * a UTF-8 boundary) and marked with "...", which no configured name can
 * hold, so that neither the conversation nor the ledger ever holds a cut
 * name that could be a real tool. */
static void keep_name(const char *gen, char *out, size_t cap)
{
    size_t n = strlen(gen);
    if (n <= RT_TOOL_NAME_MAX) {
        snprintf(out, cap, "%s", gen);
        return;
    }
    size_t keep = sw_utf8_cut(gen, n, RT_TOOL_NAME_MAX - 3);
    snprintf(out, cap, "%.*s...", (int)keep, gen);
}

void rt__handle_agent(rt_req *q, json_t *body)
{
    rt_router *rt = q->rt;
    const rt_config *cfg = rt->cfg;
    json_t *tools = NULL, *base = NULL, *msgs = NULL, *steps = NULL, *final = NULL;
    /* the failover record of the run: the first generation failure, when
     * the replay started and which worker gave the final answer */
    json_t *run_first_error = NULL;
    double t_received = rt__wall_s(), replay_start = 0;
    char final_worker[64] = "";
    int n_reused = 0;
    bool resumed = false;
    bool allowed[RT_MAX_TOOLS] = {false};
    bool stream = json_is_true(json_object_get(body, "stream"));
    bool stream_usage = json_is_true(
        json_object_get(json_object_get(body, "stream_options"), "include_usage"));
    agent_run a;
    memset(&a, 0, sizeof a);
    a.client = q;
    a.stream = stream;
    a.deadline_ms = q->deadline_ms >= 0 ? q->deadline_ms : body_deadline_ms(body);
    a.deadline_at = a.deadline_ms >= 0 ? rt__now_s() + (double)a.deadline_ms / 1000.0 : -1;
    /* the usage of the pass that gives the answer: every generation's */
    json_int_t use_prompt = 0, use_completion = 0;
    if (cfg->n_tools == 0) {
        rt__send_error(q, 400, "invalid_request",
                       "no server-side tools are configured ([tool NAME] sections)",
                       "tool_execution", NULL);
        return;
    }
    json_t *messages = json_object_get(body, "messages");
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        rt__send_error(q, 400, "invalid_request", "messages must be a non-empty array",
                       "messages", NULL);
        return;
    }
    json_t *req_tools = json_object_get(body, "tools");
    if (!req_tools) {
        for (int i = 0; i < cfg->n_tools; i++)
            allowed[i] = true;
    } else if (!json_is_array(req_tools) || json_array_size(req_tools) == 0) {
        rt__send_error(q, 400, "invalid_request", "tools must be a non-empty array", "tools", NULL);
        return;
    } else {
        for (size_t k = 0; k < json_array_size(req_tools); k++) {
            json_t *e = json_array_get(req_tools, k);
            const char *type = json_string_value(json_object_get(e, "type"));
            const char *name =
                json_string_value(json_object_get(json_object_get(e, "function"), "name"));
            char msg[200];
            if (name && strlen(name) > RT_TOOL_NAME_MAX) {
                snprintf(msg, sizeof msg,
                         "tools[%zu]: the function name is %zu bytes long; tool names are at "
                         "most %d bytes",
                         k, strlen(name), RT_TOOL_NAME_MAX);
                rt__send_error(q, 400, "invalid_request", msg, "tools", NULL);
                return;
            }
            int found = -1;
            for (int i = 0; name && i < cfg->n_tools; i++)
                if (!strcmp(cfg->tools[i].name, name))
                    found = i;
            if (!type || strcmp(type, "function") || found < 0) {
                snprintf(msg, sizeof msg,
                         "tools[%zu]: %s is not a configured server-side tool", k,
                         name ? name : "(no function name)");
                rt__send_error(q, 400, "invalid_request", msg, "tools", NULL);
                return;
            }
            allowed[found] = true;
        }
    }
    json_t *choice = json_object_get(body, "tool_choice");
    if (choice) {
        const char *cs = json_string_value(choice);
        const char *fname = json_string_value(
            json_object_get(json_object_get(choice, "function"), "name"));
        if (fname && strlen(fname) > RT_TOOL_NAME_MAX) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "tool_choice: the function name is %zu bytes long; tool names are at most "
                     "%d bytes",
                     strlen(fname), RT_TOOL_NAME_MAX);
            rt__send_error(q, 400, "invalid_request", msg, "tool_choice", NULL);
            return;
        }
        bool ok = cs ? (!strcmp(cs, "auto") || !strcmp(cs, "none") || !strcmp(cs, "required"))
                     : (json_is_object(choice) && fname && find_tool(rt, fname, allowed));
        if (!ok) {
            rt__send_error(q, 400, "invalid_request",
                           "tool_choice must be auto, none, required or a configured function",
                           "tool_choice", NULL);
            return;
        }
    }
    /* the tools as the worker sees them: the configured schemas win */
    tools = json_array();
    for (int i = 0; i < cfg->n_tools; i++) {
        if (!allowed[i])
            continue;
        json_t *params = sw_json_loads(cfg->tools[i].parameters, 0, NULL);
        json_array_append_new(
            tools, json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name",
                             cfg->tools[i].name, "description", cfg->tools[i].description,
                             "parameters", params ? params : json_object()));
    }
    base = json_deep_copy(body);
    json_object_del(base, "tool_execution");
    json_object_del(base, "stream");
    json_object_del(base, "stream_options");
    json_object_del(base, "timeout"); /* the run's deadline, given to each generation */
    if (stream) {
        /* every generation streams: the answer's text reaches the client
         * as it is generated (agent_on_event); usage comes in the stream */
        json_object_set_new(base, "stream", json_true());
        json_object_set_new(base, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    if (!json_object_get(base, "seed")) {
        /* one seed for the whole run (and its replays) */
        uint64_t n = __atomic_add_fetch(&rt->seq, 1, __ATOMIC_RELAXED);
        uint64_t s = (uint64_t)(rt__wall_s() * 1e6) ^ (n * 0x9E3779B97F4A7C15ull);
        json_object_set_new(base, "seed", json_integer((json_int_t)(s & 0x7fffffff)));
    }
    json_object_set(base, "tools", tools);
    /* the run's tool steps are promised to the ledger: none begins while
     * it cannot be reached (503 ledger_unavailable) */
    if (!rt->sabotage.no_tool_ledger && !rt__ledger_ready(q))
        goto out;
    /* workers that failed in this run: the replay avoids them (a worker
     * that answered a generation stays eligible for the next one) */
    bool failed[RT_MAX_WORKERS] = {false};
    int run_attempts = 0;
    int n_steps = 0;

run:
    run_attempts++;
    json_decref(msgs);
    json_decref(steps);
    msgs = json_deep_copy(messages);
    steps = json_array();
    n_steps = 0;
    use_prompt = use_completion = 0;
    for (int gen = 0;; gen++) {
        long long left = left_ms(&a);
        if (left == 0) {
            deadline_fail(&a, n_steps, gen == 0 ? "the first generation"
                                                : "the generation after the tool steps");
            goto out;
        }
        json_t *b = json_deep_copy(base);
        json_object_set(b, "messages", msgs);
        if (n_steps >= cfg->max_tool_steps)
            json_object_set_new(b, "tool_choice", json_string("none"));
        else if (gen == 0 && choice)
            json_object_set(b, "tool_choice", choice);
        else
            json_object_set_new(b, "tool_choice", json_string("auto"));
        char *bs = sw_json_dumps(b, JSON_COMPACT);
        json_decref(b);
        if (!bs) {
            run_fail(&a, 500, "internal_error", "out of memory", NULL, NULL);
            goto out;
        }
        rt_req iq;
        memset(&iq, 0, sizeof iq);
        iq.rt = rt;
        iq.fd = -1;
        iq.cap.on = true;
        iq.single_pass = true;
        iq.durable = true; /* an agent run's records are promised */
        /* every generation of the run, and of its replays, keeps the
         * run's place in arrival order */
        if (!q->ticket)
            q->ticket = rt_queue_ticket(&rt->queue);
        iq.ticket = q->ticket;
        iq.defer_event = true;
        iq.deadline_ms = left; /* what is left of the run's: admission and queue */
        if (stream) {
            iq.on_event = agent_on_event;
            iq.on_event_ctx = &a;
        }
        a.gen = &iq;
        a.error_seen = false;
        snprintf(iq.method, sizeof iq.method, "POST");
        snprintf(iq.path, sizeof iq.path, "/v1/chat/completions");
        snprintf(iq.request_id, sizeof iq.request_id, "%s", q->request_id);
        memcpy(iq.tried, failed, sizeof iq.tried);
        iq.body = bs;
        iq.body_len = strlen(bs);
        rt__handle_generate(&iq, true);
        free(bs);
        a.gen = NULL;
        if (iq.failover_first_error && a.text_sent)
            resumed = true; /* the relay resumed the answer's stream */
        if (iq.failover_first_error) {
            if (!run_first_error)
                run_first_error = iq.failover_first_error;
            else
                json_decref(iq.failover_first_error);
        }
        q->attempts += iq.attempts;
        if (iq.worker[0] && !a.text_sent)
            snprintf(q->worker, sizeof q->worker, "%s", iq.worker);
        if (iq.worker_failed) {
            pthread_mutex_lock(&rt->pool.mu);
            RT_POOL_FOR_LIVE(&rt->pool, i)
                if (!strcmp(rt->pool.w[i].cfg.name, iq.worker))
                    failed[i] = true;
            pthread_mutex_unlock(&rt->pool.mu);
        }
        if (a.ended || (a.text_sent && q->write_failed)) {
            /* the stream already ended at the client (an error event after
             * text, or the client left) */
            rt__capture_free(&iq.cap);
            goto out;
        }
        /* The run's own failover, from the replay table: the generation
         * stopped (single_pass) without text at the client; the tool steps
         * so far are in the ledger (a tool whose outcome stayed unknown
         * ended the run in run_step already). */
        rt_failover_in fi = {iq.outcome,     false, 0,     a.text_sent,
                             iq.outcome_kind, n_steps > 0 ? RT_TOOL_EXECUTED : RT_TOOL_NONE,
                             false,          rt->sabotage.no_replay, rt->sabotage.no_resume,
                             false,          false,
                             RT_LSR_OK,      false,
                             false};
        rt_failover f = {RT_FO_STOP, NULL, NULL, NULL, false, false, false};
        if (iq.worker_failed && !a.text_sent)
            f = rt_failover_decide(&fi);
        if (f.action == RT_FO_REPLAY && run_attempts < cfg->max_attempts) {
            rt__capture_free(&iq.cap);
            SW_WARN("router", "agent run %s: the worker failed in generation %d; the run is "
                    "replayed (%s)", q->request_id, gen + 1, f.reason);
            if (!replay_start)
                replay_start = rt__wall_s();
            goto run;
        }
        json_t *resp = NULL;
        if (iq.cap.status == 200 && iq.cap.stream)
            resp = iq.completed && !iq.cap.overflow ? completion_from_sse(iq.cap.body, iq.cap.len)
                                                    : NULL;
        else if (iq.cap.status == 200)
            resp = sw_json_loadb(iq.cap.body, iq.cap.len, JSON_ALLOW_NUL, NULL);
        if (!resp && (iq.cap.status != 200 || iq.cap.stream)) {
            forward(&a, &iq.cap);
            rt__capture_free(&iq.cap);
            goto out;
        }
        rt__capture_free(&iq.cap);
        json_t *msg = json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "message");
        json_t *tcs = json_object_get(msg, "tool_calls");
        if (!resp || !msg) {
            json_decref(resp);
            run_fail(&a, 502, "worker_failed", "the worker's answer was not a chat completion",
                     NULL, NULL);
            goto out;
        }
        json_t *usage = json_object_get(resp, "usage");
        use_prompt += json_integer_value(json_object_get(usage, "prompt_tokens"));
        use_completion += json_integer_value(json_object_get(usage, "completion_tokens"));
        snprintf(final_worker, sizeof final_worker, "%s", iq.worker);
        if (!json_is_array(tcs) || json_array_size(tcs) == 0 || n_steps >= cfg->max_tool_steps) {
            final = resp;
            break;
        }
        json_t *calls = json_array();
        json_t *tool_msgs = json_array();
        for (size_t k = 0; k < json_array_size(tcs) && n_steps < cfg->max_tool_steps; k++) {
            json_t *tc = json_array_get(tcs, k);
            json_t *fn = json_object_get(tc, "function");
            char tool_name[64], call_id[64];
            /* a name over the limit becomes an invalid call, never a cut
             * name that might be a configured tool */
            keep_name(json_string_value(json_object_get(fn, "name")) ?: "", tool_name,
                      sizeof tool_name);
            int step = ++n_steps;
            if (json_is_string(json_object_get(tc, "id")))
                copy_utf8(call_id, sizeof call_id, json_string_value(json_object_get(tc, "id")));
            else
                snprintf(call_id, sizeof call_id, "call_%d", step);
            const char *arg_text = json_string_value(json_object_get(fn, "arguments"));
            char *args = sw_strdup(arg_text ? arg_text : "");
            char *result = NULL;
            bool reused = false;
            if (!args || run_step(&a, step, allowed, tool_name, sizeof tool_name, &args, call_id,
                                  sizeof call_id, &result, &reused)) {
                if (!args)
                    run_fail(&a, 500, "internal_error", "out of memory", NULL, NULL);
                sw_free(args);
                sw_free(result);
                json_decref(calls);
                json_decref(tool_msgs);
                json_decref(resp);
                goto out;
            }
            json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", call_id,
                                                   "type", "function", "function", "name",
                                                   tool_name, "arguments", args));
            json_array_append_new(tool_msgs, json_pack("{s:s, s:s, s:s}", "role", "tool",
                                                       "tool_call_id", call_id, "content", result));
            n_reused += reused;
            json_array_append_new(steps, json_pack("{s:i, s:s, s:s, s:s, s:b}", "step", step,
                                                   "tool", tool_name, "arguments", args, "result",
                                                   result, "reused", reused));
            sw_free(args);
            sw_free(result);
        }
        json_array_append_new(msgs, json_pack("{s:s, s:n, s:o}", "role", "assistant", "content",
                                              "tool_calls", calls));
        json_array_extend(msgs, tool_msgs);
        json_decref(tool_msgs);
        json_decref(resp);
    }
    {
        json_t *sp = json_object_get(final, "spillway");
        if (!json_is_object(sp)) {
            sp = json_object();
            json_object_set_new(final, "spillway", sp);
        }
        json_object_set(sp, "tool_steps", steps);
        json_object_set_new(sp, "run_attempts", json_integer(run_attempts));
        /* what the client is billed for: every generation of the run */
        json_object_set_new(final, "usage",
                            json_pack("{s:I, s:I, s:I}", "prompt_tokens", use_prompt,
                                      "completion_tokens", use_completion, "total_tokens",
                                      use_prompt + use_completion));
        if (stream && a.text_sent) {
            finish_stream(&a, final, stream_usage);
        } else if (stream) {
            send_as_stream(q, final, stream_usage);
        } else {
            char *s = sw_json_dumps(final, JSON_COMPACT);
            if (s) {
                rt__send_response(q, 200, "application/json", NULL, s, strlen(s));
                q->completed = true;
                free(s);
            } else {
                rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
            }
        }
        SW_INFO("router", "agent run %s: %d tool step(s), %d attempt(s)", q->request_id, n_steps,
                q->attempts);
    }
out:
    if (run_first_error) {
        /* one record for the run: a generation failed on a worker; the
         * run was replayed from the start (tool steps from the ledger) and
         * completed on final_worker, or it failed */
        bool done = q->completed && final;
        bool replayed = replay_start > 0;
        json_t *usage = json_object_get(final, "usage");
        json_int_t toks = json_integer_value(json_object_get(usage, "completion_tokens"));
        json_t *ev = json_pack(
            "{s:s, s:f, s:o, s:s, s:s, s:s?, s:o, s:f, s:I, s:i, s:i, s:i, s:i, s:s, s:b, s:b, "
            "s:b}",
            "request_id", q->request_id, "received_time", t_received, "first_error",
            run_first_error, "decision", replayed ? "replay" : resumed ? "resume" : "none",
            "reason",
            replayed ? "agent run: a generation failed, so the run was replayed from the start on "
                       "the next worker; tool steps recorded in the ledger were reused, not "
                       "called again"
            : resumed ? "agent run: the answer's stream failed after text reached the client, so "
                        "it was resumed on the next worker after the tokens sent (the run was "
                        "not replayed: no text is generated twice)"
                      : "agent run: a generation failed and the run was not replayed (attempts "
                        "used up, or SPILLWAY_SABOTAGE=no-replay)",
            "replay_worker", done && final_worker[0] ? final_worker : NULL, "cpu_start_time",
            replayed ? json_real(replay_start) : json_null(), "completion_time", rt__wall_s(),
            "tokens", toks, "attempts", q->attempts, "run_attempts", run_attempts,
            "tool_steps", (int)json_array_size(steps), "tool_steps_reused", n_reused,
            "outcome", done ? "completed" : q->write_failed ? "cancelled" : "failed",
            "client_connected", !q->write_failed, "stream", stream, "agent_run", true);
        run_first_error = NULL; /* the record owns it (json_pack "o") */
        if (ev)
            rt__ev_record(rt, ev);
        json_decref(ev);
    }
    json_decref(a.created);
    json_decref(a.model);
    json_decref(final);
    json_decref(steps);
    json_decref(msgs);
    json_decref(base);
    json_decref(tools);
}
