/* log.c - see log.h. One write(2) per line, so lines from threads and
 * processes sharing stderr do not interleave mid-line; and no stdio lock:
 * threads logging at once (the router logs every request) never wait on
 * each other while one of them is in the system call. */
#include "common/log.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static sw_log_level current_level = SW_LOG_INFO;
static bool json_lines;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static const char *level_names[] = {"debug", "info", "warn", "error", "off"};

int sw_log_parse_level(const char *name)
{
    for (int i = 0; i <= SW_LOG_OFF; i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

static void read_env(void)
{
    const char *level = getenv("SPILLWAY_LOG");
    const char *json = getenv("SPILLWAY_LOG_JSON");
    if (level && sw_log_parse_level(level) >= 0)
        current_level = (sw_log_level)sw_log_parse_level(level);
    if (json && strcmp(json, "0") != 0 && json[0])
        json_lines = true;
}

void sw_log_set_level(sw_log_level level)
{
    pthread_once(&env_once, read_env);
    current_level = level;
}

void sw_log_set_json(bool json)
{
    pthread_once(&env_once, read_env);
    json_lines = json;
}

sw_log_level sw_log_get_level(void)
{
    pthread_once(&env_once, read_env);
    return current_level;
}

/* The whole line to stderr; a short write goes on (a full pipe), a
 * failure drops the line (logging never stops the caller). */
static void write_line(const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

void sw_log(sw_log_level level, const char *module, const char *fmt, ...)
{
    char message[2048];
    char stamp[64];
    struct timespec now;
    struct tm tm;
    va_list ap;

    pthread_once(&env_once, read_env);
    if (level < current_level || level >= SW_LOG_OFF)
        return;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);

    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (long)(now.tv_nsec / 1000000) % 1000);

    if (json_lines) {
        json_t *line = json_pack("{s:s, s:s, s:s, s:s}", "time", stamp, "level",
                                 level_names[level], "module", module, "msg",
                                 message);
        char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
        if (text) {
            size_t n = strlen(text);
            text[n] = '\n'; /* json_dumps's terminator: the line is written by length */
            write_line(text, n + 1);
        }
        free(text);
        json_decref(line);
    } else {
        char text[2200];
        int n = snprintf(text, sizeof text, "%s %-5s %s: %s\n", stamp, level_names[level],
                         module, message);
        if (n > 0 && (size_t)n >= sizeof text) {
            n = (int)sizeof text - 1; /* cut: still one line */
            text[n - 1] = '\n';
        }
        if (n > 0)
            write_line(text, (size_t)n);
    }
}
