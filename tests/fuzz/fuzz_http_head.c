/* fuzz_http_head.c - libFuzzer harness for the router's client side: the
 * request head parser, Content-Length framing, Expect: 100-continue,
 * keep-alive and pipelining (router_http.c), through rt__conn_serve, the
 * one entry point a client connection reaches.
 *
 * Input: one byte of options (bit 0: an API key is required), then the
 * bytes a client sends on one connection, which may hold several
 * pipelined requests. They are written into one end of a socketpair whose
 * other end a harness thread serves with rt__conn_serve on a router that
 * has no workers (a generation is parsed and answered 503) and no job
 * runners, with its ledger in a fresh temporary directory (on /dev/shm
 * when there is one; removed at exit), as the router always has one,
 * while this thread reads what the router answers.
 *
 * Invariants on the answer bytes: they are a sequence of whole HTTP/1.1
 * responses and nothing else, each framed by a Content-Length equal to its
 * body's bytes (or chunked, well formed), with a status in 100..599, an
 * X-Request-Id, and a Connection header on final responses; a 4xx is
 * JSON with a string error.code and error.message; nothing follows a
 * response that says Connection: close; there are no more final responses
 * than request heads, at most one 100 Continue before each, and a first
 * request with a complete head and no body gets an answer.
 */
#include "common/log.h"
#include "router/router-impl.h"
#include "router/router_net.h"

#include "fuzzlib.h"

#include <errno.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_API_KEY "fuzz-key-0123456789"

static rt_config fz_cfg;
static rt_router fz_rt;

/* ---- the serving thread ---------------------------------------------------- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int fd;      /* to serve, -1 none */
    bool done;
} fz_s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, -1, false};

static void *serve_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&fz_s.mu);
        while (fz_s.fd < 0)
            pthread_cond_wait(&fz_s.cond, &fz_s.mu);
        int fd = fz_s.fd;
        pthread_mutex_unlock(&fz_s.mu);
        pthread_mutex_lock(&fz_rt.mu);
        fz_rt.active_conns++;
        pthread_mutex_unlock(&fz_rt.mu);
        rt__conn_serve(&fz_rt, fd, NULL); /* closes fd; its own head buffer */
        pthread_mutex_lock(&fz_s.mu);
        fz_s.fd = -1;
        fz_s.done = true;
        pthread_cond_broadcast(&fz_s.cond);
        pthread_mutex_unlock(&fz_s.mu);
    }
    return NULL;
}

