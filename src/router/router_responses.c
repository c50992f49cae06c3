/* router_responses.c - OpenAI's Responses API on the router: POST
 * /v1/responses, GET and DELETE /v1/responses/{id}.
 *
 * A Responses body is translated (api_responses.h) into a chat body that
 * replaces the request's body, and the request then takes the chat
 * route whole: idempotency keys, admission and queueing, the capacity
 * fallback, failover and resume. Only the answer is translated, where it
 * leaves for the client: a whole answer through the request's body
 * filter (rt_req.on_body, called by rt__send_response; an error there
 * names the Responses parameter, not the chat one), a
 * stream through its event filter (rt_req.on_event, called by
 * rt_sink_event for each chat chunk). The chat stream between the router
 * and its workers is unchanged, so a stream resumed on another worker
 * reaches the client as one Responses stream.
 *
 * Stored responses (store, true unless the body says false) are in the
 * ledger: the conversation up to the response (every earlier turn's
 * input and output items and its own input) and the Response object. A
 * later body's previous_response_id puts that conversation and that
 * output before its own input. background: true stores the chat body as
 * a durable job (router_jobs.c) and answers at once with the queued
 * response; GET /v1/responses/{id} reads the job's state and, once it
 * succeeded, its translated answer, stored then.
 */
#include "router/router-impl.h"

#include "api/api_responses.h"
#include "common/alloc.h"
#include "common/json_big.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

/* One Responses request's translation state. */
typedef struct resp_ctx {
    json_t *body;           /* the Responses body */
    char id[96];            /* resp_... */
    int64_t created_at;
    api_resp_stream *st;    /* a stream's translation */
    json_t *answer;         /* a whole answer's Response, once sent */
} resp_ctx;

static void send_json(rt_req *q, int status, const json_t *j)
{
    char *s = j ? sw_json_dumps(j, JSON_COMPACT) : NULL;
    if (s)
        rt__send_response(q, status, "application/json", NULL, s, strlen(s));
    else
        rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
    free(s);
}

/* An error whose param is the chat body's, sent naming the Responses
 * parameter it came from. */
static void send_error_body(rt_req *q, int status, const char *ctype, const char *extra,
                            const char *body, size_t len)
{
    json_t *j = sw_json_loadb(body, len, 0, NULL);
    json_t *e = json_object_get(j, "error");
    const char *param = json_string_value(json_object_get(e, "param"));
    const char *mapped = param ? api_responses_param(param) : NULL;
    char *s = NULL;
    if (mapped && mapped != param && json_object_set_new(e, "param", json_string(mapped)) == 0)
        s = sw_json_dumps(j, JSON_COMPACT);
    if (s)
        rt__send_response(q, status, ctype, extra, s, strlen(s));
    else
        rt__send_response(q, status, ctype, extra, body, len);
    free(s);
    json_decref(j);
}

/* rt_req.on_body: the chat answer becomes the Response. */
static void on_body(rt_req *q, int status, const char *ctype, const char *extra,
                    const char *body, size_t len)
{
    resp_ctx *c = q->on_event_ctx;
    if (status != 200) {
        send_error_body(q, status, ctype, extra, body, len);
        return;
    }
    json_t *chat = sw_json_loadb(body, len, JSON_ALLOW_NUL, NULL);
    const char *object = json_string_value(json_object_get(chat, "object"));
    json_t *r = NULL;
    if (object && !strcmp(object, "response")) /* a stored answer replayed (Idempotency-Key) */
        r = json_incref(chat);
    else if (chat)
        r = api_responses_from_chat(c->body, c->id, c->created_at, chat);
    json_decref(chat);
    char *s = r ? sw_json_dumps(r, JSON_COMPACT) : NULL;
    if (s) {
        rt__send_response(q, 200, ctype, extra, s, strlen(s));
        json_decref(c->answer);
        c->answer = r;
    } else {
        json_decref(r);
        rt__send_error(q, 500, "internal_error", "out of memory translating the answer", NULL,
                       NULL);
    }
    free(s);
}

/* Writes SSE text (events already framed) as one chunk, to the client and
 * the capture; -1 when the client is gone. */
static int write_events(rt_req *q, const char *text)
{
    size_t len = strlen(text);
    if (!len)
        return 0;
    if (q->cap.on)
        rt__capture_append(&q->cap, text, len);
    char hex[32];
    int n = snprintf(hex, sizeof hex, "%zx\r\n", len);
    if (rt__sink_write(q, hex, (size_t)n) || rt__sink_write(q, text, len) ||
        rt__sink_write(q, "\r\n", 2))
        return -1;
    return 0;
}

/* rt_req.on_event: a chat chunk (or [DONE], or an error event) becomes
 * the Responses events it stands for. */
