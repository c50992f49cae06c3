/* test_ledger.c - the ledger (src/ledger) on a real SQLite file, or with
 * the argument "pg" on a real PostgreSQL database (ledger_fixture.h):
 * SHA-256 against the FIPS 180-4 / NIST example vectors, schema creation
 * and reopen, every API, key expiry, use from several threads at once,
 * and a real crash: a child process records a tool step as started and
 * dies by SIGKILL before "done"; the parent reopens the ledger and finds
 * the step started, and a job the child had claimed still pending. On
 * SQLite only: the file's journal mode, a migration from schema 1, and
 * failed allocations. Several routers on one ledger: test_ledger_leases.
 */
#include "ledger_fixture.h"

#include "common/alloc.h"
#include "ledger/ledger.h"

#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static bool g_first; /* ldg_tool_started's *first, where a case does not look */

#define open_ok ldgt_open
#define setup ldgt_setup
#define teardown ldgt_teardown

static void test_sha256(void **state)
{
    /* FIPS 180-4 examples (NIST CSRC "SHA256.pdf") and the empty string */
    char hex[65];
    ldg_sha256_hex("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    ldg_sha256_hex("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    ldg_sha256_hex(two, strlen(two), hex);
    assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* one million 'a' (crosses many blocks) */
    size_t n = 1000000;
    char *a = sw_malloc(n);
    assert_non_null(a);
    memset(a, 'a', n);
    ldg_sha256_hex(a, n, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    sw_free(a);
    /* the padding boundaries (one or two final blocks); references from
     * Python's hashlib.sha256(b"a" * n) */
    static const struct { size_t n; const char *hex; } edge[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
    };
    char as[65];
    memset(as, 'a', sizeof as);
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        ldg_sha256_hex(as, edge[i].n, hex);
        assert_string_equal(hex, edge[i].hex);
    }
}

static void test_open_migrate_reopen(void **state)
{
    ldg_ledger *l = open_ok();
    assert_int_equal(ldg_schema_version(l), LDG_SCHEMA_VERSION);
    ldg_job j;
    memset(&j, 0, sizeof j);
    snprintf(j.id, sizeof j.id, "job_a");
    snprintf(j.endpoint, sizeof j.endpoint, "chat");
    j.request = "{\"messages\":[]}";
    j.deadline_ms = -1;
    j.created = 100;
    assert_int_equal(ldg_job_insert(l, &j, NULL), 0);
    ldg_close(l);
    /* reopen: no migration again, data kept, WAL mode on the file */
    l = open_ok();
    assert_int_equal(ldg_schema_version(l), LDG_SCHEMA_VERSION);
    ldg_job got;
    bool found;
    assert_int_equal(ldg_job_get(l, "job_a", &got, &found, NULL), 0);
    assert_true(found);
    assert_string_equal(got.request, "{\"messages\":[]}");
    assert_int_equal(got.deadline_ms, -1);
    ldg_job_free(&got);
    ldg_close(l);
    sw_error err;
    if (ldgt_pg()) {
        /* a newer schema is refused, not misread */
        ldgt_pg_exec("UPDATE schema_version SET version = 99");
        assert_int_equal(ldg_open(ldgt_where(), &l, &err), SW_EUNSUPPORTED);
        assert_non_null(strstr(err.message, "99"));
        return;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/ledger.db", ldgt_dir());
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    /* a newer schema is refused, not misread */
    assert_int_equal(sqlite3_exec(db, "PRAGMA user_version=99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(ldg_open(ldgt_where(), &l, &err), SW_EUNSUPPORTED);
    assert_non_null(strstr(err.message, "99"));
}

static void test_idempotency(void **state)
{
    ldg_ledger *l = open_ok();
    ldg_idem_state s;
    ldg_stored st;
    char rid[80];
    char h1[65], h2[65];
    ldg_sha256_hex("body1", 5, h1);
    ldg_sha256_hex("body2", 5, h2);
    assert_int_equal(ldg_idem_begin(l, "k1", h1, "req-1", 1000, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_NEW);
    assert_string_equal(rid, "req-1");
    /* while running */
    assert_int_equal(ldg_idem_begin(l, "k1", h1, "req-2", 1001, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_RUNNING);
    assert_int_equal(ldg_idem_begin(l, "k1", h2, "req-2", 1001, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_MISMATCH);
    /* done: replay with the stored bytes (a NUL inside survives) */
    const char body[] = "{\"a\":1}\0tail";
    assert_int_equal(ldg_idem_finish(l, "k1", 200, "application/json", false, body, sizeof body - 1,
                                     1002, NULL),
                     0);
    assert_int_equal(ldg_idem_begin(l, "k1", h1, "req-3", 1003, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_REPLAY);
    assert_int_equal(st.status, 200);
    assert_string_equal(st.content_type, "application/json");
    assert_string_equal(st.request_id, "req-1");
    assert_false(st.stream);
    assert_int_equal(st.body_len, sizeof body - 1);
    assert_memory_equal(st.body, body, sizeof body - 1);
    ldg_stored_free(&st);
    assert_int_equal(ldg_idem_begin(l, "k1", h2, "req-3", 1003, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_MISMATCH);
    /* expired: a new run with the other body */
    assert_int_equal(ldg_idem_begin(l, "k1", h2, "req-4", 1061, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_NEW);
    assert_string_equal(rid, "req-4");
    /* drop: forgotten, the next one runs */
    assert_int_equal(ldg_idem_drop(l, "k1", NULL), 0);
    assert_int_equal(ldg_idem_begin(l, "k1", h1, "req-5", 1062, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_NEW);
    /* recover: a running key is abandoned; the same body takes it over
     * with the original request id, another body is still a mismatch */
    int n = -1;
    assert_int_equal(ldg_idem_recover(l, &n, NULL), 0);
    ldg_ledger *taker = l;
    double t = 1063;
    if (ldgt_pg()) {
        /* shared: recovery leaves keys alone (other routers run them);
         * another router takes the key over once its lease ended */
        assert_int_equal(n, 0);
        taker = open_ok();
        t = 1062 + ldg_lease_s(l) + 1;
    } else {
        assert_int_equal(n, 1);
    }
    assert_int_equal(ldg_idem_begin(taker, "k1", h2, "req-6", t, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_MISMATCH);
    assert_int_equal(ldg_idem_begin(taker, "k1", h1, "req-6", t, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_NEW);
    assert_string_equal(rid, "req-5");
    if (taker != l)
        ldg_close(taker);
    assert_int_equal(ldg_idem_begin(l, "k1", h1, "req-7", 1064, 60, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_RUNNING);
    /* a stream */
    assert_int_equal(ldg_idem_begin(l, "k2", h1, "req-8", 1064, 10, &s, rid, &st, NULL), 0);
    assert_int_equal(ldg_idem_finish(l, "k2", 200, "text/event-stream", true, "data: x\n\n", 9,
                                     1065, NULL),
                     0);
    assert_int_equal(ldg_idem_begin(l, "k2", h1, "req-9", 1066, 10, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_REPLAY);
    assert_true(st.stream);
    ldg_stored_free(&st);
    /* abandon: only the running key it names; a done key keeps its answer,
     * and the abandoned one is taken over with its original request id */
    assert_int_equal(ldg_idem_begin(l, "k3", h1, "req-10", 1066, 10, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_NEW);
    assert_int_equal(ldg_idem_abandon(l, "k2", NULL), SW_ECONFLICT);
    assert_int_equal(ldg_idem_abandon(l, "k3", NULL), 0);
    assert_int_equal(ldg_idem_begin(l, "k2", h1, "req-11", 1067, 10, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_REPLAY);
    ldg_stored_free(&st);
    assert_int_equal(ldg_idem_begin(l, "k3", h1, "req-11", 1067, 10, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_NEW);
    assert_string_equal(rid, "req-10");
    assert_int_equal(ldg_idem_drop(l, "k3", NULL), 0);
    /* expiry removes exactly the keys past their time */
    assert_int_equal(ldg_idem_expire(l, 1073.5, &n, NULL), 0);
    assert_int_equal(n, 0);
    assert_int_equal(ldg_idem_expire(l, 1074.5, &n, NULL), 0);
    assert_int_equal(n, 1); /* k2 (1064 + 10) */
    assert_int_equal(ldg_idem_expire(l, 1200, &n, NULL), 0);
    assert_int_equal(n, 1); /* k1 */
    ldg_close(l);
}

static void test_attempts_and_tools(void **state)
{
    ldg_ledger *l = open_ok();
    int n;
    assert_int_equal(ldg_attempt_count(l, "r1", &n, NULL), 0);
    assert_int_equal(n, 0);
    assert_int_equal(ldg_attempt_add(l, "r1", 1, "gpu", "worker_crash", "aborted", 1, 2, NULL), 0);
    assert_int_equal(ldg_attempt_add(l, "r1", 2, "cpu", "ok", NULL, 2, 3, NULL), 0);
    assert_int_equal(ldg_attempt_count(l, "r1", &n, NULL), 0);
    assert_int_equal(n, 2);

    ldg_tool_step t;
    bool found = true;
    assert_int_equal(ldg_tool_get(l, "r1", 1, &t, &found, NULL), 0);
    assert_false(found);
    sw_error err;
    assert_int_equal(ldg_tool_done(l, "r1", 1, "x", 5, &err), SW_ENOTFOUND);
    assert_int_equal(ldg_tool_started(l, "r1", 1, "lookup", "call_1", "{\"w\":\"a\"}", 5, &g_first, NULL), 0);
    assert_true(g_first);
    assert_int_equal(ldg_tool_get(l, "r1", 1, &t, &found, NULL), 0);
    assert_true(found);
    assert_int_equal(t.state, LDG_TOOL_STARTED);
    assert_string_equal(t.tool, "lookup");
    assert_string_equal(t.call_id, "call_1");
    assert_string_equal(t.arguments, "{\"w\":\"a\"}");
    assert_null(t.result);
    assert_int_equal(t.calls, 1);
    ldg_tool_step_free(&t);
    /* a re-call (idempotent tool) counts, keeps the first arguments */
    assert_int_equal(ldg_tool_started(l, "r1", 1, "lookup", "call_9", "{}", 6, &g_first, NULL), 0);
    assert_false(g_first);
    assert_int_equal(ldg_tool_done(l, "r1", 1, "result one", 7, NULL), 0);
    assert_int_equal(ldg_tool_get(l, "r1", 1, &t, &found, NULL), 0);
    assert_int_equal(t.state, LDG_TOOL_DONE);
    assert_string_equal(t.result, "result one");
    assert_string_equal(t.arguments, "{\"w\":\"a\"}");
    assert_int_equal(t.calls, 2);
    ldg_tool_step_free(&t);
    /* a done step is not started again */
    assert_int_equal(ldg_tool_started(l, "r1", 1, "lookup", "c", "{}", 8, &g_first, NULL), 0);
    assert_false(g_first);
    assert_int_equal(ldg_tool_get(l, "r1", 1, &t, &found, NULL), 0);
    assert_int_equal(t.state, LDG_TOOL_DONE);
    assert_int_equal(t.calls, 2);
    ldg_tool_step_free(&t);
    /* steps are per request */
    assert_int_equal(ldg_tool_get(l, "r2", 1, &t, &found, NULL), 0);
    assert_false(found);
    ldg_close(l);
}

static void test_jobs(void **state)
{
    ldg_ledger *l = open_ok();
    const char *names[] = {"job_1", "job_2", "job_3"};
    for (int i = 0; i < 3; i++) {
        ldg_job j;
        memset(&j, 0, sizeof j);
        snprintf(j.id, sizeof j.id, "%s", names[i]);
        snprintf(j.endpoint, sizeof j.endpoint, "%s", i == 1 ? "completions" : "chat");
        j.request = "{}";
        j.deadline_ms = i == 2 ? 5000 : -1;
        j.created = 10 + i;
        assert_int_equal(ldg_job_insert(l, &j, NULL), 0);
    }
    char(*ids)[48] = NULL;
    size_t n = 0;
    assert_int_equal(ldg_job_pending(l, &ids, &n, NULL), 0);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(ids[i], names[i]);
    sw_free(ids);
    bool claimed;
    int64_t fence = -1, fence2 = -1;
    assert_int_equal(ldg_job_start(l, "job_1", 20, &claimed, &fence, NULL), 0);
    assert_true(claimed);
    assert_int_equal(fence, 1);
    assert_int_equal(ldg_job_finish(l, "job_1", fence, LDG_JOB_SUCCEEDED, "{\"ok\":1}", NULL, 21, NULL), 0);
    assert_int_equal(ldg_job_start(l, "job_1", 22, &claimed, &fence, NULL), 0);
    assert_false(claimed); /* finished jobs are not run again */
    assert_int_equal(ldg_job_start(l, "job_2", 22, &claimed, &fence, NULL), 0);
    assert_true(claimed);
    /* not again by the owner that runs it, nor (its lease live) by another */
    assert_int_equal(ldg_job_start(l, "job_2", 23, &claimed, &fence2, NULL), 0);
    assert_false(claimed);
    ldg_ledger *l2 = open_ok();
    assert_int_equal(ldg_job_start(l2, "job_2", 23, &claimed, &fence2, NULL), 0);
    assert_false(claimed);
    /* its runner died: past the lease, another owner takes it over */
    assert_int_equal(ldg_job_start(l2, "job_2", 22 + ldg_lease_s(l) + 1, &claimed, &fence2, NULL),
                     0);
    assert_true(claimed);
    assert_int_equal(fence2, fence + 1);
    sw_error err;
    assert_int_equal(ldg_job_finish(l, "job_2", fence, LDG_JOB_SUCCEEDED, "{}", NULL, 24, &err),
                     SW_ECONFLICT);
    assert_int_equal(ldg_job_finish(l2, "job_2", fence2, LDG_JOB_FAILED, NULL, "{\"code\":\"x\"}",
                                    24, NULL),
                     0);
    ldg_close(l2);
    assert_int_equal(ldg_job_finish(l, "job_2", fence2, LDG_JOB_QUEUED, NULL, NULL, 24, NULL), SW_EINVAL);
    assert_int_equal(ldg_job_finish(l, "nope", 1, LDG_JOB_FAILED, NULL, "{}", 24, NULL), SW_ENOTFOUND);
    assert_int_equal(ldg_job_pending(l, &ids, &n, NULL), 0);
    assert_int_equal(n, 1);
    assert_string_equal(ids[0], "job_3");
    sw_free(ids);
    ldg_job j;
    bool found;
    assert_int_equal(ldg_job_get(l, "job_1", &j, &found, NULL), 0);
    assert_true(found);
    assert_int_equal(j.state, LDG_JOB_SUCCEEDED);
    assert_int_equal(j.attempts, 1);
    assert_int_equal(j.finish_writes, 1);
    assert_string_equal(j.response, "{\"ok\":1}");
    assert_null(j.error);
    assert_true(j.started == 20 && j.finished == 21 && j.created == 10);
    ldg_job_free(&j);
    assert_int_equal(ldg_job_get(l, "job_2", &j, &found, NULL), 0);
    assert_int_equal(j.state, LDG_JOB_FAILED);
    assert_int_equal(j.attempts, 2);
    assert_string_equal(j.endpoint, "completions");
    assert_string_equal(j.error, "{\"code\":\"x\"}");
    ldg_job_free(&j);
    assert_int_equal(ldg_job_get(l, "job_3", &j, &found, NULL), 0);
    assert_int_equal(j.state, LDG_JOB_QUEUED);
    assert_int_equal(j.deadline_ms, 5000);
    assert_true(j.started == 0);
    ldg_job_free(&j);
    assert_int_equal(ldg_job_get(l, "job_x", &j, &found, NULL), 0);
    assert_false(found);
    assert_string_equal(ldg_job_state_name(LDG_JOB_RUNNING), "running");
    ldg_close(l);
}

/* Threads sharing one ledger: each inserts its own tool steps and jobs
 * and races on one shared idempotency key; exactly one wins it. */
typedef struct th_arg {
    ldg_ledger *l;
    int id;
    int wins;
    int errors;
} th_arg;

static void *th_main(void *p)
{
    th_arg *a = p;
    char rid[32], hash[65], out[80];
    ldg_sha256_hex("same", 4, hash);
    for (int i = 0; i < 50; i++) {
        snprintf(rid, sizeof rid, "t%d", a->id);
        if (ldg_tool_started(a->l, rid, i + 1, "t", "c", "{}", i, &g_first, NULL) ||
            ldg_tool_done(a->l, rid, i + 1, "r", i, NULL))
            a->errors++;
        ldg_idem_state s;
        ldg_stored st;
        char key[32];
        snprintf(key, sizeof key, "shared-%d", i);
        if (ldg_idem_begin(a->l, key, hash, rid, 1, 100, &s, out, &st, NULL))
            a->errors++;
        else if (s == LDG_IDEM_NEW)
            a->wins++;
        ldg_stored_free(&st);
    }
    return NULL;
}

static void test_threads(void **state)
{
    ldg_ledger *l = open_ok();
    enum { NT = 4 };
    pthread_t t[NT];
    th_arg a[NT];
    for (int i = 0; i < NT; i++) {
        a[i] = (th_arg){l, i, 0, 0};
        assert_int_equal(pthread_create(&t[i], NULL, th_main, &a[i]), 0);
    }
    int wins = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(a[i].errors, 0);
        wins += a[i].wins;
    }
    assert_int_equal(wins, 50); /* each shared key won once */
    for (int i = 0; i < NT; i++) {
        char rid[32];
        snprintf(rid, sizeof rid, "t%d", i);
        ldg_tool_step s;
        bool found;
        assert_int_equal(ldg_tool_get(l, rid, 50, &s, &found, NULL), 0);
        assert_true(found);
        assert_int_equal(s.state, LDG_TOOL_DONE);
        ldg_tool_step_free(&s);
    }
    ldg_close(l);
}

/* A real crash: the child commits "started" (and claims a job), tells the
 * parent through a pipe, and is SIGKILLed while it waits; nothing of a
 * "done" may appear, everything committed must. */
static void test_crash_between_started_and_done(void **state)
{
    ldg_ledger *l = open_ok();
    ldg_job j;
    memset(&j, 0, sizeof j);
    snprintf(j.id, sizeof j.id, "job_crash");
    snprintf(j.endpoint, sizeof j.endpoint, "chat");
    j.request = "{}";
    j.deadline_ms = -1;
    j.created = 1;
    assert_int_equal(ldg_job_insert(l, &j, NULL), 0);
    ldg_close(l);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        ldg_ledger *cl = NULL;
        bool claimed = false;
        int64_t fence;
        if (ldg_open(ldgt_where(), &cl, NULL) || ldg_job_start(cl, "job_crash", 2, &claimed, &fence, NULL) ||
            !claimed || ldg_tool_started(cl, "job_crash", 1, "lookup", "c1", "{}", 2, &g_first, NULL))
            _exit(3);
        if (write(fds[1], "S", 1) != 1)
            _exit(4);
        for (;;)
            pause(); /* killed here, before "done" */
    }
    close(fds[1]);
    char c = 0;
    assert_int_equal(read(fds[0], &c, 1), 1);
    assert_int_equal(c, 'S');
    close(fds[0]);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFSIGNALED(st));
    l = open_ok();
    ldg_tool_step s;
    bool found;
    assert_int_equal(ldg_tool_get(l, "job_crash", 1, &s, &found, NULL), 0);
    assert_true(found);
    assert_int_equal(s.state, LDG_TOOL_STARTED);
    assert_null(s.result);
    ldg_tool_step_free(&s);
    bool jf;
    assert_int_equal(ldg_job_get(l, "job_crash", &j, &jf, NULL), 0);
    assert_true(jf);
    assert_int_equal(j.state, LDG_JOB_RUNNING);
    assert_int_equal(j.attempts, 1);
    ldg_job_free(&j);
    char(*ids)[48] = NULL;
    size_t n = 0;
    assert_int_equal(ldg_job_pending(l, &ids, &n, NULL), 0);
    assert_int_equal(n, 1); /* picked up again after the crash */
    sw_free(ids);
    ldg_close(l);
}

/* Retention: with times chosen around the cut-off (now 1000, retention
 * 100: cut-off 900), exactly the finished and old rows go; a queued or
 * running job, a request named by a key within its TTL, and a request
 * with one recent row stay whole. */
static int count_attempts(ldg_ledger *l, const char *rid)
{
    int n = -1;
    assert_int_equal(ldg_attempt_count(l, rid, &n, NULL), 0);
    return n;
}

static bool step_exists(ldg_ledger *l, const char *rid, int step)
{
    ldg_tool_step ts;
    bool found = false;
    assert_int_equal(ldg_tool_get(l, rid, step, &ts, &found, NULL), 0);
    if (found)
        ldg_tool_step_free(&ts);
    return found;
}

static bool job_exists(ldg_ledger *l, const char *id)
{
    ldg_job j;
    bool found = false;
    assert_int_equal(ldg_job_get(l, id, &j, &found, NULL), 0);
    if (found)
        ldg_job_free(&j);
    return found;
}

/* The fence of its start (0 for a queued job). */
static int64_t add_job(ldg_ledger *l, const char *id, double created, int end_state, double finished)
{
    ldg_job j;
    memset(&j, 0, sizeof j);
    snprintf(j.id, sizeof j.id, "%s", id);
    snprintf(j.endpoint, sizeof j.endpoint, "chat");
    j.request = "{}";
    j.deadline_ms = -1;
    j.created = created;
    assert_int_equal(ldg_job_insert(l, &j, NULL), 0);
    bool claimed;
    int64_t fence = 0;
    if (end_state == LDG_JOB_QUEUED)
        return 0;
    assert_int_equal(ldg_job_start(l, id, created + 1, &claimed, &fence, NULL), 0);
    assert_true(claimed);
    if (end_state != LDG_JOB_RUNNING)
        assert_int_equal(ldg_job_finish(l, id, fence, end_state,
                                        end_state == LDG_JOB_SUCCEEDED ? "{}" : NULL,
                                        end_state == LDG_JOB_FAILED ? "{}" : NULL, finished, NULL),
                         0);
    return fence;
}

static void test_retention_sweep(void **state)
{
    (void)state;
    ldg_ledger *l = open_ok();
    /* jobs: finished old (go), finished recent, queued and running old (stay) */
    add_job(l, "job_old_ok", 100, LDG_JOB_SUCCEEDED, 200);
    add_job(l, "job_old_failed", 100, LDG_JOB_FAILED, 899);
    add_job(l, "job_recent", 100, LDG_JOB_SUCCEEDED, 901);
    add_job(l, "job_queued", 100, LDG_JOB_QUEUED, 0);
    add_job(l, "job_running", 100, LDG_JOB_RUNNING, 0);
    /* requests: old (go), old but one recent attempt, old with a key in
     * its TTL, old with an expired key (key and rows go), a running job's */
    const char *rids[] = {"req_old", "req_mixed", "req_keyed", "req_expired_key", "job_running",
                          "job_old_ok"};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(ldg_attempt_add(l, rids[i], 1, "gpu", "oom", "decode", 100, 110, NULL), 0);
        assert_int_equal(ldg_tool_started(l, rids[i], 1, "lookup", "c1", "{}", 105, &g_first, NULL), 0);
        assert_int_equal(ldg_tool_done(l, rids[i], 1, "r", 106, NULL), 0);
    }
    assert_int_equal(ldg_attempt_add(l, "req_mixed", 2, "cpu", "ok", NULL, 950, 960, NULL), 0);
    /* a step started long ago whose outcome never came, on an old request */
    assert_int_equal(ldg_tool_started(l, "req_old", 2, "book", "c2", "{}", 107, &g_first, NULL), 0);
    ldg_idem_state st;
    char rid_out[80];
    ldg_stored stored;
    assert_int_equal(ldg_idem_begin(l, "key-live", "sha", "req_keyed", 100, 5000, &st, rid_out,
                                    &stored, NULL), 0);
    assert_int_equal(st, LDG_IDEM_NEW);
    assert_int_equal(ldg_idem_finish(l, "key-live", 200, "application/json", false, "{}", 2, 110,
                                     NULL), 0);
    assert_int_equal(ldg_idem_begin(l, "key-expired", "sha", "req_expired_key", 100, 50, &st,
                                    rid_out, &stored, NULL), 0);
    assert_int_equal(ldg_idem_finish(l, "key-expired", 200, "application/json", false, "{}", 2,
                                     110, NULL), 0);

    ldg_sweep_counts c;
    sw_error err;
    assert_int_equal(ldg_retention_sweep(l, 1000, 100, &c, &err), 0);
    assert_int_equal(c.jobs, 2);
    assert_int_equal(c.keys, 1);
    assert_int_equal(c.attempts, 3);   /* req_old, req_expired_key, job_old_ok */
    assert_int_equal(c.tool_calls, 4); /* the same three, req_old's two steps */
    assert_false(job_exists(l, "job_old_ok"));
    assert_false(job_exists(l, "job_old_failed"));
    assert_true(job_exists(l, "job_recent"));
    assert_true(job_exists(l, "job_queued"));
    assert_true(job_exists(l, "job_running"));
    assert_int_equal(count_attempts(l, "req_old"), 0);
    assert_false(step_exists(l, "req_old", 1));
    assert_false(step_exists(l, "req_old", 2));
    assert_int_equal(count_attempts(l, "req_expired_key"), 0);
    assert_int_equal(count_attempts(l, "job_old_ok"), 0);
    assert_int_equal(count_attempts(l, "req_mixed"), 2);
    assert_true(step_exists(l, "req_mixed", 1));
    assert_int_equal(count_attempts(l, "req_keyed"), 1);
    assert_true(step_exists(l, "req_keyed", 1));
    assert_int_equal(count_attempts(l, "job_running"), 1);
    assert_true(step_exists(l, "job_running", 1));
    /* the live key still replays */
    assert_int_equal(ldg_idem_begin(l, "key-live", "sha", "req_other", 1000, 5000, &st, rid_out,
                                    &stored, NULL), 0);
    assert_int_equal(st, LDG_IDEM_REPLAY);
    ldg_stored_free(&stored);
    /* a second sweep at the same time finds nothing more */
    assert_int_equal(ldg_retention_sweep(l, 1000, 100, &c, NULL), 0);
    assert_int_equal(c.jobs + c.keys + c.attempts + c.tool_calls, 0);
    /* later, past every time: the rest of the finished rows go, never the
     * queued or running jobs or what the running job recorded */
    assert_int_equal(ldg_retention_sweep(l, 100000, 100, &c, NULL), 0);
    assert_false(job_exists(l, "job_recent"));
    assert_true(job_exists(l, "job_queued"));
    assert_true(job_exists(l, "job_running"));
    assert_int_equal(count_attempts(l, "req_mixed"), 0);
    assert_int_equal(count_attempts(l, "req_keyed"), 0); /* its key expired at 5100 */
    assert_int_equal(count_attempts(l, "job_running"), 1);
    ldg_close(l);
}

/* A job given up by its runner (shutdown) goes back to queued with its
 * attempt counted; one whose final record is written stays done. */
static void test_job_requeue(void **state)
{
    (void)state;
    ldg_ledger *l = open_ok();
    int64_t cut = add_job(l, "job_cut", 100, LDG_JOB_RUNNING, 0);
    int64_t done = add_job(l, "job_done", 100, LDG_JOB_SUCCEEDED, 150);
    add_job(l, "job_waiting", 100, LDG_JOB_QUEUED, 0);
    bool requeued = false;
    assert_int_equal(ldg_job_requeue(l, "job_cut", cut, &requeued, NULL), 0);
    assert_true(requeued);
    ldg_job j;
    bool found;
    assert_int_equal(ldg_job_get(l, "job_cut", &j, &found, NULL), 0);
    assert_int_equal(j.state, LDG_JOB_QUEUED);
    assert_int_equal(j.attempts, 1);
    assert_int_equal(j.finish_writes, 0);
    ldg_job_free(&j);
    /* a finished job, a queued one and an unknown id are not changed */
    assert_int_equal(ldg_job_requeue(l, "job_done", done, &requeued, NULL), 0);
    assert_false(requeued);
    assert_int_equal(ldg_job_requeue(l, "job_waiting", 0, &requeued, NULL), 0);
    assert_false(requeued);
    assert_int_equal(ldg_job_requeue(l, "job_nope", 1, NULL, NULL), 0);
    assert_int_equal(ldg_job_get(l, "job_done", &j, &found, NULL), 0);
    assert_int_equal(j.state, LDG_JOB_SUCCEEDED);
    assert_string_equal(j.response, "{}");
    assert_int_equal(j.finish_writes, 1);
    ldg_job_free(&j);
    /* the next start takes it up: the second attempt, one final record */
    char(*ids)[48] = NULL;
    size_t n = 0;
    assert_int_equal(ldg_job_pending(l, &ids, &n, NULL), 0);
    assert_int_equal(n, 2);
    assert_string_equal(ids[0], "job_cut");
    assert_string_equal(ids[1], "job_waiting");
    sw_free(ids);
    bool claimed;
    int64_t fence;
    assert_int_equal(ldg_job_start(l, "job_cut", 200, &claimed, &fence, NULL), 0);
    assert_true(claimed);
    assert_int_equal(fence, cut + 1);
    /* the first run's give-up, late: another claim runs it now */
    sw_error err;
    assert_int_equal(ldg_job_requeue(l, "job_cut", cut, &requeued, &err), SW_ECONFLICT);
    assert_false(requeued);
    assert_int_equal(ldg_job_finish(l, "job_cut", fence, LDG_JOB_SUCCEEDED, "{\"r\":2}", NULL, 201, NULL), 0);
    /* a late give-up (the result was written first) leaves it done */
    assert_int_equal(ldg_job_requeue(l, "job_cut", fence, &requeued, NULL), 0);
    assert_false(requeued);
    assert_int_equal(ldg_job_get(l, "job_cut", &j, &found, NULL), 0);
    assert_int_equal(j.state, LDG_JOB_SUCCEEDED);
    assert_int_equal(j.attempts, 2);
    assert_int_equal(j.finish_writes, 1);
    ldg_job_free(&j);
    ldg_close(l);
}

/* Whether some index of table has column as its first column. */
static bool indexed_first(sqlite3 *db, const char *table, const char *column)
{
    char sql[256];
    snprintf(sql, sizeof sql, "PRAGMA index_list(%s)", table);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    bool found = false;
    while (!found && sqlite3_step(st) == SQLITE_ROW) {
        snprintf(sql, sizeof sql, "PRAGMA index_info(\"%s\")", (const char *)sqlite3_column_text(st, 1));
        sqlite3_stmt *ci;
        assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &ci, NULL), SQLITE_OK);
        /* rows in key order: seqno 0 first */
        if (sqlite3_step(ci) == SQLITE_ROW && sqlite3_column_int(ci, 0) == 0 &&
            sqlite3_column_text(ci, 2) && !strcmp((const char *)sqlite3_column_text(ci, 2), column))
            found = true;
        sqlite3_finalize(ci);
    }
    sqlite3_finalize(st);
    return found;
}

/* A ledger file written by the first release (schema version 1, its
 * tables exactly as that release created them, rows in each) is
 * migrated on open: the version goes up, every row is kept and still
 * read and swept right, and the times the retention sweep filters by
 * are indexed. */
static void test_migrate_from_v1(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/ledger.db", ldgt_dir());
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    /* the version 1 schema, as shipped (a fixture: never changes) */
    static const char v1[] =
        "PRAGMA journal_mode=WAL;"
        "BEGIN;"
        "CREATE TABLE idempotency (key TEXT PRIMARY KEY, body_sha256 TEXT NOT NULL,"
        " request_id TEXT NOT NULL, state TEXT NOT NULL CHECK (state IN"
        " ('running','done','abandoned')), status INTEGER, content_type TEXT, response BLOB,"
        " stream INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, expires REAL NOT NULL);"
        "CREATE TABLE attempts (request_id TEXT NOT NULL, attempt INTEGER NOT NULL,"
        " worker TEXT NOT NULL, outcome TEXT NOT NULL, error TEXT, started REAL NOT NULL,"
        " finished REAL NOT NULL);"
        "CREATE INDEX attempts_request ON attempts(request_id);"
        "CREATE TABLE tool_calls (request_id TEXT NOT NULL, step INTEGER NOT NULL,"
        " tool TEXT NOT NULL, call_id TEXT NOT NULL, arguments TEXT NOT NULL, state TEXT NOT NULL"
        " CHECK (state IN ('started','done')), result TEXT, calls INTEGER NOT NULL DEFAULT 1,"
        " started REAL NOT NULL, finished REAL, PRIMARY KEY (request_id, step));"
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, endpoint TEXT NOT NULL, request TEXT NOT NULL,"
        " deadline_ms INTEGER, state TEXT NOT NULL CHECK (state IN"
        " ('queued','running','succeeded','failed')), attempts INTEGER NOT NULL DEFAULT 0,"
        " finish_writes INTEGER NOT NULL DEFAULT 0, response TEXT, error TEXT,"
        " created REAL NOT NULL, started REAL, finished REAL);"
        "CREATE INDEX jobs_state ON jobs(state, created);"
        "INSERT INTO idempotency VALUES ('k1', 'sha', 'req_a', 'done', 200, 'application/json',"
        " X'7B7D', 0, 100, 100000);"
        "INSERT INTO attempts VALUES ('req_a', 1, 'gpu', 'ok', NULL, 100, 110);"
        "INSERT INTO attempts VALUES ('req_old', 1, 'cpu', 'oom', 'decode', 100, 110);"
        "INSERT INTO tool_calls VALUES ('req_old', 1, 'lookup', 'c1', '{}', 'done', 'r', 1,"
        " 105, 106);"
        "INSERT INTO jobs VALUES ('job_done', 'chat', '{}', NULL, 'succeeded', 1, 1, '{\"x\":1}',"
        " NULL, 100, 101, 102);"
        "INSERT INTO jobs VALUES ('job_wait', 'completions', '{\"prompt\":\"p\"}', 5000,"
        " 'queued', 0, 0, NULL, NULL, 103, NULL, NULL);"
        "PRAGMA user_version=1;"
        "COMMIT;";
    char *msg = NULL;
    if (sqlite3_exec(db, v1, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("v1 fixture: %s", msg);
    assert_false(indexed_first(db, "jobs", "finished"));
    sqlite3_close(db);

    ldg_ledger *l = open_ok();
    assert_int_equal(ldg_schema_version(l), LDG_SCHEMA_VERSION);
    assert_true(LDG_SCHEMA_VERSION >= 2);
    /* every row kept and read as before */
    ldg_job j;
    bool found;
    assert_int_equal(ldg_job_get(l, "job_done", &j, &found, NULL), 0);
    assert_true(found);
    assert_int_equal(j.state, LDG_JOB_SUCCEEDED);
    assert_string_equal(j.response, "{\"x\":1}");
    assert_true(j.finished == 102);
    ldg_job_free(&j);
    assert_int_equal(ldg_job_get(l, "job_wait", &j, &found, NULL), 0);
    assert_true(found);
    assert_int_equal(j.state, LDG_JOB_QUEUED);
    assert_int_equal(j.deadline_ms, 5000);
    ldg_job_free(&j);
    int n = 0;
    assert_int_equal(ldg_attempt_count(l, "req_a", &n, NULL), 0);
    assert_int_equal(n, 1);
    assert_true(step_exists(l, "req_old", 1));
    ldg_idem_state st;
    char rid_out[80];
    ldg_stored stored;
    assert_int_equal(ldg_idem_begin(l, "k1", "sha", "req_b", 200, 5000, &st, rid_out, &stored, NULL),
                     0);
    assert_int_equal(st, LDG_IDEM_REPLAY);
    assert_string_equal(stored.body, "{}");
    assert_string_equal(stored.request_id, "req_a");
    ldg_stored_free(&stored);
    /* the sweep on the migrated file: what is old and unkeyed goes */
    ldg_sweep_counts c;
    assert_int_equal(ldg_retention_sweep(l, 1000, 100, &c, NULL), 0);
    assert_int_equal(c.jobs, 1);
    assert_int_equal(c.attempts, 1);
    assert_int_equal(c.tool_calls, 1);
    assert_int_equal(c.keys, 0);
    assert_false(job_exists(l, "job_done"));
    assert_true(job_exists(l, "job_wait"));
    assert_int_equal(count_attempts(l, "req_a"), 1); /* its key is live */
    ldg_close(l);

    /* the times the sweep filters by have an index each */
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_true(indexed_first(db, "jobs", "finished"));
    assert_true(indexed_first(db, "attempts", "finished"));
    assert_true(indexed_first(db, "tool_calls", "finished"));
    assert_true(indexed_first(db, "tool_calls", "started"));
    assert_true(indexed_first(db, "idempotency", "expires"));
    sqlite3_close(db);
    /* opened again: no second migration, the rows still there */
    l = open_ok();
    assert_int_equal(ldg_schema_version(l), LDG_SCHEMA_VERSION);
    assert_true(job_exists(l, "job_wait"));
    ldg_close(l);
}

/* SQLite through the hook (ldg_alloc_hook, in main): every allocation of
 * an idempotency round (a new key, its finish, the replay) fails in turn.
 * Each call then succeeds or says it failed, never with a wrong state (a
 * mismatch, a running key), and the ledger stays usable: a round on a new
 * key right after, unfaulted, goes through (no transaction left open). */
static void test_idem_alloc_failures(void **state)
{
    (void)state;
    ldg_ledger *l = open_ok();
    char h[65];
    ldg_sha256_hex("body", 4, h);
    long k = 0;
    for (;; k++) {
        char key[48], rid[80];
        snprintf(key, sizeof key, "faulted-%ld", k);
        ldg_idem_state s = LDG_IDEM_NEW, s2 = LDG_IDEM_NEW;
        ldg_stored st;
        long before = sw_alloc_count();
        sw_alloc_fail_after(k);
        int rc1 = ldg_idem_begin(l, key, h, "req", 1000, 60, &s, rid, &st, NULL);
        int rc2 = rc1 ? -1
                      : ldg_idem_finish(l, key, 200, "application/json", false, "{}", 2, 1001,
                                        NULL);
        int rc3 = rc2 ? -1 : ldg_idem_begin(l, key, h, "req2", 1002, 60, &s2, rid, &st, NULL);
        bool fired = sw_alloc_count() - before > k;
        sw_alloc_fail_after(-1);
        if (!rc1)
            assert_int_equal(s, LDG_IDEM_NEW);
        if (!rc3) {
            assert_int_equal(s2, LDG_IDEM_REPLAY);
            assert_int_equal(st.body_len, 2);
            assert_memory_equal(st.body, "{}", 2);
            ldg_stored_free(&st);
        }
        if (!fired) {
            assert_true(!rc1 && !rc2 && !rc3);
            break;
        }
        snprintf(key, sizeof key, "after-%ld", k);
        assert_int_equal(ldg_idem_begin(l, key, h, "req", 1000, 60, &s, rid, &st, NULL), 0);
        assert_int_equal(s, LDG_IDEM_NEW);
        assert_int_equal(ldg_idem_finish(l, key, 200, "text/plain", false, "x", 1, 1001, NULL), 0);
        assert_int_equal(ldg_idem_begin(l, key, h, "req", 1002, 60, &s, rid, &st, NULL), 0);
        assert_int_equal(s, LDG_IDEM_REPLAY);
        ldg_stored_free(&st);
    }
    printf("ledger: %ld allocations per idempotency round, each failed in turn\n", k);
    assert_true(k > 10);
    ldg_close(l);
}

/* Stored responses: put, get, replace, delete; the sweep takes old ones
 * but not a background one whose job is still queued. */
static void test_responses(void **state)
{
    (void)state;
    ldg_ledger *l = open_ok();
    ldg_response r;
    bool found = true;
    assert_int_equal(ldg_response_get(l, "resp_a", &r, &found, NULL), 0);
    assert_false(found);
    assert_int_equal(ldg_response_put(l, "resp_a", "[1]", "{\"id\":\"resp_a\"}", NULL, 100, NULL),
                     0);
    assert_int_equal(ldg_response_get(l, "resp_a", &r, &found, NULL), 0);
    assert_true(found);
    assert_string_equal(r.conversation, "[1]");
    assert_string_equal(r.response, "{\"id\":\"resp_a\"}");
    assert_string_equal(r.job_id, "");
    ldg_response_free(&r);
    assert_int_equal(ldg_response_put(l, "resp_a", "[2]", "{}", "job_x", 100, NULL), 0);
    assert_int_equal(ldg_response_get(l, "resp_a", &r, &found, NULL), 0);
    assert_string_equal(r.conversation, "[2]");
    assert_string_equal(r.job_id, "job_x");
    ldg_response_free(&r);
    /* a background response with its job queued, and an old plain one */
    ldg_job j;
    memset(&j, 0, sizeof j);
    snprintf(j.id, sizeof j.id, "job_q");
    snprintf(j.endpoint, sizeof j.endpoint, "chat");
    j.request = "{}";
    j.deadline_ms = -1;
    j.created = 100;
    assert_int_equal(ldg_job_insert(l, &j, NULL), 0);
    assert_int_equal(ldg_response_put(l, "resp_bg", "[]", "{}", "job_q", 100, NULL), 0);
    ldg_sweep_counts c;
    assert_int_equal(ldg_retention_sweep(l, 1000, 10, &c, NULL), 0);
    assert_int_equal(c.responses, 1);
    assert_int_equal(ldg_response_get(l, "resp_a", &r, &found, NULL), 0);
    assert_false(found);
    assert_int_equal(ldg_response_get(l, "resp_bg", &r, &found, NULL), 0);
    assert_true(found);
    ldg_response_free(&r);
    assert_int_equal(ldg_response_delete(l, "resp_bg", &found, NULL), 0);
    assert_true(found);
    assert_int_equal(ldg_response_delete(l, "resp_bg", &found, NULL), 0);
    assert_false(found);
    ldg_close(l);
}

int main(int argc, char **argv)
{
    int rc = ldgt_init(argc, argv);
    if (rc)
        return rc;
    /* SQLite allocates through the hook, as in the binary: before any
     * other SQLite call */
    assert_int_equal(ldg_alloc_hook(), 0);
    const struct CMUnitTest both[] = {
        cmocka_unit_test(test_sha256),
        cmocka_unit_test_setup_teardown(test_open_migrate_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attempts_and_tools, setup, teardown),
        cmocka_unit_test_setup_teardown(test_jobs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_between_started_and_done, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retention_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_requeue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_responses, setup, teardown),
    };
    const struct CMUnitTest sqlite_only[] = {
        cmocka_unit_test_setup_teardown(test_migrate_from_v1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idem_alloc_failures, setup, teardown),
    };
    if (ldgt_pg())
        return cmocka_run_group_tests_name("ledger on postgresql", both, NULL, NULL);
    return cmocka_run_group_tests_name("ledger on sqlite", both, NULL, NULL) |
           cmocka_run_group_tests_name("ledger on sqlite only", sqlite_only, NULL, NULL);
}
