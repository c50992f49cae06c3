/* test_router_health_edges.c - what a worker's /health may say that the
 * router passes on, end to end: a real `spillway serve` with an
 * unmanaged worker (url = unix:...) that is a server thread here, so the
 * test chooses its /health text.
 *
 *  - a rates_source that is not one of the documented words (none,
 *    calibration, measured), long and not ASCII: the router's /health
 *    still lists the worker (a cut inside a UTF-8 character made the
 *    entry vanish) and says "none" for it;
 *  - a ctx_limit past 32 bits (2^32 + 512): read as unknown (0), not
 *    wrapped to 512.
 */
#include "testutil.h"
#include "router_harness.h"
#include "worker_client.h"

#include "common/alloc.h"
#include "engine/model_make.h"

#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static char g_model[512];

typedef struct fake_worker {
    int lfd;
    char path[600];
    atomic_bool stop;
    pthread_t th;
} fake_worker;

static fake_worker g_fake;

/* 12 two-byte characters: 24 bytes, more than the router keeps (15) */
#define ODD_SOURCE "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9" \
                   "\xc3\xa9\xc3\xa9\xc3\xa9"

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* Answers every request with a spillway worker's /health (ready, rates,
 * the odd rates_source) and closes. */
static void *fake_thread(void *arg)
{
    fake_worker *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {f->lfd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        struct timeval tv = {2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char buf[4096];
        size_t n = 0;
        while (n < sizeof buf - 1) {
            ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
            if (r <= 0)
                break;
            n += (size_t)r;
            buf[n] = 0;
            if (strstr(buf, "\r\n\r\n"))
                break;
        }
        static const char body[] =
            "{\"status\":\"ready\",\"model\":\"fake\",\"ctx_limit\":4294967808,"
            "\"prefill_tokens_per_second\":100.0,\"decode_tokens_per_second\":10.0,"
            "\"rates_source\":\"" ODD_SOURCE "\"}";
        char head[200];
        int m = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                         sizeof body - 1);
        send_all(fd, head, (size_t)m);
        send_all(fd, body, sizeof body - 1);
        shutdown(fd, SHUT_WR);
        close(fd);
    }
    return NULL;
}

static int setup(void **state)
{
    (void)state;
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = 31;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("router-health-edges.gguf"));
    if (eng_model_make(&p, g_model, NULL) || !tu_spillway_bin())
        return -1;
    memset(&g_fake, 0, sizeof g_fake);
    snprintf(g_fake.path, sizeof g_fake.path, "%s", tu_tmp_path("health-fake.sock"));
    unlink(g_fake.path);
    g_fake.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (g_fake.lfd < 0 || strlen(g_fake.path) >= sizeof sa.sun_path)
        return -1;
    memcpy(sa.sun_path, g_fake.path, strlen(g_fake.path) + 1);
    if (bind(g_fake.lfd, (struct sockaddr *)&sa, sizeof sa) || listen(g_fake.lfd, 16) ||
        pthread_create(&g_fake.th, NULL, fake_thread, &g_fake))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rh_stop_all();
    atomic_store(&g_fake.stop, true);
    pthread_join(g_fake.th, NULL);
    close(g_fake.lfd);
    unlink(g_fake.path);
    remove(g_model);
    return 0;
}

static void test_odd_rates_source(void **state)
{
    (void)state;
    assert_int_equal(strlen(ODD_SOURCE), 24);
    char rest[800];
    snprintf(rest, sizeof rest, "[worker fake]\nurl = unix:%s\n", g_fake.path);
    rh_router r;
    assert_int_equal(rh_start(&r, "health-odd", g_model, NULL, rest), 0);
    /* the worker is listed (rh_worker_health fails the test otherwise),
     * ready, with its rates and a documented rates_source */
    json_t *w = rh_worker_health(&r, "fake");
    assert_string_equal(json_string_value(json_object_get(w, "state")), "ready");
    assert_true(json_number_value(json_object_get(w, "decode_tokens_per_second")) > 0);
    assert_string_equal(json_string_value(json_object_get(w, "rates_source")), "none");
    assert_int_equal(json_integer_value(json_object_get(w, "ctx_limit")), 0);
    json_decref(w);
    rh_finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_odd_rates_source),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
