/* test_router_jobs_shutdown.c - durable jobs at the edges of a router's
 * life, end to end: a real `spillway serve` with a real managed worker,
 * real signals, and the real ledger.db read back (and locked) with
 * SQLite from this process.
 *
 *  - SIGTERM while a long job runs (a worker that stalls 200 ms per
 *    token, 300 tokens: about a minute): the router exits within a bound
 *    far below the job's length, the job is back to queued with its one
 *    attempt counted and the worker attempt recorded as cancelled; a job
 *    that had finished stays as it was and a queued one stays queued.
 *    After a restart every job completes, each final record written once.
 *  - The job's final write fails: another connection holds the ledger's
 *    write lock (BEGIN IMMEDIATE) past SQLite's busy time-out. Held for
 *    one failed write, the retry stores the result; held past every try,
 *    the log says so, the job is not reported done (GET says running, the
 *    jobs metric does not count it), and the next start runs it again and
 *    finishes it once.
 *  - SIGTERM while the runner is stuck in that write: the router exits
 *    without waiting for it, cleanly, and the job runs again after.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-jobs-shutdown.gguf", 11);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    remove(g_model);
    return 0;
}

/* ---- helpers ----------------------------------------------------------------- */

static bool job_in_state(const rh_router *r, const char *id, const char *state)
{
    json_t *j = rh_job_get(r, id);
    bool yes = !strcmp(json_string_value(json_object_get(j, "state")), state);
    json_decref(j);
    return yes;
}

static void job_wait_state(const rh_router *r, const char *id, const char *state, int timeout_s)
{
    double t0 = tu_now_s();
    while (!job_in_state(r, id, state)) {
        if (tu_now_s() - t0 > timeout_s)
            fail_msg("job %s not %s within %d s", id, state, timeout_s);
        usleep(50 * 1000);
    }
}

/* POSTs a completions job of max_tokens tokens; its id (sw_free). */
static char *job_post(const rh_router *r, const char *prompt, int max_tokens)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"endpoint\":\"completions\",\"request\":{\"prompt\":\"%s\",\"max_tokens\":%d,"
             "\"temperature\":0,\"ignore_eos\":true}}",
             prompt, max_tokens);
    wc_response w;
    assert_int_equal(rh_req(r, "POST", "/v1/spillway/jobs", NULL, body, &w), 0);
    if (w.status != 202)
        fail_msg("job POST: %d %s", w.status, w.body);
    json_t *j = rh_body_json(&w);
    char *id = sw_strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    wc_response_free(&w);
    assert_non_null(id);
    return id;
}

typedef struct job_row {
    char state[16];
    int attempts, finish_writes;
    bool has_response;
} job_row;

/* The job's row, read from ledger.db with SQLite itself. */
static job_row ledger_job(const rh_router *r, const char *id)
{
    sqlite3 *db = rh_ledger_open(r, true);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT state, attempts, finish_writes, response IS NOT NULL"
                                        " FROM jobs WHERE id = ?",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    job_row row;
    snprintf(row.state, sizeof row.state, "%s", (const char *)sqlite3_column_text(st, 0));
    row.attempts = sqlite3_column_int(st, 1);
    row.finish_writes = sqlite3_column_int(st, 2);
    row.has_response = sqlite3_column_int(st, 3) != 0;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return row;
}

/* How many worker attempts of request id ended with outcome. */
static int ledger_attempts(const rh_router *r, const char *id, const char *outcome)
{
    sqlite3 *db = rh_ledger_open(r, true);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT count(*) FROM attempts WHERE request_id = ?"
                                        " AND outcome = ?",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, outcome, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* Waits (up to timeout_s) until the router's log contains a line with
 * both a and b. */
static void log_wait(const rh_router *r, const char *a, const char *b, int timeout_s)
{
    double t0 = tu_now_s();
    for (;;) {
        char *log = tu_read_file(r->log, NULL);
        bool found = false;
        for (char *line = log; line && *line && !found;) {
            char *nl = strchr(line, '\n');
            if (nl)
                *nl = 0;
            found = strstr(line, a) && strstr(line, b);
            line = nl ? nl + 1 : NULL;
        }
        sw_free(log);
        if (found)
            return;
        if (tu_now_s() - t0 > timeout_s)
            fail_msg("no log line with '%s' and '%s' in %s within %d s", a, b, r->log, timeout_s);
        usleep(100 * 1000);
    }
}

/* spillway_router_jobs_total{outcome="succeeded"} from /metrics. */
static long jobs_succeeded_metric(const rh_router *r)
{
    wc_response w;
    assert_int_equal(rh_req(r, "GET", "/metrics", NULL, NULL, &w), 0);
    assert_int_equal(w.status, 200);
    static const char k[] = "spillway_router_jobs_total{outcome=\"succeeded\"} ";
    const char *p = strstr(w.body, k);
    assert_non_null(p);
    long n = strtol(p + strlen(k), NULL, 10);
    wc_response_free(&w);
    return n;
}

/* Rewrites the router's configuration without the worker's stall, for
 * the restart on the same state directory. */
static void drop_stall(const rh_router *r, const char *stall_line)
{
    char *cfg = tu_read_file(r->cfg, NULL);
    assert_non_null(cfg);
    char *at = strstr(cfg, stall_line);
    assert_non_null(at);
    FILE *f = fopen(r->cfg, "w");
    assert_non_null(f);
    fwrite(cfg, 1, (size_t)(at - cfg), f);
    fputs(at + strlen(stall_line), f);
    fclose(f);
    sw_free(cfg);
}

static long completion_tokens(json_t *job)
{
    return (long)json_integer_value(json_object_get(
        json_object_get(json_object_get(job, "response"), "usage"), "completion_tokens"));
}

/* Waits up to timeout_s for job id to end: succeeded, with that many
 * completion tokens, after that many attempts. */
static void assert_job_succeeded(const rh_router *r, const char *id, int timeout_s, long tokens,
                                 int attempts)
{
    json_t *j = rh_job_wait_end(r, id, timeout_s);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "succeeded");
    assert_int_equal(completion_tokens(j), tokens);
    assert_int_equal(json_integer_value(json_object_get(j, "attempts")), attempts);
    json_decref(j);
}

