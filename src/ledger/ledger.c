/* ledger.c - the SQLite side of the ledger (ledger.h explains what it
 * holds and why every write is committed before the caller goes on).
 *
 * Durability: WAL mode with synchronous=FULL, so each commit is synced to
 * the WAL before sqlite3_step returns; NORMAL would be faster but could
 * lose the last commits on a power cut, and the router promises things
 * (a 202, a tool call) right after a commit. A process crash (SIGKILL)
 * loses nothing in either mode. The one exception is the attempts table:
 * a record of what happened, written after every relayed request and
 * promising nothing, so it commits with synchronous=NORMAL (no sync of its
 * own; the next FULL commit syncs it along). A sync per request was most
 * of the router's own cost per request. Each function is one statement or
 * one explicit transaction under the ledger's mutex.
 */
#include "ledger/ledger.h"

#include "common/alloc.h"

#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

struct ldg_ledger {
    sqlite3 *db;
    pthread_mutex_t mu;
    char owner[LDG_OWNER_MAX + 1];
    double lease_s;
    /* ldg_attempt_add could not put synchronous back to FULL (out of
     * memory): the next caller does, before its write (ledger_lock) */
    bool sync_normal;
};

/* Takes the ledger's mutex, and first restores synchronous=FULL if an
 * attempt record left it NORMAL: every write after it makes a promise. If
 * that fails too, the write still goes ahead (it is synced with the next
 * FULL commit) and the next caller tries again. */
static void ledger_lock(ldg_ledger *l)
{
    pthread_mutex_lock(&l->mu);
    if (l->sync_normal &&
        sqlite3_exec(l->db, "PRAGMA synchronous=FULL", NULL, NULL, NULL) == SQLITE_OK)
        l->sync_normal = false;
}

/* Migrations: entry i takes the schema from version i to i + 1. Never
 * edit one that shipped; append. */
static const char *const k_migrations[LDG_SCHEMA_VERSION] = {
    "CREATE TABLE idempotency ("
    "  key TEXT PRIMARY KEY,"
    "  body_sha256 TEXT NOT NULL,"
    "  request_id TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('running','done','abandoned')),"
    "  status INTEGER,"
    "  content_type TEXT,"
    "  response BLOB,"
    "  stream INTEGER NOT NULL DEFAULT 0,"
    "  created REAL NOT NULL,"
    "  expires REAL NOT NULL);"
    "CREATE TABLE attempts ("
    "  request_id TEXT NOT NULL,"
    "  attempt INTEGER NOT NULL,"
    "  worker TEXT NOT NULL,"
    "  outcome TEXT NOT NULL,"
    "  error TEXT,"
    "  started REAL NOT NULL,"
    "  finished REAL NOT NULL);"
    "CREATE INDEX attempts_request ON attempts(request_id);"
    "CREATE TABLE tool_calls ("
    "  request_id TEXT NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  tool TEXT NOT NULL,"
    "  call_id TEXT NOT NULL,"
    "  arguments TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('started','done')),"
    "  result TEXT,"
    "  calls INTEGER NOT NULL DEFAULT 1,"
    "  started REAL NOT NULL,"
    "  finished REAL,"
    "  PRIMARY KEY (request_id, step));"
    "CREATE TABLE jobs ("
    "  id TEXT PRIMARY KEY,"
    "  endpoint TEXT NOT NULL,"
    "  request TEXT NOT NULL,"
    "  deadline_ms INTEGER,"
    "  state TEXT NOT NULL CHECK (state IN ('queued','running','succeeded','failed')),"
    "  attempts INTEGER NOT NULL DEFAULT 0,"
    "  finish_writes INTEGER NOT NULL DEFAULT 0,"
    "  response TEXT,"
    "  error TEXT,"
    "  created REAL NOT NULL,"
    "  started REAL,"
    "  finished REAL);"
    "CREATE INDEX jobs_state ON jobs(state, created);",
    /* 1 -> 2: the retention sweep filters every table by a time (a
     * finish, a start, an expiry) and looks request ids up in the
     * idempotency table; without these it scanned each table whole,
     * under the ledger's one lock. */
    "CREATE INDEX jobs_finished ON jobs(finished);"
    "CREATE INDEX attempts_finished ON attempts(finished, request_id);"
    "CREATE INDEX tool_calls_started ON tool_calls(started);"
    "CREATE INDEX tool_calls_finished ON tool_calls(finished);"
    "CREATE INDEX idempotency_expires ON idempotency(expires);"
    "CREATE INDEX idempotency_request ON idempotency(request_id);",
    /* 2 -> 3: stored responses (POST /v1/responses with store), which a
     * later request continues by previous_response_id */
    "CREATE TABLE responses ("
    "  id TEXT PRIMARY KEY,"
    "  conversation TEXT NOT NULL,"
    "  response TEXT NOT NULL,"
    "  job_id TEXT,"
    "  created REAL NOT NULL);"
    "CREATE INDEX responses_created ON responses(created);",
    /* 3 -> 4: leases and fences, for several routers on one ledger
     * (running keys and jobs: who runs them, until when, and a counter
     * of claims that a late write of a previous owner does not match);
     * the partial index serves ldg_renew without a cost for done keys */
    "ALTER TABLE idempotency ADD COLUMN owner TEXT;"
    "ALTER TABLE idempotency ADD COLUMN lease_until REAL NOT NULL DEFAULT 0;"
    "ALTER TABLE idempotency ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN owner TEXT;"
    "ALTER TABLE jobs ADD COLUMN lease_until REAL NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;"
    "CREATE INDEX idempotency_running ON idempotency(owner) WHERE state = 'running';",
};

