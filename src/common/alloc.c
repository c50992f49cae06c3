/* alloc.c - the allocation hook and its fault scopes (see alloc.h). */
#include "common/alloc.h"
#include "common/json_big.h"

#include <limits.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static atomic_long alloc_calls;
static atomic_long fail_at = -1; /* absolute call number that fails, or -1 */

/* the calling thread's fault scope (alloc.h), NULL when none */
static _Thread_local sw_alloc_scope *scope_current;
static atomic_bool scope_used[SW_ALLOC_THREAD_KINDS];       /* one was ever published */
static atomic_long scope_last_calls[SW_ALLOC_THREAD_KINDS]; /* of the last published */
static atomic_long scope_failures;    /* failures injected by scopes */

static _Thread_local long thread_failures; /* sw_alloc_thread_failures */

static int should_fail(void)
{
    long call = atomic_fetch_add(&alloc_calls, 1);
    long target = atomic_load(&fail_at);
    sw_alloc_scope *scope = scope_current;
    if (scope && scope->calls++ == scope->fail_at) {
        scope->failed = true;
        atomic_fetch_add(&scope_failures, 1);
        thread_failures++;
        return 1;
    }
    if (target >= 0 && call == target) {
        atomic_store(&fail_at, -1);
        thread_failures++;
        return 1;
    }
    return 0;
}

/* A real allocation's result, counted when it failed. */
static void *counted(void *p)
{
    if (!p)
        thread_failures++;
    return p;
}

long sw_alloc_thread_failures(void) { return thread_failures; }

/* A load that lost an allocation: its result dropped, the error said. */
static json_t *load_checked(json_t *j, long before, json_error_t *error)
{
    if (thread_failures == before)
        return j;
    json_decref(j);
    if (error) {
        /* the code lives in the text's last byte (jansson.h, json_error_code) */
        snprintf(error->text, JSON_ERROR_TEXT_LENGTH - 1, "out of memory");
        error->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory;
    }
    return NULL;
}

json_t *sw_json_loads(const char *text, size_t flags, json_error_t *error)
{
    long before = thread_failures;
    return load_checked(json_loads(text, flags, error), before, error);
}

json_t *sw_json_loadb(const char *buffer, size_t len, size_t flags, json_error_t *error)
{
    long before = thread_failures;
    return load_checked(json_loadb(buffer, len, flags, error), before, error);
}

char *sw_json_dumps(const json_t *json, size_t flags)
{
    long before = thread_failures;
    char *s = json_dumps(json, flags);
    if (s && thread_failures != before) {
        sw_free(s);
        return NULL;
    }
    if (s)
        sw__json_big_restore(s, strlen(s)); /* numbers a body kept as markers */
    return s;
}

bool sw_json_error_oom(const json_error_t *error)
{
    return json_error_code(error) == json_error_out_of_memory;
}

bool sw_json_error_number_range(const json_error_t *error)
{
    return json_error_code(error) == json_error_numeric_overflow;
}

void sw_alloc_fail_after(long n)
{
    atomic_store(&fail_at, n < 0 ? -1 : atomic_load(&alloc_calls) + n);
}

long sw_alloc_count(void) { return atomic_load(&alloc_calls); }

void *sw_malloc(size_t size)
{
    if (should_fail())
        return NULL;
    return counted(malloc(size ? size : 1));
}

void *sw_calloc(size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    if (should_fail())
        return NULL;
    return counted(calloc(count ? count : 1, size ? size : 1));
}

void *sw_realloc(void *ptr, size_t size)
{
    if (should_fail())
        return NULL;
    return counted(realloc(ptr, size ? size : 1));
}

void *sw_aligned_alloc(size_t alignment, size_t size)
{
    void *p = NULL;
    if (alignment < sizeof(void *))
        alignment = sizeof(void *);
    if (should_fail())
        return NULL;
    if (posix_memalign(&p, alignment, size ? size : 1) != 0)
        return counted(NULL);
    return p;
}

char *sw_strndup(const char *s, size_t n)
{
    char *copy = sw_malloc(n + 1);
    if (!copy)
        return NULL;
    memcpy(copy, s, n);
    copy[n] = '\0';
    return copy;
}

char *sw_strdup(const char *s) { return sw_strndup(s, strlen(s)); }

static bool in_reserve(const void *p);
static void reserve_give_back(void);

