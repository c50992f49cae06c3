/* ledger.c - the ledger's functions (ledger.h), written once for both
 * backends: each one is a statement or one explicit transaction, run
 * through the backend (ledger-impl.h; ledger_sqlite.c, ledger_pg.c) under
 * the ledger's mutex. What the rows mean (leases, fences, the claims) is
 * decided here, so the two backends cannot drift apart; the SQL is the
 * dialect both speak, with the few differences picked by the backend's
 * fields.
 */
#include "ledger/ledger-impl.h"

#include "common/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* ---- statement helpers ------------------------------------------------- */

/* Takes the ledger's mutex and readies the connection; on failure the
 * mutex is released again. */
static int lock(ldg_ledger *l, sw_error *err)
{
    pthread_mutex_lock(&l->mu);
    int rc = l->be->ready(l, err);
    if (rc)
        pthread_mutex_unlock(&l->mu);
    return rc;
}

static void unlock(ldg_ledger *l)
{
    pthread_mutex_unlock(&l->mu);
}

/* Runs sql with its parameters (fmt: ledger-impl.h); the caller reads the
 * rows with row() and frees *r. */
static int q_open(ldg_ledger *l, ldg__result **r, sw_error *err, const char *sql,
                  const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = l->be->query(l, sql, fmt, ap, r, err);
    va_end(ap);
    return rc;
}

/* 1 a row, 0 the end, < 0 an error */
static int row(ldg_ledger *l, ldg__result *r, sw_error *err)
{
    return l->be->next(l, r, err);
}

static void q_free(ldg__result *r)
{
    if (r)
        r->be->result_free(r);
}

/* Runs a statement whose rows (if any) nobody reads; *changes (may be
 * NULL): the rows it changed. */
static int q_run(ldg_ledger *l, int *changes, sw_error *err, const char *sql, const char *fmt,
                 ...)
{
    ldg__result *r = NULL;
    va_list ap;
    va_start(ap, fmt);
    int rc = l->be->query(l, sql, fmt, ap, &r, err);
    va_end(ap);
    if (rc)
        return rc;
    int s;
    while ((s = row(l, r, err)) > 0)
        ;
    rc = s < 0 ? s : SW_OK;
    if (!rc && changes)
        *changes = l->be->changes(l, r);
    q_free(r);
    return rc;
}

static int begin(ldg_ledger *l, sw_error *err) { return l->be->begin(l, err); }
static int commit(ldg_ledger *l, sw_error *err) { return l->be->exec(l, "COMMIT", err); }
static void rollback(ldg_ledger *l) { l->be->exec(l, "ROLLBACK", NULL); }

static bool is_sqlite(const ldg_ledger *l) { return l->be == &ldg__sqlite_backend; }

static char *c_dup(ldg__result *r, int i)
{
    const char *t = r->be->text(r, i);
    return t ? sw_strdup(t) : NULL;
}

/* "" for NULL; false when the column is not NULL but memory ran out
 * making its text (dst is then ""). */
static bool c_copy(ldg__result *r, int i, char *dst, size_t cap)
{
    const char *t = r->be->text(r, i);
    snprintf(dst, cap, "%s", t ? t : "");
    return t || r->be->is_null(r, i);
}

static int64_t c_int(ldg__result *r, int i) { return r->be->int64(r, i); }
static double c_real(ldg__result *r, int i) { return r->be->real(r, i); }

static int oom(sw_error *err) { return sw_error_set(err, SW_ENOMEM, "ledger: out of memory"); }

/* ---- open, close, owner ------------------------------------------------ */

/* "<hostname>:<pid>:<8 random hex>", cut to LDG_OWNER_MAX bytes at the
 * host name so the pid and the random part stay. */
static void default_owner(char out[LDG_OWNER_MAX + 1])
{
    char host[256] = "";
    if (gethostname(host, sizeof host))
        snprintf(host, sizeof host, "host");
    host[sizeof host - 1] = 0;
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = (uint32_t)getpid() * 2654435761u ^ (uint32_t)(uintptr_t)out;
    char tail[40];
    int tn = snprintf(tail, sizeof tail, ":%ld:%08x", (long)getpid(), (unsigned)rnd);
    int hn = (int)strlen(host);
    if (hn > LDG_OWNER_MAX - tn)
        hn = LDG_OWNER_MAX - tn;
    snprintf(out, LDG_OWNER_MAX + 1, "%.*s%s", hn, host, tail);
}

