/* router_lease.c - the router's hold on what it runs in the ledger
 * (docs/router.md, Several routers): the lease keeper, and what the other
 * parts do when the ledger cannot be reached.
 *
 * Every running Idempotency-Key and every running job carries the lease
 * of the router that runs it (ldg_set_owner). The keeper renews them all
 * every third of the lease (ldg_renew), so a router that dies, or loses
 * the ledger for longer than a lease, lets another router take its keys
 * and jobs over; a write it makes after that is refused by the fence
 * (SW_ECONFLICT) and dropped. It runs with SQLite too: there the only
 * taker is this router itself, which must not take a key it still runs
 * for a key whose router died.
 *
 * After each renewal that reached the ledger it also settles the keys
 * whose last write failed while the ledger was away
 * (rt__idem_settle_pending, router_idem.c).
 */
#include "router/router-impl.h"

#include "common/log.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Best-effort writes that fail say so at most this often. */
#define RT_LEDGER_WARN_EVERY_S 5.0

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC; signalled by rt__lease_stop */
    pthread_t th;
    bool started, stop;
} g_lease;

static double warned_at; /* rt__now_s of the last rate-limited line; under rt->mu */

bool rt__ledger_warn_due(rt_router *rt)
{
    double t = rt__now_s();
    pthread_mutex_lock(&rt->mu);
    bool due = warned_at == 0 || t - warned_at >= RT_LEDGER_WARN_EVERY_S;
    if (due)
        warned_at = t;
    pthread_mutex_unlock(&rt->mu);
    return due;
}

void rt__ledger_seen(rt_router *rt, int rc)
{
    if (rc == SW_OK)
        atomic_store(&rt->ledger_reachable, 1);
    else if (rc == SW_EUNAVAILABLE)
        atomic_store(&rt->ledger_reachable, 0);
}

void rt__ledger_unavailable(rt_req *q, const char *msg, const sw_error *err)
{
    rt_router *rt = q->rt;
    if (err && err->code == SW_EUNAVAILABLE) {
        rt__ledger_seen(rt, SW_EUNAVAILABLE);
        if (rt__ledger_warn_due(rt))
            SW_WARN("router", "request %s: %s: %s (requests that need the ledger get 503 "
                    "ledger_unavailable until it is back)", q->request_id, msg, err->message);
    } else {
        SW_ERROR("router", "request %s: %s: %s", q->request_id, msg,
                 err && err->message[0] ? err->message : "no detail");
    }
    char extra[64];
    snprintf(extra, sizeof extra, "Retry-After: %d\r\n", RT_LEDGER_RETRY_AFTER_S);
    rt__send_error(q, 503, "ledger_unavailable", msg, NULL, extra);
}

bool rt__ledger_ready(rt_req *q)
{
    rt_router *rt = q->rt;
    if (!rt->ledger)
        return true;
    /* a read of a row that cannot exist: one round trip, nothing written */
    ldg_response r;
    bool found = false;
    sw_error err;
    sw_error_clear(&err);
    int rc = ldg_response_get(rt->ledger, "", &r, &found, &err);
    if (rc == SW_OK) {
        if (found)
            ldg_response_free(&r);
        rt__ledger_seen(rt, SW_OK);
        return true;
    }
    rt__ledger_unavailable(q, "the ledger cannot be reached", &err);
    return false;
}

int rt__idem_retry_after_s(const rt_router *rt)
{
    if (!rt->ledger || !ldg_shared(rt->ledger))
        return 1; /* this router runs the key: it ends with its generation */
    /* another router may be generating, or may have died: its lease
     * then runs out within lease_s */
    int s = (int)ceil(ldg_lease_s(rt->ledger) / 2);
    return s < 1 ? 1 : s;
}

static void *lease_thread(void *arg)
{
    rt_router *rt = arg;
    double every = ldg_lease_s(rt->ledger) / 3;
    bool lost = false;
    pthread_mutex_lock(&g_lease.mu);
    while (!g_lease.stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long long ns = (long long)ts.tv_nsec + (long long)(every * 1e9);
        ts.tv_sec += (time_t)(ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        pthread_cond_timedwait(&g_lease.cv, &g_lease.mu, &ts);
        if (g_lease.stop)
            break;
        pthread_mutex_unlock(&g_lease.mu);
        sw_error err;
        sw_error_clear(&err);
        int rc = ldg_renew(rt->ledger, rt__wall_s(), &err);
        rt__ledger_seen(rt, rc);
        if (rc && !lost) {
            lost = true;
            SW_WARN("router", "ledger: the leases could not be renewed: %s; what this router "
                    "runs may be taken over by another router after %.0f s",
                    err.message, ldg_lease_s(rt->ledger));
        } else if (rc == SW_OK) {
            if (lost)
                SW_INFO("router", "ledger: reachable again; leases renewed");
            lost = false;
            rt__idem_settle_pending(rt);
        }
        pthread_mutex_lock(&g_lease.mu);
    }
    pthread_mutex_unlock(&g_lease.mu);
    return NULL;
}

int rt__lease_start(rt_router *rt)
{
    memset(&g_lease, 0, sizeof g_lease);
    pthread_mutex_init(&g_lease.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_lease.cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_store(&rt->ledger_reachable, 1);
    if (!rt->ledger)
        return 0;
    if (pthread_create(&g_lease.th, NULL, lease_thread, rt))
        return -1;
    g_lease.started = true;
    return 0;
}

void rt__lease_stop(rt_router *rt)
{
    (void)rt;
    if (!g_lease.started)
        return;
    pthread_mutex_lock(&g_lease.mu);
    g_lease.stop = true;
    pthread_cond_broadcast(&g_lease.cv);
    pthread_mutex_unlock(&g_lease.mu);
    pthread_join(g_lease.th, NULL);
    g_lease.started = false;
}