void sw_free(void *ptr)
{
    if (in_reserve(ptr))
        reserve_give_back();
    else
        free(ptr);
}

/* ---- jansson's reserve ---------------------------------------------------
 *
 * jansson 2.14 does not survive a NULL from its allocator everywhere: its
 * lexer drops the byte it could not save to a token and then decodes past
 * the token's end (a heap overflow), and json_dumps writes a key it could
 * not append as "". So jansson is never handed a NULL. An injected failure
 * is counted (the scope, sw_alloc_thread_failures) and the memory given
 * all the same; a real NULL from malloc is counted too, and the block
 * comes from this reserve instead: address space mapped once, before the
 * first JSON value, whose pages cost nothing until a failure touches them.
 * Either way the sw_json_* wrappers and the callers' checks of
 * sw_alloc_thread_failures turn the call into a failed one, and its
 * blocks come back through sw_free.
 *
 * Blocks are cut from the front (a bump pointer, under a lock: failures
 * are rare and short-lived); when the last one is freed the reserve
 * starts again from the front and its pages go back to the system. Only
 * when the reserve itself is spent (SW_JSON_RESERVE_BYTES of blocks alive
 * at once, or the mapping failed at start) does jansson see a NULL. */
#define SW_JSON_RESERVE_BYTES ((size_t)64 << 20)
#define RESERVE_ALIGN 16

static struct {
    pthread_mutex_t lock;
    unsigned char *base; /* NULL: not mapped */
    size_t used;         /* bytes cut from the front */
    size_t high;         /* the most ever cut since the last return */
    long live;           /* blocks not yet freed */
    atomic_long blocks;  /* blocks ever given (sw_alloc_json_reserve_blocks) */
} reserve = {.lock = PTHREAD_MUTEX_INITIALIZER};

static atomic_long system_refusals = -1; /* sw_alloc_test_refuse_system */

static bool in_reserve(const void *p)
{
    const unsigned char *b = reserve.base;
    return b && (const unsigned char *)p >= b && (const unsigned char *)p < b + SW_JSON_RESERVE_BYTES;
}

static void *reserve_take(size_t size)
{
    size_t need = (size + RESERVE_ALIGN - 1) & ~(size_t)(RESERVE_ALIGN - 1);
    void *p = NULL;
    pthread_mutex_lock(&reserve.lock);
    if (reserve.base && need >= size && need <= SW_JSON_RESERVE_BYTES - reserve.used) {
        p = reserve.base + reserve.used;
        reserve.used += need;
        if (reserve.used > reserve.high)
            reserve.high = reserve.used;
        reserve.live++;
        atomic_fetch_add(&reserve.blocks, 1);
    }
    pthread_mutex_unlock(&reserve.lock);
    return p;
}

static void reserve_give_back(void)
{
    pthread_mutex_lock(&reserve.lock);
    if (--reserve.live == 0) {
        /* the pages read as zero again, and cost nothing, until next time */
        madvise(reserve.base, reserve.high, MADV_DONTNEED);
        reserve.used = reserve.high = 0;
    }
    pthread_mutex_unlock(&reserve.lock);
}

/* A test's stand-in for malloc running dry (alloc.h). */
static void *system_malloc(size_t size)
{
    long left = atomic_load(&system_refusals);
    if (left >= 0 && atomic_compare_exchange_strong(&system_refusals, &left, left - 1) &&
        left == 0)
        return NULL;
    return malloc(size);
}

void sw_alloc_test_refuse_system(long n) { atomic_store(&system_refusals, n < 0 ? -1 : n); }

long sw_alloc_json_reserve_blocks(void) { return atomic_load(&reserve.blocks); }

long sw_alloc_json_reserve_live(void)
{
    pthread_mutex_lock(&reserve.lock);
    long live = reserve.live;
    pthread_mutex_unlock(&reserve.lock);
    return live;
}

static void *jansson_malloc(size_t size)
{
    (void)should_fail();
    void *p = counted(system_malloc(size ? size : 1));
    return p ? p : reserve_take(size ? size : 1);
}

