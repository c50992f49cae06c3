/* ledger_pg.c - the ledger's PostgreSQL backend (libpq), for several
 * routers sharing one ledger: the connection (one, under the ledger's
 * mutex, like SQLite's), its schema and migrations (a schema_version
 * table, under a transaction-level advisory lock so that routers starting
 * together migrate once), and the statements the shared code (ledger.c,
 * ledger_idem.c, ledger_jobs.c) runs through ledger-impl.h.
 *
 * Losing the server: a statement that fails because the connection is
 * gone (or the server is shutting down or starting) returns
 * SW_EUNAVAILABLE, never SW_EIO, and nothing is retried here (a write whose
 * COMMIT got no answer may or may not have happened: the caller decides).
 * The next call reconnects (PQreset), at most one attempt per
 * LDG_PG_RETRY_S; calls in between fail at once with SW_EUNAVAILABLE.
 *
 * Durability is the server's: every commit waits for its WAL flush
 * (synchronous_commit on, PostgreSQL's default). The one exception, as on
 * SQLite, is the attempts' record, which promises nothing: it commits
 * with synchronous_commit off (safe against a crash of the router or of
 * PostgreSQL itself, short of the machine's; the next synchronous
 * commit flushes it along, the WAL being one sequence).
 */
#include "ledger/ledger-impl.h"

#include "common/alloc.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LDG_PG_RETRY_S 0.5
#define LDG_PG_MAX_PARAMS 16
/* pg_advisory_xact_lock key of the migration: "spillway" in ASCII */
#define LDG_PG_MIGRATION_LOCK "7526755694052796793"

typedef struct pg_db {
    PGconn *conn;
    double last_try; /* CLOCK_MONOTONIC seconds of the last reconnect */
    /* pg_relax could not turn synchronous_commit back on: the next
     * pg_ready does, before its write */
    bool async_commit;
} pg_db;

typedef struct pg_result {
    ldg__result base;
    PGresult *res;
    int row, rows;
    unsigned char *blob; /* the current bytea, unescaped (PQfreemem) */
} pg_result;

#define PG(l) ((pg_db *)(l)->db)

/* Migrations, the same steps as ledger_sqlite.c's in PostgreSQL's types
 * (REAL there is double precision here, BLOB bytea). jobs.seq keeps the
 * insertion order, as SQLite's rowid does. */
