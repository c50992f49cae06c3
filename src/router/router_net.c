/* router_net.c - blocking HTTP/1.1 client for the router's upstream side
 * (router_net.h explains why blocking), and the pool of idle worker
 * connections it reuses. */
#include "router/router_net.h"

#include "api/http1.h"

#include "router/router_tls.h"

#include "common/alloc.h"
#include "common/textbuf.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* An idle connection younger than this is used without looking at it
 * first (a poll per request): a worker closes one only at its own idle
 * time-out (http-timeout, seconds) or when it exits, and a connection
 * found closed is sent again by the stale-connection retry below. */
#define RN_POOL_FRESH_MS 1000

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
    const char *default_port = NULL;
    if (!strncmp(address, "http://", 7))
        address += 7;
    else if (!strncmp(address, "https://", 8))
        address += 8, default_port = "443";
    char host[256], port[16];
    size_t hostport_len = strcspn(address, "/");
    const char *colon = memchr(address, ':', hostport_len);
    if (address[0] == '[') { /* [v6]:PORT */
        const char *close = memchr(address, ']', hostport_len);
        colon = close && close[1] == ':' ? close + 1 : NULL;
        if (!close || (size_t)(close - address - 1) >= sizeof host)
            return -1;
        memcpy(host, address + 1, (size_t)(close - address - 1));
        host[close - address - 1] = 0;
    } else {
        size_t host_len = colon ? (size_t)(colon - address) : hostport_len;
        if (host_len >= sizeof host)
            return -1;
        memcpy(host, address, host_len);
        host[host_len] = 0;
    }
    if (colon)
        snprintf(port, sizeof port, "%.*s", (int)(address + hostport_len - colon - 1), colon + 1);
    else if (default_port)
        snprintf(port, sizeof port, "%s", default_port);
    else
        return -1;
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
        /* a request goes out in more than one write (head, then body): with
         * Nagle's algorithm the second waits for the worker's delayed ACK,
         * about 40 ms on Linux */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static double rn_now_s(void);

