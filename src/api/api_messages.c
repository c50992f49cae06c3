/* api_messages.c - Anthropic's Messages API to and from chat completions
 * (messages.h): the request body, the answer, the stream and the errors.
 *
 * The mapping (docs/api.md, POST /v1/messages): system -> a system
 * message; a user turn's text blocks -> a user message, its tool_result
 * blocks -> tool messages; an assistant turn's text -> content, thinking
 * -> reasoning_content, tool_use -> tool_calls; tools (name, description,
 * input_schema) -> function tools; tool_choice auto / any / tool / none
 * -> auto / required / named / none; stop_sequences -> stop. Back: the
 * reasoning becomes a thinking block, the text a text block, each call a
 * tool_use block; finish_reason stop / length / tool_calls -> stop_reason
 * end_turn or stop_sequence / max_tokens / tool_use. Images and documents
 * are refused (the engine reads text); cache_control is accepted and
 * ignored (the prefix cache reuses a shared prompt start by itself).
 */
#include "api/messages.h"

#include "common/alloc.h"
#include "common/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the request --------------------------------------------------------- */

/* A block the engine cannot read: refused with its name. */
static bool unsupported_block(const char *t)
{
    return strcmp(t, "image") == 0 || strcmp(t, "document") == 0 ||
           strcmp(t, "search_result") == 0 || strcmp(t, "container_upload") == 0 ||
           strcmp(t, "server_tool_use") == 0 || strcmp(t, "web_search_tool_result") == 0;
}

/* Appends text to a growing JSON string value *acc (created on first use). */
static bool text_add(json_t **acc, const char *p, size_t n, const char *sep)
{
    if (!*acc) {
        *acc = json_stringn(p, n);
        return *acc != NULL;
    }
    size_t have = json_string_length(*acc), sl = strlen(sep);
    char *t = sw_malloc(have + sl + n + 1);
    if (!t)
        return false;
    memcpy(t, json_string_value(*acc), have);
    memcpy(t + have, sep, sl);
    memcpy(t + have + sl, p, n);
    int rc = json_string_setn_nocheck(*acc, t, have + sl + n);
    sw_free(t);
    return rc == 0;
}

/* The text of a content that is a string or an array of text blocks
 * (system, tool_result content), joined by "\n" into *out; false with e
 * set. what names it in the message. */
static bool text_of(json_t *content, const char *what, const char *param, json_t **out,
                    api_error *e)
{
    if (json_is_string(content)) {
        *out = json_incref(content);
        return true;
    }
    if (!json_is_array(content))
        return api_bad(e, param, "%s must be a string or an array of text blocks", what);
    json_t *acc = NULL;
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *b = json_array_get(content, i);
        const char *t = json_string_value(json_object_get(b, "type"));
        json_t *text = json_object_get(b, "text");
        if (t && unsupported_block(t)) {
            json_decref(acc);
            return api_bad(e, param, "%s[%zu]: '%s' blocks are not supported (text only)", what,
                           i, t);
        }
        if (!t || strcmp(t, "text") != 0 || !json_is_string(text)) {
            json_decref(acc);
            return api_bad(e, param, "%s[%zu] must be {\"type\": \"text\", \"text\": string}",
                           what, i);
        }
        if (!text_add(&acc, json_string_value(text), json_string_length(text), "\n")) {
            json_decref(acc);
            return api_oom(e);
        }
    }
    *out = acc ? acc : json_string("");
    return *out != NULL || api_oom(e);
}

static bool push(json_t *msgs, json_t *m, api_error *e)
{
    return (m && json_array_append_new(msgs, m) == 0) || api_oom(e);
}

/* One user turn: its text as a user message, each tool_result as a tool
 * message, in the order given (text after results becomes a message of
 * its own). */
