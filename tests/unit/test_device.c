/* test_device.c - the cpu and sim-gpu devices: spec errors, exact pool
 * accounting, pools shared between processes, memory coming back from
 * killed processes (SIGKILL, a lock holder, a reused pid), concurrent
 * creation, and `spillway hog` end to end.
 *
 * Every pool name carries the test's pid and is unlinked by the test; every
 * child gets PR_SET_PDEATHSIG and is waited for with a time-out, so a failed
 * test leaves neither pools nor processes behind.
 */
#include "bin_testutil.h"
#include "testutil.h"

#include "common/alloc.h"
#include "device/device.h"
#include "device/fault.h"
#include "device/sim/sim_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHILD_TIMEOUT_MS 20000

static const char *pool_name(const char *tag)
{
    static char name[64];
    snprintf(name, sizeof name, "t%ld-%s", (long)getpid(), tag);
    return name;
}

static const char *pool_spec(const char *tag)
{
    static char spec[80];
    snprintf(spec, sizeof spec, "sim-gpu:%s", pool_name(tag));
    return spec;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* fork() whose child dies with the test process. */
static pid_t fork_child(void)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(99);
    }
    return pid;
}

/* waitpid with a time-out (the child is killed then); returns the status or
 * -1 on time-out. WNOWAIT-style waiting is done by wait_zombie. */
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

/* Waits until pid has exited without reaping it (it stays a zombie). */
static bool wait_zombie(pid_t pid, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    for (;;) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT | WNOHANG) == 0 && info.si_pid == pid)
            return true;
        if (mono_ms() > deadline)
            return false;
        usleep(2000);
    }
}

/* Reads one byte from fd with a time-out; 1 = got it, 0 = EOF, -1 = timeout. */
static int read_byte(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    int r = poll(&p, 1, timeout_ms);
    if (r <= 0)
        return -1;
    return read(fd, &c, 1) == 1 ? 1 : 0;
}

static dev_device *open_ok(const char *spec, uint64_t capacity)
{
    dev_options opts = {.sim_capacity_bytes = capacity};
    dev_device *dev = NULL;
    sw_error err;
    int rc = dev_open(spec, &opts, &dev, &err);
    if (rc != SW_OK)
        print_message("dev_open(%s): %s\n", spec, err.message);
    assert_int_equal(rc, SW_OK);
    assert_non_null(dev);
    return dev;
}

static dev_memory info_ok(dev_device *dev)
{
    dev_memory mem;
    sw_error err;
    int rc = dev_memory_info(dev, &mem, &err);
    if (rc != SW_OK)
        print_message("dev_memory_info: %s\n", err.message);
    assert_int_equal(rc, SW_OK);
    return mem;
}

/* MemTotal from /proc/meminfo, read here independently of device.c. */
static uint64_t meminfo_total(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    assert_non_null(f);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %llu kB", &kib) == 1)
            break;
    fclose(f);
    assert_true(kib > 0);
    return (uint64_t)kib * 1024;
}

/* ---- specs and the cpu device ---------------------------------------------- */

static void test_bad_specs(void **state)
{
    (void)state;
    static const char *bad[] = {
        "", "gpu", "sim-gpu:", "sim-gpu:bad/name", "cuda:x", "cuda:", "cpu:0", "sim-gpu",
        "sim-gpu:a b", "sim-gpu:0123456789012345678901234567890123456789012345678", "cuda:-1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dev_device *dev = NULL;
        sw_error err;
        sw_error_clear(&err);
        int rc = dev_open(bad[i], NULL, &dev, &err);
        if (rc != SW_EINVAL)
            print_message("spec '%s' gave %d\n", bad[i], rc);
        assert_int_equal(rc, SW_EINVAL);
        assert_null(dev);
        assert_true(strlen(err.message) > 0);
    }
    dev_device *dev = NULL;
    sw_error err;
    assert_int_equal(dev_open(NULL, NULL, &dev, &err), SW_EINVAL);
    /* 48 characters is the longest valid name: it must not be refused as a
     * spec (the pool does not exist and no capacity is given). */
    assert_int_equal(dev_open("sim-gpu:012345678901234567890123456789012345678901234567", NULL,
                              &dev, &err), SW_ENOTFOUND);
#ifndef SPILLWAY_CUDA /* with CUDA, cuda:0 is test_cuda's */
    assert_int_equal(dev_open("cuda:0", NULL, &dev, &err), SW_EUNSUPPORTED);
    assert_non_null(strstr(err.message, "this build has no CUDA device (build with SPILLWAY_CUDA)"));
#endif
    assert_null(dev);
}