int rn_sendv(int fd, struct iovec *iov, int n_iov, int timeout_ms)
{
    double until = timeout_ms >= 0 ? rn_now_s() + timeout_ms / 1000.0 : 0;
    int flags = MSG_NOSIGNAL | (timeout_ms >= 0 ? MSG_DONTWAIT : 0);
    int i = 0;
    while (i < n_iov && iov[i].iov_len == 0)
        i++;
    while (i < n_iov) {
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = iov + i;
        m.msg_iovlen = (size_t)(n_iov - i);
        ssize_t w = sendmsg(fd, &m, flags);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && timeout_ms >= 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            double left = until - rn_now_s();
            struct pollfd p = {fd, POLLOUT, 0};
            if (left <= 0)
                return -1;
            if (poll(&p, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR)
                return -1;
            continue;
        }
        if (w <= 0)
            return -1;
        size_t left = (size_t)w;
        while (i < n_iov && left >= iov[i].iov_len)
            left -= iov[i++].iov_len;
        if (i < n_iov) {
            iov[i].iov_base = (char *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
        }
    }
    return 0;
}

/* Head and body in one sendmsg where the socket takes them, so that the
 * worker reads the whole request in one wake-up, not the head alone and
 * then the body. Over TLS, two records (the socket is non-blocking there:
 * the per-read time-out bounds the writes). */
static int rn_write_request(rn_conn *c, const char *head, size_t head_len, const char *body,
                            size_t body_len)
{
    if (c->tls)
        return rn_tls_write(c->tls, head, head_len, c->timeout_ms) ||
                       (body && body_len && rn_tls_write(c->tls, body, body_len, c->timeout_ms))
                   ? -1
                   : 0;
    struct iovec iov[2] = {{(void *)head, head_len}, {(void *)body, body ? body_len : 0}};
    return rn_sendv(c->fd, iov, 2, -1);
}

static double rn_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads more bytes into the buffer (compacting it first). Waits on the
 * upstream and, when set, watches the client for a hang-up.
 *
 * poll, then recv, rather than one blocking recv with a time-out: a
 * thread asleep in recv on a Unix socket is woken by every write-space
 * event of that socket too (the worker reading our request frees its
 * buffer space), so each answer cost two context switches; poll waits
 * for input only. */
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
    short want = POLLIN;
    for (;;) {
        /* the overall bound, checked before every wait: bytes that keep
         * coming slowly must not carry a read past it */
        if (c->deadline_s > 0 && rn_now_s() >= c->deadline_s) {
            c->timed_out = true;
            return -1;
        }
        /* TLS: a record already decrypted is not on the socket any more */
        if (c->tls && rn_tls_pending(c->tls) > 0) {
            long r = rn_tls_read(c->tls, c->buf + c->len, sizeof c->buf - c->len, &want);
            if (r > 0) {
                c->len += (size_t)r;
                c->received += (size_t)r;
                return (int)r;
            }
        }
        struct pollfd p[2] = {{c->fd, want, 0}, {c->watch_fd, POLLRDHUP, 0}};
        int n = poll(p, c->watch_fd >= 0 ? 2 : 1, 100);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (c->watch_fd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            c->client_gone = true;
            return -2;
        }
        if (p[0].revents && c->tls) {
            long r = rn_tls_read(c->tls, c->buf + c->len, sizeof c->buf - c->len, &want);
            if (r == -4)
                continue; /* a record not yet whole, or a handshake message */
            if (r <= 0)
                return r == 0 ? 0 : -1;
            want = POLLIN;
            c->len += (size_t)r;
            c->received += (size_t)r;
            return (int)r;
        }
        if (p[0].revents) {
            ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return r == 0 ? 0 : -1;
            c->len += (size_t)r;
            c->received += (size_t)r;
            return (int)r;
        }
        waited += 100;
        if (waited >= c->timeout_ms) {
            c->timed_out = true;
            return -1;
        }
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

/* Sends the request on the open c->fd and reads the status line and
 * headers; returns as rn_request (-1: the write failed). */
static int rn_exchange(rn_conn *c, const char *method, const char *path,
                       const char *extra_headers, const char *body, size_t body_len,
                       bool keep_alive)
{
    char head[4096];
    sw_tb t;
    sw_tb_init(&t, head, sizeof head);
    sw_tb_str(&t, method);
    SW_TB_LIT(&t, " ");
    sw_tb_str(&t, path);
    SW_TB_LIT(&t, " HTTP/1.1\r\n");
    if (c->up) {
        /* the upstream's own Host, and its key: in the request only */
        char up_headers[1500];
        int n = rn_upstream_headers(c->up, up_headers, sizeof up_headers);
        if (n < 0)
            return -1;
        sw_tb_put(&t, up_headers, (size_t)n);
    } else {
        SW_TB_LIT(&t, "Host: worker\r\n");
    }
    SW_TB_LIT(&t, "Connection: ");
    sw_tb_str(&t, keep_alive ? "keep-alive" : "close");
    SW_TB_LIT(&t, "\r\n");
    sw_tb_str(&t, extra_headers ? extra_headers : "");
    SW_TB_LIT(&t, "Content-Type: application/json\r\nContent-Length: ");
    sw_tb_u64(&t, body ? body_len : 0);
    SW_TB_LIT(&t, "\r\n\r\n");
    if (!sw_tb_ok(&t) || rn_write_request(c, head, t.len, body, body_len))
        return -1;
    char line[4096];
    int r, minor = 1;
    for (;;) {
        r = rn_line(c, line, sizeof line);
        if (r < 0)
            return r == -2 ? -2 : -3;
        /* "HTTP/1.x NNN[ reason]" (api/http1.h), a final status 200..599;
         * an interim 1xx head (100 Continue, 103 Early Hints) is skipped */
        if (!api_http_status_line(line, strlen(line), &c->status, &minor))
            return -3;
        if (c->status >= 200)
            break;
        if (c->status == 101)
            return -3; /* no upgrade was asked for */
        do { /* the interim head's fields, to its empty line */
            r = rn_line(c, line, sizeof line);
            if (r < 0)
                return r == -2 ? -2 : -3;
        } while (line[0]);
    }
    /* HTTP/1.1 keeps the connection unless it says close; 1.0 is not reused */
    c->keep_alive = keep_alive && minor == 1;
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
            int64_t cl;
            if (!api_http_content_length(v, strlen(v), &cl))
                return -3; /* not a length (digits only): the framing is unknown */
            c->has_length = true;
            c->remaining = cl;
        } else if (!strcasecmp(line, "Connection") && strcasestr(v, "close"))
            c->keep_alive = false;
        else if (!strcasecmp(line, "Retry-After"))
            snprintf(c->retry_after, sizeof c->retry_after, "%s", v);
        else if (!strcasecmp(line, "Content-Type"))
            snprintf(c->content_type, sizeof c->content_type, "%s", v);
    }
    if (c->chunked)
        c->remaining = 0;
    if (!c->chunked && !c->has_length)
        c->keep_alive = false; /* the body ends with the connection */
    return 0;
}

