/* test_ledger_leases.c - several routers on one ledger: two connections
 * (two ldg_open of the same database, each its own owner) racing from
 * threads for one idempotency key, one job and one tool step (exactly one
 * wins each); schema creation by routers starting at once; a lease that
 * expires and is taken over, after which the old owner's writes are
 * refused (SW_ECONFLICT) and write nothing; ldg_renew keeping a lease;
 * ldg_job_claim skipping jobs under live leases (and, on PostgreSQL,
 * rows another transaction holds locked); what ldg_open refuses (a URL
 * with a password, an unreachable server) and the owner it picks. On
 * SQLite, or with "pg" on PostgreSQL (ledger_fixture.h). With
 * "pg-restart": SW_EUNAVAILABLE while a scratch cluster of its own is
 * stopped, success again after it is back.
 */
#include "ledger_fixture.h"

#include "common/alloc.h"
#include "ledger/ledger.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *k_body_hash = "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f";

static void insert_job(ldg_ledger *l, const char *id, double created)
{
    ldg_job j;
    memset(&j, 0, sizeof j);
    snprintf(j.id, sizeof j.id, "%s", id);
    snprintf(j.endpoint, sizeof j.endpoint, "chat");
    j.request = "{}";
    j.deadline_ms = -1;
    j.created = created;
    assert_int_equal(ldg_job_insert(l, &j, NULL), 0);
}

static ldg_idem_state begin_key(ldg_ledger *l, const char *key, const char *rid, double now,
                                char rid_out[80])
{
    ldg_idem_state s;
    ldg_stored st;
    char tmp[80];
    sw_error err;
    sw_error_clear(&err);
    if (ldg_idem_begin(l, key, k_body_hash, rid, now, 3600, &s, rid_out ? rid_out : tmp, &st,
                       &err))
        fail_msg("ldg_idem_begin %s: %s", key, err.message);
    ldg_stored_free(&st);
    return s;
}

/* ---- opening ------------------------------------------------------------ */

/* What needs no server: a URL with a password is refused without echoing
 * it, an unreachable server is SW_EUNAVAILABLE, the default owner names
 * the host and the process, a set one is kept to LDG_OWNER_MAX bytes. */
static void test_open_refusals_and_owner(void **state)
{
    (void)state;
    ldg_ledger *l = NULL;
    sw_error err;
    assert_int_equal(ldg_open("postgresql://spill:s3cret@127.0.0.1:1/db", &l, &err), SW_EINVAL);
    assert_null(l);
    assert_non_null(strstr(err.message, "PGPASSWORD"));
    assert_null(strstr(err.message, "s3cret"));
    assert_int_equal(ldg_open("postgres://127.0.0.1:1/db?password=s3cret", &l, &err), SW_EINVAL);
    assert_null(strstr(err.message, "s3cret"));
    /* port 1 on loopback: nobody listens (refused at once) */
    assert_int_equal(ldg_open("postgresql://spill@127.0.0.1:1/db", &l, &err), SW_EUNAVAILABLE);
    assert_null(l);
    assert_int_equal(ldg_open("", &l, &err), SW_EINVAL);

    l = ldgt_open();
    char host[256] = "";
    gethostname(host, sizeof host);
    const char *owner = ldg_owner(l);
    assert_true(strlen(owner) <= LDG_OWNER_MAX);
    char pid[32];
    snprintf(pid, sizeof pid, ":%ld:", (long)getpid());
    const char *at = strstr(owner, pid);
    assert_non_null(at);
    assert_int_equal(strlen(at + strlen(pid)), 8); /* 8 hex digits */
    assert_int_equal(strncmp(owner, host, (size_t)(at - owner)), 0);
    assert_int_equal(ldg_shared(l), ldgt_pg());
    char long_owner[200];
    memset(long_owner, 'o', sizeof long_owner - 1);
    long_owner[sizeof long_owner - 1] = 0;
    ldg_set_owner(l, long_owner, 0); /* lease_s 0: kept */
    assert_int_equal(strlen(ldg_owner(l)), LDG_OWNER_MAX);
    assert_true(ldg_lease_s(l) == 10);
    ldg_close(l);
}

