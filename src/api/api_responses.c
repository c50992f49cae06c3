/* api_responses.c - the Responses API translated to and from chat
 * completions (api_responses.h).
 *
 * Request: input items become chat messages (message items with their
 * text parts, function_call items an assistant message's tool_calls,
 * function_call_output items tool messages; reasoning items are dropped,
 * as chat templates drop earlier thinking), instructions a system message
 * first, function tools the chat shape, text.format a response_format,
 * max_output_tokens max_tokens. What has no chat counterpart here
 * (built-in tools, images, files, conversations, prompt templates) is
 * refused with a 400 naming the parameter.
 *
 * Answer: a chat message becomes up to three kinds of output items in
 * this order: reasoning (reasoning_content), message (content) and one
 * function_call per tool call. A stream is the same items opened and
 * closed as the chat deltas arrive; sequence_number counts every event.
 */
#include "api/api_responses.h"

#include "common/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Text kept for one open stream item: a hard cap, as on every growable
 * buffer (a worker's answer is far below it). */
#define RESP_TEXT_MAX ((size_t)64 << 20)

/* ---- request ------------------------------------------------------------- */

static bool is_str(const json_t *v)
{
    return json_is_string(v);
}

/* The parameter a refusal names, when it is built (input[3].content):
 * api_error keeps a pointer, so it is kept here, one per thread, until
 * the next refusal. */
static _Thread_local char g_param[96];

static const char *keep(const char *param)
{
    if (param != g_param)
        snprintf(g_param, sizeof g_param, "%s", param);
    return g_param;
}

static const char *str_or(const json_t *v)
{
    const char *s = json_string_value(v);
    return s ? s : "";
}

/* The text of a content given as a string or a list of text parts
 * (input_text, output_text, text, refusal); false (e filled) for another
 * part. out: a new JSON string. */
static bool content_text(const json_t *content, const char *where, json_t **out, api_error *e)
{
    if (is_str(content)) {
        *out = json_incref((json_t *)content);
        return true;
    }
    if (!json_is_array(content))
        return api_bad(e, keep(where), "%s must be a string or an array of content parts", where);
    json_t *parts = json_array();
    if (!parts)
        return api_oom(e);
    size_t i;
    json_t *p;
    json_array_foreach(content, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!type) {
            json_decref(parts);
            return api_bad(e, keep(where), "%s[%zu] has no type", where, i);
        }
        const char *field = strcmp(type, "refusal") == 0 ? "refusal" : "text";
        if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
            strcmp(type, "refusal")) {
            json_decref(parts);
            return api_bad(e, keep(where),
                           "%s[%zu]: content of type '%.40s' is not supported (text only: "
                           "input_text, output_text)",
                           where, i, type);
        }
        json_t *t = json_object_get(p, field);
        if (!is_str(t)) {
            json_decref(parts);
            return api_bad(e, keep(where), "%s[%zu].%s must be a string", where, i, field);
        }
        if (json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", t))) {
            json_decref(parts);
            return api_oom(e);
        }
    }
    *out = parts;
    return true;
}

/* The last chat message when it is the assistant's, else NULL. */
static json_t *last_assistant(json_t *messages)
{
    size_t n = json_array_size(messages);
    json_t *m = n ? json_array_get(messages, n - 1) : NULL;
    const char *role = json_string_value(json_object_get(m, "role"));
    return role && strcmp(role, "assistant") == 0 ? m : NULL;
}

