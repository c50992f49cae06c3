/* ledger.h - the router's durable state (DESIGN.md, "Durable state: the
 * ledger"; docs/internals/ledger.md): idempotency keys with their stored
 * responses, attempts, tool calls (started / done) and jobs. Two backends
 * behind this one interface: SQLite in WAL mode, <state_dir>/ledger.db
 * (the default: one router per state directory), or a PostgreSQL database
 * that several routers share.
 *
 * Every write here is one transaction committed (and, on SQLite with
 * synchronous=FULL, synced) before the function returns, so a caller may
 * make a promise (send a 202, call a tool) right after it. The schema is
 * created and migrated by ldg_open. One connection guarded by a mutex: the
 * router is thread-per-connection, and every statement here is short.
 *
 * Several routers: running idempotency keys and running jobs carry an
 * owner (the router that runs them), a lease (lease_until, extended by
 * ldg_renew) and a fence (+1 each time the row is claimed). A row whose
 * lease expired belongs to a router that died: another router takes it
 * over. A write by the old owner then fails with SW_ECONFLICT and writes
 * nothing. A router never takes over its own rows (it is alive: the
 * request or job is still running in it), so a single router that never
 * renews behaves as one without leases.
 */
#ifndef SPILLWAY_LEDGER_LEDGER_H
#define SPILLWAY_LEDGER_LEDGER_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ldg_ledger ldg_ledger;

/* The schema version ldg_open migrates to (both backends). */
#define LDG_SCHEMA_VERSION 4

/* Makes SQLite allocate through spillway's hook (common/alloc.h), so an
 * injected failure reaches the ledger too (SQLITE_CONFIG_MALLOC). Once per
 * process, before any other SQLite call: SQLite takes a configuration only
 * before it initializes. SW_OK, or SW_EINTERNAL when SQLite was already
 * initialized (it then keeps its own allocator). */
int ldg_alloc_hook(void);

/* where: a directory (SQLite, <where>/ledger.db, created) or a
 * postgresql:// or postgres:// URL (libpq; the password comes from
 * PGPASSWORD or ~/.pgpass: a URL that carries one is refused with
 * SW_EINVAL). Opens and migrates. SW_EIO with the database's message on
 * failure, SW_EUNAVAILABLE when PostgreSQL cannot be reached,
 * SW_EUNSUPPORTED for a database from a newer program. */
int ldg_open(const char *where, ldg_ledger **out, sw_error *err);
void ldg_close(ldg_ledger *l);
/* The schema version of the open database (tests); -1 when unreadable. */
int ldg_schema_version(ldg_ledger *l);
/* "sqlite" or "postgresql". */
const char *ldg_backend(const ldg_ledger *l);
/* true for PostgreSQL: other routers write the same ledger. */
bool ldg_shared(const ldg_ledger *l);

/* ---- leases ----------------------------------------------------------------- */
#define LDG_OWNER_MAX 63

/* Who this process is, for leases. ldg_open picks a default owner
 * "<hostname>:<pid>:<8 random hex>" and lease_s 10. The owner must name
 * this process alone (no other router, no earlier run of this one: the
 * default does); at most LDG_OWNER_MAX bytes (longer is cut). lease_s > 0. */
void ldg_set_owner(ldg_ledger *l, const char *owner, double lease_s);
const char *ldg_owner(const ldg_ledger *l);
double ldg_lease_s(const ldg_ledger *l);
/* Extends to now_s + lease_s every lease this owner holds (its running
 * idempotency keys and its running jobs), in one transaction. The router
 * calls it every lease_s / 3. */
int ldg_renew(ldg_ledger *l, double now_s, sw_error *err);

/* ---- SHA-256 (FIPS 180-4) ----------------------------------------------- */
void ldg_sha256(const void *data, size_t len, uint8_t out[32]);
/* Lower-case hex, NUL-terminated. */
void ldg_sha256_hex(const void *data, size_t len, char out[65]);

/* ---- idempotency keys ------------------------------------------------------ */
typedef enum ldg_idem_state {
    LDG_IDEM_NEW,      /* recorded as running: go ahead, then finish or drop */
    LDG_IDEM_REPLAY,   /* done: *stored holds the response */
    LDG_IDEM_RUNNING,  /* the first request with this key is still running */
    LDG_IDEM_MISMATCH, /* the key was used with another body */
} ldg_idem_state;

typedef struct ldg_stored {
    int status;
    char content_type[64];
    bool stream;         /* body is the SSE text ("data: ...\n\n" events) */
    char request_id[80]; /* of the original request */
    char *body;          /* sw_free (ldg_stored_free) */
    size_t body_len;
} ldg_stored;

void ldg_stored_free(ldg_stored *s);

