/* api_chat.c - a chat body's messages and tools read into the chat room's
 * types, its prompt tokenized, and its token count for the router
 * (api.h). The worker builds its requests from the same functions, so the
 * router's count is the worker's. */
#include "api/api.h"

#include "chat/chat_content.h"
#include "common/alloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

bool api_bad(api_error *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->param = param;
    if (!e->status) {
        e->status = 400;
        e->code = "invalid_request";
    }
    return false;
}

bool api_oom(api_error *e)
{
    snprintf(e->msg, sizeof e->msg, "out of memory");
    e->param = NULL;
    e->status = 500;
    e->code = "internal_error";
    return false;
}

/* The tool parts of message i: tool_calls of an assistant message, the
 * tool_call_id of a tool message. *calls_out (n entries) is allocated;
 * strings point into the body. */
static bool message_tools(json_t *m, size_t i, const char *role, eng_chat_message_tools *x,
                          eng_chat_tool_call **calls_out, api_error *e)
{
    json_t *tc = json_object_get(m, "tool_calls");
    json_t *id = json_object_get(m, "tool_call_id");
    if (strcmp(role, "tool") == 0) {
        if (!json_is_string(id))
            return api_bad(e, "messages", "messages[%zu] (tool) needs a string 'tool_call_id'", i);
        x->tool_call_id = json_string_value(id);
    }
    if (!tc || json_is_null(tc))
        return true;
    if (strcmp(role, "assistant") != 0)
        return api_bad(e, "messages", "messages[%zu]: only assistant messages have 'tool_calls'",
                       i);
    size_t n = json_array_size(tc);
    if (!json_is_array(tc) || n > 64)
        return api_bad(e, "messages", "messages[%zu].tool_calls must be an array (at most 64)", i);
    if (n == 0)
        return true;
    eng_chat_tool_call *calls = sw_calloc(n, sizeof *calls);
    if (!calls)
        return api_oom(e);
    *calls_out = calls;
    for (size_t k = 0; k < n; k++) {
        json_t *c = json_array_get(tc, k);
        json_t *fn = json_object_get(c, "function");
        json_t *type = json_object_get(c, "type");
        json_t *cid = json_object_get(c, "id");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(name) ||
            !json_is_string(args) ||
            (type && strcmp(json_string_value(type) ? json_string_value(type) : "", "function") != 0) ||
            (cid && !json_is_string(cid)))
            return api_bad(e, "messages",
                           "messages[%zu].tool_calls[%zu] must be {\"id\": string, \"type\": "
                           "\"function\", \"function\": {\"name\": string, \"arguments\": "
                           "string}}", i, k);
        calls[k].id = json_string_value(cid);
        calls[k].name = json_string_value(name);
        calls[k].arguments = json_string_value(args);
    }
    x->calls = calls;
    x->n_calls = n;
    return true;
}