static int on_event(rt_req *q, const char *payload)
{
    resp_ctx *c = q->on_event_ctx;
    char *text;
    if (!strcmp(payload, "[DONE]")) {
        text = api_resp_stream_end(c->st);
    } else {
        json_t *j = sw_json_loads(payload, JSON_ALLOW_NUL, NULL);
        text = j ? api_resp_stream_chunk(c->st, j) : NULL;
        json_decref(j);
    }
    if (!text)
        text = api_resp_stream_fail(c->st, "internal_error", "out of memory");
    int rc = text ? write_events(q, text) : -1;
    sw_free(text);
    return rc;
}

static json_t *stored_now(rt_req *q, const char *id, const ldg_response *sr);

/* The conversation a stored response continues: its conversation and
 * its output (reasoning items dropped by the translation). A new
 * reference in *prior, or an answer sent and false. */
static bool load_prior(rt_req *q, const char *prev_id, json_t **prior)
{
    rt_router *rt = q->rt;
    ldg_response sr;
    bool found = false;
    sw_error err;
    sw_error_clear(&err);
    if (strlen(prev_id) <= 200 && rt->ledger &&
        ldg_response_get(rt->ledger, prev_id, &sr, &found, &err)) {
        rt__ledger_unavailable(q, "the ledger could not be read", &err);
        return false;
    }
    if (!found) {
        char msg[320];
        snprintf(msg, sizeof msg, "no stored response '%.200s' (a response made with store "
                 "false is not kept)", prev_id);
        rt__send_error(q, 404, "not_found", msg, "previous_response_id", NULL);
        return false;
    }
    json_t *conv = sw_json_loads(sr.conversation, JSON_ALLOW_NUL, NULL);
    json_t *resp = stored_now(q, prev_id, &sr);
    ldg_response_free(&sr);
    const char *status = json_string_value(json_object_get(resp, "status"));
    if (!json_is_array(conv) || !status) {
        json_decref(conv);
        json_decref(resp);
        rt__send_error(q, 500, "internal_error", "the stored response cannot be read", NULL, NULL);
        return false;
    }
    if (strcmp(status, "completed") && strcmp(status, "incomplete")) {
        json_decref(conv);
        json_decref(resp);
        rt__send_error(q, 400, "invalid_request", "the previous response has not completed",
                       "previous_response_id", NULL);
        return false;
    }
    json_array_extend(conv, json_object_get(resp, "output"));
    json_decref(resp);
    *prior = conv;
    return true;
}

/* Stores a finished response: its conversation (prior and its input)
 * and the Response. */
static void store(rt_req *q, const json_t *body, const json_t *prior, const json_t *response,
                  const char *job_id)
{
    rt_router *rt = q->rt;
    json_t *conv = prior ? json_deep_copy(prior) : json_array();
    json_t *input = api_responses_input_items(body);
    char *cs = conv && input && json_array_extend(conv, input) == 0
                   ? sw_json_dumps(conv, JSON_COMPACT)
                   : NULL;
    char *rs = sw_json_dumps(response, JSON_COMPACT);
    sw_error err;
    sw_error_clear(&err);
    const char *id = json_string_value(json_object_get(response, "id"));
    if (!cs || !rs || !id ||
        ldg_response_put(rt->ledger, id, cs, rs, job_id, rt__wall_s(), &err))
        SW_WARN("router", "request %s: response not stored: %s", q->request_id,
                err.message[0] ? err.message : "out of memory");
    free(cs);
    free(rs);
    json_decref(conv);
    json_decref(input);
}

/* Replaces the request's body by the chat body; false when out of memory. */
static bool set_body(rt_req *q, const json_t *chat)
{
    char *s = sw_json_dumps(chat, JSON_COMPACT);
    size_t n = s ? strlen(s) : 0;
    char *b = s ? sw_malloc(n + 1) : NULL;
    if (b) {
        memcpy(b, s, n + 1);
        sw_free(q->body);
        q->body = b;
        q->body_len = n;
    }
    free(s);
    return b != NULL;
}

/* background: the chat body as a job; the queued response stored with it
 * and answered. */
static void create_background(rt_req *q, const json_t *body, const json_t *prior, json_t *chat,
                              const char *id, int64_t created_at)
{
    rt_router *rt = q->rt;
    const json_t *st = json_object_get(body, "stream");
    if (json_is_true(st)) {
        rt__send_error(q, 400, "invalid_request", "background responses are not streamed here: "
                       "poll GET /v1/responses/{id}", "stream", NULL);
        return;
    }
    char job_id[48];
    sw_error err;
    sw_error_clear(&err);
    json_t *r = api_responses_object(body, id, created_at, "queued", NULL);
    if (!r) {
        rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
        return;
    }
    if (rt__jobs_submit(rt, "chat", chat, job_id, sizeof job_id, &err)) {
        json_decref(r);
        rt__ledger_unavailable(q, "the background response could not be stored", &err);
        return;
    }
    store(q, body, prior, r, job_id);
    send_json(q, 200, r);
    json_decref(r);
}

