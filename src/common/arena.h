/* arena.h - per-request memory, freed in one place.
 *
 * An arena hands out aligned chunks from blocks it allocates through the
 * allocation hook; nothing is freed individually. Every arena has a hard cap
 * in bytes: an allocation beyond it returns NULL instead of growing without
 * bound (what a request may use is decided by its creator).
 */
#ifndef SPILLWAY_COMMON_ARENA_H
#define SPILLWAY_COMMON_ARENA_H

#include <stddef.h>

typedef struct sw_arena sw_arena;

/* cap_bytes: the most the arena may allocate in total (blocks included). */
sw_arena *sw_arena_create(size_t cap_bytes);
void sw_arena_destroy(sw_arena *arena);

/* Returns zeroed memory aligned to `alignment` (power of 2, <= 4096), or NULL
 * when the cap would be exceeded or the host is out of memory. */
void *sw_arena_alloc(sw_arena *arena, size_t size, size_t alignment);
char *sw_arena_strndup(sw_arena *arena, const char *s, size_t n);

/* Frees all but the first block and rewinds; earlier pointers are invalid. */
void sw_arena_reset(sw_arena *arena);

/* Bytes handed out since creation or the last reset. */
size_t sw_arena_used(const sw_arena *arena);

#endif
