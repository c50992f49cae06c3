/* chat_harmony.c - gpt-oss's chat format: OpenAI's harmony messages (the
 * renderer behind ENG_CHAT_HARMONY; chat_template.c runs it).
 *
 * Written from the public description of the harmony format (OpenAI's
 * "harmony response format" guide and the gpt-oss model card) and the
 * structure of the template gpt-oss GGUF files carry. Every message is
 *   <|start|>{header}<|message|>{body}<|end|>
 * and a prompt is:
 *   - the system message: the model identity, "Knowledge cutoff: 2024-06",
 *     "Current date: D" (when a date is given), "Reasoning: EFFORT", and the
 *     valid channels (with tools, that calls go to the commentary channel);
 *   - a developer message, when there is a system message or tools:
 *     "# Instructions\n\n{system}\n\n" and the tools as
 *     "# Tools\n\n## functions\n\nnamespace functions {\n\n...} // namespace
 *     functions", each tool a commented TypeScript-like type
 *     (`type NAME = (_: {...}) => any;`) derived from its JSON schema;
 *   - user turns: <|start|>user<|message|>{content}<|end|>;
 *   - assistant answers: <|start|>assistant<|channel|>final<|message|>{content}<|end|>
 *     (the thought of earlier turns is not shown again, as the format says);
 *   - assistant calls: <|start|>assistant<|channel|>commentary
 *     to=functions.NAME <|constrain|>json<|message|>{arguments}<|call|>
 *     (text beside the calls first, as a commentary message; in a tool
 *     loop in progress - after the last user message - the turn's
 *     reasoning_content before them as its analysis message, which the
 *     model is to see until the loop ends);
 *   - tool results: <|start|>functions.NAME to=assistant<|channel|>commentary
 *     <|message|>{content}<|end|>, NAME from the call the tool_call_id names
 *     (else the last call before it);
 *   - and <|start|>assistant to generate.
 * Later system messages become developer messages of their own.
 */
#include "chat/chat_template-impl.h"

#include "common/alloc.h"
#include "common/json_big.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static void tmpl(chat_builder *b, const char *s)
{
    eng_chat__append(b, s, strlen(s), true);
}

static void client(chat_builder *b, const char *s)
{
    eng_chat__append(b, s, strlen(s), false);
}

/* ---- tool definitions as TypeScript-like types ---------------------------- */

static void ts_type(chat_builder *b, json_t *schema, int depth);

/* The properties of an object schema, one per line: a comment with the
 * description, name (? when not required): type, and the default. */
static void ts_object_body(chat_builder *b, json_t *schema, int depth)
{
    json_t *props = json_object_get(schema, "properties");
    json_t *required = json_object_get(schema, "required");
    const char *key;
    json_t *p;
    json_object_foreach(props, key, p) {
        const char *desc = json_string_value(json_object_get(p, "description"));
        if (desc) {
            tmpl(b, "// ");
            client(b, desc);
            tmpl(b, "\n");
        }
        bool req = false;
        size_t k;
        json_t *r;
        json_array_foreach(required, k, r) {
            req |= json_is_string(r) && strcmp(json_string_value(r), key) == 0;
        }
        client(b, key);
        tmpl(b, req ? ": " : "?: ");
        ts_type(b, p, depth + 1);
        json_t *def = json_object_get(p, "default");
        if (def) {
            char *text = sw_json_dumps(def, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!text) {
                b->failed = true;
                return;
            }
            tmpl(b, ", // default: ");
            client(b, text);
            free(text);
            tmpl(b, "\n");
        } else {
            tmpl(b, ",\n");
        }
    }
}

static void ts_type(chat_builder *b, json_t *schema, int depth)
{
    if (!json_is_object(schema) || depth > 16) {
        tmpl(b, "any");
        return;
    }
    json_t *en = json_object_get(schema, "enum");
    if (json_is_array(en) && json_array_size(en) > 0) {
        size_t i;
        json_t *v;
        json_array_foreach(en, i, v) {
            char *text = sw_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!text) {
                b->failed = true;
                return;
            }
            if (i)
                tmpl(b, " | ");
            client(b, text);
            free(text);
        }
        return;
    }
    json_t *type = json_object_get(schema, "type");
    if (json_is_array(type)) {
        size_t i;
        json_t *t;
        json_array_foreach(type, i, t) {
            json_t *one = json_pack("{s:O}", "type", t);
            if (!one) {
                b->failed = true;
                return;
            }
            if (i)
                tmpl(b, " | ");
            ts_type(b, one, depth + 1);
            json_decref(one);
        }
        return;
    }
    const char *t = json_string_value(type);
    if (!t) {
        tmpl(b, "any");
    } else if (strcmp(t, "string") == 0) {
        tmpl(b, "string");
    } else if (strcmp(t, "number") == 0 || strcmp(t, "integer") == 0) {
        tmpl(b, "number");
    } else if (strcmp(t, "boolean") == 0) {
        tmpl(b, "boolean");
    } else if (strcmp(t, "null") == 0) {
        tmpl(b, "null");
    } else if (strcmp(t, "array") == 0) {
        json_t *items = json_object_get(schema, "items");
        if (json_is_object(items)) {
            ts_type(b, items, depth + 1);
            tmpl(b, "[]");
        } else {
            tmpl(b, "any[]");
        }
    } else if (strcmp(t, "object") == 0 &&
               json_object_size(json_object_get(schema, "properties")) > 0) {
        tmpl(b, "{\n");
        ts_object_body(b, schema, depth);
        tmpl(b, "}");
    } else if (strcmp(t, "object") == 0) {
        tmpl(b, "object");
    } else {
        tmpl(b, "any");
    }
}

