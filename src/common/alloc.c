/* alloc.c - the allocation hook (see alloc.h). */
#include "common/alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static atomic_long alloc_calls;
static atomic_long fail_at = -1; /* absolute call number that fails, or -1 */

static int should_fail(void)
{
    long call = atomic_fetch_add(&alloc_calls, 1);
    long target = atomic_load(&fail_at);
    if (target >= 0 && call == target) {
        atomic_store(&fail_at, -1);
        return 1;
    }
    return 0;
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
    return malloc(size ? size : 1);
}

void *sw_calloc(size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    if (should_fail())
        return NULL;
    return calloc(count ? count : 1, size ? size : 1);
}

void *sw_realloc(void *ptr, size_t size)
{
    if (should_fail())
        return NULL;
    return realloc(ptr, size ? size : 1);
}

void *sw_aligned_alloc(size_t alignment, size_t size)
{
    void *p = NULL;
    if (alignment < sizeof(void *))
        alignment = sizeof(void *);
    if (should_fail())
        return NULL;
    if (posix_memalign(&p, alignment, size ? size : 1) != 0)
        return NULL;
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

void sw_free(void *ptr) { free(ptr); }