static void test_cpu_basics(void **state)
{
    (void)state;
    dev_device *dev = open_ok("cpu", 0);
    dev_memory mem = info_ok(dev);
    sw_error err;
    void *ptr = NULL;

    assert_int_equal(dev_get_kind(dev), DEV_KIND_CPU);
    assert_string_equal(dev_kind_name(dev_get_kind(dev)), "cpu");
    assert_string_equal(dev_kind_name(DEV_KIND_SIM_GPU), "sim-gpu");
    assert_string_equal(dev_kind_name(DEV_KIND_CUDA), "cuda");
    assert_string_equal(dev_spec(dev), "cpu");
    assert_false(dev_is_simulated(dev));
    assert_int_equal(mem.total_bytes, meminfo_total());
    assert_true(mem.free_bytes <= mem.total_bytes);
    assert_int_equal(mem.used_bytes, mem.total_bytes - mem.free_bytes);
    assert_int_equal(mem.self_bytes, 0);

    assert_int_equal(dev_alloc(dev, 1 << 20, "test", &ptr, &err), SW_OK);
    assert_non_null(ptr);
    assert_int_equal((uintptr_t)ptr % 64, 0);
    unsigned char src[4096];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (unsigned char)(i * 7);
    assert_int_equal(dev_upload(dev, ptr, src, sizeof src, &err), SW_OK);
    assert_memory_equal(ptr, src, sizeof src);
    assert_int_equal(info_ok(dev).self_bytes, 1 << 20);

    /* Never partial: more than the machine has fails cleanly, holding nothing. */
    void *huge = NULL;
    assert_int_equal(dev_alloc(dev, (size_t)(mem.total_bytes * 2), "huge", &huge, &err),
                     SW_EDEVOOM);
    assert_null(huge);
    assert_non_null(strstr(err.message, "cpu out of memory"));
    assert_int_equal(info_ok(dev).self_bytes, 1 << 20);

    /* The allocation hook reaches device memory too. */
    sw_alloc_fail_after(0);
    assert_int_equal(dev_alloc(dev, 4096, "hooked", &huge, &err), SW_EDEVOOM);
    sw_alloc_fail_after(-1);
    assert_null(huge);

    dev_free(dev, ptr, 1 << 20);
    dev_free(dev, NULL, 123); /* no-op */
    assert_int_equal(info_ok(dev).self_bytes, 0);
    assert_int_equal(dev_alloc(dev, 0, "empty", &ptr, &err), SW_OK);
    dev_free(dev, ptr, 0);
    dev_close(dev);
    dev_close(NULL);
}

/* ---- one process ------------------------------------------------------------ */

static void test_sim_capacity_exact(void **state)
{
    (void)state;
    const uint64_t cap = 1 << 20;
    const char *spec = pool_spec("cap");
    dev_device *dev = open_ok(spec, cap);
    dev_memory mem = info_ok(dev);
    sw_error err;
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    char expect[256];

    assert_true(dev_is_simulated(dev));
    assert_int_equal(dev_get_kind(dev), DEV_KIND_SIM_GPU);
    assert_string_equal(dev_spec(dev), spec);
    assert_int_equal(mem.total_bytes, cap);
    assert_int_equal(mem.used_bytes, 0);
    assert_int_equal(mem.free_bytes, cap);

    assert_int_equal(dev_alloc(dev, 600000, "kv", &a, &err), SW_OK);
    assert_int_equal((uintptr_t)a % 64, 0);
    memset(a, 0x5a, 600000);
    mem = info_ok(dev);
    assert_int_equal(mem.used_bytes, 600000);
    assert_int_equal(mem.free_bytes, cap - 600000);
    assert_int_equal(mem.self_bytes, 600000);

    /* 500000 more would exceed 1048576: refused, nothing held. */
    assert_int_equal(dev_alloc(dev, 500000, "kv", &b, &err), SW_EDEVOOM);
    assert_int_equal(err.code, SW_EDEVOOM);
    assert_null(b);
    snprintf(expect, sizeof expect,
             "%s out of memory: asked 500000 bytes (488.3 KiB), 600000 bytes (585.9 KiB) used "
             "of 1048576 bytes (1.0 MiB)", spec);
    if (!strstr(err.message, expect))
        print_message("message: %s\nexpected: %s\n", err.message, expect);
    assert_non_null(strstr(err.message, expect));
    assert_non_null(strstr(err.message, "simulated"));
    assert_int_equal(info_ok(dev).used_bytes, 600000);

    /* Exactly the rest fits; one byte more does not. */
    assert_int_equal(dev_alloc(dev, cap - 600000, "rest", &c, &err), SW_OK);
    assert_int_equal(info_ok(dev).free_bytes, 0);
    assert_int_equal(dev_alloc(dev, 1, "byte", &d, &err), SW_EDEVOOM);
    assert_int_equal(dev_alloc(dev, cap + 1, "too big", &d, &err), SW_EDEVOOM);
    assert_null(d);

    /* Freed memory is accepted again. */
    dev_free(dev, a, 600000);
    assert_int_equal(info_ok(dev).used_bytes, cap - 600000);
    assert_int_equal(dev_alloc(dev, 500000, "kv", &b, &err), SW_OK);
    mem = info_ok(dev);
    assert_int_equal(mem.used_bytes, cap - 600000 + 500000);
    assert_int_equal(mem.self_bytes, cap - 600000 + 500000);

    /* A second handle in the same process shares the pool but has its own
     * count; closing it returns exactly what it held. */
    dev_device *other = open_ok(spec, 0);
    void *e = NULL;
    assert_int_equal(dev_alloc(other, 100000, "other", &e, &err), SW_OK);
    mem = info_ok(other);
    assert_int_equal(mem.self_bytes, 100000);
    assert_int_equal(mem.used_bytes, cap - 600000 + 500000 + 100000);
    assert_int_equal(info_ok(dev).self_bytes, cap - 600000 + 500000);
    dev_close(other); /* still holding e: the pool gets it back */
    sw_free(e);       /* the host memory stays the caller's */
    assert_int_equal(info_ok(dev).used_bytes, cap - 600000 + 500000);

    dev_free(dev, b, 500000);
    dev_free(dev, c, cap - 600000);
    assert_int_equal(info_ok(dev).used_bytes, 0);
    dev_close(dev);
    /* the last handle closed: the pool went with it */
    assert_int_equal(dev_sim_unlink(pool_name("cap"), &err), SW_ENOTFOUND);
}

