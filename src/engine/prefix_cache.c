/* prefix_cache.c - full KV blocks kept for later sequences with the same
 * start (model.h has the contract; docs/internals/prefix-cache.md the
 * design).
 *
 * Keys. Block b of a sequence (tokens [b*B, (b+1)*B)) is keyed by
 * hash_b = H(hash_{b-1}, its B token ids), hash_{-1} a constant: the key of a
 * block names every token before it, so two sequences share block b only if
 * they agree on all of tokens [0, (b+1)*B). An entry also keeps its parent's
 * hash and its own token ids, and a lookup compares both, so a match needs a
 * 64-bit collision of the whole chain, not of one block. What else decides
 * a block's contents (the model, the KV type, which layers sit on the
 * device) is fixed for the context, which owns the cache.
 *
 * Life of a block. A sequence's full blocks are offered to the cache as
 * they complete (eng__prefix_publish): a block whose key is new becomes an
 * entry, still held by that sequence; one whose key is already there (two
 * sequences computed the same prefix at the same time) stays private. An
 * entry is never written again: sequences only write at and after their
 * length, and attach stops before the block of the prompt's last token.
 * When its last holder lets go, the entry goes on the LRU list; it is
 * evicted from there when a new block needs memory (memory.c's block_take:
 * when in-use plus cached blocks reach the capacity, or the device refuses)
 * or when the cache is turned off.
 *
 * Books. n_blocks_held (memory.c) counts physical global blocks some
 * sequence holds, a shared one once; n_unused counts the cached ones nobody
 * holds. The two never exceed capacity_blocks, the KV the context was
 * planned for (n_seq_max sequences of n_ctx tokens).
 *
 * Memory: the table and capacity_blocks entries are allocated with the
 * context; caching a block allocates nothing (an entry is taken from the
 * free list, which cannot be empty: every entry is a block some sequence
 * holds or a cached one, and there are at most capacity_blocks of those).
 *
 * Single-threaded, like the context it belongs to.
 */
#include "engine/model-impl.h"

#include "common/alloc.h"

#include <string.h>

struct eng_prefix_entry {
    uint64_t hash;
    uint64_t parent_hash;
    int32_t refs;                 /* sequences holding it */
    unsigned char *device_part;
    unsigned char *host_part;
    eng_prefix_entry *bucket_next; /* or the free list's next */
    eng_prefix_entry *lru_prev, *lru_next; /* on the LRU list when refs == 0 */
    int32_t *tokens;              /* block_tokens */
};

#define PREFIX_CHAIN_START 0x243f6a8885a308d3ULL

static uint64_t prefix_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t prefix_block_hash(uint64_t parent, const int32_t *tokens, int32_t n)
{
    uint64_t h = prefix_mix64(parent ^ 0x9e3779b97f4a7c15ULL);
    for (int32_t i = 0; i < n; i++)
        h = prefix_mix64(h + (uint64_t)(uint32_t)tokens[i] + 0x632be59bd9b4e019ULL);
    return h;
}

static bool prefix_active(const eng_context *ctx)
{
    return ctx->prefix.enabled && ctx->prefix.buckets;
}

