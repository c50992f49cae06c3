/* log.c - see log.h. One write(2) per line, so lines from threads and
 * processes sharing stderr do not interleave mid-line; and no stdio lock:
 * threads logging at once (the router logs every request) never wait on
 * each other while one of them is in the system call. */
#include "common/log.h"
#include "common/alloc.h"

#include "common/textbuf.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
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

/* "2026-01-02T03:04:05.678Z" into out (at least 25 bytes); its length. */
static int format_stamp(char *out, size_t cap)
{
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    sw_tb t;
    sw_tb_init(&t, out, cap);
    sw_tb_u64_pad(&t, (uint64_t)(tm.tm_year + 1900), 4);
    SW_TB_LIT(&t, "-");
    sw_tb_u64_pad(&t, (uint64_t)tm.tm_mon + 1, 2);
    SW_TB_LIT(&t, "-");
    sw_tb_u64_pad(&t, (uint64_t)tm.tm_mday, 2);
    SW_TB_LIT(&t, "T");
    sw_tb_u64_pad(&t, (uint64_t)tm.tm_hour, 2);
    SW_TB_LIT(&t, ":");
    sw_tb_u64_pad(&t, (uint64_t)tm.tm_min, 2);
    SW_TB_LIT(&t, ":");
    sw_tb_u64_pad(&t, (uint64_t)tm.tm_sec, 2);
    SW_TB_LIT(&t, ".");
    sw_tb_u64_pad(&t, (uint64_t)(now.tv_nsec / 1000000) % 1000, 3);
    SW_TB_LIT(&t, "Z");
    return (int)t.len;
}

void sw_log(sw_log_level level, const char *module, const char *fmt, ...)
{
    va_list ap;

    pthread_once(&env_once, read_env);
    if (level < current_level || level >= SW_LOG_OFF)
        return;
    if (json_lines) {
        char message[2048], stamp[64];
        va_start(ap, fmt);
        vsnprintf(message, sizeof message, fmt, ap);
        va_end(ap);
        format_stamp(stamp, sizeof stamp);
        json_t *line = json_pack("{s:s, s:s, s:s, s:s}", "time", stamp, "level",
                                 level_names[level], "module", module, "msg",
                                 message);
        char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
        if (text) {
            size_t n = strlen(text);
            text[n] = '\n'; /* json_dumps's terminator: the line is written by length */
            write_line(text, n + 1);
        }
        sw_free(text); /* json_dumps: may be a reserve block (alloc.h) */
        json_decref(line);
        return;
    }
    /* the prefix, then the message formatted right after it: one buffer */
    char text[2200];
    sw_tb t;
    sw_tb_init(&t, text, sizeof text);
    t.len = (size_t)format_stamp(text, sizeof text);
    /* the level, left-aligned in 5 columns */
    static const char pad[] = "     ";
    size_t ln = strlen(level_names[level]);
    SW_TB_LIT(&t, " ");
    sw_tb_put(&t, level_names[level], ln);
    sw_tb_put(&t, pad, ln < 5 ? 5 - ln : 0);
    SW_TB_LIT(&t, " ");
    sw_tb_str(&t, module);
    SW_TB_LIT(&t, ": ");
    int n = (int)t.len;
    if (!sw_tb_ok(&t) || (size_t)n >= sizeof text - 2)
        return;
    va_start(ap, fmt);
    int m = vsnprintf(text + n, sizeof text - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    n += m;
    if ((size_t)n > sizeof text - 2)
        n = (int)sizeof text - 2; /* cut: still one line */
    text[n++] = '\n';
    write_line(text, (size_t)n);
}