static void test_sim_missing_and_mismatch(void **state)
{
    (void)state;
    const char *name = pool_name("mismatch");
    char spec[80];
    dev_options opts = {0};
    dev_device *dev = NULL;
    sw_error err;

    snprintf(spec, sizeof spec, "sim-gpu:%s", name);
    assert_int_equal(dev_open(spec, &opts, &dev, &err), SW_ENOTFOUND);
    assert_null(dev);
    assert_non_null(strstr(err.message, "capacity"));
    assert_int_equal(dev_sim_unlink(name, &err), SW_ENOTFOUND);

    dev_device *owner = open_ok(spec, 1 << 20);
    opts.sim_capacity_bytes = 2 << 20;
    assert_int_equal(dev_open(spec, &opts, &dev, &err), SW_EINVAL);
    assert_null(dev);
    assert_non_null(strstr(err.message, "1048576"));
    assert_non_null(strstr(err.message, "2097152"));

    /* No capacity, or the same one: the existing pool is adopted. */
    dev_device *same = open_ok(spec, 1 << 20);
    dev_device *adopted = open_ok(spec, 0);
    assert_int_equal(info_ok(adopted).total_bytes, 1 << 20);
    dev_close(adopted);
    dev_close(same);
    dev_close(owner);

    /* the last handle closed: the pool went with it */
    assert_int_equal(dev_sim_unlink(name, &err), SW_ENOTFOUND);
    assert_int_equal(dev_sim_unlink("bad/name", &err), SW_EINVAL);
    assert_int_equal(dev_sim_unlink("", &err), SW_EINVAL);
}

/* A handle inherited through fork() must not charge the child's memory to
 * the parent's slot. */
static void test_fork_inherited_handle(void **state)
{
    (void)state;
    const char *spec = pool_spec("inherit");
    dev_device *dev = open_ok(spec, 1 << 20);
    pid_t pid = fork_child();
    assert_true(pid >= 0);
    if (pid == 0) {
        void *p = NULL;
        sw_error err;
        int rc = dev_alloc(dev, 4096, "child", &p, &err);
        _exit(rc == SW_EINVAL && p == NULL ? 0 : 1);
    }
    int status = wait_child(pid, CHILD_TIMEOUT_MS);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(info_ok(dev).used_bytes, 0);
    dev_close(dev);
    sw_error err;
    /* the last handle closed: the pool went with it */
    assert_int_equal(dev_sim_unlink(pool_name("inherit"), &err), SW_ENOTFOUND);
}

/* ---- several processes -------------------------------------------------------- */

/* Child: opens spec, allocates bytes, says so on ready_fd, then waits to be
 * killed. Exit codes say what failed. */