/* One input item appended to the chat messages. */
static bool add_item(json_t *messages, const json_t *item, const char *where, api_error *e)
{
    char param[96];
    if (!json_is_object(item))
        return api_bad(e, keep(where), "%s must be an object", where);
    const json_t *jt = json_object_get(item, "type");
    const char *type = json_string_value(jt);
    if (jt && !type)
        return api_bad(e, keep(where), "%s.type must be a string", where);
    if (!type || strcmp(type, "message") == 0) {
        const char *role = json_string_value(json_object_get(item, "role"));
        snprintf(param, sizeof param, "%s.role", where);
        if (!role)
            return api_bad(e, keep(param), "%s needs a role (user, assistant, system or developer)",
                           where);
        if (strcmp(role, "developer") == 0)
            role = "system";
        if (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system"))
            return api_bad(e, keep(param),
                           "%s: role '%.40s' is not one of user, assistant, system, developer",
                           where, role);
        snprintf(param, sizeof param, "%s.content", where);
        json_t *content;
        if (!content_text(json_object_get(item, "content"), param, &content, e))
            return false;
        json_t *m = json_pack("{s:s, s:o}", "role", role, "content", content);
        if (!m || json_array_append_new(messages, m))
            return api_oom(e);
        return true;
    }
    if (strcmp(type, "function_call") == 0) {
        const json_t *call_id = json_object_get(item, "call_id");
        const json_t *name = json_object_get(item, "name");
        const json_t *args = json_object_get(item, "arguments");
        if (!is_str(call_id) || !is_str(name) || !is_str(args))
            return api_bad(e, keep(where), "%s: a function_call needs call_id, name and arguments "
                           "(strings)", where);
        json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function",
                                 "function", "name", name, "arguments", args);
        if (!call)
            return api_oom(e);
        json_t *m = last_assistant(messages);
        if (!m) {
            m = json_pack("{s:s, s:n}", "role", "assistant", "content");
            if (!m || json_array_append_new(messages, m)) {
                json_decref(call);
                return api_oom(e);
            }
        }
        json_t *calls = json_object_get(m, "tool_calls");
        if (!calls) {
            calls = json_array();
            if (!calls || json_object_set_new(m, "tool_calls", calls)) {
                json_decref(call);
                return api_oom(e);
            }
        }
        if (json_array_append_new(calls, call))
            return api_oom(e);
        return true;
    }
    if (strcmp(type, "function_call_output") == 0) {
        const json_t *call_id = json_object_get(item, "call_id");
        if (!is_str(call_id))
            return api_bad(e, keep(where), "%s: a function_call_output needs call_id (a string)",
                           where);
        snprintf(param, sizeof param, "%s.output", where);
        json_t *out;
        if (!content_text(json_object_get(item, "output"), param, &out, e))
            return false;
        json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", call_id,
                              "content", out);
        if (!m || json_array_append_new(messages, m))
            return api_oom(e);
        return true;
    }
    if (strcmp(type, "reasoning") == 0)
        return true; /* earlier thinking: chat templates drop it too */
    snprintf(param, sizeof param, "%s.type", where);
    return api_bad(e, keep(param), "%s: items of type '%.40s' are not supported (message, "
                   "function_call, function_call_output, reasoning)", where, type);
}

static bool add_items(json_t *messages, const json_t *items, const char *name, api_error *e)
{
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item) {
        char where[48];
        snprintf(where, sizeof where, "%s[%zu]", name, i);
        if (!add_item(messages, item, where, e))
            return false;
    }
    return true;
}

static bool tools_chat(const json_t *tools, json_t *chat, api_error *e)
{
    if (!json_is_array(tools))
        return api_bad(e, "tools", "tools must be an array");
    json_t *out = json_array();
    if (!out || json_object_set_new(chat, "tools", out))
        return api_oom(e);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char param[48];
        snprintf(param, sizeof param, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type)
            return api_bad(e, keep(param), "%s needs a type", param);
        if (strcmp(type, "function"))
            return api_bad(e, keep(param), "%s: tools of type '%.40s' are not supported (built-in "
                           "tools run on OpenAI's servers; only function tools here)",
                           param, type);
        const json_t *name = json_object_get(t, "name");
        if (!is_str(name))
            return api_bad(e, keep(param), "%s: a function tool needs a name (a string)", param);
        json_t *fn = json_pack("{s:O}", "name", name);
        static const char *const copied[] = {"description", "parameters", "strict"};
        for (size_t k = 0; fn && k < 3; k++) {
            json_t *v = json_object_get(t, copied[k]);
            if (v && !json_is_null(v) && json_object_set(fn, copied[k], v))
                json_decref(fn), fn = NULL;
        }
        json_t *ct = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
        if (!ct || json_array_append_new(out, ct))
            return api_oom(e);
    }
    return true;
}

static bool tool_choice_chat(const json_t *tc, json_t *chat, api_error *e)
{
    if (is_str(tc)) {
        const char *v = json_string_value(tc);
        if (strcmp(v, "none") && strcmp(v, "auto") && strcmp(v, "required"))
            return api_bad(e, "tool_choice", "tool_choice must be none, auto, required or "
                           "{\"type\": \"function\", \"name\": ...}");
        return json_object_set(chat, "tool_choice", (json_t *)tc) == 0 || api_oom(e);
    }
    const char *type = json_string_value(json_object_get(tc, "type"));
    const json_t *name = json_object_get(tc, "name");
    if (!type || strcmp(type, "function") || !is_str(name))
        return api_bad(e, "tool_choice", "tool_choice: only none, auto, required or a function "
                       "({\"type\": \"function\", \"name\": ...}) are supported");
    json_t *v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    return (v && json_object_set_new(chat, "tool_choice", v) == 0) || api_oom(e);
}