static const char *const k_migrations[LDG_SCHEMA_VERSION] = {
    "CREATE TABLE idempotency ("
    "  key TEXT PRIMARY KEY,"
    "  body_sha256 TEXT NOT NULL,"
    "  request_id TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('running','done','abandoned')),"
    "  status INTEGER,"
    "  content_type TEXT,"
    "  response BYTEA,"
    "  stream INTEGER NOT NULL DEFAULT 0,"
    "  created DOUBLE PRECISION NOT NULL,"
    "  expires DOUBLE PRECISION NOT NULL);"
    "CREATE TABLE attempts ("
    "  request_id TEXT NOT NULL,"
    "  attempt INTEGER NOT NULL,"
    "  worker TEXT NOT NULL,"
    "  outcome TEXT NOT NULL,"
    "  error TEXT,"
    "  started DOUBLE PRECISION NOT NULL,"
    "  finished DOUBLE PRECISION NOT NULL);"
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
    "  started DOUBLE PRECISION NOT NULL,"
    "  finished DOUBLE PRECISION,"
    "  PRIMARY KEY (request_id, step));"
    "CREATE TABLE jobs ("
    "  id TEXT PRIMARY KEY,"
    "  seq BIGSERIAL,"
    "  endpoint TEXT NOT NULL,"
    "  request TEXT NOT NULL,"
    "  deadline_ms BIGINT,"
    "  state TEXT NOT NULL CHECK (state IN ('queued','running','succeeded','failed')),"
    "  attempts INTEGER NOT NULL DEFAULT 0,"
    "  finish_writes INTEGER NOT NULL DEFAULT 0,"
    "  response TEXT,"
    "  error TEXT,"
    "  created DOUBLE PRECISION NOT NULL,"
    "  started DOUBLE PRECISION,"
    "  finished DOUBLE PRECISION);"
    "CREATE INDEX jobs_state ON jobs(state, created);",
    /* 1 -> 2 */
    "CREATE INDEX jobs_finished ON jobs(finished);"
    "CREATE INDEX attempts_finished ON attempts(finished, request_id);"
    "CREATE INDEX tool_calls_started ON tool_calls(started);"
    "CREATE INDEX tool_calls_finished ON tool_calls(finished);"
    "CREATE INDEX idempotency_expires ON idempotency(expires);"
    "CREATE INDEX idempotency_request ON idempotency(request_id);",
    /* 2 -> 3 */
    "CREATE TABLE responses ("
    "  id TEXT PRIMARY KEY,"
    "  conversation TEXT NOT NULL,"
    "  response TEXT NOT NULL,"
    "  job_id TEXT,"
    "  created DOUBLE PRECISION NOT NULL);"
    "CREATE INDEX responses_created ON responses(created);",
    /* 3 -> 4: leases and fences */
    "ALTER TABLE idempotency ADD COLUMN owner TEXT,"
    "  ADD COLUMN lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,"
    "  ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN owner TEXT,"
    "  ADD COLUMN lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,"
    "  ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;"
    "CREATE INDEX idempotency_running ON idempotency(owner) WHERE state = 'running';",
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* libpq's message on one line, without its trailing newline. */
static void trim_copy(char *dst, size_t cap, const char *msg)
{
    snprintf(dst, cap, "%s", msg && msg[0] ? msg : "no message");
    for (char *p = dst; *p; p++)
        if (*p == '\n' || *p == '\t')
            *p = ' ';
    size_t n = strlen(dst);
    while (n && (dst[n - 1] == '\n' || dst[n - 1] == ' '))
        dst[--n] = 0;
}

/* Whether a failure means the server is out of reach: the connection is
 * broken, or the server said it is shutting down / starting (SQLSTATE
 * class 08, 57P01-57P03). */
static bool server_gone(PGconn *conn, const PGresult *res)
{
    if (!conn || PQstatus(conn) != CONNECTION_OK)
        return true;
    const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    return st && (!strncmp(st, "08", 2) || !strcmp(st, "57P01") || !strcmp(st, "57P02") ||
                  !strcmp(st, "57P03"));
}

static int pg_fail(ldg_ledger *l, const PGresult *res, sw_error *err, const char *what)
{
    PGconn *conn = PG(l)->conn;
    char msg[240];
    trim_copy(msg, sizeof msg,
              res && PQresultErrorMessage(res)[0] ? PQresultErrorMessage(res)
                                                  : conn ? PQerrorMessage(conn) : NULL);
    if (server_gone(conn, res))
        return sw_error_set(err, SW_EUNAVAILABLE, "ledger: PostgreSQL unavailable (%s): %s", what,
                            msg);
    return sw_error_set(err, SW_EIO, "ledger: %s: %s", what, msg);
}

/* A statement without parameters; SW_OK when it ran. */
static int pg_exec(ldg_ledger *l, const char *sql, sw_error *err)
{
    PGresult *res = PQexec(PG(l)->conn, sql);
    ExecStatusType s = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    int rc = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK ? SW_OK : pg_fail(l, res, err, sql);
    PQclear(res);
    return rc;
}

static int pg_begin(ldg_ledger *l, sw_error *err) { return pg_exec(l, "BEGIN", err); }

static void pg_close(ldg_ledger *l)
{
    if (!PG(l))
        return;
    PQfinish(PG(l)->conn);
    sw_free(PG(l));
    l->db = NULL;
}

/* Reconnects a broken connection, at most once per LDG_PG_RETRY_S; and
 * ends a transaction a failed call may have left open. */
static int pg_ready(ldg_ledger *l, sw_error *err)
{
    pg_db *d = PG(l);
    if (PQstatus(d->conn) != CONNECTION_OK) {
        double now = mono_s();
        if (now - d->last_try < LDG_PG_RETRY_S)
            return sw_error_set(err, SW_EUNAVAILABLE,
                                "ledger: PostgreSQL unavailable (reconnecting)");
        d->last_try = now;
        PQreset(d->conn);
        if (PQstatus(d->conn) != CONNECTION_OK)
            return pg_fail(l, NULL, err, "reconnect");
    }
    PGTransactionStatusType t = PQtransactionStatus(d->conn);
    if (t == PQTRANS_INTRANS || t == PQTRANS_INERROR) {
        int rc = pg_exec(l, "ROLLBACK", err);
        if (rc)
            return rc;
    }
    if (d->async_commit && pg_exec(l, "SET synchronous_commit TO on", NULL) == SW_OK)
        d->async_commit = false;
    return SW_OK;
}

/* synchronous_commit off around an attempt's record (see the top); a
 * failure to turn it on again is retried by the next pg_ready. A
 * reconnection starts a new session, with the server's default (on). */
static void pg_relax(ldg_ledger *l, bool relaxed)
{
    pg_db *d = PG(l);
    if (relaxed)
        d->async_commit = pg_exec(l, "SET synchronous_commit TO off", NULL) == SW_OK;
    else if (pg_exec(l, "SET synchronous_commit TO on", NULL) == SW_OK)
        d->async_commit = false;
}

static int pg_schema_version(ldg_ledger *l)
{
    PGresult *res = PQexec(PG(l)->conn, "SELECT version FROM schema_version");
    int v = -1;
    if (res && PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        v = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    return v;
}

/* Creates or migrates the schema in one transaction under an advisory
 * lock: a second router starting at the same time waits, then finds it
 * done. */
static int migrate(ldg_ledger *l, sw_error *err)
{
    int rc;
    if ((rc = pg_exec(l, "BEGIN", err)))
        return rc;
    if ((rc = pg_exec(l, "SELECT pg_advisory_xact_lock(" LDG_PG_MIGRATION_LOCK ")", err)) ||
        (rc = pg_exec(l, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
                      err)))
        goto rollback;
    int v = pg_schema_version(l);
    if (v < 0) {
        if ((rc = pg_exec(l, "INSERT INTO schema_version VALUES (0)", err)))
            goto rollback;
        v = 0;
    }
    if (v > LDG_SCHEMA_VERSION) {
        rc = sw_error_set(err, SW_EUNSUPPORTED,
                          "ledger: the database has schema version %d, this program knows up "
                          "to %d", v, LDG_SCHEMA_VERSION);
        goto rollback;
    }
    for (; v < LDG_SCHEMA_VERSION; v++)
        if ((rc = pg_exec(l, k_migrations[v], err)))
            goto rollback;
    char bump[64];
    snprintf(bump, sizeof bump, "UPDATE schema_version SET version = %d", LDG_SCHEMA_VERSION);
    if ((rc = pg_exec(l, bump, err)) || (rc = pg_exec(l, "COMMIT", err)))
        goto rollback;
    return SW_OK;
rollback:
    pg_exec(l, "ROLLBACK", NULL);
    return rc;
}

static void ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

int ldg__pg_open(ldg_ledger *l, const char *url, sw_error *err)
{
    /* the password never sits in a configuration file: PGPASSWORD or
     * ~/.pgpass (libpq reads both) */
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(url, &perr);
    if (!opts) {
        char msg[200];
        trim_copy(msg, sizeof msg, perr ? perr : "out of memory");
        PQfreemem(perr);
        return sw_error_set(err, SW_EINVAL, "ledger: bad PostgreSQL URL: %s", msg);
    }
    bool password = false;
    for (PQconninfoOption *o = opts; o->keyword; o++)
        if (!strcmp(o->keyword, "password") && o->val && o->val[0])
            password = true;
    PQconninfoFree(opts);
    if (password)
        return sw_error_set(err, SW_EINVAL,
                            "ledger: the PostgreSQL URL carries a password: give it in "
                            "PGPASSWORD or ~/.pgpass instead");
    pg_db *d = sw_calloc(1, sizeof *d);
    if (!d)
        return sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
    l->db = d;
    /* defaults first: what the URL says wins (expand_dbname). A server
     * that vanished without closing the connection is noticed within
     * about 10-25 s (TCP keep-alives, unacknowledged data), not hours. */
    /* A router stalled inside a transaction (stopped, cut off with its
     * connection open) would hold its row locks, and every other router
     * that touches those rows would wait for it: the server ends such a
     * session after 5 s idle in a transaction. */
    const char *const keys[] = {"connect_timeout", "fallback_application_name", "keepalives_idle",
                                "keepalives_interval", "keepalives_count", "tcp_user_timeout",
                                "options", "dbname", NULL};
    const char *const vals[] = {"5", "spillway", "10", "5", "3", "10000",
                                "-c idle_in_transaction_session_timeout=5000", url, NULL};
    d->conn = PQconnectdbParams(keys, vals, 1);
    d->last_try = mono_s();
    int rc;
    if (!d->conn) {
        rc = sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
        goto fail;
    }
    if (PQstatus(d->conn) != CONNECTION_OK) {
        char msg[240];
        trim_copy(msg, sizeof msg, PQerrorMessage(d->conn));
        rc = sw_error_set(err, SW_EUNAVAILABLE, "ledger: cannot connect to PostgreSQL: %s", msg);
        goto fail;
    }
    /* "relation already exists, skipping" and the like: not for stderr */
    PQsetNoticeProcessor(d->conn, ignore_notice, NULL);
    if ((rc = migrate(l, err)))
        goto fail;
    return SW_OK;
fail:
    pg_close(l);
    return rc;
}

/* ---- statements ------------------------------------------------------------ */

/* SQLite's placeholders ("?" in order, "?N") to PostgreSQL's "$N",
 * outside quoted text. false when it does not fit. */
static bool rewrite_placeholders(const char *sql, char *out, size_t cap)
{
    size_t o = 0;
    int next = 1;
    bool quoted = false;
    for (const char *p = sql; *p; p++) {
        if (o + 8 >= cap)
            return false;
        if (*p == '\'')
            quoted = !quoted;
        if (*p != '?' || quoted) {
            out[o++] = *p;
        } else if (p[1] >= '0' && p[1] <= '9') {
            out[o++] = '$';
        } else {
            o += (size_t)snprintf(out + o, cap - o, "$%d", next++);
        }
    }
    out[o] = 0;
    return true;
}

static int pg_query(ldg_ledger *l, const char *sql, const char *fmt, va_list ap,
                    ldg__result **out, sw_error *err)
{
    *out = NULL;
    char text[4096];
    if (!rewrite_placeholders(sql, text, sizeof text))
        return sw_error_set(err, SW_EINTERNAL, "ledger: statement too long");
    const char *values[LDG_PG_MAX_PARAMS];
    int lengths[LDG_PG_MAX_PARAMS], formats[LDG_PG_MAX_PARAMS];
    Oid types[LDG_PG_MAX_PARAMS];
    char nums[LDG_PG_MAX_PARAMS][32];
    int n = 0;
    for (const char *f = fmt; *f; f++, n++) {
        if (n == LDG_PG_MAX_PARAMS)
            return sw_error_set(err, SW_EINTERNAL, "ledger: too many parameters");
        lengths[n] = 0;
        formats[n] = 0;
        types[n] = 0; /* inferred from where it is used */
        switch (*f) {
        case 's': values[n] = va_arg(ap, const char *); break;
        case 'b': {
            const void *p = va_arg(ap, const void *);
            size_t len = va_arg(ap, size_t);
            if (len > (size_t)0x3fffffff)
                return sw_error_set(err, SW_ERANGE, "ledger: value too large");
            values[n] = p ? p : "";
            lengths[n] = (int)len;
            formats[n] = 1; /* binary */
            types[n] = 17;  /* bytea */
            break;
        }
        case 'i':
            snprintf(nums[n], sizeof nums[n], "%d", va_arg(ap, int));
            values[n] = nums[n];
            break;
        case 'I':
            snprintf(nums[n], sizeof nums[n], "%lld", (long long)va_arg(ap, int64_t));
            values[n] = nums[n];
            break;
        case 'd':
            snprintf(nums[n], sizeof nums[n], "%.17g", va_arg(ap, double));
            values[n] = nums[n];
            break;
        default: return sw_error_set(err, SW_EINTERNAL, "ledger: bad parameter format");
        }
    }
    PGresult *res = PQexecParams(PG(l)->conn, text, n, types, values, lengths, formats, 0);
    ExecStatusType s = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
        int rc = pg_fail(l, res, err, "statement");
        PQclear(res);
        return rc;
    }
    pg_result *r = sw_calloc(1, sizeof *r);
    if (!r) {
        PQclear(res);
        return sw_error_set(err, SW_ENOMEM, "ledger: out of memory");
    }
    r->base.be = &ldg__pg_backend;
    r->res = res;
    r->row = -1;
    r->rows = PQntuples(res);
    *out = &r->base;
    return SW_OK;
}

static int pg_next(ldg_ledger *l, ldg__result *base, sw_error *err)
{
    (void)l;
    (void)err;
    pg_result *r = (pg_result *)base;
    if (r->row + 1 < r->rows) {
        r->row++;
        return 1;
    }
    r->row = r->rows;
    return 0;
}

static int pg_changes(ldg_ledger *l, ldg__result *base)
{
    (void)l;
    return atoi(PQcmdTuples(((pg_result *)base)->res));
}

static bool pg_is_null(ldg__result *base, int col)
{
    pg_result *r = (pg_result *)base;
    return r->row < 0 || r->row >= r->rows || PQgetisnull(r->res, r->row, col);
}

static const char *pg_text(ldg__result *base, int col)
{
    pg_result *r = (pg_result *)base;
    return pg_is_null(base, col) ? NULL : PQgetvalue(r->res, r->row, col);
}

static const void *pg_blob(ldg__result *base, int col, size_t *len)
{
    pg_result *r = (pg_result *)base;
    *len = 0;
    const char *t = pg_text(base, col);
    if (!t)
        return "";
    PQfreemem(r->blob);
    r->blob = PQunescapeBytea((const unsigned char *)t, len);
    return r->blob; /* NULL: out of memory */
}

static int64_t pg_col_int64(ldg__result *base, int col)
{
    const char *t = pg_text(base, col);
    return t ? strtoll(t, NULL, 10) : 0;
}

static double pg_real(ldg__result *base, int col)
{
    const char *t = pg_text(base, col);
    return t ? strtod(t, NULL) : 0;
}

static void pg_result_free(ldg__result *base)
{
    pg_result *r = (pg_result *)base;
    if (!r)
        return;
    PQfreemem(r->blob);
    PQclear(r->res);
    sw_free(r);
}

const ldg__backend ldg__pg_backend = {
    .name = "postgresql",
    .shared = true,
    .jobs_order = "seq",
    .for_update = " FOR UPDATE",
    .ready = pg_ready,
    .close = pg_close,
    .schema_version = pg_schema_version,
    .begin = pg_begin,
    .exec = pg_exec,
    .query = pg_query,
    .next = pg_next,
    .changes = pg_changes,
    .text = pg_text,
    .blob = pg_blob,
    .int64 = pg_col_int64,
    .real = pg_real,
    .is_null = pg_is_null,
    .result_free = pg_result_free,
    .relax = pg_relax,
};
