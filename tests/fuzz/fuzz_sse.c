/* fuzz_sse.c - libFuzzer harness for the router's side of a worker's
 * answer: the HTTP response head and body framing (router_net.c: status
 * line, headers, Content-Length, chunked) and the SSE events the relay
 * reads from it (router_attempt.c), through rt_attempt_run, the relay's
 * one entry point for an attempt.
 *
 * The input is what a buggy or compromised worker sends: one byte of
 * options (bit 0: a stream, bit 1: chat, bit 2: a kind = openai upstream,
 * bit 3: a resumed attempt, bit 4: the client already has a stream's
 * head), then the raw response bytes. A thread of this harness plays the
 * worker on a unix socket in a fresh temporary directory (removed at
 * exit): it reads the router's request, writes the input, and ends its
 * side. The relay's answer goes to the capture (no client socket).
 *
 * Invariants: the outcome is one of the enum, refused_memory only with
 * RT_OUT_REFUSED; an answer relayed as a whole (OK or a 4xx) carries a
 * real status (200..499) and exactly the body bytes the framing says,
 * computed here independently from the input (Content-Length, chunked, or
 * to the end), and a framing that cannot be read is never relayed as an
 * answer; a stream that ends OK ends with data: [DONE] and every event it
 * relayed is "data: " + JSON or [DONE], and all the text of the events
 * before [DONE] reached the client; token and text counts stay within
 * what the input holds.
 */
#include "common/log.h"
#include "router/router_attempt.h"
#include "router/router_net.h"

#include "fuzzlib.h"

#include <errno.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- the fake worker ---------------------------------------------------- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    const uint8_t *answer; /* set while armed */
    size_t answer_len;
    int phase;             /* 0 idle, 1 armed, 2 served */
    int lfd;
    char dir[256], sock[300];
} fz_w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, -1, "", ""};

/* Reads the router's request (head and Content-Length body), so that
 * closing never resets the connection under unread bytes. */
static void read_request(int fd)
{
    char buf[8192];
    size_t have = 0;
    char *end = NULL;
    while (!end && have < sizeof buf - 1) {
        ssize_t r = recv(fd, buf + have, sizeof buf - 1 - have, 0);
        if (r <= 0)
            return;
        have += (size_t)r;
        buf[have] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    if (!end)
        return;
    const char *cl = strcasestr(buf, "\r\nContent-Length:");
    size_t body = cl ? strtoul(cl + 17, NULL, 10) : 0;
    size_t got = have - (size_t)(end + 4 - buf);
    while (got < body) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0)
            return;
        got += (size_t)r;
    }
}

static void *worker_main(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(fz_w.lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return NULL;
        }
        pthread_mutex_lock(&fz_w.mu);
        while (fz_w.phase != 1)
            pthread_cond_wait(&fz_w.cond, &fz_w.mu);
        const uint8_t *answer = fz_w.answer;
        size_t len = fz_w.answer_len;
        pthread_mutex_unlock(&fz_w.mu);

        read_request(fd);
        for (size_t at = 0; at < len;) {
            ssize_t w = send(fd, answer + at, len - at, MSG_NOSIGNAL);
            if (w <= 0)
                break;
            at += (size_t)w;
        }
        shutdown(fd, SHUT_WR);
        char sink[4096];
        while (recv(fd, sink, sizeof sink, 0) > 0)
            ; /* until the router closes its end */
        close(fd);

        pthread_mutex_lock(&fz_w.mu);
        fz_w.phase = 2;
        pthread_cond_broadcast(&fz_w.cond);
        pthread_mutex_unlock(&fz_w.mu);
    }
}

static void worker_cleanup(void)
{
    if (fz_w.sock[0])
        unlink(fz_w.sock);
    if (fz_w.dir[0])
        rmdir(fz_w.dir);
}