static bool user_turn(json_t *content, size_t i, json_t *msgs, api_error *e)
{
    if (json_is_string(content))
        return push(msgs, json_pack("{s:s, s:O}", "role", "user", "content", content), e);
    json_t *text = NULL;
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *b = json_array_get(content, k);
        const char *t = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !t)
            goto bad_block;
        if (strcmp(t, "text") == 0) {
            json_t *s = json_object_get(b, "text");
            if (!json_is_string(s))
                goto bad_block;
            if (!text_add(&text, json_string_value(s), json_string_length(s), "\n"))
                goto oom;
        } else if (strcmp(t, "tool_result") == 0) {
            json_t *id = json_object_get(b, "tool_use_id"), *c = json_object_get(b, "content");
            json_t *result = NULL;
            if (!json_is_string(id)) {
                json_decref(text);
                return api_bad(e, "messages", "messages[%zu].content[%zu] (tool_result) needs "
                               "a string 'tool_use_id'", i, k);
            }
            if (text && !push(msgs, json_pack("{s:s, s:o}", "role", "user", "content", text), e))
                return false;
            text = NULL;
            char what[96];
            snprintf(what, sizeof what, "messages[%zu].content[%zu].content", i, k);
            if (!c || json_is_null(c))
                result = json_string("");
            else if (!text_of(c, what, "messages", &result, e))
                return false;
            if (!result)
                return api_oom(e);
            if (json_is_true(json_object_get(b, "is_error"))) {
                /* the model is told the call failed, in words */
                json_t *r2 = json_string("Error: ");
                bool ok = r2 && text_add(&r2, json_string_value(result),
                                         json_string_length(result), "");
                json_decref(result);
                if (!ok) {
                    json_decref(r2);
                    return api_oom(e);
                }
                result = r2;
            }
            if (!push(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id,
                                      "content", result), e))
                return false;
        } else if (unsupported_block(t)) {
            json_decref(text);
            return api_bad(e, "messages", "messages[%zu].content[%zu]: '%s' blocks are not "
                           "supported (text only)", i, k, t);
        } else {
            goto bad_block;
        }
    }
    if (text || json_array_size(content) == 0) {
        if (!text && !(text = json_string("")))
            goto oom;
        return push(msgs, json_pack("{s:s, s:o}", "role", "user", "content", text), e);
    }
    return true;
bad_block:
    json_decref(text);
    return api_bad(e, "messages", "messages[%zu].content: a user turn takes text and "
                   "tool_result blocks", i);
oom:
    json_decref(text);
    return api_oom(e);
}

/* One assistant turn: text -> content, thinking -> reasoning_content,
 * tool_use -> tool_calls. */
static bool assistant_turn(json_t *content, size_t i, json_t *msgs, api_error *e)
{
    if (json_is_string(content))
        return push(msgs, json_pack("{s:s, s:O}", "role", "assistant", "content", content), e);
    json_t *text = NULL, *thought = NULL, *calls = NULL;
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *b = json_array_get(content, k);
        const char *t = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !t)
            goto bad_block;
        if (strcmp(t, "text") == 0) {
            json_t *s = json_object_get(b, "text");
            if (!json_is_string(s))
                goto bad_block;
            if (!text_add(&text, json_string_value(s), json_string_length(s), ""))
                goto oom;
        } else if (strcmp(t, "thinking") == 0) {
            json_t *s = json_object_get(b, "thinking");
            if (!json_is_string(s))
                goto bad_block;
            if (!text_add(&thought, json_string_value(s), json_string_length(s), "\n"))
                goto oom;
        } else if (strcmp(t, "redacted_thinking") == 0) {
            /* another model's sealed thought: nothing this one can read */
        } else if (strcmp(t, "tool_use") == 0) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            json_t *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input)) {
                json_decref(text);
                json_decref(thought);
                json_decref(calls);
                return api_bad(e, "messages", "messages[%zu].content[%zu] (tool_use) must be "
                               "{\"id\": string, \"name\": string, \"input\": object}", i, k);
            }
            char *args = sw_json_dumps(input, JSON_COMPACT);
            if (!calls)
                calls = json_array();
            json_t *c = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
                                         "function", "name", name, "arguments", args)
                             : NULL;
            free(args);
            if (!calls || !c || json_array_append_new(calls, c) != 0)
                goto oom;
        } else if (unsupported_block(t)) {
            json_decref(text);
            json_decref(thought);
            json_decref(calls);
            return api_bad(e, "messages", "messages[%zu].content[%zu]: '%s' blocks are not "
                           "supported (text only)", i, k, t);
        } else {
            goto bad_block;
        }
    }
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                          text ? text : json_string(""));
    if (m && thought)
        json_object_set_new(m, "reasoning_content", thought);
    else
        json_decref(thought);
    if (m && calls)
        json_object_set_new(m, "tool_calls", calls);
    else
        json_decref(calls);
    return push(msgs, m, e);