static bool text_format_chat(const json_t *text, json_t *chat, api_error *e)
{
    if (!json_is_object(text))
        return api_bad(e, "text", "text must be an object");
    const json_t *f = json_object_get(text, "format");
    if (!f || json_is_null(f))
        return true;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!type)
        return api_bad(e, "text.format", "text.format needs a type (text, json_object, "
                       "json_schema)");
    if (strcmp(type, "text") == 0)
        return true;
    json_t *rf = NULL;
    if (strcmp(type, "json_object") == 0) {
        rf = json_pack("{s:s}", "type", "json_object");
    } else if (strcmp(type, "json_schema") == 0) {
        const json_t *schema = json_object_get(f, "schema");
        const json_t *name = json_object_get(f, "name");
        if (!json_is_object(schema))
            return api_bad(e, "text.format.schema", "text.format.schema must be an object");
        if (!is_str(name))
            return api_bad(e, "text.format.name", "text.format.name must be a string");
        json_t *js = json_pack("{s:O, s:O}", "name", name, "schema", schema);
        static const char *const copied[] = {"strict", "description"};
        for (size_t k = 0; js && k < 2; k++) {
            json_t *v = json_object_get(f, copied[k]);
            if (v && !json_is_null(v) && json_object_set(js, copied[k], v))
                json_decref(js), js = NULL;
        }
        rf = js ? json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js) : NULL;
    } else {
        return api_bad(e, "text.format.type", "text.format.type '%.40s' is not one of text, "
                       "json_object, json_schema", type);
    }
    return (rf && json_object_set_new(chat, "response_format", rf) == 0) || api_oom(e);
}