/* ---- SQLite's allocator ---------------------------------------------------
 * SQLite asks an allocation's size back (xSize), which sw_malloc does not
 * keep: each block carries it in a header of LDG_MEM_HEADER bytes, a
 * multiple of 16 so that the memory SQLite gets keeps malloc's alignment
 * (SQLite needs 8). */
#define LDG_MEM_HEADER 16

static void *mem_malloc(int n)
{
    if (n <= 0)
        return NULL;
    unsigned char *p = sw_malloc((size_t)n + LDG_MEM_HEADER);
    if (!p)
        return NULL;
    memcpy(p, &(size_t){(size_t)n}, sizeof(size_t));
    return p + LDG_MEM_HEADER;
}

static void mem_free(void *p)
{
    if (p)
        sw_free((unsigned char *)p - LDG_MEM_HEADER);
}

static int mem_size(void *p)
{
    size_t n = 0;
    if (p)
        memcpy(&n, (unsigned char *)p - LDG_MEM_HEADER, sizeof n);
    return (int)n;
}

/* SQLite never calls it with p NULL nor n <= 0 (sqlite3Realloc handles
 * those itself). On failure the old block stays valid, as with realloc. */
static void *mem_realloc(void *p, int n)
{
    if (n <= 0)
        return NULL;
    unsigned char *base = p ? (unsigned char *)p - LDG_MEM_HEADER : NULL;
    unsigned char *q = sw_realloc(base, (size_t)n + LDG_MEM_HEADER);
    if (!q)
        return NULL;
    memcpy(q, &(size_t){(size_t)n}, sizeof(size_t));
    return q + LDG_MEM_HEADER;
}

static int mem_roundup(int n)
{
    return n > INT_MAX - 7 ? n : (n + 7) & ~7;
}

static int mem_init(void *app) { (void)app; return SQLITE_OK; }
static void mem_shutdown(void *app) { (void)app; }

int ldg_alloc_hook(void)
{
    static const sqlite3_mem_methods methods = {
        mem_malloc, mem_free, mem_realloc, mem_size, mem_roundup, mem_init, mem_shutdown, NULL,
    };
    return sqlite3_config(SQLITE_CONFIG_MALLOC, &methods) == SQLITE_OK ? SW_OK : SW_EINTERNAL;
}

static int db_fail(ldg_ledger *l, sw_error *err, const char *what)
{
    return sw_error_set(err, SW_EIO, "ledger: %s: %s", what, sqlite3_errmsg(l->db));
}