bad_block:
    json_decref(text);
    json_decref(thought);
    json_decref(calls);
    return api_bad(e, "messages", "messages[%zu].content: an assistant turn takes text, "
                   "thinking and tool_use blocks", i);
oom:
    json_decref(text);
    json_decref(thought);
    json_decref(calls);
    return api_oom(e);
}

static bool tools_of(json_t *tools, json_t *chat, api_error *e)
{
    if (!tools || json_is_null(tools))
        return true;
    if (!json_is_array(tools))
        return api_bad(e, "tools", "'tools' must be an array");
    json_t *out = json_array();
    if (!out)
        return api_oom(e);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *t = json_array_get(tools, i);
        json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
        json_t *desc = json_object_get(t, "description");
        const char *type = json_string_value(json_object_get(t, "type"));
        if (type && strcmp(type, "custom") != 0) {
            json_decref(out);
            return api_bad(e, "tools", "tools[%zu]: server tools ('%.64s') are not supported; "
                           "give {\"name\", \"description\", \"input_schema\"}", i, type);
        }
        if (!json_is_object(t) || !json_is_string(name) || !json_is_object(schema) ||
            (desc && !json_is_string(desc) && !json_is_null(desc))) {
            json_decref(out);
            return api_bad(e, "tools", "tools[%zu] must be {\"name\": string, \"description\": "
                           "string, \"input_schema\": object}", i);
        }
        json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
        if (fn && json_is_string(desc))
            json_object_set(fn, "description", desc);
        json_t *tool = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
        if (!tool || json_array_append_new(out, tool) != 0) {
            json_decref(out);
            return api_oom(e);
        }
    }
    if (json_array_size(out) == 0) { /* no tools: as if none were given */
        json_decref(out);
        return true;
    }
    return json_object_set_new(chat, "tools", out) == 0 || api_oom(e);
}

static bool tool_choice_of(json_t *tc, json_t *chat, api_error *e)
{
    if (!tc || json_is_null(tc))
        return true;
    const char *type = json_string_value(json_object_get(tc, "type"));
    json_t *name = json_object_get(tc, "name");
    json_t *v = NULL;
    if (!json_is_object(tc) || !type)
        v = NULL;
    else if (strcmp(type, "auto") == 0)
        v = json_string("auto");
    else if (strcmp(type, "any") == 0)
        v = json_string("required");
    else if (strcmp(type, "none") == 0)
        v = json_string("none");
    else if (strcmp(type, "tool") == 0 && json_is_string(name))
        v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    if (!v)
        return api_bad(e, "tool_choice", "'tool_choice' must be {\"type\": \"auto\"}, "
                       "{\"type\": \"any\"}, {\"type\": \"none\"} or {\"type\": \"tool\", "
                       "\"name\": string}");
    if (!json_object_get(chat, "tools")) {
        json_decref(v);
        return api_bad(e, "tool_choice", "'tool_choice' needs 'tools'");
    }
    return json_object_set_new(chat, "tool_choice", v) == 0 || api_oom(e);
}

/* Copies a number field as it is (the worker checks its range). */
static bool copy_number(json_t *body, json_t *chat, const char *key, api_error *e)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_number(v))
        return api_bad(e, key, "'%s' must be a number", key);
    return json_object_set(chat, key, v) == 0 || api_oom(e);
}