json_t *api_responses_chat(const json_t *body, const json_t *prior, api_error *e)
{
    if (!json_is_object(body)) {
        api_bad(e, NULL, "the body must be a JSON object");
        return NULL;
    }
    /* what has no chat counterpart here */
    static const char *const refused[][2] = {
        {"conversation", "conversation objects are not supported; use previous_response_id"},
        {"prompt", "prompt templates are not supported"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        const json_t *v = json_object_get(body, refused[k][0]);
        if (v && !json_is_null(v)) {
            api_bad(e, refused[k][0], "%s", refused[k][1]);
            return NULL;
        }
    }
    json_t *chat = json_object();
    json_t *messages = json_array();
    if (!chat || !messages || json_object_set_new(chat, "messages", messages)) {
        json_decref(chat);
        api_oom(e);
        return NULL;
    }
    const json_t *v;
    if ((v = json_object_get(body, "model")) && !json_is_null(v)) {
        if (!is_str(v)) {
            api_bad(e, "model", "model must be a string");
            goto fail;
        }
        json_object_set(chat, "model", (json_t *)v);
    }
    if ((v = json_object_get(body, "instructions")) && !json_is_null(v)) {
        if (!is_str(v)) {
            api_bad(e, "instructions", "instructions must be a string");
            goto fail;
        }
        if (json_array_append_new(messages, json_pack("{s:s, s:O}", "role", "system", "content",
                                                      v))) {
            api_oom(e);
            goto fail;
        }
    }
    if (prior && !add_items(messages, prior, "previous_response", e))
        goto fail;
    v = json_object_get(body, "input");
    if (is_str(v)) {
        json_t *m = json_pack("{s:s, s:O}", "role", "user", "content", v);
        if (!m || json_array_append_new(messages, m)) {
            api_oom(e);
            goto fail;
        }
    } else if (json_is_array(v)) {
        if (!add_items(messages, v, "input", e))
            goto fail;
    } else {
        api_bad(e, "input", "input must be a string or an array of items");
        goto fail;
    }
    if (json_array_size(messages) == 0) {
        api_bad(e, "input", "input has no message");
        goto fail;
    }
    if ((v = json_object_get(body, "tools")) && !json_is_null(v) && !tools_chat(v, chat, e))
        goto fail;
    if ((v = json_object_get(body, "tool_choice")) && !json_is_null(v) &&
        !tool_choice_chat(v, chat, e))
        goto fail;
    if ((v = json_object_get(body, "parallel_tool_calls")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            api_bad(e, "parallel_tool_calls", "parallel_tool_calls must be a boolean");
            goto fail;
        }
        json_object_set(chat, "parallel_tool_calls", (json_t *)v);
    }
    if ((v = json_object_get(body, "text")) && !json_is_null(v) && !text_format_chat(v, chat, e))
        goto fail;
    if ((v = json_object_get(body, "max_output_tokens")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) {
            api_bad(e, "max_output_tokens", "max_output_tokens must be an integer of at least 1");
            goto fail;
        }
        json_object_set(chat, "max_tokens", (json_t *)v);
    }
    /* sampling, checked by the chat parser (it names the same fields);
     * and spillway's extensions of chat, taken here as there */
    static const char *const same[] = {"temperature", "top_p",   "user",
                                       "seed",        "top_k",   "min_p",
                                       "ignore_eos",  "grammar", "reasoning_format",
                                       "cache_prompt"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++)
        if ((v = json_object_get(body, same[k])) && !json_is_null(v) &&
            json_object_set(chat, same[k], (json_t *)v)) {
            api_oom(e);
            goto fail;
        }
    if ((v = json_object_get(body, "stream")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            api_bad(e, "stream", "stream must be a boolean");
            goto fail;
        }
        if (json_is_true(v) &&
            (json_object_set_new(chat, "stream", json_true()) ||
             json_object_set_new(chat, "stream_options", json_pack("{s:b}", "include_usage", 1)))) {
            api_oom(e);
            goto fail;
        }
    }
    return chat;
fail:
    json_decref(chat);
    return NULL;
}

json_t *api_responses_input_items(const json_t *body)
{
    const json_t *input = json_object_get(body, "input");
    if (json_is_array(input))
        return json_deep_copy(input);
    return json_pack("[{s:s, s:s, s:[{s:s, s:O}]}]", "type", "message", "role", "user", "content",
                     "type", "input_text", "text", input);
}

const char *api_responses_param(const char *param)
{
    if (!strcmp(param, "max_tokens"))
        return "max_output_tokens";
    if (!strncmp(param, "response_format", 15))
        return "text.format";
    if (!strncmp(param, "messages", 8))
        return "input";
    if (!strncmp(param, "stream_options", 14))
        return "stream";
    return param;
}

/* ---- answer -------------------------------------------------------------- */

void api_responses_item_id(char *out, size_t cap, const char *prefix, const char *resp_id,
                           size_t index)
{
    const char *tail = strncmp(resp_id, "resp_", 5) == 0 ? resp_id + 5 : resp_id;
    snprintf(out, cap, "%s_%s_%zu", prefix, tail, index);
}

static json_t *or_default(const json_t *body, const char *key, json_t *dflt)
{
    json_t *v = json_object_get(body, key);
    if (v && !json_is_null(v)) {
        json_decref(dflt);
        return json_incref(v);
    }
    return dflt;
}

json_t *api_responses_object(const json_t *body, const char *id, int64_t created_at,
                             const char *status, const char *model)
{
    const char *m = model ? model : json_string_value(json_object_get(body, "model"));
    json_t *text = json_object_get(body, "text");
    json_t *r = json_pack(
        "{s:s, s:s, s:I, s:s, s:o, s:n, s:n, s:o, s:o, s:s, s:[], s:o, s:o, s:o, s:o, s:o, "
        "s:o, s:o, s:o, s:o, s:s, s:n, s:o, s:n}",
        "id", id, "object", "response", "created_at", (json_int_t)created_at, "status", status,
        "background", or_default(body, "background", json_false()), "error",
        "incomplete_details", "instructions", or_default(body, "instructions", json_null()),
        "max_output_tokens", or_default(body, "max_output_tokens", json_null()), "model",
        m ? m : "", "output", "parallel_tool_calls",
        or_default(body, "parallel_tool_calls", json_true()), "previous_response_id",
        or_default(body, "previous_response_id", json_null()), "reasoning",
        json_pack("{s:n, s:n}", "effort", "summary"), "store",
        or_default(body, "store", json_true()), "temperature",
        or_default(body, "temperature", json_real(1.0)), "text",
        json_is_object(text) && json_object_get(text, "format")
            ? json_incref(text)
            : json_pack("{s:{s:s}}", "format", "type", "text"),
        "tool_choice", or_default(body, "tool_choice", json_string("auto")), "tools",
        or_default(body, "tools", json_array()), "top_p", or_default(body, "top_p", json_real(1.0)),
        "truncation", "disabled", "usage", "metadata",
        or_default(body, "metadata", json_object()), "user");
    return r;
}

/* The Response's usage from the chat answer's: the prompt tokens the
 * prefix cache supplied (chat's prompt_tokens_details.cached_tokens) come
 * along; a thought's tokens are not counted apart (0). */
static json_t *usage_of(const json_t *chat_usage)
{
    json_int_t in = json_integer_value(json_object_get(chat_usage, "prompt_tokens"));
    json_int_t out = json_integer_value(json_object_get(chat_usage, "completion_tokens"));
    json_int_t cached = json_integer_value(json_object_get(
        json_object_get(chat_usage, "prompt_tokens_details"), "cached_tokens"));
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:i}, s:I}", "input_tokens", in,
                     "input_tokens_details", "cached_tokens", cached, "output_tokens", out,
                     "output_tokens_details", "reasoning_tokens", 0, "total_tokens", in + out);
}