static char fz_state_dir[256];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void cleanup(void)
{
    if (fz_rt.ledger)
        ldg_close(fz_rt.ledger);
    fz_rt.ledger = NULL;
    if (fz_state_dir[0])
        nftw(fz_state_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* The ledger, in a directory of its own under /dev/shm (no disk syncs) or
 * $TMPDIR. */
static bool open_ledger(void)
{
    struct stat st;
    const char *tmp = getenv("TMPDIR");
    const char *root = stat("/dev/shm", &st) == 0 && access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                       : tmp && *tmp                                            ? tmp
                                                                                : "/tmp";
    sw_error err;
    snprintf(fz_state_dir, sizeof fz_state_dir, "%s/spillway-fuzz-http-XXXXXX", root);
    if (!mkdtemp(fz_state_dir)) {
        fz_state_dir[0] = 0;
        return false;
    }
    atexit(cleanup);
    if (ldg_open(fz_state_dir, &fz_rt.ledger, &err) != SW_OK) {
        fprintf(stderr, "fuzz_http_head: %s\n", err.message);
        return false;
    }
    return true;
}

static bool setup(void)
{
    static int state; /* 0 not tried, 1 ready, -1 failed */
    if (state)
        return state > 0;
    state = -1;
    if (!getenv("SPILLWAY_LOG"))
        sw_log_set_level(SW_LOG_ERROR); /* a line per request otherwise */
    rt_config_defaults(&fz_cfg);
    fz_cfg.http_timeout_s = 2;
    fz_cfg.keepalive_timeout_s = 1;
    fz_cfg.keepalive_max_requests = 32;
    fz_cfg.max_body_bytes = 2048;
    fz_cfg.queue_size = 0;
    fz_cfg.queue_timeout_ms = 0;
    snprintf(fz_cfg.api_keys[0], sizeof fz_cfg.api_keys[0], "%s", FZ_API_KEY);
    fz_rt.cfg = &fz_cfg;
    fz_rt.n_models = 1; /* a [model] section alone: "model" left to the workers */
    snprintf(fz_rt.models[0].cfg.name, sizeof fz_rt.models[0].cfg.name, "fuzz");
    fz_rt.models[0].tok = (eng_tokenizer *)fz_builtin_tokenizer();
    fz_rt.models[0].family = ENG_CHAT_CHATML;
    if (!fz_rt.models[0].tok || pthread_mutex_init(&fz_rt.mu, NULL) != 0 || !open_ledger())
        return false;
    rt_pool_init(&fz_rt.pool, &fz_cfg);
    rt_queue_init(&fz_rt.queue, &fz_rt.pool, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, serve_main, NULL) != 0)
        return false;
    pthread_detach(t);
    state = 1;
    return true;
}

/* Sends the input and reads every answer byte (both at once, so neither
 * side blocks on a full buffer). *out: sw_free. */
static bool exchange(int fd, const uint8_t *in, size_t in_len, char **out, size_t *out_len)
{
    size_t sent = 0, cap = 65536, got = 0;
    char *buf = sw_malloc(cap + 1);
    if (!buf)
        return false;
    if (in_len == 0)
        shutdown(fd, SHUT_WR);
    for (;;) {
        struct pollfd p = {fd, (short)(POLLIN | (sent < in_len ? POLLOUT : 0)), 0};
        int ready = poll(&p, 1, 10000);
        if (ready < 0 && errno == EINTR)
            continue; /* libFuzzer's alarm: its signal ends a poll early */
        if (ready <= 0)
            break; /* the router holds a request for at most http-timeout */
        if ((p.revents & POLLOUT) && sent < in_len) {
            ssize_t w = send(fd, in + sent, in_len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0)
                sent += (size_t)w;
            if (w < 0 && errno != EAGAIN && errno != EINTR)
                sent = in_len; /* the router closed: no more to send */
            if (sent == in_len)
                shutdown(fd, SHUT_WR);
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            if (got == cap) {
                char *grown = sw_realloc(buf, cap * 2 + 1);
                if (!grown)
                    break;
                buf = grown;
                cap *= 2;
            }
            ssize_t r = recv(fd, buf + got, cap - got, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                break;
            if (r > 0)
                got += (size_t)r;
        }
    }
    buf[got] = 0;
    *out = buf;
    *out_len = got;
    return true;
}

/* ---- checking the answers ---------------------------------------------------- */

/* The value of header name in head[0..len) (CRLF lines), copied into
 * out; false when absent. */
static bool header(const char *head, size_t len, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *line = head; line < head + len;) {
        const char *eol = memmem(line, (size_t)(head + len - line), "\r\n", 2);
        size_t line_len = eol ? (size_t)(eol - line) : (size_t)(head + len - line);
        if (line_len > n && line[n] == ':' && !strncasecmp(line, name, n)) {
            const char *v = line + n + 1;
            while (v < line + line_len && *v == ' ')
                v++;
            snprintf(out, cap, "%.*s", (int)(line + line_len - v), v);
            return true;
        }
        line += line_len + 2;
    }
    return false;
}

/* A JSON answer parses; a 4xx (and any answer with an "error" member:
 * /health's 503 is a status object) is an error with a code and a
 * message. */
static void check_json_body(int status, const char *body, size_t len)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    json_t *e = json_object_get(j, "error");
    FZ_CHECK(json_is_object(j));
    if (status < 500 || e) {
        FZ_CHECK(json_is_string(json_object_get(e, "code")));
        FZ_CHECK(json_is_string(json_object_get(e, "message")));
        FZ_CHECK(json_string_length(json_object_get(e, "message")) > 0);
    }
    json_decref(j);
}