int eng__prefix_init(eng_context *ctx, sw_error *err)
{
    eng_prefix_cache *pc = &ctx->prefix;
    memset(pc, 0, sizeof *pc);
    /* Sliding layers keep a ring whose blocks are overwritten as the window
     * moves: nothing there outlives a position, so nothing can be shared. */
    if (ctx->swa_ring_blocks > 0)
        return SW_OK;
    pc->capacity_blocks = ctx->params.n_seq_max * ctx->max_blocks_per_seq;
    size_t n = 16;
    while (n < (size_t)pc->capacity_blocks * 2)
        n *= 2;
    pc->buckets = sw_calloc(n, sizeof *pc->buckets);
    if (!pc->buckets)
        return sw_error_set(err, SW_ENOMEM, "out of memory for the prefix cache's table");
    pc->n_buckets = n;
    const size_t cap = (size_t)pc->capacity_blocks, bt = (size_t)ctx->params.kv_block_tokens;
    pc->pool = sw_calloc(cap, sizeof *pc->pool);
    pc->pool_tokens = sw_malloc(cap * bt * sizeof *pc->pool_tokens);
    if (!pc->pool || !pc->pool_tokens)
        return sw_error_set(err, SW_ENOMEM, "out of memory for the prefix cache's entries");
    for (size_t i = cap; i-- > 0;) {
        pc->pool[i].tokens = pc->pool_tokens + i * bt;
        pc->pool[i].bucket_next = pc->free_entries;
        pc->free_entries = &pc->pool[i];
    }
    const size_t per_seq = (size_t)ctx->max_blocks_per_seq;
    for (int32_t s = 0; s < ctx->params.n_seq_max; s++) {
        eng_sequence *seq = &ctx->seqs[s];
        seq->token_ids = sw_malloc(per_seq * (size_t)ctx->params.kv_block_tokens *
                                   sizeof *seq->token_ids);
        seq->block_hash = sw_malloc(per_seq * sizeof *seq->block_hash);
        if (!seq->token_ids || !seq->block_hash)
            return sw_error_set(err, SW_ENOMEM, "out of memory for the prefix cache's tables");
    }
    pc->enabled = ctx->params.prefix_cache;
    pc->retain = true;
    return SW_OK;
}

static void entry_put(eng_prefix_cache *pc, eng_prefix_entry *e)
{
    e->bucket_next = pc->free_entries;
    pc->free_entries = e;
}

static void lru_unlink(eng_prefix_cache *pc, eng_prefix_entry *e)
{
    if (e->lru_prev)
        e->lru_prev->lru_next = e->lru_next;
    else
        pc->lru_oldest = e->lru_next;
    if (e->lru_next)
        e->lru_next->lru_prev = e->lru_prev;
    else
        pc->lru_newest = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
    pc->n_unused--;
}

static void lru_push_newest(eng_prefix_cache *pc, eng_prefix_entry *e)
{
    e->lru_next = NULL;
    e->lru_prev = pc->lru_newest;
    if (pc->lru_newest)
        pc->lru_newest->lru_next = e;
    else
        pc->lru_oldest = e;
    pc->lru_newest = e;
    pc->n_unused++;
}

static eng_prefix_entry **bucket_of(eng_prefix_cache *pc, uint64_t hash)
{
    return &pc->buckets[hash & (pc->n_buckets - 1)];
}

static void table_remove(eng_prefix_cache *pc, eng_prefix_entry *e)
{
    for (eng_prefix_entry **p = bucket_of(pc, e->hash); *p; p = &(*p)->bucket_next)
        if (*p == e) {
            *p = e->bucket_next;
            pc->n_entries--;
            return;
        }
}

static eng_prefix_entry *table_find(eng_prefix_cache *pc, uint64_t hash, uint64_t parent,
                                    const int32_t *tokens, int32_t block_tokens)
{
    for (eng_prefix_entry *e = *bucket_of(pc, hash); e; e = e->bucket_next)
        if (e->hash == hash && e->parent_hash == parent &&
            memcmp(e->tokens, tokens, (size_t)block_tokens * sizeof *tokens) == 0)
            return e;
    return NULL;
}

/* Takes the oldest unused entry out of the cache; its memory is the
 * caller's. */
static eng_prefix_entry *evict_oldest(eng_context *ctx)
{
    eng_prefix_cache *pc = &ctx->prefix;
    eng_prefix_entry *e = pc->lru_oldest;
    if (!e)
        return NULL;
    lru_unlink(pc, e);
    table_remove(pc, e);
    pc->counts.evictions++;
    return e;
}

bool eng__prefix_evict_into(eng_context *ctx, eng_kv_block *b)
{
    eng_prefix_entry *e = evict_oldest(ctx);
    if (!e)
        return false;
    b->device_part = e->device_part;
    b->host_part = e->host_part;
    b->entry = NULL;
    entry_put(&ctx->prefix, e);
    return true;
}