/* ---- routers starting at once ------------------------------------------- */

static void *open_main(void *arg)
{
    ldg_ledger *l = NULL;
    *(int *)arg = ldg_open(ldgt_where(), &l, NULL);
    if (l) {
        if (ldg_schema_version(l) != LDG_SCHEMA_VERSION)
            *(int *)arg = -100;
        ldg_close(l);
    }
    return NULL;
}

static void test_open_race(void **state)
{
    (void)state;
    enum { N = 4 };
    pthread_t t[N];
    int rc[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_create(&t[i], NULL, open_main, &rc[i]), 0);
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(rc[i], 0);
    }
}

/* ---- races between two connections ---------------------------------------- */

enum { RACE_THREADS = 4, RACE_KEYS = 40, RACE_JOBS = 30 };

typedef struct race {
    ldg_ledger *ledgers[2];
    pthread_barrier_t go;
    pthread_mutex_t mu;
    int key_wins[RACE_KEYS];
    int job_claims[RACE_JOBS];
    int one_job_wins, tool_firsts, errors;
} race;

typedef struct racer {
    race *r;
    int id;
} racer;

static void *race_main(void *arg)
{
    racer *me = arg;
    race *r = me->r;
    ldg_ledger *l = r->ledgers[me->id % 2];
    pthread_barrier_wait(&r->go);
    /* one key after another, every thread at once */
    for (int k = 0; k < RACE_KEYS; k++) {
        char key[32], rid[32], out[80];
        snprintf(key, sizeof key, "key-%d", k);
        snprintf(rid, sizeof rid, "req-%d-%d", me->id, k);
        ldg_idem_state s;
        ldg_stored st;
        int rc = ldg_idem_begin(l, key, k_body_hash, rid, 100, 3600, &s, out, &st, NULL);
        ldg_stored_free(&st);
        pthread_mutex_lock(&r->mu);
        if (rc || (s != LDG_IDEM_NEW && s != LDG_IDEM_RUNNING))
            r->errors++;
        else if (s == LDG_IDEM_NEW)
            r->key_wins[k]++;
        pthread_mutex_unlock(&r->mu);
    }
    pthread_barrier_wait(&r->go);
    /* one job, started by all */
    bool claimed = false;
    int64_t fence;
    int rc = ldg_job_start(l, "job-one", 100, &claimed, &fence, NULL);
    pthread_mutex_lock(&r->mu);
    r->errors += rc != 0;
    r->one_job_wins += claimed;
    pthread_mutex_unlock(&r->mu);
    /* every queued job, claimed until none is left */
    for (;;) {
        char id[48];
        bool got = false;
        if (ldg_job_claim(l, 100, id, &fence, &got, NULL)) {
            pthread_mutex_lock(&r->mu);
            r->errors++;
            pthread_mutex_unlock(&r->mu);
            break;
        }
        if (!got)
            break;
        int n = -1;
        if (sscanf(id, "job-%d", &n) == 1 && n >= 0 && n < RACE_JOBS) {
            pthread_mutex_lock(&r->mu);
            r->job_claims[n]++;
            pthread_mutex_unlock(&r->mu);
        }
    }
    /* one tool step, started by all */
    bool first = false;
    rc = ldg_tool_started(l, "req-tool", 1, "book", "c1", "{}", 100, &first, NULL);
    pthread_mutex_lock(&r->mu);
    r->errors += rc != 0;
    r->tool_firsts += first;
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void test_races(void **state)
{
    (void)state;
    race *r = sw_calloc(1, sizeof *r);
    assert_non_null(r);
    r->ledgers[0] = ldgt_open();
    r->ledgers[1] = ldgt_open();
    assert_string_not_equal(ldg_owner(r->ledgers[0]), ldg_owner(r->ledgers[1]));
    insert_job(r->ledgers[0], "job-one", 1);
    for (int i = 0; i < RACE_JOBS; i++) {
        char id[48];
        snprintf(id, sizeof id, "job-%d", i);
        insert_job(r->ledgers[i % 2], id, 10 + i);
    }
    pthread_barrier_init(&r->go, NULL, RACE_THREADS);
    pthread_mutex_init(&r->mu, NULL);
    pthread_t t[RACE_THREADS];
    racer a[RACE_THREADS];
    for (int i = 0; i < RACE_THREADS; i++) {
        a[i] = (racer){r, i};
        assert_int_equal(pthread_create(&t[i], NULL, race_main, &a[i]), 0);
    }
    for (int i = 0; i < RACE_THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(r->errors, 0);
    for (int k = 0; k < RACE_KEYS; k++)
        assert_int_equal(r->key_wins[k], 1);
    assert_int_equal(r->one_job_wins, 1);
    for (int i = 0; i < RACE_JOBS; i++)
        assert_int_equal(r->job_claims[i], 1);
    assert_int_equal(r->tool_firsts, 1);
    ldg_tool_step ts;
    bool found = false;
    assert_int_equal(ldg_tool_get(r->ledgers[0], "req-tool", 1, &ts, &found, NULL), 0);
    assert_true(found);
    assert_int_equal(ts.calls, RACE_THREADS);
    ldg_tool_step_free(&ts);
    ldg_job j;
    assert_int_equal(ldg_job_get(r->ledgers[1], "job-one", &j, &found, NULL), 0);
    assert_int_equal(j.state, LDG_JOB_RUNNING);
    assert_int_equal(j.attempts, 1);
    ldg_job_free(&j);
    ldg_close(r->ledgers[0]);
    ldg_close(r->ledgers[1]);
    pthread_barrier_destroy(&r->go);
    pthread_mutex_destroy(&r->mu);
    sw_free(r);
}

/* ---- leases ----------------------------------------------------------------- */

/* Router a dies holding a key and a job; b takes both over once the lease
 * ended; a's late writes are refused and change nothing. */
static void test_takeover_and_fences(void **state)
{
    (void)state;
    ldg_ledger *a = ldgt_open(), *b = ldgt_open();
    double lease = ldg_lease_s(a);
    char rid[80];
    sw_error err;
    assert_int_equal(begin_key(a, "k", "req-a", 100, rid), LDG_IDEM_NEW);
    assert_int_equal(begin_key(b, "k", "req-b", 105, rid), LDG_IDEM_RUNNING);
    assert_int_equal(begin_key(b, "k", "req-b", 100 + lease + 0.5, rid), LDG_IDEM_NEW);
    assert_string_equal(rid, "req-a"); /* the run keeps its request id */
    assert_int_equal(begin_key(a, "k", "req-a2", 100 + lease + 1, rid), LDG_IDEM_RUNNING);
    assert_int_equal(ldg_idem_finish(a, "k", 200, "text/plain", false, "late", 4, 111, &err),
                     SW_ECONFLICT);
    assert_int_equal(ldg_idem_drop(a, "k", NULL), SW_ECONFLICT);
    assert_int_equal(ldg_idem_abandon(a, "k", NULL), SW_ECONFLICT);
    ldg_job job;
    memset(&job, 0, sizeof job);
    snprintf(job.id, sizeof job.id, "job-late");
    snprintf(job.endpoint, sizeof job.endpoint, "chat");
    job.request = "{}";
    job.deadline_ms = -1;
    assert_int_equal(ldg_job_insert_idem(a, &job, "k", 202, "application/json", "{}", 2, NULL),
                     SW_ECONFLICT);
    bool found = true;
    ldg_job got;
    assert_int_equal(ldg_job_get(a, "job-late", &got, &found, NULL), 0);
    assert_false(found); /* rolled back with the key's write */
    assert_int_equal(ldg_idem_finish(b, "k", 200, "text/plain", false, "b's", 3, 112, NULL), 0);
    ldg_idem_state s;
    ldg_stored st;
    assert_int_equal(ldg_idem_begin(a, "k", k_body_hash, "req-a3", 113, 3600, &s, rid, &st, NULL), 0);
    assert_int_equal(s, LDG_IDEM_REPLAY);
    assert_int_equal(st.body_len, 3);
    assert_memory_equal(st.body, "b's", 3);
    ldg_stored_free(&st);

    /* a router never takes over its own key, however old its lease */
    assert_int_equal(begin_key(a, "mine", "req-m", 100, rid), LDG_IDEM_NEW);
    assert_int_equal(begin_key(a, "mine", "req-m2", 1000, rid), LDG_IDEM_RUNNING);
    assert_int_equal(begin_key(b, "mine", "req-m3", 1000, rid), LDG_IDEM_NEW);

    /* a job */
    insert_job(a, "job-1", 1);
    bool claimed = false;
    int64_t fa = 0, fb = 0;
    assert_int_equal(ldg_job_start(a, "job-1", 100, &claimed, &fa, NULL), 0);
    assert_true(claimed);
    assert_int_equal(ldg_job_start(b, "job-1", 105, &claimed, &fb, NULL), 0);
    assert_false(claimed);
    assert_int_equal(ldg_job_start(b, "job-1", 100 + lease + 1, &claimed, &fb, NULL), 0);
    assert_true(claimed);
    assert_int_equal(fb, fa + 1);
    bool requeued = true;
    assert_int_equal(ldg_job_requeue(a, "job-1", fa, &requeued, &err), SW_ECONFLICT);
    assert_false(requeued);
    assert_int_equal(ldg_job_finish(a, "job-1", fa, LDG_JOB_SUCCEEDED, "{\"by\":\"a\"}", NULL, 112,
                                    &err),
                     SW_ECONFLICT);
    assert_int_equal(ldg_job_finish(b, "job-1", fb, LDG_JOB_SUCCEEDED, "{\"by\":\"b\"}", NULL, 113,
                                    NULL),
                     0);
    /* and again after its final record: nothing more is written */
    assert_int_equal(ldg_job_finish(b, "job-1", fb, LDG_JOB_FAILED, NULL, "{}", 114, &err),
                     SW_ECONFLICT);
    assert_int_equal(ldg_job_get(a, "job-1", &got, &found, NULL), 0);
    assert_int_equal(got.state, LDG_JOB_SUCCEEDED);
    assert_string_equal(got.response, "{\"by\":\"b\"}");
    assert_int_equal(got.attempts, 2);
    assert_int_equal(got.finish_writes, 1);
    ldg_job_free(&got);
    ldg_close(a);
    ldg_close(b);
}

/* ldg_renew moves the lease of every running key and job of its owner, and
 * nobody else's. */
static void test_renew(void **state)
{
    (void)state;
    ldg_ledger *a = ldgt_open(), *b = ldgt_open();
    ldg_set_owner(a, "router-a", 10);
    ldg_set_owner(b, "router-b", 10);
    assert_string_equal(ldg_owner(a), "router-a");
    assert_true(ldg_lease_s(a) == 10);
    char rid[80];
    assert_int_equal(begin_key(a, "ka", "req-a", 100, rid), LDG_IDEM_NEW);
    assert_int_equal(begin_key(b, "kb", "req-b", 100, rid), LDG_IDEM_NEW);
    insert_job(a, "job-a", 1);
    bool claimed;
    int64_t fence, fb;
    assert_int_equal(ldg_job_start(a, "job-a", 100, &claimed, &fence, NULL), 0);
    assert_true(claimed);
    assert_int_equal(ldg_renew(a, 108, NULL), 0); /* until 118 */
    /* b's own key was not renewed: a takes it over at 110.5 */
    assert_int_equal(begin_key(a, "kb", "req-x", 110.5, rid), LDG_IDEM_NEW);
    assert_string_equal(rid, "req-b");
    assert_int_equal(begin_key(b, "ka", "req-y", 112, rid), LDG_IDEM_RUNNING);
    assert_int_equal(ldg_job_start(b, "job-a", 112, &claimed, &fb, NULL), 0);
    assert_false(claimed);
    char id[48];
    bool got = true;
    assert_int_equal(ldg_job_claim(b, 112, id, &fb, &got, NULL), 0);
    assert_false(got);
    assert_string_equal(id, "");
    /* a stops renewing: past 118 b takes both */
    assert_int_equal(begin_key(b, "ka", "req-y", 118.5, rid), LDG_IDEM_NEW);
    assert_string_equal(rid, "req-a");
    assert_int_equal(ldg_job_claim(b, 118.5, id, &fb, &got, NULL), 0);
    assert_true(got);
    assert_string_equal(id, "job-a");
    assert_int_equal(fb, fence + 1);
    ldg_close(a);
    ldg_close(b);
}

/* ldg_job_claim: the oldest claimable job, never one under a live lease
 * (another's or its own); on PostgreSQL never one another transaction
 * holds locked, and without waiting for it. */
static void test_claim_skips(void **state)
{
    (void)state;
    ldg_ledger *a = ldgt_open(), *b = ldgt_open();
    double lease = ldg_lease_s(a);
    insert_job(a, "j1", 1);
    insert_job(a, "j2", 2);
    insert_job(b, "j3", 3);
    bool claimed, got;
    int64_t f1, f;
    char id[48];
    assert_int_equal(ldg_job_start(a, "j1", 10, &claimed, &f1, NULL), 0);
    assert_true(claimed);
    assert_int_equal(ldg_job_claim(b, 11, id, &f, &got, NULL), 0);
    assert_true(got);
    assert_string_equal(id, "j2");
    assert_int_equal(ldg_job_claim(b, 11, id, &f, &got, NULL), 0);
    assert_string_equal(id, "j3");
    assert_int_equal(ldg_job_claim(b, 11, id, &f, &got, NULL), 0);
    assert_false(got);
    assert_int_equal(ldg_job_claim(a, 11, id, &f, &got, NULL), 0);
    assert_false(got);
    /* a's lease on j1 ended, b's on j2 and j3 not yet */
    double t = 10 + lease + 0.5;
    assert_int_equal(ldg_job_claim(a, t, id, &f, &got, NULL), 0);
    assert_false(got);
    assert_int_equal(ldg_job_claim(b, t, id, &f, &got, NULL), 0);
    assert_true(got);
    assert_string_equal(id, "j1");
    assert_int_equal(f, f1 + 1);
    if (ldgt_pg()) {
        insert_job(a, "j4", 4);
        insert_job(a, "j5", 5);
        PGconn *c = ldgt_pg_connect();
        PGresult *res = PQexec(c, "BEGIN; SELECT id FROM jobs WHERE id = 'j4' FOR UPDATE");
        assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
        PQclear(res);
        assert_int_equal(ldg_job_claim(a, t, id, &f, &got, NULL), 0);
        assert_true(got);
        assert_string_equal(id, "j5"); /* j4 is locked: skipped */
        res = PQexec(c, "ROLLBACK");
        PQclear(res);
        PQfinish(c);
        assert_int_equal(ldg_job_claim(a, t, id, &f, &got, NULL), 0);
        assert_string_equal(id, "j4");
    }
    ldg_close(a);
    ldg_close(b);
}

/* ---- PostgreSQL stopped and restarted ------------------------------------- */

static int scratch(const char *cmd, const char *dir)
{
    const char *script = getenv("SPILLWAY_PG_SCRATCH");
    char line[1400];
    snprintf(line, sizeof line, "bash '%s' %s '%s' >/dev/null", script, cmd, dir);
    return system(line);
}

static void pause_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int restart_main(void)
{
    bool ci = getenv("CI") && !strcmp(getenv("CI"), "true");
    const char *script = getenv("SPILLWAY_PG_SCRATCH");
    char dir[600];
    snprintf(dir, sizeof dir, "%s", tu_tmp_path("pg-restart"));
    if (!script)
        return fprintf(stderr, "SPILLWAY_PG_SCRATCH is not set (ctest sets it)\n"), 1;
    scratch("fixture-stop", dir);
    int st = scratch("start", dir);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        fprintf(stderr, "test_ledger_pg_restart: PostgreSQL is not installed: run "
                        "scripts/install-deps.sh (Debian's postgresql)\n");
        return ci ? 1 : 77;
    }
    if (st != 0)
        return fprintf(stderr, "pg-scratch.sh start %s failed\n", dir), 1;
    char path[700], url[512] = "";
    snprintf(path, sizeof path, "%s/url", dir);
    FILE *f = fopen(path, "r");
    if (!f || !fgets(url, sizeof url, f))
        return fprintf(stderr, "no %s\n", path), 1;
    fclose(f);
    url[strcspn(url, "\n")] = 0;
    int failures = 0;
#define CHECK(cond)                                                                             \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "test_ledger_pg_restart: line %d: %s failed\n", __LINE__, #cond);  \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)
    ldg_ledger *l = NULL;
    sw_error err;
    CHECK(ldg_open(url, &l, &err) == 0);
    if (!l) {
        scratch("fixture-stop", dir);
        return 1;
    }
    bool first = false;
    CHECK(ldg_tool_started(l, "req", 1, "t", "c", "{}", 1, &first, &err) == 0 && first);
    /* stopped: the next statement finds the connection gone */
    CHECK(scratch("stop", dir) == 0);
    int rc = ldg_tool_started(l, "req", 2, "t", "c", "{}", 2, &first, &err);
    printf("while stopped: %s: %s\n", sw_status_name(rc), err.message);
    CHECK(rc == SW_EUNAVAILABLE);
    CHECK(ldg_tool_done(l, "req", 1, "r", 2, &err) == SW_EUNAVAILABLE);
    pause_s(0.6);
    rc = ldg_job_claim(l, 3, (char[48]){0}, &(int64_t){0}, &(bool){false}, &err);
    printf("reconnect while stopped: %s: %s\n", sw_status_name(rc), err.message);
    CHECK(rc == SW_EUNAVAILABLE);
    /* back (same port): the next call after the 0.5 s pause reconnects */
    CHECK(scratch("start", dir) == 0);
    pause_s(0.6);
    CHECK(ldg_tool_done(l, "req", 1, "r", 4, &err) == 0);
    ldg_tool_step s;
    bool found = false;
    CHECK(ldg_tool_get(l, "req", 1, &s, &found, &err) == 0 && found && s.state == LDG_TOOL_DONE);
    ldg_tool_step_free(&s);
    /* restarted between two calls: the connection the ledger holds is
     * dead, which the next statement finds (SW_EUNAVAILABLE, not SW_EIO) */
    CHECK(scratch("restart", dir) == 0);
    rc = ldg_tool_started(l, "req", 3, "t", "c", "{}", 5, &first, &err);
    printf("after a restart: %s: %s\n", sw_status_name(rc), err.message);
    CHECK(rc == SW_EUNAVAILABLE);
    pause_s(0.6);
    CHECK(ldg_tool_started(l, "req", 3, "t", "c", "{}", 6, &first, &err) == 0 && first);
    ldg_close(l);
    scratch("fixture-stop", dir);
    printf("test_ledger_pg_restart: %s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "pg-restart"))
        return restart_main();
    int rc = ldgt_init(argc, argv);
    if (rc)
        return rc;
    assert_int_equal(ldg_alloc_hook(), 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_refusals_and_owner, ldgt_setup, ldgt_teardown),
        cmocka_unit_test_setup_teardown(test_open_race, ldgt_setup, ldgt_teardown),
        cmocka_unit_test_setup_teardown(test_races, ldgt_setup, ldgt_teardown),
        cmocka_unit_test_setup_teardown(test_takeover_and_fences, ldgt_setup, ldgt_teardown),
        cmocka_unit_test_setup_teardown(test_renew, ldgt_setup, ldgt_teardown),
        cmocka_unit_test_setup_teardown(test_claim_skips, ldgt_setup, ldgt_teardown),
    };
    return cmocka_run_group_tests_name(ldgt_pg() ? "leases on postgresql" : "leases on sqlite",
                                       tests, NULL, NULL);
}
