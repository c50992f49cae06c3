/* ledger.c - the ledger's functions (ledger.h), written once for both
 * backends (ledger_idem.c and ledger_jobs.c hold the keys, tool steps and
 * jobs): each one is a statement or one explicit transaction, run through
 * the backend (ledger-impl.h; ledger_sqlite.c, ledger_pg.c) under the
 * ledger's mutex. What the rows mean (leases, fences, the claims) is
 * decided here, so the two backends cannot drift apart; the SQL is the
 * dialect both speak, with the few differences picked by the backend's
 * fields. This file: the statement helpers, opening and the owner,
 * ldg_renew, attempts, retention and stored responses.
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
int ldg__lock(ldg_ledger *l, sw_error *err)
{
    pthread_mutex_lock(&l->mu);
    int rc = l->be->ready(l, err);
    if (rc)
        pthread_mutex_unlock(&l->mu);
    return rc;
}

void ldg__unlock(ldg_ledger *l)
{
    pthread_mutex_unlock(&l->mu);
}

/* Runs sql with its parameters (fmt: ledger-impl.h); the caller reads the
 * rows with ldg__row() and frees *r. */
int ldg__query(ldg_ledger *l, ldg__result **r, sw_error *err, const char *sql,
               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = l->be->query(l, sql, fmt, ap, r, err);
    va_end(ap);
    return rc;
}

/* 1 a row, 0 the end, < 0 an error */
int ldg__row(ldg_ledger *l, ldg__result *r, sw_error *err)
{
    return l->be->next(l, r, err);
}

void ldg__free(ldg__result *r)
{
    if (r)
        r->be->result_free(r);
}

/* Runs a statement whose rows (if any) nobody reads; *changes (may be
 * NULL): the rows it changed. */
int ldg__run(ldg_ledger *l, int *changes, sw_error *err, const char *sql, const char *fmt, ...)
{
    ldg__result *r = NULL;
    va_list ap;
    va_start(ap, fmt);
    int rc = l->be->query(l, sql, fmt, ap, &r, err);
    va_end(ap);
    if (rc)
        return rc;
    int s;
    while ((s = ldg__row(l, r, err)) > 0)
        ;
    rc = s < 0 ? s : SW_OK;
    if (!rc && changes)
        *changes = l->be->changes(l, r);
    ldg__free(r);
    return rc;
}

char *ldg__dup(ldg__result *r, int i)
{
    const char *t = ldg__text(r, i);
    return t ? sw_strdup(t) : NULL;
}

/* "" for NULL; false when the column is not NULL but memory ran out
 * making its text (dst is then ""). */
bool ldg__copy(ldg__result *r, int i, char *dst, size_t cap)
{
    const char *t = ldg__text(r, i);
    snprintf(dst, cap, "%s", t ? t : "");
    return t || ldg__is_null(r, i);
}

int ldg__oom(sw_error *err) { return sw_error_set(err, SW_ENOMEM, "ledger: out of memory"); }

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
        return ldg__oom(err);
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
    if (ldg__lock(l, NULL))
        return -1;
    int v = l->be->schema_version(l);
    ldg__unlock(l);
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

int ldg_renew(ldg_ledger *l, double now_s, sw_error *err)
{
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    double until = now_s + l->lease_s;
    if (!(rc = ldg__begin(l, err))) {
        rc = ldg__run(l, NULL, err,
                      "UPDATE idempotency SET lease_until = ? WHERE state = 'running'"
                      " AND owner = ?",
                      "ds", until, l->owner);
        if (!rc)
            rc = ldg__run(l, NULL, err,
                          "UPDATE jobs SET lease_until = ? WHERE state = 'running' AND owner = ?",
                          "ds", until, l->owner);
        if (!rc)
            rc = ldg__commit(l, err);
        if (rc)
            ldg__rollback(l);
    }
    ldg__unlock(l);
    return rc;
}

/* ---- attempts ------------------------------------------------------------ */

int ldg_attempt_add(ldg_ledger *l, const char *request_id, int attempt, const char *worker,
                    const char *outcome, const char *error, double started_s, double finished_s,
                    sw_error *err)
{
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    /* a record, not a promise: no sync of its own (ledger_sqlite.c) */
    if (l->be->relax)
        l->be->relax(l, true);
    rc = ldg__run(l, NULL, err,
                  "INSERT INTO attempts (request_id, attempt, worker, outcome, error, started,"
                  " finished) VALUES (?, ?, ?, ?, ?, ?, ?)",
                  "sisssdd", request_id, attempt, worker, outcome, error, started_s, finished_s);
    if (l->be->relax)
        l->be->relax(l, false);
    ldg__unlock(l);
    return rc;
}