/* A chunked body starting at p: its length in bytes, or 0 when malformed. */
static size_t chunked_length(const char *p, size_t avail)
{
    size_t at = 0;
    for (;;) {
        const char *eol = memmem(p + at, avail - at, "\r\n", 2);
        FZ_CHECK(eol);
        char *end;
        unsigned long long n = strtoull(p + at, &end, 16);
        FZ_CHECK(end == eol && end != p + at);
        at = (size_t)(eol - p) + 2;
        FZ_CHECK(n <= avail - at);
        at += (size_t)n;
        FZ_CHECK(avail - at >= 2 && !memcmp(p + at, "\r\n", 2));
        at += 2;
        if (n == 0)
            return at;
    }
}

static void check_answers(const char *out, size_t len, const uint8_t *in, size_t in_len)
{
    size_t heads = 0, finals = 0, at = 0;
    bool continued = false; /* a 100 Continue since the last final response */
    for (const uint8_t *p = in; (p = memmem(p, in_len - (size_t)(p - in), "\r\n\r\n", 4)); p += 4)
        heads++;
    bool closed = false;
    while (at < len) {
        FZ_CHECK(!closed); /* nothing after Connection: close */
        const char *end = memmem(out + at, len - at, "\r\n\r\n", 4);
        FZ_CHECK(end && len - at >= 12 && !memcmp(out + at, "HTTP/1.1 ", 9));
        const char *head = out + at;
        size_t head_len = (size_t)(end - head) + 4;
        int status = atoi(head + 9);
        FZ_CHECK(status >= 100 && status <= 599);
        at += head_len;
        if (status == 100) {
            FZ_CHECK(head_len == 25); /* "HTTP/1.1 100 Continue\r\n\r\n" */
            FZ_CHECK(!continued);
            continued = true;
            continue;
        }
        continued = false;
        finals++;
        char value[256], ctype[128] = "";
        FZ_CHECK(header(head, head_len, "X-Request-Id", value, sizeof value) && value[0]);
        FZ_CHECK(header(head, head_len, "Connection", value, sizeof value));
        FZ_CHECK(!strcmp(value, "close") || !strcmp(value, "keep-alive"));
        closed = !strcmp(value, "close");
        header(head, head_len, "Content-Type", ctype, sizeof ctype);
        size_t body_len;
        if (header(head, head_len, "Content-Length", value, sizeof value)) {
            char *e;
            unsigned long long n = strtoull(value, &e, 10);
            FZ_CHECK(*e == 0 && e != value && n <= len - at);
            body_len = (size_t)n;
            if (status >= 400 && !strcmp(ctype, "application/json"))
                check_json_body(status, out + at, body_len);
        } else {
            FZ_CHECK(header(head, head_len, "Transfer-Encoding", value, sizeof value) &&
                     !strcmp(value, "chunked"));
            body_len = chunked_length(out + at, len - at);
        }
        at += body_len;
    }
    /* one answer per request head (a head over 16 KiB without its end is
     * refused once, as too large) */
    FZ_CHECK(finals <= heads + (in_len >= 16384));
    /* a first request whose head is complete and that has no body is
     * always answered */
    const uint8_t *first_end = memmem(in, in_len, "\r\n\r\n", 4);
    if (first_end) {
        size_t n = (size_t)(first_end - in);
        bool may_have_body = false;
        for (size_t i = 0; i + 14 <= n && !may_have_body; i++)
            may_have_body = !strncasecmp((const char *)in + i, "Content-Length", 14) ||
                            !strncasecmp((const char *)in + i, "Transfer-Encoding", 14);
        if (!may_have_body && !memchr(in, 0, n) && n + 4 <= 16384)
            FZ_CHECK(finals >= 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    if (size < 1 || !setup() || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return 0;
    fz_cfg.n_keys = data[0] & 1;

    pthread_mutex_lock(&fz_s.mu);
    fz_s.done = false;
    fz_s.fd = sv[1];
    pthread_cond_broadcast(&fz_s.cond);
    pthread_mutex_unlock(&fz_s.mu);

    char *out = NULL;
    size_t out_len = 0;
    bool ok = exchange(sv[0], data + 1, size - 1, &out, &out_len);

    pthread_mutex_lock(&fz_s.mu);
    while (!fz_s.done)
        pthread_cond_wait(&fz_s.cond, &fz_s.mu);
    pthread_mutex_unlock(&fz_s.mu);
    close(sv[0]);
    if (ok)
        check_answers(out, out_len, data + 1, size - 1);
    sw_free(out);
    return 0;
}