static void rn_conn_init(rn_conn *c, int watch_fd, int timeout_ms)
{
    memset(c, 0, offsetof(rn_conn, buf));
    c->fd = -1;
    c->watch_fd = watch_fd;
    c->timeout_ms = timeout_ms;
    c->pool_slot = -1;
}

/* Connects c to address: the socket, and TLS on it for an https://
 * upstream (router_tls.h). 0, or -1 with c->fd closed. */
static int rn_open(rn_conn *c, const char *address, int timeout_ms)
{
    c->up = rn_upstream_find(address);
    c->fd = rn_connect(address, timeout_ms);
    if (c->fd < 0)
        return -1;
    if (c->up && rn_upstream_tls(c->up)) {
        c->tls = rn_tls_open(c->up, c->fd, timeout_ms);
        if (!c->tls) {
            close(c->fd);
            c->fd = -1;
            return -1;
        }
    }
    return 0;
}

int rn_request(rn_conn *c, const char *address, const char *method, const char *path,
               const char *extra_headers, const char *body, size_t body_len, int watch_fd,
               int timeout_ms)
{
    return rn_request_until(c, address, method, path, extra_headers, body, body_len, watch_fd,
                            timeout_ms, 0);
}

int rn_request_until(rn_conn *c, const char *address, const char *method, const char *path,
                     const char *extra_headers, const char *body, size_t body_len, int watch_fd,
                     int timeout_ms, double deadline_s)
{
    rn_conn_init(c, watch_fd, timeout_ms);
    c->deadline_s = deadline_s;
    if (rn_open(c, address, timeout_ms))
        return -1;
    return rn_exchange(c, method, path, extra_headers, body, body_len, false);
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
        if (c->chunk_data_read) { /* the CRLF after a chunk's data, required */
            if (line[0])
                return -1;
            r = rn_line(c, line, sizeof line);
            if (r < 0)
                return r;
        }
        /* chunk-size = 1*HEXDIG, then an optional extension after ';' */
        int64_t size;
        if (!api_http_chunk_size(line, strlen(line), &size))
            return -1;
        if (size == 0) {
            /* trailer fields (none from our workers), then an empty line */
            do {
                r = rn_line(c, line, sizeof line);
                if (r < 0)
                    return r;
            } while (line[0]);
            c->body_done = true;
            return 0;
        }
        c->remaining = size;
        c->chunk_data_read = true;
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
    rn_tls_free(c->tls);
    c->tls = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}


/* ---- the pool of idle worker connections ----------------------------------
 *
 * One slot per upstream address (a worker's address never changes while
 * the router runs), each a LIFO stack of idle sockets: the one used last is
 * reused first, so the older ones expire when traffic falls. All under one
 * mutex, held only to push or pop (never during I/O). The supervisor drops
 * a slot when its worker exits, is killed or stops answering
 * (rn_pool_drop); the generation in rn_target catches what it could miss,
 * and the slot's epoch makes a connection in use when its slot was dropped
 * close at its rn_release instead of going back. */

#define RN_POOL_SLOTS 64
#define RN_POOL_MAX_IDLE 32

typedef struct rn_pool_slot {
    char address[640];
    uint64_t generation;
    uint64_t epoch;          /* bumped at every drop */
    int n_idle;
    int fd[RN_POOL_MAX_IDLE];
    struct ssl_st *tls[RN_POOL_MAX_IDLE]; /* TLS on fd[i], or NULL */
    double idle_since_s[RN_POOL_MAX_IDLE];
} rn_pool_slot;