/* Looks the key up and, when it is unknown, expired or abandoned (left
 * running by a router that died: marked so at start-up, or running under
 * another owner whose lease expired), records it as running for
 * request_id under this owner, with a lease of lease_s. The claim is
 * atomic across connections and routers: one LDG_IDEM_NEW per key. A
 * taken-over key keeps its original request id, returned in
 * request_id_out (so an agent run finds its recorded tool steps), and its
 * fence goes up by one; for a new key request_id_out receives request_id.
 * Expired keys are replaced. A running key with a live lease, or one this
 * owner runs, gives LDG_IDEM_RUNNING. stored is filled for LDG_IDEM_REPLAY
 * only. */
int ldg_idem_begin(ldg_ledger *l, const char *key, const char *body_sha256, const char *request_id,
                   double now_s, double ttl_s, ldg_idem_state *state, char request_id_out[80],
                   ldg_stored *stored, sw_error *err);
/* Stores the final response of a running key (state done). This function,
 * ldg_idem_drop and ldg_idem_abandon write only a key that is running
 * under this owner: SW_ECONFLICT otherwise (another router took it over,
 * or it is not running), and nothing is written. */
int ldg_idem_finish(ldg_ledger *l, const char *key, int status, const char *content_type,
                    bool stream, const char *body, size_t body_len, double now_s, sw_error *err);
/* Forgets a running key (the request produced nothing worth replaying: a
 * retry may run it again). */
int ldg_idem_drop(ldg_ledger *l, const char *key, sw_error *err);
/* Marks one running key abandoned, as ldg_idem_recover does at start-up:
 * for a request that ran but whose response could not be stored, so a
 * retry with the same body runs it again under its request id instead
 * of being told 409 until the key expires. */
int ldg_idem_abandon(ldg_ledger *l, const char *key, sw_error *err);
/* At start-up. SQLite (one router per state directory): every running
 * key belongs to the router that is gone, and is marked abandoned; every
 * running job's lease is released (the next ldg_job_start takes it).
 * *n receives how many keys (may be NULL). PostgreSQL: nothing (*n = 0):
 * other routers may be running them, and expired leases do it. */
int ldg_idem_recover(ldg_ledger *l, int *n, sw_error *err);
/* Deletes keys expired at now_s. */
int ldg_idem_expire(ldg_ledger *l, double now_s, int *n, sw_error *err);

/* ---- attempts ------------------------------------------------------------- */
int ldg_attempt_add(ldg_ledger *l, const char *request_id, int attempt, const char *worker,
                    const char *outcome, const char *error, double started_s, double finished_s,
                    sw_error *err);
int ldg_attempt_count(ldg_ledger *l, const char *request_id, int *n, sw_error *err);

/* ---- tool calls --------------------------------------------------------- */
typedef enum { LDG_TOOL_STARTED = 0, LDG_TOOL_DONE = 1 } ldg_tool_state;

typedef struct ldg_tool_step {
    int step;
    int state;           /* ldg_tool_state */
    char tool[64];
    char call_id[64];
    char *arguments;     /* JSON text (sw_free) */
    char *result;        /* when done (sw_free) */
    int calls;           /* times it was started (1 + re-calls) */
    double started, finished;
} ldg_tool_step;

void ldg_tool_step_free(ldg_tool_step *s);
/* Records step as started (a second start of the same step, an idempotent
 * re-call, counts in calls and keeps the first arguments). *first is true
 * when this call created the step's row: it claimed the step, atomically
 * across connections (an insert that conflicts); false for a re-call or a
 * step already done (which is left as it is). */
int ldg_tool_started(ldg_ledger *l, const char *request_id, int step, const char *tool,
                     const char *call_id, const char *arguments, double now_s, bool *first,
                     sw_error *err);
int ldg_tool_done(ldg_ledger *l, const char *request_id, int step, const char *result,
                  double now_s, sw_error *err);
/* *found false when the step was never started. */
int ldg_tool_get(ldg_ledger *l, const char *request_id, int step, ldg_tool_step *out,
                 bool *found, sw_error *err);

/* ---- jobs ----------------------------------------------------------------- */
typedef enum {
    LDG_JOB_QUEUED = 0,
    LDG_JOB_RUNNING = 1,
    LDG_JOB_SUCCEEDED = 2,
    LDG_JOB_FAILED = 3,
} ldg_job_state;

const char *ldg_job_state_name(int state);

typedef struct ldg_job {
    char id[48];
    char endpoint[16];   /* "chat" or "completions" */
    char *request;       /* JSON text (sw_free) */
    int64_t deadline_ms; /* after created; -1 none */
    int state;
    int attempts;        /* times a runner started it */
    int finish_writes;   /* times its final record was written */
    char *response;      /* JSON text when succeeded (sw_free) */
    char *error;         /* JSON text when failed (sw_free) */
    double created, started, finished; /* Unix seconds; 0 = not yet */
} ldg_job;

