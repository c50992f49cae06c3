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
        char head[768];
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                         "Connection: %s\r\nX-Request-Id: %s\r\nX-Spillway-Worker: %s\r\n"
                         "X-Spillway-Attempts: %d\r\n",
                         rt__conn_hdr(q), q->request_id, q->worker, q->attempts);
        if (q->admission > 0 && n > 0 && (size_t)n < sizeof head)
            n += snprintf(head + n, sizeof head - (size_t)n,
                          "X-Spillway-Admission: %llu\r\nX-Spillway-Queue-Ms: %.0f\r\n",
                          (unsigned long long)q->admission, q->queue_ms);
        if (n > 0 && (size_t)n < sizeof head)
            n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
        rt__chunked_begin(q);
        if (n <= 0 || (size_t)n >= sizeof head || rt__sink_write(q, head, (size_t)n))
            return -1;
        r->headers_sent = true;
        r->status = 200;
        if (q->cap.on) {
            q->cap.status = 200;
            q->cap.stream = true;
            q->cap.len = 0;
            snprintf(q->cap.content_type, sizeof q->cap.content_type, "text/event-stream");
        }
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