static struct {
    pthread_mutex_t mu;
    rn_pool_slot slots[RN_POOL_SLOTS];
    int n_slots;
    rn_pool_counts counts;
} rn_pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t rn_pool_once = PTHREAD_ONCE_INIT;
static bool rn_pool_off;         /* SPILLWAY_UPSTREAM_POOL=0 */
static bool rn_pool_no_idle_check; /* SPILLWAY_FAULT router_pool_no_idle_check */

static void rn_pool_read_env(void)
{
    const char *v = getenv("SPILLWAY_UPSTREAM_POOL");
    rn_pool_off = v && !strcmp(v, "0");
    /* test hook: reuse idle connections without looking at them first, so
     * that the stale-connection retry is what copes with a closed one */
    v = getenv("SPILLWAY_FAULT");
    rn_pool_no_idle_check = v && strstr(v, "router_pool_no_idle_check");
}

/* The slot of address (created when absent); -1 when the table is full
 * or the address too long. Called with rn_pool.mu held. */
static int rn_slot_locked(const char *address)
{
    for (int i = 0; i < rn_pool.n_slots; i++)
        if (!strcmp(rn_pool.slots[i].address, address))
            return i;
    if (rn_pool.n_slots == RN_POOL_SLOTS ||
        strlen(address) >= sizeof rn_pool.slots[0].address)
        return -1;
    rn_pool_slot *s = &rn_pool.slots[rn_pool.n_slots];
    memset(s, 0, sizeof *s);
    snprintf(s->address, sizeof s->address, "%s", address);
    return rn_pool.n_slots++;
}

/* Closes an idle connection (its TLS first). */
static void rn_idle_close(int fd, struct ssl_st *tls)
{
    rn_tls_free(tls);
    close(fd);
}

/* Closes every idle connection of s. Called with rn_pool.mu held. */
static void rn_slot_clear_locked(rn_pool_slot *s)
{
    for (int i = 0; i < s->n_idle; i++)
        rn_idle_close(s->fd[i], s->tls[i]);
    rn_pool.counts.discarded += (uint64_t)s->n_idle;
    s->n_idle = 0;
}

/* An idle connection to t (its slot and epoch in *slot, *epoch, also when
 * none is returned; its TLS in *tls), or -1. One the worker has closed, or
 * that has bytes nobody asked for, is discarded on the way. */
static int rn_pool_take(const rn_target *t, int *slot, uint64_t *epoch, struct ssl_st **tls)
{
    *tls = NULL;
    for (;;) {
        pthread_mutex_lock(&rn_pool.mu);
        int i = rn_slot_locked(t->address);
        *slot = i;
        if (i < 0) {
            pthread_mutex_unlock(&rn_pool.mu);
            return -1;
        }
        rn_pool_slot *s = &rn_pool.slots[i];
        if (t->generation < s->generation) {
            /* a caller that read the worker table before a restart: its
             * connection is its own, the slot stays with the new process */
            *slot = -1;
            pthread_mutex_unlock(&rn_pool.mu);
            return -1;
        }
        if (s->generation != t->generation) {
            /* another process now: what was opened to the last one goes */
            rn_slot_clear_locked(s);
            s->generation = t->generation;
            s->epoch++;
        }
        *epoch = s->epoch;
        int fd = -1;
        double now = rn_now_s(), idle_s = 0;
        while (s->n_idle > 0 && fd < 0) {
            fd = s->fd[--s->n_idle];
            *tls = s->tls[s->n_idle];
            idle_s = now - s->idle_since_s[s->n_idle];
            if (idle_s > RN_POOL_IDLE_MS / 1000.0) {
                rn_idle_close(fd, *tls);
                *tls = NULL;
                rn_pool.counts.discarded++;
                fd = -1;
            }
        }
        if (fd >= 0)
            rn_pool.counts.reused++;
        pthread_mutex_unlock(&rn_pool.mu);
        if (fd < 0 || rn_pool_no_idle_check || idle_s < RN_POOL_FRESH_MS / 1000.0)
            return fd;
        /* an idle connection has nothing to read: readable means the worker
         * closed it (its idle time-out, its exit) */
        struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
        if (poll(&p, 1, 0) == 0)
            return fd;
        rn_idle_close(fd, *tls);
        *tls = NULL;
        pthread_mutex_lock(&rn_pool.mu);
        rn_pool.counts.reused--;
        rn_pool.counts.discarded++;
        pthread_mutex_unlock(&rn_pool.mu);
    }
}

