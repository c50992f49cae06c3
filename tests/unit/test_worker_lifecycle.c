/* test_worker_lifecycle.c - end-to-end: the worker's process life.
 *
 * TCP listening with port 0 (the real port is printed), SIGTERM draining
 * (the active stream finishes, new work gets 503 draining, /health says
 * draining, then exit 0), a stop under a burst of signals (Ctrl-C then
 * its router's SIGTERM) that still exits 0 and gives its simulated-GPU
 * pool back, and a startup failure's exit status.
 */
#include "testutil.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_model[512];

static int setup(void **state)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.seed = 9;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("worker-life.gguf"));
    return eng_model_make(&p, g_model, NULL) == 0 && tu_spillway_bin() ? 0 : -1;
}

static int teardown(void **state)
{
    remove(g_model);
    wc_worker_kill_all();
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int tcp_get(int port, const char *path, wc_response *out)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    char req[256], buf[65536];
    size_t len = 0;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n",
                     path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    struct pollfd p = {fd, POLLIN, 0};
    while (len < sizeof buf && poll(&p, 1, 5000) > 0) {
        ssize_t r = read(fd, buf + len, sizeof buf - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    return wc_response_parse(buf, len, out);
}

static void test_tcp_port_zero(void **state)
{
    char logpath[512];
    snprintf(logpath, sizeof logpath, "%s", tu_tmp_path("worker-tcp.log"));
    int port = 0;
    pid_t pid = wc_worker_start_tcp(g_model, logpath, 20, &port);
    assert_true(pid > 0);
    double end = now_s() + 20;
    assert_true(port > 0 && port < 65536);
    wc_response r;
    int status = 0;
    while (now_s() < end) {
        if (tcp_get(port, "/health", &r) == 0) {
            status = r.status;
            wc_response_free(&r);
            if (status == 200)
                break;
        }
        usleep(10000);
    }
    assert_int_equal(status, 200);
    assert_int_equal(tcp_get(port, "/v1/models", &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "spillway-synthetic"));
    wc_response_free(&r);
    kill(pid, SIGTERM);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_sigterm_drains(void **state)
{
    static const char *const args[] = {"--threads", "1", NULL};
    static const char *const env[] = {"SPILLWAY_FAULT=stall_ms:10", NULL};
    wc_worker w;
    static char buf[1 << 16];
    size_t len = 0;
    assert_int_equal(wc_worker_start(&w, g_model, args, env, 30, NULL), 0);
    int fd = wc_connect(w.socket_path, 20000);
    assert_true(fd >= 0);
    assert_int_equal(wc_send(fd, "POST", "/v1/completions",
                             "{\"prompt\":\"Once upon a time\",\"max_tokens\":80,\"stream\":true,"
                             "\"ignore_eos\":true,\"temperature\":0}"),
                     0);
    while (!strstr(buf, "data: ")) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        assert_true(n > 0);
        len += (size_t)n;
        buf[len] = '\0';
    }
    kill(w.pid, SIGTERM);
    /* New work is refused while the stream goes on. */
    wc_response r;
    json_t *j;
    double end = now_s() + 5;
    int st = 0;
    while (now_s() < end) {
        assert_int_equal(wc_request(w.socket_path, "POST", "/v1/completions",
                                    "{\"prompt\":\"Hi\",\"max_tokens\":2}", 5000, &r),
                         0);
        st = r.status;
        j = json_loads(r.body, 0, NULL);
        if (st == 503) {
            assert_string_equal(
                json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                "draining");
            json_decref(j);
            wc_response_free(&r);
            break;
        }
        json_decref(j);
        wc_response_free(&r);
    }
    assert_int_equal(st, 503);
    assert_int_equal(wc_request(w.socket_path, "GET", "/health", NULL, 5000, &r), 0);
    assert_int_equal(r.status, 503);
    j = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "draining");
    json_decref(j);
    wc_response_free(&r);
    /* The stream completes. */
    ssize_t n;
    while ((n = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t)n;
    close(fd);
    int toks[128];
    assert_int_equal(wc_response_parse(buf, len, &r), 0);
    assert_int_equal(wc_tokens_of(&r, true, toks, 128, NULL, NULL, 0), 80);
    wc_response_free(&r);
    int exit_status = wc_worker_wait(&w, 10);
    print_message("worker exit: %d\n", exit_status);
    assert_int_equal(exit_status, 0);
}

/* Ctrl-C reaches a managed worker and its router; the router then sends
 * SIGTERM. However late those land in the worker's stop, it exits 0 and
 * its simulated-GPU pool goes with it (the pool's last user). Each round
 * SIGINTs the worker and then keeps sending SIGTERM until it has exited,
 * so some signal lands after its signal events are gone. */
static void test_signals_while_stopping(void **state)
{
    char pool[64], shm[96];
    snprintf(pool, sizeof pool, "sim-gpu:life-%d", (int)getpid());
    snprintf(shm, sizeof shm, "/dev/shm/spillway-sim-life-%d", (int)getpid());
    const char *const args[] = {"--threads", "1", "--device", pool, "--sim-capacity", "64MiB",
                                NULL};
    for (int round = 0; round < 8; round++) {
        wc_worker w;
        assert_int_equal(wc_worker_start(&w, g_model, args, NULL, 30, NULL), 0);
        assert_int_equal(access(shm, F_OK), 0);
        kill(w.pid, SIGINT);
        int st = 0;
        pid_t r = 0;
        double end = now_s() + 20;
        while ((r = waitpid(w.pid, &st, WNOHANG)) == 0 && now_s() < end) {
            kill(w.pid, SIGTERM);
            usleep(200);
        }
        assert_int_equal(r, w.pid);
        w.pid = 0;
        if (!WIFEXITED(st))
            print_message("round %d: killed by signal %d\n", round, WTERMSIG(st));
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_int_not_equal(access(shm, F_OK), 0); /* the pool went with it */
    }
}

static void test_startup_failure(void **state)
{
    wc_worker w;
    int st = -1;
    const char *missing = tu_tmp_path("no-such-model.gguf");
    char path[512];
    snprintf(path, sizeof path, "%s", missing);
    assert_int_equal(wc_worker_start(&w, path, NULL, NULL, 20, &st), -1);
    assert_int_equal(st, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_port_zero),
        cmocka_unit_test(test_sigterm_drains),
        cmocka_unit_test(test_signals_while_stopping),
        cmocka_unit_test(test_startup_failure),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