static int exec_sql(ldg_ledger *l, const char *sql, sw_error *err)
{
    char *msg = NULL;
    if (sqlite3_exec(l->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        sw_error_set(err, SW_EIO, "ledger: %s", msg ? msg : sqlite3_errmsg(l->db));
        sqlite3_free(msg);
        return SW_EIO;
    }
    return SW_OK;
}

static int user_version(ldg_ledger *l)
{
    sqlite3_stmt *st = NULL;
    int v = -1;
    if (sqlite3_prepare_v2(l->db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

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
const char *ldg_backend(const ldg_ledger *l) { (void)l; return "sqlite"; }
bool ldg_shared(const ldg_ledger *l) { (void)l; return false; }

int ldg_open(const char *dir, ldg_ledger **out, sw_error *err)
{
    *out = NULL;
    char path[1024];
    if (snprintf(path, sizeof path, "%s/ledger.db", dir) >= (int)sizeof path)
        return sw_error_set(err, SW_EINVAL, "ledger: state directory path too long");
    ldg_ledger *l = sw_calloc(1, sizeof *l);
    if (!l)
        return sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
    pthread_mutex_init(&l->mu, NULL);
    default_owner(l->owner);
    l->lease_s = 10;
    int rc = SW_EIO;
    if (sqlite3_open_v2(path, &l->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL) !=
        SQLITE_OK) {
        sw_error_set(err, SW_EIO, "ledger: cannot open %s: %s", path,
                     l->db ? sqlite3_errmsg(l->db) : "out of memory");
        goto fail;
    }
    /* Another process (a test, sqlite3 on the command line) may hold the
     * database for a moment: wait for it rather than fail. */
    sqlite3_busy_timeout(l->db, 5000);
    if (exec_sql(l, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;",
                 err))
        goto fail;
    int v = user_version(l);
    if (v < 0) {
        db_fail(l, err, "reading the schema version");
        goto fail;
    }
    if (v > LDG_SCHEMA_VERSION) {
        rc = sw_error_set(err, SW_EUNSUPPORTED,
                          "ledger: %s has schema version %d, this program knows up to %d", path, v,
                          LDG_SCHEMA_VERSION);
        goto fail;
    }
    for (; v < LDG_SCHEMA_VERSION; v++) {
        /* each step and its version bump in one transaction */
        char bump[64];
        snprintf(bump, sizeof bump, "PRAGMA user_version=%d;", v + 1);
        if (exec_sql(l, "BEGIN IMMEDIATE;", err))
            goto fail;
        if (exec_sql(l, k_migrations[v], err) || exec_sql(l, bump, err)) {
            exec_sql(l, "ROLLBACK;", NULL);
            goto fail;
        }
        if (exec_sql(l, "COMMIT;", err))
            goto fail;
    }
    *out = l;
    return SW_OK;
fail:
    sqlite3_close(l->db);
    pthread_mutex_destroy(&l->mu);
    sw_free(l);
    return rc;
}

void ldg_close(ldg_ledger *l)
{
    if (!l)
        return;
    sqlite3_close(l->db);
    pthread_mutex_destroy(&l->mu);
    sw_free(l);
}

int ldg_schema_version(ldg_ledger *l)
{
    ledger_lock(l);
    int v = user_version(l);
    pthread_mutex_unlock(&l->mu);
    return v;
}

/* ---- statement helpers ------------------------------------------------- */

/* Binds the arguments described by fmt: s text (NULL binds NULL), b blob
 * (pointer, size_t), i int, I int64, d double. */
static int bind_all(sqlite3_stmt *st, const char *fmt, va_list ap)
{
    int idx = 1, rc = SQLITE_OK;
    for (const char *f = fmt; *f && rc == SQLITE_OK; f++, idx++) {
        switch (*f) {
        case 's': {
            const char *s = va_arg(ap, const char *);
            rc = s ? sqlite3_bind_text(st, idx, s, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(st, idx);
            break;
        }
        case 'b': {
            const void *p = va_arg(ap, const void *);
            size_t n = va_arg(ap, size_t);
            rc = sqlite3_bind_blob64(st, idx, p ? p : "", (sqlite3_uint64)n, SQLITE_TRANSIENT);
            break;
        }
        case 'i': rc = sqlite3_bind_int(st, idx, va_arg(ap, int)); break;
        case 'I': rc = sqlite3_bind_int64(st, idx, va_arg(ap, int64_t)); break;
        case 'd': rc = sqlite3_bind_double(st, idx, va_arg(ap, double)); break;
        default: rc = SQLITE_MISUSE; break;
        }
    }
    return rc;
}

/* Prepares sql and binds; the caller steps and finalizes. NULL on error
 * (err set). */
static sqlite3_stmt *prep(ldg_ledger *l, sw_error *err, const char *sql, const char *fmt, ...)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(l->db, sql, -1, &st, NULL) != SQLITE_OK) {
        db_fail(l, err, "prepare");
        return NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    int rc = bind_all(st, fmt, ap);
    va_end(ap);
    if (rc != SQLITE_OK) {
        db_fail(l, err, "bind");
        sqlite3_finalize(st);
        return NULL;
    }
    return st;
}

/* Runs a statement that returns no rows; *changes (may be NULL). */
static int run_stmt(ldg_ledger *l, sqlite3_stmt *st, int *changes, sw_error *err)
{
    if (!st)
        return SW_EIO;
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return db_fail(l, err, "write");
    if (changes)
        *changes = sqlite3_changes(l->db);
    return SW_OK;
}

static char *col_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? sw_strdup((const char *)t) : NULL;
}

/* "" for NULL; false when the column is not NULL but SQLite ran out of
 * memory making its text (dst is then ""). */
static bool col_copy(sqlite3_stmt *st, int i, char *dst, size_t cap)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    snprintf(dst, cap, "%s", t ? (const char *)t : "");
    return t || sqlite3_column_type(st, i) == SQLITE_NULL;
}

/* ---- leases ------------------------------------------------------------- */

/* Whether the row's lease (owner in column oc, lease_until in lc) is
 * expired for this owner: past now_s, and held by another owner (a router
 * never takes over its own rows: it is alive). */
static bool lease_expired(ldg_ledger *l, sqlite3_stmt *st, int oc, int lc, double now_s)
{
    const unsigned char *owner = sqlite3_column_text(st, oc);
    if (owner && !strcmp((const char *)owner, l->owner))
        return false;
    return sqlite3_column_double(st, lc) <= now_s;
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

int ldg_renew(ldg_ledger *l, double now_s, sw_error *err)
{
    ledger_lock(l);
    double until = now_s + l->lease_s;
    int rc = exec_sql(l, "BEGIN IMMEDIATE;", err);
    if (!rc)
        rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE idempotency SET lease_until = ? WHERE state = 'running'"
                           " AND owner = ?",
                           "ds", until, l->owner),
                      NULL, err);
    if (!rc)
        rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE jobs SET lease_until = ? WHERE state = 'running' AND owner = ?",
                           "ds", until, l->owner),
                      NULL, err);
    if (!rc)
        rc = exec_sql(l, "COMMIT;", err);
    if (rc)
        exec_sql(l, "ROLLBACK;", NULL);
    pthread_mutex_unlock(&l->mu);
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

