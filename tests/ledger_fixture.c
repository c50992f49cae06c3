/* ledger_fixture.c - the two backends of the ledger test-suite
 * (ledger_fixture.h). */
#include "ledger_fixture.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool g_pg;
static char g_base[512];  /* the cluster's URL up to the database name, "/" included */
static char g_dir[512];   /* SQLite */
static char g_dbname[64]; /* PostgreSQL */
static char g_where[640];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    remove(path);
    return 0;
}

int ldgt_init(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "pg"))
        return 0;
    g_pg = true;
    bool ci = getenv("CI") && !strcmp(getenv("CI"), "true");
    const char *file = getenv("SPILLWAY_PG_URL_FILE");
    char url[512] = "";
    FILE *f = file ? fopen(file, "r") : NULL;
    if (f) {
        if (!fgets(url, sizeof url, f))
            url[0] = 0;
        fclose(f);
    }
    url[strcspn(url, "\r\n")] = 0;
    char *slash = strrchr(url, '/');
    if (!url[0] || !slash || slash < strstr(url, "://") + 3) {
        fprintf(stderr,
                "%s: PostgreSQL is not available (no scratch cluster URL in %s): install it "
                "with scripts/install-deps.sh (Debian's postgresql); ctest then starts a "
                "scratch cluster (scripts/pg-scratch.sh)\n",
                argv[0], file ? file : "$SPILLWAY_PG_URL_FILE");
        return ci ? 1 : 77;
    }
    snprintf(g_base, sizeof g_base, "%.*s", (int)(slash - url + 1), url);
    return 0;
}

bool ldgt_pg(void) { return g_pg; }
const char *ldgt_where(void) { return g_where; }
const char *ldgt_dir(void) { return g_dir; }

static void quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static PGconn *connect_db(const char *db)
{
    char url[640];
    snprintf(url, sizeof url, "%s%s", g_base, db);
    PGconn *c = PQconnectdb(url);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("PostgreSQL %s: %s", url, PQerrorMessage(c));
    PQsetNoticeProcessor(c, quiet, NULL); /* "does not exist, skipping" */
    return c;
}

static void exec_on(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType s = PQresultStatus(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(c));
    PQclear(r);
}

int ldgt_setup(void **state)
{
    (void)state;
    static int n;
    n++;
    if (g_pg) {
        snprintf(g_dbname, sizeof g_dbname, "ledger_%d_%d", (int)getpid(), n);
        PGconn *c = connect_db("postgres");
        char sql[160];
        snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s", g_dbname);
        exec_on(c, sql);
        snprintf(sql, sizeof sql, "CREATE DATABASE %s", g_dbname);
        exec_on(c, sql);
        PQfinish(c);
        snprintf(g_where, sizeof g_where, "%s%s", g_base, g_dbname);
        return 0;
    }
    char name[64];
    snprintf(name, sizeof name, "ledger-%d-%d", (int)getpid(), n);
    snprintf(g_dir, sizeof g_dir, "%s", tu_tmp_path(name));
    nftw(g_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    snprintf(g_where, sizeof g_where, "%s", g_dir);
    return mkdir(g_dir, 0700);
}

int ldgt_teardown(void **state)
{
    (void)state;
    if (g_pg) {
        PGconn *c = connect_db("postgres");
        char sql[160];
        snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", g_dbname);
        exec_on(c, sql);
        PQfinish(c);
        return 0;
    }
    nftw(g_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    return 0;
}

ldg_ledger *ldgt_open(void)
{
    ldg_ledger *l = NULL;
    sw_error err;
    sw_error_clear(&err);
    if (ldg_open(g_where, &l, &err))
        fail_msg("ldg_open %s: %s", g_where, err.message);
    assert_string_equal(ldg_backend(l), g_pg ? "postgresql" : "sqlite");
    return l;
}

PGconn *ldgt_pg_connect(void)
{
    return connect_db(g_dbname);
}

void ldgt_pg_exec(const char *sql)
{
    PGconn *c = connect_db(g_dbname);
    exec_on(c, sql);
    PQfinish(c);
}
