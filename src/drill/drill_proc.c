/* drill_proc.c - what the drill runs besides its clients: the router
 * (`spillway serve`, the same binary, as a child process), a "second
 * model" that takes device memory from inside the drill (the way `spillway
 * hog` does, but at once, so it lands while a request is mid-generation),
 * and a tiny tool server whose calls it counts (scenario 5).
 *
 * Clean-up is part of the proof: the router dies with the drill
 * (PR_SET_PDEATHSIG) and takes its workers along; Ctrl-C stops the router
 * with SIGTERM and the drill then removes its sim-gpu pool, so no process
 * and no shared-memory pool is left behind.
 */
#include "drill/drill_impl.h"

#include "common/alloc.h"
#include "device/device.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

volatile sig_atomic_t dr_interrupted;
static volatile sig_atomic_t g_router_pid;

static void on_signal(int sig)
{
    dr_interrupted = sig;
    pid_t pid = (pid_t)g_router_pid;
    if (pid > 0)
        kill(pid, SIGTERM);
}

void dr_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: blocking calls return EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    remove(path);
    return 0;
}

static bool log_has_listen(const char *log, char *addr, size_t cap)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return false;
    char line[1024];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "spillway serve: listening on ");
        if (!p || !strchr(line, '\n'))
            continue;
        p += strlen("spillway serve: listening on ");
        size_t n = strcspn(p, " \r\n");
        if (n && n < cap) {
            memcpy(addr, p, n);
            addr[n] = '\0';
            found = true;
        }
        break;
    }
    fclose(f);
    return found;
}

/* The last lines of a log, for a message. */
static void log_tail(const char *log, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > (long)cap - 1 ? size - (long)cap + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
    for (char *p = out; *p; p++)
        if (*p == '\n' && p[1])
            *p = ' ';
}

int dr_router_start(drill *d, dr_router *r, const char *name, const char *server_extra,
                    const char *workers, char *why, size_t why_cap)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s/run/%s", d->out_dir, name);
    char parent[600];
    snprintf(parent, sizeof parent, "%s/run", d->out_dir);
    mkdir(parent, 0700);
    mkdir(r->dir, 0700);
    snprintf(r->cfg, sizeof r->cfg, "%s/router.ini", r->dir);
    snprintf(r->log, sizeof r->log, "%s/router.log", r->dir);
    snprintf(r->state_dir, sizeof r->state_dir, "%s/state", r->dir);
    snprintf(r->gpu_sock, sizeof r->gpu_sock, "unix:%s/gpu.sock", r->state_dir);
    snprintf(r->cpu_sock, sizeof r->cpu_sock, "unix:%s/cpu.sock", r->state_dir);
    /* A previous run into the same directory must not leak into this one:
     * its log holds an old "listening on" line, its state directory old
     * events and a ledger whose unfinished jobs the router would resume. */
    remove(r->log);
    nftw(r->state_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    FILE *f = fopen(r->cfg, "w");
    if (!f) {
        snprintf(why, why_cap, "cannot write %s", r->cfg);
        return -1;
    }
    fprintf(f,
            "; written by spillway drill (scenario %s)\n"
            "[server]\nlisten = 127.0.0.1:0\nstate-dir = %s\nhealth-interval-ms = 100\n"
            "ready-timeout = 60\nqueue-timeout-ms = 10000\n%s\n[model]\npath = %s\n\n%s",
            name, r->state_dir, server_extra ? server_extra : "", d->model, workers);
    fclose(f);

    char exe[1024];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) {
        snprintf(why, why_cap, "cannot find the spillway binary (/proc/self/exe)");
        return -1;
    }
    exe[el] = '\0';
    pid_t me = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != me)
            _exit(127);
        int fd = open(r->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        signal(SIGPIPE, SIG_DFL);
        if (d->sabotage[0])
            setenv("SPILLWAY_SABOTAGE", d->sabotage, 1);
        execl(exe, "spillway", "serve", "--config", r->cfg, (char *)NULL);
        _exit(127);
    }
    if (pid < 0) {
        snprintf(why, why_cap, "fork: %s", strerror(errno));
        return -1;
    }
    r->pid = pid;
    g_router_pid = pid;
    double t0 = dh_now();
    bool have_addr = false;
    while (dh_now() - t0 < 90 && !dr_interrupted) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r->pid = 0;
            g_router_pid = 0;
            char tail[400];
            log_tail(r->log, tail, sizeof tail);
            snprintf(why, why_cap, "the router exited with status %d: %s",
                     WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), tail);
            return -1;
        }
        /* only a whole line counts (log_has_listen wants its newline) */
        have_addr = log_has_listen(r->log, r->address, sizeof r->address);
        if (have_addr) {
            int status = 0;
            json_t *h = dh_get_json(r->address, "/health", 2000, &status);
            json_decref(h);
            if (status == 200)
                return 0;
        }
        dh_sleep_ms(50);
    }
    snprintf(why, why_cap, dr_interrupted ? "interrupted" : "the router did not become ready in 90 s (log: %s)",
             r->log);
    dr_router_stop(d, r);
    return -1;
}

