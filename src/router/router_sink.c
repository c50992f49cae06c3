/* router_sink.c - the answer's destination (router_sink.h).
 */
#include "router/router_sink.h"

#include "common/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rt_sink_chunk(rt_relay *r, const char *data, size_t len)
{
    char hex[32];
    int n = snprintf(hex, sizeof hex, "%zx\r\n", len);
    if (rt__sink_write(r->q, hex, (size_t)n) || rt__sink_write(r->q, data, len) ||
        rt__sink_write(r->q, "\r\n", 2))
        return -1;
    if (len == 0)
        rt__chunked_end(r->q); /* the last chunk */
    return 0;
}

int rt_sink_event(rt_relay *r, const char *payload)
{
    rt_req *q = r->q;
    if (!r->headers_sent) {
        if (rt__stream_begin(q))
            return -1;
        r->headers_sent = true;
        r->status = 200;
    }
    size_t len = strlen(payload);
    /* an overflow (or out of memory) marks it incomplete; a filter that
     * captures what the client sees does it itself */
    if (q->cap.on && !q->on_event_captures) {
        rt__capture_append(&q->cap, "data: ", 6);
        rt__capture_append(&q->cap, payload, len);
        rt__capture_append(&q->cap, "\n\n", 2);
    }
    /* an agent run's streamed generation has no client socket: its
     * filter decides what of each event the client sees */
    if (q->on_event)
        return q->on_event(q, payload);
    /* one chunk, written in pieces: an event costs no allocation, so the
     * end of a stream that ran out of memory still gets out */
    char hex[32];
    int n = snprintf(hex, sizeof hex, "%zx\r\n", len + 8);
    if (rt__sink_write(q, hex, (size_t)n) || rt__sink_write(q, "data: ", 6) ||
        rt__sink_write(q, payload, len) || rt__sink_write(q, "\n\n\r\n", 4))
        return -1;
    return 0;
}

void rt_sink_stream_error(rt_relay *r, json_t *error)
{
    char *s = error ? sw_json_dumps(error, JSON_COMPACT) : NULL;
    rt_sink_event(r, s ? s
                       : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                         "\"code\":\"internal_error\"}}");
    free(s);
    rt_sink_event(r, "[DONE]");
    rt_sink_chunk(r, "", 0);
}
