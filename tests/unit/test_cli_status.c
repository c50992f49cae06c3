/* test_cli_status.c - `spillway status` against a running router (a real
 * `spillway serve` on a unix socket, two managed workers: "gpu" on a
 * sim-gpu pool that crashes after a few tokens, "cpu" that takes the
 * replay): the table names every worker with its state and device and
 * lists the failover; --json is the stats snapshot plus the failover
 * records; the key is asked for and used; an unreachable router and bad
 * options are told apart by the exit status.
 *
 * Each kind of event record as the table shows it, from a router that is
 * a scripted server here (fake_server.h), so every kind is there at once:
 * a failover, a capacity fallback, a routine remote route, a worker
 * started, ready and stopped on demand, a record of a kind this status
 * does not know; and a remote worker's memory as a remote service's.
 */
#include "testutil.h"
#include "fake_server.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "device/device.h"

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define KEY "status-test-key-1"

static char g_model[512];
static char g_pool[64];
static rh_router g_rt;
static char g_url[700];

static int setup(void **state)
{
    (void)state;
    snprintf(g_pool, sizeof g_pool, "cli-status-%d", (int)getpid());
    dev_sim_unlink(g_pool, NULL);
    if (rh_make_model(g_model, sizeof g_model, "cli-status.gguf", 11))
        return -1;
    char workers[1024];
    snprintf(workers, sizeof workers,
             "[worker gpu]\ndevice = sim-gpu:%s\nsim-capacity = 64MiB\nmax-seqs = 2\n"
             "threads = 1\nctx-limit = 512\nfault = abort_after_tokens:2\n"
             "[worker cpu]\nthreads = 1\nctx-limit = 512\n",
             g_pool);
    rh_init(&g_rt, "status", g_model, "api-keys = " KEY "\n", workers);
    if (rh_run(&g_rt, NULL))
        return -1;
    snprintf(g_url, sizeof g_url, "unix:%s", g_rt.sock);
    /* one failover for the table to show */
    wc_response w;
    int rc = rh_req(&g_rt, "POST", "/v1/completions",
                    "Authorization: Bearer " KEY "\r\nX-Request-Id: status-fo-1\r\n",
                    "{\"prompt\":\"Once upon a time\",\"max_tokens\":5,\"temperature\":0}", &w);
    int st = w.status;
    wc_response_free(&w);
    return rc == 0 && st == 200 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    int rc = rh_finish_quiet(&g_rt);
    rh_stop_all();
    dev_sim_unlink(g_pool, NULL);
    remove(g_model);
    return rc;
}

/* Runs `spillway status ARGS...`: its stdout (sw_free) and exit status. */
static char *run_status(int *exit_status, const char *a1, const char *a2, const char *a3,
                        const char *a4, const char *a5)
{
    char *argv[] = {(char *)tu_spillway_bin(), "status", (char *)a1, (char *)a2, (char *)a3,
                    (char *)a4, (char *)a5, NULL};
    char *out = NULL;
    assert_int_equal(tu_run_capture(argv, 60, &out, exit_status), 0);
    assert_non_null(out);
    return out;
}

/* The line of the table that starts with the worker's name. */
static const char *row_of(const char *out, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ')
            return p;
    return NULL;
}

static void test_table(void **state)
{
    (void)state;
    /* the crashed gpu worker back first, for its row to say ready */
    rh_wait_restarted(&g_rt, "gpu", 1);
    int st;
    char *out = run_status(&st, "--router", g_url, "--key", KEY, NULL);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "WORKER"));
    assert_non_null(strstr(out, " ready "));
    const char *gpu = row_of(out, "gpu"), *cpu = row_of(out, "cpu");
    assert_non_null(gpu);
    assert_non_null(cpu);
    char want[128];
    snprintf(want, sizeof want, "sim-gpu:%s", g_pool);
    const char *eol = strchr(gpu, '\n');
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(eol - gpu), gpu);
    assert_non_null(strstr(line, "ready"));
    assert_non_null(strstr(line, want));
    assert_non_null(strstr(line, "MiB/64.0 MiB")); /* the memory bar's figures */
    assert_non_null(strstr(line, "0/2"));          /* seqs of max-seqs */
    assert_non_null(strstr(cpu, "host memory (not counted)"));
    /* the failover, and the activity of the last 10 minutes */
    assert_non_null(strstr(out, "events: 1 since the start"));
    assert_non_null(strstr(out, "failover           status-fo-1  worker_crash on gpu, replay on "
                                "cpu: completed"));
    assert_non_null(strstr(out, "1 requests, 5 tokens, 1 failovers"));
    sw_free(out);
}

