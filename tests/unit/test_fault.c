/* test_fault.c - SPILLWAY_FAULT: the parser (and the byte sizes it uses),
 * every mode on the devices it applies to, the environment path, and the
 * counter under threads.
 *
 * abort_after_tokens kills the process, so it runs in children: forked ones
 * for dev_fault_set, and this test binary re-executed with
 * "--fault-child MODE" for the environment variable (read once per
 * process, so it needs a fresh one). Children are waited for with a
 * time-out and die with the test (PR_SET_PDEATHSIG).
 */
#include "testutil.h"

#include "common/alloc.h"
#include "common/units.h"
#include "device/device.h"
#include "device/fault.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHILD_TIMEOUT_MS 20000

static const dev_fault_config no_faults = {.alloc_fail_after = -1,
                                           .alloc_fail_over = 0,
                                           .abort_after_tokens = -1,
                                           .stall_ms = 0,
                                           .device_error_after_tokens = -1};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int wait_child(pid_t pid, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 && errno != EINTR)
            return -1;
        if (mono_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(2000);
    }
}

/* Everything readable from fd until EOF (time-out); NUL-terminated. */
static size_t read_all(int fd, char *buf, size_t cap, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    size_t len = 0;
    while (len + 1 < cap) {
        int left = (int)(deadline - mono_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    return len;
}

/* ---- sizes and parsing -------------------------------------------------------- */

static void test_units(void **state)
{
    (void)state;
    uint64_t v = 0;
    char buf[SW_BYTES_STR_MAX];
    assert_int_equal(sw_parse_bytes("0", &v), SW_OK);
    assert_int_equal(v, 0);
    assert_int_equal(sw_parse_bytes("512", &v), SW_OK);
    assert_int_equal(v, 512);
    assert_int_equal(sw_parse_bytes("512MiB", &v), SW_OK);
    assert_int_equal(v, 512ULL * 1024 * 1024);
    assert_int_equal(sw_parse_bytes("2gib", &v), SW_OK);
    assert_int_equal(v, 2ULL * 1024 * 1024 * 1024);
    assert_int_equal(sw_parse_bytes("3G", &v), SW_OK);
    assert_int_equal(v, 3ULL * 1024 * 1024 * 1024);
    assert_int_equal(sw_parse_bytes("64KiB", &v), SW_OK);
    assert_int_equal(v, 65536);
    assert_int_equal(sw_parse_bytes("5MB", &v), SW_OK);
    assert_int_equal(v, 5000000);
    assert_int_equal(sw_parse_bytes("7b", &v), SW_OK);
    assert_int_equal(v, 7);
    assert_int_equal(sw_parse_bytes("1TiB", &v), SW_OK);
    assert_int_equal(v, 1ULL << 40);
    assert_int_equal(sw_parse_bytes("18446744073709551615", &v), SW_OK);
    assert_true(v == UINT64_MAX);
    v = 42;
    assert_int_equal(sw_parse_bytes("18446744073709551616", &v), SW_ERANGE);
    assert_int_equal(sw_parse_bytes("16777216TiB", &v), SW_ERANGE);
    assert_int_equal(sw_parse_bytes("", &v), SW_EINVAL);
    assert_int_equal(sw_parse_bytes(NULL, &v), SW_EINVAL);
    assert_int_equal(sw_parse_bytes("-1", &v), SW_EINVAL);
    assert_int_equal(sw_parse_bytes(" 1", &v), SW_EINVAL);
    assert_int_equal(sw_parse_bytes("1 MiB", &v), SW_EINVAL);
    assert_int_equal(sw_parse_bytes("1.5GiB", &v), SW_EINVAL);
    assert_int_equal(sw_parse_bytes("12XB", &v), SW_EINVAL);
    assert_int_equal(v, 42); /* untouched on failure */

    assert_string_equal(sw_format_bytes(0, buf, sizeof buf), "0 B");
    assert_string_equal(sw_format_bytes(1023, buf, sizeof buf), "1023 B");
    assert_string_equal(sw_format_bytes(1024, buf, sizeof buf), "1.0 KiB");
    assert_string_equal(sw_format_bytes(1536, buf, sizeof buf), "1.5 KiB");
    assert_string_equal(sw_format_bytes(3ULL << 30, buf, sizeof buf), "3.0 GiB");
    assert_string_equal(sw_format_bytes((1ULL << 20) - 1, buf, sizeof buf), "1.0 MiB");
    assert_string_equal(sw_format_bytes(UINT64_MAX, buf, sizeof buf), "16.0 EiB");
}

static void test_parse_valid(void **state)
{
    (void)state;
    dev_fault_config cfg;
    sw_error err;

    assert_int_equal(dev_fault_parse(NULL, &cfg, &err), SW_OK);
    assert_memory_equal(&cfg, &no_faults, sizeof cfg);
    assert_int_equal(dev_fault_parse("", &cfg, &err), SW_OK);
    assert_memory_equal(&cfg, &no_faults, sizeof cfg);

    assert_int_equal(dev_fault_parse("alloc_fail_after:3", &cfg, &err), SW_OK);
    assert_int_equal(cfg.alloc_fail_after, 3);
    assert_int_equal(cfg.device_error_after_tokens, -1);
    assert_int_equal(dev_fault_parse("device_error_after_tokens:4", &cfg, &err), SW_OK);
    assert_int_equal(cfg.device_error_after_tokens, 4);
    /* The hook reports the device error from the 5th token on, not before. */
    dev_fault_set(&cfg);
    for (int64_t i = 0; i < 4; i++)
        assert_int_equal(dev_fault_before_token(i), SW_OK);
    assert_int_equal(dev_fault_before_token(4), SW_EDEVICE);
    assert_int_equal(dev_fault_before_token(9), SW_EDEVICE);
    dev_fault_set(NULL);
    assert_int_equal(dev_fault_before_token(9), SW_OK);
    assert_int_equal(cfg.alloc_fail_over, 0);
    assert_int_equal(cfg.abort_after_tokens, -1);
    assert_int_equal(cfg.stall_ms, 0);

    assert_int_equal(dev_fault_parse("alloc_fail_after:0,alloc_fail_over:512MiB,"
                                     "abort_after_tokens:7,stall_ms:15", &cfg, &err), SW_OK);
    assert_int_equal(cfg.alloc_fail_after, 0);
    assert_int_equal(cfg.alloc_fail_over, 512ULL * 1024 * 1024);
    assert_int_equal(cfg.abort_after_tokens, 7);
    assert_int_equal(cfg.stall_ms, 15);

    assert_int_equal(dev_fault_parse("stall_ms:250,alloc_fail_over:4096", &cfg, &err), SW_OK);
    assert_int_equal(cfg.alloc_fail_after, -1);
    assert_int_equal(cfg.alloc_fail_over, 4096);
    assert_int_equal(cfg.stall_ms, 250);
}

static void test_parse_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *named; /* the part the message must name */
    } bad[] = {
        {"alloc_fail_after", "alloc_fail_after"},
        {"alloc_fail_after:", "alloc_fail_after"},
        {"alloc_fail_after:-1", "-1"},
        {"alloc_fail_after:3x", "3x"},
        {"bogus:3", "bogus"},
        {"alloc_fail_over:12XB", "12XB"},
        {"alloc_fail_over:0", "alloc_fail_over"},
        {"stall_ms:abc", "abc"},
        {"abort_after_tokens:99999999999999999999", "abort_after_tokens"},
        {"stall_ms:1,,alloc_fail_after:1", "empty"},
        {"stall_ms:1,", "empty"},
        {",stall_ms:1", "empty"},
        {"stall_ms:1,stall_ms:2", "twice"},
        {"stall_ms: 1", " 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dev_fault_config cfg = no_faults;
        cfg.stall_ms = 777; /* untouched on failure */
        sw_error err;
        sw_error_clear(&err);
        int rc = dev_fault_parse(bad[i].text, &cfg, &err);
        if (rc != SW_EINVAL || !strstr(err.message, bad[i].named))
            print_message("'%s' -> %d '%s'\n", bad[i].text, rc, err.message);
        assert_int_equal(rc, SW_EINVAL);
        assert_non_null(strstr(err.message, bad[i].named));
        assert_non_null(strstr(err.message, DEV_FAULT_ENV));
        assert_int_equal(cfg.stall_ms, 777);
    }
}

/* ---- allocation faults on both devices ----------------------------------------- */

static void pool_spec(char *spec, size_t cap, char *name, size_t name_cap, const char *tag)
{
    snprintf(name, name_cap, "t%ld-%s", (long)getpid(), tag);
    snprintf(spec, cap, "sim-gpu:%s", name);
}

static void check_fail_after(const char *spec, uint64_t capacity)
{
    dev_options opts = {.sim_capacity_bytes = capacity};
    dev_device *dev = NULL;
    dev_memory mem;
    sw_error err;
    void *p[4] = {0};

    assert_int_equal(dev_open(spec, &opts, &dev, &err), SW_OK);
    dev_fault_config cfg = no_faults;
    cfg.alloc_fail_after = 2;
    dev_fault_set(&cfg);
    assert_int_equal(dev_alloc(dev, 1000, "a", &p[0], &err), SW_OK);
    assert_int_equal(dev_alloc(dev, 1000, "b", &p[1], &err), SW_OK);
    /* After the first two, every allocation fails, held nothing. */
    assert_int_equal(dev_alloc(dev, 1000, "c", &p[2], &err), SW_EDEVOOM);
    assert_null(p[2]);
    assert_non_null(strstr(err.message, "out of memory"));
    assert_non_null(strstr(err.message, "injected"));
    assert_non_null(strstr(err.message, spec));
    assert_int_equal(dev_alloc(dev, 1, "d", &p[2], &err), SW_EDEVOOM);
    assert_int_equal(dev_memory_info(dev, &mem, &err), SW_OK);
    assert_int_equal(mem.self_bytes, 2000);
    if (capacity)
        assert_int_equal(mem.used_bytes, 2000);
    /* Setting a configuration resets the count: one more, then failures. */
    cfg.alloc_fail_after = 1;
    dev_fault_set(&cfg);
    assert_int_equal(dev_alloc(dev, 1000, "e", &p[2], &err), SW_OK);
    assert_int_equal(dev_alloc(dev, 1000, "f", &p[3], &err), SW_EDEVOOM);
    dev_fault_set(&no_faults);
    assert_int_equal(dev_alloc(dev, 1000, "g", &p[3], &err), SW_OK);
    for (int i = 0; i < 4; i++)
        dev_free(dev, p[i], 1000);
    assert_int_equal(dev_memory_info(dev, &mem, &err), SW_OK);
    assert_int_equal(mem.self_bytes, 0);
    dev_close(dev);
}

static void check_fail_over(const char *spec, uint64_t capacity)
{
    dev_options opts = {.sim_capacity_bytes = capacity};
    dev_device *dev = NULL;
    sw_error err;
    void *a = NULL, *b = NULL, *c = NULL;

    assert_int_equal(dev_open(spec, &opts, &dev, &err), SW_OK);
    dev_fault_config cfg = no_faults;
    assert_int_equal(dev_fault_parse("alloc_fail_over:4KiB", &cfg, &err), SW_OK);
    dev_fault_set(&cfg);
    assert_int_equal(dev_alloc(dev, 4096, "at the limit", &a, &err), SW_OK);
    assert_int_equal(dev_alloc(dev, 4097, "over", &b, &err), SW_EDEVOOM);
    assert_null(b);
    assert_non_null(strstr(err.message, "asked 4097 bytes"));
    assert_non_null(strstr(err.message, "injected"));
    /* Only the large ones fail, however many. */
    for (int i = 0; i < 20; i++) {
        assert_int_equal(dev_alloc(dev, 100, "small", &c, &err), SW_OK);
        dev_free(dev, c, 100);
    }
    dev_fault_set(&no_faults);
    assert_int_equal(dev_alloc(dev, 4097, "over", &b, &err), SW_OK);
    dev_free(dev, a, 4096);
    dev_free(dev, b, 4097);
    dev_close(dev);
}

static void test_alloc_faults_cpu(void **state)
{
    (void)state;
    check_fail_after("cpu", 0);
    check_fail_over("cpu", 0);
    dev_fault_set(&no_faults);
}

static void test_alloc_faults_sim(void **state)
{
    (void)state;
    char spec[80], name[64];
    sw_error err;
    pool_spec(spec, sizeof spec, name, sizeof name, "fault");
    check_fail_after(spec, 1 << 20);
    /* each check's handle was the pool's last: it went with it */
    check_fail_over(spec, 1 << 20);
    dev_fault_set(&no_faults);
    assert_int_equal(dev_sim_unlink(name, &err), SW_ENOTFOUND);
}

typedef struct count_arg {
    int calls;
    int failures;
} count_arg;

static void *count_thread(void *p)
{
    count_arg *arg = p;
    for (int i = 0; i < arg->calls; i++)
        if (dev_fault_alloc_should_fail(16))
            arg->failures++;
    return NULL;
}

/* The count is shared by every thread: exactly the calls past N fail. */
static void test_alloc_fail_after_threads(void **state)
{
    (void)state;
    enum { N_THREADS = 4, CALLS = 2000, AFTER = 3000 };
    pthread_t threads[N_THREADS];
    count_arg args[N_THREADS];
    dev_fault_config cfg = no_faults;
    cfg.alloc_fail_after = AFTER;
    dev_fault_set(&cfg);
    for (int i = 0; i < N_THREADS; i++) {
        args[i] = (count_arg){.calls = CALLS, .failures = 0};
        assert_int_equal(pthread_create(&threads[i], NULL, count_thread, &args[i]), 0);
    }
    int failures = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(threads[i], NULL);
        failures += args[i].failures;
    }
    assert_int_equal(failures, N_THREADS * CALLS - AFTER);
    dev_fault_set(&no_faults);
}