static json_t *message_item(const char *id, const char *status, json_t *text)
{
    json_t *content = text ? json_pack("[{s:s, s:o, s:[], s:[]}]", "type", "output_text",
                                       "text", text, "annotations", "logprobs")
                           : json_array();
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status,
                     "role", "assistant", "content", content);
}

static json_t *reasoning_item(const char *id, json_t *text)
{
    json_t *content = text ? json_pack("[{s:s, s:o}]", "type", "reasoning_text", "text", text)
                           : json_array();
    return json_pack("{s:s, s:s, s:[], s:o}", "id", id, "type", "reasoning", "summary",
                     "content", content);
}

static json_t *call_item(const char *id, const char *status, const char *call_id,
                         const char *name, json_t *args)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "function_call",
                     "status", status, "call_id", call_id, "name", name, "arguments", args);
}

static void set_finish(json_t *r, const char *finish)
{
    bool length = finish && strcmp(finish, "length") == 0;
    json_object_set_new(r, "status", json_string(length ? "incomplete" : "completed"));
    if (length)
        json_object_set_new(r, "incomplete_details",
                            json_pack("{s:s}", "reason", "max_output_tokens"));
}

json_t *api_responses_from_chat(const json_t *body, const char *id, int64_t created_at,
                                const json_t *chat)
{
    json_t *choice = json_array_get(json_object_get(chat, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    json_t *r = api_responses_object(body, id, created_at, "completed",
                                     json_string_value(json_object_get(chat, "model")));
    json_t *output = json_object_get(r, "output");
    if (!r || !output) {
        json_decref(r);
        return NULL;
    }
    char item_id[160];
    bool ok = true;
    json_t *rc = json_object_get(msg, "reasoning_content");
    if (is_str(rc) && json_string_length(rc) > 0) {
        api_responses_item_id(item_id, sizeof item_id, "rs", id, json_array_size(output));
        ok &= json_array_append_new(output, reasoning_item(item_id, json_incref(rc))) == 0;
    }
    json_t *content = json_object_get(msg, "content");
    if (is_str(content) && json_string_length(content) > 0) {
        api_responses_item_id(item_id, sizeof item_id, "msg", id, json_array_size(output));
        const char *fr = json_string_value(json_object_get(choice, "finish_reason"));
        const char *status = fr && !strcmp(fr, "length") ? "incomplete" : "completed";
        ok &= json_array_append_new(output,
                                    message_item(item_id, status, json_incref(content))) == 0;
    }
    size_t i;
    json_t *call;
    json_array_foreach(json_object_get(msg, "tool_calls"), i, call) {
        json_t *fn = json_object_get(call, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        api_responses_item_id(item_id, sizeof item_id, "fc", id, json_array_size(output));
        ok &= json_array_append_new(
                  output, call_item(item_id, "completed",
                                    str_or(json_object_get(call, "id")),
                                    str_or(json_object_get(fn, "name")),
                                    json_string(args ? args : ""))) == 0;
    }
    set_finish(r, json_string_value(json_object_get(choice, "finish_reason")));
    ok &= json_object_set_new(r, "usage", usage_of(json_object_get(chat, "usage"))) == 0;
    if (!ok) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* ---- stream -------------------------------------------------------------- */

enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

struct api_resp_stream {
    json_t *body;     /* the request (echoed) */
    json_t *response; /* the Response: output holds the closed items */
    char id[96];
    int64_t created_at;
    int64_t seq;      /* the next event's sequence_number */
    int64_t seq_sent; /* ... after the text last handed out */
    int64_t seq_prev; /* ... before it (api_resp_stream_lost) */
    bool started;     /* response.created sent */
    bool ended;       /* the final event sent */
    bool oom;         /* an allocation failed: everything after is NULL */
    char finish[32];  /* the chat stream's finish_reason */
    json_t *usage;    /* the chat stream's usage chunk's */
    /* the open item */
    int item;
    size_t output_index;
    char item_id[160];
    int call_index;   /* the chat delta's tool_calls index */
    char call_id[128], call_name[256];
    char *text;       /* its text or arguments so far (sw_malloc) */
    size_t text_len, text_cap;
    /* the events for the caller */
    char *out;
    size_t out_len, out_cap;
};

static bool buf_put(char **p, size_t *len, size_t *cap, const char *s, size_t n)
{
    size_t need;
    if (__builtin_add_overflow(*len, n, &need) || need + 1 > RESP_TEXT_MAX)
        return false;
    if (need + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < need + 1)
            nc *= 2;
        char *q = sw_realloc(*p, nc);
        if (!q)
            return false;
        *p = q;
        *cap = nc;
    }
    memcpy(*p + *len, s, n);
    *len = need;
    (*p)[need] = 0;
    return true;
}

/* One event: its fields in ev (consumed), type and sequence_number added. */
static void emit(api_resp_stream *s, const char *type, json_t *ev)
{
    if (!ev || s->oom) {
        json_decref(ev);
        s->oom = true;
        return;
    }
    json_t *head = json_pack("{s:s, s:I}", "type", type, "sequence_number", (json_int_t)s->seq++);
    char *dump = head && json_object_update(head, ev) == 0 ? sw_json_dumps(head, JSON_COMPACT)
                                                           : NULL;
    json_decref(head);
    json_decref(ev);
    if (!dump || !buf_put(&s->out, &s->out_len, &s->out_cap, "event: ", 7) ||
        !buf_put(&s->out, &s->out_len, &s->out_cap, type, strlen(type)) ||
        !buf_put(&s->out, &s->out_len, &s->out_cap, "\ndata: ", 7) ||
        !buf_put(&s->out, &s->out_len, &s->out_cap, dump, strlen(dump)) ||
        !buf_put(&s->out, &s->out_len, &s->out_cap, "\n\n", 2))
        s->oom = true;
    free(dump);
}

/* The events so far, handed to the caller. */
static char *take(api_resp_stream *s)
{
    if (s->oom)
        return NULL;
    char *out = s->out ? s->out : sw_calloc(1, 1);
    if (!out) {
        s->oom = true;
        return NULL;
    }
    s->out = NULL;
    s->out_len = s->out_cap = 0;
    s->seq_prev = s->seq_sent;
    s->seq_sent = s->seq;
    return out;
}

api_resp_stream *api_resp_stream_new(const json_t *body, const char *id, int64_t created_at)
{
    api_resp_stream *s = sw_calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->body = json_deep_copy(body);
    snprintf(s->id, sizeof s->id, "%s", id);
    s->created_at = created_at;
    s->response = api_responses_object(body, id, created_at, "in_progress", NULL);
    if (!s->body || !s->response) {
        api_resp_stream_free(s);
        return NULL;
    }
    return s;
}

void api_resp_stream_free(api_resp_stream *s)
{
    if (!s)
        return;
    json_decref(s->body);
    json_decref(s->response);
    json_decref(s->usage);
    sw_free(s->text);
    sw_free(s->out);
    sw_free(s);
}

static void start(api_resp_stream *s, const json_t *chunk)
{
    if (s->started)
        return;
    s->started = true;
    const char *model = json_string_value(json_object_get(chunk, "model"));
    if (model)
        json_object_set_new(s->response, "model", json_string(model));
    emit(s, "response.created", json_pack("{s:O}", "response", s->response));
    emit(s, "response.in_progress", json_pack("{s:O}", "response", s->response));
}

static json_t *text_json(const api_resp_stream *s)
{
    return json_stringn(s->text ? s->text : "", s->text_len);
}

static void close_item(api_resp_stream *s)
{
    json_t *item = NULL;
    size_t oi = s->output_index;
    const char *iid = s->item_id;
    switch (s->item) {
    case ITEM_NONE:
        return;
    case ITEM_MESSAGE:
        emit(s, "response.output_text.done",
             json_pack("{s:s, s:I, s:i, s:o, s:[]}", "item_id", iid, "output_index",
                       (json_int_t)oi, "content_index", 0, "text", text_json(s), "logprobs"));
        emit(s, "response.content_part.done",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:o, s:[], s:[]}}", "item_id", iid,
                       "output_index", (json_int_t)oi, "content_index", 0, "part", "type",
                       "output_text", "text", text_json(s), "annotations", "logprobs"));
        /* cut by max_output_tokens: the message is incomplete too */
        item = message_item(iid, strcmp(s->finish, "length") ? "completed" : "incomplete",
                            text_json(s));
        break;
    case ITEM_REASONING:
        emit(s, "response.reasoning_text.done",
             json_pack("{s:s, s:I, s:i, s:o}", "item_id", iid, "output_index", (json_int_t)oi,
                       "content_index", 0, "text", text_json(s)));
        emit(s, "response.content_part.done",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:o}}", "item_id", iid, "output_index",
                       (json_int_t)oi, "content_index", 0, "part", "type", "reasoning_text",
                       "text", text_json(s)));
        item = reasoning_item(iid, text_json(s));
        break;
    case ITEM_CALL:
        emit(s, "response.function_call_arguments.done",
             json_pack("{s:s, s:I, s:s, s:o}", "item_id", iid, "output_index", (json_int_t)oi,
                       "name", s->call_name, "arguments", text_json(s)));
        item = call_item(iid, "completed", s->call_id, s->call_name, text_json(s));
        break;
    }
    emit(s, "response.output_item.done",
         item ? json_pack("{s:I, s:O}", "output_index", (json_int_t)oi, "item", item) : NULL);
    if (!item || json_array_append_new(json_object_get(s->response, "output"), item))
        s->oom = true;
    s->item = ITEM_NONE;
    s->text_len = 0;
}