static void create(rt_req *q)
{
    rt_router *rt = q->rt;
    json_error_t je;
    json_t *body = sw_json_loadb_big(q->body, q->body_len,
                                     JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    json_t *prior = NULL, *chat = NULL;
    resp_ctx c;
    memset(&c, 0, sizeof c);
    if (!body) {
        rt__send_error(q, sw_json_error_oom(&je) ? 500 : 400,
                       sw_json_error_oom(&je) ? "internal_error" : "invalid_json",
                       sw_json_error_oom(&je) ? "out of memory reading the body" : je.text, NULL,
                       NULL);
        return;
    }
    if (!json_is_object(body)) {
        rt__send_error(q, 400, "invalid_request", "the body must be a JSON object", NULL, NULL);
        goto done;
    }
    const json_t *v;
    static const char *const flags[] = {"store", "background", "stream"};
    for (size_t k = 0; k < 3; k++) {
        v = json_object_get(body, flags[k]);
        if (v && !json_is_null(v) && !json_is_boolean(v)) {
            char msg[64];
            snprintf(msg, sizeof msg, "%s must be a boolean", flags[k]);
            rt__send_error(q, 400, "invalid_request", msg, flags[k], NULL);
            goto done;
        }
    }
    bool keep = !json_is_false(json_object_get(body, "store"));
    bool background = json_is_true(json_object_get(body, "background"));
    if ((keep || background) && !rt->ledger) {
        /* nothing to keep it in: an answer that is not stored is still an
         * answer, a background one is not */
        keep = false;
        if (background) {
            rt__send_error(q, 400, "invalid_request", "background responses need the router's "
                           "ledger (state-dir)", "background", NULL);
            goto done;
        }
    }
    if (background && !rt->jobs) {
        rt__send_error(q, 400, "invalid_request", "background responses need the router's job "
                       "runners", "background", NULL);
        goto done;
    }
    v = json_object_get(body, "previous_response_id");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v)) {
            rt__send_error(q, 400, "invalid_request", "previous_response_id must be a string",
                           "previous_response_id", NULL);
            goto done;
        }
        if (!load_prior(q, json_string_value(v), &prior))
            goto done;
    }
    api_error e;
    memset(&e, 0, sizeof e);
    if (!(chat = api_responses_chat(body, prior, &e))) {
        rt__send_error(q, e.status ? e.status : 400, e.code ? e.code : "invalid_request", e.msg,
                       e.param, NULL);
        goto done;
    }
    snprintf(c.id, sizeof c.id, "resp_%s", q->request_id);
    c.created_at = (int64_t)rt__wall_s();
    c.body = body;
    if (background) {
        create_background(q, body, prior, chat, c.id, c.created_at);
        goto done;
    }
    /* a stored response is promised to a later GET: not generated while
     * the ledger is away */
    if (keep && !rt__ledger_ready(q))
        goto done;
    bool stream = json_is_true(json_object_get(body, "stream"));
    if (stream && !(c.st = api_resp_stream_new(body, c.id, c.created_at))) {
        rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
        goto done;
    }
    if (!set_body(q, chat)) {
        rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
        goto done;
    }
    /* Prefer: respond-async would answer a spillway job, which a
     * Responses client does not read: background is its way */
    q->prefer_async = false;
    q->on_event_ctx = &c;
    q->on_body = on_body; /* a stream's errors before it began too */
    if (stream) {
        q->on_event = on_event;
        q->on_event_captures = true;
    }
    rt__with_idempotency(q, rt__dispatch_generate, true);
    q->on_event = NULL;
    q->on_body = NULL;
    q->on_event_ctx = NULL;
    const json_t *answer = stream ? api_resp_stream_response(c.st) : c.answer;
    const char *status = json_string_value(json_object_get(answer, "status"));
    bool finished = answer && status && (stream ? api_resp_stream_ended(c.st) : true) &&
                    (!strcmp(status, "completed") || !strcmp(status, "incomplete"));
    if (keep && finished)
        store(q, body, prior, answer, NULL);
done:
    api_resp_stream_free(c.st);
    json_decref(c.answer);
    json_decref(chat);
    json_decref(prior);
    json_decref(body);
}

/* A background response whose job has finished since: the stored
 * response brought up to date (completed, or failed with the job's
 * error). Returns a new reference, or NULL to keep the stored one. */
