/* ledger_idem.c - idempotency keys and tool steps (ledger.h), for both
 * backends through ledger-impl.h: the claims that must be atomic across
 * routers (one LDG_IDEM_NEW per key, one *first per tool step), lease
 * take-over and the owner-guarded writes (docs/internals/ledger.md).
 */
#include "ledger/ledger-impl.h"

#include "common/alloc.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Whether a running row (owner in column oc, lease_until in lc) may be
 * taken over: its lease ended by now_s and another owner holds it (a
 * router never takes over its own rows: it is alive, and runs them). */
static bool lease_expired(ldg_ledger *l, ldg__result *r, int oc, int lc, double now_s)
{
    const char *owner = ldg__text(r, oc);
    if (owner && !strcmp(owner, l->owner))
        return false;
    return ldg__real(r, lc) <= now_s;
}

/* ---- idempotency keys ---------------------------------------------------- */

void ldg_stored_free(ldg_stored *s)
{
    if (s) {
        sw_free(s->body);
        s->body = NULL;
    }
}

/* A guarded write on a key changed no row: it is not running under this
 * owner. */
int ldg__idem_owned(int changes, const char *key, sw_error *err)
{
    if (changes > 0)
        return SW_OK;
    return sw_error_set(err, SW_ECONFLICT,
                        "ledger: Idempotency-Key %s is not running under this router (taken over "
                        "or finished)", key);
}

/* Fills stored from a done key's row (columns of idem_begin's SELECT). */
static int idem_replay(ldg__result *r, ldg_stored *stored, sw_error *err)
{
    stored->status = (int)ldg__int(r, 3);
    bool texts = ldg__copy(r, 4, stored->content_type, sizeof stored->content_type) &&
                 ldg__copy(r, 1, stored->request_id, sizeof stored->request_id);
    stored->stream = ldg__int(r, 6) != 0;
    size_t n = 0;
    const void *p = r->be->blob(r, 5, &n);
    stored->body = texts && p && n < SIZE_MAX ? sw_malloc(n + 1) : NULL;
    if (!stored->body)
        return ldg__oom(err);
    if (n)
        memcpy(stored->body, p, n);
    stored->body[n] = 0;
    stored->body_len = n;
    return SW_OK;
}