static void drop_unused(eng_context *ctx)
{
    eng_prefix_entry *e;
    while ((e = evict_oldest(ctx))) {
        eng_kv_block b = {e->device_part, e->host_part, NULL};
        eng__block_free(ctx, &b, false);
        entry_put(&ctx->prefix, e);
    }
}

void eng__prefix_free(eng_context *ctx)
{
    eng_prefix_cache *pc = &ctx->prefix;
    if (pc->buckets)
        drop_unused(ctx);
    sw_free(pc->buckets);
    sw_free(pc->pool);
    sw_free(pc->pool_tokens);
    pc->buckets = NULL;
    pc->pool = NULL;
    pc->pool_tokens = NULL;
    pc->free_entries = NULL;
    if (ctx->seqs)
        for (int32_t s = 0; s < ctx->params.n_seq_max; s++) {
            sw_free(ctx->seqs[s].token_ids);
            sw_free(ctx->seqs[s].block_hash);
            ctx->seqs[s].token_ids = NULL;
            ctx->seqs[s].block_hash = NULL;
        }
}

void eng__prefix_note_tokens(eng_context *ctx, eng_sequence *seq, const int32_t *tokens,
                             int32_t n)
{
    if (seq->token_ids)
        memcpy(seq->token_ids + seq->n_tokens, tokens, (size_t)n * sizeof *tokens);
    (void)ctx;
}

void eng__prefix_publish(eng_context *ctx, eng_sequence *seq)
{
    eng_prefix_cache *pc = &ctx->prefix;
    const int32_t bt = ctx->params.kv_block_tokens;
    if (!seq->token_ids)
        return;
    while ((seq->n_published + 1) * bt <= seq->n_tokens) {
        int32_t b = seq->n_published++;
        const int32_t *tokens = seq->token_ids + (size_t)b * bt;
        uint64_t parent = b ? seq->block_hash[b - 1] : PREFIX_CHAIN_START;
        uint64_t hash = prefix_block_hash(parent, tokens, bt);
        eng_kv_block *blk = &seq->blocks[b];
        seq->block_hash[b] = hash;
        if (!prefix_active(ctx) || blk->entry || table_find(pc, hash, parent, tokens, bt))
            continue;
        eng_prefix_entry *e = pc->free_entries;
        if (!e) /* cannot happen (see the top); the block stays private */
            continue;
        pc->free_entries = e->bucket_next;
        e->hash = hash;
        e->parent_hash = parent;
        e->refs = 1;
        e->device_part = blk->device_part;
        e->host_part = blk->host_part;
        e->lru_prev = e->lru_next = NULL;
        memcpy(e->tokens, tokens, (size_t)bt * sizeof(int32_t));
        eng_prefix_entry **bucket = bucket_of(pc, hash);
        e->bucket_next = *bucket;
        *bucket = e;
        pc->n_entries++;
        blk->entry = e;
    }
}

void eng__prefix_release_block(eng_context *ctx, eng_kv_block *b)
{
    eng_prefix_entry *e = b->entry;
    eng_prefix_cache *pc = &ctx->prefix;
    if (e) {
        if (e->refs == 2)
            pc->n_shared--;
        if (--e->refs > 0) {
            b->device_part = b->host_part = NULL;
            b->entry = NULL;
            return;
        }
        ctx->n_blocks_held--;
        b->device_part = b->host_part = NULL;
        b->entry = NULL;
        if (pc->enabled && pc->retain) {
            lru_push_newest(pc, e);
            return;
        }
        table_remove(pc, e);
        eng_kv_block mem = {e->device_part, e->host_part, NULL};
        eng__block_free(ctx, &mem, false);
        entry_put(pc, e);
        return;
    }
    eng__block_free(ctx, b, false);
    ctx->n_blocks_held--;
}

