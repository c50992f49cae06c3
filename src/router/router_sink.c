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
    char *ev = sw_malloc(len + 9);
    if (!ev)
        return -1;
    memcpy(ev, "data: ", 6);
    memcpy(ev + 6, payload, len);
    memcpy(ev + 6 + len, "\n\n", 2);
    if (q->cap.on)
        rt__capture_append(&q->cap, ev, len + 8);
    /* an agent run's streamed generation has no client socket: its
     * filter decides what of each event the client sees */
    int rc = q->on_event ? q->on_event(q, payload) : rt_sink_chunk(r, ev, len + 8);
    sw_free(ev);
    return rc;
}

void rt_sink_stream_error(rt_relay *r, json_t *error)
{
    char *s = json_dumps(error, JSON_COMPACT);
    if (s)
        rt_sink_event(r, s);
    free(s);
    rt_sink_event(r, "[DONE]");
    rt_sink_chunk(r, "", 0);
}