static void open_item(api_resp_stream *s, int kind)
{
    close_item(s);
    s->item = kind;
    s->output_index = json_array_size(json_object_get(s->response, "output"));
    s->text_len = 0;
    const char *prefix = kind == ITEM_MESSAGE ? "msg" : kind == ITEM_REASONING ? "rs" : "fc";
    api_responses_item_id(s->item_id, sizeof s->item_id, prefix, s->id, s->output_index);
    json_t *item = kind == ITEM_MESSAGE     ? message_item(s->item_id, "in_progress", NULL)
                   : kind == ITEM_REASONING ? reasoning_item(s->item_id, NULL)
                                            : call_item(s->item_id, "in_progress", s->call_id,
                                                        s->call_name, json_string(""));
    json_int_t oi = (json_int_t)s->output_index;
    emit(s, "response.output_item.added",
         item ? json_pack("{s:I, s:o}", "output_index", oi, "item", item) : NULL);
    if (kind == ITEM_MESSAGE)
        emit(s, "response.content_part.added",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", s->item_id,
                       "output_index", oi, "content_index", 0, "part", "type", "output_text",
                       "text", "", "annotations", "logprobs"));
    else if (kind == ITEM_REASONING)
        emit(s, "response.content_part.added",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:s}}", "item_id", s->item_id, "output_index",
                       oi, "content_index", 0, "part", "type", "reasoning_text", "text", ""));
}