bool api_chat_messages_parse(json_t *messages, api_chat_messages *out, api_error *e)
{
    size_t n = json_array_size(messages);
    memset(out, 0, sizeof *out);
    out->msgs = sw_calloc(n, sizeof *out->msgs);
    out->tools = sw_calloc(n, sizeof *out->tools);
    out->calls_ = sw_calloc(n, sizeof *out->calls_);
    out->joined_ = sw_calloc(n, sizeof *out->joined_); /* content given as parts */
    out->reasoning = sw_calloc(n, sizeof *out->reasoning);
    out->n = n;
    if (!out->msgs || !out->tools || !out->calls_ || !out->joined_ || !out->reasoning)
        return api_oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(messages, i);
        json_t *jr = json_object_get(m, "role"), *jc = json_object_get(m, "content");
        eng_chat_message *msg = &out->msgs[i];
        if (!json_is_object(m) || !json_is_string(jr))
            return api_bad(e, "messages", "messages[%zu] must be an object with a string 'role'",
                           i);
        msg->role = json_string_value(jr);
        /* OpenAI's "developer" role is the system role's successor (its
         * newer models take it in place of "system"); llama-server and vLLM
         * read it as "system", and so does every template here (harmony's
         * developer message is made from the system messages) */
        if (strcmp(msg->role, "developer") == 0)
            msg->role = "system";
        if (json_is_string(jc)) {
            msg->content = json_string_value(jc);
        } else if ((!jc || json_is_null(jc)) && strcmp(msg->role, "assistant") == 0) {
            msg->content = "";
        } else if (json_is_array(jc)) {
            char why[160];
            int rc = sw_chat_content_text(jc, &out->joined_[i], why, sizeof why);
            if (rc == SW_ENOMEM)
                return api_oom(e);
            if (rc != SW_OK)
                return api_bad(e, "messages", "messages[%zu]: %s", i, why);
            msg->content = out->joined_[i];
        } else {
            return api_bad(e, "messages",
                           "messages[%zu].content must be a string or an array of text parts", i);
        }
        json_t *jr_thought = json_object_get(m, "reasoning_content");
        if (jr_thought && !json_is_null(jr_thought)) {
            /* an assistant turn's thought sent back (a tool loop) */
            if (!json_is_string(jr_thought) || strcmp(msg->role, "assistant") != 0)
                return api_bad(e, "messages", "messages[%zu].reasoning_content must be a string "
                               "of an assistant message", i);
            out->reasoning[i] = json_string_value(jr_thought);
        }
        if (!message_tools(m, i, msg->role, &out->tools[i], &out->calls_[i], e))
            return false;
    }
    return true;
}

void api_chat_messages_free(api_chat_messages *m)
{
    for (size_t i = 0; m->calls_ && i < m->n; i++)
        sw_free(m->calls_[i]);
    for (size_t i = 0; m->joined_ && i < m->n; i++)
        sw_free(m->joined_[i]);
    sw_free(m->joined_);
    sw_free(m->calls_);
    sw_free(m->tools);
    sw_free(m->reasoning);
    sw_free(m->msgs);
    memset(m, 0, sizeof *m);
}

static bool valid_tool_name(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > 64)
        return false;
    for (const char *c = n; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-'))
            return false;
    return true;
}

/* tools: each {"type": "function", "function": {"name", "parameters",
 * "description", "strict"}}; the definitions' text for the prompt. */
static bool parse_tool_list(json_t *tools, api_tools *t, api_error *e)
{
    size_t n = json_array_size(tools);
    if (!json_is_array(tools) || n == 0 || n > API_MAX_TOOLS)
        return api_bad(e, "tools", "'tools' must be an array of 1 to 64 tools");
    char *defs[API_MAX_TOOLS] = {0};
    size_t text_len = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        json_t *tool = json_array_get(tools, i);
        json_t *type = json_object_get(tool, "type"), *fn = json_object_get(tool, "function");
        json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
        json_t *desc = json_object_get(fn, "description"), *strict = json_object_get(fn, "strict");
        bool twice = false;
        for (size_t k = 0; json_is_string(name) && k < t->n; k++)
            twice |= strcmp(t->names[k], json_string_value(name)) == 0;
        if (!json_is_object(tool) || !json_is_string(type) ||
            strcmp(json_string_value(type), "function") != 0 || !json_is_object(fn)) {
            ok = api_bad(e, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": "
                         "{...}}", i);
        } else if (!json_is_string(name) || !valid_tool_name(json_string_value(name))) {
            ok = api_bad(e, "tools", "tools[%zu].function.name must be 1 to 64 of a-z, A-Z, "
                         "0-9, _ and -", i);
        } else if ((params && !json_is_object(params) && !json_is_null(params)) ||
                   (desc && !json_is_string(desc) && !json_is_null(desc)) ||
                   (strict && !json_is_boolean(strict) && !json_is_null(strict))) {
            ok = api_bad(e, "tools", "tools[%zu].function: 'parameters' must be an object, "
                         "'description' a string, 'strict' a boolean", i);
        } else if (twice) {
            ok = api_bad(e, "tools", "tools[%zu]: the name '%s' is used twice", i,
                         json_string_value(name));
        } else if (!(defs[i] = sw_json_dumps(tool, 0))) {
            /* flags 0: one line with ", " and ": ", as the templates'
             * `tool | tojson` (Python's json.dumps) writes the tools */
            ok = api_oom(e);
        } else {
            t->names[t->n] = json_string_value(name);
            t->parameters[t->n] = json_is_object(params) ? params : NULL;
            t->n++;
            text_len += strlen(defs[i]) + 1;
        }
    }
    if (ok && (t->text = sw_malloc(text_len + 1)) != NULL) {
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            size_t l = strlen(defs[i]);
            memcpy(t->text + at, defs[i], l);
            at += l;
            t->text[at++] = '\n';
        }
        t->text[at] = '\0';
    } else if (ok) {
        ok = api_oom(e);
    }
    for (size_t i = 0; i < n && i < API_MAX_TOOLS; i++)
        free(defs[i]); /* sw_json_dumps: jansson's allocation */
    return ok;
}