/* ---- token faults ---------------------------------------------------------------- */

/* "Generates" tokens: before each one asks the fault layer, then reports the
 * token on tokens_fd. */
static void generate_tokens(int tokens_fd, int n)
{
    for (int i = 0; i < n; i++) {
        dev_fault_before_token(i);
        if (write(tokens_fd, "t", 1) != 1)
            _exit(20);
    }
}

typedef struct child_result {
    int status;
    int tokens;
    char stderr_text[1024];
} child_result;

/* Runs fn in a child (forked, or argv re-executed when argv is given) with
 * stderr and fd 3 ("tokens") captured. */
static child_result run_child(void (*fn)(int tokens_fd), char *const argv[], char *const envp[])
{
    int tok[2], errp[2];
    child_result res = {0};
    assert_int_equal(pipe(tok), 0);
    assert_int_equal(pipe(errp), 0);
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(99);
        /* Read ends first: one of them may be fd 3 itself. */
        close(tok[0]);
        close(errp[0]);
        dup2(errp[1], 2);
        if (errp[1] != 2 && errp[1] != 3 && errp[1] != tok[1])
            close(errp[1]);
        if (tok[1] != 3) {
            dup2(tok[1], 3);
            close(tok[1]);
        }
        if (argv) {
            execve(argv[0], argv, envp);
            _exit(127);
        }
        fn(3);
        _exit(0);
    }
    close(tok[1]);
    close(errp[1]);
    read_all(errp[0], res.stderr_text, sizeof res.stderr_text, CHILD_TIMEOUT_MS);
    char tokens[256];
    res.tokens = (int)read_all(tok[0], tokens, sizeof tokens, CHILD_TIMEOUT_MS);
    close(tok[0]);
    close(errp[0]);
    res.status = wait_child(pid, CHILD_TIMEOUT_MS);
    return res;
}

