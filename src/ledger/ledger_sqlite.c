/* ledger_sqlite.c - the ledger's SQLite backend (the default: one router
 * per state directory, <state_dir>/ledger.db): the connection, its
 * schema and migrations (PRAGMA user_version), and the statements the
 * shared code (ledger.c, ledger_idem.c, ledger_jobs.c) runs through
 * ledger-impl.h.
 *
 * Durability: WAL mode with synchronous=FULL, so each commit is synced to
 * the WAL before sqlite3_step returns; NORMAL would be faster but could
 * lose the last commits on a power cut, and the router promises things
 * (a 202, a tool call) right after a commit. A process crash (SIGKILL)
 * loses nothing in either mode. The one exception is the attempts table:
 * a record of what happened, written after every relayed request and
 * promising nothing, so it commits with synchronous=NORMAL (no sync of its
 * own; the next FULL commit syncs it along: relax below). A sync per
 * request was most of the router's own cost per request.
 */
#include "ledger/ledger-impl.h"

#include "common/alloc.h"

#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

/* Prepared statements kept for the next call with the same SQL text: a
 * request's ledger writes are a handful of short statements, and
 * preparing them again each time was a good part of their cost. A
 * statement in use (a second one with the same text at once) or past
 * the cache's size is prepared and finalized as before. */
#define SQ_CACHE 48

typedef struct sq_cached {
    uint64_t hash;
    char *sql; /* sw_free */
    sqlite3_stmt *st;
    bool busy;
} sq_cached;

typedef struct sq_db {
    sqlite3 *db;
    /* ldg_attempt_add could not put synchronous back to FULL (out of
     * memory): the next caller does, before its write (sq_ready) */
    bool sync_normal;
    sq_cached cache[SQ_CACHE];
    int n_cached;
} sq_db;

typedef struct sq_result {
    ldg__result base;
    sqlite3_stmt *st;
    sq_cached *cached; /* NULL: finalized when freed */
    int changes;
} sq_result;

#define SQ(l) ((sq_db *)(l)->db)

/* Migrations: entry i takes the schema from version i to i + 1. Never
 * edit one that shipped; append (and the same step to ledger_pg.c's). */
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
     * (running keys and jobs: who runs them, until when, and a count of
     * claims that a late write of a previous owner does not match); the
     * partial index serves ldg_renew at no cost for done keys */
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

/* ---- the connection -------------------------------------------------------- */

static int db_fail(sqlite3 *db, sw_error *err, const char *what)
{
    return sw_error_set(err, SW_EIO, "ledger: %s: %s", what, sqlite3_errmsg(db));
}