int ldg_idem_begin(ldg_ledger *l, const char *key, const char *body_sha256, const char *request_id,
                   double now_s, double ttl_s, ldg_idem_state *state, char request_id_out[80],
                   ldg_stored *stored, sw_error *err)
{
    int rc = SW_OK;
    memset(stored, 0, sizeof *stored);
    snprintf(request_id_out, 80, "%s", request_id);
    ledger_lock(l);
    /* IMMEDIATE: the look-up and the insert are one decision; a second
     * request with the same key waits for it and then sees "running". */
    if ((rc = exec_sql(l, "BEGIN IMMEDIATE;", err)))
        goto out;
    sqlite3_stmt *st = prep(l, err,
                            "SELECT body_sha256, request_id, state, status, content_type, response,"
                            " stream, expires, owner, lease_until FROM idempotency WHERE key = ?",
                            "s", key);
    if (!st) {
        rc = SW_EIO;
        goto rollback;
    }
    int step = sqlite3_step(st);
    bool insert = true, take_over = false;
    if (step == SQLITE_ROW && sqlite3_column_double(st, 7) > now_s) {
        const char *sha = (const char *)sqlite3_column_text(st, 0);
        const char *rstate = (const char *)sqlite3_column_text(st, 2);
        insert = false;
        if (!sha || !rstate) {
            /* both columns are NOT NULL: SQLite ran out of memory
             * converting them, which is neither a mismatch nor a run */
            sqlite3_finalize(st);
            rc = sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
            goto rollback;
        }
        if (strcmp(sha, body_sha256)) {
            *state = LDG_IDEM_MISMATCH;
        } else if (!strcmp(rstate, "running") && !lease_expired(l, st, 8, 9, now_s)) {
            *state = LDG_IDEM_RUNNING;
        } else if (strcmp(rstate, "done")) {
            /* abandoned, or running under a dead router's lease */
            take_over = true;
            if (!col_copy(st, 1, request_id_out, 80)) {
                sqlite3_finalize(st);
                rc = sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
                goto rollback;
            }
        } else {
            *state = LDG_IDEM_REPLAY;
            stored->status = sqlite3_column_int(st, 3);
            bool texts = col_copy(st, 4, stored->content_type, sizeof stored->content_type) &&
                         col_copy(st, 1, stored->request_id, sizeof stored->request_id);
            stored->stream = sqlite3_column_int(st, 6) != 0;
            int n = sqlite3_column_bytes(st, 5);
            const void *p = sqlite3_column_blob(st, 5);
            stored->body = texts && (p || n == 0) ? sw_malloc((size_t)n + 1) : NULL;
            if (!stored->body) {
                sqlite3_finalize(st);
                rc = sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
                goto rollback;
            }
            if (n)
                memcpy(stored->body, p, (size_t)n);
            stored->body[n] = 0;
            stored->body_len = (size_t)n;
        }
    } else if (step != SQLITE_ROW && step != SQLITE_DONE) {
        sqlite3_finalize(st);
        rc = db_fail(l, err, "idempotency look-up");
        goto rollback;
    }
    sqlite3_finalize(st);
    if (take_over) {
        rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE idempotency SET state = 'running', owner = ?, lease_until = ?,"
                           " fence = fence + 1 WHERE key = ?",
                           "sds", l->owner, now_s + l->lease_s, key),
                      NULL, err);
        if (rc)
            goto rollback;
        *state = LDG_IDEM_NEW;
    } else if (insert) {
        rc = run_stmt(l,
                      prep(l, err,
                           /* an expired key's row is replaced (its fence
                            * goes on counting) */
                           "INSERT INTO idempotency (key, body_sha256, request_id, state, created,"
                           " expires, owner, lease_until) VALUES (?, ?, ?, 'running', ?, ?, ?, ?)"
                           " ON CONFLICT (key) DO UPDATE SET body_sha256 = excluded.body_sha256,"
                           " request_id = excluded.request_id, state = 'running', status = NULL,"
                           " content_type = NULL, response = NULL, stream = 0,"
                           " created = excluded.created, expires = excluded.expires,"
                           " owner = excluded.owner, lease_until = excluded.lease_until,"
                           " fence = fence + 1",
                           "sssddsd", key, body_sha256, request_id, now_s, now_s + ttl_s, l->owner,
                           now_s + l->lease_s),
                      NULL, err);
        if (rc)
            goto rollback;
        *state = LDG_IDEM_NEW;
    }
    if ((rc = exec_sql(l, "COMMIT;", err)))
        goto rollback;
    goto out;
rollback:
    exec_sql(l, "ROLLBACK;", NULL);
    ldg_stored_free(stored);
out:
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int ldg_idem_finish(ldg_ledger *l, const char *key, int status, const char *content_type,
                    bool stream, const char *body, size_t body_len, double now_s, sw_error *err)
{
    (void)now_s;
    int changes = 0;
    ledger_lock(l);
    int rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE idempotency SET state = 'done', status = ?, content_type = ?,"
                           " stream = ?, response = ? WHERE key = ? AND state = 'running'"
                           " AND owner = ?",
                           "isibss", status, content_type, (int)stream, body, body_len, key,
                           l->owner),
                      &changes, err);
    pthread_mutex_unlock(&l->mu);
    return rc ? rc : idem_owned(changes, key, err);
}