static void child_abort_after_3(int tokens_fd)
{
    dev_fault_config cfg = no_faults;
    cfg.abort_after_tokens = 3;
    dev_fault_set(&cfg);
    generate_tokens(tokens_fd, 10);
}

static void child_abort_after_0(int tokens_fd)
{
    dev_fault_config cfg = no_faults;
    cfg.abort_after_tokens = 0;
    dev_fault_set(&cfg);
    generate_tokens(tokens_fd, 10);
}

static void test_abort_after_tokens(void **state)
{
    (void)state;
    child_result res = run_child(child_abort_after_3, NULL, NULL);
    assert_true(WIFSIGNALED(res.status));
    assert_int_equal(WTERMSIG(res.status), SIGABRT);
    assert_int_equal(res.tokens, 3); /* exactly N tokens came out */
    assert_non_null(strstr(res.stderr_text, "spillway: injected fault abort_after_tokens:3\n"));

    res = run_child(child_abort_after_0, NULL, NULL);
    assert_true(WIFSIGNALED(res.status));
    assert_int_equal(WTERMSIG(res.status), SIGABRT);
    assert_int_equal(res.tokens, 0);
    assert_non_null(strstr(res.stderr_text, "abort_after_tokens:0"));
}

static void test_stall(void **state)
{
    (void)state;
    dev_fault_config cfg = no_faults;
    cfg.stall_ms = 60;
    dev_fault_set(&cfg);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dev_fault_before_token(0);
    dev_fault_before_token(1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double elapsed_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    /* Lower bound only: two stalls of 60 ms take at least 120 ms. */
    assert_true(elapsed_ms >= 119.0);
    dev_fault_set(&no_faults);
    dev_fault_before_token(1000000); /* nothing configured: returns */
}

/* ---- from the environment ---------------------------------------------------------- */

static char self_exe[4096];

static child_result run_env_child(const char *mode, const char *fault)
{
    char env_fault[256];
    snprintf(env_fault, sizeof env_fault, "%s=%s", DEV_FAULT_ENV, fault);
    char *argv[] = {self_exe, "--fault-child", (char *)mode, NULL};
    char *envp[] = {env_fault, "SPILLWAY_LOG=info", NULL};
    return run_child(NULL, argv, envp);
}

static void test_from_environment(void **state)
{
    (void)state;
    child_result res = run_env_child("tokens", "abort_after_tokens:2,stall_ms:1");
    assert_true(WIFSIGNALED(res.status));
    assert_int_equal(WTERMSIG(res.status), SIGABRT);
    assert_int_equal(res.tokens, 2);
    assert_non_null(strstr(res.stderr_text, "fault injection active"));
    assert_non_null(strstr(res.stderr_text, "spillway: injected fault abort_after_tokens:2"));

    /* alloc_fail_after from the environment: the child reports through its
     * exit status how many cpu allocations succeeded before the first
     * failure. */
    res = run_env_child("alloc", "alloc_fail_after:3");
    assert_true(WIFEXITED(res.status));
    assert_int_equal(WEXITSTATUS(res.status), 3);

    /* A value that does not parse is logged and ignored. */
    res = run_env_child("tokens", "abort_after_tokens:two");
    assert_true(WIFEXITED(res.status));
    assert_int_equal(WEXITSTATUS(res.status), 0);
    assert_int_equal(res.tokens, 10);
    assert_non_null(strstr(res.stderr_text, "ignoring SPILLWAY_FAULT"));
}

static int fault_child_main(const char *mode)
{
    if (strcmp(mode, "tokens") == 0) {
        generate_tokens(3, 10);
        return 0;
    }
    if (strcmp(mode, "alloc") == 0) {
        dev_device *dev = NULL;
        sw_error err;
        void *p[16];
        int ok = 0;
        if (dev_open("cpu", NULL, &dev, &err) != SW_OK)
            return 100;
        while (ok < 16 && dev_alloc(dev, 64, "child", &p[ok], &err) == SW_OK)
            ok++;
        for (int i = 0; i < ok; i++)
            dev_free(dev, p[i], 64);
        dev_close(dev);
        return ok;
    }
    return 101;
}

/* Removes the pools even when a test failed half-way. */
static int unlink_pools(void **state)
{
    (void)state;
    char spec[80], name[64];
    pool_spec(spec, sizeof spec, name, sizeof name, "fault");
    dev_sim_unlink(name, NULL);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--fault-child") == 0)
        return fault_child_main(argv[2]);
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n > 0)
        self_exe[n] = '\0';

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units),
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_alloc_faults_cpu),
        cmocka_unit_test(test_alloc_faults_sim),
        cmocka_unit_test(test_alloc_fail_after_threads),
        cmocka_unit_test(test_abort_after_tokens),
        cmocka_unit_test(test_stall),
        cmocka_unit_test(test_from_environment),
    };
    dev_fault_set(&no_faults);
    return cmocka_run_group_tests(tests, NULL, unlink_pools);
}