static void child_hold(const char *spec, size_t bytes, int ready_fd)
{
    dev_device *dev = NULL;
    sw_error err;
    void *p = NULL;
    if (dev_open(spec, NULL, &dev, &err) != SW_OK)
        _exit(10);
    if (dev_alloc(dev, bytes, "child", &p, &err) != SW_OK)
        _exit(11);
    if (write(ready_fd, "r", 1) != 1)
        _exit(12);
    for (;;)
        pause();
}

static pid_t start_holder(const char *spec, size_t bytes)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork_child();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        child_hold(spec, bytes, fds[1]);
    }
    close(fds[1]);
    int got = read_byte(fds[0], CHILD_TIMEOUT_MS);
    close(fds[0]);
    if (got != 1) {
        int status = wait_child(pid, 1000);
        print_message("holder child failed: status %d\n", status);
    }
    assert_int_equal(got, 1);
    return pid;
}

static void test_sim_two_processes_sigkill(void **state)
{
    (void)state;
    const uint64_t cap = 1 << 20;
    const char *spec = pool_spec("kill");
    char spec_copy[80];
    dev_device *dev = open_ok(spec, cap);
    sw_error err;
    void *p = NULL;

    snprintf(spec_copy, sizeof spec_copy, "%s", spec);
    /* Killed, then checked while still a zombie (not yet reaped). */
    pid_t pid = start_holder(spec_copy, 300000);
    dev_memory mem = info_ok(dev);
    assert_int_equal(mem.used_bytes, 300000);
    assert_int_equal(mem.self_bytes, 0);
    assert_int_equal(mem.free_bytes, cap - 300000);
    assert_int_equal(dev_alloc(dev, cap - 300000 + 1, "too much", &p, &err), SW_EDEVOOM);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_true(wait_zombie(pid, CHILD_TIMEOUT_MS));
    assert_int_equal(info_ok(dev).used_bytes, 0);
    int status = wait_child(pid, CHILD_TIMEOUT_MS);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);

    /* Killed and reaped; the next allocation (not an info call) reclaims. */
    pid = start_holder(spec_copy, 500000);
    assert_int_equal(info_ok(dev).used_bytes, 500000);
    kill(pid, SIGKILL);
    status = wait_child(pid, CHILD_TIMEOUT_MS);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(dev_alloc(dev, cap, "all of it", &p, &err), SW_OK);
    assert_int_equal(info_ok(dev).used_bytes, cap);
    dev_free(dev, p, cap);

    dev_close(dev);
    /* the last handle closed: the pool went with it */
    assert_int_equal(dev_sim_unlink(pool_name("kill"), &err), SW_ENOTFOUND);
}

static void test_sim_lock_holder_killed(void **state)
{
    (void)state;
    const char *spec = pool_spec("robust");
    dev_device *dev = open_ok(spec, 1 << 20);
    sw_error err;
    void *p = NULL;

    pid_t pid = fork_child();
    assert_true(pid >= 0);
    if (pid == 0) {
        dev_device *mine = NULL;
        void *q = NULL;
        if (dev_open(spec, NULL, &mine, &err) != SW_OK ||
            dev_alloc(mine, 200000, "child", &q, &err) != SW_OK)
            _exit(10);
        dev__sim_die_holding_lock(mine, &err);
        _exit(11);
    }
    int status = wait_child(pid, CHILD_TIMEOUT_MS);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);

    /* The lock was left held by a dead process: the next user recovers it
     * (well within the lock time-out) and reclaims the child's bytes. */
    int64_t t0 = mono_ms();
    dev_memory mem = info_ok(dev);
    assert_true(mono_ms() - t0 < SIM_POOL_LOCK_TIMEOUT_MS);
    assert_int_equal(mem.used_bytes, 0);
    assert_int_equal(dev_alloc(dev, 1 << 20, "all", &p, &err), SW_OK);
    dev_free(dev, p, 1 << 20);
    assert_int_equal(info_ok(dev).used_bytes, 0);
    dev_close(dev);
    /* the last handle closed: the pool went with it */
    assert_int_equal(dev_sim_unlink(pool_name("robust"), &err), SW_ENOTFOUND);
}

/* A live pid whose start time no longer matches the slot is a different
 * process (the pid was reused): the slot's bytes are reclaimed. */