static void add_text(api_resp_stream *s, const char *event, const json_t *delta, bool with_part)
{
    const char *d = json_string_value(delta);
    size_t n = json_string_length(delta);
    if (!buf_put(&s->text, &s->text_len, &s->text_cap, d, n)) {
        s->oom = true;
        return;
    }
    json_t *ev = json_pack("{s:s, s:I, s:O}", "item_id", s->item_id, "output_index",
                           (json_int_t)s->output_index, "delta", delta);
    if (ev && with_part)
        json_object_set_new(ev, "content_index", json_integer(0));
    if (ev && s->item == ITEM_MESSAGE)
        json_object_set_new(ev, "logprobs", json_array());
    emit(s, event, ev);
}

static void finish(api_resp_stream *s, json_t *error)
{
    close_item(s);
    const char *type;
    if (error) {
        json_object_set_new(s->response, "status", json_string("failed"));
        json_object_set_new(s->response, "error", error);
        type = "response.failed";
    } else {
        set_finish(s->response, s->finish);
        type = strcmp(json_string_value(json_object_get(s->response, "status")), "incomplete")
                   ? "response.completed"
                   : "response.incomplete";
    }
    if (s->usage)
        json_object_set_new(s->response, "usage", usage_of(s->usage));
    emit(s, type, json_pack("{s:O}", "response", s->response));
    s->ended = true;
}