static bool worker_start(void)
{
    static int started; /* 0 not tried, 1 running, -1 failed */
    if (started)
        return started > 0;
    started = -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(fz_w.dir, sizeof fz_w.dir, "%s/spillway-fuzz-sse-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fz_w.dir)) {
        fz_w.dir[0] = 0;
        return false;
    }
    atexit(worker_cleanup);
    snprintf(fz_w.sock, sizeof fz_w.sock, "%s/w.sock", fz_w.dir);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(fz_w.sock) >= sizeof sa.sun_path)
        return false;
    memcpy(sa.sun_path, fz_w.sock, strlen(fz_w.sock) + 1);
    fz_w.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fz_w.lfd < 0 || bind(fz_w.lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(fz_w.lfd, 8) != 0)
        return false;
    pthread_t t;
    if (pthread_create(&t, NULL, worker_main, NULL) != 0)
        return false;
    pthread_detach(t);
    started = 1;
    return true;
}

/* ---- the framing, independently ------------------------------------------
 * What router_net.c promises to read from a response: a status line
 * "HTTP/1.x NNN", header lines ending at an empty line (LF or CRLF), then a
 * body framed by chunked transfer coding, Content-Length, or the end of
 * the connection. */

typedef struct fz_answer {
    bool head_ok;        /* the status line and the headers can be read */
    bool ok;             /* and the whole body */
    int status;
    char *body;          /* de-chunked (sw_free); when !ok, what could be read */
    size_t body_len;
} fz_answer;

typedef struct fz_cursor {
    const uint8_t *p;
    size_t len, pos;
} fz_cursor;

/* One line without its LF (and a CR before it); false when there is no
 * LF or the line has cap bytes or more. */
static bool next_line(fz_cursor *c, char *out, size_t cap)
{
    const uint8_t *nl = memchr(c->p + c->pos, '\n', c->len - c->pos);
    if (!nl)
        return false;
    size_t n = (size_t)(nl - (c->p + c->pos));
    size_t m = n > 0 && c->p[c->pos + n - 1] == '\r' ? n - 1 : n;
    if (m >= cap)
        return false;
    memcpy(out, c->p + c->pos, m);
    out[m] = 0;
    c->pos += n + 1;
    return true;
}

static bool body_append(fz_answer *a, const uint8_t *p, size_t n)
{
    char *grown = sw_realloc(a->body, a->body_len + n + 1);
    if (!grown)
        return false;
    a->body = grown;
    memcpy(a->body + a->body_len, p, n);
    a->body_len += n;
    a->body[a->body_len] = 0;
    return true;
}

static void frame(const uint8_t *p, size_t len, fz_answer *a)
{
    fz_cursor c = {p, len, 0};
    char line[4096];
    bool chunked = false, has_length = false;
    long long length = 0;
    memset(a, 0, sizeof *a);
    for (;;) {
        if (!next_line(&c, line, sizeof line) || strncmp(line, "HTTP/1.", 7) || strlen(line) < 12)
            return;
        a->status = atoi(line + 9);
        if (a->status < 100 || a->status >= 200)
            break;
        /* an interim head (100 Continue, 103 Early Hints) is skipped to
         * its empty line; 101 (an upgrade nobody asked for) is unreadable */
        if (a->status == 101)
            return;
        do {
            if (!next_line(&c, line, sizeof line))
                return;
        } while (line[0]);
    }
    for (;;) {
        if (!next_line(&c, line, sizeof line))
            return;
        if (!line[0])
            break;
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        *colon = 0;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        if (!strcasecmp(line, "Transfer-Encoding") && strstr(v, "chunked")) {
            chunked = true;
        } else if (!strcasecmp(line, "Content-Length")) {
            char *end;
            errno = 0;
            length = strtoll(v, &end, 10);
            if (end == v || length < 0 || errno)
                return;
            has_length = true;
        }
    }
    if (!body_append(a, (const uint8_t *)"", 0))
        return;
    a->head_ok = true;
    if (chunked) {
        for (;;) {
            char size_line[64];
            if (!next_line(&c, size_line, sizeof size_line))
                return;
            if (!size_line[0] && !next_line(&c, size_line, sizeof size_line))
                return;
            char *end;
            long long n = strtoll(size_line, &end, 16);
            if (end == size_line || n < 0)
                return;
            if (n == 0) {
                do {
                    if (!next_line(&c, size_line, sizeof size_line))
                        return;
                } while (size_line[0]);
                break;
            }
            if ((unsigned long long)n > c.len - c.pos) {
                body_append(a, c.p + c.pos, c.len - c.pos); /* what a reader got */
                return;
            }
            if (!body_append(a, c.p + c.pos, (size_t)n))
                return;
            c.pos += (size_t)n;
        }
    } else if (has_length) {
        if ((unsigned long long)length > c.len - c.pos) {
            body_append(a, c.p + c.pos, c.len - c.pos);
            return;
        }
        if (!body_append(a, c.p + c.pos, (size_t)length))
            return;
    } else if (!body_append(a, c.p + c.pos, c.len - c.pos)) {
        return;
    }
    a->ok = true;
}