int ldg_idem_drop(ldg_ledger *l, const char *key, sw_error *err)
{
    int changes = 0;
    ledger_lock(l);
    int rc = run_stmt(l,
                      prep(l, err,
                           "DELETE FROM idempotency WHERE key = ? AND state = 'running'"
                           " AND owner = ?",
                           "ss", key, l->owner),
                      &changes, err);
    pthread_mutex_unlock(&l->mu);
    return rc ? rc : idem_owned(changes, key, err);
}

int ldg_idem_abandon(ldg_ledger *l, const char *key, sw_error *err)
{
    int changes = 0;
    ledger_lock(l);
    int rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE idempotency SET state = 'abandoned' WHERE key = ?"
                           " AND state = 'running' AND owner = ?",
                           "ss", key, l->owner),
                      &changes, err);
    pthread_mutex_unlock(&l->mu);
    return rc ? rc : idem_owned(changes, key, err);
}

int ldg_idem_recover(ldg_ledger *l, int *n, sw_error *err)
{
    int changes = 0;
    ledger_lock(l);
    int rc = exec_sql(l, "BEGIN IMMEDIATE;", err);
    if (!rc)
        rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE idempotency SET state = 'abandoned' WHERE state = 'running'", ""),
                      &changes, err);
    if (!rc)
        rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE jobs SET owner = NULL, lease_until = 0 WHERE state = 'running'",
                           ""),
                      NULL, err);
    if (!rc)
        rc = exec_sql(l, "COMMIT;", err);
    if (rc)
        exec_sql(l, "ROLLBACK;", NULL);
    pthread_mutex_unlock(&l->mu);
    if (n)
        *n = rc ? 0 : changes;
    return rc;
}

int ldg_idem_expire(ldg_ledger *l, double now_s, int *n, sw_error *err)
{
    int changes = 0;
    ledger_lock(l);
    int rc = run_stmt(l, prep(l, err, "DELETE FROM idempotency WHERE expires <= ?", "d", now_s),
                      &changes, err);
    pthread_mutex_unlock(&l->mu);
    if (n)
        *n = changes;
    return rc;
}

/* ---- attempts ------------------------------------------------------------ */

int ldg_attempt_add(ldg_ledger *l, const char *request_id, int attempt, const char *worker,
                    const char *outcome, const char *error, double started_s, double finished_s,
                    sw_error *err)
{
    ledger_lock(l);
    /* a record, not a promise: no sync of its own (see the top) */
    sqlite3_exec(l->db, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
    int rc = run_stmt(l,
                      prep(l, err,
                           "INSERT INTO attempts (request_id, attempt, worker, outcome, error,"
                           " started, finished) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           "sisssdd", request_id, attempt, worker, outcome, error, started_s,
                           finished_s),
                      NULL, err);
    if (sqlite3_exec(l->db, "PRAGMA synchronous=FULL", NULL, NULL, NULL) != SQLITE_OK) {
        l->sync_normal = true; /* the next ledger_lock tries again */
        if (rc == SW_OK)
            rc = db_fail(l, err, "restoring synchronous=FULL");
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int ldg_attempt_count(ldg_ledger *l, const char *request_id, int *n, sw_error *err)
{
    *n = 0;
    ledger_lock(l);
    int rc = SW_OK;
    sqlite3_stmt *st =
        prep(l, err, "SELECT count(*) FROM attempts WHERE request_id = ?", "s", request_id);
    if (!st)
        rc = SW_EIO;
    else if (sqlite3_step(st) == SQLITE_ROW)
        *n = sqlite3_column_int(st, 0);
    else
        rc = db_fail(l, err, "attempt count");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&l->mu);
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
    int rc = SW_OK;
    ledger_lock(l);
    /* one statement: the insert claims the step; a conflicting one counts
     * a re-call. calls is 1 only on the row this statement created. */
    sqlite3_stmt *st = prep(l, err,
                            "INSERT INTO tool_calls (request_id, step, tool, call_id, arguments,"
                            " state, started) VALUES (?, ?, ?, ?, ?, 'started', ?)"
                            " ON CONFLICT (request_id, step) DO UPDATE SET calls = calls + 1,"
                            " started = excluded.started WHERE state = 'started'"
                            " RETURNING calls",
                            "sisssd", request_id, step, tool, call_id ? call_id : "", arguments,
                            now_s);
    if (!st) {
        rc = SW_EIO;
        goto out;
    }
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        *first = sqlite3_column_int64(st, 0) == 1;
        s = sqlite3_step(st);
    }
    if (s != SQLITE_DONE)
        rc = db_fail(l, err, "tool step start");
    sqlite3_finalize(st);
    if (rc)
        *first = false;
out:
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int ldg_tool_done(ldg_ledger *l, const char *request_id, int step, const char *result,
                  double now_s, sw_error *err)
{
    int changes = 0;
    ledger_lock(l);
    int rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE tool_calls SET state = 'done', result = ?, finished = ?"
                           " WHERE request_id = ? AND step = ?",
                           "sdsi", result, now_s, request_id, step),
                      &changes, err);
    pthread_mutex_unlock(&l->mu);
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
    int rc = SW_OK;
    ledger_lock(l);
    sqlite3_stmt *st = prep(l, err,
                            "SELECT tool, call_id, arguments, state, result, calls, started,"
                            " finished FROM tool_calls WHERE request_id = ? AND step = ?",
                            "si", request_id, step);
    if (!st) {
        rc = SW_EIO;
        goto out;
    }
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        *found = true;
        out->step = step;
        col_copy(st, 0, out->tool, sizeof out->tool);
        col_copy(st, 1, out->call_id, sizeof out->call_id);
        out->arguments = col_text(st, 2);
        const char *state = (const char *)sqlite3_column_text(st, 3); /* NULL: out of memory */
        out->state = state && !strcmp(state, "done") ? LDG_TOOL_DONE : LDG_TOOL_STARTED;
        out->result = col_text(st, 4);
        out->calls = sqlite3_column_int(st, 5);
        out->started = sqlite3_column_double(st, 6);
        out->finished = sqlite3_column_double(st, 7);
        if (!out->arguments || (out->state == LDG_TOOL_DONE && !out->result)) {
            ldg_tool_step_free(out);
            *found = false;
            rc = sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
        }
    } else if (s != SQLITE_DONE) {
        rc = db_fail(l, err, "tool step look-up");
    }
    sqlite3_finalize(st);