int ldg_attempt_count(ldg_ledger *l, const char *request_id, int *n, sw_error *err)
{
    *n = 0;
    ldg__result *r = NULL;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    if (!(rc = ldg__query(l, &r, err, "SELECT count(*) FROM attempts WHERE request_id = ?", "s",
                          request_id))) {
        int s = ldg__row(l, r, err);
        if (s > 0)
            *n = (int)ldg__int(r, 0);
        else
            rc = s < 0 ? s : sw_error_set(err, SW_EIO, "ledger: attempt count: no row");
    }
    ldg__free(r);
    ldg__unlock(l);
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
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    if ((rc = ldg__begin(l, err)))
        goto out;
    if ((rc = ldg__run(l, &c.keys, err, "DELETE FROM idempotency WHERE expires <= ?", "d", now_s)))
        goto rollback;
    /* SQLite: "+state", not by jobs_state, which would walk every
     * finished job, but by jobs_finished (PostgreSQL plans by itself) */
    if ((rc = ldg__run(l, &c.jobs, err,
                       ldg__is_sqlite(l) ? "DELETE FROM jobs WHERE +state IN ('succeeded','failed')"
                                   " AND finished IS NOT NULL AND finished <= ?1"
                                   " AND id NOT IN (SELECT request_id FROM idempotency)"
                                 : "DELETE FROM jobs WHERE state IN ('succeeded','failed')"
                                   " AND finished IS NOT NULL AND finished <= ?1"
                                   " AND id NOT IN (SELECT request_id FROM idempotency)",
                       "d", cut)))
        goto rollback;
    if ((rc = ldg__run(l, &c.attempts, err,
                       "DELETE FROM attempts WHERE finished <= ?1 AND " LDG_SWEEPABLE("request_id"),
                       "d", cut)))
        goto rollback;
    /* "started <= ?1" is implied by the rest, but lets it search
     * tool_calls_started */
    if ((rc = ldg__run(l, &c.tool_calls, err,
                       "DELETE FROM tool_calls WHERE started <= ?1 AND "
                       LDG_SWEEPABLE("request_id"),
                       "d", cut)))
        goto rollback;
    /* a background response stays while its job may still finish it */
    if ((rc = ldg__run(l, &c.responses, err,
                       "DELETE FROM responses WHERE created <= ?1 AND (job_id IS NULL OR"
                       " job_id NOT IN (SELECT id FROM jobs WHERE state IN ('queued','running')))",
                       "d", cut)))
        goto rollback;
    if ((rc = ldg__commit(l, err)))
        goto rollback;
    if (out)
        *out = c;
    goto out;
rollback:
    ldg__rollback(l);
out:
    ldg__unlock(l);
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
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__run(l, NULL, err,
                  "INSERT INTO responses (id, conversation, response, job_id, created)"
                  " VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                  " conversation = excluded.conversation, response = excluded.response,"
                  " job_id = excluded.job_id, created = excluded.created",
                  "ssssd", id, conversation, response, job_id && job_id[0] ? job_id : NULL, now_s);
    ldg__unlock(l);
    return rc;
}

int ldg_response_get(ldg_ledger *l, const char *id, ldg_response *out, bool *found,
                     sw_error *err)
{
    memset(out, 0, sizeof *out);
    *found = false;
    ldg__result *r = NULL;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__query(l, &r, err,
                    "SELECT conversation, response, job_id, created FROM responses"
                    " WHERE id = ?",
                    "s", id);
    int s = rc ? 0 : ldg__row(l, r, err);
    if (s > 0) {
        *found = true;
        out->conversation = ldg__dup(r, 0);
        out->response = ldg__dup(r, 1);
        ldg__copy(r, 2, out->job_id, sizeof out->job_id);
        out->created = ldg__real(r, 3);
        if (!out->conversation || !out->response) {
            ldg_response_free(out);
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

int ldg_response_delete(ldg_ledger *l, const char *id, bool *found, sw_error *err)
{
    int changes = 0;
    int rc = ldg__lock(l, err);
    if (rc) {
        *found = false;
        return rc;
    }
    rc = ldg__run(l, &changes, err, "DELETE FROM responses WHERE id = ?", "s", id);
    ldg__unlock(l);
    *found = rc == SW_OK && changes > 0;
    return rc;
}
