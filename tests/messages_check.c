/* messages_check.c - a strict reader of Anthropic's Messages streams
 * (messages_check.h). */
#include "messages_check.h"

#include "common/alloc.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static json_t *fail(char *why, size_t cap, json_t *a, json_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    json_decref(a);
    json_decref(b);
    return NULL;
}

/* Appends s to the string field key of o. */
static void field_append(json_t *o, const char *key, const char *s)
{
    const char *have = json_string_value(json_object_get(o, key));
    size_t a = have ? strlen(have) : 0, b = strlen(s);
    char *t = sw_malloc(a + b + 1);
    memcpy(t, have ? have : "", a);
    memcpy(t + a, s, b + 1);
    json_object_set_new(o, key, json_string(t));
    sw_free(t);
}

json_t *mc_stream_message(const char *body, size_t len, char *why, size_t cap)
{
    json_t *msg = NULL, *block = NULL;
    int open = -1, next = 0;
    bool delta_seen = false, stopped = false;
    const char *p = body, *end = body + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl || strncmp(p, "event: ", 7))
            return fail(why, cap, msg, block, "an event must start with 'event: ' at %zu",
                        (size_t)(p - body));
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(nl - p - 7), p + 7);
        p = nl + 1;
        nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl || strncmp(p, "data: ", 6) || nl + 1 >= end || nl[1] != '\n')
            return fail(why, cap, msg, block, "event %s: one 'data: ' line and a blank line",
                        name);
        json_t *d = json_loadb(p + 6, (size_t)(nl - p - 6), 0, NULL);
        p = nl + 2;
        const char *type = json_string_value(json_object_get(d, "type"));
        if (!d || !type || strcmp(type, name)) {
            json_decref(d);
            return fail(why, cap, msg, block, "event %s: data's type differs", name);
        }
        if (stopped) {
            json_decref(d);
            return fail(why, cap, msg, block, "%s after message_stop", name);
        }
        if (strcmp(name, "error") == 0) {
            json_decref(msg);
            json_decref(block);
            if (p != end) {
                json_decref(d);
                return fail(why, cap, NULL, NULL, "events after the error");
            }
            return d;
        }
        if (strcmp(name, "ping") == 0) {
            json_decref(d);
            continue;
        }
        if (strcmp(name, "message_start") == 0) {
            if (msg) {
                json_decref(d);
                return fail(why, cap, msg, block, "a second message_start");
            }
            msg = json_deep_copy(json_object_get(d, "message"));
            json_decref(d);
            if (!json_is_array(json_object_get(msg, "content")))
                return fail(why, cap, msg, block, "message_start without content []");
            continue;
        }
        if (!msg) {
            json_decref(d);
            return fail(why, cap, msg, block, "%s before message_start", name);
        }
        json_t *index = json_object_get(d, "index");
        if (strcmp(name, "content_block_start") == 0) {
            if (open >= 0 || json_integer_value(index) != next || !json_is_integer(index) ||
                delta_seen) {
                json_decref(d);
                return fail(why, cap, msg, block, "content_block_start %d: expected %d, "
                            "none open", (int)json_integer_value(index), next);
            }
            block = json_deep_copy(json_object_get(d, "content_block"));
            open = next++;
            if (strcmp(json_string_value(json_object_get(block, "type")), "tool_use") == 0)
                json_object_set_new(block, "partial_json", json_string(""));
        } else if (strcmp(name, "content_block_delta") == 0) {
            json_t *dd = json_object_get(d, "delta");
            const char *dt = json_string_value(json_object_get(dd, "type"));
            const char *bt = json_string_value(json_object_get(block, "type"));
            bool ok = open >= 0 && json_integer_value(index) == open && dt && bt;
            if (ok && strcmp(dt, "text_delta") == 0 && strcmp(bt, "text") == 0)
                field_append(block, "text", json_string_value(json_object_get(dd, "text")));
            else if (ok && strcmp(dt, "thinking_delta") == 0 && strcmp(bt, "thinking") == 0)
                field_append(block, "thinking",
                             json_string_value(json_object_get(dd, "thinking")));
            else if (ok && strcmp(dt, "signature_delta") == 0 && strcmp(bt, "thinking") == 0)
                ;
            else if (ok && strcmp(dt, "input_json_delta") == 0 && strcmp(bt, "tool_use") == 0)
                field_append(block, "partial_json",
                             json_string_value(json_object_get(dd, "partial_json")));
            else
                ok = false;
            if (!ok) {
                json_decref(d);
                return fail(why, cap, msg, block, "a %s delta for block %d (open: %d)",
                            dt ? dt : "?", (int)json_integer_value(index), open);
            }
        } else if (strcmp(name, "content_block_stop") == 0) {
            if (open < 0 || json_integer_value(index) != open) {
                json_decref(d);
                return fail(why, cap, msg, block, "content_block_stop of a block not open");
            }
            json_t *pj = json_object_get(block, "partial_json");
            if (pj) {
                json_t *input = json_string_length(pj) ? json_loads(json_string_value(pj), 0, NULL)
                                                       : json_object();
                if (!json_is_object(input)) {
                    json_decref(input);
                    json_decref(d);
                    return fail(why, cap, msg, block, "tool_use input is not a JSON object");
                }
                json_object_set_new(block, "input", input);
                json_object_del(block, "partial_json");
            }
            json_array_append_new(json_object_get(msg, "content"), block);
            block = NULL;
            open = -1;
        } else if (strcmp(name, "message_delta") == 0) {
            if (open >= 0 || delta_seen) {
                json_decref(d);
                return fail(why, cap, msg, block, "message_delta with a block open, or twice");
            }
            delta_seen = true;
            json_t *dd = json_object_get(d, "delta");
            json_object_set(msg, "stop_reason", json_object_get(dd, "stop_reason"));
            json_object_set(msg, "stop_sequence", json_object_get(dd, "stop_sequence"));
            json_t *u = json_object_get(d, "usage");
            json_t *mu = json_object_get(msg, "usage");
            if (json_object_get(u, "output_tokens"))
                json_object_set(mu, "output_tokens", json_object_get(u, "output_tokens"));
            if (json_object_get(u, "input_tokens"))
                json_object_set(mu, "input_tokens", json_object_get(u, "input_tokens"));
        } else if (strcmp(name, "message_stop") == 0) {
            if (!delta_seen) {
                json_decref(d);
                return fail(why, cap, msg, block, "message_stop without message_delta");
            }
            stopped = true;
        } else {
            json_decref(d);
            return fail(why, cap, msg, block, "an unknown event %s", name);
        }
        json_decref(d);
    }
    if (!stopped)
        return fail(why, cap, msg, block, "the stream ended without message_stop");
    return msg;
}

char *mc_blocks_text(json_t *message, const char *type)
{
    json_t *content = json_object_get(message, "content");
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *b = json_array_get(content, i);
        if (strcmp(json_string_value(json_object_get(b, "type")), type) == 0)
            n += strlen(json_string_value(json_object_get(b, type)));
    }
    char *out = sw_malloc(n + 1);
    out[0] = '\0';
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *b = json_array_get(content, i);
        if (strcmp(json_string_value(json_object_get(b, "type")), type) == 0)
            strcat(out, json_string_value(json_object_get(b, type)));
    }
    return out;
}
