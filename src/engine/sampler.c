/* sampler.c - choosing the next token from the logits (see sampler.h).
 *
 * Order of operations in eng_sampler_sample (this is the documented
 * contract; tests check each step):
 *   0. NaN logits are treated as -inf. Then the logit bias (OpenAI's
 *      logit_bias): each listed id's bias is added to its logit, unless
 *      that logit is -inf (a constraint's mask stays a mask).
 *   1. Penalties, on the last penalty_last_n tokens of the history, applied
 *      once per distinct token t with count c in that window (ids outside
 *      [0, n_vocab) are ignored):
 *        repetition (llama.cpp):  logit = logit > 0 ? logit / rp : logit * rp
 *        presence / frequency (OpenAI):
 *                                 logit -= presence * (c > 0) + frequency * c
 *      Penalties apply in greedy mode too (as in llama.cpp's sampler chain):
 *      they are edits of the logits, not part of the random choice.
 *   2. temperature <= 0: greedy. The argmax; ties go to the lowest id.
 *   3. Otherwise: top-k (the k largest logits, ties by lowest id; a heap
 *      selection that skips, a vector at a time, logits that cannot enter
 *      it, so small k never sorts the vocabulary; the k survivors are then
 *      put in id order). Each candidate
 *      then gets a weight relative to the best one,
 *        e = eng__sampler_exp((logit - max) * (1 / temperature))
 *      in single precision (1 / temperature rounded to float, at most
 *      FLT_MAX), with this file's exponential: about 1 ulp from exp, no
 *      fused multiply-add, the same bits from the vector kernels
 *      (sampler_avx2.c, sampler_avx512.c) as from the scalar code, so a draw
 *      does not depend on the machine. The best candidate's e is exactly 1;
 *      e is 0 for -inf and below exp(-80). The probabilities are e / sum(e),
 *      and "the order" is e descending, ties by id ascending.
 *      Each candidate's mass is the integer trunc(e * 2^40) (a candidate
 *      whose probability is below ~1e-12 of the best's has none and is never
 *      picked); masses are added as 64-bit integers, exactly, so no result
 *      depends on the order of an addition. W is the candidates' total mass.
 *        top-p: the shortest prefix of the order whose mass reaches
 *               trunc(top_p * W) (at least one token);
 *        min-p: the tokens with e >= min_p, i.e. probability at least min_p
 *               times the largest (a prefix of the order; at least one token);
 *      the kept set is the shorter of the two prefixes, of mass K. The pick:
 *      with draw k's 53-bit uniform integer u (eng_sampler_uniform is
 *      u / 2^53), target = floor(u * K / 2^53), and the token is the first of
 *      the order whose cumulative mass exceeds target.
 *   Every call consumes exactly one draw (the counter goes up by one), greedy
 *   included, so a resumed generation sets the counter to the number of
 *   tokens already sampled.
 *
 * Finding "the first of the order whose cumulative mass exceeds a target"
 * sorts nothing but a handful of tokens (sampler_find): the bits of a
 * non-negative float order like its value, so the masses are summed per
 * value of the top 12 bits of e (a histogram, one pass); walking the buckets
 * from the top gives the one where the cumulative mass crosses the target.
 * Only that bucket's candidates are gathered (in id order), bucketed by the
 * next 10 bits, then the last 10; what is left then has equal e, so it is
 * already in the order. A group of at most SAMPLER_SMALL candidates is
 * sorted directly. Linear time in the vocabulary, whatever the truncation;
 * top-p costs one more search for its cut.
 *
 * The random stream is counter-based: the uniform number of draw k is a
 * pure function of (seed, k), built from the splitmix64 finaliser, so
 * there is no hidden state to save or restore beyond the counter.
 *
 * Memory: every buffer (candidates, weights and packed masses, the groups
 * of a search, the histograms, penalty counts, the bias list) is allocated
 * once at create, 32 bytes per vocabulary entry and 48 KiB of histograms;
 * sampling allocates nothing. A vocabulary of more than 2^23 entries is
 * refused at create (its masses could pass 2^64).
 */
