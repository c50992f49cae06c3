/* router_idem.c - the Idempotency-Key header (docs/router.md,
 * Idempotency): a client retry with the same key and the same body gets
 * the stored response (a stream as a stream) without a new generation;
 * the same key with another body is refused (422), and while the first
 * request still runs, the retry is told so (409).
 *
 * The key is recorded as running in the ledger before the request runs,
 * and the response is stored once it is complete. What is not worth
 * replaying (a 5xx other than unsafe_to_retry, a stream cut short, a
 * client that left) is forgotten, so a retry runs the request again.
 *
 * Across routers sharing a ledger the key is claimed atomically by
 * ldg_idem_begin: a retry that reaches another router while the first
 * still generates is told 409 with Retry-After (half the lease); a key
 * whose router died is taken over once its lease ran out and runs again
 * under its original request id. A key taken over meanwhile refuses this
 * router's final write (SW_ECONFLICT): the answer is sent, not stored.
 */
#include "router/router-impl.h"

#include "api/sse.h"
#include "common/alloc.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The stored response, as it was, plus X-Spillway-Idempotent-Replay. */
static void send_stored(rt_req *q, const ldg_stored *s)
{
    snprintf(q->request_id, sizeof q->request_id, "%s", s->request_id);
    q->worker[0] = 0;
    q->attempts = 0;
    if (!s->stream) {
        /* A stored 202 is a job (POST /v1/spillway/jobs, or a generation
         * queued by Prefer: respond-async): its headers again, from the
         * job id in the stored body, so a retry is told the same thing. */
        char extra[256] = "X-Spillway-Idempotent-Replay: true\r\n";
        json_t *o = s->status == 202 ? sw_json_loadb(s->body, s->body_len, 0, NULL) : NULL;
        const char *id = json_string_value(json_object_get(o, "id"));
        if (id && strlen(id) < 64) {
            bool generation = strcmp(q->path, "/v1/spillway/jobs") != 0;
            snprintf(extra, sizeof extra,
                     "Location: /v1/spillway/jobs/%s\r\n%sX-Spillway-Idempotent-Replay: true\r\n",
                     id, generation ? "Preference-Applied: respond-async\r\n" : "");
        }
        json_decref(o);
        rt__send_response(q, s->status, s->content_type[0] ? s->content_type : "application/json",
                          extra, s->body, s->body_len);
        return;
    }
    char head[512];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                     "Connection: %s\r\nX-Request-Id: %s\r\n"
                     "X-Spillway-Idempotent-Replay: true\r\n\r\n",
                     rt__conn_hdr(q), q->request_id);
    rt__chunked_begin(q);
    if (rt__sink_write(q, head, (size_t)n))
        return;
    /* one chunk per event, as the original stream was sent */
    const char *p = s->body, *end = s->body + s->body_len;
    while (p < end) {
        api_sse_event ev;
        size_t len = api_sse_next(p, (size_t)(end - p), &ev) ? ev.consumed : (size_t)(end - p);
        char hex[32];
        int hn = snprintf(hex, sizeof hex, "%zx\r\n", len);
        if (rt__sink_write(q, hex, (size_t)hn) || rt__sink_write(q, p, len) ||
            rt__sink_write(q, "\r\n", 2))
            return;
        p += len;
    }
    if (rt__sink_write(q, "0\r\n\r\n", 5) == 0)
        rt__chunked_end(q);
}

/* Keys left running because their final write failed with the ledger
 * away (rt__idem_settle_pending). Bounded: past RT_IDEM_PENDING_MAX a key
 * stays running until its TTL, which is logged. */
#define RT_IDEM_PENDING_MAX 256
static struct {
    pthread_mutex_t mu;
    char keys[RT_IDEM_PENDING_MAX][256];
    int n;
} g_pending = {PTHREAD_MUTEX_INITIALIZER, {{0}}, 0};

static void settle_later(const rt_req *q)
{
    pthread_mutex_lock(&g_pending.mu);
    bool added = g_pending.n < RT_IDEM_PENDING_MAX;
    if (added)
        snprintf(g_pending.keys[g_pending.n++], sizeof g_pending.keys[0], "%s", q->idem_key);
    pthread_mutex_unlock(&g_pending.mu);
    if (!added)
        SW_ERROR("router", "request %s: Idempotency-Key left running (too many keys wait for "
                 "the ledger): retries get 409 until it expires", q->request_id);
}

void rt__idem_settle_pending(rt_router *rt)
{
    pthread_mutex_lock(&g_pending.mu);
    for (int i = 0; i < g_pending.n;) {
        sw_error err;
        sw_error_clear(&err);
        int rc = ldg_idem_abandon(rt->ledger, g_pending.keys[i], &err);
        if (rc == SW_EUNAVAILABLE)
            break; /* away again: the next renewal tries */
        if (rc == SW_OK)
            SW_INFO("router", "Idempotency-Key %s: marked abandoned now that the ledger is back "
                    "(a retry runs it again)", g_pending.keys[i]);
        /* done, or no longer ours (SW_ECONFLICT: taken over or settled) */
        memmove(g_pending.keys[i], g_pending.keys[i + 1],
                (size_t)(g_pending.n - i - 1) * sizeof g_pending.keys[0]);
        g_pending.n--;
    }
    pthread_mutex_unlock(&g_pending.mu);
}