char *api_resp_stream_chunk(api_resp_stream *s, const json_t *chunk)
{
    if (s->ended)
        return take(s);
    start(s, chunk);
    const json_t *err = json_object_get(chunk, "error");
    if (err) {
        const char *code = json_string_value(json_object_get(err, "code"));
        const char *msg = json_string_value(json_object_get(err, "message"));
        finish(s, json_pack("{s:s, s:s}", "code", code ? code : "server_error", "message",
                            msg ? msg : "the generation failed"));
        return take(s);
    }
    const json_t *usage = json_object_get(chunk, "usage");
    if (json_is_object(usage)) {
        json_decref(s->usage);
        s->usage = json_deep_copy(usage);
    }
    const json_t *choice = json_array_get(json_object_get(chunk, "choices"), 0);
    const json_t *delta = json_object_get(choice, "delta");
    const json_t *rc = json_object_get(delta, "reasoning_content");
    if (is_str(rc) && json_string_length(rc) > 0) {
        if (s->item != ITEM_REASONING)
            open_item(s, ITEM_REASONING);
        add_text(s, "response.reasoning_text.delta", rc, true);
    }
    const json_t *content = json_object_get(delta, "content");
    if (is_str(content) && json_string_length(content) > 0) {
        if (s->item != ITEM_MESSAGE)
            open_item(s, ITEM_MESSAGE);
        add_text(s, "response.output_text.delta", content, true);
    }
    size_t i;
    const json_t *call;
    json_array_foreach(json_object_get(delta, "tool_calls"), i, call) {
        json_int_t index = json_integer_value(json_object_get(call, "index"));
        const json_t *fn = json_object_get(call, "function");
        const char *cid = json_string_value(json_object_get(call, "id"));
        if (s->item != ITEM_CALL || s->call_index != (int)index ||
            (cid && strcmp(cid, s->call_id))) {
            /* a new call: its id and name come in its first delta (a
             * resumed worker naming the open call again continues it) */
            const char *name = json_string_value(json_object_get(fn, "name"));
            snprintf(s->call_id, sizeof s->call_id, "%s", cid ? cid : "");
            snprintf(s->call_name, sizeof s->call_name, "%s", name ? name : "");
            s->call_index = (int)index;
            open_item(s, ITEM_CALL);
        }
        const json_t *args = json_object_get(fn, "arguments");
        if (is_str(args) && json_string_length(args) > 0)
            add_text(s, "response.function_call_arguments.delta", args, false);
    }
    const char *fr = json_string_value(json_object_get(choice, "finish_reason"));
    if (fr)
        snprintf(s->finish, sizeof s->finish, "%s", fr);
    return take(s);
}

char *api_resp_stream_end(api_resp_stream *s)
{
    if (!s->ended) {
        start(s, NULL);
        finish(s, NULL);
    }
    return take(s);
}

char *api_resp_stream_fail(api_resp_stream *s, const char *code, const char *message)
{
    /* an end whose text could not be made (oom) never reached the client */
    if (!s->ended || s->oom) {
        s->ended = false;
        s->oom = false; /* what was lost is dropped; the end must get out */
        sw_free(s->out);
        s->out = NULL;
        s->out_len = s->out_cap = 0;
        s->seq = s->seq_sent; /* numbered on from what the client has */
        if (s->seq == 0)
            s->started = false; /* not even response.created reached it */
        start(s, NULL);
        s->item = ITEM_NONE; /* an item left open is not closed after a failure */
        finish(s, json_pack("{s:s, s:s}", "code", code, "message", message));
    }
    return take(s);
}

void api_resp_stream_lost(api_resp_stream *s)
{
    s->seq = s->seq_sent = s->seq_prev;
    s->ended = false; /* if the final event was lost, api_resp_stream_fail ends it again */
}

const json_t *api_resp_stream_response(const api_resp_stream *s)
{
    return s->response;
}

bool api_resp_stream_ended(const api_resp_stream *s)
{
    return s->ended;
}