int dr_router_stop(drill *d, dr_router *r)
{
    (void)d;
    if (r->pid <= 0)
        return -1;
    kill(r->pid, SIGTERM);
    double t0 = dh_now();
    int st = 0;
    for (;;) {
        pid_t w = waitpid(r->pid, &st, WNOHANG);
        if (w == r->pid)
            break;
        if (w < 0 && errno != EINTR)
            break;
        if (dh_now() - t0 > 25) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &st, 0);
            break;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    r->pid = 0;
    g_router_pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- the second model ------------------------------------------------------- */

static int hog_open(drill *d, char *why, size_t why_cap)
{
    if (d->hog_dev)
        return 0;
    dev_options opts = {0}; /* adopt the pool the GPU worker made */
    sw_error err;
    if (dev_open(d->gpu_device, &opts, &d->hog_dev, &err)) {
        snprintf(why, why_cap, "cannot open %s: %s", d->gpu_device, err.message);
        d->hog_dev = NULL;
        return -1;
    }
    return 0;
}

int dr_hog_take(drill *d, uint64_t bytes, char *why, size_t why_cap)
{
    if (hog_open(d, why, why_cap))
        return -1;
    if (bytes == 0)
        return 0;
    if (d->n_hog >= 4) {
        snprintf(why, why_cap, "the second model holds 4 allocations already");
        return -1;
    }
    sw_error err;
    void *p = NULL;
    if (bytes > SIZE_MAX || dev_alloc(d->hog_dev, (size_t)bytes, "drill-hog", &p, &err)) {
        snprintf(why, why_cap, "the second model did not fit: %s",
                 bytes > SIZE_MAX ? "too large" : err.message);
        return -1;
    }
    d->hog_ptr[d->n_hog] = p;
    d->hog_bytes[d->n_hog] = (size_t)bytes;
    d->n_hog++;
    return 0;
}

void dr_hog_release(drill *d)
{
    for (int i = 0; i < d->n_hog; i++)
        if (d->hog_dev && d->hog_ptr[i])
            dev_free(d->hog_dev, d->hog_ptr[i], d->hog_bytes[i]);
    d->n_hog = 0;
}

uint64_t dr_hog_held(const drill *d)
{
    uint64_t n = 0;
    for (int i = 0; i < d->n_hog; i++)
        n += d->hog_bytes[i];
    return n;
}

int dr_pool_used(drill *d, uint64_t *used_excluding_hog)
{
    char why[512];
    if (hog_open(d, why, sizeof why))
        return -1;
    dev_memory m;
    sw_error err;
    if (dev_memory_info(d->hog_dev, &m, &err))
        return -1;
    *used_excluding_hog = m.used_bytes - m.self_bytes;
    return 0;
}

void dr_hog_close(drill *d)
{
    dr_hog_release(d);
    if (d->hog_dev)
        dev_close(d->hog_dev);
    d->hog_dev = NULL;
}

void dr_cleanup(drill *d)
{
    if (d->router.pid > 0)
        dr_router_stop(d, &d->router);
    dr_tool_server_stop(&d->tools);
    dr_hog_close(d);
    if (d->pool[0]) {
        sw_error err;
        dev_sim_unlink(d->pool, &err);
    }
}

/* ---- the tool server ------------------------------------------------------------ */

static void tool_answer(int fd, int status, const char *text)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, status == 200 ? "OK" : "Bad Request", strlen(text));
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) == n)
        (void)!send(fd, text, strlen(text), MSG_NOSIGNAL);
}

