/* fault.c - SPILLWAY_FAULT: failures caused on purpose (see fault.h).
 *
 * The configuration is read from the environment once, at first use, and
 * then only changed by dev_fault_set (tests). The allocation counter is
 * atomic so engines allocating from several threads count every call once.
 * A value that does not parse is logged and ignored rather than fatal: a
 * typo in a test knob must not stop a production worker.
 */
#include "device/fault.h"

#include "common/log.h"
#include "common/units.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FAULT_ENTRY_MAX 64

static const dev_fault_config fault_off = {
    .alloc_fail_after = -1,
    .alloc_fail_over = 0,
    .abort_after_tokens = -1,
    .stall_ms = 0,
    .device_error_after_tokens = -1,
};

static dev_fault_config fault_current = {
    .alloc_fail_after = -1,
    .alloc_fail_over = 0,
    .abort_after_tokens = -1,
    .stall_ms = 0,
    .device_error_after_tokens = -1,
};
static atomic_llong fault_alloc_calls; /* device allocations seen since set */
static pthread_once_t fault_env_once = PTHREAD_ONCE_INIT;
static _Thread_local bool fault_suspended; /* dev_fault_suspend, this thread */

/* Non-negative decimal integer, the whole string. */
static int parse_count(const char *text, int64_t *out)
{
    int64_t value = 0;
    if (!*text)
        return SW_EINVAL;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9')
            return SW_EINVAL;
        if (__builtin_mul_overflow(value, 10, &value) ||
            __builtin_add_overflow(value, (int64_t)(*p - '0'), &value))
            return SW_ERANGE;
    }
    *out = value;
    return SW_OK;
}

static int parse_entry(const char *entry, dev_fault_config *cfg, unsigned *seen, sw_error *err)
{
    static const char *modes[] = {"alloc_fail_after",  "alloc_fail_over",
                                  "abort_after_tokens", "stall_ms",
                                  "device_error_after_tokens", "fault_header"};
    const char *colon = strchr(entry, ':');
    size_t name_len = colon ? (size_t)(colon - entry) : strlen(entry);
    const char *value = colon ? colon + 1 : NULL;
    int mode = -1;

    for (int i = 0; i < 6; i++)
        if (strlen(modes[i]) == name_len && strncmp(entry, modes[i], name_len) == 0)
            mode = i;
    if (mode < 0)
        return sw_error_set(err, SW_EINVAL,
                            "%s: unknown mode '%.*s' in '%s' (known: alloc_fail_after, "
                            "alloc_fail_over, abort_after_tokens, stall_ms, "
                            "device_error_after_tokens, fault_header)",
                            DEV_FAULT_ENV, (int)(name_len > 40 ? 40 : name_len), entry, entry);
    if (!value || !*value)
        return sw_error_set(err, SW_EINVAL, "%s: '%s' needs a value (%s:N)", DEV_FAULT_ENV,
                            entry, modes[mode]);
    if (*seen & (1u << mode))
        return sw_error_set(err, SW_EINVAL, "%s: %s given twice", DEV_FAULT_ENV, modes[mode]);
    *seen |= 1u << mode;

    if (mode == 1) {
        uint64_t bytes;
        if (sw_parse_bytes(value, &bytes) != SW_OK || bytes == 0)
            return sw_error_set(err, SW_EINVAL,
                                "%s: alloc_fail_over needs a size above 0 like 512MiB, not '%s'",
                                DEV_FAULT_ENV, value);
        cfg->alloc_fail_over = bytes;
        return SW_OK;
    }
    int64_t n;
    if (parse_count(value, &n) != SW_OK)
        return sw_error_set(err, SW_EINVAL, "%s: %s needs a non-negative integer, not '%s'",
                            DEV_FAULT_ENV, modes[mode], value);
    if (mode == 0)
        cfg->alloc_fail_after = n;
    else if (mode == 2)
        cfg->abort_after_tokens = n;
    else if (mode == 3)
        cfg->stall_ms = n;
    else if (mode == 4)
        cfg->device_error_after_tokens = n;
    else if (n > 1)
        return sw_error_set(err, SW_EINVAL, "%s: fault_header is 0 or 1, not '%s'",
                            DEV_FAULT_ENV, value);
    else
        cfg->fault_header = n;
    return SW_OK;
}