void rt__with_idempotency(rt_req *q, void (*handler)(rt_req *q, bool chat), bool chat)
{
    rt_router *rt = q->rt;
    if (q->idem_key_bad) {
        rt__send_error(q, 400, "invalid_request",
                       "Idempotency-Key must have 1 to 255 printable ASCII characters",
                       "Idempotency-Key", NULL);
        return;
    }
    if (!q->idem_key[0] || !rt->ledger) {
        handler(q, chat);
        return;
    }
    static double last_expire;
    double now = rt__wall_s();
    pthread_mutex_lock(&rt->mu);
    bool expire = now - last_expire > 60;
    if (expire)
        last_expire = now;
    pthread_mutex_unlock(&rt->mu);
    sw_error err;
    sw_error_clear(&err);
    if (expire)
        ldg_idem_expire(rt->ledger, now, NULL, NULL); /* best effort */
    char sha[65], rid[80];
    ldg_sha256_hex(q->body ? q->body : "", q->body_len, sha);
    ldg_idem_state st;
    ldg_stored stored;
    if (ldg_idem_begin(rt->ledger, q->idem_key, sha, q->request_id, now,
                       rt->cfg->idempotency_ttl_s, &st, rid, &stored, &err)) {
        rt__ledger_unavailable(q, "the ledger could not record the Idempotency-Key", &err);
        return;
    }
    rt__ledger_seen(rt, SW_OK);
    switch (st) {
    case LDG_IDEM_REPLAY:
        pthread_mutex_lock(&rt->mu);
        rt->idem_replays++;
        pthread_mutex_unlock(&rt->mu);
        SW_INFO("router", "request %s: Idempotency-Key seen, stored response of %s replayed",
                q->request_id, stored.request_id);
        send_stored(q, &stored);
        ldg_stored_free(&stored);
        return;
    case LDG_IDEM_RUNNING: {
        char extra[64];
        snprintf(extra, sizeof extra, "Retry-After: %d\r\n", rt__idem_retry_after_s(rt));
        rt__send_error(q, 409, "idempotency_conflict",
                       "a request with this Idempotency-Key is still running", "Idempotency-Key",
                       extra);
        return;
    }
    case LDG_IDEM_MISMATCH:
        rt__send_error(q, 422, "idempotency_key_reused",
                       "this Idempotency-Key was used with a different body", "Idempotency-Key",
                       NULL);
        return;
    case LDG_IDEM_NEW:
        break;
    }
    /* the original request id when an abandoned run is taken over */
    snprintf(q->request_id, sizeof q->request_id, "%s", rid);
    q->cap.on = true;
    /* a whole answer goes out after the ledger stored it (below): a
     * router killed in between leaves a key whose answer nobody got */
    q->cap.hold = true;
    handler(q, chat);
    const rt_capture *c = &q->cap;
    bool keep = c->status > 0 && !c->overflow &&
                (c->stream ? q->completed
                           : c->status < 500 ||
                                 (q->error_code && !strcmp(q->error_code, "unsafe_to_retry")));
    /* A failed agent run that recorded tool steps keeps its key (abandoned,
     * not dropped): the client's retry then runs under the same request id
     * and reuses the recorded steps instead of calling a tool again. */
    bool steps = false;
    if (!keep) {
        ldg_tool_step first;
        memset(&first, 0, sizeof first);
        if (ldg_tool_get(rt->ledger, q->request_id, 1, &first, &steps, NULL) != SW_OK)
            steps = true; /* unknown: keep the safe side */
        ldg_tool_step_free(&first);
    }
    int rc = keep    ? ldg_idem_finish(rt->ledger, q->idem_key, c->status, c->content_type,
                                       c->stream, c->body, c->len, rt__wall_s(), &err)
             : steps ? ldg_idem_abandon(rt->ledger, q->idem_key, &err)
                     : ldg_idem_drop(rt->ledger, q->idem_key, &err);
    if (rc == SW_ECONFLICT) {
        /* another router took the key over (this one's lease ran out):
         * its run is the key's; this answer was sent, not stored */
        pthread_mutex_lock(&rt->mu);
        rt->fenced_keys++;
        pthread_mutex_unlock(&rt->mu);
        SW_WARN("router", "request %s: Idempotency-Key taken over by another router; this "
                "answer is not %s", q->request_id, keep ? "stored" : "dropped");
    } else if (rc) {
        rt__ledger_seen(rt, rc);
        SW_WARN("router", "request %s: Idempotency-Key not %s: %s", q->request_id,
                keep ? "stored" : "dropped", err.message);
        /* left running, every retry would get 409 until the key expires */
        sw_error aerr;
        int arc = ldg_idem_abandon(rt->ledger, q->idem_key, &aerr);
        if (arc == SW_EUNAVAILABLE) {
            SW_WARN("router", "request %s: Idempotency-Key to be marked abandoned once the "
                    "ledger is back", q->request_id);
            settle_later(q);
        } else if (arc && arc != SW_ECONFLICT) {
            SW_WARN("router", "request %s: Idempotency-Key not abandoned either: %s",
                    q->request_id, aerr.message);
        }
    }
    rt__capture_release(q);
    rt__capture_free(&q->cap);
    q->cap.on = false;
    q->cap.hold = false;
}
