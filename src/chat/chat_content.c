/* chat_content.c - see chat_content.h. */
#include "chat/chat_content.h"

#include "common/alloc.h"
#include "common/error.h"

#include <stdio.h>
#include <string.h>

int sw_chat_content_text(const json_t *content, char **out, char *why, size_t why_cap)
{
    *out = NULL;
    if (json_is_string(content)) {
        *out = sw_strdup(json_string_value(content));
        return *out ? SW_OK : SW_ENOMEM;
    }
    if (!json_is_array(content)) {
        snprintf(why, why_cap, "content must be a string or an array of content parts");
        return SW_EINVAL;
    }
    /* the joined length first, so that one allocation holds it */
    size_t total = 0, n = json_array_size(content);
    for (size_t i = 0; i < n; i++) {
        const json_t *part = json_array_get(content, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !type) {
            snprintf(why, why_cap, "content part %zu must be an object with a string 'type'", i);
            return SW_EINVAL;
        }
        if (strcmp(type, "text") != 0) {
            snprintf(why, why_cap,
                     "content part %zu has type '%.40s': this model takes text parts only", i,
                     type);
            return SW_EUNSUPPORTED;
        }
        if (!json_is_string(text)) {
            snprintf(why, why_cap, "content part %zu (text) needs a string 'text'", i);
            return SW_EINVAL;
        }
        total += json_string_length(text) + (i > 0);
    }
    char *s = sw_malloc(total + 1);
    if (!s)
        return SW_ENOMEM;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *text = json_object_get(json_array_get(content, i), "text");
        if (i > 0)
            s[at++] = '\n';
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    s[at] = '\0';
    *out = s;
    return SW_OK;
}