/* CMakeLists.txt compiles this file and its kernels with -ffp-contract=off. */

#include "engine/sampler.h"

#include "common/alloc.h"
#include "device/cpu/cpu_kernels.h"
#include "engine/sampler-impl.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* n_vocab masses of at most 2^40 add up below 2^64. */
#define SAMPLER_MAX_VOCAB (1 << 23)
#define SAMPLER_BUCKETS 1024 /* 10 bits per level; the top level's 12 bits of
                                e <= 1 (0x3f800000 >> 20 = 1016) fit too */
#define SAMPLER_SMALL 16     /* groups this small are sorted directly */
/* The top level's histogram is built as SAMPLER_LANES partial ones
 * (sampler_histogram_lanes), shared out between a pass's chunks. */
#define SAMPLER_LANES 4

typedef struct eng_candidate {
    float value; /* logit */
    int32_t id;
} eng_candidate;

struct eng_sampler {
    eng_sampler_params params;
    int32_t n_vocab;
    uint64_t draws;
    const eng__sampler_kernels *kern; /* this call's */
    eng_sampler_threads threads;      /* lent (eng_sampler_set_threads); for_each NULL: none */
    eng_candidate *cand;  /* n_vocab: top-k's heap, then its survivors in id order */
    float *weight;        /* n_vocab: e of each candidate (index order = id order) */
    uint64_t *packed;     /* n_vocab: bucket and mass of each (masses kernel) */
    int32_t *group_a;     /* n_vocab each: indices into weight of the bucket */
    int32_t *group_b;     /*   being refined (sampler_find) */
    uint32_t *counts;     /* n_vocab: penalty counts, all zero between calls */
    uint64_t mass_top[SAMPLER_BUCKETS]; /* mass per top 12 bits of e, this call */
    uint64_t mass_part[SAMPLER_LANES][SAMPLER_BUCKETS]; /* mass_top in the making */
    uint64_t mass_sub[SAMPLER_BUCKETS]; /* mass per 10 bits, inside one bucket */
};

eng_sampler_params eng_sampler_default_params(void)
{
    eng_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.penalty_last_n = 64;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = 0;
    return p;
}

eng_sampler *eng_sampler_create(const eng_sampler_params *params, int32_t n_vocab)
{
    eng_sampler *s = NULL;
    if (!params || n_vocab <= 0 || n_vocab > SAMPLER_MAX_VOCAB)
        return NULL;
    s = sw_calloc(1, sizeof *s);
    if (!s)
        goto fail;
    s->params = *params;
    s->params.bias_ids = NULL;
    s->params.bias_values = NULL;
    s->params.n_bias = 0;
    s->n_vocab = n_vocab;
    s->cand = sw_calloc((size_t)n_vocab, sizeof *s->cand);
    s->counts = sw_calloc((size_t)n_vocab, sizeof *s->counts);
    s->weight = sw_calloc((size_t)n_vocab, sizeof *s->weight);
    s->packed = sw_calloc((size_t)n_vocab, sizeof *s->packed);
    s->group_a = sw_calloc((size_t)n_vocab, sizeof *s->group_a);
    s->group_b = sw_calloc((size_t)n_vocab, sizeof *s->group_b);
    if (!s->cand || !s->counts || !s->weight || !s->packed || !s->group_a || !s->group_b)
        goto fail;
    if (params->n_bias > 0 && params->bias_ids && params->bias_values) {
        int32_t *ids = sw_malloc(sizeof *ids * (size_t)params->n_bias);
        float *values = sw_malloc(sizeof *values * (size_t)params->n_bias);
        s->params.bias_ids = ids;
        s->params.bias_values = values;
        if (!ids || !values)
            goto fail;
        memcpy(ids, params->bias_ids, sizeof *ids * (size_t)params->n_bias);
        memcpy(values, params->bias_values, sizeof *values * (size_t)params->n_bias);
        s->params.n_bias = params->n_bias;
    }
    return s;
fail:
    eng_sampler_free(s);
    return NULL;
}