/* Starts a router with one job runner and one worker slowed by stall
 * (a "fault = stall_ms:N" line, which drop_stall takes out again). */
static void start_stalled(rh_router *r, const char *name, const char *stall)
{
    char rest[256];
    snprintf(rest, sizeof rest, "[worker cpu]\nthreads = 1\nctx-limit = 1024\n%s", stall);
    assert_int_equal(rh_start(r, name, g_model, "job-workers = 1\n", rest), 0);
}

/* ---- SIGTERM with a long job running ----------------------------------------- */

static void test_sigterm_cancels_running_job(void **state)
{
    (void)state;
    static const char stall[] = "fault = stall_ms:200\n";
    rh_router r;
    start_stalled(&r, "jobs-sigterm", stall);

    /* done before the shutdown: must stay done, not run again */
    char *done = job_post(&r, "Done before", 2);
    json_t *jd = rh_job_wait_end(&r, done, 60);
    assert_string_equal(json_string_value(json_object_get(jd, "state")), "succeeded");
    json_decref(jd);
    /* 300 tokens x 200 ms: about a minute of generation */
    char *lng = job_post(&r, "A long one", 300);
    char *waiting = job_post(&r, "Behind it", 3);
    job_wait_state(&r, lng, "running", 60);
    /* let its worker request get going */
    usleep(1000 * 1000);
    assert_true(job_in_state(&r, waiting, "queued"));

    assert_int_equal(kill(r.pid, SIGTERM), 0);
    /* A bound, not a speed figure: the job alone would hold a router that
     * waits for it for about a minute (the promise is 2 s plus the
     * workers' exit). */
    int st = rh_wait_exit(&r, 30);
    if (st < 0)
        fail_msg("the router did not exit within 30 s of SIGTERM with a job running (log %s)",
                 r.log);
    assert_int_equal(st, 0);

    /* the long job: back to queued, its attempt counted, no final record */
    job_row row = ledger_job(&r, lng);
    assert_string_equal(row.state, "queued");
    assert_int_equal(row.attempts, 1);
    assert_int_equal(row.finish_writes, 0);
    assert_false(row.has_response);
    /* its worker request was given up (the relay recorded it), not run out */
    assert_int_equal(ledger_attempts(&r, lng, "cancelled"), 1);
    assert_int_equal(ledger_attempts(&r, lng, "ok"), 0);
    log_wait(&r, lng, "cancelled by the shutdown", 1);
    row = ledger_job(&r, done);
    assert_string_equal(row.state, "succeeded");
    assert_int_equal(row.attempts, 1);
    assert_int_equal(row.finish_writes, 1);
    row = ledger_job(&r, waiting);
    assert_string_equal(row.state, "queued");
    assert_int_equal(row.attempts, 0);

    /* the next start (same state directory, the worker no longer slowed)
     * completes both, once each; the finished one is left alone */
    drop_stall(&r, stall);
    assert_int_equal(rh_run(&r, NULL), 0);
    assert_job_succeeded(&r, lng, 120, 300, 2);
    assert_job_succeeded(&r, waiting, 60, 3, 1);
    assert_int_equal(ledger_job(&r, lng).finish_writes, 1);
    assert_int_equal(ledger_job(&r, waiting).finish_writes, 1);
    row = ledger_job(&r, done);
    assert_int_equal(row.attempts, 1);
    assert_int_equal(row.finish_writes, 1);
    assert_int_equal(ledger_attempts(&r, done, "ok"), 1);
    sw_free(done);
    sw_free(lng);
    sw_free(waiting);
    rh_finish(&r);
}

/* ---- the final write fails ------------------------------------------------------ */