out:
    pthread_mutex_unlock(&l->mu);
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

int ldg_job_insert(ldg_ledger *l, const ldg_job *j, sw_error *err)
{
    ledger_lock(l);
    int rc = run_stmt(l,
                      prep(l, err,
                           "INSERT INTO jobs (id, endpoint, request, deadline_ms, state, created)"
                           " VALUES (?, ?, ?, ?, 'queued', ?)",
                           "sssId", j->id, j->endpoint, j->request, (int64_t)j->deadline_ms,
                           j->created),
                      NULL, err);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int ldg_job_insert_idem(ldg_ledger *l, const ldg_job *j, const char *idem_key, int status,
                        const char *content_type, const char *body, size_t body_len,
                        sw_error *err)
{
    if (!idem_key || !idem_key[0])
        return ldg_job_insert(l, j, err);
    int rc;
    ledger_lock(l);
    if ((rc = exec_sql(l, "BEGIN IMMEDIATE;", err)))
        goto out;
    rc = run_stmt(l,
                  prep(l, err,
                       "INSERT INTO jobs (id, endpoint, request, deadline_ms, state, created)"
                       " VALUES (?, ?, ?, ?, 'queued', ?)",
                       "sssId", j->id, j->endpoint, j->request, (int64_t)j->deadline_ms,
                       j->created),
                  NULL, err);
    if (rc)
        goto rollback;
    int changes = 0;
    rc = run_stmt(l,
                  prep(l, err,
                       "UPDATE idempotency SET state = 'done', status = ?, content_type = ?,"
                       " stream = 0, response = ? WHERE key = ? AND state = 'running'"
                       " AND owner = ?",
                       "isbss", status, content_type, body, body_len, idem_key, l->owner),
                  &changes, err);
    if (!rc)
        rc = idem_owned(changes, idem_key, err);
    if (rc)
        goto rollback;
    if ((rc = exec_sql(l, "COMMIT;", err)))
        goto rollback;
    goto out;
rollback:
    exec_sql(l, "ROLLBACK;", NULL);
out:
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int ldg_job_get(ldg_ledger *l, const char *id, ldg_job *out, bool *found, sw_error *err)
{
    memset(out, 0, sizeof *out);
    *found = false;
    int rc = SW_OK;
    ledger_lock(l);
    sqlite3_stmt *st = prep(l, err,
                            "SELECT endpoint, request, deadline_ms, state, attempts, finish_writes,"
                            " response, error, created, started, finished FROM jobs WHERE id = ?",
                            "s", id);
    if (!st) {
        rc = SW_EIO;
        goto out;
    }
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        *found = true;
        snprintf(out->id, sizeof out->id, "%s", id);
        col_copy(st, 0, out->endpoint, sizeof out->endpoint);
        out->request = col_text(st, 1);
        out->deadline_ms = sqlite3_column_type(st, 2) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 2);
        out->state = job_state_parse((const char *)sqlite3_column_text(st, 3));
        out->attempts = sqlite3_column_int(st, 4);
        out->finish_writes = sqlite3_column_int(st, 5);
        out->response = col_text(st, 6);
        out->error = col_text(st, 7);
        out->created = sqlite3_column_double(st, 8);
        out->started = sqlite3_column_double(st, 9);
        out->finished = sqlite3_column_double(st, 10);
        if (!out->request) {
            ldg_job_free(out);
            *found = false;
            rc = sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
        }
    } else if (s != SQLITE_DONE) {
        rc = db_fail(l, err, "job look-up");
    }
    sqlite3_finalize(st);
out:
    pthread_mutex_unlock(&l->mu);
    return rc;
}

/* The claim of a job, shared by ldg_job_start and ldg_job_claim: which
 * rows may be claimed (queued, or running under another owner whose lease
 * expired at ?now) and what the claim writes. */
#define LDG_JOB_CLAIMABLE                                                                       \
    "(state = 'queued' OR (state = 'running' AND lease_until <= ?2"                            \
    " AND COALESCE(owner, '') <> ?3))"