static bool is_pg_url(const char *where)
{
    return !strncmp(where, "postgresql://", 13) || !strncmp(where, "postgres://", 11);
}

int ldg_open(const char *where, ldg_ledger **out, sw_error *err)
{
    *out = NULL;
    if (!where || !where[0])
        return sw_error_set(err, SW_EINVAL, "ledger: no state directory or database URL");
    ldg_ledger *l = sw_calloc(1, sizeof *l);
    if (!l)
        return oom(err);
    pthread_mutex_init(&l->mu, NULL);
    default_owner(l->owner);
    l->lease_s = 10;
    bool pg = is_pg_url(where);
    l->be = pg ? &ldg__pg_backend : &ldg__sqlite_backend;
    int rc = pg ? ldg__pg_open(l, where, err) : ldg__sqlite_open(l, where, err);
    if (rc) {
        pthread_mutex_destroy(&l->mu);
        sw_free(l);
        return rc;
    }
    *out = l;
    return SW_OK;
}

void ldg_close(ldg_ledger *l)
{
    if (!l)
        return;
    l->be->close(l);
    pthread_mutex_destroy(&l->mu);
    sw_free(l);
}

int ldg_schema_version(ldg_ledger *l)
{
    if (lock(l, NULL))
        return -1;
    int v = l->be->schema_version(l);
    unlock(l);
    return v;
}

const char *ldg_backend(const ldg_ledger *l) { return l->be->name; }
bool ldg_shared(const ldg_ledger *l) { return l->be->shared; }

void ldg_set_owner(ldg_ledger *l, const char *owner, double lease_s)
{
    pthread_mutex_lock(&l->mu);
    if (owner && owner[0])
        snprintf(l->owner, sizeof l->owner, "%s", owner);
    if (lease_s > 0)
        l->lease_s = lease_s;
    pthread_mutex_unlock(&l->mu);
}

const char *ldg_owner(const ldg_ledger *l) { return l->owner; }
double ldg_lease_s(const ldg_ledger *l) { return l->lease_s; }

/* ---- leases ------------------------------------------------------------- */

/* Whether a running row (owner in column oc, lease_until in lc) may be
 * taken over: its lease ended by now_s and another owner holds it (a
 * router never takes over its own rows: it is alive, and runs them). */
static bool lease_expired(ldg_ledger *l, ldg__result *r, int oc, int lc, double now_s)
{
    const char *owner = r->be->text(r, oc);
    if (owner && !strcmp(owner, l->owner))
        return false;
    return c_real(r, lc) <= now_s;
}

