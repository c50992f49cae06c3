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
 * steps the same way after the restart.
 */
#include "router/router-impl.h"
#include "router/router_net.h"

#include "common/alloc.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tool answers longer than this are cut (they go back into the prompt). */
#define RT_MAX_TOOL_RESULT ((size_t)256 << 10)
/* Calls of an idempotent tool whose outcome stays unknown, per step. */
#define RT_TOOL_TRIES 3

static const rt_tool_config *find_tool(const char *name, const bool *allowed)
{
    for (int i = 0; name && i < rt__g.cfg->n_tools; i++)
        if (allowed[i] && !strcmp(rt__g.cfg->tools[i].name, name))
            return &rt__g.cfg->tools[i];
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

/* One POST to the tool. Returns 1 when the outcome is known (*result set:
 * the body of a 2xx, or an error text), 0 when unknown (time-out, dropped
 * connection: the tool may or may not have acted). *result: sw_free. */
static int call_tool(const rt_tool_config *t, const char *request_id, int step, const char *args,
                     char **result)
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
    int rc = rn_request(&c, address, "POST", path, hdr, args, strlen(args), -1, t->timeout_ms);
    pthread_mutex_lock(&rt__g.mu);
    rt__g.tool_calls++;
    pthread_mutex_unlock(&rt__g.mu);
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
    int br = rn_body_all(&c, &body, &len, RT_MAX_TOOL_RESULT);
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
    size_t ml = strlen(msg), show = len > 200 ? 200 : len;
    while (show > 0 && show < len && ((unsigned char)body[show] & 0xc0) == 0x80)
        show--; /* not inside a UTF-8 sequence */
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

static void ledger_fail(rt_req *q, const sw_error *err)
{
    SW_ERROR("router", "request %s: %s", q->request_id, err->message);
    rt__send_error(q, 503, "ledger_unavailable", "the tool ledger could not be written", NULL,
                   "Retry-After: 1\r\n");
}

/* The outcome of one step: 0 to go on (*result set, *reused), -1 when the
 * run ended (the response was sent). */
static int run_step(rt_req *q, int step, const bool *allowed, char *tool_name, size_t tool_cap,
                    char **args, char *call_id, size_t call_cap, char **result, bool *reused)
{
    sw_error err;
    sw_error_clear(&err);
    *result = NULL;
    *reused = false;
    if (!rt__g.sabotage.no_tool_ledger) {
        ldg_tool_step rec;
        bool found = false;
        if (ldg_tool_get(rt__g.ledger, q->request_id, step, &rec, &found, &err)) {
            ledger_fail(q, &err);
            return -1;
        }
        if (found) {
            /* the recorded call wins over what was generated this time */
            snprintf(tool_name, tool_cap, "%s", rec.tool);
            snprintf(call_id, call_cap, "%s", rec.call_id);
            sw_free(*args);
            *args = rec.arguments;
            rec.arguments = NULL;
            if (rec.state == LDG_TOOL_DONE) {
                *result = rec.result;
                rec.result = NULL;
                *reused = true;
                ldg_tool_step_free(&rec);
                pthread_mutex_lock(&rt__g.mu);
                rt__g.tool_reused++;
                pthread_mutex_unlock(&rt__g.mu);
                SW_INFO("router", "request %s: tool step %d (%s) reused from the ledger",
                        q->request_id, step, tool_name);
                return 0;
            }
            ldg_tool_step_free(&rec);
            const rt_tool_config *t = find_tool(tool_name, allowed);
            if (!t || !t->idempotent) {
                char msg[300];
                snprintf(msg, sizeof msg,
                         "tool step %d (%s) was started but its outcome is unknown, and the tool "
                         "is not idempotent: the run is not retried",
                         step, tool_name);
                SW_WARN("router", "request %s: %s", q->request_id, msg);
                rt__send_error(q, 502, "unsafe_to_retry", msg, NULL, NULL);
                return -1;
            }
            SW_INFO("router", "request %s: tool step %d (%s) has an unknown outcome; the tool is "
                    "idempotent: called again with the same Idempotency-Key",
                    q->request_id, step, tool_name);
        }
    }
    const rt_tool_config *t = find_tool(tool_name, allowed);
    json_t *aj = json_loads(*args ? *args : "", 0, NULL);
    bool args_ok = json_is_object(aj);
    json_decref(aj);
    char msg[200];
    if (!t || !args_ok) {
        /* nothing to call: the error goes back to the model as the result */
        if (!t)
            snprintf(msg, sizeof msg, "error: %s is not an available tool", tool_name);
        else
            snprintf(msg, sizeof msg, "error: the arguments are not a JSON object");
        *result = sw_strdup(msg);
        if (!*result ||
            ldg_tool_started(rt__g.ledger, q->request_id, step, tool_name, call_id,
                             *args ? *args : "", rt__wall_s(), &err) ||
            ldg_tool_done(rt__g.ledger, q->request_id, step, *result, rt__wall_s(), &err)) {
            ledger_fail(q, &err);
            return -1;
        }
        return 0;
    }
    /* committed before the call (a re-call counts in the step's calls) */
    if (ldg_tool_started(rt__g.ledger, q->request_id, step, tool_name, call_id, *args,
                         rt__wall_s(), &err)) {
        ledger_fail(q, &err);
        return -1;
    }
    if (rt__g.fault_exit_after_tool_started) {
        SW_WARN("router", "SPILLWAY_FAULT router_exit_after_tool_started: exiting (status 70)");
        _exit(70);
    }
    int known = 0;
    for (int i = 0; i < RT_TOOL_TRIES && !known; i++) {
        if (i > 0 && !t->idempotent)
            break;
        if (i > 0)
            SW_INFO("router", "request %s: tool %s gave no answer; idempotent: calling again",
                    q->request_id, t->name);
        known = call_tool(t, q->request_id, step, *args, result);
    }
    if (rt__g.fault_exit_after_tool_called) {
        SW_WARN("router", "SPILLWAY_FAULT router_exit_after_tool_called: exiting (status 70)");
        _exit(70);
    }
    if (!known && !t->idempotent) {
        char emsg[300];
        snprintf(emsg, sizeof emsg,
                 "tool step %d (%s): no answer within %d ms (time-out or dropped connection); the "
                 "tool is not idempotent, so it is not called again",
                 step, t->name, t->timeout_ms);
        SW_WARN("router", "request %s: %s", q->request_id, emsg);
        rt__send_error(q, 502, "unsafe_to_retry", emsg, NULL, NULL);
        return -1;
    }
    if (!known) {
        snprintf(msg, sizeof msg, "error: the tool %s did not answer", t->name);
        *result = sw_strdup(msg);
    }
    if (!*result || ldg_tool_done(rt__g.ledger, q->request_id, step, *result, rt__wall_s(), &err)) {
        ledger_fail(q, &err);
        return -1;
    }
    return 0;
}

/* Writes one SSE event (headers first) to the client and the capture. */
static int sse_event(rt_req *q, bool *head_sent, const char *payload)
{
    if (!*head_sent) {
        char head[600];
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                         "Connection: %s\r\nX-Request-Id: %s\r\nX-Spillway-Worker: %s\r\n"
                         "X-Spillway-Attempts: %d\r\n\r\n",
                         rt__conn_hdr(q), q->request_id, q->worker, q->attempts);
        rt__chunked_begin(q);
        if (rt__sink_write(q, head, (size_t)n))
            return -1;
        *head_sent = true;
        if (q->cap.on) {
            q->cap.status = 200;
            q->cap.stream = true;
            q->cap.len = 0;
            snprintf(q->cap.content_type, sizeof q->cap.content_type, "text/event-stream");
        }
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

/* A streaming agent run: the loop runs as usual, then the final answer
 * goes out as chat.completion.chunk events (the role and the whole
 * content, then the finish reason with the spillway extension, the usage
 * when asked, [DONE]). Tokens are not streamed as they are generated:
 * the tool steps come first, and a replayed run must not show the
 * client a first attempt's text. */
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
        char *s = json_dumps(evs[i], JSON_COMPACT);
        ok = s && sse_event(q, &head, s) == 0;
        free(s);
    }
    if (ok)
        ok = sse_event(q, &head, "[DONE]") == 0 && rt__sink_write(q, "0\r\n\r\n", 5) == 0;
    if (ok)
        rt__chunked_end(q);
    q->completed = ok;
    for (int i = 0; i < 3; i++)
        json_decref(evs[i]);
    json_decref(base);
}