/* Takes the ledger's write lock from this process (another connection, as
 * a backup tool or an operator's sqlite3 could); the router's writes then
 * wait its busy time-out (5 s) and fail with SQLITE_BUSY. */
static sqlite3 *lock_ledger(const rh_router *r)
{
    sqlite3 *db = rh_ledger_open(r, true);
    char *msg = NULL;
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("BEGIN IMMEDIATE: %s", msg);
    return db;
}

static void unlock_ledger(sqlite3 *db)
{
    assert_int_equal(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

/* Posts a 100-token job and, while it runs, holds the ledger's write lock
 * until the router says its first result write failed; the lock, for
 * unlock_ledger. */
static sqlite3 *post_blocked_write(const rh_router *r, const char *prompt, char **id)
{
    *id = job_post(r, prompt, 100);
    job_wait_state(r, *id, "running", 60);
    sqlite3 *lock = lock_ledger(r);
    log_wait(r, *id, "writing its result failed (try 1 of", 60);
    return lock;
}

static void test_finish_write_fails(void **state)
{
    (void)state;
    static const char stall[] = "fault = stall_ms:30\n";
    rh_router r;
    start_stalled(&r, "jobs-finish-fail", stall);

    /* held for one failed write: the retry stores the result */
    /* 100 tokens x 30 ms: time to take the lock while it generates */
    char *brief = NULL;
    sqlite3 *lock = post_blocked_write(&r, "Brief lock", &brief);
    unlock_ledger(lock);
    json_t *jb = rh_job_wait_end(&r, brief, 60);
    assert_string_equal(json_string_value(json_object_get(jb, "state")), "succeeded");
    assert_int_equal(completion_tokens(jb), 100);
    json_decref(jb);
    job_row row = ledger_job(&r, brief);
    assert_int_equal(row.attempts, 1);
    assert_int_equal(row.finish_writes, 1);
    long succeeded = jobs_succeeded_metric(&r);
    assert_int_equal(succeeded, 1);

    /* held past every try: a clear log line, and not done */
    char *stuck = job_post(&r, "Long lock", 100);
    job_wait_state(&r, stuck, "running", 60);
    lock = lock_ledger(&r);
    log_wait(&r, stuck, "could not be written to the ledger", 120);
    assert_true(job_in_state(&r, stuck, "running"));
    assert_int_equal(jobs_succeeded_metric(&r), succeeded);
    unlock_ledger(lock);
    row = ledger_job(&r, stuck);
    assert_string_equal(row.state, "running");
    assert_int_equal(row.finish_writes, 0);
    assert_false(row.has_response);
    /* nothing runs it again in this process: still running a moment on */
    usleep(500 * 1000);
    assert_true(job_in_state(&r, stuck, "running"));
    assert_int_equal(rh_stop(&r), 0);

    /* the next start runs it again and finishes it once */
    drop_stall(&r, stall);
    assert_int_equal(rh_run(&r, NULL), 0);
    assert_job_succeeded(&r, stuck, 60, 100, 2);
    row = ledger_job(&r, stuck);
    assert_int_equal(row.finish_writes, 1);
    /* the first one is not touched by the restart */
    row = ledger_job(&r, brief);
    assert_int_equal(row.attempts, 1);
    assert_int_equal(row.finish_writes, 1);
    sw_free(brief);
    sw_free(stuck);
    rh_finish(&r);
}

/* SIGTERM while a runner is stuck writing a result (the lock held): the
 * router does not wait for it past its grace, exits cleanly (no use of
 * the freed ledger by the runner left behind: the sanitizer build checks
 * that), and the job, still running in the ledger, runs again at the next
 * start and finishes once. */
static void test_sigterm_during_blocked_write(void **state)
{
    (void)state;
    static const char stall[] = "fault = stall_ms:30\n";
    rh_router r;
    start_stalled(&r, "jobs-stuck-stop", stall);
    char *id = NULL;
    sqlite3 *lock = post_blocked_write(&r, "Stuck at the end", &id);
    assert_int_equal(kill(r.pid, SIGTERM), 0);
    int st = rh_wait_exit(&r, 30);
    if (st < 0)
        fail_msg("the router did not exit within 30 s of SIGTERM (log %s)", r.log);
    assert_int_equal(st, 0);
    log_wait(&r, "a job runner is still busy", "not waiting for it", 1);
    unlock_ledger(lock);
    job_row row = ledger_job(&r, id);
    assert_string_equal(row.state, "running");
    assert_int_equal(row.attempts, 1);
    assert_int_equal(row.finish_writes, 0);
    drop_stall(&r, stall);
    assert_int_equal(rh_run(&r, NULL), 0);
    assert_job_succeeded(&r, id, 60, 100, 2);
    assert_int_equal(ledger_job(&r, id).finish_writes, 1);
    sw_free(id);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm_cancels_running_job),
        cmocka_unit_test(test_finish_write_fails),
        cmocka_unit_test(test_sigterm_during_blocked_write),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