int ldg_renew(ldg_ledger *l, double now_s, sw_error *err)
{
    int rc = lock(l, err);
    if (rc)
        return rc;
    double until = now_s + l->lease_s;
    if (!(rc = begin(l, err))) {
        rc = q_run(l, NULL, err,
                   "UPDATE idempotency SET lease_until = ? WHERE state = 'running' AND owner = ?",
                   "ds", until, l->owner);
        if (!rc)
            rc = q_run(l, NULL, err,
                       "UPDATE jobs SET lease_until = ? WHERE state = 'running' AND owner = ?",
                       "ds", until, l->owner);
        if (!rc)
            rc = commit(l, err);
        if (rc)
            rollback(l);
    }
    unlock(l);
    return rc;
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
static int idem_owned(int changes, const char *key, sw_error *err)
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
    stored->status = (int)c_int(r, 3);
    bool texts = c_copy(r, 4, stored->content_type, sizeof stored->content_type) &&
                 c_copy(r, 1, stored->request_id, sizeof stored->request_id);
    stored->stream = c_int(r, 6) != 0;
    size_t n = 0;
    const void *p = r->be->blob(r, 5, &n);
    stored->body = texts && p && n < SIZE_MAX ? sw_malloc(n + 1) : NULL;
    if (!stored->body)
        return oom(err);
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
    int rc = lock(l, err);
    if (rc)
        return rc;
    /* A new key (the common case): one insert, which a row already there
     * makes do nothing; of two routers inserting at once one wins. */
    int inserted = 0;
    rc = q_run(l, &inserted, err,
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
    if ((rc = begin(l, err)))
        goto out;
    for (int tries = 0;; tries++) {
        ldg__result *r = NULL;
        if ((rc = q_open(l, &r, err, sql, "s", key)))
            goto rollback;
        int s = row(l, r, err);
        enum { INSERT, REPLACE, TAKE_OVER, DECIDED } act = INSERT;
        if (s < 0) {
            rc = s;
        } else if (s > 0 && c_real(r, 7) <= now_s) {
            act = REPLACE; /* expired */
        } else if (s > 0) {
            const char *sha = r->be->text(r, 0);
            const char *rstate = r->be->text(r, 2);
            act = DECIDED;
            if (!sha || !rstate) {
                /* both columns are NOT NULL: memory ran out converting
                 * them, which is neither a mismatch nor a run */
                rc = oom(err);
            } else if (strcmp(sha, body_sha256)) {
                *state = LDG_IDEM_MISMATCH;
            } else if (!strcmp(rstate, "running") && !lease_expired(l, r, 8, 9, now_s)) {
                *state = LDG_IDEM_RUNNING;
            } else if (strcmp(rstate, "done")) {
                /* abandoned, or running under a dead router's lease */
                act = TAKE_OVER;
                if (!c_copy(r, 1, request_id_out, 80))
                    rc = oom(err);
            } else {
                *state = LDG_IDEM_REPLAY;
                rc = idem_replay(r, stored, err);
            }
        }
        q_free(r);
        if (rc)
            goto rollback;
        int changes = 0;
        if (act == TAKE_OVER) {
            rc = q_run(l, NULL, err,
                       "UPDATE idempotency SET state = 'running', owner = ?, lease_until = ?,"
                       " fence = fence + 1 WHERE key = ?",
                       "sds", l->owner, now_s + l->lease_s, key);
            *state = LDG_IDEM_NEW;
        } else if (act == REPLACE) {
            /* the row of an expired key is reused (its fence counts on) */
            rc = q_run(l, NULL, err,
                       "UPDATE idempotency SET body_sha256 = ?, request_id = ?, state = 'running',"
                       " status = NULL, content_type = NULL, response = NULL, stream = 0,"
                       " created = ?, expires = ?, owner = ?, lease_until = ?, fence = fence + 1"
                       " WHERE key = ?",
                       "ssddsds", body_sha256, request_id, now_s, now_s + ttl_s, l->owner,
                       now_s + l->lease_s, key);
            *state = LDG_IDEM_NEW;
        } else if (act == INSERT) {
            rc = q_run(l, &changes, err,
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
    if ((rc = commit(l, err)))
        goto rollback;
    goto out;
rollback:
    rollback(l);
    ldg_stored_free(stored);
out:
    unlock(l);
    return rc;
}

int ldg_idem_finish(ldg_ledger *l, const char *key, int status, const char *content_type,
                    bool stream, const char *body, size_t body_len, double now_s, sw_error *err)
{
    (void)now_s;
    int changes = 0;
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_run(l, &changes, err,
               "UPDATE idempotency SET state = 'done', status = ?, content_type = ?, stream = ?,"
               " response = ? WHERE key = ? AND state = 'running' AND owner = ?",
               "isibss", status, content_type, (int)stream, body, body_len, key, l->owner);
    unlock(l);
    return rc ? rc : idem_owned(changes, key, err);
}

int ldg_idem_drop(ldg_ledger *l, const char *key, sw_error *err)
{
    int changes = 0;
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_run(l, &changes, err,
               "DELETE FROM idempotency WHERE key = ? AND state = 'running' AND owner = ?", "ss",
               key, l->owner);
    unlock(l);
    return rc ? rc : idem_owned(changes, key, err);
}

int ldg_idem_abandon(ldg_ledger *l, const char *key, sw_error *err)
{
    int changes = 0;
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_run(l, &changes, err,
               "UPDATE idempotency SET state = 'abandoned' WHERE key = ? AND state = 'running'"
               " AND owner = ?",
               "ss", key, l->owner);
    unlock(l);
    return rc ? rc : idem_owned(changes, key, err);
}

int ldg_idem_recover(ldg_ledger *l, int *n, sw_error *err)
{
    if (n)
        *n = 0;
    if (l->be->shared)
        return SW_OK; /* other routers run their keys; dead ones' leases expire */
    int changes = 0;
    int rc = lock(l, err);
    if (rc)
        return rc;
    if (!(rc = begin(l, err))) {
        rc = q_run(l, &changes, err,
                   "UPDATE idempotency SET state = 'abandoned' WHERE state = 'running'", "");
        if (!rc)
            rc = q_run(l, NULL, err,
                       "UPDATE jobs SET owner = NULL, lease_until = 0 WHERE state = 'running'", "");
        if (!rc)
            rc = commit(l, err);
        if (rc)
            rollback(l);
    }
    unlock(l);
    if (n && !rc)
        *n = changes;
    return rc;
}

int ldg_idem_expire(ldg_ledger *l, double now_s, int *n, sw_error *err)
{
    int changes = 0;
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_run(l, &changes, err, "DELETE FROM idempotency WHERE expires <= ?", "d", now_s);
    unlock(l);
    if (n)
        *n = rc ? 0 : changes;
    return rc;
}

/* ---- attempts ------------------------------------------------------------ */

int ldg_attempt_add(ldg_ledger *l, const char *request_id, int attempt, const char *worker,
                    const char *outcome, const char *error, double started_s, double finished_s,
                    sw_error *err)
{
    int rc = lock(l, err);
    if (rc)
        return rc;
    /* a record, not a promise: no sync of its own (ledger_sqlite.c) */
    if (l->be->relax)
        l->be->relax(l, true);
    rc = q_run(l, NULL, err,
               "INSERT INTO attempts (request_id, attempt, worker, outcome, error, started,"
               " finished) VALUES (?, ?, ?, ?, ?, ?, ?)",
               "sisssdd", request_id, attempt, worker, outcome, error, started_s, finished_s);
    if (l->be->relax)
        l->be->relax(l, false);
    unlock(l);
    return rc;
}

int ldg_attempt_count(ldg_ledger *l, const char *request_id, int *n, sw_error *err)
{
    *n = 0;
    ldg__result *r = NULL;
    int rc = lock(l, err);
    if (rc)
        return rc;
    if (!(rc = q_open(l, &r, err, "SELECT count(*) FROM attempts WHERE request_id = ?", "s",
                      request_id))) {
        int s = row(l, r, err);
        if (s > 0)
            *n = (int)c_int(r, 0);
        else
            rc = s < 0 ? s : sw_error_set(err, SW_EIO, "ledger: attempt count: no row");
    }
    q_free(r);
    unlock(l);
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
    int rc = lock(l, err);
    if (rc)
        return rc;
    /* one statement: the insert claims the step, a conflicting one counts
     * a re-call; calls is 1 only on the row this statement created */
    rc = q_open(l, &r, err,
                "INSERT INTO tool_calls (request_id, step, tool, call_id, arguments, state,"
                " started) VALUES (?, ?, ?, ?, ?, 'started', ?)"
                " ON CONFLICT (request_id, step) DO UPDATE SET calls = tool_calls.calls + 1,"
                " started = excluded.started WHERE tool_calls.state = 'started'"
                " RETURNING calls",
                "sisssd", request_id, step, tool, call_id ? call_id : "", arguments, now_s);
    if (!rc) {
        int s = row(l, r, err);
        if (s > 0) {
            *first = c_int(r, 0) == 1;
            s = row(l, r, err);
        }
        if (s < 0) {
            rc = s;
            *first = false;
        }
    }
    q_free(r);
    unlock(l);
    return rc;
}

int ldg_tool_done(ldg_ledger *l, const char *request_id, int step, const char *result,
                  double now_s, sw_error *err)
{
    int changes = 0;
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_run(l, &changes, err,
               "UPDATE tool_calls SET state = 'done', result = ?, finished = ?"
               " WHERE request_id = ? AND step = ?",
               "sdsi", result, now_s, request_id, step);
    unlock(l);
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
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_open(l, &r, err,
                "SELECT tool, call_id, arguments, state, result, calls, started, finished"
                " FROM tool_calls WHERE request_id = ? AND step = ?",
                "si", request_id, step);
    int s = rc ? 0 : row(l, r, err);
    if (s > 0) {
        *found = true;
        out->step = step;
        c_copy(r, 0, out->tool, sizeof out->tool);
        c_copy(r, 1, out->call_id, sizeof out->call_id);
        out->arguments = c_dup(r, 2);
        const char *state = r->be->text(r, 3); /* NULL: out of memory */
        out->state = state && !strcmp(state, "done") ? LDG_TOOL_DONE : LDG_TOOL_STARTED;
        out->result = c_dup(r, 4);
        out->calls = (int)c_int(r, 5);
        out->started = c_real(r, 6);
        out->finished = c_real(r, 7);
        if (!out->arguments || (out->state == LDG_TOOL_DONE && !out->result)) {
            ldg_tool_step_free(out);
            *found = false;
            rc = oom(err);
        }
    } else if (s < 0) {
        rc = s;
    }
    q_free(r);
    unlock(l);
    return rc;
}

/* ---- jobs ------------------------------------------------------------------ */

static const char *const k_job_states[] = {"queued", "running", "succeeded", "failed"};

const char *ldg_job_state_name(int state)
{
    return state >= 0 && state < 4 ? k_job_states[state] : "unknown";
}

static int job_state_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (s && !strcmp(s, k_job_states[i]))
            return i;
    return -1;
}

void ldg_job_free(ldg_job *j)
{
    if (!j)
        return;
    sw_free(j->request);
    sw_free(j->response);
    sw_free(j->error);
    j->request = j->response = j->error = NULL;
}

#define LDG_JOB_INSERT                                                                          \
    "INSERT INTO jobs (id, endpoint, request, deadline_ms, state, created)"                      \
    " VALUES (?, ?, ?, ?, 'queued', ?)"

int ldg_job_insert(ldg_ledger *l, const ldg_job *j, sw_error *err)
{
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_run(l, NULL, err, LDG_JOB_INSERT, "sssId", j->id, j->endpoint, j->request,
               (int64_t)j->deadline_ms, j->created);
    unlock(l);
    return rc;
}

int ldg_job_insert_idem(ldg_ledger *l, const ldg_job *j, const char *idem_key, int status,
                        const char *content_type, const char *body, size_t body_len,
                        sw_error *err)
{
    if (!idem_key || !idem_key[0])
        return ldg_job_insert(l, j, err);
    int rc = lock(l, err);
    if (rc)
        return rc;
    if ((rc = begin(l, err)))
        goto out;
    rc = q_run(l, NULL, err, LDG_JOB_INSERT, "sssId", j->id, j->endpoint, j->request,
               (int64_t)j->deadline_ms, j->created);
    int changes = 0;
    if (!rc)
        rc = q_run(l, &changes, err,
                   "UPDATE idempotency SET state = 'done', status = ?, content_type = ?,"
                   " stream = 0, response = ? WHERE key = ? AND state = 'running' AND owner = ?",
                   "isbss", status, content_type, body, body_len, idem_key, l->owner);
    if (!rc)
        rc = idem_owned(changes, idem_key, err);
    if (!rc)
        rc = commit(l, err);
    if (rc)
        rollback(l);
out:
    unlock(l);
    return rc;
}

int ldg_job_get(ldg_ledger *l, const char *id, ldg_job *out, bool *found, sw_error *err)
{
    memset(out, 0, sizeof *out);
    *found = false;
    ldg__result *r = NULL;
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_open(l, &r, err,
                "SELECT endpoint, request, deadline_ms, state, attempts, finish_writes, response,"
                " error, created, started, finished FROM jobs WHERE id = ?",
                "s", id);
    int s = rc ? 0 : row(l, r, err);
    if (s > 0) {
        *found = true;
        snprintf(out->id, sizeof out->id, "%s", id);
        c_copy(r, 0, out->endpoint, sizeof out->endpoint);
        out->request = c_dup(r, 1);
        out->deadline_ms = r->be->is_null(r, 2) ? -1 : c_int(r, 2);
        out->state = job_state_parse(r->be->text(r, 3));
        out->attempts = (int)c_int(r, 4);
        out->finish_writes = (int)c_int(r, 5);
        out->response = c_dup(r, 6);
        out->error = c_dup(r, 7);
        out->created = c_real(r, 8);
        out->started = c_real(r, 9);
        out->finished = c_real(r, 10);
        if (!out->request) {
            ldg_job_free(out);
            *found = false;
            rc = oom(err);
        }
    } else if (s < 0) {
        rc = s;
    }
    q_free(r);
    unlock(l);
    return rc;
}

/* The claim of a job, shared by ldg_job_start and ldg_job_claim: the rows
 * that may be claimed (queued, or running under another owner whose lease
 * ended at ?1 now) and what a claim writes (?1 now, ?2 this owner, ?3 the
 * lease's end). */
#define LDG_JOB_CLAIMABLE                                                                       \
    "(state = 'queued' OR (state = 'running' AND lease_until <= ?1"                            \
    " AND COALESCE(owner, '') <> ?2))"
#define LDG_JOB_CLAIM_SET                                                                       \
    "UPDATE jobs SET state = 'running', attempts = attempts + 1, started = ?1, owner = ?2,"     \
    " lease_until = ?3, fence = fence + 1"

/* Runs a claim statement (returning id, fence; parameters as above, and
 * ?4 the id for a start). */
static int job_claim_run(ldg_ledger *l, const char *sql, const char *id, double now_s,
                         char id_out[48], int64_t *fence, bool *got, sw_error *err)
{
    *got = false;
    *fence = 0;
    if (id_out)
        id_out[0] = 0;
    ldg__result *r = NULL;
    int rc = lock(l, err);
    if (rc)
        return rc;
    if (id)
        rc = q_open(l, &r, err, sql, "dsds", now_s, l->owner, now_s + l->lease_s, id);
    else
        rc = q_open(l, &r, err, sql, "dsd", now_s, l->owner, now_s + l->lease_s);
    int s = rc ? 0 : row(l, r, err);
    if (s > 0) {
        *got = true;
        if (id_out)
            c_copy(r, 0, id_out, 48);
        *fence = c_int(r, 1);
        s = row(l, r, err);
    }
    if (s < 0) {
        rc = s;
        *got = false;
        if (id_out)
            id_out[0] = 0;
    }
    q_free(r);
    unlock(l);
    return rc;
}

int ldg_job_start(ldg_ledger *l, const char *id, double now_s, bool *claimed, int64_t *fence,
                  sw_error *err)
{
    return job_claim_run(l,
                         LDG_JOB_CLAIM_SET " WHERE id = ?4 AND " LDG_JOB_CLAIMABLE
                                           " RETURNING id, fence",
                         id, now_s, NULL, fence, claimed, err);
}

int ldg_job_claim(ldg_ledger *l, double now_s, char id_out[48], int64_t *fence, bool *got,
                  sw_error *err)
{
    /* One statement. SQLite runs it alone, so one connection claims the
     * oldest job; PostgreSQL locks the row it picks, and another router
     * picking at the same time skips it for the next. */
    char sql[640];
    snprintf(sql, sizeof sql,
             LDG_JOB_CLAIM_SET " WHERE %s = (SELECT %s FROM jobs WHERE " LDG_JOB_CLAIMABLE
                               " ORDER BY created, %s LIMIT 1%s) RETURNING id, fence",
             l->be->jobs_order, l->be->jobs_order, l->be->jobs_order,
             l->be->shared ? " FOR UPDATE SKIP LOCKED" : "");
    return job_claim_run(l, sql, NULL, now_s, id_out, fence, got, err);
}

/* A fenced write on a job changed no row: SW_ENOTFOUND for an unknown id,
 * SW_ECONFLICT when it is not running with this fence. *running (may be
 * NULL): whether it runs at all. */
static int job_unfenced(ldg_ledger *l, const char *id, bool *running, sw_error *err)
{
    ldg__result *r = NULL;
    int rc = q_open(l, &r, err, "SELECT state FROM jobs WHERE id = ?", "s", id);
    int s = rc ? 0 : row(l, r, err);
    if (s > 0) {
        if (running)
            *running = job_state_parse(r->be->text(r, 0)) == LDG_JOB_RUNNING;
        rc = sw_error_set(err, SW_ECONFLICT,
                          "ledger: job %s is not running under this claim (taken over or "
                          "finished)", id);
    } else if (s == 0 && !rc) {
        rc = sw_error_set(err, SW_ENOTFOUND, "ledger: no job %s", id);
    } else if (s < 0) {
        rc = s;
    }
    q_free(r);
    return rc;
}

int ldg_job_finish(ldg_ledger *l, const char *id, int64_t fence, int state, const char *response,
                   const char *error, double now_s, sw_error *err)
{
    if (state != LDG_JOB_SUCCEEDED && state != LDG_JOB_FAILED)
        return sw_error_set(err, SW_EINVAL, "ledger: a job finishes as succeeded or failed");
    int changes = 0;
    int rc = lock(l, err);
    if (rc)
        return rc;
    /* finish_writes counts every final write: a job completed twice would
     * show (the tests check it is 1) */
    rc = q_run(l, &changes, err,
               "UPDATE jobs SET state = ?, response = ?, error = ?, finished = ?,"
               " finish_writes = finish_writes + 1 WHERE id = ? AND state = 'running'"
               " AND fence = ?",
               "sssdsI", ldg_job_state_name(state), response, error, now_s, id, fence);
    if (!rc && changes != 1)
        rc = job_unfenced(l, id, NULL, err);
    unlock(l);
    return rc;
}

int ldg_job_requeue(ldg_ledger *l, const char *id, int64_t fence, bool *requeued, sw_error *err)
{
    int changes = 0;
    int rc = lock(l, err);
    if (requeued)
        *requeued = false;
    if (rc)
        return rc;
    /* only from running: a succeeded or failed job keeps its final record */
    rc = q_run(l, &changes, err,
               "UPDATE jobs SET state = 'queued', owner = NULL, lease_until = 0"
               " WHERE id = ? AND state = 'running' AND fence = ?",
               "sI", id, fence);
    if (!rc && changes != 1) {
        bool running = false;
        sw_error why;
        sw_error_clear(&why);
        int u = job_unfenced(l, id, &running, &why);
        /* running under another claim: a conflict; finished, queued or
         * unknown: left as it is */
        if ((u == SW_ECONFLICT && running) || (u != SW_ECONFLICT && u != SW_ENOTFOUND))
            rc = sw_error_set(err, u, "%s", why.message);
    }
    unlock(l);
    if (requeued)
        *requeued = !rc && changes == 1;
    return rc;
}

int ldg_job_pending(ldg_ledger *l, char (**ids)[48], size_t *n, sw_error *err)
{
    *ids = NULL;
    *n = 0;
    size_t cap = 0;
    char sql[160];
    snprintf(sql, sizeof sql,
             "SELECT id FROM jobs WHERE state IN ('queued', 'running') ORDER BY created, %s",
             l->be->jobs_order);
    ldg__result *r = NULL;
    int rc = lock(l, err);
    if (rc)
        return rc;
    if ((rc = q_open(l, &r, err, sql, "")))
        goto out;
    int s;
    while ((s = row(l, r, err)) > 0) {
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char(*na)[48] = sw_realloc(*ids, nc * sizeof **ids);
            if (!na) {
                rc = oom(err);
                break;
            }
            *ids = na;
            cap = nc;
        }
        c_copy(r, 0, (*ids)[*n], 48);
        (*n)++;
    }
    if (!rc && s < 0)
        rc = s;
out:
    q_free(r);
    if (rc) {
        sw_free(*ids);
        *ids = NULL;
        *n = 0;
    }
    unlock(l);
    return rc;
}

/* ---- retention ------------------------------------------------------------- */

/* The requests whose rows may go: every attempt and tool step older than
 * the cut-off (?1), no idempotency key naming them (keys leave only when
 * their TTL passed: the key's replay may need the run's tool steps), and
 * not a job that is still queued or running (jobs run under their id).
 * Plain comparisons, no COALESCE: a NULL finish is never past the
 * cut-off either way, and a bare column can use its index (migration 2). */
#define LDG_SWEEPABLE(ID)                                                                        \
    ID " NOT IN (SELECT request_id FROM attempts WHERE finished > ?1)"                           \
    " AND " ID " NOT IN (SELECT request_id FROM tool_calls WHERE started > ?1"                    \
    " OR finished > ?1)"                                                                         \
    " AND " ID " NOT IN (SELECT request_id FROM idempotency)"                                    \
    " AND " ID " NOT IN (SELECT id FROM jobs WHERE state IN ('queued','running'))"

int ldg_retention_sweep(ldg_ledger *l, double now_s, double retention_s, ldg_sweep_counts *out,
                        sw_error *err)
{
    ldg_sweep_counts c = {0};
    double cut = now_s - retention_s;
    int rc = lock(l, err);
    if (rc)
        return rc;
    if ((rc = begin(l, err)))
        goto out;
    if ((rc = q_run(l, &c.keys, err, "DELETE FROM idempotency WHERE expires <= ?", "d", now_s)))
        goto rollback;
    /* SQLite: "+state", not by jobs_state, which would walk every
     * finished job, but by jobs_finished (PostgreSQL plans by itself) */
    if ((rc = q_run(l, &c.jobs, err,
                    is_sqlite(l) ? "DELETE FROM jobs WHERE +state IN ('succeeded','failed')"
                                   " AND finished IS NOT NULL AND finished <= ?1"
                                   " AND id NOT IN (SELECT request_id FROM idempotency)"
                                 : "DELETE FROM jobs WHERE state IN ('succeeded','failed')"
                                   " AND finished IS NOT NULL AND finished <= ?1"
                                   " AND id NOT IN (SELECT request_id FROM idempotency)",
                    "d", cut)))
        goto rollback;
    if ((rc = q_run(l, &c.attempts, err,
                    "DELETE FROM attempts WHERE finished <= ?1 AND " LDG_SWEEPABLE("request_id"),
                    "d", cut)))
        goto rollback;
    /* "started <= ?1" is implied by the rest, but lets it search
     * tool_calls_started */
    if ((rc = q_run(l, &c.tool_calls, err,
                    "DELETE FROM tool_calls WHERE started <= ?1 AND " LDG_SWEEPABLE("request_id"),
                    "d", cut)))
        goto rollback;
    /* a background response stays while its job may still finish it */
    if ((rc = q_run(l, &c.responses, err,
                    "DELETE FROM responses WHERE created <= ?1 AND (job_id IS NULL OR"
                    " job_id NOT IN (SELECT id FROM jobs WHERE state IN ('queued','running')))",
                    "d", cut)))
        goto rollback;
    if ((rc = commit(l, err)))
        goto rollback;
    if (out)
        *out = c;
    goto out;
rollback:
    rollback(l);
out:
    unlock(l);
    return rc;
}

/* ---- stored responses ------------------------------------------------------ */

void ldg_response_free(ldg_response *r)
{
    if (!r)
        return;
    sw_free(r->conversation);
    sw_free(r->response);
    r->conversation = r->response = NULL;
}

int ldg_response_put(ldg_ledger *l, const char *id, const char *conversation,
                     const char *response, const char *job_id, double now_s, sw_error *err)
{
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_run(l, NULL, err,
               "INSERT INTO responses (id, conversation, response, job_id, created)"
               " VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
               " conversation = excluded.conversation, response = excluded.response,"
               " job_id = excluded.job_id, created = excluded.created",
               "ssssd", id, conversation, response, job_id && job_id[0] ? job_id : NULL, now_s);
    unlock(l);
    return rc;
}

int ldg_response_get(ldg_ledger *l, const char *id, ldg_response *out, bool *found,
                     sw_error *err)
{
    memset(out, 0, sizeof *out);
    *found = false;
    ldg__result *r = NULL;
    int rc = lock(l, err);
    if (rc)
        return rc;
    rc = q_open(l, &r, err,
                "SELECT conversation, response, job_id, created FROM responses WHERE id = ?", "s",
                id);
    int s = rc ? 0 : row(l, r, err);
    if (s > 0) {
        *found = true;
        out->conversation = c_dup(r, 0);
        out->response = c_dup(r, 1);
        c_copy(r, 2, out->job_id, sizeof out->job_id);
        out->created = c_real(r, 3);
        if (!out->conversation || !out->response) {
            ldg_response_free(out);
            *found = false;
            rc = oom(err);
        }
    } else if (s < 0) {
        rc = s;
    }
    q_free(r);
    unlock(l);
    return rc;
}

int ldg_response_delete(ldg_ledger *l, const char *id, bool *found, sw_error *err)
{
    int changes = 0;
    int rc = lock(l, err);
    if (rc) {
        *found = false;
        return rc;
    }
    rc = q_run(l, &changes, err, "DELETE FROM responses WHERE id = ?", "s", id);
    unlock(l);
    *found = rc == SW_OK && changes > 0;
    return rc;
}