static int sq_exec(ldg_ledger *l, const char *sql, sw_error *err)
{
    char *msg = NULL;
    if (sqlite3_exec(SQ(l)->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        sw_error_set(err, SW_EIO, "ledger: %s", msg ? msg : sqlite3_errmsg(SQ(l)->db));
        sqlite3_free(msg);
        return SW_EIO;
    }
    return SW_OK;
}

static int user_version(sqlite3 *db)
{
    sqlite3_stmt *st = NULL;
    int v = -1;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

static void sq_close(ldg_ledger *l)
{
    if (!SQ(l))
        return;
    for (int i = 0; i < SQ(l)->n_cached; i++) {
        sqlite3_finalize(SQ(l)->cache[i].st);
        sw_free(SQ(l)->cache[i].sql);
    }
    sqlite3_close(SQ(l)->db);
    sw_free(SQ(l));
    l->db = NULL;
}

int ldg__sqlite_open(ldg_ledger *l, const char *dir, sw_error *err)
{
    char path[1024];
    if (snprintf(path, sizeof path, "%s/ledger.db", dir) >= (int)sizeof path)
        return sw_error_set(err, SW_EINVAL, "ledger: state directory path too long");
    sq_db *d = sw_calloc(1, sizeof *d);
    if (!d)
        return sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
    l->db = d;
    int rc = SW_EIO;
    if (sqlite3_open_v2(path, &d->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL) !=
        SQLITE_OK) {
        sw_error_set(err, SW_EIO, "ledger: cannot open %s: %s", path,
                     d->db ? sqlite3_errmsg(d->db) : "out of memory");
        goto fail;
    }
    /* Another process (a test, sqlite3 on the command line) or another
     * connection may hold the database for a moment: wait for it rather
     * than fail. */
    sqlite3_busy_timeout(d->db, 5000);
    if (sq_exec(l, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;",
                err))
        goto fail;
    for (;;) {
        /* each step and its version bump in one transaction; the version
         * is read inside it, so two connections opening a new file at
         * once migrate it once */
        if (sq_exec(l, "BEGIN IMMEDIATE;", err))
            goto fail;
        int v = user_version(d->db);
        if (v < 0) {
            db_fail(d->db, err, "reading the schema version");
            sq_exec(l, "ROLLBACK;", NULL);
            goto fail;
        }
        if (v > LDG_SCHEMA_VERSION) {
            rc = sw_error_set(err, SW_EUNSUPPORTED,
                              "ledger: %s has schema version %d, this program knows up to %d",
                              path, v, LDG_SCHEMA_VERSION);
            sq_exec(l, "ROLLBACK;", NULL);
            goto fail;
        }
        if (v == LDG_SCHEMA_VERSION) {
            if (sq_exec(l, "COMMIT;", err))
                goto fail;
            break;
        }
        char bump[64];
        snprintf(bump, sizeof bump, "PRAGMA user_version=%d;", v + 1);
        if (sq_exec(l, k_migrations[v], err) || sq_exec(l, bump, err)) {
            sq_exec(l, "ROLLBACK;", NULL);
            goto fail;
        }
        if (sq_exec(l, "COMMIT;", err))
            goto fail;
    }
    return SW_OK;
fail:
    sq_close(l);
    return rc;
}

/* Restores synchronous=FULL if an attempt record left it NORMAL: every
 * write after it makes a promise. If that fails too, the write still goes
 * ahead (it is synced with the next FULL commit) and the next caller
 * tries again. */
static int sq_ready(ldg_ledger *l, sw_error *err)
{
    (void)err;
    if (SQ(l)->sync_normal &&
        sqlite3_exec(SQ(l)->db, "PRAGMA synchronous=FULL", NULL, NULL, NULL) == SQLITE_OK)
        SQ(l)->sync_normal = false;
    return SW_OK;
}

static void sq_relax(ldg_ledger *l, bool relaxed)
{
    if (relaxed) {
        sqlite3_exec(SQ(l)->db, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
    } else if (sqlite3_exec(SQ(l)->db, "PRAGMA synchronous=FULL", NULL, NULL, NULL) !=
               SQLITE_OK) {
        SQ(l)->sync_normal = true; /* the next sq_ready tries again */
    }
}

static int sq_schema_version(ldg_ledger *l) { return user_version(SQ(l)->db); }

/* IMMEDIATE: a transaction's reads and writes are one decision; a second
 * writer waits for it (busy time-out) and then sees its outcome. */
static int sq_begin(ldg_ledger *l, sw_error *err) { return sq_exec(l, "BEGIN IMMEDIATE;", err); }

/* ---- statements ------------------------------------------------------------ */

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

static uint64_t sql_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The statement for sql in r: a cached one, or a new one (cached when
 * there is room). */
static int sq_prepare(sq_db *d, const char *sql, sq_result *r)
{
    uint64_t h = sql_hash(sql);
    for (int i = 0; i < d->n_cached; i++) {
        sq_cached *c = &d->cache[i];
        if (c->hash == h && !c->busy && !strcmp(c->sql, sql)) {
            c->busy = true;
            r->st = c->st;
            r->cached = c;
            return SQLITE_OK;
        }
    }
    if (d->n_cached < SQ_CACHE) {
        char *copy = sw_strdup(sql);
        if (copy) {
            int rc = sqlite3_prepare_v3(d->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &r->st, NULL);
            if (rc != SQLITE_OK) {
                sw_free(copy);
                return rc;
            }
            sq_cached *c = &d->cache[d->n_cached++];
            *c = (sq_cached){h, copy, r->st, true};
            r->cached = c;
            return SQLITE_OK;
        }
    }
    return sqlite3_prepare_v2(d->db, sql, -1, &r->st, NULL);
}

static void sq_result_free(ldg__result *base);

static int sq_query(ldg_ledger *l, const char *sql, const char *fmt, va_list ap,
                    ldg__result **out, sw_error *err)
{
    *out = NULL;
    sqlite3 *db = SQ(l)->db;
    sq_result *r = sw_calloc(1, sizeof *r);
    if (!r)
        return sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
    r->base.be = &ldg__sqlite_backend;
    if (sq_prepare(SQ(l), sql, r) != SQLITE_OK) {
        sw_free(r);
        return db_fail(db, err, "prepare");
    }
    if (bind_all(r->st, fmt, ap) != SQLITE_OK) {
        int rc = db_fail(db, err, "bind");
        sq_result_free(&r->base);
        return rc;
    }
    *out = &r->base;
    return SW_OK;
}

static int sq_next(ldg_ledger *l, ldg__result *base, sw_error *err)
{
    sq_result *r = (sq_result *)base;
    int s = sqlite3_step(r->st);
    if (s == SQLITE_ROW)
        return 1;
    if (s == SQLITE_DONE) {
        r->changes = sqlite3_changes(SQ(l)->db);
        return 0;
    }
    return db_fail(SQ(l)->db, err, "statement");
}

static int sq_changes(ldg_ledger *l, ldg__result *base)
{
    (void)l;
    return ((sq_result *)base)->changes;
}

static const char *sq_text(ldg__result *base, int col)
{
    return (const char *)sqlite3_column_text(((sq_result *)base)->st, col);
}

static const void *sq_blob(ldg__result *base, int col, size_t *len)
{
    sqlite3_stmt *st = ((sq_result *)base)->st;
    const void *p = sqlite3_column_blob(st, col);
    *len = (size_t)sqlite3_column_bytes(st, col);
    return p ? p : (*len == 0 ? "" : NULL);
}

static int64_t sq_int64(ldg__result *base, int col)
{
    return sqlite3_column_int64(((sq_result *)base)->st, col);
}

static double sq_real(ldg__result *base, int col)
{
    return sqlite3_column_double(((sq_result *)base)->st, col);
}

static bool sq_is_null(ldg__result *base, int col)
{
    return sqlite3_column_type(((sq_result *)base)->st, col) == SQLITE_NULL;
}

static void sq_result_free(ldg__result *base)
{
    sq_result *r = (sq_result *)base;
    if (!r)
        return;
    if (r->cached) {
        sqlite3_reset(r->st);
        sqlite3_clear_bindings(r->st);
        r->cached->busy = false;
    } else {
        sqlite3_finalize(r->st);
    }
    sw_free(r);
}

const ldg__backend ldg__sqlite_backend = {
    .name = "sqlite",
    .shared = false,
    .jobs_order = "rowid",
    .for_update = "",
    .ready = sq_ready,
    .close = sq_close,
    .schema_version = sq_schema_version,
    .begin = sq_begin,
    .exec = sq_exec,
    .query = sq_query,
    .next = sq_next,
    .changes = sq_changes,
    .text = sq_text,
    .blob = sq_blob,
    .int64 = sq_int64,
    .real = sq_real,
    .is_null = sq_is_null,
    .result_free = sq_result_free,
    .relax = sq_relax,
};
