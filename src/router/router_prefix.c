/* router_prefix.c - the router's summaries of what each worker's prefix
 * cache may hold (router_prefix.h). No lock of its own: the pool's. */
#include "router/router_prefix.h"

#include <string.h>

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int rt_prefix_hashes(const int32_t *ids, size_t n, uint64_t *out, int cap)
{
    if (!ids || n < 2 || cap <= 0)
        return 0;
    size_t blocks = (n - 1) / RT_PREFIX_BLOCK_TOKENS;
    if (blocks > (size_t)cap)
        blocks = (size_t)cap;
    uint64_t h = 0x8a5cd789635d2dffULL;
    for (size_t b = 0; b < blocks; b++) {
        for (size_t i = 0; i < RT_PREFIX_BLOCK_TOKENS; i++)
            h = mix64(h + (uint64_t)(uint32_t)ids[b * RT_PREFIX_BLOCK_TOKENS + i] +
                      0x9e3779b97f4a7c15ULL);
        out[b] = h ? h : 1;
    }
    return (int)blocks;
}

void rt_prefix_note(rt_prefix_summary *s, const uint64_t *hashes, int n)
{
    for (int i = 0; i < n; i++) {
        uint64_t h = hashes[i];
        size_t set = h & (RT_PREFIX_SETS - 1);
        int way = 0;
        for (int k = 0; k < RT_PREFIX_WAYS; k++) {
            if (s->hash[set][k] == h) {
                way = k;
                break;
            }
            if (s->used[set][k] < s->used[set][way])
                way = k;
        }
        s->hash[set][way] = h;
        s->used[set][way] = ++s->clock;
    }
}

int rt_prefix_match(const rt_prefix_summary *s, const uint64_t *hashes, int n)
{
    int m = 0;
    for (; m < n; m++) {
        size_t set = hashes[m] & (RT_PREFIX_SETS - 1);
        int k = 0;
        while (k < RT_PREFIX_WAYS && s->hash[set][k] != hashes[m])
            k++;
        if (k == RT_PREFIX_WAYS)
            break;
    }
    return m;
}

void rt_prefix_clear(rt_prefix_summary *s)
{
    memset(s, 0, sizeof *s);
}

/* The slot of h, or of the first free one on its probe when absent
 * (-1: neither). */
static int shared_find(const rt_prefix_shared *m, uint64_t h, bool *found)
{
    int free_slot = -1;
    for (int k = 0; k < RT_SHARED_SLOTS; k++) {
        int i = (int)((h + (uint64_t)k) & (RT_SHARED_SLOTS - 1));
        if (m->hash[i] == h) {
            *found = true;
            return i;
        }
        if (m->refs[i] == 0 && free_slot < 0)
            free_slot = i;
        if (m->hash[i] == 0)
            break;
    }
    *found = false;
    return free_slot;
}

int32_t rt_shared_refs(const rt_prefix_shared *m, uint64_t h)
{
    bool found;
    int i = shared_find(m, h, &found);
    return found ? m->refs[i] : 0;
}

bool rt_shared_take(rt_prefix_shared *m, uint64_t h, int32_t *refs_after)
{
    bool found;
    int i = shared_find(m, h, &found);
    if (i < 0)
        return false;
    if (!found)
        m->hash[i] = h;
    if (m->refs[i]++ == 0)
        m->live++;
    *refs_after = m->refs[i];
    return true;
}

int32_t rt_shared_give(rt_prefix_shared *m, uint64_t h)
{
    bool found;
    int i = shared_find(m, h, &found);
    if (!found || m->refs[i] == 0)
        return 0;
    int32_t after = --m->refs[i];
    if (after == 0 && --m->live == 0)
        memset(m, 0, sizeof *m); /* empty: the kept hashes go too */
    return after;
}
