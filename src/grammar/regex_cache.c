/* regex_cache.c - the process's cache of compiled patterns
 * (eng_regex_compile_cached, regex.h).
 *
 * A grammar names the same patterns request after request (a client sends
 * its JSON grammar with every call), and a fuzzer's mutations keep most of
 * an input's rules: compiling them again is most of what a grammar costs.
 * Entries hold a reference to the automaton, or the refusal (code and
 * message) of a pattern that is too large or malformed, so a client that
 * resends a too-complex grammar does not make the worker pay the work
 * bound again. Out of memory is never cached. Bounded in entries and in
 * bytes (keys, tables), the least recently used evicted first; one mutex:
 * a lookup is a hash and a compare, a miss is a compile (outside it).
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define RC_ENTRIES ENG_REGEX_CACHE_ENTRIES
#define RC_BUCKETS (2 * RC_ENTRIES) /* a power of two */
_Static_assert((RC_BUCKETS & (RC_BUCKETS - 1)) == 0, "RC_BUCKETS must be a power of two");

typedef struct rc_entry {
    char *key; /* NULL: a free entry */
    size_t key_len;
    uint64_t hash;
    eng_regex *re;  /* a reference, or NULL for a refusal */
    int code;       /* the refusal's */
    char message[SW_ERROR_MESSAGE_MAX];
    size_t bytes;
    uint64_t used;  /* the clock when last found */
    int32_t next;   /* in its bucket's chain, -1 at the end */
} rc_entry;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static rc_entry cache[RC_ENTRIES];
static int32_t bucket[RC_BUCKETS];
static bool cache_ready;
static uint64_t cache_clock;
static size_t cache_bytes, cache_entries;
static size_t max_entries = RC_ENTRIES, max_bytes = ENG_REGEX_CACHE_BYTES;
static uint64_t n_hits, n_misses, n_evictions;

static uint64_t key_hash(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

static void cache_init(void)
{
    if (cache_ready)
        return;
    for (int32_t i = 0; i < RC_BUCKETS; i++)
        bucket[i] = -1;
    cache_ready = true;
}

static int32_t cache_find(const char *p, size_t n, uint64_t h)
{
    for (int32_t i = bucket[h & (RC_BUCKETS - 1)]; i >= 0; i = cache[i].next)
        if (cache[i].hash == h && cache[i].key_len == n && memcmp(cache[i].key, p, n) == 0)
            return i;
    return -1;
}

/* Unlinks and empties entry i (its reference released). */
static void cache_drop(int32_t i)
{
    int32_t *link = &bucket[cache[i].hash & (RC_BUCKETS - 1)];
    while (*link != i)
        link = &cache[*link].next;
    *link = cache[i].next;
    cache_bytes -= cache[i].bytes;
    cache_entries--;
    sw_free(cache[i].key);
    eng_regex_free(cache[i].re);
    memset(&cache[i], 0, sizeof cache[i]);
}

/* The least recently used entry, or -1 when the cache is empty. */
static int32_t cache_lru(void)
{
    int32_t lru = -1;
    for (int32_t i = 0; i < RC_ENTRIES; i++)
        if (cache[i].key && (lru < 0 || cache[i].used < cache[lru].used))
            lru = i;
    return lru;
}

/* Evicts the least recently used entries until `room` more entries and
 * `bytes` more bytes fit; false when they cannot. */
static bool cache_evict(size_t room, size_t bytes)
{
    while (cache_entries + room > max_entries || cache_bytes + bytes > max_bytes) {
        int32_t lru = cache_lru();
        if (lru < 0)
            return false;
        cache_drop(lru);
        n_evictions++;
    }
    return true;
}

/* A free entry for bytes more, or -1. */
static int32_t cache_slot(size_t bytes)
{
    if (!cache_evict(1, bytes))
        return -1;
    for (int32_t i = 0; i < RC_ENTRIES; i++)
        if (!cache[i].key)
            return i;
    return -1;
}

static size_t regex_bytes(const eng_regex *re)
{
    return sizeof *re + (size_t)re->n_states * (size_t)re->n_classes * sizeof *re->trans +
           4 * (size_t)re->n_states;
}

int eng_regex_compile_cached(const char *pattern, size_t len, eng_regex **out, sw_error *err)
{
    *out = NULL;
    uint64_t h = key_hash(pattern ? pattern : "", len);
    pthread_mutex_lock(&cache_lock);
    cache_init();
    int32_t i = pattern ? cache_find(pattern, len, h) : -1;
    if (i >= 0) {
        n_hits++;
        cache[i].used = ++cache_clock;
        int code = cache[i].code;
        if (cache[i].re)
            *out = eng_regex_ref(cache[i].re);
        else
            sw_error_set(err, code, "%s", cache[i].message);
        pthread_mutex_unlock(&cache_lock);
        return code;
    }
    n_misses++;
    pthread_mutex_unlock(&cache_lock);

    sw_error e;
    int rc = eng_regex_compile(pattern, len, out, &e);
    if (rc)
        sw_error_set(err, rc, "%s", e.message);
    if (rc == SW_ENOMEM || !pattern)
        return rc;
    size_t bytes = len + (*out ? regex_bytes(*out) : sizeof(rc_entry));
    pthread_mutex_lock(&cache_lock);
    bool fits = bytes <= max_bytes / 4;
    pthread_mutex_unlock(&cache_lock);
    if (!fits)
        return rc;
    char *key = sw_malloc(len ? len : 1);
    if (!key)
        return rc; /* compiled, just not kept */
    memcpy(key, pattern, len);
    pthread_mutex_lock(&cache_lock);
    if (cache_find(pattern, len, h) >= 0 || (i = cache_slot(bytes)) < 0) {
        pthread_mutex_unlock(&cache_lock); /* another thread kept it first */
        sw_free(key);
        return rc;
    }
    cache[i] = (rc_entry){.key = key, .key_len = len, .hash = h, .code = rc, .bytes = bytes,
                          .used = ++cache_clock, .next = bucket[h & (RC_BUCKETS - 1)]};
    if (*out)
        cache[i].re = eng_regex_ref(*out);
    else
        snprintf(cache[i].message, sizeof cache[i].message, "%s", e.message);
    bucket[h & (RC_BUCKETS - 1)] = i;
    cache_bytes += bytes;
    cache_entries++;
    pthread_mutex_unlock(&cache_lock);
    return rc;
}

void eng_regex_cache_clear(void)
{
    pthread_mutex_lock(&cache_lock);
    cache_init();
    for (int32_t i = 0; i < RC_ENTRIES; i++)
        if (cache[i].key)
            cache_drop(i);
    pthread_mutex_unlock(&cache_lock);
}

void eng_regex_cache_stats_get(eng_regex_cache_stats *out)
{
    pthread_mutex_lock(&cache_lock);
    *out = (eng_regex_cache_stats){.hits = n_hits, .misses = n_misses, .evictions = n_evictions,
                                   .entries = cache_entries, .bytes = cache_bytes,
                                   .max_entries = max_entries, .max_bytes = max_bytes};
    pthread_mutex_unlock(&cache_lock);
}

void eng_regex_cache_limit(size_t entries, size_t bytes)
{
    pthread_mutex_lock(&cache_lock);
    cache_init();
    if (entries)
        max_entries = entries < RC_ENTRIES ? entries : RC_ENTRIES;
    if (bytes)
        max_bytes = bytes;
    cache_evict(0, 0);
    pthread_mutex_unlock(&cache_lock);
}
