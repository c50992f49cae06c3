/* fake_server.c - the scripted HTTP server the router tests run in a
 * thread (see fake_server.h): one copy of the listener, the accept loop
 * and the request reading that each test used to carry. */
#include "fake_server.h"
#include "testutil.h"

#include "common/alloc.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

bool fs_read_request(int fd, char *buf, size_t cap, const char **body)
{
    size_t n = 0;
    char *end = NULL;
    while (!end && n < cap - 1) {
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r <= 0)
            return false;
        n += (size_t)r;
        buf[n] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    if (!end)
        return false;
    const char *cl = strcasestr(buf, "\r\nContent-Length:");
    size_t want = (size_t)(end - buf) + 4 + (cl ? strtoul(cl + 17, NULL, 10) : 0);
    while (n < want && n < cap - 1) {
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r <= 0)
            return false;
        n += (size_t)r;
        buf[n] = 0;
    }
    *body = end + 4;
    return true;
}

void fs_send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

void fs_send_reply(int fd, int status, const char *ctype, const char *body, size_t len)
{
    const char *reason = status == 200 ? "OK" : status == 404 ? "Not Found" : "Status";
    char head[256];
    int m = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, reason, ctype, len);
    fs_send_all(fd, head, (size_t)m);
    fs_send_all(fd, body, len);
}

/* What an OpenAI-compatible engine answers to a GET: its model list, or
 * 404 (no /health there). */
static void fs_openai_get(int fd, const char *req)
{
    static const char models[] =
        "{\"object\":\"list\",\"data\":[{\"id\":\"fake\",\"object\":\"model\","
        "\"created\":0,\"owned_by\":\"test\"}]}";
    static const char nf[] = "404 page not found";
    if (!strncmp(req, "GET /v1/models ", 15))
        fs_send_reply(fd, 200, "application/json", models, sizeof models - 1);
    else
        fs_send_reply(fd, 404, "text/plain", nf, sizeof nf - 1);
}

static void *fs_thread(void *arg)
{
    fs_server *s = arg;
    char *buf = sw_malloc(s->cap);
    while (buf && !atomic_load(&s->stop)) {
        struct pollfd p = {s->lfd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        const char *body = NULL;
        if (fs_read_request(fd, buf, s->cap, &body)) {
            if (s->openai_gets && !strncmp(buf, "GET ", 4))
                fs_openai_get(fd, buf);
            else
                s->handle(s, fd, buf, body);
        }
        shutdown(fd, SHUT_WR);
        close(fd);
    }
    sw_free(buf);
    return NULL;
}

void fs_start(fs_server *s, const char *name, size_t cap, bool openai_gets, fs_handler handle)
{
    memset(s, 0, sizeof *s);
    s->cap = cap;
    s->openai_gets = openai_gets;
    s->handle = handle;
    snprintf(s->path, sizeof s->path, "%s", tu_tmp_path(name));
    unlink(s->path);
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s->lfd >= 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    assert_true(strlen(s->path) < sizeof sa.sun_path);
    memcpy(sa.sun_path, s->path, strlen(s->path) + 1);
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(s->lfd, 16), 0);
    assert_int_equal(pthread_create(&s->th, NULL, fs_thread, s), 0);
}

void fs_stop(fs_server *s)
{
    atomic_store(&s->stop, true);
    pthread_join(s->th, NULL);
    close(s->lfd);
    unlink(s->path);
}
