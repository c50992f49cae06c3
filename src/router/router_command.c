/* router_command.c - an engine the router runs (docs/router.md, Managed
 * external engines): `command = ...` on a kind = openai or llama-server
 * worker, split into an argv without a shell, with {host}, {port} and {model_path}
 * taken from the worker's url and its model, and the program found on
 * PATH before the fork (the child calls only execve).
 */
#include "router/router-impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int rt__pick_port(char *address, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int rc = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        snprintf(address, cap, "http://127.0.0.1:%d", ntohs(a.sin_port));
        rc = 0;
    }
    close(fd);
    return rc;
}

/* HOST and PORT of http://HOST:PORT[/...] ([v6] hosts keep brackets). */
static bool url_host_port(const char *url, char *host, size_t hcap, char *port, size_t pcap)
{
    if (strncmp(url, "http://", 7))
        return false;
    const char *h = url + 7, *end = h + strcspn(h, "/");
    const char *colon = NULL;
    for (const char *p = h; p < end; p++)
        if (*p == ':')
            colon = p;
    if (!colon || colon == h || (size_t)(colon - h) >= hcap || (size_t)(end - colon - 1) >= pcap ||
        end == colon + 1)
        return false;
    memcpy(host, h, (size_t)(colon - h));
    host[colon - h] = 0;
    memcpy(port, colon + 1, (size_t)(end - colon - 1));
    port[end - colon - 1] = 0;
    return strspn(port, "0123456789") == strlen(port);
}

/* Appends s to the argument being built; false when buf is full. */
static bool put(char *buf, size_t cap, size_t *n, const char *s, size_t len)
{
    if (*n + len + 1 > cap)
        return false;
    memcpy(buf + *n, s, len);
    *n += len;
    return true;
}

/* The program argv[0] names: as it is when it has a '/', else the first
 * executable of that name on PATH. */
static bool find_program(const char *name, char *out, size_t cap)
{
    if (strchr(name, '/')) {
        snprintf(out, cap, "%s", name);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        if (n && (size_t)snprintf(out, cap, "%.*s/%s", (int)n, p, name) < cap &&
            access(out, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

int rt__command_argv(const rt_worker *w, const char *model_path, char *buf, size_t cap,
                     const char **argv, int max, char *exe, size_t exe_cap, sw_error *err)
{
    char host[256], port[16];
    if (!url_host_port(w->address, host, sizeof host, port, sizeof port))
        return sw_error_set(err, SW_EINVAL, "its url %s is not http://HOST:PORT", w->address);
    const struct {
        const char *name, *value;
    } subst[] = {{"{host}", host}, {"{port}", port}, {"{model_path}", model_path}};
    size_t n = 0;
    int argc = 0;
    const char *p = w->cfg.command;
    while (*p) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        if (argc >= max - 1)
            return sw_error_set(err, SW_EINVAL, "command: more than %d arguments", max - 1);
        argv[argc++] = buf + n;
        char quote = 0;
        for (; *p && (quote || (*p != ' ' && *p != '\t')); p++) {
            if (!quote && (*p == '"' || *p == '\'')) {
                quote = *p;
                continue;
            }
            if (quote && *p == quote) {
                quote = 0;
                continue;
            }
            bool done = false;
            for (size_t k = 0; k < 3 && !done; k++) {
                size_t len = strlen(subst[k].name);
                if (!strncmp(p, subst[k].name, len)) {
                    if (!put(buf, cap, &n, subst[k].value, strlen(subst[k].value)))
                        return sw_error_set(err, SW_EINVAL, "command: too long");
                    p += len - 1;
                    done = true;
                }
            }
            if (!done && !put(buf, cap, &n, p, 1))
                return sw_error_set(err, SW_EINVAL, "command: too long");
        }
        if (quote)
            return sw_error_set(err, SW_EINVAL, "command: an unclosed %c quote", quote);
        buf[n++] = 0;
    }
    argv[argc] = NULL;
    if (argc == 0)
        return sw_error_set(err, SW_EINVAL, "command: empty");
    if (!find_program(argv[0], exe, exe_cap))
        return sw_error_set(err, SW_EINVAL, "command: no program '%s' (%s)", argv[0],
                            strchr(argv[0], '/') ? "not executable" : "not on PATH");
    return SW_OK;
}