static void test_sim_reused_pid(void **state)
{
    (void)state;
    const char *spec = pool_spec("reuse");
    char spec_copy[80];
    dev_device *dev = open_ok(spec, 1 << 20);
    sw_error err;

    snprintf(spec_copy, sizeof spec_copy, "%s", spec);
    pid_t pid = start_holder(spec_copy, 4096);
    assert_int_equal(info_ok(dev).used_bytes, 4096);
    /* Its real start time is kept: still counted. Forged: reclaimed. */
    assert_int_equal(info_ok(dev).used_bytes, 4096);
    assert_int_equal(dev__sim_forge_start_time(dev, (long)pid, 1, &err), 1);
    assert_int_equal(info_ok(dev).used_bytes, 0);
    kill(pid, SIGKILL);
    wait_child(pid, CHILD_TIMEOUT_MS);

    /* A handle whose slot was taken from it (as if this process had been
     * mistaken for a dead one) refuses to go on instead of charging whoever
     * holds the slot now. */
    void *p = NULL;
    assert_int_equal(dev_alloc(dev, 1000, "before", &p, &err), SW_OK);
    assert_int_equal(dev__sim_forge_start_time(dev, (long)getpid(), 1, &err), 1);
    assert_int_equal(info_ok(dev).used_bytes, 0);
    assert_int_equal(info_ok(dev).self_bytes, 0);
    void *q = NULL;
    assert_int_equal(dev_alloc(dev, 1000, "after", &q, &err), SW_EDEVICE);
    assert_null(q);
    assert_non_null(strstr(err.message, "reclaimed"));
    dev_free(dev, p, 1000);
    assert_int_equal(info_ok(dev).used_bytes, 0);
    dev_close(dev);
    /* the last handle closed: the pool went with it */
    assert_int_equal(dev_sim_unlink(pool_name("reuse"), &err), SW_ENOTFOUND);
}

/* Several processes create the same pool at the same moment: one creates,
 * the others wait for it, all see one consistent pool. */
/* A pool goes with its last user: it stays while any handle is open,
 * goes when the last one closes; one left by processes that died is
 * replaced by an opener asking another capacity (and adopted by one that
 * asks none); SPILLWAY_SIM_KEEP=1 keeps it; a look (sim_no_create)
 * creates nothing and removes nothing. */
static void test_sim_pool_lifetime(void **state)
{
    (void)state;
    const char *name = pool_name("life");
    char spec[80];
    snprintf(spec, sizeof spec, "sim-gpu:%s", name);
    sw_error err;
    dev_device *dev = NULL;

    /* the last close removes it */
    dev_device *a = open_ok(spec, 1 << 20), *b = open_ok(spec, 0);
    dev_close(a);
    dev_device *c = open_ok(spec, 0); /* still there: b has it open */
    dev_close(c);
    dev_close(b);
    assert_int_equal(dev_open(spec, NULL, &dev, &err), SW_ENOTFOUND);
    assert_null(dev);

    /* a look creates nothing ... */
    dev_options look = {.sim_capacity_bytes = 1 << 20, .sim_no_create = true};
    assert_int_equal(dev_open(spec, &look, &dev, &err), SW_ENOTFOUND);
    assert_int_equal(dev_sim_unlink(name, &err), SW_ENOTFOUND);
    /* ... and sees a pool in use without removing it at its close */
    a = open_ok(spec, 1 << 20);
    void *p = NULL;
    assert_int_equal(dev_alloc(a, 1000, "held", &p, &err), SW_OK);
    assert_int_equal(dev_open(spec, &look, &dev, &err), SW_OK);
    assert_int_equal(info_ok(dev).used_bytes, 1000);
    dev_close(dev);
    assert_int_equal(info_ok(a).used_bytes, 1000);
    dev_free(a, p, 1000);

    /* users that died leave it; another capacity replaces it, none adopts */
    pid_t pid = start_holder(spec, 4096);
    dev_close(a); /* the holder still uses it */
    kill(pid, SIGKILL);
    wait_child(pid, CHILD_TIMEOUT_MS);
    look.sim_capacity_bytes = 2 << 20;
    assert_int_equal(dev_open(spec, &look, &dev, &err), SW_ENOTFOUND); /* would be replaced */
    b = open_ok(spec, 2 << 20);
    dev_memory m = info_ok(b);
    assert_int_equal(m.total_bytes, 2 << 20);
    assert_int_equal(m.used_bytes, 0);
    dev_close(b);
    assert_int_equal(dev_sim_unlink(name, &err), SW_ENOTFOUND);

    /* SPILLWAY_SIM_KEEP=1 in any user keeps it after the last close */
    setenv("SPILLWAY_SIM_KEEP", "1", 1);
    a = open_ok(spec, 1 << 20);
    unsetenv("SPILLWAY_SIM_KEEP");
    b = open_ok(spec, 0);
    dev_close(a);
    dev_close(b);
    c = open_ok(spec, 0);
    assert_int_equal(info_ok(c).total_bytes, 1 << 20);
    dev_close(c);
    dev_options other = {.sim_capacity_bytes = 2 << 20};
    assert_int_equal(dev_open(spec, &other, &dev, &err), SW_EINVAL);
    assert_non_null(strstr(err.message, "kept"));
    assert_int_equal(dev_sim_unlink(name, &err), SW_OK);
}

