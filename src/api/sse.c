/* sse.c - server-sent events, read event by event (sse.h). */
#include "api/sse.h"

#include <string.h>

bool api_sse_next(const char *buf, size_t len, api_sse_event *ev)
{
    const char *end = len >= 2 ? memmem(buf, len, "\n\n", 2) : NULL;
    if (!end)
        return false;
    ev->text = buf;
    ev->text_len = (size_t)(end - buf);
    ev->consumed = ev->text_len + 2;
    ev->data = NULL;
    ev->data_len = 0;
    if (ev->text_len >= 6 && memcmp(buf, "data: ", 6) == 0) {
        ev->data = buf + 6;
        ev->data_len = ev->text_len - 6;
    }
    return true;
}

bool api_sse_is_done(const api_sse_event *ev)
{
    return ev->data && ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0;
}