json_t *api_msg_to_chat(json_t *body, bool count, api_error *e)
{
    if (!json_is_object(body)) {
        api_bad(e, NULL, "the body must be a JSON object");
        return NULL;
    }
    json_t *chat = json_object();
    json_t *msgs = json_array();
    if (!chat || !msgs || json_object_set_new(chat, "messages", msgs) != 0) {
        json_decref(chat);
        api_oom(e);
        return NULL;
    }
    json_t *model = json_object_get(body, "model");
    if (!json_is_string(model)) {
        api_bad(e, "model", "'model' is required (a string)");
        goto fail;
    }
    json_object_set(chat, "model", model);
    json_t *mt = json_object_get(body, "max_tokens");
    if (!count && !json_is_integer(mt)) {
        api_bad(e, "max_tokens", "'max_tokens' is required (an integer of at least 1)");
        goto fail;
    }
    if (!count && json_integer_value(mt) < 1) {
        api_bad(e, "max_tokens", "'max_tokens' must be at least 1");
        goto fail;
    }
    if (!count)
        json_object_set(chat, "max_tokens", mt);
    json_t *system = json_object_get(body, "system");
    if (system && !json_is_null(system)) {
        json_t *text = NULL;
        if (!text_of(system, "'system'", "system", &text, e))
            goto fail;
        if (!push(msgs, json_pack("{s:s, s:o}", "role", "system", "content", text), e))
            goto fail;
    }
    json_t *turns = json_object_get(body, "messages");
    if (!json_is_array(turns) || json_array_size(turns) == 0) {
        api_bad(e, "messages", "'messages' must be a non-empty array");
        goto fail;
    }
    for (size_t i = 0; i < json_array_size(turns); i++) {
        json_t *m = json_array_get(turns, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
            api_bad(e, "messages", "messages[%zu].role must be \"user\" or \"assistant\" "
                    "(the system prompt is the top-level 'system')", i);
            goto fail;
        }
        if (!json_is_string(content) && !json_is_array(content)) {
            api_bad(e, "messages", "messages[%zu].content must be a string or an array of "
                    "content blocks", i);
            goto fail;
        }
        bool ok = strcmp(role, "user") == 0 ? user_turn(content, i, msgs, e)
                                            : assistant_turn(content, i, msgs, e);
        if (!ok)
            goto fail;
    }
    if (!tools_of(json_object_get(body, "tools"), chat, e) ||
        !tool_choice_of(json_object_get(body, "tool_choice"), chat, e))
        goto fail;
    json_t *stops = json_object_get(body, "stop_sequences");
    if (stops && !json_is_null(stops)) {
        bool ok = json_is_array(stops);
        for (size_t i = 0; ok && i < json_array_size(stops); i++)
            ok = json_is_string(json_array_get(stops, i));
        if (!ok) {
            api_bad(e, "stop_sequences", "'stop_sequences' must be an array of strings");
            goto fail;
        }
        if (json_array_size(stops) && json_object_set(chat, "stop", stops) != 0) {
            api_oom(e);
            goto fail;
        }
    }
    if (!copy_number(body, chat, "temperature", e) || !copy_number(body, chat, "top_p", e) ||
        !copy_number(body, chat, "top_k", e))
        goto fail;
    json_t *stream = json_object_get(body, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream)) {
        api_bad(e, "stream", "'stream' must be true or false");
        goto fail;
    }
    if (!count && json_is_true(stream)) {
        /* the usage comes at the end of the chat stream: message_delta's */
        json_object_set_new(chat, "stream", json_true());
        json_object_set_new(chat, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    /* llama-server's extensions beside Anthropic's fields, taken as the
     * chat body takes them: a seed, a GBNF grammar, the reasoning split */
    static const char *const extensions[] = {"seed", "grammar", "reasoning_format",
                                             "cache_prompt"};
    for (size_t i = 0; i < sizeof extensions / sizeof extensions[0]; i++) {
        json_t *v = json_object_get(body, extensions[i]);
        if (v && json_object_set(chat, extensions[i], v) != 0) {
            api_oom(e);
            goto fail;
        }
    }
    json_t *thinking = json_object_get(body, "thinking");
    if (thinking && !json_is_null(thinking)) {
        const char *t = json_string_value(json_object_get(thinking, "type"));
        if (!t || (strcmp(t, "enabled") && strcmp(t, "disabled"))) {
            api_bad(e, "thinking", "'thinking' must be {\"type\": \"enabled\", "
                    "\"budget_tokens\": integer} or {\"type\": \"disabled\"}");
            goto fail;
        }
        /* a thinking model's template switch (Qwen3's enable_thinking);
         * budget_tokens is not enforced: max_tokens bounds the whole reply */
        json_object_set_new(chat, "chat_template_kwargs",
                            json_pack("{s:b}", "enable_thinking", strcmp(t, "enabled") == 0));
    }
    return chat;
fail:
    json_decref(chat);
    return NULL;
}

/* ---- the answer ------------------------------------------------------------ */

/* msg_ and the chat answer's id without its chatcmpl- */
static void message_id(const char *chat_id, char *out, size_t cap)
{
    if (!chat_id)
        chat_id = "";
    if (strncmp(chat_id, "chatcmpl-", 9) == 0)
        chat_id += 9;
    snprintf(out, cap, "msg_%s", chat_id);
}

static const char *stop_reason_of(const char *finish, bool stopped_by_string)
{
    if (finish && strcmp(finish, "length") == 0)
        return "max_tokens";
    if (finish && strcmp(finish, "tool_calls") == 0)
        return "tool_use";
    return stopped_by_string ? "stop_sequence" : "end_turn";
}

/* A call's arguments as the tool_use block's input (an object; text that
 * does not parse as one is kept under "arguments"). */
static json_t *input_of(const char *args)
{
    json_t *v = args ? sw_json_loads(args, 0, NULL) : NULL;
    if (json_is_object(v))
        return v;
    json_decref(v);
    return args && *args ? json_pack("{s:s}", "arguments", args) : json_object();
}

json_t *api_msg_from_chat(json_t *chat)
{
    json_t *choice = json_array_get(json_object_get(chat, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    json_t *stop = json_object_get(json_object_get(chat, "spillway"), "stop_sequence");
    json_t *usage = json_object_get(chat, "usage");
    char id[128];
    message_id(json_string_value(json_object_get(chat, "id")), id, sizeof id);
    json_t *content = json_array();
    json_t *reasoning = json_object_get(msg, "reasoning_content");
    json_t *text = json_object_get(msg, "content");
    json_t *calls = json_object_get(msg, "tool_calls");
    if (json_is_string(reasoning) && json_string_length(reasoning))
        json_array_append_new(content, json_pack("{s:s, s:O, s:s}", "type", "thinking",
                                                 "thinking", reasoning, "signature", ""));
    if (json_is_string(text) && (json_string_length(text) || !json_array_size(calls)))
        json_array_append_new(content, json_pack("{s:s, s:O}", "type", "text", "text", text));
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *c = json_array_get(calls, i), *fn = json_object_get(c, "function");
        const char *cid = json_string_value(json_object_get(c, "id"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use",
                                                 "id", cid ? cid : "", "name", name ? name : "",
                                                 "input", input_of(json_string_value(
                                                     json_object_get(fn, "arguments")))));
    }
    bool by_string = json_is_string(stop) && finish && strcmp(finish, "stop") == 0;
    const char *model = json_string_value(json_object_get(chat, "model"));
    json_t *m = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:O, s:{s:I, s:I}}", "id", id, "type",
                          "message", "role", "assistant", "model", model ? model : "",
                          "content", content, "stop_reason",
                          stop_reason_of(finish, by_string), "stop_sequence",
                          by_string ? stop : json_null(), "usage", "input_tokens",
                          json_integer_value(json_object_get(usage, "prompt_tokens")),
                          "output_tokens",
                          json_integer_value(json_object_get(usage, "completion_tokens")));
    if (m && json_object_get(chat, "spillway"))
        json_object_set(m, "spillway", json_object_get(chat, "spillway"));
    return m;
}

