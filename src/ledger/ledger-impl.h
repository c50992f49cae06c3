/* ledger-impl.h - what the ledger's functions (ledger.c, ledger_idem.c,
 * ledger_jobs.c: written once for both backends) ask of a database
 * backend (ledger_sqlite.c, ledger_pg.c): a lock, transactions,
 * statements with parameters and their rows; and the statement helpers
 * those three share.
 *
 * SQL is written once, in the dialect both accept, with SQLite's
 * placeholders: "?" numbered in order, or "?N" (never both in one
 * statement); the PostgreSQL backend rewrites them to "$N". Where the
 * dialects differ, the shared code picks the text by the backend's fields
 * below.
 */
#ifndef SPILLWAY_LEDGER_LEDGER_IMPL_H
#define SPILLWAY_LEDGER_LEDGER_IMPL_H

#include "ledger/ledger.h"

#include <pthread.h>
#include <stdarg.h>

/* One statement's result, read row by row. Each backend's own result
 * struct starts with this. */
typedef struct ldg__result {
    const struct ldg__backend *be;
} ldg__result;

typedef struct ldg__backend {
    const char *name; /* ldg_backend() */
    bool shared;      /* ldg_shared() */
    /* the column that keeps the jobs' insertion order */
    const char *jobs_order;
    /* appended to a SELECT whose rows the transaction will write
     * (PostgreSQL: row locks; SQLite's BEGIN IMMEDIATE already
     * serializes writers) */
    const char *for_update;
    /* Called with the ledger's mutex held, before each function's
     * statements: makes the connection usable (PostgreSQL: reconnects,
     * at most once per 0.5 s). SW_EUNAVAILABLE when it cannot. */
    int (*ready)(ldg_ledger *l, sw_error *err);
    void (*close)(ldg_ledger *l);
    int (*schema_version)(ldg_ledger *l);
    /* BEGIN of a write transaction */
    int (*begin)(ldg_ledger *l, sw_error *err);
    /* a statement without parameters or rows (COMMIT, ROLLBACK) */
    int (*exec)(ldg_ledger *l, const char *sql, sw_error *err);
    /* Runs sql with the parameters fmt describes (s text, NULL binds
     * NULL; b blob: pointer then size_t; i int; I int64_t; d double).
     * *out: its rows (free with result_free), or NULL. *changes (may be
     * NULL): rows it inserted, updated or deleted, once its rows are
     * read (SQLite runs a statement as its rows are stepped). */
    int (*query)(ldg_ledger *l, const char *sql, const char *fmt, va_list ap, ldg__result **out,
                 sw_error *err);
    /* 1: a row is current; 0: no more rows; < 0 an error (err set) */
    int (*next)(ldg_ledger *l, ldg__result *r, sw_error *err);
    int (*changes)(ldg_ledger *l, ldg__result *r);
    /* Columns of the current row: NULL text for SQL NULL, and also when
     * memory ran out making it (is_null tells them apart). */
    const char *(*text)(ldg__result *r, int col);
    const void *(*blob)(ldg__result *r, int col, size_t *len);
    int64_t (*int64)(ldg__result *r, int col);
    double (*real)(ldg__result *r, int col);
    bool (*is_null)(ldg__result *r, int col);
    void (*result_free)(ldg__result *r);
    /* Around ldg_attempt_add (a record that promises nothing): relax and
     * restore durability for that one write. NULL: nothing to do. */
    void (*relax)(ldg_ledger *l, bool relaxed);
} ldg__backend;

struct ldg_ledger {
    const ldg__backend *be;
    void *db; /* the backend's connection state */
    pthread_mutex_t mu;
    char owner[LDG_OWNER_MAX + 1];
    double lease_s;
};

/* ---- statement helpers (defined in ledger.c) ---------------------------- */

/* Takes the ledger's mutex and readies the connection; on failure the
 * mutex is released again. */
int ldg__lock(ldg_ledger *l, sw_error *err);
void ldg__unlock(ldg_ledger *l);
/* Runs sql with its parameters (fmt: as query above); the caller reads
 * the rows with ldg__row and frees *r with ldg__free. */
int ldg__query(ldg_ledger *l, ldg__result **r, sw_error *err, const char *sql, const char *fmt,
               ...);
/* 1 a row, 0 the end, < 0 an error */
int ldg__row(ldg_ledger *l, ldg__result *r, sw_error *err);
void ldg__free(ldg__result *r);
/* Runs a statement whose rows (if any) nobody reads; *changes (may be
 * NULL): the rows it changed. */
int ldg__run(ldg_ledger *l, int *changes, sw_error *err, const char *sql, const char *fmt, ...);
/* A column's text, copied (sw_free); NULL for NULL or out of memory. */
char *ldg__dup(ldg__result *r, int i);
/* "" for NULL; false when the column is not NULL but memory ran out
 * making its text (dst is then ""). */
bool ldg__copy(ldg__result *r, int i, char *dst, size_t cap);
int ldg__oom(sw_error *err);
/* A guarded write on a key changed no row (changes 0): SW_ECONFLICT, it
 * is not running under this owner (ledger_idem.c). */
int ldg__idem_owned(int changes, const char *key, sw_error *err);

static inline int ldg__begin(ldg_ledger *l, sw_error *err) { return l->be->begin(l, err); }
static inline int ldg__commit(ldg_ledger *l, sw_error *err)
{
    return l->be->exec(l, "COMMIT", err);
}
static inline void ldg__rollback(ldg_ledger *l) { l->be->exec(l, "ROLLBACK", NULL); }
static inline const char *ldg__text(ldg__result *r, int i) { return r->be->text(r, i); }
static inline bool ldg__is_null(ldg__result *r, int i) { return r->be->is_null(r, i); }
static inline int64_t ldg__int(ldg__result *r, int i) { return r->be->int64(r, i); }
static inline double ldg__real(ldg__result *r, int i) { return r->be->real(r, i); }

/* The backends' openers: fill l->db and migrate (l->be is set). */
int ldg__sqlite_open(ldg_ledger *l, const char *dir, sw_error *err);
int ldg__pg_open(ldg_ledger *l, const char *url, sw_error *err);

extern const ldg__backend ldg__sqlite_backend;
extern const ldg__backend ldg__pg_backend;

static inline bool ldg__is_sqlite(const ldg_ledger *l) { return l->be == &ldg__sqlite_backend; }

#endif