bool api_tools_parse(json_t *body, bool chat, api_tools *t, api_error *e)
{
    json_t *tools = json_object_get(body, "tools");
    json_t *choice = json_object_get(body, "tool_choice");
    memset(t, 0, sizeof *t);
    if (tools && !json_is_null(tools)) {
        if (!chat)
            return api_bad(e, "tools", "'tools' needs /v1/chat/completions");
        if (!parse_tool_list(tools, t, e))
            return false;
    }
    /* tool_choice: "none", "auto" (the default with tools), "required", or
     * {"type": "function", "function": {"name": ...}}. */
    t->choice = t->n ? API_CHOICE_AUTO : API_CHOICE_NONE;
    if (!choice || json_is_null(choice))
        return true;
    if (!t->n)
        return api_bad(e, "tool_choice", "'tool_choice' needs 'tools'");
    const char *cs = json_string_value(choice);
    json_t *cname = json_object_get(json_object_get(choice, "function"), "name");
    if (cs && strcmp(cs, "none") == 0) {
        t->choice = API_CHOICE_NONE;
    } else if (cs && strcmp(cs, "auto") == 0) {
        t->choice = API_CHOICE_AUTO;
    } else if (cs && strcmp(cs, "required") == 0) {
        t->choice = API_CHOICE_REQUIRED;
    } else if (json_is_object(choice) && json_is_string(json_object_get(choice, "type")) &&
               strcmp(json_string_value(json_object_get(choice, "type")), "function") == 0 &&
               json_is_string(cname)) {
        t->choice = API_CHOICE_NAMED;
        while (t->named < t->n && strcmp(t->names[t->named], json_string_value(cname)))
            t->named++;
        if (t->named == t->n)
            return api_bad(e, "tool_choice",
                           "tool_choice names '%.64s', which is not in 'tools'",
                           json_string_value(cname));
    } else {
        return api_bad(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", "
                       "\"required\" or {\"type\": \"function\", \"function\": {\"name\": "
                       "...}}");
    }
    return true;
}

void api_tools_free(api_tools *t)
{
    sw_free(t->text);
    t->text = NULL;
}

bool api_tools_in_prompt(const api_tools *t, json_t *body)
{
    if (t->choice == API_CHOICE_REQUIRED || t->choice == API_CHOICE_NAMED)
        return true;
    if (t->choice != API_CHOICE_AUTO)
        return false;
    /* a JSON response_format takes the place of the offered tools */
    const char *type = json_string_value(json_object_get(json_object_get(body, "response_format"),
                                                         "type"));
    return !type || (strcmp(type, "json_object") != 0 && strcmp(type, "json_schema") != 0);
}