int32_t eng_seq_attach_prefix(eng_context *ctx, int32_t seq_id, const int32_t *tokens,
                              int32_t n_tokens)
{
    eng_prefix_cache *pc = &ctx->prefix;
    const int32_t bt = ctx->params.kv_block_tokens;
    if (seq_id < 0 || seq_id >= ctx->params.n_seq_max || !tokens || !prefix_active(ctx))
        return 0;
    eng_sequence *seq = &ctx->seqs[seq_id];
    /* Only cached blocks so far (none, or an earlier call's): the run
     * continues after them, if tokens still starts with them. */
    int32_t b = seq->n_tokens / bt;
    if (seq->n_tokens % bt || seq->n_published != b ||
        memcmp(seq->token_ids, tokens, (size_t)seq->n_tokens * sizeof *tokens) != 0)
        return 0;
    for (int32_t i = 0; i < b; i++)
        if (!seq->blocks[i].entry)
            return 0;
    pc->counts.lookups++;
    /* The last token is always computed (its logits are the next step), so
     * its block is never attached. */
    int32_t max_blocks = n_tokens > 0 ? (n_tokens - 1) / bt : 0;
    if (max_blocks > ctx->max_blocks_per_seq)
        max_blocks = ctx->max_blocks_per_seq;
    const int32_t first = b;
    uint64_t parent = b ? seq->block_hash[b - 1] : PREFIX_CHAIN_START;
    for (; b < max_blocks; b++) {
        const int32_t *blk_tokens = tokens + (size_t)b * bt;
        uint64_t hash = prefix_block_hash(parent, blk_tokens, bt);
        eng_prefix_entry *e = table_find(pc, hash, parent, blk_tokens, bt);
        if (!e)
            break;
        eng_kv_block *slot = &seq->blocks[b];
        if (b < seq->n_blocks) /* reserved: given back, the cached one takes its place */
            eng__prefix_release_block(ctx, slot);
        if (e->refs == 0) {
            lru_unlink(pc, e);
            ctx->n_blocks_held++;
        } else if (e->refs == 1) {
            pc->n_shared++;
        }
        e->refs++;
        slot->device_part = e->device_part;
        slot->host_part = e->host_part;
        slot->entry = e;
        if (b >= seq->n_blocks)
            seq->n_blocks = b + 1;
        memcpy(seq->token_ids + (size_t)b * bt, blk_tokens, (size_t)bt * sizeof(int32_t));
        seq->block_hash[b] = hash;
        parent = hash;
    }
    if (b == first)
        return 0;
    seq->n_tokens = b * bt;
    seq->n_published = b;
    pc->counts.hits++;
    pc->counts.tokens_reused += (uint64_t)(b - first) * (uint64_t)bt;
    return (b - first) * bt;
}

int32_t eng_seq_prefix_cached_tokens(const eng_context *ctx, int32_t seq_id)
{
    if (seq_id < 0 || seq_id >= ctx->params.n_seq_max)
        return 0;
    const eng_sequence *seq = &ctx->seqs[seq_id];
    int32_t b = 0;
    while (b < seq->n_published && seq->blocks[b].entry)
        b++;
    return b * ctx->params.kv_block_tokens;
}

void eng_context_set_prefix_cache(eng_context *ctx, bool on)
{
    if (!ctx->prefix.buckets)
        return;
    ctx->prefix.enabled = on;
    if (!on)
        drop_unused(ctx);
}

void eng_context_set_prefix_cache_retain(eng_context *ctx, bool retain)
{
    ctx->prefix.retain = retain;
    if (!retain && ctx->prefix.buckets)
        drop_unused(ctx);
}

bool eng_context_prefix_cache_on(const eng_context *ctx)
{
    return prefix_active(ctx);
}

void eng_context_prefix_cache_stats(const eng_context *ctx, eng_prefix_cache_stats *out)
{
    const eng_prefix_cache *pc = &ctx->prefix;
    *out = pc->counts;
    out->entries = pc->n_entries;
    out->blocks_cached = pc->n_unused;
    out->blocks_shared = pc->n_shared;
    out->device_bytes_cached = ctx->block_bytes_device * (size_t)pc->n_unused;
    out->bytes_cached = (ctx->block_bytes_device + ctx->block_bytes_host) * (size_t)pc->n_unused;
}