void eng_sampler_free(eng_sampler *s)
{
    if (!s)
        return;
    sw_free(s->cand);
    sw_free(s->counts);
    sw_free(s->weight);
    sw_free(s->packed);
    sw_free(s->group_a);
    sw_free(s->group_b);
    sw_free((void *)s->params.bias_ids);
    sw_free((void *)s->params.bias_values);
    sw_free(s);
}

uint64_t eng_sampler_draws(const eng_sampler *s)
{
    return s->draws;
}

void eng_sampler_set_draws(eng_sampler *s, uint64_t draws)
{
    s->draws = draws;
}

void eng_sampler_set_threads(eng_sampler *s, const eng_sampler_threads *threads)
{
    if (threads && threads->for_each)
        s->threads = *threads;
    else
        memset(&s->threads, 0, sizeof s->threads);
}

void eng_sampler_mask_logits(float *logits, int32_t n_logits, const uint32_t *allowed,
                             int32_t n_allowed_ids)
{
    for (int32_t i = 0; i < n_logits; i++)
        if (i >= n_allowed_ids || !((allowed[i >> 5] >> (i & 31)) & 1u))
            logits[i] = -INFINITY;
}

/* splitmix64's output function (Steele, Lea, Flood 2014): a bijection of
 * 64-bit words with full avalanche. */
static uint64_t sampler_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Draw k's 53-bit uniform integer. */
static uint64_t sampler_uniform_bits(uint64_t seed, uint64_t k)
{
    /* The seed is mixed on its own first so that (seed, k) and (seed + 1,
     * k - 1) do not collide, then the counter is added on the Weyl sequence
     * splitmix64 itself uses, and the sum mixed twice. */
    uint64_t key = sampler_mix64(seed ^ 0x6a09e667f3bcc909ULL);
    uint64_t z = sampler_mix64(key + (k + 1) * 0x9e3779b97f4a7c15ULL);
    z = sampler_mix64(z ^ 0xbb67ae8584caa73bULL);
    return z >> 11;
}

double eng_sampler_uniform(uint64_t seed, uint64_t k)
{
    return (double)sampler_uniform_bits(seed, k) * (1.0 / 9007199254740992.0); /* 2^-53 */
}

/* "a ranks before b": larger value first, then smaller id. NaN never
 * reaches here (sanitised to -inf first). */
static bool sampler_before(const eng_candidate *a, const eng_candidate *b)
{
    if (a->value != b->value)
        return a->value > b->value;
    return a->id < b->id;
}

static int sampler_cmp_id(const void *pa, const void *pb)
{
    const eng_candidate *a = pa, *b = pb;
    return (a->id > b->id) - (a->id < b->id);
}

void eng_sampler_apply_penalties(eng_sampler *s, float *logits, const int32_t *history,
                                 size_t n_history)
{
    const eng_sampler_params *p = &s->params;
    if (!history || n_history == 0 || p->penalty_last_n == 0)
        return;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
        p->frequency_penalty == 0.0f)
        return;
    size_t window = n_history;
    /* A negative penalty_last_n means "the whole history", as in llama.cpp's -1. */
    if (p->penalty_last_n > 0 && (size_t)p->penalty_last_n < window)
        window = (size_t)p->penalty_last_n;
    const int32_t *recent = history + (n_history - window);
    for (size_t i = 0; i < window; i++) {
        int32_t t = recent[i];
        if (t >= 0 && t < s->n_vocab)
            s->counts[t]++;
    }
    /* Second pass: apply once per distinct token, and zero its count so the
     * next occurrence is skipped and the buffer is clean for the next call. */
    for (size_t i = 0; i < window; i++) {
        int32_t t = recent[i];
        if (t < 0 || t >= s->n_vocab || s->counts[t] == 0)
            continue;
        uint32_t c = s->counts[t];
        float l = logits[t];
        if (p->repeat_penalty != 1.0f && p->repeat_penalty > 0.0f)
            l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)c;
        logits[t] = l;
        s->counts[t] = 0;
    }
}