/* ---- errors ------------------------------------------------------------------ */

const char *api_msg_error_type(int status)
{
    switch (status) {
    case 400: case 405: case 409: case 411: case 415: case 417: case 422:
        return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 400 && status < 500 ? "invalid_request_error" : "api_error";
    }
}

json_t *api_msg_error(int status, const char *message)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", message ? message : "");
    sw_utf8_repair(msg);
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                     api_msg_error_type(status), "message", msg);
}

json_t *api_msg_error_from_chat(int status, json_t *openai_error)
{
    json_t *err = json_object_get(openai_error, "error");
    const char *message = json_string_value(json_object_get(err, "message"));
    if (!message)
        message = json_is_string(err) ? json_string_value(err) : "the request failed";
    json_t *o = api_msg_error(status, message);
    /* the engine's own code (context_length_exceeded, capacity_exceeded,
     * model_not_found ...) kept beside Anthropic's type */
    json_t *code = json_object_get(err, "code");
    if (o && json_is_string(code))
        json_object_set(json_object_get(o, "error"), "code", code);
    return o;
}

/* ---- streams --------------------------------------------------------------- */

void api_msg_stream_init(api_msg_stream *s, const char *model, long long input_tokens)
{
    memset(s, 0, sizeof *s);
    s->tool = -1;
    snprintf(s->model, sizeof s->model, "%s", model ? model : "");
    s->input_tokens = input_tokens;
}

