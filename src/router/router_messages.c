/* router_messages.c - Anthropic's Messages API through the router
 * (POST /v1/messages, /v1/messages/count_tokens; docs/api.md).
 *
 * The body is translated to the chat-completions body it means
 * (api/messages.h) and served as /v1/chat/completions is: admission and
 * the queue, the smaller-model fallback, Idempotency-Key, failover and
 * the resume of a cut stream. Between router and workers the request
 * stays a chat request; only what reaches the client is translated: a
 * whole answer in rt__send_response (rt__messages_body), a stream event
 * by event in rt_sink_event's per-request filter (rt_req.on_event), so a
 * stream resumed on another worker is still one Messages stream.
 * count_tokens is answered here with the model's tokenizer and template,
 * as a worker counts the prompt (api_chat_prompt_tokens).
 */
#include "router/router-impl.h"

#include "api/messages.h"
#include "common/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether path is want, with or without a query (the SDKs' ?beta=true). */
static bool path_is(const char *path, const char *want)
{
    size_t n = strlen(want);
    return strncmp(path, want, n) == 0 && (path[n] == '\0' || path[n] == '?');
}

bool rt__messages_path(const char *path)
{
    return path_is(path, API_MSG_PATH) || path_is(path, API_MSG_COUNT_PATH);
}

char *rt__messages_body(int status, const char *body, size_t len, size_t *out_len)
{
    json_t *j = body ? sw_json_loadb(body, len, JSON_ALLOW_NUL, NULL) : NULL;
    if (!j)
        return NULL;
    json_t *o = NULL;
    const char *object = json_string_value(json_object_get(j, "object"));
    if (status >= 400 || json_object_get(j, "error"))
        o = api_msg_error_from_chat(status, j);
    else if (object && strcmp(object, "chat.completion") == 0)
        o = api_msg_from_chat(j);
    json_decref(j);
    char *text = o ? sw_json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return NULL;
    size_t n = strlen(text);
    char *out = sw_malloc(n + 1);
    if (out) {
        memcpy(out, text, n + 1);
        *out_len = n;
    }
    free(text);
    return out;
}

/* rt_req.on_event of a streamed Messages request: each chat payload the
 * relay would send becomes the Anthropic events it means, one chunk; the
 * capture (Idempotency-Key) keeps those events instead of the chat
 * payload, so that a replay is the same Messages stream. */
static int on_event(rt_req *q, const char *payload)
{
    api_msg_stream *s = q->on_event_ctx;
    size_t len = strlen(payload);
    if (q->cap.on && q->cap.len >= len + 8)
        q->cap.len -= len + 8; /* "data: " payload "\n\n", just appended */
    api_msg_stream_feed(s, payload, len);
    if (s->oom) /* an event lost: the client is told, and the stream ends */
        api_msg_stream_fail(s, 500, "out of memory");
    if (s->out_len == 0)
        return 0;
    if (q->cap.on)
        rt__capture_append(&q->cap, s->out, s->out_len);
    char hex[32];
    int n = snprintf(hex, sizeof hex, "%zx\r\n", s->out_len);
    if (rt__sink_write(q, hex, (size_t)n) || rt__sink_write(q, s->out, s->out_len) ||
        rt__sink_write(q, "\r\n", 2))
        return -1;
    return 0;
}

static void count_tokens(rt_req *q, json_t *body)
{
    rt_router *rt = q->rt;
    api_error e;
    memset(&e, 0, sizeof e);
    json_t *chat = api_msg_to_chat(body, true, &e);
    if (!chat) {
        rt__send_error(q, e.status, e.code, e.msg, e.param, NULL);
        return;
    }
    int mi = rt__model_find(rt, json_string_value(json_object_get(body, "model")));
    if (mi < 0 || mi >= rt->n_models || !rt->models[mi].tok) {
        json_decref(chat);
        rt__send_error(q, 404, "model_not_found",
                       "no such model here (GET /v1/models lists them)", "model", NULL);
        return;
    }
    q->model = q->asked_model = mi;
    size_t n = 0;
    int rc = api_chat_prompt_tokens(rt->models[mi].tok, rt->models[mi].family, chat, &n);
    json_decref(chat);
    if (rc == SW_ENOMEM) {
        rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
    } else if (rc != SW_OK) {
        rt__send_error(q, 400, "invalid_request",
                       "the messages or tools cannot be rendered to a prompt (/v1/messages "
                       "says why)", "messages", NULL);
    } else {
        char out[64];
        int len = snprintf(out, sizeof out, "{\"input_tokens\":%zu}", n);
        rt__send_response(q, 200, "application/json", NULL, out, (size_t)len);
    }
}

void rt__handle_messages(rt_req *q)
{
    json_error_t jerr;
    json_t *body = sw_json_loadb(q->body, q->body_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!body) {
        char msg[256];
        snprintf(msg, sizeof msg, "the body is not valid JSON: %s", jerr.text);
        rt__send_error(q, 400, "invalid_json", msg, NULL, NULL);
        return;
    }
    if (path_is(q->path, API_MSG_COUNT_PATH)) {
        count_tokens(q, body);
        json_decref(body);
        return;
    }
    api_error e;
    memset(&e, 0, sizeof e);
    json_t *chat = api_msg_to_chat(body, false, &e);
    char *text = chat ? sw_json_dumps(chat, JSON_COMPACT) : NULL;
    bool stream = json_is_true(json_object_get(chat, "stream"));
    const char *model = json_string_value(json_object_get(body, "model"));
    /* message_start's input_tokens: the prompt as the worker counts it */
    size_t n_prompt = 0;
    int mi = stream ? rt__model_find(q->rt, model) : -1;
    if (mi >= 0 && mi < q->rt->n_models && q->rt->models[mi].tok &&
        api_chat_prompt_tokens(q->rt->models[mi].tok, q->rt->models[mi].family, chat,
                               &n_prompt) != SW_OK)
        n_prompt = 0;
    api_msg_stream s;
    api_msg_stream_init(&s, model, (long long)n_prompt);
    if (!chat) {
        rt__send_error(q, e.status, e.code, e.msg, e.param, NULL);
    } else if (!text) {
        rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
    } else {
        size_t n = strlen(text);
        char *copy = sw_malloc(n + 1);
        if (!copy) {
            rt__send_error(q, 500, "internal_error", "out of memory", NULL, NULL);
        } else {
            memcpy(copy, text, n + 1);
            sw_free(q->body); /* the chat body serves it from here */
            q->body = copy;
            q->body_len = n;
            /* a job's answer is a chat answer: Messages are answered
             * while the client waits */
            q->prefer_async = false;
            if (stream) {
                q->on_event = on_event;
                q->on_event_ctx = &s;
            }
            rt__with_idempotency(q, rt__dispatch_generate, true);
            q->on_event = NULL;
            q->on_event_ctx = NULL;
        }
    }
    api_msg_stream_free(&s);
    free(text);
    json_decref(chat);
    json_decref(body);
}