void ldg_job_free(ldg_job *j);
/* Inserts a queued job (id, endpoint, request, deadline_ms, created). */
int ldg_job_insert(ldg_ledger *l, const ldg_job *j, sw_error *err);
/* ldg_job_insert and, in the same transaction, ldg_idem_finish of a
 * running Idempotency-Key with the answer that promises the job (its
 * 202): a retry with the key finds the job answer as soon as the job
 * exists, and never a job without it (a crash between the two would
 * leave the key abandoned and let a retry make a second job). idem_key
 * NULL or "": ldg_job_insert. */
int ldg_job_insert_idem(ldg_ledger *l, const ldg_job *j, const char *idem_key, int status,
                        const char *content_type, const char *body, size_t body_len,
                        sw_error *err);
int ldg_job_get(ldg_ledger *l, const char *id, ldg_job *out, bool *found, sw_error *err);
/* Queued, or running under another owner with an expired lease ->
 * running under this owner: attempts + 1, started = now, lease_until =
 * now + lease_s, fence + 1 (returned in *fence: pass it to the job's
 * finish or requeue). *claimed is false otherwise (finished, unknown, or
 * running under a live lease or under this owner). */
int ldg_job_start(ldg_ledger *l, const char *id, double now_s, bool *claimed, int64_t *fence,
                  sw_error *err);
/* The same for the oldest such job, whichever it is (PostgreSQL: FOR
 * UPDATE SKIP LOCKED: routers claiming at once get different jobs). *got
 * false when there is none; id_out is then "". */
int ldg_job_claim(ldg_ledger *l, double now_s, char id_out[48], int64_t *fence, bool *got,
                  sw_error *err);
/* The final record: state succeeded (response) or failed (error). Only
 * while the job is running with this fence: SW_ECONFLICT otherwise (taken
 * over, or finished already), SW_ENOTFOUND for an unknown id; nothing is
 * written then. */
int ldg_job_finish(ldg_ledger *l, const char *id, int64_t fence, int state, const char *response,
                   const char *error, double now_s, sw_error *err);
/* running -> queued: the runner gave the job up unfinished (the router
 * is shutting down and cancelled its worker request). Its attempt stays
 * counted; the next start takes it up again. Only while the job is
 * running with this fence: running under another fence gives SW_ECONFLICT;
 * a job that is not running (its final record was written meanwhile) is
 * left as it is. *requeued (may be NULL) says whether this call changed
 * it. */
int ldg_job_requeue(ldg_ledger *l, const char *id, int64_t fence, bool *requeued, sw_error *err);
/* Ids of queued and running jobs, oldest first (sw_free the array). For
 * SQLite's start-up, where every running job is this router's; on a shared
 * ledger it lists other routers' running jobs too: ldg_job_claim there. */
int ldg_job_pending(ldg_ledger *l, char (**ids)[48], size_t *n, sw_error *err);

/* ---- stored responses (POST /v1/responses, store) -------------------------- */
/* A Response the router stored: its conversation (JSON text: the input
 * items of every turn up to it, its own included) and the Response object
 * (JSON text), or for a background response the job that makes it. */
typedef struct ldg_response {
    char *conversation;  /* sw_free (ldg_response_free) */
    char *response;      /* sw_free */
    char job_id[48];     /* "" none */
    double created;      /* Unix seconds */
} ldg_response;

void ldg_response_free(ldg_response *r);
/* Stores (or replaces) the response id; job_id NULL or "" none. */
int ldg_response_put(ldg_ledger *l, const char *id, const char *conversation,
                     const char *response, const char *job_id, double now_s, sw_error *err);
int ldg_response_get(ldg_ledger *l, const char *id, ldg_response *out, bool *found,
                     sw_error *err);
/* *found: whether there was one to delete. */
int ldg_response_delete(ldg_ledger *l, const char *id, bool *found, sw_error *err);

/* ---- retention ------------------------------------------------------------ */
typedef struct ldg_sweep_counts {
    int jobs, attempts, tool_calls, keys, responses; /* rows deleted */
} ldg_sweep_counts;

/* Deletes what is finished and older than retention_s at now_s, in one
 * transaction: succeeded / failed jobs finished before the cut-off, and
 * the attempts and tool steps of a request whose every row is older than
 * the cut-off, when no idempotency key names the request (a key is only
 * gone once its TTL passed) and it is no queued or running job. Expired
 * idempotency keys go too (as ldg_idem_expire). Queued and running jobs
 * and keys within their TTL are never touched. out may be NULL. */
/* Stored responses (POST /v1/responses) made before the cut-off go too,
 * but not a background one whose job is queued or running. */
int ldg_retention_sweep(ldg_ledger *l, double now_s, double retention_s, ldg_sweep_counts *out,
                        sw_error *err);

#endif
