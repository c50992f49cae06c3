/* drill_http.c - the drill's HTTP/1.1 client: what a user's client does,
 * written independently of the router's and the worker's code so that a
 * framing or header mistake there shows up as a failed check here.
 *
 * One request per connection ("Connection: close"), blocking I/O with a
 * time-out per read, bodies with Content-Length, chunked or ending at EOF.
 * A callback sees the body as it grows, so a scenario can time the first
 * token or hang up mid-stream. Also: Prometheus sample lookup and strict
 * SSE splitting.
 */
#include "drill/drill_impl.h"

#include "api/http1.h"
#include "api/sse.h"
#include "common/alloc.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

double dh_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dh_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !dr_interrupted)
        ;
}

int dh_connect(const char *address, int timeout_ms)
{
    if (strncmp(address, "unix:", 5) == 0) {
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        const char *path = address + 5;
        if (!*path || strlen(path) >= sizeof un.sun_path)
            return -1;
        memcpy(un.sun_path, path, strlen(path) + 1);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        if (connect(fd, (struct sockaddr *)&un, sizeof un) < 0) {
            close(fd);
            return -1;
        }
        return fd;
    }
    if (strncmp(address, "http://", 7) == 0)
        address += 7;
    char host[256], port[16];
    const char *colon = strrchr(address, ':');
    if (!colon || colon == address)
        return -1;
    size_t hl = (size_t)(colon - address);
    const char *p = colon + 1;
    size_t pl = strcspn(p, "/");
    if (hl >= sizeof host || pl == 0 || pl >= sizeof port)
        return -1;
    memcpy(host, address, hl);
    host[hl] = '\0';
    memcpy(port, p, pl);
    port[pl] = '\0';
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) || !res)
        return -1;
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        /* a non-blocking connect bounded by the time-out */
        struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR && !dr_interrupted)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Incremental response reading: raw bytes in, head and de-chunked body out
 * (the framing is api/http1's). */
typedef struct parser {
    char *raw;
    size_t raw_len, raw_cap;
    size_t pos;          /* first raw byte not yet consumed (after the head) */
    bool have_head;
    bool close_framed;   /* the body ends with the connection */
    api_http_body body;
    bool done;
    bool overflow;
} parser;

static int body_append(dh_response *out, const char *p, size_t n, parser *ps)
{
    if (out->body_len + n > DH_MAX_BODY) {
        ps->overflow = true;
        return -1;
    }
    char *nb = sw_realloc(out->body, out->body_len + n + 1);
    if (!nb)
        return -1;
    memcpy(nb + out->body_len, p, n);
    out->body = nb;
    out->body_len += n;
    nb[out->body_len] = '\0';
    return 0;
}

/* Consumes what it can of raw; returns -1 on a malformed response. */
static int parse_step(parser *ps, dh_response *out)
{
    if (!ps->have_head) {
        api_http_response r;
        int h = api_http_response_head(ps->raw, ps->raw_len, 65536, &r);
        if (h <= 0)
            return h;
        /* the final head's status line and fields, each line with its CRLF */
        out->headers = sw_strndup(ps->raw + r.final_at, r.head_len - 2 - r.final_at);
        if (!out->headers)
            return -1;
        out->status = r.status;
        out->t_headers = dh_now();
        ps->have_head = true;
        ps->pos = r.head_len;
        ps->close_framed = !r.chunked && !r.has_length;
        api_http_body_init(&ps->body, &r);
        ps->done = ps->body.done;
        if (!out->body && body_append(out, "", 0, ps))
            return -1;
    }
    while (!ps->done && ps->pos < ps->raw_len) {
        const char *d;
        size_t dn;
        long k = api_http_body_next(&ps->body, ps->raw + ps->pos, ps->raw_len - ps->pos, &d, &dn);
        if (k < 0)
            return -1;
        if (k == 0)
            break;
        if (dn && body_append(out, d, dn, ps))
            return -1;
        ps->pos += (size_t)k;
        ps->done = ps->body.done;
    }
    return 0;
}

int dh_exchange(const char *address, const char *method, const char *path,
                const char *extra_headers, const char *body, int timeout_ms, dh_body_fn on_body,
                void *user, dh_response *out)
{
    memset(out, 0, sizeof *out);
    int fd = dh_connect(address, timeout_ms);
    if (fd < 0) {
        out->t_end = dh_now();
        out->broken = true;
        return -1;
    }
    size_t blen = body ? strlen(body) : 0;
    size_t cap = blen + (extra_headers ? strlen(extra_headers) : 0) + strlen(path) + 256;
    char *req = sw_malloc(cap);
    parser ps = {0};
    int rc = 0;
    if (!req) {
        close(fd);
        return -1;
    }
    int hl;
    if (body)
        hl = snprintf(req, cap,
                      "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n%s"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, extra_headers ? extra_headers : "", blen);
    else
        hl = snprintf(req, cap, "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n%s\r\n",
                      method, path, extra_headers ? extra_headers : "");
    if (hl < 0 || (size_t)hl + blen >= cap) {
        sw_free(req);
        close(fd);
        return -1;
    }
    memcpy(req + hl, body ? body : "", blen);
    if (send_all(fd, req, (size_t)hl + blen)) {
        /* the answer may still be there (a refusal before reading the body) */
    }
    sw_free(req);
    /* With a callback, wake every 20 ms so it can decide to hang up even
     * while nothing arrives (a non-stream request being replayed). */
    int slice_ms = on_body ? 20 : timeout_ms;
    double idle_since = dh_now();
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, slice_ms);
        if (pr < 0 && errno == EINTR) {
            if (dr_interrupted) {
                out->broken = true;
                break;
            }
            continue;
        }
        if (pr == 0 && (dh_now() - idle_since) * 1000.0 < timeout_ms) {
            if (on_body && on_body(user, out->body ? out->body : "", out->body_len)) {
                out->stopped = true;
                break;
            }
            continue;
        }
        if (pr <= 0) {
            out->broken = true; /* time-out */
            break;
        }
        idle_since = dh_now();
        if (ps.raw_len + 16384 > ps.raw_cap) {
            size_t nc = ps.raw_cap ? ps.raw_cap * 2 : 32768;
            if (nc > DH_MAX_BODY + 65536u) {
                out->broken = true;
                break;
            }
            char *nr = sw_realloc(ps.raw, nc);
            if (!nr) {
                out->broken = true;
                break;
            }
            ps.raw = nr;
            ps.raw_cap = nc;
        }
        ssize_t n = recv(fd, ps.raw + ps.raw_len, ps.raw_cap - ps.raw_len, 0);
        if (n < 0 && errno == EINTR && !dr_interrupted)
            continue;
        if (n < 0) {
            out->broken = true;
            break;
        }
        if (n == 0) {
            /* EOF: the end of a close-delimited body, else a broken one */
            if (ps.have_head && ps.close_framed)
                ps.done = true;
            else if (!ps.done)
                out->broken = true;
            break;
        }
        ps.raw_len += (size_t)n;
        if (parse_step(&ps, out)) {
            out->broken = true;
            break;
        }
        if (on_body && on_body(user, out->body ? out->body : "", out->body_len)) {
            out->stopped = true;
            break;
        }
        if (ps.done)
            break;
    }
    out->complete = ps.done && !ps.overflow;
    out->t_end = dh_now();
    if (!out->body && !out->stopped)
        out->body = sw_strdup("");
    sw_free(ps.raw);
    close(fd);
    return rc;
}