/* ---- the attempt ---------------------------------------------------------- */

static rt_config fz_cfg;
static rt_router fz_rt;

/* The text bytes of the events before [DONE] in a stream's body: every
 * one reaches the client (resume.text_bytes counts them). */
static size_t stream_text_bytes(const fz_answer *a, bool chat)
{
    size_t total = 0;
    for (const char *at = a->body; at < a->body + a->body_len;) {
        const char *sep = memmem(at, (size_t)(a->body + a->body_len - at), "\n\n", 2);
        if (!sep)
            break;
        if (!strncmp(at, "data: ", 6)) {
            size_t n = (size_t)(sep - at) - 6;
            if (n == 6 && !memcmp(at + 6, "[DONE]", 6))
                break;
            json_t *j = json_loadb(at + 6, n, 0, NULL);
            json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
            json_t *text = chat ? json_object_get(json_object_get(choice, "delta"), "content")
                                : json_object_get(choice, "text");
            /* a worker that splits reasoning off gives its engine's bytes
             * (one token's: at most 4096) */
            json_t *tb = json_object_get(json_object_get(j, "spillway"), "text_bytes");
            if (json_is_integer(tb) && json_integer_value(tb) >= 0 &&
                json_integer_value(tb) <= 4096)
                total += (size_t)json_integer_value(tb);
            else
                total += json_is_string(text) ? json_string_length(text) : 0;
            json_decref(j);
        }
        at = sep + 2;
    }
    return total;
}