bool api_chat_options_parse(json_t *body, eng_chat_options *o, char date[11], api_error *e)
{
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    o->add_generation_prompt = true;
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return api_bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        json_t *think = json_object_get(kw, "enable_thinking");
        if (think && !json_is_null(think) && !json_is_boolean(think))
            return api_bad(e, "chat_template_kwargs",
                           "'chat_template_kwargs.enable_thinking' must be true or false");
        o->thinking_off = json_is_false(think);
    }
    json_t *effort = json_object_get(body, "reasoning_effort");
    if (effort && !json_is_null(effort)) {
        const char *v = json_string_value(effort);
        if (!v || (strcmp(v, "minimal") != 0 && strcmp(v, "low") != 0 &&
                   strcmp(v, "medium") != 0 && strcmp(v, "high") != 0))
            return api_bad(e, "reasoning_effort", "'reasoning_effort' must be \"minimal\", "
                           "\"low\", \"medium\" or \"high\"");
        /* OpenAI's "minimal" is gpt-oss's least: low */
        o->reasoning_effort = strcmp(v, "minimal") == 0 ? "low" : v;
    }
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm) && strftime(date, 11, "%Y-%m-%d", &tm) == 10)
        o->date = date;
    return true;
}

bool api_chat_tokenize(const eng_tokenizer *tok, eng_chat_family family,
                       const api_chat_messages *m, const eng_chat_options *o, int32_t **ids,
                       size_t *n_ids, api_error *e)
{
    char *text = NULL;
    size_t len = 0, n_seg = 0;
    eng_chat_segment *seg = NULL;
    sw_error err;
    bool ok = false;
    eng_chat_options with = *o;
    with.reasoning = m->reasoning;
    int rc = eng_chat_render_with(family, m->msgs, m->tools, m->n, &with, &text, &len, &seg,
                                  &n_seg, &err);
    if (rc) {
        rc == SW_ENOMEM ? api_oom(e) : api_bad(e, "messages", "%s", err.message);
    } else {
        bool add_bos = eng_chat_tokenize_add_bos(family, eng_tokenizer_add_bos(tok));
        rc = eng_chat_tokenize(tok, text, len, seg, n_seg, add_bos, ids, n_ids, &err);
        if (rc == SW_ENOMEM)
            api_oom(e);
        else if (rc)
            api_bad(e, "messages", "cannot tokenize the prompt: %s", err.message);
        else
            ok = true;
    }
    sw_free(text);
    sw_free(seg);
    return ok;
}

int api_chat_prompt_tokens(const eng_tokenizer *tok, eng_chat_family family, json_t *body,
                           size_t *n_tokens)
{
    int32_t *ids = NULL;
    int rc = api_chat_prompt_ids(tok, family, body, &ids, n_tokens);
    sw_free(ids);
    return rc;
}

int api_chat_prompt_ids(const eng_tokenizer *tok, eng_chat_family family, json_t *body,
                        int32_t **ids_out, size_t *n_tokens)
{
    json_t *messages = json_object_get(body, "messages");
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        return SW_EINVAL;
    api_error e;
    memset(&e, 0, sizeof e);
    api_tools t;
    api_chat_messages m;
    memset(&m, 0, sizeof m);
    int32_t *ids = NULL;
    size_t n = 0;
    long failures = sw_alloc_thread_failures();
    eng_chat_options o;
    memset(&o, 0, sizeof o);
    char date[11];
    bool ok = api_tools_parse(body, true, &t, &e) && api_chat_options_parse(body, &o, date, &e) &&
              api_chat_messages_parse(messages, &m, &e);
    if (ok) {
        o.tools_text = api_tools_in_prompt(&t, body) ? t.text : NULL;
        ok = api_chat_tokenize(tok, family, &m, &o, &ids, &n, &e);
    }
    int rc = ok ? SW_OK : sw_alloc_thread_failures() != failures ? SW_ENOMEM : SW_EINVAL;
    if (ok) {
        *n_tokens = n;
        *ids_out = ids;
        ids = NULL;
    }
    sw_free(ids);
    api_chat_messages_free(&m);
    api_tools_free(&t);
    return rc;
}