static json_t *background_update(rt_req *q, const char *id, const json_t *stored,
                                 const char *job_id)
{
    rt_router *rt = q->rt;
    ldg_job j;
    bool found = false;
    if (ldg_job_get(rt->ledger, job_id, &j, &found, NULL) || !found)
        return NULL;
    json_t *r = NULL;
    if (j.state == LDG_JOB_RUNNING) {
        r = json_deep_copy(stored);
        json_object_set_new(r, "status", json_string("in_progress"));
    } else if (j.state == LDG_JOB_SUCCEEDED && j.response) {
        json_t *chat = sw_json_loads(j.response, JSON_ALLOW_NUL, NULL);
        r = chat ? api_responses_from_chat(stored, id,
                                           json_integer_value(json_object_get(stored,
                                                                              "created_at")),
                                           chat)
                 : NULL;
        json_decref(chat);
        /* the echo of a background request: its settings, as stored */
        if (r)
            json_object_set_new(r, "background", json_true());
    } else if (j.state == LDG_JOB_FAILED) {
        r = json_deep_copy(stored);
        json_t *e = j.error ? sw_json_loads(j.error, 0, NULL) : NULL;
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        json_object_set_new(r, "status", json_string("failed"));
        json_object_set_new(r, "error",
                            json_pack("{s:s, s:s}", "code", code ? code : "server_error",
                                      "message", msg ? msg : "the job failed"));
        json_decref(e);
    }
    ldg_job_free(&j);
    return r;
}

/* The stored Response sr as it is now: a background one whose job has
 * finished since is brought up to date (and stored so). A new reference,
 * NULL when it cannot be read. */
static json_t *stored_now(rt_req *q, const char *id, const ldg_response *sr)
{
    rt_router *rt = q->rt;
    json_t *r = sw_json_loads(sr->response, JSON_ALLOW_NUL, NULL);
    const char *status = json_string_value(json_object_get(r, "status"));
    if (r && sr->job_id[0] && status &&
        (!strcmp(status, "queued") || !strcmp(status, "in_progress"))) {
        json_t *now = background_update(q, id, r, sr->job_id);
        const char *ns = json_string_value(json_object_get(now, "status"));
        if (now && ns && strcmp(ns, "in_progress")) { /* finished: stored as it is now */
            sw_error err;
            sw_error_clear(&err);
            char *s = sw_json_dumps(now, JSON_COMPACT);
            if (!s || ldg_response_put(rt->ledger, id, sr->conversation, s, sr->job_id,
                                       sr->created, &err))
                SW_WARN("router", "response %s: its finished state not stored", id);
            free(s);
        }
        if (now) {
            json_decref(r);
            r = now;
        }
    }
    return r;
}

static void get_or_delete(rt_req *q, const char *id, bool del)
{
    rt_router *rt = q->rt;
    sw_error err;
    sw_error_clear(&err);
    bool found = false;
    if (!rt->ledger || strlen(id) > 200 || strchr(id, '/')) {
        rt__send_error(q, 404, "not_found", "no such stored response", NULL, NULL);
        return;
    }
    if (del) {
        if (ldg_response_delete(rt->ledger, id, &found, &err))
            rt__ledger_unavailable(q, "the ledger could not delete it", &err);
        else if (!found)
            rt__send_error(q, 404, "not_found", "no such stored response", NULL, NULL);
        else {
            json_t *o = json_pack("{s:s, s:s, s:b}", "id", id, "object", "response.deleted",
                                  "deleted", 1);
            send_json(q, 200, o);
            json_decref(o);
        }
        return;
    }
    ldg_response sr;
    if (ldg_response_get(rt->ledger, id, &sr, &found, &err)) {
        rt__ledger_unavailable(q, "the ledger could not be read", &err);
        return;
    }
    if (!found) {
        rt__send_error(q, 404, "not_found", "no such stored response", NULL, NULL);
        return;
    }
    json_t *r = stored_now(q, id, &sr);
    ldg_response_free(&sr);
    if (r)
        send_json(q, 200, r);
    else
        rt__send_error(q, 500, "internal_error", "the stored response cannot be read", NULL, NULL);
    json_decref(r);
}

void rt__handle_responses(rt_req *q)
{
    bool post = !strcmp(q->method, "POST"), get = !strcmp(q->method, "GET");
    bool del = !strcmp(q->method, "DELETE");
    /* a query (the SDKs' include[], stream on a retrieve) is not read */
    char path[sizeof q->path];
    snprintf(path, sizeof path, "%.*s", (int)strcspn(q->path, "?"), q->path);
    if (!strcmp(path, "/v1/responses")) {
        if (!post)
            rt__send_error(q, 405, "method_not_allowed", "use POST", NULL, NULL);
        else
            create(q);
        return;
    }
    const char *id = path + strlen("/v1/responses/");
    if (!get && !del)
        rt__send_error(q, 405, "method_not_allowed", "use GET or DELETE", NULL, NULL);
    else
        get_or_delete(q, id, del);
}