/* One exchange of a pooled request on fd (reused: it came from the pool). */
static int rn_pooled_exchange(rn_conn *c, int fd, struct ssl_st *tls, bool reused, int slot,
                              uint64_t epoch,
                              const rn_target *t, const char *method, const char *path,
                              const char *extra_headers, const char *body, size_t body_len,
                              int watch_fd, int timeout_ms)
{
    rn_conn_init(c, watch_fd, timeout_ms);
    c->fd = fd;
    c->tls = tls;
    c->up = rn_upstream_find(t->address);
    c->reused = reused;
    c->pool_slot = slot;
    c->pool_epoch = epoch;
    c->max_idle = t->max_idle < 1 ? 1 : t->max_idle > RN_POOL_MAX_IDLE ? RN_POOL_MAX_IDLE
                                                                        : t->max_idle;
    if (!reused) { /* a reused one was counted when it was taken */
        pthread_mutex_lock(&rn_pool.mu);
        rn_pool.counts.opened++;
        pthread_mutex_unlock(&rn_pool.mu);
    }
    return rn_exchange(c, method, path, extra_headers, body, body_len, true);
}

int rn_request_pooled(rn_conn *c, const rn_target *t, const char *method, const char *path,
                      const char *extra_headers, const char *body, size_t body_len,
                      int watch_fd, int timeout_ms)
{
    pthread_once(&rn_pool_once, rn_pool_read_env);
    if (!t->pool || rn_pool_off)
        return rn_request(c, t->address, method, path, extra_headers, body, body_len,
                          watch_fd, timeout_ms);
    int slot = -1;
    uint64_t epoch = 0;
    struct ssl_st *tls = NULL;
    int fd = rn_pool_take(t, &slot, &epoch, &tls);
    if (fd < 0) {
        rn_conn_init(c, watch_fd, timeout_ms);
        if (rn_open(c, t->address, timeout_ms))
            return -1;
        return rn_pooled_exchange(c, c->fd, c->tls, false, slot, epoch, t, method, path,
                                  extra_headers, body, body_len, watch_fd, timeout_ms);
    }
    int rc = rn_pooled_exchange(c, fd, tls, true, slot, epoch, t, method, path, extra_headers,
                                body, body_len, watch_fd, timeout_ms);
    /* The stale-connection race: the worker closed this idle connection
     * (its idle time-out) while we were sending on it. Sending the
     * request again on a new connection is safe when it was reused, the
     * write failed or the connection ended before a single response
     * byte, and no read timed out, because then the worker did not
     * start the request:
     *  - evhttp reads a request whole before its handler runs, and
     *    closes a connection without answering only while no request
     *    is in progress on it (idle time-out, free at exit) or when the
     *    process dies. A worker that runs a request either answers
     *    (every error path of worker_http.c sends a response) or dies;
     *    it never hangs up on a request it started.
     *  - So an EOF before any byte means: the request was never read,
     *    or the process died. The retry connects anew to the same
     *    address. A dead process's listening socket is closed with it,
     *    so the connect fails, and the caller gets -3, the crash it
     *    would have seen without the pool (no second execution: no
     *    other process listens there until the supervisor reaped the
     *    dead one and started a new one, after its back-off and a model
     *    load). If the connect slipped in while the dying process still
     *    had its listener, nothing ever accepts it and it ends without
     *    a response too: -3 again, and not retried a second time.
     *  - evhttp's own time-out (http-timeout) cannot close a connection
     *    whose request is being served without a byte: libevent stops
     *    reading a connection once its request is dispatched (see
     *    on_gone_check in worker_http.c), so no read time-out runs then.
     *  - A time-out on our side is not stale: the worker may be running
     *    the request; and once one response byte came, the worker had
     *    started: both are failures as before, never sent again. */
    if (!((rc == -1 || rc == -3) && c->received == 0 && !c->timed_out))
        return rc;
    rn_close(c);
    pthread_mutex_lock(&rn_pool.mu);
    rn_pool.counts.stale_retries++;
    pthread_mutex_unlock(&rn_pool.mu);
    rn_conn_init(c, watch_fd, timeout_ms);
    if (rn_open(c, t->address, timeout_ms))
        return -3; /* reached a moment ago, gone now: a crash before the response */
    return rn_pooled_exchange(c, c->fd, c->tls, false, slot, epoch, t, method, path,
                              extra_headers, body, body_len, watch_fd, timeout_ms);
}