void sw_alloc_hook_jansson(void)
{
    /* Before any JSON value exists (alloc.h): jansson's own defaults are
     * malloc and free, which sw_free matches, so a second call is harmless. */
    pthread_mutex_lock(&reserve.lock);
    if (!reserve.base) {
        void *m = mmap(NULL, SW_JSON_RESERVE_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        reserve.base = m == MAP_FAILED ? NULL : m;
    }
    pthread_mutex_unlock(&reserve.lock);
    json_set_alloc_funcs(jansson_malloc, sw_free);
}

/* ---- fault scopes ------------------------------------------------------- */

void sw_alloc_scope_init_on(sw_alloc_scope *scope, sw_alloc_thread thread, long fail_at_call)
{
    scope->calls = 0;
    scope->fail_at = fail_at_call < 0 ? -1 : fail_at_call;
    scope->failed = false;
    scope->thread = thread >= 0 && thread < SW_ALLOC_THREAD_KINDS ? thread
                                                                  : SW_ALLOC_THREAD_REQUEST;
}

void sw_alloc_scope_init(sw_alloc_scope *scope, long fail_at_call)
{
    sw_alloc_scope_init_on(scope, SW_ALLOC_THREAD_REQUEST, fail_at_call);
}

sw_alloc_scope *sw_alloc_scope_swap(sw_alloc_scope *scope)
{
    sw_alloc_scope *previous = scope_current;
    scope_current = scope;
    return previous;
}

void sw_alloc_scope_publish(const sw_alloc_scope *scope)
{
    atomic_store(&scope_last_calls[scope->thread], scope->calls);
    atomic_store(&scope_used[scope->thread], true);
}

static bool header_enabled;
static pthread_once_t header_once = PTHREAD_ONCE_INIT;

static void read_header_switch(void)
{
    /* the switch is one entry of the comma-separated SPILLWAY_FAULT list */
    const char *v = getenv("SPILLWAY_FAULT");
    for (const char *p = v ? strstr(v, "fault_header:") : NULL; p;
         p = strstr(p + 1, "fault_header:")) {
        bool starts = p == v || p[-1] == ',';
        const char *value = p + strlen("fault_header:");
        if (starts && value[0] == '1' && (value[1] == '\0' || value[1] == ','))
            header_enabled = true;
    }
}

bool sw_alloc_fault_header_enabled(void)
{
    pthread_once(&header_once, read_header_switch);
    return header_enabled;
}

bool sw_alloc_scope_parse(const char *value, long *fail_at_call)
{
    sw_alloc_thread thread;
    return sw_alloc_scope_parse_on(value, &thread, fail_at_call) &&
           thread == SW_ALLOC_THREAD_REQUEST;
}

bool sw_alloc_scope_parse_on(const char *value, sw_alloc_thread *thread, long *fail_at_call)
{
    static const char mode[] = "alloc_fail_after:";
    static const char engine[] = "engine:";
    if (!value || strncmp(value, mode, sizeof mode - 1))
        return false;
    const char *p = value + sizeof mode - 1;
    *thread = SW_ALLOC_THREAD_REQUEST;
    if (!strncmp(p, engine, sizeof engine - 1)) {
        *thread = SW_ALLOC_THREAD_ENGINE;
        p += sizeof engine - 1;
    }
    if (!strcmp(p, "-1")) {
        *fail_at_call = -1;
        return true;
    }
    long n = 0;
    if (*p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (n > (LONG_MAX - 9) / 10)
            return false;
        n = n * 10 + (*p - '0');
    }
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p)
        return false;
    *fail_at_call = n;
    return true;
}

size_t sw_alloc_scope_metrics(char *buf, size_t cap)
{
    if (!cap)
        return 0;
    buf[0] = '\0';
    if (!atomic_load(&scope_used[SW_ALLOC_THREAD_REQUEST]))
        return 0;
    int n = snprintf(buf, cap,
                     "# TYPE spillway_fault_scope_allocations gauge\n"
                     "spillway_fault_scope_allocations %ld\n",
                     atomic_load(&scope_last_calls[SW_ALLOC_THREAD_REQUEST]));
    if (n >= 0 && (size_t)n < cap && atomic_load(&scope_used[SW_ALLOC_THREAD_ENGINE]))
        n += snprintf(buf + n, cap - (size_t)n,
                      "spillway_fault_scope_allocations{thread=\"engine\"} %ld\n",
                      atomic_load(&scope_last_calls[SW_ALLOC_THREAD_ENGINE]));
    if (n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n,
                      "# TYPE spillway_fault_allocations_failed_total counter\n"
                      "spillway_fault_allocations_failed_total %ld\n",
                      atomic_load(&scope_failures));
    if (n < 0)
        return 0;
    return (size_t)n < cap ? (size_t)n : cap - 1;
}