int ldg_idem_begin(ldg_ledger *l, const char *key, const char *body_sha256, const char *request_id,
                   double now_s, double ttl_s, ldg_idem_state *state, char request_id_out[80],
                   ldg_stored *stored, sw_error *err)
{
    memset(stored, 0, sizeof *stored);
    snprintf(request_id_out, 80, "%s", request_id);
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT body_sha256, request_id, state, status, content_type, response, stream,"
             " expires, owner, lease_until FROM idempotency WHERE key = ?%s",
             l->be->for_update);
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    /* A new key (the common case): one insert, which a row already there
     * makes do nothing; of two routers inserting at once one wins. */
    int inserted = 0;
    rc = ldg__run(l, &inserted, err,
                  "INSERT INTO idempotency (key, body_sha256, request_id, state, created, expires,"
                  " owner, lease_until) VALUES (?, ?, ?, 'running', ?, ?, ?, ?)"
                  " ON CONFLICT (key) DO NOTHING",
                  "sssddsd", key, body_sha256, request_id, now_s, now_s + ttl_s, l->owner,
                  now_s + l->lease_s);
    if (rc || inserted == 1) {
        if (!rc)
            *state = LDG_IDEM_NEW;
        goto out;
    }
    /* The key exists: the look-up and the write are one decision.
     * SQLite's write transaction makes a second connection wait for it;
     * PostgreSQL locks the row (and should the row go meanwhile, an
     * insert that conflicts decides again). */
    if ((rc = ldg__begin(l, err)))
        goto out;
    for (int tries = 0;; tries++) {
        ldg__result *r = NULL;
        if ((rc = ldg__query(l, &r, err, sql, "s", key)))
            goto rollback;
        int s = ldg__row(l, r, err);
        enum { INSERT, REPLACE, TAKE_OVER, DECIDED } act = INSERT;
        if (s < 0) {
            rc = s;
        } else if (s > 0 && ldg__real(r, 7) <= now_s) {
            act = REPLACE; /* expired */
        } else if (s > 0) {
            const char *sha = ldg__text(r, 0);
            const char *rstate = ldg__text(r, 2);
            act = DECIDED;
            if (!sha || !rstate) {
                /* both columns are NOT NULL: memory ran out converting
                 * them, which is neither a mismatch nor a run */
                rc = ldg__oom(err);
            } else if (strcmp(sha, body_sha256)) {
                *state = LDG_IDEM_MISMATCH;
            } else if (!strcmp(rstate, "running") && !lease_expired(l, r, 8, 9, now_s)) {
                *state = LDG_IDEM_RUNNING;
            } else if (strcmp(rstate, "done")) {
                /* abandoned, or running under a dead router's lease */
                act = TAKE_OVER;
                if (!ldg__copy(r, 1, request_id_out, 80))
                    rc = ldg__oom(err);
            } else {
                *state = LDG_IDEM_REPLAY;
                rc = idem_replay(r, stored, err);
            }
        }
        ldg__free(r);
        if (rc)
            goto rollback;
        int changes = 0;
        if (act == TAKE_OVER) {
            rc = ldg__run(l, NULL, err,
                          "UPDATE idempotency SET state = 'running', owner = ?, lease_until = ?,"
                          " fence = fence + 1 WHERE key = ?",
                          "sds", l->owner, now_s + l->lease_s, key);
            *state = LDG_IDEM_NEW;
        } else if (act == REPLACE) {
            /* the row of an expired key is reused (its fence counts on) */
            rc = ldg__run(l, NULL, err,
                          "UPDATE idempotency SET body_sha256 = ?, request_id = ?,"
                          " state = 'running', status = NULL, content_type = NULL, response = NULL, stream = 0,"
                          " created = ?, expires = ?, owner = ?, lease_until = ?, fence = fence + 1"
                          " WHERE key = ?",
                          "ssddsds", body_sha256, request_id, now_s, now_s + ttl_s, l->owner,
                          now_s + l->lease_s, key);
            *state = LDG_IDEM_NEW;
        } else if (act == INSERT) {
            rc = ldg__run(l, &changes, err,
                          "INSERT INTO idempotency (key, body_sha256, request_id, state, created,"
                          " expires, owner, lease_until) VALUES (?, ?, ?, 'running', ?, ?, ?, ?)"
                          " ON CONFLICT (key) DO NOTHING",
                          "sssddsd", key, body_sha256, request_id, now_s, now_s + ttl_s, l->owner,
                          now_s + l->lease_s);
            if (!rc && changes == 0) {
                /* another router inserted it again since the look-up */
                if (tries < 3)
                    continue;
                rc = sw_error_set(err, SW_EIO, "ledger: Idempotency-Key %s keeps changing", key);
            }
            *state = LDG_IDEM_NEW;
        }
        break;
    }
    if (rc)
        goto rollback;
    if ((rc = ldg__commit(l, err)))
        goto rollback;
    goto out;
rollback:
    ldg__rollback(l);
    ldg_stored_free(stored);
out:
    ldg__unlock(l);
    return rc;
}

int ldg_idem_finish(ldg_ledger *l, const char *key, int status, const char *content_type,
                    bool stream, const char *body, size_t body_len, double now_s, sw_error *err)
{
    (void)now_s;
    int changes = 0;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__run(l, &changes, err,
                  "UPDATE idempotency SET state = 'done', status = ?, content_type = ?, stream = ?,"
                  " response = ? WHERE key = ? AND state = 'running' AND owner = ?",
                  "isibss", status, content_type, (int)stream, body, body_len, key, l->owner);
    ldg__unlock(l);
    return rc ? rc : ldg__idem_owned(changes, key, err);
}

int ldg_idem_drop(ldg_ledger *l, const char *key, sw_error *err)
{
    int changes = 0;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__run(l, &changes, err,
                  "DELETE FROM idempotency WHERE key = ? AND state = 'running' AND owner = ?", "ss",
                  key, l->owner);
    ldg__unlock(l);
    return rc ? rc : ldg__idem_owned(changes, key, err);
}

int ldg_idem_abandon(ldg_ledger *l, const char *key, sw_error *err)
{
    int changes = 0;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__run(l, &changes, err,
                  "UPDATE idempotency SET state = 'abandoned' WHERE key = ? AND state = 'running'"
                  " AND owner = ?",
                  "ss", key, l->owner);
    ldg__unlock(l);
    return rc ? rc : ldg__idem_owned(changes, key, err);
}