/* One tool of tools_text (a {"type": "function", "function": {...}} line). */
static void ts_tool(chat_builder *b, const char *line, size_t len)
{
    json_t *tool = sw_json_loadb_big(line, len, 0, NULL);
    json_t *fn = json_object_get(tool, "function");
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (!name) {
        json_decref(tool);
        b->failed |= tool == NULL; /* the worker wrote the line: only memory can fail */
        return;
    }
    const char *desc = json_string_value(json_object_get(fn, "description"));
    if (desc) {
        tmpl(b, "// ");
        client(b, desc);
        tmpl(b, "\n");
    }
    tmpl(b, "type ");
    client(b, name);
    json_t *params = json_object_get(fn, "parameters");
    if (json_object_size(json_object_get(params, "properties")) > 0) {
        tmpl(b, " = (_: {\n");
        ts_object_body(b, params, 0);
        tmpl(b, "}) => any;\n\n");
    } else {
        tmpl(b, " = () => any;\n\n");
    }
    json_decref(tool);
}

static void tools_namespace(chat_builder *b, const char *tools_text)
{
    tmpl(b, "# Tools\n\n## functions\n\nnamespace functions {\n\n");
    for (const char *p = tools_text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if (n > 0)
            ts_tool(b, p, n);
        p += n + (nl != NULL);
    }
    tmpl(b, "} // namespace functions");
}

/* ---- messages -------------------------------------------------------------------- */

/* The function a tool result answers: the call whose id it names, else the
 * last call before it. */
static const char *result_name(const eng_chat_message *m, const eng_chat_message_tools *ext,
                               size_t i)
{
    const char *last = NULL;
    const char *id = ext ? ext[i].tool_call_id : NULL;
    for (size_t k = 0; ext && k < i; k++) {
        for (size_t c = 0; c < ext[k].n_calls; c++) {
            if (strcmp(m[k].role, "assistant") != 0)
                continue;
            if (id && ext[k].calls[c].id && strcmp(ext[k].calls[c].id, id) == 0)
                return ext[k].calls[c].name;
            last = ext[k].calls[c].name;
        }
    }
    return last;
}

void eng_chat__render_harmony(chat_builder *b, const eng_chat_message *m,
                              const eng_chat_message_tools *ext, size_t n,
                              const eng_chat_options *o)
{
    bool tools = o->tools_text && o->tools_text[0];
    tmpl(b, "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
            "OpenAI.\nKnowledge cutoff: 2024-06\n");
    if (o->date && o->date[0]) {
        tmpl(b, "Current date: ");
        tmpl(b, o->date);
        tmpl(b, "\n");
    }
    tmpl(b, "\nReasoning: ");
    tmpl(b, o->reasoning_effort && o->reasoning_effort[0] ? o->reasoning_effort : "medium");
    tmpl(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
            "every message.");
    if (tools)
        tmpl(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    tmpl(b, "<|end|>");

    size_t first = 0, last_user = n;
    for (size_t i = n; i-- > 0;)
        if (strcmp(m[i].role, "user") == 0) {
            last_user = i;
            break;
        }
    bool has_system = n > 0 && strcmp(m[0].role, "system") == 0;
    if (has_system || tools) {
        tmpl(b, "<|start|>developer<|message|>");
        if (has_system) {
            tmpl(b, "# Instructions\n\n");
            client(b, m[0].content);
            tmpl(b, "\n\n");
            first = 1;
        }
        if (tools)
            tools_namespace(b, o->tools_text);
        tmpl(b, "<|end|>");
    }
    for (size_t i = first; i < n; i++) {
        const char *role = m[i].role;
        if (strcmp(role, "system") == 0) {
            tmpl(b, "<|start|>developer<|message|>");
            client(b, m[i].content);
            tmpl(b, "<|end|>");
        } else if (strcmp(role, "user") == 0) {
            tmpl(b, "<|start|>user<|message|>");
            client(b, m[i].content);
            tmpl(b, "<|end|>");
        } else if (strcmp(role, "tool") == 0) {
            const char *name = result_name(m, ext, i);
            tmpl(b, "<|start|>functions.");
            if (name)
                client(b, name);
            else
                tmpl(b, "unknown"); /* a result without a call before it */
            tmpl(b, " to=assistant<|channel|>commentary<|message|>");
            client(b, m[i].content);
            tmpl(b, "<|end|>");
        } else if (ext && ext[i].n_calls > 0) {
            const char *thought = o->reasoning ? o->reasoning[i] : NULL;
            if (thought && thought[0] && last_user < n && i > last_user) {
                tmpl(b, "<|start|>assistant<|channel|>analysis<|message|>");
                client(b, thought);
                tmpl(b, "<|end|>");
            }
            if (m[i].content[0]) {
                tmpl(b, "<|start|>assistant<|channel|>commentary<|message|>");
                client(b, m[i].content);
                tmpl(b, "<|end|>");
            }
            for (size_t c = 0; c < ext[i].n_calls; c++) {
                tmpl(b, "<|start|>assistant<|channel|>commentary to=functions.");
                client(b, ext[i].calls[c].name);
                tmpl(b, " <|constrain|>json<|message|>");
                client(b, ext[i].calls[c].arguments);
                tmpl(b, "<|call|>");
            }
        } else {
            tmpl(b, "<|start|>assistant<|channel|>final<|message|>");
            client(b, m[i].content);
            tmpl(b, "<|end|>");
        }
    }
    if (o->add_generation_prompt)
        tmpl(b, "<|start|>assistant");
}