static void test_sim_creation_race(void **state)
{
    (void)state;
    enum { N_CHILDREN = 6 };
    const char *spec = pool_spec("race");
    const uint64_t cap = 8 << 20;
    pid_t pids[N_CHILDREN];
    int go[2];
    sw_error err;

    assert_int_equal(pipe(go), 0);
    for (int i = 0; i < N_CHILDREN; i++) {
        pids[i] = fork_child();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            dev_options opts = {.sim_capacity_bytes = cap};
            dev_device *dev = NULL;
            dev_memory mem;
            void *p = NULL;
            char c;
            close(go[1]);
            if (read(go[0], &c, 1) != 0) /* EOF when the parent closes: go */
                _exit(9);
            if (dev_open(spec, &opts, &dev, &err) != SW_OK)
                _exit(10);
            if (dev_alloc(dev, 1 << 20, "race", &p, &err) != SW_OK)
                _exit(11);
            if (dev_memory_info(dev, &mem, &err) != SW_OK || mem.total_bytes != cap ||
                mem.used_bytes < (1 << 20) || mem.used_bytes > (uint64_t)N_CHILDREN << 20)
                _exit(12);
            dev_free(dev, p, 1 << 20);
            dev_close(dev);
            _exit(0);
        }
    }
    close(go[0]);
    close(go[1]);
    for (int i = 0; i < N_CHILDREN; i++) {
        int status = wait_child(pids[i], CHILD_TIMEOUT_MS);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    /* each child closed its handle: the pool went with the last one */
    dev_device *dev = NULL;
    assert_int_equal(dev_open(spec, NULL, &dev, &err), SW_ENOTFOUND);
    assert_int_equal(dev_sim_unlink(pool_name("race"), &err), SW_ENOTFOUND);
}

/* A creator that died half-way (object never sized, or sized but never
 * published) leaves a name that openers refuse after a short wait, with a
 * message saying how to remove it, instead of using garbage or hanging. */
static void test_sim_stale_half_created(void **state)
{
    (void)state;
    char shm[96], spec[80], name[64];
    dev_options opts = {.sim_capacity_bytes = 1 << 20};
    dev_device *dev = NULL;
    sw_error err;

    snprintf(name, sizeof name, "%s", pool_name("stale"));
    snprintf(spec, sizeof spec, "sim-gpu:%s", name);
    snprintf(shm, sizeof shm, "/spillway-sim-%s", name);
    int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    int rc = dev_open(spec, &opts, &dev, &err);
    assert_true(rc == SW_EDEVICE);
    assert_null(dev);
    assert_non_null(strstr(err.message, "never sized"));
    assert_non_null(strstr(err.message, "rm /dev/shm/spillway-sim-"));

    assert_int_equal(ftruncate(fd, 64 << 10), 0); /* bigger than a pool, all zero */
    rc = dev_open(spec, &opts, &dev, &err);
    assert_true(rc == SW_EDEVICE);
    assert_null(dev);
    assert_non_null(strstr(err.message, "never became ready"));
    close(fd);

    /* After removal the name works again. */
    assert_int_equal(dev_sim_unlink(name, &err), SW_OK);
    dev = open_ok(spec, 1 << 20);
    assert_int_equal(info_ok(dev).total_bytes, 1 << 20);
    dev_close(dev);
    /* the last handle closed: the pool went with it */
    assert_int_equal(dev_sim_unlink(name, &err), SW_ENOTFOUND);
}

/* A pool another spillway version left (a smaller object: the layout an
 * older build used) is refused by an opener that only attaches, with how to
 * remove it, and replaced by one that creates: an upgrade does not leave
 * `make run` stuck on a stale /dev/shm entry. */
static void test_sim_other_version_replaced(void **state)
{
    (void)state;
    char shm[96], spec[80], name[64];
    dev_device *dev = NULL;
    sw_error err;

    snprintf(name, sizeof name, "%s", pool_name("oldver"));
    snprintf(spec, sizeof spec, "sim-gpu:%s", name);
    snprintf(shm, sizeof shm, "/spillway-sim-%s", name);
    int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 6216), 0);
    close(fd);
    assert_int_equal(dev_open(spec, NULL, &dev, &err), SW_EFORMAT);
    assert_null(dev);
    assert_non_null(strstr(err.message, "not a pool of this spillway version"));
    dev = open_ok(spec, 1 << 20);
    assert_int_equal(info_ok(dev).total_bytes, 1 << 20);
    dev_close(dev);
    assert_int_equal(dev_sim_unlink(name, &err), SW_ENOTFOUND); /* went with its user */
}