/* Sift-down in a min-heap whose root is the candidate that ranks last. */
static void sampler_heap_down(eng_candidate *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && sampler_before(&h[worst], &h[l]))
            worst = l;
        if (r < n && sampler_before(&h[worst], &h[r]))
            worst = r;
        if (worst == i)
            return;
        eng_candidate tmp = h[i];
        h[i] = h[worst];
        h[worst] = tmp;
        i = worst;
    }
}

/* Puts the k best of logits[0..n) into cand[0..k), unordered. A later
 * token enters only with a logit above the heap's worst (an equal one has
 * a larger id, so it ranks after), so runs of those that cannot are
 * skipped by first_above, 8 or 16 at a time. */
static void sampler_select_top_k(const eng__sampler_kernels *kern, eng_candidate *cand,
                                 const float *logits, int32_t n, int32_t k)
{
    for (int32_t i = 0; i < k; i++) {
        cand[i].value = logits[i];
        cand[i].id = i;
    }
    for (size_t i = (size_t)k / 2; i-- > 0;)
        sampler_heap_down(cand, (size_t)k, i);
    for (int32_t i = kern->first_above(logits, k, n, cand[0].value); i < n;
         i = kern->first_above(logits, i + 1, n, cand[0].value)) {
        cand[0] = (eng_candidate){logits[i], i};
        sampler_heap_down(cand, (size_t)k, 0);
    }
}

/* ---- the draw ------------------------------------------------------------ */

float eng__sampler_exp(float x)
{
    /* exp(x) = 2^k * exp(r), k = round(x / ln 2), |r| <= ln(2) / 2 (Cody and
     * Waite's two-part ln 2: k * ln2_hi is exact), exp(r) by its Taylor
     * polynomial of degree 6 (truncation error below 1.2e-7 relative).
     * Every step is a separately rounded float operation: the vector
     * kernels do exactly these, lane by lane. */
    if (!(x >= ENG_SAMPLER_EXP_MIN))
        return 0.0f;
    float t = x * 1.44269504f;
    float kf = (t + 12582912.0f) - 12582912.0f; /* round to nearest, |t| < 2^22 */
    float r = x - kf * 0.693145752f;
    r = r - kf * 1.42860677e-6f;
    float p = 1.38888892e-3f;
    p = p * r + 8.33333377e-3f;
    p = p * r + 4.16666679e-2f;
    p = p * r + 0.166666672f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)kf + 127) << 23; /* 2^k, k in [-116, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static float sampler_scalar_sanitize_max(float *logits, int32_t n)
{
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
        if (logits[i] > m)
            m = logits[i];
    }
    return m;
}

static float sampler_scalar_max(const float *logits, int32_t n)
{
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] > m)
            m = logits[i];
    return m;
}

static int32_t sampler_scalar_bucket(const float *weight, int32_t from, int32_t to, uint32_t key,
                                     int32_t *out)
{
    int32_t m = 0;
    for (int32_t i = from; i < to; i++) {
        uint32_t bits;
        memcpy(&bits, &weight[i], sizeof bits);
        /* without a branch: members are scattered, a branch mispredicts */
        out[m] = i;
        m += (bits >> 20) == key;
    }
    return m;
}

static void sampler_scalar_weights(const float *logits, int32_t n, float max, float inv_temp,
                                   float min_p, float *e, uint64_t *packed, uint64_t *total,
                                   uint64_t *above)
{
    for (int32_t i = 0; i < n; i++)
        e[i] = eng__sampler_exp((logits[i] - max) * inv_temp);
    eng__sampler_masses_scalar(e, n, min_p, packed, total, above);
}

static int32_t sampler_scalar_first_above(const float *values, int32_t from, int32_t n,
                                          float threshold)
{
    for (int32_t i = from; i < n; i++)
        if (values[i] > threshold)
            return i;
    return n;
}

static const eng__sampler_kernels sampler_kernels_scalar = {
    sampler_scalar_sanitize_max, sampler_scalar_max, sampler_scalar_weights,
    sampler_scalar_bucket, sampler_scalar_first_above};

/* The kernels of the instruction set the CPU kernels use (cpu_kernels_isa:
 * what the CPU has, lowered by SPILLWAY_CPU_KERNELS or a test). */