int rn_body_drain(rn_conn *c, int wait_ms)
{
    char sink[4096];
    int saved = c->timeout_ms;
    c->timeout_ms = wait_ms;
    long n;
    /* bounded: a stream's end is a few bytes after its last event */
    for (int i = 0; i < 64 && (n = rn_body(c, sink, sizeof sink)) > 0; i++)
        ;
    c->timeout_ms = saved;
    return c->body_done ? 0 : -1;
}

void rn_release(rn_conn *c)
{
    if (c->fd < 0)
        return;
    bool reusable = c->pool_slot >= 0 && c->keep_alive && c->body_done && !c->client_gone &&
                    c->pos == c->len && /* nothing beyond the response */
                    (!c->tls || rn_tls_pending(c->tls) == 0);
    if (reusable) {
        pthread_mutex_lock(&rn_pool.mu);
        rn_pool_slot *s = &rn_pool.slots[c->pool_slot];
        if (s->epoch == c->pool_epoch && s->n_idle < c->max_idle) {
            s->fd[s->n_idle] = c->fd;
            s->tls[s->n_idle] = c->tls;
            s->idle_since_s[s->n_idle] = rn_now_s();
            s->n_idle++;
            c->fd = -1;
            c->tls = NULL;
        }
        pthread_mutex_unlock(&rn_pool.mu);
    }
    rn_close(c);
}

void rn_pool_drop(const char *address)
{
    pthread_mutex_lock(&rn_pool.mu);
    for (int i = 0; i < rn_pool.n_slots; i++) {
        rn_pool_slot *s = &rn_pool.slots[i];
        if (!strcmp(s->address, address)) {
            rn_slot_clear_locked(s);
            s->epoch++;
        }
    }
    pthread_mutex_unlock(&rn_pool.mu);
}

void rn_pool_sweep(void)
{
    pthread_mutex_lock(&rn_pool.mu);
    double now = rn_now_s();
    for (int i = 0; i < rn_pool.n_slots; i++) {
        rn_pool_slot *s = &rn_pool.slots[i];
        /* the oldest are at the bottom of the stack */
        int expired = 0;
        while (expired < s->n_idle &&
               now - s->idle_since_s[expired] > RN_POOL_IDLE_MS / 1000.0) {
            rn_idle_close(s->fd[expired], s->tls[expired]);
            expired++;
        }
        if (expired) {
            memmove(s->fd, s->fd + expired, (size_t)(s->n_idle - expired) * sizeof s->fd[0]);
            memmove(s->tls, s->tls + expired, (size_t)(s->n_idle - expired) * sizeof s->tls[0]);
            memmove(s->idle_since_s, s->idle_since_s + expired,
                    (size_t)(s->n_idle - expired) * sizeof s->idle_since_s[0]);
            s->n_idle -= expired;
            rn_pool.counts.discarded += (uint64_t)expired;
        }
    }
    pthread_mutex_unlock(&rn_pool.mu);
}

void rn_pool_close_all(void)
{
    pthread_mutex_lock(&rn_pool.mu);
    for (int i = 0; i < rn_pool.n_slots; i++) {
        rn_slot_clear_locked(&rn_pool.slots[i]);
        rn_pool.slots[i].epoch++;
    }
    pthread_mutex_unlock(&rn_pool.mu);
}

void rn_pool_get_counts(rn_pool_counts *out)
{
    pthread_mutex_lock(&rn_pool.mu);
    *out = rn_pool.counts;
    out->idle = 0;
    for (int i = 0; i < rn_pool.n_slots; i++)
        out->idle += rn_pool.slots[i].n_idle;
    pthread_mutex_unlock(&rn_pool.mu);
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
