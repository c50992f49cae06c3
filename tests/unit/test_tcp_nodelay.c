/* test_tcp_nodelay.c - small writes go out at once on the TCP connections
 * spillway makes and takes: the router's connections to its workers and
 * upstreams (rn_connect), every client connection its listening socket
 * accepts (rt__listen_on: an accepted socket inherits the option), and every
 * connection a worker's TCP listening socket accepts. With Nagle's
 * algorithm the second write of a request (its head, then its body) or a
 * stream's next chunk waits for the peer's delayed ACK, about 40 ms on
 * Linux: a streamed completion through a router to a worker on TCP took
 * ~44 ms where it takes ~10. The worker's listening socket is read from
 * its process with pidfd_getfd(2) (Linux 5.6; the test skips without it).
 */
#include "testutil.h"
#include "worker_client.h"

#include "modelgen/model_make.h"
#include "router/router-impl.h"
#include "router/router_net.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int nodelay(int fd)
{
    int v = -1;
    socklen_t len = sizeof v;
    if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len) != 0)
        return -1;
    return v;
}

static int local_port(int fd)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    return ntohs(sa.sin_port);
}

/* A plain listener of the test's own (the option's default: off). */
static int plain_listener(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 4)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static void test_router_to_worker(void **state)
{
    (void)state;
    int l = plain_listener();
    assert_true(l >= 0);
    char addr[64];
    snprintf(addr, sizeof addr, "http://127.0.0.1:%d", local_port(l));
    int c = rn_connect(addr, 2000);
    assert_true(c >= 0);
    assert_int_equal(nodelay(c), 1);
    int a = accept(l, NULL, NULL);
    assert_true(a >= 0);
    assert_int_equal(nodelay(a), 0); /* the other end's default, for contrast */
    close(a);
    close(c);
    close(l);
}

static void test_router_clients(void **state)
{
    (void)state;
    char actual[128];
    int l = rt__listen_on("127.0.0.1:0", actual, sizeof actual);
    assert_true(l >= 0);
    int port = local_port(l);
    assert_true(port > 0);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
    int a = accept(l, NULL, NULL);
    assert_true(a >= 0);
    assert_int_equal(nodelay(a), 1); /* what the router writes to a client */
    close(a);
    close(c);
    close(l);
}

static void test_worker_listener(void **state)
{
    (void)state;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    assert_non_null(tu_spillway_bin()); /* SPILLWAY_BIN, as ctest sets it */
    char model[512];
    snprintf(model, sizeof model, "%s", tu_tmp_path("nodelay.gguf"));
    eng_model_make_params p = eng_model_make_default_params();
    p.seed = 5;
    assert_int_equal(eng_model_make(&p, model, NULL), 0);
    char log_path[512];
    snprintf(log_path, sizeof log_path, "%s", tu_tmp_path("nodelay-worker.log"));
    int port = 0;
    pid_t pid = wc_worker_start_tcp(model, log_path, 20, &port);
    assert_true(pid > 0);
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        remove(model);
        print_message("skip: no pidfd_open (Linux 5.3)\n");
        skip();
    }
    /* its TCP listening socket among its descriptors */
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int found = 0, option = -1, refused = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int target = atoi(e->d_name);
        if (e->d_name[0] == '.')
            continue;
        int fd = (int)syscall(SYS_pidfd_getfd, pidfd, target, 0);
        if (fd < 0) {
            refused += errno == EPERM || errno == ENOSYS;
            continue;
        }
        int listening_opt = 0, domain = 0;
        socklen_t len = sizeof listening_opt;
        bool tcp_listener =
            getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening_opt, &len) == 0 &&
            listening_opt &&
            (len = sizeof domain, getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0) &&
            (domain == AF_INET || domain == AF_INET6);
        if (tcp_listener) {
            found++;
            option = nodelay(fd);
        }
        close(fd);
    }
    closedir(d);
    close(pidfd);
    kill(pid, SIGTERM);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    remove(model);
    if (found == 0 && refused > 0) {
        print_message("skip: pidfd_getfd is not allowed here (ptrace rules or seccomp)\n");
        skip();
    }
    assert_int_equal(found, 1);
    assert_int_equal(option, 1);
#else
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_to_worker),
        cmocka_unit_test(test_router_clients),
        cmocka_unit_test(test_worker_listener),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