#define LDG_JOB_CLAIM_SET                                                                       \
    "UPDATE jobs SET state = 'running', attempts = attempts + 1, started = ?2, owner = ?3,"     \
    " lease_until = ?4, fence = fence + 1"

/* Runs a claim statement (LDG_JOB_CLAIM_SET ... RETURNING id, fence) with
 * ?1 (id, or unused), ?2 now, ?3 owner, ?4 lease end. */
static int job_claim_run(ldg_ledger *l, const char *sql, const char *id, double now_s,
                         char id_out[48], int64_t *fence, bool *got, sw_error *err)
{
    *got = false;
    *fence = 0;
    if (id_out)
        id_out[0] = 0;
    int rc = SW_OK;
    ledger_lock(l);
    sqlite3_stmt *st = prep(l, err, sql, "sdsd", id ? id : "", now_s, l->owner,
                            now_s + l->lease_s);
    if (!st) {
        rc = SW_EIO;
        goto out;
    }
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        *got = true;
        if (id_out)
            col_copy(st, 0, id_out, 48);
        *fence = sqlite3_column_int64(st, 1);
        s = sqlite3_step(st);
    }
    if (s != SQLITE_DONE) {
        rc = db_fail(l, err, "job claim");
        *got = false;
    }
    sqlite3_finalize(st);
out:
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int ldg_job_start(ldg_ledger *l, const char *id, double now_s, bool *claimed, int64_t *fence,
                  sw_error *err)
{
    return job_claim_run(l,
                         LDG_JOB_CLAIM_SET " WHERE id = ?1 AND " LDG_JOB_CLAIMABLE
                                           " RETURNING id, fence",
                         id, now_s, NULL, fence, claimed, err);
}

int ldg_job_claim(ldg_ledger *l, double now_s, char id_out[48], int64_t *fence, bool *got,
                  sw_error *err)
{
    /* one statement: SQLite runs it alone, so the oldest claimable job
     * is claimed by one connection */
    return job_claim_run(l,
                         LDG_JOB_CLAIM_SET " WHERE rowid = (SELECT rowid FROM jobs WHERE "
                         LDG_JOB_CLAIMABLE " ORDER BY created, rowid LIMIT 1)"
                         " RETURNING id, fence",
                         NULL, now_s, id_out, fence, got, err);
}

/* A fenced write on a job changed no row: SW_ENOTFOUND for an unknown id,
 * SW_ECONFLICT when it is not running with this fence; *running (may be
 * NULL) whether it is running at all. */
static int job_unfenced(ldg_ledger *l, const char *id, bool *running, sw_error *err)
{
    sqlite3_stmt *st = prep(l, err, "SELECT state FROM jobs WHERE id = ?", "s", id);
    if (!st)
        return SW_EIO;
    int s = sqlite3_step(st);
    int rc;
    if (s == SQLITE_ROW) {
        int state = job_state_parse((const char *)sqlite3_column_text(st, 0));
        if (running)
            *running = state == LDG_JOB_RUNNING;
        rc = sw_error_set(err, SW_ECONFLICT,
                          "ledger: job %s is not running under this claim (taken over or "
                          "finished)", id);
    } else if (s == SQLITE_DONE) {
        rc = sw_error_set(err, SW_ENOTFOUND, "ledger: no job %s", id);
    } else {
        rc = db_fail(l, err, "job look-up");
    }
    sqlite3_finalize(st);
    return rc;
}

int ldg_job_finish(ldg_ledger *l, const char *id, int64_t fence, int state, const char *response,
                   const char *error, double now_s, sw_error *err)
{
    if (state != LDG_JOB_SUCCEEDED && state != LDG_JOB_FAILED)
        return sw_error_set(err, SW_EINVAL, "ledger: a job finishes as succeeded or failed");
    int changes = 0;
    ledger_lock(l);
    /* finish_writes counts every final write: a job run twice would show
     * (tests check it is 1), though the fence lets one write through */
    int rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE jobs SET state = ?, response = ?, error = ?, finished = ?,"
                           " finish_writes = finish_writes + 1 WHERE id = ? AND state = 'running'"
                           " AND fence = ?",
                           "sssdsI", ldg_job_state_name(state), response, error, now_s, id, fence),
                      &changes, err);
    if (!rc && changes != 1)
        rc = job_unfenced(l, id, NULL, err);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int ldg_job_requeue(ldg_ledger *l, const char *id, int64_t fence, bool *requeued, sw_error *err)
{
    int changes = 0;
    ledger_lock(l);
    /* only from running: a succeeded or failed job keeps its final record */
    int rc = run_stmt(l,
                      prep(l, err,
                           "UPDATE jobs SET state = 'queued', owner = NULL, lease_until = 0"
                           " WHERE id = ? AND state = 'running' AND fence = ?",
                           "sI", id, fence),
                      &changes, err);
    if (!rc && changes != 1) {
        bool running = false;
        sw_error why;
        int u = job_unfenced(l, id, &running, &why);
        /* running under another claim: a conflict; finished, queued or
         * unknown: left as it is */
        if (u == SW_ECONFLICT && running)
            rc = sw_error_set(err, u, "%s", why.message);
        else if (u != SW_ECONFLICT && u != SW_ENOTFOUND)
            rc = sw_error_set(err, u, "%s", why.message);
    }
    pthread_mutex_unlock(&l->mu);
    if (requeued)
        *requeued = !rc && changes == 1;
    return rc;
}