static const eng__sampler_kernels *sampler_kernels(void)
{
#if defined(__x86_64__) || defined(__i386__)
    cpu_isa isa = cpu_kernels_isa();
    if (isa >= CPU_ISA_AVX512)
        return &eng__sampler_kernels_avx512;
    if (isa >= CPU_ISA_AVX2)
        return &eng__sampler_kernels_avx2;
#endif
    return &sampler_kernels_scalar;
}

static inline uint32_t sampler_bits(float e)
{
    uint32_t b;
    memcpy(&b, &e, sizeof b);
    return b;
}

static inline uint64_t sampler_mass(float e)
{
    /* through int64_t: e * 2^40 <= 2^40, and the signed conversion is one
     * instruction where the unsigned one tests for 2^63 first */
    return (uint64_t)(int64_t)(e * ENG_SAMPLER_MASS_SCALE);
}

/* floor(u * total / 2^53) for u < 2^53, without 128-bit integers. */
static uint64_t sampler_scale_u53(uint64_t u, uint64_t total)
{
    const uint64_t lo32 = 0xffffffffULL;
    uint64_t u_hi = u >> 32, u_lo = u & lo32, t_hi = total >> 32, t_lo = total & lo32;
    uint64_t ll = u_lo * t_lo, hl = u_hi * t_lo, lh = u_lo * t_hi, hh = u_hi * t_hi;
    uint64_t mid = (ll >> 32) + (hl & lo32) + (lh & lo32);
    uint64_t high = hh + (hl >> 32) + (lh >> 32) + (mid >> 32);
    uint64_t low = (mid << 32) | (ll & lo32);
    return (high << 11) | (low >> 53);
}

/* Walks buckets from the top: the bucket where acc + its mass first
 * exceeds target (acc then holds the mass above it), or -1. */
static int32_t sampler_walk(const uint64_t *mass, uint64_t target, uint64_t *acc)
{
    for (int32_t b = SAMPLER_BUCKETS; b-- > 0;) {
        if (*acc + mass[b] > target)
            return b;
        *acc += mass[b];
    }
    return -1;
}

void eng__sampler_masses_scalar(const float *weight, int32_t n, float min_p, uint64_t *packed,
                                uint64_t *total, uint64_t *above)
{
    uint64_t t = 0, a = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t w = sampler_mass(weight[i]);
        packed[i] = (uint64_t)(sampler_bits(weight[i]) >> 20) << ENG_SAMPLER_MASS_BITS | w;
        t += w;
        a += w & (0 - (uint64_t)(weight[i] >= min_p)); /* no branch */
    }
    *total = t;
    *above = a;
}

/* ---- passes over the candidates, split between lent threads ------------ */

/* Fewer candidates stay on one thread: the hand-off would cost more than
 * half a pass. */
#define SAMPLER_PARALLEL_MIN 16384

/* One pass over the candidates in n_chunks contiguous chunks (1, 2 or 4:
 * chunk c builds its histogram in lanes [c, c + 1) * SAMPLER_LANES /
 * n_chunks of mass_part), what each chunk found, and the pass's inputs. The
 * results do not depend on the chunking: maxima and integer sums combine
 * exactly, and gathers are concatenated in chunk order. */
typedef struct sampler_pass {
    eng_sampler *s;
    int32_t n, n_chunks;
    float *logits;                 /* sanitize: the whole vocabulary */
    const float *values;           /* weigh: the candidates' logits */
    float max, inv_temp, min_p;
    uint32_t key;                  /* gather: the top-level bucket */
    float chunk_max[SAMPLER_LANES];
    uint64_t total[SAMPLER_LANES], above[SAMPLER_LANES];
    int32_t found[SAMPLER_LANES];
} sampler_pass;

static void sampler_chunk(const sampler_pass *ps, int32_t c, int32_t *begin, int32_t *end)
{
    /* chunks of a multiple of 64 candidates: whole vectors, whole lines */
    int64_t per = (((int64_t)ps->n + ps->n_chunks - 1) / ps->n_chunks + 63) & ~(int64_t)63;
    int64_t b = (int64_t)c * per, e = b + per;
    *begin = (int32_t)(b < ps->n ? b : ps->n);
    *end = (int32_t)(e < ps->n ? e : ps->n);
}

