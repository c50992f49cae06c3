/* test_router_startup.c - end-to-end: what `spillway serve` refuses at
 * start-up, with real routers and real workers.
 *
 * - The state directory is one router's: a second router on the same
 *   directory exits 2, naming the first one's pid, and the first one's
 *   worker keeps its pid and serves on; once the first has stopped, the
 *   second starts there.
 * - A configuration the router cannot use exits 2 (docs/router.md): here
 *   an unknown key. (An unset api-key-env variable: test_router_tls.)
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_model[512];

static int setup(void **state)
{
    (void)state;
    return rh_make_model(g_model, sizeof g_model, "router-startup.gguf", 41);
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    return 0;
}

static const char *WORKER = "[worker cpu]\nthreads = 1\nctx-limit = 256\n";
static const char *BODY = "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}";

static void expect_served(const rh_router *r)
{
    wc_response a;
    assert_int_equal(rh_req(r, "POST", "/v1/completions", NULL, BODY, &a), 0);
    assert_int_equal(a.status, 200);
    wc_response_free(&a);
}

static void test_state_dir_locked(void **state)
{
    (void)state;
    rh_router first, second;
    assert_int_equal(rh_start(&first, "lock-first", g_model, NULL, WORKER), 0);
    pid_t worker = rh_worker_pid(&first, "cpu");
    expect_served(&first);

    /* its own socket and log, the first one's state directory */
    char extra[700];
    snprintf(extra, sizeof extra, "state-dir = %s/state\n", first.dir);
    rh_init(&second, "lock-second", g_model, extra, WORKER);
    assert_int_equal(rh_run(&second, NULL), -1);
    assert_int_equal(second.exit_status, 2);
    char *log = tu_read_file(second.log, NULL);
    assert_non_null(log);
    char want[900];
    snprintf(want, sizeof want, "state-dir %s/state is in use by another router (pid %d)",
             first.dir, (int)first.pid);
    if (!strstr(log, want))
        fail_msg("the second router's log lacks '%s':\n%s", want, log);
    sw_free(log);

    /* the first router, its worker and its socket are untouched */
    expect_served(&first);
    assert_int_equal(rh_worker_pid(&first, "cpu"), worker);
    char sock[700];
    assert_int_equal(access(rh_worker_sock(&first, "cpu", sock, sizeof sock), F_OK), 0);
    rh_finish(&first);

    /* the lock goes with the router: now the second starts there */
    rh_init(&second, "lock-second-again", g_model, extra, WORKER);
    mkdir(first.dir, 0700); /* rh_finish removed it; the state dir is made by serve */
    assert_int_equal(rh_run(&second, NULL), 0);
    expect_served(&second);
    rh_finish(&second);
    tu_rm_tree(first.dir);
}

static void test_bad_config_exits_2(void **state)
{
    (void)state;
    rh_router r;
    rh_init(&r, "bad-config", g_model, "no-such-key = 1\n", WORKER);
    assert_int_equal(rh_run(&r, NULL), -1);
    assert_int_equal(r.exit_status, 2);
    rh_stop(&r);
    tu_rm_tree(r.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_dir_locked),
        cmocka_unit_test(test_bad_config_exits_2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