/* The generation's error response, passed on as the run's answer. */
static void forward(rt_req *q, const rt_capture *c)
{
    if (c->status > 0 && c->body)
        rt__send_response(q, c->status, c->content_type[0] ? c->content_type : "application/json",
                          c->status == 503 ? "Retry-After: 1\r\n" : NULL, c->body, c->len);
    else
        rt__send_error(q, 500, "internal_error", "the generation produced no response", NULL, NULL);
}

void rt__handle_agent(rt_req *q, json_t *body)
{
    const rt_config *cfg = rt__g.cfg;
    json_t *tools = NULL, *base = NULL, *msgs = NULL, *steps = NULL, *final = NULL;
    /* the failover record of the run: the first generation failure, when
     * the replay started and which worker gave the final answer */
    json_t *run_first_error = NULL;
    double t_received = rt__wall_s(), replay_start = 0;
    char final_worker[64] = "";
    int n_reused = 0;
    bool allowed[RT_MAX_TOOLS] = {false};
    bool stream = json_is_true(json_object_get(body, "stream"));
    bool stream_usage = json_is_true(
        json_object_get(json_object_get(body, "stream_options"), "include_usage"));
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
            int found = -1;
            for (int i = 0; name && i < cfg->n_tools; i++)
                if (!strcmp(cfg->tools[i].name, name))
                    found = i;
            if (!type || strcmp(type, "function") || found < 0) {
                char msg[200];
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
        bool ok = cs ? (!strcmp(cs, "auto") || !strcmp(cs, "none") || !strcmp(cs, "required"))
                     : (json_is_object(choice) && fname && find_tool(fname, allowed));
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
        json_t *params = json_loads(cfg->tools[i].parameters, 0, NULL);
        json_array_append_new(
            tools, json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name",
                             cfg->tools[i].name, "description", cfg->tools[i].description,
                             "parameters", params ? params : json_object()));
    }
    base = json_deep_copy(body);
    json_object_del(base, "tool_execution");
    json_object_del(base, "stream");
    json_object_del(base, "stream_options");
    if (!json_object_get(base, "seed")) {
        /* one seed for the whole run (and its replays) */
        pthread_mutex_lock(&rt__g.mu);
        uint64_t s = (uint64_t)(rt__wall_s() * 1e6) ^ (++rt__g.seq * 0x9E3779B97F4A7C15ull);
        pthread_mutex_unlock(&rt__g.mu);
        json_object_set_new(base, "seed", json_integer((json_int_t)(s & 0x7fffffff)));
    }
    json_object_set(base, "tools", tools);
    /* workers that failed in this run: the replay avoids them (a worker
     * that answered a generation stays eligible for the next one) */
    bool failed[RT_MAX_WORKERS] = {false};
    int run_attempts = 0;

