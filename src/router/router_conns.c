/* router_conns.c - the client connection threads: one per connection, as
 * before, but a thread whose connection ended waits up to
 * RT_CONN_IDLE_S for the next accepted one instead of exiting, so a
 * steady load of short connections does not create and destroy a thread
 * (its stack mapped, faulted in and given back) for each: that was two
 * thirds of the router's CPU time per request (docs/internals/router.md).
 */
#include "router/router-impl.h"

#include "common/alloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define RT_CONN_IDLE_S 30
#define RT_CONN_PENDING 4096

/* An accepted connection and the router that serves it. */
typedef struct conn_item {
    rt_router *rt;
    int fd;
} conn_item;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    conn_item pending[RT_CONN_PENDING]; /* accepted, for an idle thread */
    int head, n;
    int idle;                     /* threads waiting for a connection */
    bool closing;
} cc = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {{0}}, 0, 0, 0, false};

/* arg: the first connection (a conn_item, sw_malloc; freed here) */
static void *conn_main(void *arg)
{
    conn_item it = *(conn_item *)arg;
    sw_free(arg);
    for (;;) {
        rt__conn_serve(it.rt, it.fd);
        pthread_mutex_lock(&cc.mu);
        cc.idle++;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += RT_CONN_IDLE_S;
        while (cc.n == 0 && !cc.closing)
            if (pthread_cond_timedwait(&cc.cv, &cc.mu, &until) == ETIMEDOUT)
                break;
        cc.idle--;
        if (cc.n == 0) {
            pthread_mutex_unlock(&cc.mu);
            return NULL;
        }
        it = cc.pending[cc.head];
        cc.head = (cc.head + 1) % RT_CONN_PENDING;
        cc.n--;
        pthread_mutex_unlock(&cc.mu);
    }
}

int rt__conn_start(rt_router *rt, int fd)
{
    pthread_mutex_lock(&cc.mu);
    if (cc.idle > cc.n && cc.n < RT_CONN_PENDING && !cc.closing) {
        cc.pending[(cc.head + cc.n) % RT_CONN_PENDING] = (conn_item){rt, fd};
        cc.n++;
        pthread_cond_signal(&cc.cv);
        pthread_mutex_unlock(&cc.mu);
        return 0;
    }
    pthread_mutex_unlock(&cc.mu);
    conn_item *it = sw_malloc(sizeof *it);
    if (!it)
        return -1;
    it->rt = rt;
    it->fd = fd;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, conn_main, it);
    pthread_attr_destroy(&attr);
    if (rc)
        sw_free(it);
    return rc ? -1 : 0;
}

void rt__conns_close(void)
{
    pthread_mutex_lock(&cc.mu);
    cc.closing = true;
    pthread_cond_broadcast(&cc.cv);
    pthread_mutex_unlock(&cc.mu);
}
