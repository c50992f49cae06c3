/* ledger-impl.h - what the ledger's functions (ledger.c, written once for
 * both backends) ask of a database backend (ledger_sqlite.c,
 * ledger_pg.c): a lock, transactions, statements with parameters and
 * their rows.
 *
 * SQL is written once, in the dialect both accept, with SQLite's
 * placeholders: "?" numbered in order, or "?N" (never both in one
 * statement); the PostgreSQL backend rewrites them to "$N". Where the
 * dialects differ, ledger.c picks the text by the backend's fields below.
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

/* The backends' openers: fill l->db and migrate (l->be is set). */
int ldg__sqlite_open(ldg_ledger *l, const char *dir, sw_error *err);
int ldg__pg_open(ldg_ledger *l, const char *url, sw_error *err);

extern const ldg__backend ldg__sqlite_backend;
extern const ldg__backend ldg__pg_backend;

#endif