static bool header_of(const char *head, const char *name, char *buf, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = strstr(head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            line += nl + 1;
            while (*line == ' ')
                line++;
            size_t vl = strcspn(line, "\r\n");
            if (vl >= cap)
                vl = cap - 1;
            memcpy(buf, line, vl);
            buf[vl] = '\0';
            return true;
        }
    }
    return false;
}

static void tool_serve_one(dr_tool_server *t, int fd)
{
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[8192];
    size_t len = 0;
    char *end = NULL;
    while (!end && len < sizeof buf - 1) {
        ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (n <= 0)
            return;
        len += (size_t)n;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    if (!end)
        return;
    *end = '\0';
    char cl[32] = "0";
    header_of(buf, "Content-Length", cl, sizeof cl);
    size_t want = (size_t)strtoul(cl, NULL, 10);
    size_t have = len - (size_t)(end + 4 - buf);
    char *body = end + 4;
    if (want > sizeof buf - 1 - (size_t)(body - buf))
        want = sizeof buf - 1 - (size_t)(body - buf);
    while (have < want) {
        ssize_t n = recv(fd, body + have, want - have, 0);
        if (n <= 0)
            break;
        have += (size_t)n;
    }
    body[have] = '\0';
    dr_tool_call call;
    memset(&call, 0, sizeof call);
    call.time = dh_now();
    header_of(buf, "Idempotency-Key", call.key, sizeof call.key);
    header_of(buf, "X-Request-Id", call.request_id, sizeof call.request_id);
    snprintf(call.body, sizeof call.body, "%s", body);
    pthread_mutex_lock(&t->lock);
    if (t->n_calls < DR_MAX_TOOL_CALLS)
        t->calls[t->n_calls] = call;
    t->n_calls++;
    int delay_ms = t->answer_delay_ms;
    pthread_mutex_unlock(&t->lock);
    if (delay_ms > 0)
        dh_sleep_ms(delay_ms);
    tool_answer(fd, 200, "spillway: a channel that carries a dam's overflow safely around it");
    pthread_mutex_lock(&t->lock);
    t->n_answered++;
    pthread_mutex_unlock(&t->lock);
}

static void *tool_thread(void *arg)
{
    dr_tool_server *t = arg;
    while (!t->stop) {
        struct pollfd p = {.fd = t->listen_fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept4(t->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        tool_serve_one(t, fd);
        close(fd);
    }
    return NULL;
}

int dr_tool_server_start(dr_tool_server *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    t->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (t->listen_fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(t->listen_fd, (struct sockaddr *)&a, sizeof a) || listen(t->listen_fd, 16) ||
        getsockname(t->listen_fd, (struct sockaddr *)&a, &al))
        goto fail;
    t->port = ntohs(a.sin_port);
    if (pthread_create(&t->thread, NULL, tool_thread, t))
        goto fail;
    t->running = true;
    return 0;
fail:
    close(t->listen_fd);
    t->listen_fd = -1;
    return -1;
}

void dr_tool_server_stop(dr_tool_server *t)
{
    if (!t->running)
        return;
    t->stop = true;
    pthread_join(t->thread, NULL);
    close(t->listen_fd);
    t->listen_fd = -1;
    t->running = false;
    pthread_mutex_destroy(&t->lock);
}

int dr_tool_calls(dr_tool_server *t, dr_tool_call *copy, int cap)
{
    if (!t->running)
        return 0;
    pthread_mutex_lock(&t->lock);
    int n = t->n_calls;
    for (int i = 0; i < n && i < cap && i < DR_MAX_TOOL_CALLS; i++)
        copy[i] = t->calls[i];
    pthread_mutex_unlock(&t->lock);
    return n;
}
