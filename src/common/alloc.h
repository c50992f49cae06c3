/* alloc.h - every heap allocation of spillway goes through these functions.
 *
 * One hook lets tests make the Nth allocation fail (SQLite-style fault
 * simulation), so out-of-memory paths are exercised, not just written.
 * sw_free() accepts memory from every function here, including the aligned
 * one. The counters are atomic: the hook works with threads.
 */
#ifndef SPILLWAY_COMMON_ALLOC_H
#define SPILLWAY_COMMON_ALLOC_H

#include <stddef.h>

void *sw_malloc(size_t size);
void *sw_calloc(size_t count, size_t size); /* NULL on count*size overflow */
void *sw_realloc(void *ptr, size_t size);
void *sw_aligned_alloc(size_t alignment, size_t size); /* power-of-2 alignment */
char *sw_strdup(const char *s);
char *sw_strndup(const char *s, size_t n);
void sw_free(void *ptr);

/* Fault injection: the allocation `n` calls from now fails (0 = the next
 * one), and every later one succeeds again. A negative n disarms it. */
void sw_alloc_fail_after(long n);

/* Number of allocation calls (successful or not) since the process began. */
long sw_alloc_count(void);

#endif
