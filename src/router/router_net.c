/* router_net.c - blocking HTTP/1.1 client for the router's upstream side
 * (router_net.h explains why blocking). */
#include "router/router_net.h"

#include "common/alloc.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

int rn_connect(const char *address, int timeout_ms)
{
    int fd = -1;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    if (!strncmp(address, "unix:", 5)) {
        struct sockaddr_un sa;
        if (strlen(address + 5) >= sizeof sa.sun_path)
            return -1;
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, address + 5, strlen(address + 5) + 1);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            close(fd);
            return -1;
        }
        return fd;
    }
    if (!strncmp(address, "http://", 7))
        address += 7;
    char host[256];
    const char *colon = strrchr(address, ':');
    if (!colon || (size_t)(colon - address) >= sizeof host)
        return -1;
    memcpy(host, address, (size_t)(colon - address));
    host[colon - address] = 0;
    char port[16];
    snprintf(port, sizeof port, "%.*s", (int)strcspn(colon + 1, "/"), colon + 1);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0 || !res)
        return -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

int rn_write_all(int fd, const void *p, size_t n)
{
    const char *s = p;
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads more bytes into the buffer (compacting it first). Waits on the
 * upstream and, when set, watches the client for a hang-up. */
static int rn_fill(rn_conn *c)
{
    if (c->pos > 0) {
        memmove(c->buf, c->buf + c->pos, c->len - c->pos);
        c->len -= c->pos;
        c->pos = 0;
    }
    if (c->len == sizeof c->buf)
        return -1;
    int waited = 0;
    for (;;) {
        struct pollfd p[2] = {{c->fd, POLLIN, 0}, {c->watch_fd, POLLRDHUP, 0}};
        int n = poll(p, c->watch_fd >= 0 ? 2 : 1, 100);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (c->watch_fd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            c->client_gone = true;
            return -2;
        }
        if (p[0].revents) {
            ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return r == 0 ? 0 : -1;
            c->len += (size_t)r;
            return (int)r;
        }
        waited += 100;
        if (waited >= c->timeout_ms)
            return -1;
    }
}

/* One CRLF line (without it) into out; -1 on a broken connection. */
static int rn_line(rn_conn *c, char *out, size_t cap)
{
    for (;;) {
        char *nl = memchr(c->buf + c->pos, '\n', c->len - c->pos);
        if (nl) {
            size_t n = (size_t)(nl - (c->buf + c->pos));
            size_t m = n > 0 && c->buf[c->pos + n - 1] == '\r' ? n - 1 : n;
            if (m >= cap)
                return -1;
            memcpy(out, c->buf + c->pos, m);
            out[m] = 0;
            c->pos += n + 1;
            return 0;
        }
        int r = rn_fill(c);
        if (r <= 0)
            return r == -2 ? -2 : -1;
    }
}

int rn_request(rn_conn *c, const char *address, const char *method, const char *path,
               const char *extra_headers, const char *body, size_t body_len, int watch_fd,
               int timeout_ms)
{
    memset(c, 0, sizeof *c);
    c->watch_fd = watch_fd;
    c->timeout_ms = timeout_ms;
    c->fd = rn_connect(address, timeout_ms);
    if (c->fd < 0)
        return -1;
    char head[2048];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, extra_headers ? extra_headers : "", body ? body_len : 0);
    if (n < 0 || (size_t)n >= sizeof head || rn_write_all(c->fd, head, (size_t)n) ||
        (body && body_len && rn_write_all(c->fd, body, body_len)))
        return -1;
    char line[4096];
    int r = rn_line(c, line, sizeof line);
    if (r < 0)
        return r == -2 ? -2 : -3;
    if (strncmp(line, "HTTP/1.", 7) || strlen(line) < 12)
        return -3;
    c->status = atoi(line + 9);
    for (;;) {
        r = rn_line(c, line, sizeof line);
        if (r < 0)
            return r == -2 ? -2 : -3;
        if (!line[0])
            break;
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        *colon = 0;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        if (!strcasecmp(line, "Transfer-Encoding") && strstr(v, "chunked"))
            c->chunked = true;
        else if (!strcasecmp(line, "Content-Length")) {
            c->has_length = true;
            c->remaining = strtoll(v, NULL, 10);
        } else if (!strcasecmp(line, "Retry-After"))
            snprintf(c->retry_after, sizeof c->retry_after, "%s", v);
        else if (!strcasecmp(line, "Content-Type"))
            snprintf(c->content_type, sizeof c->content_type, "%s", v);
    }
    if (c->chunked)
        c->remaining = 0;
    return 0;
}

long rn_body(rn_conn *c, char *out, size_t cap)
{
    if (c->body_done)
        return 0;
    if (c->chunked && c->remaining == 0) {
        char line[64];
        int r = rn_line(c, line, sizeof line);
        if (r < 0)
            return r;
        if (!line[0]) { /* the CRLF after a chunk's data */
            r = rn_line(c, line, sizeof line);
            if (r < 0)
                return r;
        }
        char *end;
        long long size = strtoll(line, &end, 16);
        if (end == line || size < 0)
            return -1;
        if (size == 0) {
            rn_line(c, line, sizeof line); /* the empty trailer line */
            c->body_done = true;
            return 0;
        }
        c->remaining = size;
    }
    if (!c->chunked && c->has_length && c->remaining == 0) {
        c->body_done = true;
        return 0;
    }
    while (c->pos == c->len) {
        int r = rn_fill(c);
        if (r == 0) {
            if (!c->chunked && !c->has_length) {
                c->body_done = true;
                return 0;
            }
            return -1;
        }
        if (r < 0)
            return r;
    }
    size_t avail = c->len - c->pos;
    if (c->chunked || c->has_length)
        if ((int64_t)avail > c->remaining)
            avail = (size_t)c->remaining;
    if (avail > cap)
        avail = cap;
    memcpy(out, c->buf + c->pos, avail);
    c->pos += avail;
    if (c->chunked || c->has_length)
        c->remaining -= (int64_t)avail;
    return (long)avail;
}

int rn_body_all(rn_conn *c, char **out, size_t *len, size_t max)
{
    size_t cap = 4096, n = 0;
    char *b = sw_malloc(cap + 1);
    if (!b)
        return -1;
    for (;;) {
        if (cap - n < 4096) {
            if (cap > max) {
                sw_free(b);
                return -1;
            }
            char *nb = sw_realloc(b, cap * 2 + 1);
            if (!nb) {
                sw_free(b);
                return -1;
            }
            b = nb;
            cap *= 2;
        }
        long r = rn_body(c, b + n, cap - n);
        if (r == 0)
            break;
        if (r < 0) {
            sw_free(b);
            return (int)r;
        }
        n += (size_t)r;
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

void rn_close(rn_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

int rn_get(const char *address, const char *path, int timeout_ms, char **body)
{
    rn_conn c;
    size_t len;
    *body = NULL;
    if (rn_request(&c, address, "GET", path, NULL, NULL, 0, -1, timeout_ms) != 0) {
        rn_close(&c);
        return -1;
    }
    int st = c.status;
    if (rn_body_all(&c, body, &len, (size_t)1 << 20) != 0)
        st = -1;
    rn_close(&c);
    return st;
}