int ldg_job_pending(ldg_ledger *l, char (**ids)[48], size_t *n, sw_error *err)
{
    *ids = NULL;
    *n = 0;
    int rc = SW_OK;
    size_t cap = 0;
    ledger_lock(l);
    sqlite3_stmt *st = prep(l, err,
                            "SELECT id FROM jobs WHERE state IN ('queued', 'running')"
                            " ORDER BY created, rowid",
                            "");
    if (!st) {
        rc = SW_EIO;
        goto out;
    }
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char(*na)[48] = sw_realloc(*ids, nc * sizeof **ids);
            if (!na) {
                rc = sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
                break;
            }
            *ids = na;
            cap = nc;
        }
        col_copy(st, 0, (*ids)[*n], 48);
        (*n)++;
    }
    if (!rc && s != SQLITE_DONE)
        rc = db_fail(l, err, "pending jobs");
    sqlite3_finalize(st);
    if (rc) {
        sw_free(*ids);
        *ids = NULL;
        *n = 0;
    }
out:
    pthread_mutex_unlock(&l->mu);
    return rc;
}

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
    int rc;
    ledger_lock(l);
    if ((rc = exec_sql(l, "BEGIN IMMEDIATE;", err)))
        goto out;
    if ((rc = run_stmt(l, prep(l, err, "DELETE FROM idempotency WHERE expires <= ?", "d", now_s),
                       &c.keys, err)))
        goto rollback;
    if ((rc = run_stmt(l,
                       prep(l, err,
                            /* "+state": not by jobs_state, which would
                             * walk every finished job; by jobs_finished */
                            "DELETE FROM jobs WHERE +state IN ('succeeded','failed')"
                            " AND finished IS NOT NULL AND finished <= ?1"
                            " AND id NOT IN (SELECT request_id FROM idempotency)",
                            "d", cut),
                       &c.jobs, err)))
        goto rollback;
    if ((rc = run_stmt(l,
                       prep(l, err,
                            "DELETE FROM attempts WHERE finished <= ?1 AND "
                            LDG_SWEEPABLE("request_id"),
                            "d", cut),
                       &c.attempts, err)))
        goto rollback;
    if ((rc = run_stmt(l,
                       prep(l, err,
                            /* "started <= ?1" is implied by the rest,
                             * but lets it search tool_calls_started */
                            "DELETE FROM tool_calls WHERE started <= ?1 AND "
                            LDG_SWEEPABLE("request_id"), "d", cut),
                       &c.tool_calls, err)))
        goto rollback;
    if ((rc = run_stmt(l,
                       prep(l, err,
                            /* a background response stays while its job
                             * may still finish it */
                            "DELETE FROM responses WHERE created <= ?1 AND (job_id IS NULL OR"
                            " job_id NOT IN (SELECT id FROM jobs WHERE state IN"
                            " ('queued','running')))",
                            "d", cut),
                       &c.responses, err)))
        goto rollback;
    if ((rc = exec_sql(l, "COMMIT;", err)))
        goto rollback;
    if (out)
        *out = c;
    goto out;
rollback:
    exec_sql(l, "ROLLBACK;", NULL);
out:
    pthread_mutex_unlock(&l->mu);
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
    ledger_lock(l);
    int rc = run_stmt(l,
                      prep(l, err,
                           "INSERT OR REPLACE INTO responses (id, conversation, response, job_id,"
                           " created) VALUES (?, ?, ?, ?, ?)",
                           "ssssd", id, conversation, response,
                           job_id && job_id[0] ? job_id : NULL, now_s),
                      NULL, err);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int ldg_response_get(ldg_ledger *l, const char *id, ldg_response *out, bool *found,
                     sw_error *err)
{
    memset(out, 0, sizeof *out);
    *found = false;
    int rc = SW_OK;
    ledger_lock(l);
    sqlite3_stmt *st = prep(l, err,
                            "SELECT conversation, response, job_id, created FROM responses"
                            " WHERE id = ?",
                            "s", id);
    if (!st) {
        rc = SW_EIO;
        goto out;
    }
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        *found = true;
        out->conversation = col_text(st, 0);
        out->response = col_text(st, 1);
        col_copy(st, 2, out->job_id, sizeof out->job_id);
        out->created = sqlite3_column_double(st, 3);
        if (!out->conversation || !out->response) {
            ldg_response_free(out);
            *found = false;
            rc = sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
        }
    } else if (s != SQLITE_DONE) {
        rc = db_fail(l, err, "response look-up");
    }
    sqlite3_finalize(st);
out:
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int ldg_response_delete(ldg_ledger *l, const char *id, bool *found, sw_error *err)
{
    int changes = 0;
    ledger_lock(l);
    int rc = run_stmt(l, prep(l, err, "DELETE FROM responses WHERE id = ?", "s", id), &changes,
                      err);
    pthread_mutex_unlock(&l->mu);
    *found = rc == SW_OK && changes > 0;
    return rc;
}