static void sampler_run(sampler_pass *ps, void (*fn)(void *arg, int32_t chunk))
{
    if (ps->n_chunks > 1)
        ps->s->threads.for_each(ps->s->threads.ctx, ps->n_chunks, fn, ps);
    else
        fn(ps, 0);
}

static void sampler_sanitize_task(void *arg, int32_t c)
{
    sampler_pass *ps = arg;
    int32_t b, e;
    sampler_chunk(ps, c, &b, &e);
    ps->chunk_max[c] = ps->s->kern->sanitize_max(ps->logits + b, e - b);
}

/* Adds n packed masses to the histogram lanes part[0, lanes), candidate i
 * into lane i % lanes: neighbours in one bucket (the common case) would
 * otherwise wait on each other's read-modify-write. */
static void sampler_histogram_lanes(uint64_t (*part)[SAMPLER_BUCKETS], int32_t lanes,
                                    const uint64_t *packed, int32_t n)
{
    const uint64_t low = (1ULL << ENG_SAMPLER_MASS_BITS) - 1;
    int32_t i = 0;
    if (lanes == 4) {
        for (; i + 4 <= n; i += 4) { /* written out */
            part[0][packed[i] >> ENG_SAMPLER_MASS_BITS] += packed[i] & low;
            part[1][packed[i + 1] >> ENG_SAMPLER_MASS_BITS] += packed[i + 1] & low;
            part[2][packed[i + 2] >> ENG_SAMPLER_MASS_BITS] += packed[i + 2] & low;
            part[3][packed[i + 3] >> ENG_SAMPLER_MASS_BITS] += packed[i + 3] & low;
        }
    } else if (lanes == 2) {
        for (; i + 2 <= n; i += 2) {
            part[0][packed[i] >> ENG_SAMPLER_MASS_BITS] += packed[i] & low;
            part[1][packed[i + 1] >> ENG_SAMPLER_MASS_BITS] += packed[i + 1] & low;
        }
    }
    for (; i < n; i++)
        part[0][packed[i] >> ENG_SAMPLER_MASS_BITS] += packed[i] & low;
}

/* A chunk's weights and masses, and their histogram in its lanes. */
static void sampler_weigh_task(void *arg, int32_t c)
{
    sampler_pass *ps = arg;
    eng_sampler *s = ps->s;
    int32_t b, e, lanes = SAMPLER_LANES / ps->n_chunks;
    sampler_chunk(ps, c, &b, &e);
    s->kern->weights(ps->values + b, e - b, ps->max, ps->inv_temp, ps->min_p, s->weight + b,
                     s->packed + b, &ps->total[c], &ps->above[c]);
    sampler_histogram_lanes(s->mass_part + c * lanes, lanes, s->packed + b, e - b);
}

/* A chunk's members of the top-level bucket key, at group_a + its start. */
static void sampler_gather_task(void *arg, int32_t c)
{
    sampler_pass *ps = arg;
    eng_sampler *s = ps->s;
    int32_t b, e;
    sampler_chunk(ps, c, &b, &e);
    ps->found[c] = s->kern->bucket(s->weight, b, e, ps->key, s->group_a + b);
}

/* Sorts a small group of indices into the order: e descending, then index
 * (= id) ascending. */
static void sampler_sort_small(const float *e, int32_t *group, int32_t m)
{
    for (int32_t j = 1; j < m; j++) {
        int32_t x = group[j], k = j;
        while (k > 0 && (e[group[k - 1]] < e[x] || (e[group[k - 1]] == e[x] && group[k - 1] > x))) {
            group[k] = group[k - 1];
            k--;
        }
        group[k] = x;
    }
}

/* The index into weight[0..ps->n) of the first candidate of the order whose
 * cumulative mass exceeds target (which must be below the total mass), and
 * in *through the cumulative mass up to and including it. mass_top holds
 * the top-level histogram. The top-level gather runs in ps's chunks. */