void api_msg_stream_free(api_msg_stream *s)
{
    sw_free(s->out);
    sw_free(s->stop_sequence);
    s->out = NULL;
    s->stop_sequence = NULL;
}

static void out_put(api_msg_stream *s, const char *p, size_t n)
{
    if (s->out_len + n + 1 > s->out_cap) {
        size_t cap = s->out_cap ? s->out_cap : 512;
        while (cap < s->out_len + n + 1)
            cap *= 2;
        char *b = sw_realloc(s->out, cap);
        if (!b) {
            s->oom = true;
            return;
        }
        s->out = b;
        s->out_cap = cap;
    }
    memcpy(s->out + s->out_len, p, n);
    s->out_len += n;
    s->out[s->out_len] = '\0';
}

/* One event: "event: NAME\ndata: JSON\n\n" (JSON's "type" is NAME).
 * Takes data. */
static void emit(api_msg_stream *s, const char *name, json_t *data)
{
    char *text = data ? sw_json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (!text) {
        s->oom = true;
        return;
    }
    out_put(s, "event: ", 7);
    out_put(s, name, strlen(name));
    out_put(s, "\ndata: ", 7);
    out_put(s, text, strlen(text));
    out_put(s, "\n\n", 2);
    free(text);
}

static void start(api_msg_stream *s)
{
    if (s->started)
        return;
    s->started = true;
    emit(s, "message_start",
         json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:I, s:I}}}", "type",
                   "message_start", "message", "id", s->id[0] ? s->id : "msg_", "type",
                   "message", "role", "assistant", "model", s->model, "content", "stop_reason",
                   "stop_sequence", "usage", "input_tokens", (json_int_t)s->input_tokens,
                   "output_tokens", (json_int_t)0));
}

static void close_block(api_msg_stream *s)
{
    if (!s->open)
        return;
    emit(s, "content_block_stop",
         json_pack("{s:s, s:i}", "type", "content_block_stop", "index", s->index));
    s->open = 0;
    s->tool = -1;
    s->index++;
}

/* Opens a block of kind (1 thinking, 2 text) unless one is open. */
static void open_block(api_msg_stream *s, int kind)
{
    if (s->open == kind)
        return;
    close_block(s);
    json_t *block = kind == 1 ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "",
                                          "signature", "")
                              : json_pack("{s:s, s:s}", "type", "text", "text", "");
    emit(s, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start",
                                             "index", s->index, "content_block", block));
    s->open = kind;
}

static void delta(api_msg_stream *s, const char *type, const char *key, json_t *value)
{
    emit(s, "content_block_delta",
         json_pack("{s:s, s:i, s:{s:s, s:O}}", "type", "content_block_delta", "index", s->index,
                   "delta", "type", type, key, value));
}

static void tool_delta(api_msg_stream *s, json_t *tc)
{
    json_t *idx = json_object_get(tc, "index"), *fn = json_object_get(tc, "function");
    json_t *id = json_object_get(tc, "id"), *name = json_object_get(fn, "name");
    json_t *args = json_object_get(fn, "arguments");
    long k = json_is_integer(idx) ? (long)json_integer_value(idx) : 0;
    if (s->open != 3 || s->tool != k || json_is_string(name)) {
        close_block(s);
        char gen[64];
        snprintf(gen, sizeof gen, "toolu_%d", s->index);
        emit(s, "content_block_start",
             json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type", "content_block_start",
                       "index", s->index, "content_block", "type", "tool_use", "id",
                       json_is_string(id) ? json_string_value(id) : gen, "name",
                       json_is_string(name) ? json_string_value(name) : "", "input"));
        s->open = 3;
        s->tool = k;
    }
    if (json_is_string(args) && json_string_length(args))
        delta(s, "input_json_delta", "partial_json", args);
}

