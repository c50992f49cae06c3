/* ledger_bench.c - the ledger's own cost per operation, for bench/ledger.sh:
 * an idempotent request's writes (ldg_idem_begin of a new key, one attempt
 * record, ldg_idem_finish), a job's (insert, ldg_job_claim,
 * ldg_job_finish) and a tool step's (ldg_tool_started, ldg_tool_done), on
 * the ledger ldg_open takes from argv[1] (a directory or a PostgreSQL URL).
 * Prints microseconds per operation; asserts nothing.
 *
 *   ledger_bench WHERE ROUNDS LABEL
 */
#define _POSIX_C_SOURCE 200809L
#include "ledger/ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int fail(const char *what, const sw_error *err)
{
    fprintf(stderr, "ledger_bench: %s: %s\n", what, err->message);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return fprintf(stderr, "usage: ledger_bench WHERE ROUNDS LABEL\n"), 2;
    int n = atoi(argv[2]);
    const char *label = argv[3];
    ldg_ledger *l;
    sw_error err;
    if (ldg_open(argv[1], &l, &err))
        return fail("open", &err);
    char hash[65], rid[80], key[64], id[48];
    ldg_sha256_hex("body", 4, hash);
    int pid = (int)getpid();

    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        ldg_idem_state s;
        ldg_stored st;
        snprintf(key, sizeof key, "bench-%d-%d", pid, i);
        if (ldg_idem_begin(l, key, hash, "req", 1000, 3600, &s, rid, &st, &err))
            return fail("idem begin", &err);
        if (ldg_attempt_add(l, "req", 1, "w", "ok", NULL, 1, 2, &err))
            return fail("attempt", &err);
        if (ldg_idem_finish(l, key, 200, "application/json", false, "{\"x\":1}", 7, 1001, &err))
            return fail("idem finish", &err);
    }
    double idem = (now_s() - t0) / n * 1e6;

    t0 = now_s();
    for (int i = 0; i < n; i++) {
        ldg_job j;
        memset(&j, 0, sizeof j);
        snprintf(j.id, sizeof j.id, "job-%d-%d", pid, i);
        snprintf(j.endpoint, sizeof j.endpoint, "chat");
        j.request = "{}";
        j.deadline_ms = -1;
        j.created = 1000 + i;
        bool got = false;
        int64_t fence = 0;
        if (ldg_job_insert(l, &j, &err) || ldg_job_claim(l, 2000, id, &fence, &got, &err) ||
            !got || ldg_job_finish(l, id, fence, LDG_JOB_SUCCEEDED, "{}", NULL, 2001, &err))
            return fail("job", &err);
    }
    double job = (now_s() - t0) / n * 1e6;

    t0 = now_s();
    for (int i = 0; i < n; i++) {
        bool first;
        snprintf(rid, sizeof rid, "req-%d-%d", pid, i);
        if (ldg_tool_started(l, rid, 1, "t", "c", "{}", 1, &first, &err) ||
            ldg_tool_done(l, rid, 1, "r", 2, &err))
            return fail("tool", &err);
    }
    double tool = (now_s() - t0) / n * 1e6;
    printf("%-12s %6d rounds: idempotent request %7.1f us, job %7.1f us, tool step %7.1f us\n",
           label, n, idem, job, tool);
    ldg_close(l);
    return 0;
}
