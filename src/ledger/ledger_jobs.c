/* ledger_jobs.c - jobs (ledger.h), for both backends through
 * ledger-impl.h: inserting one (with its Idempotency-Key's answer),
 * claiming (a named one, or the oldest: FOR UPDATE SKIP LOCKED on
 * PostgreSQL), the fenced final record and give-up, and the pending list.
 */
#include "ledger/ledger-impl.h"

#include "common/alloc.h"

#include <stdio.h>
#include <string.h>

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
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__run(l, NULL, err, LDG_JOB_INSERT, "sssId", j->id, j->endpoint, j->request,
                  (int64_t)j->deadline_ms, j->created);
    ldg__unlock(l);
    return rc;
}

int ldg_job_insert_idem(ldg_ledger *l, const ldg_job *j, const char *idem_key, int status,
                        const char *content_type, const char *body, size_t body_len,
                        sw_error *err)
{
    if (!idem_key || !idem_key[0])
        return ldg_job_insert(l, j, err);
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    if ((rc = ldg__begin(l, err)))
        goto out;
    rc = ldg__run(l, NULL, err, LDG_JOB_INSERT, "sssId", j->id, j->endpoint, j->request,
                  (int64_t)j->deadline_ms, j->created);
    int changes = 0;
    if (!rc)
        rc = ldg__run(l, &changes, err,
                      "UPDATE idempotency SET state = 'done', status = ?, content_type = ?,"
                      " stream = 0, response = ? WHERE key = ? AND state = 'running' AND owner = ?",
                      "isbss", status, content_type, body, body_len, idem_key, l->owner);
    if (!rc)
        rc = ldg__idem_owned(changes, idem_key, err);
    if (!rc)
        rc = ldg__commit(l, err);
    if (rc)
        ldg__rollback(l);
out:
    ldg__unlock(l);
    return rc;
}

int ldg_job_get(ldg_ledger *l, const char *id, ldg_job *out, bool *found, sw_error *err)
{
    memset(out, 0, sizeof *out);
    *found = false;
    ldg__result *r = NULL;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    rc = ldg__query(l, &r, err,
                    "SELECT endpoint, request, deadline_ms, state, attempts, finish_writes,"
                    " response, error, created, started, finished FROM jobs WHERE id = ?",
                    "s", id);
    int s = rc ? 0 : ldg__row(l, r, err);
    if (s > 0) {
        *found = true;
        snprintf(out->id, sizeof out->id, "%s", id);
        ldg__copy(r, 0, out->endpoint, sizeof out->endpoint);
        out->request = ldg__dup(r, 1);
        out->deadline_ms = ldg__is_null(r, 2) ? -1 : ldg__int(r, 2);
        out->state = job_state_parse(ldg__text(r, 3));
        out->attempts = (int)ldg__int(r, 4);
        out->finish_writes = (int)ldg__int(r, 5);
        out->response = ldg__dup(r, 6);
        out->error = ldg__dup(r, 7);
        out->created = ldg__real(r, 8);
        out->started = ldg__real(r, 9);
        out->finished = ldg__real(r, 10);
        if (!out->request) {
            ldg_job_free(out);
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
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    if (id)
        rc = ldg__query(l, &r, err, sql, "dsds", now_s, l->owner, now_s + l->lease_s, id);
    else
        rc = ldg__query(l, &r, err, sql, "dsd", now_s, l->owner, now_s + l->lease_s);
    int s = rc ? 0 : ldg__row(l, r, err);
    if (s > 0) {
        *got = true;
        if (id_out)
            ldg__copy(r, 0, id_out, 48);
        *fence = ldg__int(r, 1);
        s = ldg__row(l, r, err);
    }
    if (s < 0) {
        rc = s;
        *got = false;
        if (id_out)
            id_out[0] = 0;
    }
    ldg__free(r);
    ldg__unlock(l);
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
    int rc = ldg__query(l, &r, err, "SELECT state FROM jobs WHERE id = ?", "s", id);
    int s = rc ? 0 : ldg__row(l, r, err);
    if (s > 0) {
        if (running)
            *running = job_state_parse(ldg__text(r, 0)) == LDG_JOB_RUNNING;
        rc = sw_error_set(err, SW_ECONFLICT,
                          "ledger: job %s is not running under this claim (taken over or "
                          "finished)", id);
    } else if (s == 0 && !rc) {
        rc = sw_error_set(err, SW_ENOTFOUND, "ledger: no job %s", id);
    } else if (s < 0) {
        rc = s;
    }
    ldg__free(r);
    return rc;
}

int ldg_job_finish(ldg_ledger *l, const char *id, int64_t fence, int state, const char *response,
                   const char *error, double now_s, sw_error *err)
{
    if (state != LDG_JOB_SUCCEEDED && state != LDG_JOB_FAILED)
        return sw_error_set(err, SW_EINVAL, "ledger: a job finishes as succeeded or failed");
    int changes = 0;
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    /* finish_writes counts every final write: a job completed twice would
     * show (the tests check it is 1) */
    rc = ldg__run(l, &changes, err,
                  "UPDATE jobs SET state = ?, response = ?, error = ?, finished = ?,"
                  " finish_writes = finish_writes + 1 WHERE id = ? AND state = 'running'"
                  " AND fence = ?",
                  "sssdsI", ldg_job_state_name(state), response, error, now_s, id, fence);
    if (!rc && changes != 1)
        rc = job_unfenced(l, id, NULL, err);
    ldg__unlock(l);
    return rc;
}

int ldg_job_requeue(ldg_ledger *l, const char *id, int64_t fence, bool *requeued, sw_error *err)
{
    int changes = 0;
    int rc = ldg__lock(l, err);
    if (requeued)
        *requeued = false;
    if (rc)
        return rc;
    /* only from running: a succeeded or failed job keeps its final record */
    rc = ldg__run(l, &changes, err,
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
    ldg__unlock(l);
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
    int rc = ldg__lock(l, err);
    if (rc)
        return rc;
    if ((rc = ldg__query(l, &r, err, sql, "")))
        goto out;
    int s;
    while ((s = ldg__row(l, r, err)) > 0) {
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char(*na)[48] = sw_realloc(*ids, nc * sizeof **ids);
            if (!na) {
                rc = ldg__oom(err);
                break;
            }
            *ids = na;
            cap = nc;
        }
        ldg__copy(r, 0, (*ids)[*n], 48);
        (*n)++;
    }
    if (!rc && s < 0)
        rc = s;
out:
    ldg__free(r);
    if (rc) {
        sw_free(*ids);
        *ids = NULL;
        *n = 0;
    }
    ldg__unlock(l);
    return rc;
}