static void test_json(void **state)
{
    (void)state;
    int st;
    char *out = run_status(&st, "--router", g_url, "--json", "--key", KEY);
    assert_int_equal(st, 0);
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    if (!j)
        fail_msg("not JSON: %s\n%s", jerr.text, out);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "spillway.stats");
    json_t *ws = json_object_get(j, "workers");
    assert_int_equal(json_array_size(ws), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ws, 0), "name")), "gpu");
    assert_string_equal(json_string_value(json_object_get(json_array_get(ws, 1), "state")),
                        "ready");
    json_t *fo = json_object_get(j, "failovers");
    assert_int_equal(json_array_size(fo), 1);
    assert_int_equal(json_array_size(json_object_get(j, "events")), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(fo, 0), "type")),
                        "failover");
    assert_string_equal(json_string_value(json_object_get(json_array_get(fo, 0), "request_id")),
                        "status-fo-1");
    json_decref(j);
    sw_free(out);
}

static void test_key_and_errors(void **state)
{
    (void)state;
    int st;
    /* no key: refused, exit 1, nothing on stdout */
    unsetenv("SPILLWAY_API_KEY");
    char *out = run_status(&st, "--router", g_url, NULL, NULL, NULL);
    assert_int_equal(st, 1);
    assert_string_equal(out, "");
    sw_free(out);
    /* the key from the environment */
    setenv("SPILLWAY_API_KEY", KEY, 1);
    out = run_status(&st, "--router", g_url, "--json", NULL, NULL);
    unsetenv("SPILLWAY_API_KEY");
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "\"spillway.stats\""));
    sw_free(out);
    /* no router there */
    char gone[700];
    snprintf(gone, sizeof gone, "unix:%s/nobody.sock", g_rt.dir);
    out = run_status(&st, "--router", gone, NULL, NULL, NULL);
    assert_int_equal(st, 1);
    sw_free(out);
    out = run_status(&st, "--bogus", NULL, NULL, NULL, NULL);
    assert_int_equal(st, 2);
    sw_free(out);
    out = run_status(&st, "--watch", "--interval", "0", NULL, NULL);
    assert_int_equal(st, 2);
    sw_free(out);
}

/* --watch --json: one JSON line per refresh until SIGINT, then exit 0. */
static void test_watch(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execl(tu_spillway_bin(), "spillway", "status", "--router", g_url, "--key", KEY, "--json",
              "--watch", "--interval", "0.2", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[1 << 16];
    size_t len = 0;
    int lines = 0;
    double t0 = tu_now_s();
    while (lines < 2 && tu_now_s() - t0 < 30) {
        struct pollfd p = {fds[0], POLLIN, 0};
        if (poll(&p, 1, 1000) <= 0)
            continue;
        ssize_t r = read(fds[0], buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r; i++)
            lines += buf[len + (size_t)i] == '\n';
        len += (size_t)r;
        if (len == sizeof buf - 1)
            len = 0; /* only the count matters */
    }
    assert_true(lines >= 2);
    kill(pid, SIGINT);
    int st = -1;
    t0 = tu_now_s();
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (tu_now_s() - t0 > 20) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("spillway status --watch did not end on SIGINT");
        }
        usleep(20 * 1000);
    }
    close(fds[0]);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* A router's /v1/spillway/stats and /v1/spillway/events, one record of
 * each kind (times 2026-12-06 12:00:0N UTC). */