run:
    run_attempts++;
    json_decref(msgs);
    json_decref(steps);
    msgs = json_deep_copy(messages);
    steps = json_array();
    int n_steps = 0;
    for (int gen = 0;; gen++) {
        json_t *b = json_deep_copy(base);
        json_object_set(b, "messages", msgs);
        if (n_steps >= cfg->max_tool_steps)
            json_object_set_new(b, "tool_choice", json_string("none"));
        else if (gen == 0 && choice)
            json_object_set(b, "tool_choice", choice);
        else
            json_object_set_new(b, "tool_choice", json_string("auto"));
        char *bs = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        if (!bs) {
            rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
            goto out;
        }
        rt_req iq;
        memset(&iq, 0, sizeof iq);
        iq.fd = -1;
        iq.cap.on = true;
        iq.single_pass = true;
        iq.defer_event = true;
        iq.deadline_ms = q->deadline_ms;
        snprintf(iq.method, sizeof iq.method, "POST");
        snprintf(iq.path, sizeof iq.path, "/v1/chat/completions");
        snprintf(iq.request_id, sizeof iq.request_id, "%s", q->request_id);
        memcpy(iq.tried, failed, sizeof iq.tried);
        iq.body = bs;
        iq.body_len = strlen(bs);
        rt__handle_generate(&iq, true);
        free(bs);
        if (iq.failover_first_error) {
            if (!run_first_error)
                run_first_error = iq.failover_first_error;
            else
                json_decref(iq.failover_first_error);
        }
        q->attempts += iq.attempts;
        if (iq.worker[0])
            snprintf(q->worker, sizeof q->worker, "%s", iq.worker);
        if (iq.worker_failed)
            for (int i = 0; i < rt__g.n; i++)
                if (!strcmp(rt__g.w[i].cfg.name, iq.worker))
                    failed[i] = true;
        if (iq.worker_failed && !rt__g.sabotage.no_replay && run_attempts < cfg->max_attempts) {
            rt__capture_free(&iq.cap);
            SW_WARN("router", "agent run %s: the worker failed in generation %d; the run is "
                    "replayed (recorded tool steps are reused, not called again)",
                    q->request_id, gen + 1);
            if (!replay_start)
                replay_start = rt__wall_s();
            goto run;
        }
        if (iq.cap.status != 200) {
            forward(q, &iq.cap);
            rt__capture_free(&iq.cap);
            goto out;
        }
        json_t *resp = json_loadb(iq.cap.body, iq.cap.len, 0, NULL);
        rt__capture_free(&iq.cap);
        json_t *msg = json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "message");
        json_t *tcs = json_object_get(msg, "tool_calls");
        if (!resp || !msg) {
            json_decref(resp);
            rt__send_error(q, 502, "worker_failed", "the worker's answer was not a chat completion",
                           NULL, NULL);
            goto out;
        }
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
            snprintf(tool_name, sizeof tool_name, "%s",
                     json_string_value(json_object_get(fn, "name")) ?: "");
            int step = ++n_steps;
            if (json_is_string(json_object_get(tc, "id")))
                snprintf(call_id, sizeof call_id, "%s", json_string_value(json_object_get(tc, "id")));
            else
                snprintf(call_id, sizeof call_id, "call_%d", step);
            const char *a = json_string_value(json_object_get(fn, "arguments"));
            char *args = sw_strdup(a ? a : "");
            char *result = NULL;
            bool reused = false;
            if (!args || run_step(q, step, allowed, tool_name, sizeof tool_name, &args, call_id,
                                  sizeof call_id, &result, &reused)) {
                if (!args)
                    rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
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
        char *s = stream ? NULL : json_dumps(final, JSON_COMPACT);
        if (stream) {
            send_as_stream(q, final, stream_usage);
        } else if (s) {
            rt__send_response(q, 200, "application/json", NULL, s, strlen(s));
            free(s);
        } else {
            rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
        }
        if (!stream)
            q->completed = true;
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
            run_first_error, "decision", replayed ? "replay" : "none", "reason",
            replayed ? "agent run: a generation failed, so the run was replayed from the start on "
                       "the next worker; tool steps recorded in the ledger were reused, not "
                       "called again"
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
            rt__ev_record(ev);
        json_decref(ev);
    }
    json_decref(final);
    json_decref(steps);
    json_decref(msgs);
    json_decref(base);
    json_decref(tools);
}