int dh_get(const char *address, const char *path, int timeout_ms, dh_response *out)
{
    return dh_exchange(address, "GET", path, NULL, NULL, timeout_ms, NULL, NULL, out);
}

void dh_response_free(dh_response *r)
{
    if (!r)
        return;
    sw_free(r->headers);
    sw_free(r->body);
    memset(r, 0, sizeof *r);
}

bool dh_header(const dh_response *r, const char *name, char *buf, size_t cap)
{
    if (!r->headers || !cap)
        return false;
    const char *fields = strstr(r->headers, "\r\n"), *v;
    size_t vn;
    if (!fields || !api_http_find_field(fields + 2, r->headers + strlen(r->headers), name, &v, &vn))
        return false;
    if (vn >= cap)
        vn = cap - 1;
    memcpy(buf, v, vn);
    buf[vn] = '\0';
    return true;
}

json_t *dh_get_json(const char *address, const char *path, int timeout_ms, int *status_out)
{
    dh_response r;
    json_t *j = NULL;
    if (dh_get(address, path, timeout_ms, &r) == 0 && r.status && r.body)
        j = json_loads(r.body, JSON_ALLOW_NUL, NULL);
    if (status_out)
        *status_out = r.status;
    dh_response_free(&r);
    return j;
}

double dh_metric(const char *text, const char *series)
{
    size_t sl = strlen(series);
    for (const char *line = text; line && *line;) {
        if (strncmp(line, series, sl) == 0 && line[sl] == ' ')
            return strtod(line + sl + 1, NULL);
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return 0.0;
}

double dh_metric_sum(const char *text, const char *name)
{
    size_t nl = strlen(name);
    double sum = 0.0;
    for (const char *line = text; line && *line;) {
        if (strncmp(line, name, nl) == 0 && (line[nl] == '{' || line[nl] == ' ')) {
            const char *v = line[nl] == ' ' ? line + nl : strchr(line, '}');
            if (v) {
                if (*v == '}')
                    v++;
                sum += strtod(v, NULL);
            }
        }
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return sum;
}

int dh_sse_split(const char *body, size_t len, char ***events, bool *framing_ok)
{
    int n = 0, cap = 0;
    char **ev = NULL;
    bool ok = true;
    size_t i = 0;
    api_sse_event sse;
    while (i < len && api_sse_next(body + i, len - i, &sse)) { /* else incomplete */
        size_t el = sse.text_len;
        const char *e = sse.text;
        if (!sse.data || memchr(e, '\n', el))
            ok = false;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **ne = sw_realloc(ev, sizeof *ev * (size_t)cap);
            if (!ne) {
                dh_sse_free(ev, n);
                return -1;
            }
            ev = ne;
        }
        ev[n] = sse.data ? sw_strndup(sse.data, sse.data_len) : sw_strndup(e, el);
        if (!ev[n]) {
            dh_sse_free(ev, n);
            return -1;
        }
        n++;
        i += sse.consumed;
    }
    if (framing_ok)
        *framing_ok = ok;
    *events = ev;
    return n;
}

void dh_sse_free(char **events, int n)
{
    for (int i = 0; i < n; i++)
        sw_free(events[i]);
    sw_free(events);
}