/* ---- spillway hog --------------------------------------------------------- */

typedef struct hog_proc {
    pid_t pid;
    int out_fd;
    int err_fd;
} hog_proc;

static hog_proc hog_start(char *const argv[])
{
    int out[2], errp[2];
    hog_proc h;
    assert_int_equal(pipe(out), 0);
    assert_int_equal(pipe(errp), 0);
    h.pid = fork_child();
    assert_true(h.pid >= 0);
    if (h.pid == 0) {
        dup2(out[1], 1);
        dup2(errp[1], 2);
        close(out[0]);
        close(out[1]);
        close(errp[0]);
        close(errp[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(out[1]);
    close(errp[1]);
    h.out_fd = out[0];
    h.err_fd = errp[0];
    return h;
}

/* Reads from fd until a newline or EOF (time-out); NUL-terminated. */
static size_t read_until(int fd, char *buf, size_t cap, bool line_only, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    size_t len = 0;
    while (len + 1 < cap) {
        int left = (int)(deadline - mono_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t n = read(fd, buf + len, 1);
        if (n <= 0)
            break;
        len++;
        if (line_only && buf[len - 1] == '\n')
            break;
    }
    buf[len] = '\0';
    return len;
}

static void test_hog_sim(void **state)
{
    (void)state;
    const char *bin = btu_spillway_bin_or_skip();
    if (!bin)
        return;
    char spec[80], name[64], line[512];
    sw_error err;
    snprintf(name, sizeof name, "%s", pool_name("hog"));
    snprintf(spec, sizeof spec, "sim-gpu:%s", name);

    char *argv[] = {(char *)bin, "hog", "--device", spec, "--sim-capacity", "4MiB", "--bytes",
                    "3MiB", NULL};
    hog_proc h = hog_start(argv);
    read_until(h.out_fd, line, sizeof line, true, CHILD_TIMEOUT_MS);
    print_message("hog said: %s", line);
    assert_non_null(strstr(line, "hog: holding 3.0 MiB (3145728 bytes)"));
    assert_non_null(strstr(line, spec));
    assert_non_null(strstr(line, "simulated"));
    assert_non_null(strstr(line, "3.0 MiB used of 4.0 MiB"));

    dev_device *dev = open_ok(spec, 0);
    dev_memory mem = info_ok(dev);
    assert_int_equal(mem.total_bytes, 4 << 20);
    assert_int_equal(mem.used_bytes, 3 << 20);
    assert_int_equal(mem.free_bytes, 1 << 20);

    /* A second hog asking more than is left exits 3 with the message. */
    char *argv2[] = {(char *)bin, "hog", "--device", spec, "--bytes", "2MiB", NULL};
    hog_proc h2 = hog_start(argv2);
    char errtext[1024];
    read_until(h2.err_fd, errtext, sizeof errtext, false, CHILD_TIMEOUT_MS);
    int status = wait_child(h2.pid, CHILD_TIMEOUT_MS);
    close(h2.out_fd);
    close(h2.err_fd);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3);
    char expect[256];
    snprintf(expect, sizeof expect, "%s out of memory: asked 2097152 bytes (2.0 MiB), 3145728 "
             "bytes (3.0 MiB) used of 4194304 bytes (4.0 MiB)", spec);
    if (!strstr(errtext, expect))
        print_message("stderr: %s\n", errtext);
    assert_non_null(strstr(errtext, expect));

    /* More than the whole capacity: exit 3 too. */
    char *argv_big[] = {(char *)bin, "hog", "--device", spec, "--bytes", "5MiB", NULL};
    h2 = hog_start(argv_big);
    read_until(h2.err_fd, errtext, sizeof errtext, false, CHILD_TIMEOUT_MS);
    status = wait_child(h2.pid, CHILD_TIMEOUT_MS);
    close(h2.out_fd);
    close(h2.err_fd);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3);
    snprintf(expect, sizeof expect, "%s out of memory: asked 5242880 bytes (5.0 MiB)", spec);
    assert_non_null(strstr(errtext, expect));
    assert_non_null(strstr(errtext, "used of 4194304 bytes (4.0 MiB)"));

    /* SIGTERM: the hog frees, exits 0, and the memory is back. */
    assert_int_equal(kill(h.pid, SIGTERM), 0);
    status = wait_child(h.pid, CHILD_TIMEOUT_MS);
    close(h.out_fd);
    close(h.err_fd);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    mem = info_ok(dev);
    assert_int_equal(mem.used_bytes, 0);
    assert_int_equal(mem.free_bytes, 4 << 20);

    /* Killed with SIGKILL instead: reclaimed all the same. --unlink on a
     * hog that is killed does nothing, so the name stays. */
    char *argv3[] = {(char *)bin, "hog", "--device", spec, "--bytes", "4MiB", "--unlink", NULL};
    h = hog_start(argv3);
    read_until(h.out_fd, line, sizeof line, true, CHILD_TIMEOUT_MS);
    assert_non_null(strstr(line, "4.0 MiB used of 4.0 MiB"));
    assert_int_equal(info_ok(dev).free_bytes, 0);
    kill(h.pid, SIGKILL);
    wait_child(h.pid, CHILD_TIMEOUT_MS);
    close(h.out_fd);
    close(h.err_fd);
    assert_int_equal(info_ok(dev).used_bytes, 0);

    /* SIGINT with --unlink: the name is removed on the way out (though
     * this process still has the pool open). */
    h = hog_start(argv3);
    read_until(h.out_fd, line, sizeof line, true, CHILD_TIMEOUT_MS);
    assert_non_null(strstr(line, "hog: holding"));
    kill(h.pid, SIGINT);
    status = wait_child(h.pid, CHILD_TIMEOUT_MS);
    close(h.out_fd);
    close(h.err_fd);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(dev_sim_unlink(name, &err), SW_ENOTFOUND);
    dev_close(dev);
}

static void test_hog_cpu_and_usage(void **state)
{
    (void)state;
    const char *bin = btu_spillway_bin_or_skip();
    if (!bin)
        return;
    char line[512];
    char *argv[] = {(char *)bin, "hog", "--device", "cpu", "--bytes", "2MiB", NULL};
    hog_proc h = hog_start(argv);
    read_until(h.out_fd, line, sizeof line, true, CHILD_TIMEOUT_MS);
    assert_non_null(strstr(line, "hog: holding 2.0 MiB (2097152 bytes) of cpu;"));
    assert_null(strstr(line, "simulated"));
    kill(h.pid, SIGTERM);
    int status = wait_child(h.pid, CHILD_TIMEOUT_MS);
    close(h.out_fd);
    close(h.err_fd);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);

    /* Missing pool without a capacity: a device error, exit 1. Bad usage: 2. */
    char missing[80];
    snprintf(missing, sizeof missing, "%s", pool_spec("hog-missing"));
    char *argv2[] = {(char *)bin, "hog", "--device", missing, "--bytes", "1MiB", NULL};
    char *out = NULL;
    assert_int_equal(tu_run_capture(argv2, 30, &out, &status), 0);
    assert_int_equal(status, 1);
    sw_free(out);
    char *argv3[] = {(char *)bin, "hog", "--device", "cpu", "--bytes", "lots", NULL};
    assert_int_equal(tu_run_capture(argv3, 30, &out, &status), 0);
    assert_int_equal(status, 2);
    sw_free(out);
    char *argv4[] = {(char *)bin, "hog", "--device", "sim-gpu:bad/name", "--sim-capacity", "1MiB",
                     "--bytes", "1", NULL};
    assert_int_equal(tu_run_capture(argv4, 30, &out, &status), 0);
    assert_int_equal(status, 2);
    sw_free(out);
}

/* Removes the pools even when a test failed half-way (a failed assertion
 * skips the test's own unlink). */
static int unlink_pools(void **state)
{
    (void)state;
    static const char *tags[] = {"cap", "mismatch", "inherit", "kill", "robust", "reuse",
                                 "race", "stale", "hog", "hog-missing"};
    for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++)
        dev_sim_unlink(pool_name(tags[i]), NULL);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_cpu_basics),
        cmocka_unit_test(test_sim_capacity_exact),
        cmocka_unit_test(test_sim_missing_and_mismatch),
        cmocka_unit_test(test_fork_inherited_handle),
        cmocka_unit_test(test_sim_two_processes_sigkill),
        cmocka_unit_test(test_sim_lock_holder_killed),
        cmocka_unit_test(test_sim_reused_pid),
        cmocka_unit_test(test_sim_pool_lifetime),
        cmocka_unit_test(test_sim_creation_race),
        cmocka_unit_test(test_sim_stale_half_created),
        cmocka_unit_test(test_sim_other_version_replaced),
        cmocka_unit_test(test_hog_sim),
        cmocka_unit_test(test_hog_cpu_and_usage),
    };
    /* No SPILLWAY_FAULT from the environment may disturb these tests. */
    dev_fault_set(NULL);
    return cmocka_run_group_tests(tests, NULL, unlink_pools);
}
