/* router_events.c - GET /v1/spillway/events/stream: the router's event
 * records (failovers, capacity fallbacks, remote routes, workers started
 * and stopped on demand) as server-sent events (text/event-stream), for
 * the dashboard's timeline.
 *
 * The stream first sends the records the ring still holds (oldest first),
 * then each new one as rt__ev_record files it: the connection's thread
 * waits on rt_router.events_cond, which every record and the shutdown
 * broadcast, and compares rt_router.events_total (the last record's id)
 * with the id it sent last. Each event is
 *
 *     id: N\nevent: TYPE\ndata: {record}\n\n
 *
 * N counting the router's records from 1, TYPE the record's "type"
 * (failover, capacity_fallback, remote_route, worker_starting, ...). A stream that fell more than
 * the ring's 128 records behind skips the lost ones (ids jump).
 *
 * A stream holds its connection thread but not a max-connections slot:
 * it hands its slot back while it streams (rt_router.n_streams counts it;
 * at most RT_MAX_STREAMS, the connection threads' cap allowing for them),
 * so open dashboards never keep a request out. It ends when the router
 * stops (at once: the broadcast), when the client has left (seen within
 * RT_STREAM_CHECK_S: a socket cannot be waited on together with a
 * condition variable, so the wait is bounded and the socket looked at
 * after it), or when a write fails or times out (http-timeout).
 */
#include "router/router-impl.h"
#include "router/router_net.h"

#include "common/alloc.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#define RT_STREAM_CHECK_S 1
#define RT_STREAM_PING_S 15

void rt__events_wake(rt_router *rt)
{
    pthread_mutex_lock(&rt->mu);
    pthread_cond_broadcast(&rt->events_cond);
    pthread_mutex_unlock(&rt->mu);
}

/* One chunk of the chunked response; -1 when the client is gone. */
static int send_chunk(rt_req *q, const char *p, size_t n)
{
    char head[32];
    int hn = snprintf(head, sizeof head, "%zx\r\n", n);
    struct iovec iov[3] = {{head, (size_t)hn}, {(void *)p, n}, {(void *)"\r\n", 2}};
    q->responded = true;
    if (rn_sendv(q->fd, iov, 3, q->rt->cfg->http_timeout_s * 1000)) {
        q->write_failed = true;
        return -1;
    }
    return 0;
}

/* Whether the client closed its side (or the socket failed). Bytes it
 * sends are read and ignored: a stream takes no request. */
static bool client_left(int fd)
{
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0)
            return false;
        if (p.revents & (POLLERR | POLLHUP | POLLNVAL))
            return true;
        char junk[512];
        ssize_t r = recv(fd, junk, sizeof junk, MSG_DONTWAIT);
        if (r == 0)
            return true;
        if (r < 0)
            return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    }
}

/* With rt->mu held: the records after id *next_id into buf (SSE text),
 * *next_id advanced past them. */
static int collect_locked(rt_router *rt, uint64_t *next_id, char **buf, size_t *len)
{
    uint64_t oldest = rt->events_total - (uint64_t)rt->n_events + 1;
    if (*next_id < oldest)
        *next_id = oldest; /* fell behind the ring: those are gone */
    size_t cap = 0;
    *len = 0;
    for (; *next_id <= rt->events_total; (*next_id)++) {
        uint64_t back = rt->events_total - *next_id; /* 0: the newest */
        int idx = (int)((rt->next_event - 1 - (int)back + 2 * RT_EVENTS) % RT_EVENTS);
        const char *ev = rt->events[idx];
        if (!ev)
            continue;
        size_t need = strlen(ev) + 96; /* "id: N\nevent: TYPE\ndata: " and "\n\n" */
        if (*len + need + 1 > cap) {
            size_t nc = (*len + need + 1) * 2;
            char *nb = sw_realloc(*buf, nc);
            if (!nb)
                return -1;
            *buf = nb;
            cap = nc;
        }
        *len += (size_t)snprintf(*buf + *len, cap - *len, "id: %llu\nevent: %s\ndata: %s\n\n",
                                 (unsigned long long)*next_id, rt->events_type[idx], ev);
    }
    return 0;
}

void rt__handle_events_stream(rt_req *q)
{
    rt_router *rt = q->rt;
    if (q->fd < 0)
        return;
    q->keep_alive = false; /* the stream ends with its connection */
    pthread_mutex_lock(&rt->mu);
    bool full = rt->n_streams >= RT_MAX_STREAMS;
    if (!full) {
        rt->n_streams++;
        rt->active_conns--; /* its slot back to max-connections meanwhile */
    }
    uint64_t next_id = 1;
    pthread_mutex_unlock(&rt->mu);
    if (full) {
        rt__send_error(q, 503, "capacity_exceeded", "too many event streams are open", NULL,
                       "Retry-After: 5\r\n");
        return;
    }
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                      "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                      "Connection: close\r\nX-Request-Id: %s\r\n\r\n",
                      q->request_id);
    char *buf = NULL;
    size_t len = 0;
    rt__chunked_begin(q);
    if (rt__sink_write(q, head, (size_t)hn))
        goto out;
    /* retry: how long a browser's EventSource waits before it reconnects */
    static const char hello[] = ": spillway events\nretry: 2000\n\n";
    if (send_chunk(q, hello, sizeof hello - 1))
        goto out;
    double last_sent = rt__now_s();
    for (;;) {
        pthread_mutex_lock(&rt->mu);
        if (!rt->stop && next_id > rt->events_total) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += RT_STREAM_CHECK_S;
            pthread_cond_timedwait(&rt->events_cond, &rt->mu, &until);
        }
        bool stop = rt->stop;
        int rc = stop ? 0 : collect_locked(rt, &next_id, &buf, &len);
        pthread_mutex_unlock(&rt->mu);
        if (stop || rc)
            break;
        if (len) {
            if (send_chunk(q, buf, len))
                break;
            last_sent = rt__now_s();
            continue;
        }
        if (client_left(q->fd))
            break;
        if (rt__now_s() - last_sent >= RT_STREAM_PING_S) {
            /* a comment line keeps proxies from closing a quiet stream */
            if (send_chunk(q, ": ping\n\n", 8))
                break;
            last_sent = rt__now_s();
        }
    }
    if (!q->write_failed) {
        struct iovec iov = {(void *)"0\r\n\r\n", 5};
        if (!rn_sendv(q->fd, &iov, 1, 1000))
            rt__chunked_end(q);
    }
out:
    sw_free(buf);
    pthread_mutex_lock(&rt->mu);
    rt->n_streams--;
    rt->active_conns++; /* rt__conn_serve gives it back when the connection ends */
    pthread_mutex_unlock(&rt->mu);
}