int dev_fault_parse(const char *text, dev_fault_config *out, sw_error *err)
{
    dev_fault_config cfg = fault_off;
    unsigned seen = 0;
    const char *p = text;
    int rc;

    if (!text || !*text) {
        *out = cfg;
        return SW_OK;
    }
    for (;;) {
        char entry[FAULT_ENTRY_MAX];
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0)
            return sw_error_set(err, SW_EINVAL, "%s: empty entry in '%s'", DEV_FAULT_ENV, text);
        if (len >= sizeof entry)
            return sw_error_set(err, SW_EINVAL, "%s: entry too long: '%.*s...'", DEV_FAULT_ENV,
                                40, p);
        memcpy(entry, p, len);
        entry[len] = '\0';
        if ((rc = parse_entry(entry, &cfg, &seen, err)) != SW_OK)
            return rc;
        if (!comma)
            break;
        p = comma + 1;
    }
    *out = cfg;
    return SW_OK;
}

static void describe(const dev_fault_config *cfg, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
#define FAULT_APPEND(...)                                                                          \
    do {                                                                                           \
        if (used < cap)                                                                            \
            used += (size_t)snprintf(buf + used, cap - used, __VA_ARGS__);                         \
    } while (0)
    if (cfg->alloc_fail_after >= 0)
        FAULT_APPEND("%salloc_fail_after:%" PRId64, used ? "," : "", cfg->alloc_fail_after);
    if (cfg->alloc_fail_over > 0)
        FAULT_APPEND("%salloc_fail_over:%" PRIu64, used ? "," : "", cfg->alloc_fail_over);
    if (cfg->abort_after_tokens >= 0)
        FAULT_APPEND("%sabort_after_tokens:%" PRId64, used ? "," : "", cfg->abort_after_tokens);
    if (cfg->stall_ms > 0)
        FAULT_APPEND("%sstall_ms:%" PRId64, used ? "," : "", cfg->stall_ms);
    if (cfg->device_error_after_tokens >= 0)
        FAULT_APPEND("%sdevice_error_after_tokens:%" PRId64, used ? "," : "",
                     cfg->device_error_after_tokens);
    if (cfg->fault_header)
        FAULT_APPEND("%sfault_header:1", used ? "," : "");
#undef FAULT_APPEND
}

static void read_env(void)
{
    const char *text = getenv(DEV_FAULT_ENV);
    dev_fault_config cfg;
    sw_error err;
    char active[160];

    if (!text || !*text)
        return;
    if (dev_fault_parse(text, &cfg, &err) != SW_OK) {
        SW_ERROR("fault", "ignoring %s: %s", DEV_FAULT_ENV, err.message);
        return;
    }
    fault_current = cfg;
    describe(&cfg, active, sizeof active);
    SW_WARN("fault", "fault injection active: %s", active);
}

const dev_fault_config *dev_fault_get(void)
{
    pthread_once(&fault_env_once, read_env);
    return &fault_current;
}

void dev_fault_set(const dev_fault_config *config)
{
    /* Run the environment reader first, so it cannot overwrite this later. */
    pthread_once(&fault_env_once, read_env);
    fault_current = config ? *config : fault_off;
    atomic_store(&fault_alloc_calls, 0);
}

void dev_fault_suspend(bool suspended)
{
    fault_suspended = suspended;
}

/* Every call counts toward alloc_fail_after, including one refused by
 * alloc_fail_over: "the first N allocations" are the first N attempts. */
bool dev_fault_alloc_should_fail(size_t bytes)
{
    if (fault_suspended)
        return false;
    const dev_fault_config *cfg = dev_fault_get();
    long long call = atomic_fetch_add(&fault_alloc_calls, 1);
    if (cfg->alloc_fail_over > 0 && (uint64_t)bytes > cfg->alloc_fail_over)
        return true;
    if (cfg->alloc_fail_after >= 0 && call >= cfg->alloc_fail_after)
        return true;
    return false;
}

int dev_fault_before_token(int64_t tokens_emitted)
{
    if (fault_suspended)
        return SW_OK;
    const dev_fault_config *cfg = dev_fault_get();
    if (cfg->device_error_after_tokens >= 0 && tokens_emitted >= cfg->device_error_after_tokens)
        return SW_EDEVICE;
    if (cfg->abort_after_tokens >= 0 && tokens_emitted >= cfg->abort_after_tokens) {
        /* One write, unbuffered: the message must be out before the signal. */
        char line[96];
        snprintf(line, sizeof line, "spillway: injected fault abort_after_tokens:%" PRId64 "\n",
                 cfg->abort_after_tokens);
        fflush(stderr);
        if (write(STDERR_FILENO, line, strlen(line)) < 0) {
            /* nothing more to do: abort regardless */
        }
        abort();
    }
    if (cfg->stall_ms > 0) {
        struct timespec left = {.tv_sec = cfg->stall_ms / 1000,
                                .tv_nsec = (long)(cfg->stall_ms % 1000) * 1000000L};
        /* Resume after signals: the stall is for the whole time asked. */
        while (nanosleep(&left, &left) != 0 && errno == EINTR)
            ;
    }
    return SW_OK;
}