static void finish(api_msg_stream *s)
{
    start(s);
    close_block(s);
    bool by_string = s->stop_sequence && strcmp(s->finish, "stop") == 0;
    emit(s, "message_delta",
         json_pack("{s:s, s:{s:s, s:o}, s:{s:I, s:I}}", "type", "message_delta", "delta",
                   "stop_reason", stop_reason_of(s->finish, by_string), "stop_sequence",
                   by_string ? json_string(s->stop_sequence) : json_null(), "usage",
                   "input_tokens", (json_int_t)s->input_tokens, "output_tokens",
                   (json_int_t)s->output_tokens));
    emit(s, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    s->ended = true;
}

void api_msg_stream_fail(api_msg_stream *s, int status, const char *message)
{
    s->out_len = 0;
    if (s->ended)
        return;
    start(s);
    emit(s, "error", api_msg_error(status, message));
    s->ended = true;
}

bool api_msg_stream_feed(api_msg_stream *s, const char *payload, size_t len)
{
    s->out_len = 0;
    if (s->ended)
        return !s->oom;
    if (len == 6 && memcmp(payload, "[DONE]", 6) == 0) {
        finish(s);
        return !s->oom;
    }
    json_error_t jerr;
    json_t *c = sw_json_loadb(payload, len, JSON_ALLOW_NUL, &jerr);
    if (!c) { /* a payload that is not JSON says nothing: skipped */
        s->oom = s->oom || sw_json_error_oom(&jerr);
        return !s->oom;
    }
    json_t *err = json_object_get(c, "error");
    if (err) {
        /* the status is not in the stream: a failure mid-way is the
         * server's (api_error), or capacity (overloaded_error) */
        const char *code = json_string_value(json_object_get(err, "code"));
        int status = code && (strstr(code, "capacity") || strstr(code, "overloaded") ||
                              strcmp(code, "worker_failed") == 0) ? 503 : 500;
        json_t *o = api_msg_error_from_chat(status, c);
        start(s);
        emit(s, "error", o);
        s->ended = true;
        json_decref(c);
        return !s->oom;
    }
    if (!s->id[0])
        message_id(json_string_value(json_object_get(c, "id")), s->id, sizeof s->id);
    const char *model = json_string_value(json_object_get(c, "model"));
    if (model && !s->started)
        snprintf(s->model, sizeof s->model, "%s", model);
    start(s);
    json_t *choice = json_array_get(json_object_get(c, "choices"), 0);
    json_t *d = json_object_get(choice, "delta");
    json_t *reasoning = json_object_get(d, "reasoning_content");
    json_t *text = json_object_get(d, "content");
    json_t *calls = json_object_get(d, "tool_calls");
    if (json_is_string(reasoning) && json_string_length(reasoning)) {
        open_block(s, 1);
        delta(s, "thinking_delta", "thinking", reasoning);
    }
    if (json_is_string(text) && json_string_length(text)) {
        open_block(s, 2);
        delta(s, "text_delta", "text", text);
    }
    for (size_t i = 0; i < json_array_size(calls); i++)
        tool_delta(s, json_array_get(calls, i));
    const char *fr = json_string_value(json_object_get(choice, "finish_reason"));
    if (fr)
        snprintf(s->finish, sizeof s->finish, "%s", fr);
    const char *stop =
        json_string_value(json_object_get(json_object_get(c, "spillway"), "stop_sequence"));
    if (stop && !s->stop_sequence) {
        s->stop_sequence = sw_malloc(strlen(stop) + 1);
        if (s->stop_sequence)
            memcpy(s->stop_sequence, stop, strlen(stop) + 1);
    }
    json_t *usage = json_object_get(c, "usage");
    if (json_is_object(usage)) {
        json_t *pt = json_object_get(usage, "prompt_tokens");
        json_t *ct = json_object_get(usage, "completion_tokens");
        if (json_is_integer(pt))
            s->input_tokens = json_integer_value(pt);
        if (json_is_integer(ct))
            s->output_tokens = json_integer_value(ct);
    }
    json_decref(c);
    return !s->oom;
}
