/* ledger_fixture.h - one ledger test-suite, two backends: the cases of
 * test_ledger and test_ledger_leases run on SQLite (a fresh state
 * directory per case) or, with the argument "pg", on PostgreSQL (a fresh
 * database per case in the scratch cluster whose URL CTest's pg_scratch
 * fixture wrote to $SPILLWAY_PG_URL_FILE; scripts/pg-scratch.sh). Each
 * case creates its database (CREATE DATABASE) and drops it after, so
 * cases and test programs running at once never see each other's rows.
 *
 * Without PostgreSQL the "pg" run skips (exit 77) with a message that
 * says how to get it; under CI=true it fails instead.
 */
#ifndef SPILLWAY_TESTS_LEDGER_FIXTURE_H
#define SPILLWAY_TESTS_LEDGER_FIXTURE_H

#include "testutil.h"

#include "ledger/ledger.h"

#include <libpq-fe.h>

/* Reads the mode from argv. 0: run the cases; otherwise the exit code
 * main returns (77 skipped, 1 failed), after a message. */
int ldgt_init(int argc, char **argv);
bool ldgt_pg(void);
/* cmocka setup / teardown of every case: a fresh, empty ledger location */
int ldgt_setup(void **state);
int ldgt_teardown(void **state);
/* What ldg_open takes for this case: the directory or the URL. */
const char *ldgt_where(void);
/* The SQLite case's directory (SQLite-only cases). */
const char *ldgt_dir(void);
/* ldg_open(ldgt_where()) or the case fails. */
ldg_ledger *ldgt_open(void);
/* A connection of its own to the case's PostgreSQL database (PQfinish),
 * or the case fails. */
PGconn *ldgt_pg_connect(void);
/* Runs sql on the case's PostgreSQL database, or the case fails. */
void ldgt_pg_exec(const char *sql);

#endif