static int32_t sampler_find(eng_sampler *s, sampler_pass *ps, uint64_t target, uint64_t *through)
{
    const float *e = s->weight;
    uint64_t acc = 0;
    int32_t b = sampler_walk(s->mass_top, target, &acc);
    if (b < 0) {
        /* unreachable while target < total; the best candidate stays valid */
        *through = acc;
        return 0;
    }
    int32_t *group = s->group_a, *spare = s->group_b;
    ps->key = (uint32_t)b;
    sampler_run(ps, sampler_gather_task);
    int32_t m = ps->found[0];
    for (int32_t c = 1; c < ps->n_chunks; c++) { /* the chunks' members, in order */
        int32_t begin, end;
        sampler_chunk(ps, c, &begin, &end);
        memmove(group + m, group + begin, sizeof *group * (size_t)ps->found[c]);
        m += ps->found[c];
    }
    for (int shift = 10; shift >= 0 && m > SAMPLER_SMALL; shift -= 10) {
        memset(s->mass_sub, 0, sizeof s->mass_sub);
        for (int32_t j = 0; j < m; j++) {
            float v = e[group[j]];
            s->mass_sub[(sampler_bits(v) >> shift) & (SAMPLER_BUCKETS - 1)] += sampler_mass(v);
        }
        b = sampler_walk(s->mass_sub, target, &acc);
        int32_t k = 0;
        for (int32_t j = 0; j < m; j++) {
            spare[k] = group[j];
            k += ((sampler_bits(e[group[j]]) >> shift) & (SAMPLER_BUCKETS - 1)) == (uint32_t)b;
        }
        int32_t *tmp = group;
        group = spare;
        spare = tmp;
        m = k;
    }
    /* After the last level every member has the same e and the group is in
     * index order already; a small group may still need sorting. */
    if (m <= SAMPLER_SMALL)
        sampler_sort_small(e, group, m);
    for (int32_t j = 0; j < m; j++) {
        acc += sampler_mass(e[group[j]]);
        if (acc > target) {
            *through = acc;
            return group[j];
        }
    }
    *through = acc;
    return m > 0 ? group[m - 1] : 0;
}