static void fake_router(fs_server *s, int fd, const char *req, const char *body)
{
    (void)s;
    (void)body;
    static const char stats[] =
        "{\"object\":\"spillway.stats\",\"status\":\"ready\",\"uptime_seconds\":9,"
        "\"events_total\":7,\"queue\":{},\"series\":{},\"workers\":["
        "{\"name\":\"cloud\",\"model\":\"big\",\"state\":\"ready\",\"device\":\"remote\","
        "\"restarts\":0,\"books\":{\"seqs\":0},\"memory\":{\"counted\":false},\"series\":{}},"
        "{\"name\":\"cpu\",\"model\":\"big\",\"state\":\"ready\",\"device\":\"cpu\","
        "\"restarts\":0,\"books\":{\"seqs\":0},\"memory\":{\"counted\":false},\"series\":{}}]}";
    static const char events[] =
        "{\"object\":\"list\",\"data\":["
        "{\"type\":\"failover\",\"request_id\":\"r-fo\",\"received_time\":1796558400,"
        "\"first_error\":{\"worker\":\"gpu\",\"kind\":\"oom\"},\"decision\":\"replay\","
        "\"replay_worker\":\"cpu\",\"outcome\":\"completed\"},"
        "{\"type\":\"capacity_fallback\",\"request_id\":\"r-fb\",\"time\":1796558401,"
        "\"from_model\":\"big\",\"to_model\":\"small\",\"reason\":\"deadline\"},"
        "{\"type\":\"remote_route\",\"request_id\":\"r-rr\",\"time\":1796558402,"
        "\"worker\":\"cloud\",\"model\":\"big\",\"route\":\"routine\"},"
        "{\"type\":\"worker_starting\",\"worker\":\"late\",\"model\":\"big\","
        "\"reason\":\"demand\",\"time\":1796558403},"
        "{\"type\":\"worker_ready\",\"worker\":\"late\",\"model\":\"big\","
        "\"reason\":\"demand\",\"time\":1796558404,\"start_seconds\":1.5},"
        "{\"type\":\"worker_stopped\",\"worker\":\"late\",\"model\":\"big\","
        "\"reason\":\"evicted\",\"for_worker\":\"other\",\"time\":1796558405},"
        "{\"type\":\"something_new\",\"worker\":\"late\",\"time\":1796558406}]}";
    const char *what = strncmp(req, "GET /v1/spillway/events ", 24) ? stats : events;
    fs_send_reply(fd, 200, "application/json", what, strlen(what));
}

/* The line of out that holds needle, into line (asserted present). */
static void line_with(const char *out, const char *needle, char *line, size_t cap)
{
    const char *p = strstr(out, needle);
    if (!p)
        fail_msg("no line with '%s' in:\n%s", needle, out);
    while (p > out && p[-1] != '\n')
        p--;
    const char *eol = strchr(p, '\n');
    snprintf(line, cap, "%.*s", (int)(eol ? eol - p : (long)strlen(p)), p);
}

static void test_event_kinds(void **state)
{
    (void)state;
    fs_server fake;
    fs_start(&fake, "status-fake-router.sock", 4096, false, fake_router);
    char url[700];
    snprintf(url, sizeof url, "unix:%s", fake.path);
    setenv("TZ", "UTC", 1);
    int st;
    char *out = run_status(&st, "--router", url, NULL, NULL, NULL);
    unsetenv("TZ");
    assert_int_equal(st, 0);
    /* the latest 7 (of up to 8), newest first, each as its kind says */
    assert_non_null(strstr(out, "events: 7 since the start; the latest:"));
    char line[512];
    line_with(out, "12:00:06", line, sizeof line);
    assert_non_null(strstr(line, "something_new"));
    line_with(out, "12:00:05", line, sizeof line);
    assert_non_null(strstr(line, "worker stopped"));
    assert_non_null(strstr(line, "late (model big) for other: evicted"));
    line_with(out, "12:00:04", line, sizeof line);
    assert_non_null(strstr(line, "worker ready"));
    assert_non_null(strstr(line, "late (model big) after 1.5 s: demand"));
    line_with(out, "12:00:03", line, sizeof line);
    assert_non_null(strstr(line, "worker starting"));
    line_with(out, "12:00:02", line, sizeof line);
    assert_non_null(strstr(line, "remote route       r-rr  model big to cloud (routine)"));
    line_with(out, "12:00:01", line, sizeof line);
    assert_non_null(strstr(line, "capacity fallback  r-fb  model big to model small: deadline"));
    line_with(out, "12:00:00", line, sizeof line);
    assert_non_null(strstr(line, "failover           r-fo  oom on gpu, replay on cpu: completed"));
    /* nothing reads as a failover but the failover, and no empty fields */
    const char *first = strstr(out, "failover "), *next = first ? strstr(first + 1, "failover ") : NULL;
    assert_non_null(first);
    assert_null(next);
    assert_null(strstr(out, " on , "));
    assert_null(strstr(out, "on none"));
    /* the remote worker's memory is a remote service's */
    assert_non_null(strstr(row_of(out, "cloud"), "remote service (not counted)"));
    assert_non_null(strstr(row_of(out, "cpu"), "host memory (not counted)"));
    sw_free(out);

    /* --json: every event under "events", the failovers alone under
     * "failovers" */
    out = run_status(&st, "--router", url, "--json", NULL, NULL);
    assert_int_equal(st, 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_array_size(json_object_get(j, "events")), 7);
    json_t *fo = json_object_get(j, "failovers");
    assert_int_equal(json_array_size(fo), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(fo, 0), "request_id")),
                        "r-fo");
    json_decref(j);
    sw_free(out);
    fs_stop(&fake);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_key_and_errors),
        cmocka_unit_test(test_watch),
        cmocka_unit_test(test_event_kinds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