int ldg_idem_recover(ldg_ledger *l, int *n, sw_error *err)
{
    if (n)
        *n = 0;
    if (l->be->shared)
        return SW_OK; /* other routers run their keys; dead ones' leases expire */
    int changes = 0;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    if (!(rc = ldg__begin(l, err))) {
        rc = ldg__run(l, &changes, err,
                      "UPDATE idempotency SET state = 'abandoned' WHERE state = 'running'", "");
        if (!rc)
            rc = ldg__run(l, NULL, err,
                          "UPDATE jobs SET owner = NULL, lease_until = 0"
                          " WHERE state = 'running'",
                          "");
        if (!rc)
            rc = ldg__commit(l, err);
        if (rc)
            ldg__rollback(l);
    }
    ldg__unlock(l);
    if (n && !rc)
        *n = changes;
    return rc;
}

int ldg_idem_expire(ldg_ledger *l, double now_s, int *n, sw_error *err)
{
    int changes = 0;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__run(l, &changes, err, "DELETE FROM idempotency WHERE expires <= ?", "d", now_s);
    ldg__unlock(l);
    if (n)
        *n = rc ? 0 : changes;
    return rc;
}

/* ---- tool calls ------------------------------------------------------------ */

void ldg_tool_step_free(ldg_tool_step *s)
{
    if (!s)
        return;
    sw_free(s->arguments);
    sw_free(s->result);
    s->arguments = s->result = NULL;
}

int ldg_tool_started(ldg_ledger *l, const char *request_id, int step, const char *tool,
                     const char *call_id, const char *arguments, double now_s, bool *first,
                     sw_error *err)
{
    *first = false;
    ldg__result *r = NULL;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    /* one statement: the insert claims the step, a conflicting one counts
     * a re-call; calls is 1 only on the row this statement created */
    rc = ldg__query(l, &r, err,
                    "INSERT INTO tool_calls (request_id, step, tool, call_id, arguments, state,"
                    " started) VALUES (?, ?, ?, ?, ?, 'started', ?)"
                    " ON CONFLICT (request_id, step) DO UPDATE SET calls = tool_calls.calls + 1,"
                    " started = excluded.started WHERE tool_calls.state = 'started'"
                    " RETURNING calls",
                    "sisssd", request_id, step, tool, call_id ? call_id : "", arguments, now_s);
    if (!rc) {
        int s = ldg__row(l, r, err);
        if (s > 0) {
            *first = ldg__int(r, 0) == 1;
            s = ldg__row(l, r, err);
        }
        if (s < 0) {
            rc = s;
            *first = false;
        }
    }
    ldg__free(r);
    ldg__unlock(l);
    return rc;
}

int ldg_tool_done(ldg_ledger *l, const char *request_id, int step, const char *result,
                  double now_s, sw_error *err)
{
    int changes = 0;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__run(l, &changes, err,
                  "UPDATE tool_calls SET state = 'done', result = ?, finished = ?"
                  " WHERE request_id = ? AND step = ?",
                  "sdsi", result, now_s, request_id, step);
    ldg__unlock(l);
    if (!rc && changes != 1)
        rc = sw_error_set(err, SW_ENOTFOUND, "ledger: tool step %s/%d was never started",
                          request_id, step);
    return rc;
}

int ldg_tool_get(ldg_ledger *l, const char *request_id, int step, ldg_tool_step *out,
                 bool *found, sw_error *err)
{
    memset(out, 0, sizeof *out);
    *found = false;
    ldg__result *r = NULL;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__query(l, &r, err,
                    "SELECT tool, call_id, arguments, state, result, calls, started, finished"
                    " FROM tool_calls WHERE request_id = ? AND step = ?",
                    "si", request_id, step);
    int s = rc ? 0 : ldg__row(l, r, err);
    if (s > 0) {
        *found = true;
        out->step = step;
        ldg__copy(r, 0, out->tool, sizeof out->tool);
        ldg__copy(r, 1, out->call_id, sizeof out->call_id);
        out->arguments = ldg__dup(r, 2);
        const char *state = ldg__text(r, 3); /* NULL: out of memory */
        out->state = state && !strcmp(state, "done") ? LDG_TOOL_DONE : LDG_TOOL_STARTED;
        out->result = ldg__dup(r, 4);
        out->calls = (int)ldg__int(r, 5);
        out->started = ldg__real(r, 6);
        out->finished = ldg__real(r, 7);
        if (!out->arguments || (out->state == LDG_TOOL_DONE && !out->result)) {
            ldg_tool_step_free(out);
            *found = false;
            rc = ldg__oom(err);
        }
    } else if (s < 0) {
        rc = s;
    }
    ldg__free(r);
    ldg__unlock(l);
    return rc;
}
