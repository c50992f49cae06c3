/* router_prefix.h - what each worker served recently, for placing a
 * request where its prompt's start is already in the worker's prefix
 * cache (docs/internals/prefix-cache.md, Placement).
 *
 * A request's prompt is cut into blocks of RT_PREFIX_BLOCK_TOKENS token
 * ids, the engine's KV block size; block b is named by a chain hash of
 * every id up to its end, so two prompts share block b only if they agree
 * on all of it and everything before. A worker's summary is a 4-way
 * set-associative table of the chain hashes of the prompts it was given:
 * a hash goes into the set its low bits name, over the way used least
 * recently, so the table forgets the oldest blocks first and never grows
 * (48 KiB a worker; a long prompt's blocks seldom meet five to a set). It
 * is a hint: the worker may have evicted what the table remembers, and a
 * miss only means no preference.
 */
#ifndef SPILLWAY_ROUTER_PREFIX_H
#define SPILLWAY_ROUTER_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RT_PREFIX_BLOCK_TOKENS 16
#define RT_PREFIX_WAYS 4
#define RT_PREFIX_SETS 1024        /* a power of two */
#define RT_PREFIX_MAX_BLOCKS 1024  /* a prompt's first 16384 tokens */

typedef struct rt_prefix_summary {
    uint64_t hash[RT_PREFIX_SETS][RT_PREFIX_WAYS]; /* 0: empty */
    uint32_t used[RT_PREFIX_SETS][RT_PREFIX_WAYS]; /* clock at the last note */
    uint32_t clock;
} rt_prefix_summary;

/* The chain hashes of the full blocks of ids[0..n) that a worker's cache
 * can serve (the block of the last token is always computed), at most cap;
 * returns how many. Hashes are never 0 (0 marks an empty slot). */
int rt_prefix_hashes(const int32_t *ids, size_t n, uint64_t *out, int cap);
/* Remembers a prompt's blocks as served by the summary's worker (those
 * already there count as used now). */
void rt_prefix_note(rt_prefix_summary *s, const uint64_t *hashes, int n);
/* How many of the prompt's leading blocks the summary remembers. */
int rt_prefix_match(const rt_prefix_summary *s, const uint64_t *hashes, int n);
void rt_prefix_clear(rt_prefix_summary *s);

/* The blocks requests in flight on a worker hold, counted once in the
 * router's books (rt_queue_shared_attach): a chain hash and how many
 * requests hold it. Open addressing; a slot whose count fell to 0 keeps
 * its hash for the probes until the table is empty again. */
#define RT_SHARED_SLOTS 8192       /* a power of two */
typedef struct rt_prefix_shared {
    uint64_t hash[RT_SHARED_SLOTS]; /* 0: never used */
    int32_t refs[RT_SHARED_SLOTS];
    int32_t live;                   /* slots with refs > 0 */
} rt_prefix_shared;

/* How many requests hold h (0: none). */
int32_t rt_shared_refs(const rt_prefix_shared *m, uint64_t h);
/* One more holder of h; its count after into *refs_after. False (nothing
 * changed) when the table has no room for a new hash. */
bool rt_shared_take(rt_prefix_shared *m, uint64_t h, int32_t *refs_after);
/* One holder fewer; the count after (0: nobody holds h now). */
int32_t rt_shared_give(rt_prefix_shared *m, uint64_t h);

#endif