int32_t eng_sampler_sample(eng_sampler *s, float *logits, const int32_t *history,
                           size_t n_history)
{
    const eng_sampler_params *p = &s->params;
    const eng__sampler_kernels *kern = sampler_kernels();
    s->kern = kern;
    const int32_t n = s->n_vocab;
    const uint64_t u = sampler_uniform_bits(p->seed, s->draws);
    s->draws++;

    int32_t chunks = 1;
    if (s->threads.for_each && s->threads.n_threads >= 2)
        chunks = s->threads.n_threads >= 4 ? 4 : 2;
    sampler_pass ps = {.s = s, .n = n, .n_chunks = n >= SAMPLER_PARALLEL_MIN ? chunks : 1,
                       .logits = logits};
    sampler_run(&ps, sampler_sanitize_task);
    float max = ps.chunk_max[0];
    for (int32_t c = 1; c < ps.n_chunks; c++)
        max = ps.chunk_max[c] > max ? ps.chunk_max[c] : max;
    bool edited = false;
    for (int32_t j = 0; j < p->n_bias; j++) {
        int32_t id = p->bias_ids[j];
        if (id >= 0 && id < n && logits[id] != -INFINITY) {
            logits[id] += p->bias_values[j];
            edited = true;
        }
    }
    if (history && n_history > 0 && p->penalty_last_n != 0 &&
        (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
         p->frequency_penalty != 0.0f)) {
        eng_sampler_apply_penalties(s, logits, history, n_history);
        edited = true;
    }
    if (edited)
        max = kern->max(logits, n);

    if (!(p->temperature > 0.0f)) {
        /* the argmax, ties to the lowest id (all -inf: id 0) */
        for (int32_t i = 0; i < n; i++)
            if (logits[i] == max)
                return i;
        return 0;
    }

    /* top-k: the survivors, in id order, with their logits in weight[] */
    int32_t n_cand = n;
    const float *values = logits;
    eng_candidate *cand = NULL;
    if (p->top_k > 0 && p->top_k < n) {
        n_cand = p->top_k;
        cand = s->cand;
        sampler_select_top_k(kern, cand, logits, n, n_cand);
        qsort(cand, (size_t)n_cand, sizeof *cand, sampler_cmp_id);
        for (int32_t i = 0; i < n_cand; i++)
            s->weight[i] = cand[i].value;
        values = s->weight;
        max = kern->max(values, n_cand);
    }
    if (!(max > -INFINITY) || max == INFINITY) {
        /* Degenerate: nothing has finite mass (all -inf), or +inf dominates.
         * The best-ranked candidate is the only sensible answer. */
        for (int32_t i = 0; i < n_cand; i++)
            if (values[i] == max)
                return cand ? cand[i].id : i;
        return cand ? cand[0].id : 0;
    }

    float inv_temp = 1.0f / p->temperature;
    if (!(inv_temp <= FLT_MAX))
        inv_temp = FLT_MAX;
    ps.n = n_cand;
    ps.n_chunks = n_cand >= SAMPLER_PARALLEL_MIN ? chunks : 1;
    ps.values = values;
    ps.max = max;
    ps.inv_temp = inv_temp;
    ps.min_p = p->min_p;
    memset(s->mass_part, 0, sizeof s->mass_part);
    sampler_run(&ps, sampler_weigh_task);
    uint64_t total = 0, above_min_p = 0;
    for (int32_t c = 0; c < ps.n_chunks; c++) {
        total += ps.total[c];
        above_min_p += ps.above[c];
    }
    for (int32_t b = 0; b < SAMPLER_BUCKETS; b++) {
        uint64_t m = 0;
        for (int32_t l = 0; l < SAMPLER_LANES; l++)
            m += s->mass_part[l][b];
        s->mass_top[b] = m;
    }
    uint64_t kept = total, through = 0;
    if (p->min_p > 0.0f) {
        /* the best candidate (e = 1, mass 2^40) at least */
        const uint64_t best_mass = (uint64_t)ENG_SAMPLER_MASS_SCALE;
        kept = above_min_p > best_mass ? above_min_p : best_mass;
    }
    if (p->top_p < 1.0f) {
        uint64_t need = p->top_p > 0.0f ? (uint64_t)((double)p->top_p * (double)total) : 0;
        sampler_find(s, &ps, need > 0 ? need - 1 : 0, &through);
        if (through < kept)
            kept = through;
    }
    int32_t pos = sampler_find(s, &ps, sampler_scale_u53(u, kept), &through);
    return cand ? cand[pos].id : pos;
}

void eng_log_softmax(const float *logits, float *logprobs, int32_t n)
{
    if (n <= 0)
        return;
    float max_logit = -INFINITY;
    int32_t n_inf = 0;
    for (int32_t i = 0; i < n; i++) {
        float l = logits[i];
        if (l > max_logit)
            max_logit = l;
        if (l == INFINITY)
            n_inf++;
    }
    if (max_logit == INFINITY) {
        /* +inf entries share all the mass. */
        const float lp = (float)-log((double)n_inf);
        for (int32_t i = 0; i < n; i++)
            logprobs[i] = logits[i] == INFINITY ? lp : -INFINITY;
        return;
    }
    if (max_logit == -INFINITY) {
        /* No finite logit (all -inf or NaN): no information, uniform. */
        const float lp = (float)-log((double)n);
        for (int32_t i = 0; i < n; i++)
            logprobs[i] = lp;
        return;
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        float l = logits[i];
        if (!isnan(l))
            sum += exp((double)l - (double)max_logit);
    }
    /* (l - max) - log(sum), not l - (max + log(sum)): with max = 1e30 the
     * latter would lose log(sum) to rounding. */
    const double log_sum = log(sum);
    for (int32_t i = 0; i < n; i++) {
        float l = logits[i];
        logprobs[i] = isnan(l) ? -INFINITY
                               : (float)(((double)l - (double)max_logit) - log_sum);
    }
}