static void check_stream(const rt_req *q, const rt_relay *r, rt_outcome o, const fz_answer *a,
                         size_t size)
{
    const rt_capture *cap = &q->cap;
    /* every relayed event is "data: " + JSON or [DONE] */
    for (size_t at = 0; at < cap->len;) {
        const char *sep = memmem(cap->body + at, cap->len - at, "\n\n", 2);
        FZ_CHECK(sep && !strncmp(cap->body + at, "data: ", 6));
        size_t n = (size_t)(sep - (cap->body + at)) - 6;
        const char *payload = cap->body + at + 6;
        if (!(n == 6 && !memcmp(payload, "[DONE]", 6))) {
            json_t *j = json_loadb(payload, n, 0, NULL);
            FZ_CHECK(j != NULL);
            json_decref(j);
        }
        at += (size_t)(sep - (cap->body + at)) + 2;
    }
    if (o == RT_OUT_OK) {
        FZ_CHECK(a->head_ok && a->status == 200 && r->finished);
        FZ_CHECK(memmem(a->body, a->body_len, "data: [DONE]", 12));
        FZ_CHECK(cap->len >= 14 && !memcmp(cap->body + cap->len - 14, "data: [DONE]\n\n", 14));
        FZ_CHECK(r->text_bytes == stream_text_bytes(a, r->chat));
    }
    /* text: what the events hold, or at most 4096 claimed per event (each
     * at least "data: {}\n\n" in the input) */
    FZ_CHECK(r->n_tokens <= size && r->text_bytes <= size * 4096 / 10 + size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint64_t generation;
    if (size < 1 || !worker_start())
        return 0;
    if (!fz_rt.cfg) {
        if (!getenv("SPILLWAY_LOG"))
            sw_log_set_level(SW_LOG_ERROR);
        rt_config_defaults(&fz_cfg);
        fz_cfg.http_timeout_s = 2;
        fz_rt.cfg = &fz_cfg;
        pthread_mutex_init(&fz_rt.mu, NULL);
        snprintf(fz_rt.pool.w[0].address, sizeof fz_rt.pool.w[0].address, "unix:%s", fz_w.sock);
        snprintf(fz_rt.pool.w[0].cfg.name, sizeof fz_rt.pool.w[0].cfg.name, "fuzz");
        fz_rt.pool.n_slots = 1;
        fz_rt.pool.n_live = 1; /* order[0] = 0 */
    }
    const uint8_t flags = data[0];
    fz_rt.pool.w[0].cfg.kind = flags & 4 ? RT_KIND_OPENAI : RT_KIND_SPILLWAY;

    rt_req q;
    memset(&q, 0, sizeof q);
    q.rt = &fz_rt;
    q.fd = -1;
    q.cap.on = true;
    q.deadline_ms = -1;
    q.job_deadline_ms = -1;
    snprintf(q.request_id, sizeof q.request_id, "fuzz-%llu", (unsigned long long)generation);
    rt_relay r;
    memset(&r, 0, sizeof r);
    r.q = &q;
    r.stream = flags & 1;
    r.chat = flags & 2;
    r.resume_base = flags & 8 ? 3 : 0;
    r.headers_sent = flags & 16;
    r.draws = -1;
    r.ttft = -1;
    r.t_start = rt__now_s();

    pthread_mutex_lock(&fz_w.mu);
    fz_w.answer = data + 1;
    fz_w.answer_len = size - 1;
    fz_w.phase = 1;
    pthread_cond_broadcast(&fz_w.cond);
    pthread_mutex_unlock(&fz_w.mu);

    static const char body[] = "{\"prompt\":\"fuzz\",\"max_tokens\":4}";
    bool refused_memory = true;
    rt_outcome o = rt_attempt_run(&r, 0, ++generation, body, sizeof body - 1, &refused_memory);
    rn_pool_drop(fz_rt.pool.w[0].address); /* the next input gets a new connection */

    pthread_mutex_lock(&fz_w.mu);
    while (fz_w.phase != 2)
        pthread_cond_wait(&fz_w.cond, &fz_w.mu);
    fz_w.phase = 0;
    pthread_mutex_unlock(&fz_w.mu);

    /* no client socket: it cannot be gone */
    FZ_CHECK(o == RT_OUT_OK || o == RT_OUT_CLIENT_ERROR || o == RT_OUT_REFUSED ||
             o == RT_OUT_OOM || o == RT_OUT_CRASH);
    FZ_CHECK(!refused_memory || o == RT_OUT_REFUSED);
    fz_answer a;
    frame(data + 1, size - 1, &a);
    FZ_CHECK(o == RT_OUT_CRASH || a.head_ok); /* any other outcome read a head */
    const bool whole = !r.stream || a.status != 200;
    if (whole && (o == RT_OUT_REFUSED || o == RT_OUT_OOM))
        FZ_CHECK(a.ok && a.status >= 500); /* a whole error answer the worker sent */
    if (whole && !r.headers_sent && (o == RT_OUT_OK || o == RT_OUT_CLIENT_ERROR)) {
        /* relayed as a whole: a real status, exactly the framed body */
        FZ_CHECK(a.ok && r.finished && r.status == a.status && q.cap.status == a.status);
        FZ_CHECK(a.status >= 200 && a.status < 500);
        FZ_CHECK((o == RT_OUT_OK) == (a.status == 200));
        FZ_CHECK(!q.cap.stream && q.cap.len == a.body_len);
        FZ_CHECK(!memcmp(q.cap.body, a.body, a.body_len));
    } else if (!whole) {
        check_stream(&q, &r, o, &a, size);
    }
    sw_free(a.body);
    sw_free(r.tokens);
    rt__capture_free(&q.cap);
    return 0;
}
