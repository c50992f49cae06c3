/* test_contrib_systemd.c - contrib/systemd: the sample configuration is
 * one the router accepts, with the unit's state directory, and the unit
 * and the several-routers template (as instance 1) pass `systemd-analyze
 * verify` without a warning (skipped, saying so, where systemd-analyze is
 * not installed). The unit is verified as a copy
 * whose ExecStart and --config name this build's binary and the sample
 * configuration, since verify checks that the command exists.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "router/router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#ifndef SPILLWAY_SOURCE_DIR
#error "SPILLWAY_SOURCE_DIR is set by CMakeLists.txt"
#endif

#define UNIT SPILLWAY_SOURCE_DIR "/contrib/systemd/spillway.service"
#define SAMPLE SPILLWAY_SOURCE_DIR "/contrib/systemd/spillway.ini"
#define TEMPLATE SPILLWAY_SOURCE_DIR "/contrib/systemd/spillway-router@.service"
#define ROUTER_SAMPLE SPILLWAY_SOURCE_DIR "/contrib/systemd/spillway-router.ini"

static void test_sample_config(void **state)
{
    (void)state;
    static rt_config c; /* large: not on the stack */
    sw_error err;
    sw_error_clear(&err);
    rt_config_defaults(&c);
    if (rt_config_load(&c, SAMPLE, &err) || rt_config_check(&c, &err))
        fail_msg("%s: %s", SAMPLE, err.message);
    assert_string_equal(c.state_dir, "/var/lib/spillway");
    assert_string_equal(c.listen, "127.0.0.1:8080");
    assert_int_equal(c.n_workers, 2);
    /* the unit runs the sample and keeps its state where the sample says */
    char *unit = tu_read_file(UNIT, NULL);
    assert_non_null(unit);
    assert_non_null(strstr(unit, "\nStateDirectory=spillway\n"));
    assert_non_null(strstr(unit, "--config /etc/spillway/spillway.ini\n"));
    assert_non_null(strstr(unit, "\nDynamicUser=yes\n"));
    assert_non_null(strstr(unit, "\nNoNewPrivileges=yes\n"));
    assert_non_null(strstr(unit, "\nProtectSystem=strict\n"));
    assert_non_null(strstr(unit, "\nPrivateTmp=yes\n"));
    sw_free(unit);
}

/* The several-routers sample: a router on the shared ledger with its
 * stop delay, unmanaged workers, and the template's state directory. */
static void test_router_sample_config(void **state)
{
    (void)state;
    static rt_config c;
    sw_error err;
    sw_error_clear(&err);
    rt_config_defaults(&c);
    if (rt_config_load(&c, ROUTER_SAMPLE, &err) || rt_config_check(&c, &err))
        fail_msg("%s: %s", ROUTER_SAMPLE, err.message);
    assert_string_equal(c.ledger, "postgresql://spillway@127.0.0.1:5432/spillway");
    assert_string_equal(c.state_dir, "/var/lib/spillway/router-1");
    assert_int_equal(c.stop_delay_ms, 3000);
    assert_int_equal(c.keepalive_timeout_s, 60);
    assert_int_equal(c.n_workers, 2);
    for (int i = 0; i < c.n_workers; i++)
        assert_false(c.workers[i].managed);
}

/* Writes src to dst with every `from` replaced by `to`. */
static char *replace_all(const char *src, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to), n = 0;
    for (const char *p = src; (p = strstr(p, from)); p += fl)
        n++;
    char *out = sw_malloc(strlen(src) + n * tl + 1);
    assert_non_null(out);
    char *o = out;
    for (const char *p = src;;) {
        const char *hit = strstr(p, from);
        if (!hit) {
            strcpy(o, p);
            break;
        }
        memcpy(o, p, (size_t)(hit - p));
        o += hit - p;
        memcpy(o, to, tl);
        o += tl;
        p = hit + fl;
    }
    return out;
}

/* systemd-analyze verify on a copy of unit_path named copy_name, with
 * `from` (the config path in ExecStart) replaced by `to`: silent and 0. */
static void verify_copy(const char *unit_path, const char *copy_name, const char *from,
                        const char *to);

static void test_unit_verifies(void **state)
{
    (void)state;
    verify_copy(UNIT, "spillway.service", "/etc/spillway/spillway.ini", SAMPLE);
}

/* The template, as an instance (verify wants a unit it could start). */
static void test_template_verifies(void **state)
{
    (void)state;
    verify_copy(TEMPLATE, "spillway-router@1.service", "/etc/spillway/router-%i.ini",
                ROUTER_SAMPLE);
    char *unit = tu_read_file(TEMPLATE, NULL);
    assert_non_null(unit);
    assert_non_null(strstr(unit, "\nStateDirectory=spillway/router-%i\n"));
    assert_non_null(strstr(unit, "\nKillSignal=SIGTERM\n"));
    assert_non_null(strstr(unit, "\nRestart=on-failure\n"));
    assert_non_null(strstr(unit, "\nAfter=network-online.target postgresql.service\n"));
    assert_null(strstr(unit, "Requires=postgresql"));
    sw_free(unit);
}

static void verify_copy(const char *unit_path, const char *copy_name, const char *from,
                        const char *to)
{
    char *argv_which[] = {"/bin/sh", "-c", "command -v systemd-analyze", NULL};
    char *where = NULL;
    int st = -1;
    if (tu_run_capture(argv_which, 10, &where, &st) || st != 0 || !where || !*where) {
        sw_free(where);
        printf("SKIP: systemd-analyze is not installed (the systemd package); the unit "
               "was not verified\n");
        skip();
    }
    sw_free(where);
    const char *bin = tu_spillway_bin();
    assert_non_null(bin);
    char *unit = tu_read_file(unit_path, NULL);
    assert_non_null(unit);
    char *a = replace_all(unit, "/usr/local/bin/spillway", bin);
    char *b = replace_all(a, from, to);
    const char *copy = tu_tmp_path(copy_name);
    FILE *f = fopen(copy, "w");
    assert_non_null(f);
    fputs(b, f);
    fclose(f);
    sw_free(unit);
    sw_free(a);
    sw_free(b);
    /* any line it prints is a warning (an unknown key is only warned
     * about): the output must be empty as well as the status 0 */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "systemd-analyze verify '%s' 2>&1", copy);
    char *argv_verify[] = {"/bin/sh", "-c", cmd, NULL};
    char *out = NULL;
    assert_int_equal(tu_run_capture(argv_verify, 60, &out, &st), 0);
    if (st != 0 || (out && *out))
        fail_msg("systemd-analyze verify (status %d):\n%s", st, out ? out : "");
    sw_free(out);
    remove(copy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_config),
        cmocka_unit_test(test_unit_verifies),
        cmocka_unit_test(test_template_verifies),
        cmocka_unit_test(test_router_sample_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
