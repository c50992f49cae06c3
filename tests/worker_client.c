/* worker_client.c - see worker_client.h. */
#include "worker_client.h"

#include "api/http1.h"

#include "testutil.h"

#include "common/alloc.h"
#include "modelgen/model_make.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/prctl.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define WC_MAX_STARTED 256
static pid_t started[WC_MAX_STARTED];
static int n_started;

void wc_worker_kill_all(void)
{
    for (int i = 0; i < n_started; i++) {
        int status;
        if (started[i] > 0 && waitpid(started[i], &status, WNOHANG) == 0) {
            kill(started[i], SIGKILL);
            waitpid(started[i], &status, 0);
        }
        started[i] = 0;
    }
    n_started = 0;
}

int wc_worker_wait(wc_worker *w, int timeout_s)
{
    double end = now_s() + timeout_s;
    int status;
    while (w->pid > 0) {
        pid_t r = waitpid(w->pid, &status, WNOHANG);
        if (r == w->pid) {
            w->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        if (r < 0) {
            w->pid = 0;
            return -1;
        }
        if (now_s() > end)
            return -1;
        usleep(10000);
    }
    return -1;
}

int wc_worker_stop(wc_worker *w)
{
    if (w->pid <= 0)
        return -1;
    kill(w->pid, SIGTERM);
    int st = wc_worker_wait(w, 10);
    if (st < 0 && w->pid > 0) {
        kill(w->pid, SIGKILL);
        st = wc_worker_wait(w, 10);
    }
    unlink(w->socket_path);
    return st;
}

pid_t wc_worker_start_tcp(const char *model, const char *log_path, int timeout_s, int *port)
{
    const char *bin = tu_spillway_bin();
    *port = 0;
    if (!bin)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(bin, bin, "worker", "--model", model, "--listen", "127.0.0.1:0", "--threads", "1",
              (char *)NULL);
        _exit(127);
    }
    static const char said[] = "listening on 127.0.0.1:";
    double end = now_s() + timeout_s;
    while (*port == 0 && now_s() < end) {
        char *text = tu_read_file(log_path, NULL);
        const char *at = text ? strstr(text, said) : NULL;
        if (at)
            *port = atoi(at + strlen(said));
        sw_free(text);
        if (*port == 0)
            usleep(10000);
    }
    if (*port > 0)
        return pid;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

int wc_worker_start(wc_worker *w, const char *model, const char *const *args,
                    const char *const *env, int timeout_s, int *exit_status)
{
    static int counter;
    const char *bin = tu_spillway_bin();
    char listen[600];
    const char *argv[64];
    int n = 0;

    memset(w, 0, sizeof *w);
    if (exit_status)
        *exit_status = -1;
    if (!bin)
        return -1;
    /* unix socket paths are short (108 bytes): /tmp, not the build tree. */
    snprintf(w->socket_path, sizeof w->socket_path, "/tmp/sw-wk-%d-%d.sock", (int)getpid(),
             counter++);
    char log_name[64];
    snprintf(log_name, sizeof log_name, "worker-%d.log", counter);
    snprintf(w->log_path, sizeof w->log_path, "%s", tu_tmp_path(log_name));
    snprintf(listen, sizeof listen, "unix:%s", w->socket_path);
    unlink(w->socket_path);
    argv[n++] = bin;
    argv[n++] = "worker";
    argv[n++] = "--model";
    argv[n++] = model;
    argv[n++] = "--listen";
    argv[n++] = listen;
    for (int i = 0; args && args[i] && n < 62; i++)
        argv[n++] = args[i];
    argv[n] = NULL;

    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* The worker dies with the test, even when an assertion or a
         * time-out ends the test abruptly. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(127);
        int fd = open(w->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    w->pid = pid;
    if (n_started < WC_MAX_STARTED)
        started[n_started++] = pid;
    double end = now_s() + timeout_s;
    while (now_s() < end) {
        wc_response r;
        if (wc_request(w->socket_path, "GET", "/health", NULL, 2000, &r) == 0) {
            int st = r.status;
            wc_response_free(&r);
            if (st == 200)
                return 0;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            w->pid = 0;
            if (exit_status)
                *exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            return -1;
        }
        usleep(20000);
    }
    wc_worker_stop(w);
    return -1;
}

void wc_response_free(wc_response *r)
{
    sw_free(r->headers);
    sw_free(r->body);
    memset(r, 0, sizeof *r);
}

bool wc_header(const wc_response *r, const char *name, char *buf, size_t cap)
{
    const char *fields = r->headers ? strstr(r->headers, "\r\n") : NULL, *v;
    size_t vn;
    if (!fields || !cap ||
        !api_http_find_field(fields + 2, r->headers + strlen(r->headers), name, &v, &vn))
        return false;
    if (vn >= cap)
        vn = cap - 1;
    memcpy(buf, v, vn);
    buf[vn] = '\0';
    return true;
}

int wc_connect(const char *socket_path, int timeout_ms)
{
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", socket_path);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* To a socket: a peer that closed first is an error (EPIPE), never the
 * test process's death by SIGPIPE. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The framing is the tree's own (api/http1.h): a response the router or a
 * worker frames wrongly fails here. */
int wc_response_parse(const char *raw, size_t len, wc_response *out)
{
    memset(out, 0, sizeof *out);
    api_http_response r;
    size_t used;
    if (api_http_decode(raw, len, true, &r, &out->body, &out->body_len, &used) != 1)
        return -1;
    out->status = r.status;
    out->chunked = r.chunked;
    out->headers = sw_strndup(raw + r.final_at, r.head_len - 2 - r.final_at);
    if (!out->headers) {
        wc_response_free(out);
        return -1;
    }
    return 0;
}

static int read_response(int fd, int timeout_ms, wc_response *out)
{
    size_t cap = 8192, len = 0;
    char *buf = sw_malloc(cap);
    double end = now_s() + timeout_ms / 1000.0;
    memset(out, 0, sizeof *out);
    if (!buf)
        return -1;
    for (;;) {
        if (len + 4096 > cap) {
            char *b = sw_realloc(buf, cap * 2);
            if (!b)
                break;
            buf = b;
            cap *= 2;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        int left = (int)((end - now_s()) * 1000);
        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            break;
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    int rc = wc_response_parse(buf, len, out);
    sw_free(buf);
    return rc;
}

int wc_send(int fd, const char *method, const char *path, const char *body)
{
    size_t blen = body ? strlen(body) : 0;
    size_t cap = blen + 512;
    char *raw = sw_malloc(cap);
    if (!raw)
        return -1;
    int n = snprintf(raw, cap,
                     "%s %s HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, blen);
    memcpy(raw + n, body ? body : "", blen);
    int rc = write_all(fd, raw, (size_t)n + blen);
    sw_free(raw);
    return rc;
}

int wc_raw(const char *socket_path, const char *raw, size_t len, int timeout_ms,
           wc_response *out)
{
    int fd = wc_connect(socket_path, timeout_ms);
    memset(out, 0, sizeof *out);
    if (fd < 0)
        return -1;
    int rc = write_all(fd, raw, len) == 0 ? read_response(fd, timeout_ms, out) : -1;
    close(fd);
    return rc;
}

int wc_request(const char *socket_path, const char *method, const char *path, const char *body,
               int timeout_ms, wc_response *out)
{
    int fd = wc_connect(socket_path, timeout_ms);
    memset(out, 0, sizeof *out);
    if (fd < 0)
        return -1;
    int rc = wc_send(fd, method, path, body) == 0 ? read_response(fd, timeout_ms, out) : -1;
    close(fd);
    return rc;
}

int wc_sse_parse(const char *body, size_t len, char ***events)
{
    int n = 0, cap = 16;
    char **ev = sw_calloc((size_t)cap, sizeof *ev);
    size_t i = 0;
    if (!ev)
        return -1;
    while (i < len) {
        const char *eol = memchr(body + i, '\n', len - i);
        if (!eol || strncmp(body + i, "data: ", 6) != 0)
            goto bad;
        size_t ll = (size_t)(eol - (body + i));
        if (memchr(body + i, '\r', ll))
            goto bad;
        if ((size_t)(eol - body) + 1 >= len || eol[1] != '\n')
            goto bad;
        if (n == cap) {
            char **e = sw_realloc(ev, (size_t)cap * 2 * sizeof *ev);
            if (!e)
                goto bad;
            ev = e;
            cap *= 2;
        }
        ev[n++] = sw_strndup(body + i + 6, ll - 6);
        i = (size_t)(eol - body) + 2;
    }
    *events = ev;
    return n;
bad:
    wc_sse_free(ev, n);
    return -1;
}

void wc_sse_free(char **events, int n)
{
    for (int i = 0; i < n; i++)
        sw_free(events[i]);
    sw_free(events);
}

int wc_run_tokens(const char *model, const char *prompt, const char *const *args,
                  int *tokens, int cap)
{
    const char *argv[48];
    int n = 0, status = -1, count = -1;
    char *out = NULL;
    argv[n++] = tu_spillway_bin();
    argv[n++] = "run";
    argv[n++] = "-m";
    argv[n++] = model;
    argv[n++] = "-p";
    argv[n++] = prompt;
    argv[n++] = "--json";
    for (int i = 0; args && args[i] && n < 46; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    if (!argv[0] || tu_run_capture((char *const *)argv, 60, &out, &status) != 0)
        return -1;
    json_t *j = status == 0 ? json_loads(out, 0, NULL) : NULL;
    json_t *t = json_object_get(j, "tokens");
    if (json_is_array(t)) {
        count = 0;
        for (size_t i = 0; i < json_array_size(t) && count < cap; i++)
            tokens[count++] = (int)json_integer_value(json_array_get(t, i));
    }
    json_decref(j);
    sw_free(out);
    return count;
}

int wc_tokens_of(const wc_response *r, bool stream, int *tokens, int cap, char **text_out,
                 char *finish, size_t finish_cap)
{
    int count = 0;
    size_t tl = 0;
    char *text = sw_calloc(1, r->body_len + 1);
    if (finish && finish_cap)
        finish[0] = '\0';
    if (!text)
        return -1;
    if (!stream) {
        json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
        json_t *ids = json_object_get(json_object_get(j, "spillway"), "token_ids");
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        json_t *tx = json_object_get(c0, "text");
        if (!tx)
            tx = json_object_get(json_object_get(c0, "message"), "content");
        if (!json_is_array(ids) || !json_is_string(tx)) {
            json_decref(j);
            sw_free(text);
            return -1;
        }
        for (size_t i = 0; i < json_array_size(ids) && count < cap; i++)
            tokens[count++] = (int)json_integer_value(json_array_get(ids, i));
        memcpy(text, json_string_value(tx), json_string_length(tx));
        if (finish && json_is_string(json_object_get(c0, "finish_reason")))
            snprintf(finish, finish_cap, "%s", json_string_value(json_object_get(c0, "finish_reason")));
        json_decref(j);
    } else {
        char **ev;
        int n = wc_sse_parse(r->body, r->body_len, &ev);
        if (n < 1 || strcmp(ev[n - 1], "[DONE]") != 0) {
            if (n >= 0)
                wc_sse_free(ev, n);
            sw_free(text);
            return -1;
        }
        for (int e = 0; e < n - 1; e++) {
            json_t *j = json_loads(ev[e], 0, NULL);
            if (!j || json_object_get(j, "error")) {
                json_decref(j);
                count = -1;
                break;
            }
            json_t *ids = json_object_get(json_object_get(j, "spillway"), "token_ids");
            for (size_t i = 0; i < json_array_size(ids) && count < cap; i++)
                tokens[count++] = (int)json_integer_value(json_array_get(ids, i));
            json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
            json_t *tx = json_object_get(c0, "text");
            if (!tx)
                tx = json_object_get(json_object_get(c0, "delta"), "content");
            if (json_is_string(tx)) {
                memcpy(text + tl, json_string_value(tx), json_string_length(tx));
                tl += json_string_length(tx);
            }
            if (finish && json_is_string(json_object_get(c0, "finish_reason")))
                snprintf(finish, finish_cap, "%s",
                         json_string_value(json_object_get(c0, "finish_reason")));
            json_decref(j);
        }
        wc_sse_free(ev, n);
    }
    if (text_out)
        *text_out = text;
    else
        sw_free(text);
    return count;
}

/* Text and token ids of a completions stream, chunk by chunk: texts[i]
 * (sw_free each) is what the client had after chunk i, ids[i] the last
 * token id of chunk i (-1 when it carried none). Returns the chunk count. */
int wc_stream_chunks(const wc_response *r, char **texts, int *ids, int cap)
{
    char **evs = NULL;
    int ne = wc_sse_parse(r->body, r->body_len, &evs);
    int n = 0;
    size_t len = 0;
    char *acc = sw_calloc(1, 1);
    for (int e = 0; e < ne && n < cap; e++) {
        json_t *j = json_loads(evs[e], 0, NULL);
        if (!j)
            continue;
        const char *t = json_string_value(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        size_t tl = t ? strlen(t) : 0;
        acc = sw_realloc(acc, len + tl + 1);
        memcpy(acc + len, t ? t : "", tl + 1);
        len += tl;
        json_t *tid = json_object_get(json_object_get(j, "spillway"), "token_ids");
        ids[n] = json_array_size(tid) ? (int)json_integer_value(json_array_get(tid, json_array_size(tid) - 1)) : -1;
        texts[n++] = sw_strdup(acc);
        json_decref(j);
    }
    sw_free(acc);
    wc_sse_free(evs, ne);
    return n;
}

int wc_worker_start_made(wc_worker *w, const char *file, uint64_t seed, int ctx_limit,
                         char *model_path, size_t cap)
{
    eng_model_make_params p = eng_model_make_default_params();
    p.n_vocab = 1024;
    p.seed = seed;
    snprintf(model_path, cap, "%s", tu_tmp_path(file));
    if (eng_model_make(&p, model_path, NULL) != 0 || !tu_spillway_bin())
        return -1;
    char ctx[16];
    snprintf(ctx, sizeof ctx, "%d", ctx_limit);
    const char *const args[] = {"--max-seqs", "2", "--threads", "1", "--ctx-limit", ctx, NULL};
    return wc_worker_start(w, model_path, args, NULL, 30, NULL);
}

int wc_worker_stop_made(wc_worker *w, const char *model_path)
{
    int st = wc_worker_stop(w);
    remove(model_path);
    wc_worker_kill_all();
    return st == 0 ? 0 : -1;
}
