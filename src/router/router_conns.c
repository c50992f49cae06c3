/* router_conns.c - the client connection threads. Each one accepts a
 * connection itself (a blocking accept on the listening socket: the
 * kernel hands each new connection to one waiting thread), serves it to
 * its end and goes back to accepting. A thread that takes a connection
 * while no other one waits in accept starts one more, so a thread is
 * always ready (up to max-connections + 2 threads: one more than the
 * connections, so a connection past the limit is still answered 503 at
 * once; plus RT_MAX_STREAMS for the event streams, which hand their slot
 * back). A thread that has waited RT_CONN_IDLE_S while another one waits
 * too ends (accept wakes that often to let it look; at shutdown,
 * shutdown(2) on the listening socket wakes every thread in accept at
 * once, so no thread wakes on a short timer, busy or idle).
 *
 * Creating and ending a thread per connection was two thirds of the
 * router's CPU per request, and handing each accepted connection from an
 * accept loop to a kept thread cost a wake-up and a context switch
 * (docs/internals/router.md).
 */
#include "router/router-impl.h"
#include "router/router_net.h"

#include "common/alloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RT_CONN_IDLE_S 30

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int start_thread(rt_router *rt);

/* The connection's slot under max-connections: taken, the oldest idle
 * keep-alive connection's, or none (503 at once, closed). */
static bool take_slot(rt_router *rt, int fd)
{
    pthread_mutex_lock(&rt->mu);
    bool full = rt->active_conns >= rt->cfg->max_connections;
    if (!full)
        rt->active_conns++;
    else if (rt__evict_idle_locked(rt))
        full = false;
    pthread_mutex_unlock(&rt->mu);
    if (full) {
        static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                                   "Content-Length: 0\r\nConnection: close\r\n\r\n";
        struct iovec iov = {(void *)busy, sizeof busy - 1};
        rn_sendv(fd, &iov, 1, 1000);
        close(fd);
    }
    return !full;
}

/* Leaves the waiting count when another thread stays in it: true when
 * this thread may end. The check and the decrement are one step, so two
 * idle threads that time out together cannot each count on the other
 * and both end, leaving no thread in accept (a client's connect then
 * succeeds into the backlog and waits forever). */
static bool leave_if_others_wait(rt_router *rt)
{
    int w = __atomic_load_n(&rt->conns.waiting, __ATOMIC_SEQ_CST);
    while (w > 1)
        if (__atomic_compare_exchange_n(&rt->conns.waiting, &w, w - 1, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            return true;
    return false;
}

static void *conn_main(void *arg)
{
    rt_router *rt = arg;
    double idle_since = mono_s();
    /* the request-head buffer, once per thread (not a malloc and free of
     * 16 KiB per connection) */
    char *buf = sw_malloc(RT_HEAD_MAX + 1);
    /* counted as waiting from here until it takes a connection or ends,
     * and counted before the shutdown flag is read, so that
     * rt__conns_close, which sets the flag before it reads the count,
     * never returns while a thread is about to enter accept */
    __atomic_add_fetch(&rt->conns.waiting, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        if (__atomic_load_n(&rt->conns.closing, __ATOMIC_SEQ_CST)) {
            __atomic_sub_fetch(&rt->conns.waiting, 1, __ATOMIC_SEQ_CST);
            break;
        }
        int fd = accept4(rt->conns.lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if ((err == EAGAIN || err == EWOULDBLOCK) && mono_s() - idle_since > RT_CONN_IDLE_S &&
                leave_if_others_wait(rt))
                break;
            if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR)
                usleep(10 * 1000); /* out of descriptors or memory: no busy loop */
            continue;
        }
        int left = __atomic_sub_fetch(&rt->conns.waiting, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&rt->conns.closing, __ATOMIC_ACQUIRE)) {
            close(fd);
            break;
        }
        if (left == 0)
            start_thread(rt); /* the next connection finds a thread waiting */
        if (take_slot(rt, fd))
            rt__conn_serve(rt, fd, buf);
        idle_since = mono_s();
        __atomic_add_fetch(&rt->conns.waiting, 1, __ATOMIC_SEQ_CST);
    }
    sw_free(buf);
    __atomic_sub_fetch(&rt->conns.threads, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int start_thread(rt_router *rt)
{
    if (__atomic_add_fetch(&rt->conns.threads, 1, __ATOMIC_ACQ_REL) > rt->conns.cap) {
        __atomic_sub_fetch(&rt->conns.threads, 1, __ATOMIC_RELEASE);
        return -1;
    }
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, conn_main, rt);
    pthread_attr_destroy(&attr);
    if (rc) {
        __atomic_sub_fetch(&rt->conns.threads, 1, __ATOMIC_RELEASE);
        return -1;
    }
    return 0;
}

int rt__conns_start(rt_router *rt, int lfd)
{
    /* accept wakes this often with EAGAIN, for the idle threads to end; an
     * accepted TCP socket inherits the time-out, which nothing uses: the
     * client socket is only read and written without blocking, after a
     * poll (router_http.c) */
    struct timeval tv = {RT_CONN_IDLE_S, 0};
    if (setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv))
        return -1;
    rt->conns.lfd = lfd;
    /* an event stream holds a thread but no max-connections slot
     * (router_events.c): room for as many of them */
    rt->conns.cap = rt->cfg->max_connections + 2 + RT_MAX_STREAMS;
    return start_thread(rt);
}

void rt__conns_close(rt_router *rt)
{
    __atomic_store_n(&rt->conns.closing, 1, __ATOMIC_SEQ_CST);
    /* the listening socket is closed after this: no thread may still be
     * in accept on it. Shutting it down makes every accept return
     * (EINVAL, on TCP and Unix sockets alike); a thread between its
     * count and its accept finds the flag or the shut socket. */
    shutdown(rt->conns.lfd, SHUT_RDWR);
    for (int i = 0; i < 50 && __atomic_load_n(&rt->conns.waiting, __ATOMIC_SEQ_CST) > 0; i++)
        usleep(20 * 1000);
}
