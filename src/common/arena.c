/* arena.c - see arena.h. Blocks form a singly linked list, newest first. */
#include "common/arena.h"

#include "common/alloc.h"

#include <stdint.h>
#include <string.h>

#define ARENA_MIN_BLOCK 4096

typedef struct arena_block {
    struct arena_block *next;
    size_t size; /* usable bytes after the header */
    size_t used;
    /* data follows, aligned to max_align_t */
} arena_block;

struct sw_arena {
    arena_block *blocks;
    size_t cap_bytes;
    size_t allocated_bytes; /* sum of block sizes incl. headers */
    size_t used_bytes;
};

#define BLOCK_HEADER (((sizeof(arena_block) + 63) / 64) * 64)

sw_arena *sw_arena_create(size_t cap_bytes)
{
    sw_arena *arena = sw_calloc(1, sizeof *arena);
    if (arena)
        arena->cap_bytes = cap_bytes;
    return arena;
}

void sw_arena_destroy(sw_arena *arena)
{
    if (!arena)
        return;
    for (arena_block *b = arena->blocks, *next; b; b = next) {
        next = b->next;
        sw_free(b);
    }
    sw_free(arena);
}

static unsigned char *block_data(arena_block *b)
{
    return (unsigned char *)b + BLOCK_HEADER;
}

void *sw_arena_alloc(sw_arena *arena, size_t size, size_t alignment)
{
    arena_block *b = arena->blocks;
    if (alignment == 0 || (alignment & (alignment - 1)) || alignment > 4096)
        return NULL;
    if (b) {
        uintptr_t base = (uintptr_t)block_data(b);
        uintptr_t at = (base + b->used + alignment - 1) & ~(uintptr_t)(alignment - 1);
        size_t offset = (size_t)(at - base);
        if (offset <= b->size && size <= b->size - offset) {
            b->used = offset + size;
            arena->used_bytes += size;
            return memset((void *)at, 0, size);
        }
    }
    /* New block: big enough for this request even at worst alignment. */
    if (size > SIZE_MAX / 2 - alignment - BLOCK_HEADER)
        return NULL;
    size_t want = size + alignment;
    size_t block_size = b ? b->size * 2 : ARENA_MIN_BLOCK;
    if (block_size < want)
        block_size = want;
    size_t total = BLOCK_HEADER + block_size;
    if (arena->allocated_bytes + total > arena->cap_bytes) {
        /* Try the smallest block that still fits before giving up. */
        block_size = want;
        total = BLOCK_HEADER + block_size;
        if (arena->allocated_bytes + total > arena->cap_bytes)
            return NULL;
    }
    arena_block *nb = sw_aligned_alloc(64, total);
    if (!nb)
        return NULL;
    nb->next = b;
    nb->size = block_size;
    nb->used = 0;
    arena->blocks = nb;
    arena->allocated_bytes += total;
    return sw_arena_alloc(arena, size, alignment);
}

char *sw_arena_strndup(sw_arena *arena, const char *s, size_t n)
{
    char *copy = sw_arena_alloc(arena, n + 1, 1);
    if (copy)
        memcpy(copy, s, n);
    return copy;
}

void sw_arena_reset(sw_arena *arena)
{
    arena_block *b = arena->blocks;
    if (!b)
        return;
    /* Keep the oldest block (the last in the list): it is the smallest. */
    while (b->next) {
        arena_block *next = b->next;
        arena->allocated_bytes -= BLOCK_HEADER + b->size;
        sw_free(b);
        b = next;
    }
    b->used = 0;
    arena->blocks = b;
    arena->used_bytes = 0;
}

size_t sw_arena_used(const sw_arena *arena) { return arena->used_bytes; }
