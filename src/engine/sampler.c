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
 *   3. Otherwise: top-k (the k largest logits, ties by lowest id; the k
 *      survivors are then put in id order). The candidates (the survivors,
 *      or the whole vocabulary) are numbered in id order. Each candidate
 *      then gets a weight relative to the best one, exp((logit - max) /
 *      temperature) as a power of two,
 *        e = eng__sampler_exp2((logit - max) * scale),
 *        scale = log2(e) / temperature
 *      in single precision (log2(e) rounded to float, ENG_SAMPLER_LOG2E,
 *      divided by the temperature and rounded, at most FLT_MAX), with this
 *      file's exponential: within 1.7e-7 of 2^t, a fixed sequence of
 *      correctly rounded operations (fused multiply-adds where it says so),
 *      the same bits from the vector kernels (sampler_avx2.c,
 *      sampler_avx512.c) as from the scalar code, so a draw does not depend
 *      on the machine. The best candidate's e is exactly 1; e is 0 for -inf
 *      and below 2^-116. The probabilities are e / sum(e),
 *      and "the order" is e descending, ties by id ascending.
 *      Each candidate's mass is the integer trunc(e * 2^25) (a candidate
 *      whose probability is below 2^-25, ~3e-8, of the best's has none and
 *      is never picked: a vector converts and adds 32-bit masses, twice as
 *      many per instruction as 64-bit ones); masses are added as integers,
 *      exactly, so no result depends on the order of an addition. W is the
 *      candidates' total mass.
 *        top-p: the shortest prefix of the order whose mass reaches
 *               trunc(top_p * W) (at least one token);
 *        min-p: the tokens with e >= min_p, i.e. probability at least min_p
 *               times the largest (a prefix of the order; at least one token;
 *               min_p > 1 keeps only the best, so it is greedy's token);
 *      the kept set is the shorter of the two prefixes, of mass K.
 *      Draw k has a stream of 53-bit uniform integers u_0, u_1, ...
 *      (eng_sampler_uniform is u_0 / 2^53).
 *      Trials, by rejection from an envelope: the candidates fall in blocks
 *      of ENG_SAMPLER_BLOCK (512) by number, and block b's lane l (of 16)
 *      holds its candidates b * 512 + l + 16 r, r = 0 .. 31. A lane's
 *      envelope mass v is the mass of its largest logit's weight plus
 *      ENG_SAMPLER_SLACK (2: the exponential never loses more masses as its
 *      argument rises, checked over every float), so v bounds each member's
 *      mass; v is 0 where that weight is 0, or below min_p *
 *      ENG_SAMPLER_NEAR (0.999999: the same check bounds the exponential's
 *      relative fall). E is the sum of v times the lane's members. Trial j
 *      takes target = floor(u_j * E / 2^53), walks the blocks, then a
 *      block's lanes in order, each weighing v times its members, to the
 *      lane where the walk passes target, with r what is left of target
 *      there: its member r / v (counted from its first) is proposed, and
 *      kept when r mod v is below the member's mass and its e >= min_p.
 *      Every candidate of min-p's set (every candidate without min-p) is
 *      kept with probability mass / E in a trial, so the first one kept is
 *      drawn in proportion to its mass.
 *      Without top-p the token is the first candidate a trial keeps. With
 *      top-p, the candidates the trials keep are proposals, at most
 *      ENG_SAMPLER_ATTEMPTS of them, and the first one that lies in the
 *      kept set is the token (each is kept with probability K / (min-p's
 *      mass) >= top_p, roughly). When the trials run out
 *      (ENG_SAMPLER_TRIALS, 1024, of them) or every proposal is refused,
 *      the token is the pick from the kept set with u_ENG_SAMPLER_TRIALS:
 *      target = floor(u * K / 2^53), and the token is the first of the set,
 *      in id order, whose cumulative mass exceeds target.
 *   Every call consumes exactly one draw (the counter goes up by one), greedy
 *   included, so a resumed generation sets the counter to the number of
 *   tokens already sampled.
 *
 * Linear time, and one pass over the vocabulary in most draws: the pass
 * that cleans NaN away also keeps each lane's largest logit; then the
 * envelope is made from the lanes (the exponential of 16 per block), and
 * a trial costs one weight. Without min-p a trial keeps a candidate with
 * probability above 1/33 whatever the logits (a lane's envelope is at
 * most 32 times its largest member's mass, plus the slack); min-p only
 * takes lanes out. top-k's k-th largest logit is bounded from below by the
 * k-th largest of the blocks' maxima, so the heap selection sees only the
 * logits above that, in the lanes that hold them. A top-p proposal of
 * weight e needs the mass ranked before it: the blocks whose largest
 * weight is near e or above are weighed exactly (their masses summed, the
 * part ranked before it apart), and the proposal is kept at once when that
 * mass is within the target of a lower bound of W (those blocks' exact
 * masses, and the largest logit of each lane of the others); only where
 * that cannot tell is every block weighed, for W itself. The cut is never
 * looked for unless every proposal is refused (at top_p 0.95, fewer than 1
 * draw in 10^10).
 *
 * The cut, when it is looked for, is found with nothing sorted but a
 * handful of tokens (sampler_cut): the bits of a non-negative float order
 * like its value, so masses bucketed by the top 12 bits of e (a histogram)
 * and walked from the top give the bucket where the cumulative mass
 * crosses trunc(top_p * W); that bucket's candidates are bucketed by the
 * next 10 bits, then the last 10; what is left has equal e, so it is in
 * the order already. The histogram is estimated first (sampler_estimate:
 * a sample, and the heavy candidates weighed exactly); the candidates of
 * the few buckets around the estimated cut are gathered with the exact
 * mass above them, and the search runs among them; where the estimate
 * missed, the cut is looked for above the buckets, below them, then in the
 * exact histogram: the estimate decides only how fast the cut is found,
 * never which it is.
 *
 * The random stream is counter-based: the uniform numbers of draw k are a
 * pure function of (seed, k, j), built from the splitmix64 finaliser, so
 * there is no hidden state to save or restore beyond the counter.
 *
 * Memory: every buffer (candidates, top-k's survivors, weights, coarse
 * masses, block sums, the lanes' maxima and envelope, the groups of a
 * search, the histograms, penalty counts, the bias list, the weights of
 * top-p's samples) is allocated once at create, about 34 bytes per
 * vocabulary entry and 52 KiB of histograms;
 * sampling allocates nothing. A vocabulary of more than 2^23 entries is
 * refused at create.
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

/* The largest vocabulary (its fine masses, 2^40 at most, add up below
 * 2^64). */
#define SAMPLER_MAX_VOCAB (1 << 23)
#define SAMPLER_BUCKETS 1024 /* 10 bits per level; the top level's 12 bits of
                                e <= 1 (0x3f800000 >> 20 = 1016) fit too */
#define SAMPLER_SMALL 16     /* groups this small are sorted directly */
/* top-p's estimate looks at one candidate in every eng__sampler_stride(n):
 * at least this many of n, at most one in 32 */
#define SAMPLER_SAMPLES 2048
/* The least top-level bucket (sampler_key) of a weight with a mass: e >=
 * 2^-25, exponent 102, 8 buckets per power of two. */
#define SAMPLER_KEY_MASS (102 * 8)
/* At most this many chunks per pass, and the lanes of the histograms built
 * one candidate at a time (sampler_estimate, sampler_bucket_masses). */
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
    float *values;        /* n_vocab: top-k's survivors' logits, in id order */
    float *weight;        /* n_vocab: e of each candidate (index order = id order),
                             stored for top-p's search; else one block's, for
                             the walk */
    uint16_t *coarse;     /* n_vocab: each candidate's coarse mass (top-p's) */
    uint64_t *kept;       /* per block of ENG_SAMPLER_BLOCK candidates: the masses
                             min-p keeps (all of them without min-p) */
    int32_t *group_a;     /* n_vocab each: indices into weight of top-p's */
    int32_t *group_b;     /*   gathered buckets, and of the levels refining */
    int32_t *group_c;     /*   them (sampler_refine) */
    uint64_t total;       /* top-p: every candidate's mass, this call */
    int32_t attempts;     /* top-p's proposals before the exact search */
    uint64_t proposals[3]; /* top-p's proposals kept, refused, and decided on
                              the exact total (the lower bound could not) */
    uint64_t cut_paths[4]; /* top-p cuts (the exact search's) found among the
                              estimate's buckets, among the candidates above
                              them, in buckets below them, from the exact
                              histogram */
    uint32_t *counts;     /* n_vocab: penalty counts, all zero between calls */
    uint64_t mass_top[SAMPLER_BUCKETS]; /* mass per top 12 bits of e: estimated, exact */
    uint32_t count_top[SAMPLER_BUCKETS]; /* the estimate's candidates per bucket */
    uint64_t mass_part[SAMPLER_LANES][SAMPLER_BUCKETS]; /* lanes: of the estimate's
                                                            samples, of an exact
                                                            histogram, of a large
                                                            group's refinement */
    uint64_t mass_sub[SAMPLER_BUCKETS]; /* mass per 10 bits, inside one bucket */
    float *sample_w;      /* one in eng__sampler_stride(n_vocab): the weights of
                             top-p's estimate's samples */
    /* the envelope, per lane (16 per block of ENG_SAMPLER_BLOCK candidates)
     * and per block: */
    float *lane_max;      /* the largest logit of each lane */
    uint32_t *lane_env;   /* each member's envelope mass */
    uint64_t *env_cum;    /* n_blocks + 1: the envelope of the blocks before */
    uint64_t *block_low;  /* the masses of its lanes' largest: below its own */
    float *block_emax;    /* its largest weight */
    uint8_t *block_known; /* top-p: its mass is summed, into w_low */
    uint64_t w_low;       /* top-p: every candidate's mass, from below (exact
                             once every block is known) */
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
    s->attempts = ENG_SAMPLER_ATTEMPTS;
    s->cand = sw_calloc((size_t)n_vocab, sizeof *s->cand);
    s->counts = sw_calloc((size_t)n_vocab, sizeof *s->counts);
    s->values = sw_calloc((size_t)n_vocab, sizeof *s->values);
    s->weight = sw_calloc((size_t)n_vocab, sizeof *s->weight);
    s->coarse = sw_calloc((size_t)n_vocab, sizeof *s->coarse);
    s->kept = sw_calloc((size_t)(n_vocab + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK,
                        sizeof *s->kept);
    s->group_a = sw_calloc((size_t)n_vocab, sizeof *s->group_a);
    s->group_b = sw_calloc((size_t)n_vocab, sizeof *s->group_b);
    s->group_c = sw_calloc((size_t)n_vocab, sizeof *s->group_c);
    size_t n_samples = (size_t)n_vocab / (size_t)eng__sampler_stride(n_vocab) + 1;
    s->sample_w = sw_calloc(n_samples, sizeof *s->sample_w);
    const size_t n_blocks = ((size_t)n_vocab + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK;
    s->lane_max = sw_calloc(n_blocks * ENG_SAMPLER_LANES, sizeof *s->lane_max);
    s->lane_env = sw_calloc(n_blocks * ENG_SAMPLER_LANES, sizeof *s->lane_env);
    s->env_cum = sw_calloc(n_blocks + 1, sizeof *s->env_cum);
    s->block_low = sw_calloc(n_blocks, sizeof *s->block_low);
    s->block_emax = sw_calloc(n_blocks, sizeof *s->block_emax);
    s->block_known = sw_calloc(n_blocks, sizeof *s->block_known);
    if (!s->cand || !s->counts || !s->values || !s->weight || !s->coarse || !s->kept ||
        !s->group_a || !s->group_b || !s->group_c || !s->sample_w || !s->lane_max ||
        !s->lane_env || !s->env_cum || !s->block_low || !s->block_emax || !s->block_known)
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
    sw_free(s->values);
    sw_free(s->weight);
    sw_free(s->coarse);
    sw_free(s->kept);
    sw_free(s->group_a);
    sw_free(s->group_b);
    sw_free(s->group_c);
    sw_free(s->sample_w);
    sw_free(s->lane_max);
    sw_free(s->lane_env);
    sw_free(s->env_cum);
    sw_free(s->block_low);
    sw_free(s->block_emax);
    sw_free(s->block_known);
    sw_free((void *)s->params.bias_ids);
    sw_free((void *)s->params.bias_values);
    sw_free(s);
}

int32_t eng__sampler_stride(int32_t n)
{
    int32_t stride = 1;
    while (stride < 32 && n / (stride * 2) >= SAMPLER_SAMPLES)
        stride *= 2;
    return stride;
}

void eng__sampler_cut_paths(const eng_sampler *s, uint64_t paths[4])
{
    memcpy(paths, s->cut_paths, sizeof s->cut_paths);
}

void eng__sampler_proposals(const eng_sampler *s, uint64_t proposals[3])
{
    memcpy(proposals, s->proposals, sizeof s->proposals);
}

void eng__sampler_set_attempts(eng_sampler *s, int32_t attempts)
{
    s->attempts = attempts > 0 ? attempts : 0;
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

/* Draw k's 53-bit uniform integer number j (top-p's proposals take
 * several; the first, j = 0, is eng_sampler_uniform's). */
static uint64_t sampler_uniform_bits(uint64_t seed, uint64_t k, uint64_t j)
{
    /* The seed is mixed on its own first so that (seed, k) and (seed + 1,
     * k - 1) do not collide, then the counter is added on the Weyl sequence
     * splitmix64 itself uses, and the sum mixed twice, the second time with
     * j (times an odd constant) in. */
    uint64_t key = sampler_mix64(seed ^ 0x6a09e667f3bcc909ULL);
    uint64_t z = sampler_mix64(key + (k + 1) * 0x9e3779b97f4a7c15ULL);
    z = sampler_mix64(z ^ 0xbb67ae8584caa73bULL ^ (j * 0x3c6ef372fe94f82bULL));
    return z >> 11;
}

double eng_sampler_uniform(uint64_t seed, uint64_t k)
{
    return (double)sampler_uniform_bits(seed, k, 0) * (1.0 / 9007199254740992.0); /* 2^-53 */
}

uint64_t eng__sampler_uniform_bits(uint64_t seed, uint64_t k, uint64_t j)
{
    return sampler_uniform_bits(seed, k, j);
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
                                 const float *logits, int32_t id0, int32_t n, int32_t k)
{
    for (int32_t i = 0; i < k; i++) {
        cand[i].value = logits[i];
        cand[i].id = id0 + i;
    }
    for (size_t i = (size_t)k / 2; i-- > 0;)
        sampler_heap_down(cand, (size_t)k, i);
    for (int32_t i = kern->first_above(logits, k, n, cand[0].value); i < n;
         i = kern->first_above(logits, i + 1, n, cand[0].value)) {
        cand[0] = (eng_candidate){logits[i], id0 + i};
        sampler_heap_down(cand, (size_t)k, 0);
    }
}

/* ---- the draw ------------------------------------------------------------ */

static inline uint32_t sampler_bits(float e)
{
    uint32_t b;
    memcpy(&b, &e, sizeof b);
    return b;
}

static inline uint64_t sampler_mass(float e)
{
    /* through int32_t: e * 2^25 <= 2^25, the vector kernels' conversion */
    return (uint64_t)(int32_t)(e * ENG_SAMPLER_MASS_SCALE);
}

float eng__sampler_exp2(float t)
{
    /* 2^t = 2^k * 2^f, k = round(t) (ties to even: the vector kernels'
     * rounding instruction), f = t - k exactly, |f| <= 1/2, 2^f by a
     * polynomial of degree 5 with constant term 1 (fitted for the least
     * largest relative error: below 1e-7, 1.7e-7 as evaluated in float) in
     * Horner's form. Every step is one correctly rounded float operation,
     * a fused multiply-add where written so (fmaf; the vector kernels' FMA
     * instructions round the same way), and the vector kernels do exactly
     * these, lane by lane. */
    if (!(t >= ENG_SAMPLER_EXP2_MIN))
        return 0.0f;
    float k = (t + 12582912.0f) - 12582912.0f; /* round to nearest even, |t| < 2^22 */
    float f = t - k;
    float p = fmaf(1.32647238e-3f, f, 9.67151299e-3f);
    p = fmaf(p, f, 5.55073358e-2f);
    p = fmaf(p, f, 0.240222424f);
    p = fmaf(p, f, 0.693147004f);
    p = fmaf(p, f, 1.0f);
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23; /* 2^k, k in [-116, 0] */
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

static int32_t sampler_scalar_first_above(const float *values, int32_t from, int32_t n,
                                          float threshold)
{
    for (int32_t i = from; i < n; i++)
        if (values[i] > threshold)
            return i;
    return n;
}

int32_t eng__sampler_above_scalar(const float *values, int32_t n, float threshold, int32_t *out,
                                  int32_t cap)
{
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (values[i] > threshold) {
            if (m == cap)
                return cap + 1;
            out[m++] = i;
        }
    return m;
}

/* The members of lane l of block b, of n candidates. */
static inline int32_t sampler_lane_members(int32_t n, int32_t b, int32_t l)
{
    int32_t len = n - b * ENG_SAMPLER_BLOCK;
    len = len < ENG_SAMPLER_BLOCK ? len : ENG_SAMPLER_BLOCK;
    return len > l ? (len - l + ENG_SAMPLER_LANES - 1) / ENG_SAMPLER_LANES : 0;
}

uint64_t eng__sampler_block_env(const uint32_t *lane_env, int32_t n, int32_t b)
{
    uint64_t env = 0;
    for (int32_t l = 0; l < ENG_SAMPLER_LANES; l++)
        env += (uint64_t)lane_env[b * ENG_SAMPLER_LANES + l] *
               (uint64_t)sampler_lane_members(n, b, l);
    return env;
}

float eng__sampler_sanitize_lanes_scalar(float *logits, int32_t n, float *lane_max)
{
    float m = -INFINITY;
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        float *lm = lane_max + b0 / ENG_SAMPLER_BLOCK * ENG_SAMPLER_LANES;
        for (int32_t l = 0; l < ENG_SAMPLER_LANES; l++)
            lm[l] = -INFINITY;
        for (int32_t i = b0; i < n && i < b0 + ENG_SAMPLER_BLOCK; i++) {
            if (isnan(logits[i]))
                logits[i] = -INFINITY;
            if (logits[i] > lm[(i - b0) % ENG_SAMPLER_LANES])
                lm[(i - b0) % ENG_SAMPLER_LANES] = logits[i];
            if (logits[i] > m)
                m = logits[i];
        }
    }
    return m;
}

void eng__sampler_envelope_scalar(const float *lane_max, int32_t n, float max, float scale,
                                  float min_env, uint32_t *lane_env, uint64_t *block_env,
                                  uint64_t *block_low, float *block_emax)
{
    for (int32_t b = 0; b * ENG_SAMPLER_BLOCK < n; b++) {
        uint64_t low = 0;
        float emax = 0.0f;
        for (int32_t l = 0; l < ENG_SAMPLER_LANES; l++) {
            int32_t k = b * ENG_SAMPLER_LANES + l;
            float e = eng__sampler_exp2((lane_max[k] - max) * scale);
            uint64_t m = sampler_mass(e);
            lane_env[k] = e > 0.0f && e >= min_env ? (uint32_t)m + ENG_SAMPLER_SLACK : 0;
            low += m;
            emax = e > emax ? e : emax;
        }
        block_env[b] = eng__sampler_block_env(lane_env, n, b);
        block_low[b] = low;
        block_emax[b] = emax;
    }
}

uint64_t eng__sampler_rank_scalar(const float *logits, int32_t n, float max, float scale,
                                  float threshold, uint64_t *total)
{
    uint64_t above = 0, all = 0;
    for (int32_t i = 0; i < n; i++) {
        float e = eng__sampler_exp2((logits[i] - max) * scale);
        uint64_t m = sampler_mass(e);
        all += m;
        above += e > threshold ? m : 0;
    }
    *total = all;
    return above;
}

static const eng__sampler_kernels sampler_kernels_scalar = {
    .sanitize_max = sampler_scalar_sanitize_max,
    .sanitize_lanes = eng__sampler_sanitize_lanes_scalar,
    .envelope = eng__sampler_envelope_scalar,
    .rank = eng__sampler_rank_scalar,
    .max = sampler_scalar_max,
    .weights = eng__sampler_weights_scalar,
    .fine_sums = eng__sampler_fine_sums_scalar,
    .range = eng__sampler_range_scalar,
    .first_above = sampler_scalar_first_above,
    .above = eng__sampler_above_scalar,
    .kept_mass = eng__sampler_kept_mass_scalar,
    .coarse = eng__sampler_coarse_scalar,
};

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

void eng__sampler_weights_scalar(const float *logits, int32_t n, float max, float scale,
                                 float min_p, float *e, uint64_t *kept)
{
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n;
        uint64_t k = 0;
        for (int32_t i = b0; i < b1; i++) {
            float w = eng__sampler_exp2((logits[i] - max) * scale);
            uint64_t m = sampler_mass(w);
            if (e)
                e[i] = w;
            k += m & (0 - (uint64_t)(w >= min_p)); /* no branch */
        }
        kept[b0 / ENG_SAMPLER_BLOCK] = k;
    }
}

void eng__sampler_fine_sums_scalar(const float *logits, int32_t n, float max, uint64_t *sums)
{
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n;
        uint64_t k = 0;
        for (int32_t i = b0; i < b1; i++) /* through int64_t: e * 2^40 <= 2^40 */
            k += (uint64_t)(int64_t)(eng__sampler_exp2((logits[i] - max) * ENG_SAMPLER_LOG2E) *
                                     ENG_SAMPLER_FINE_SCALE);
        sums[b0 / ENG_SAMPLER_BLOCK] = k;
    }
}

/* Whether weight e of candidate i ranks no later than the cut (e_cut,
 * id_cut) in the order. */
static inline bool sampler_at_or_before(float e, int32_t i, float e_cut, int32_t id_cut)
{
    return e > e_cut || (e == e_cut && i <= id_cut);
}

void eng__sampler_coarse_scalar(const float *logits, int32_t n, float max, float scale,
                                float min_p, uint16_t *c, uint64_t *kept, uint64_t *total)
{
    float w[ENG_SAMPLER_BLOCK];
    uint64_t all = 0;
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t len = n - b0 > ENG_SAMPLER_BLOCK ? ENG_SAMPLER_BLOCK : n - b0;
        eng__sampler_weights_scalar(logits + b0, len, max, scale, min_p, w,
                                    kept + b0 / ENG_SAMPLER_BLOCK);
        for (int32_t i = 0; i < len; i++) {
            uint64_t m = sampler_mass(w[i]);
            c[b0 + i] = (uint16_t)(m >> ENG_SAMPLER_COARSE_SHIFT);
            all += m;
        }
    }
    *total = all;
}

uint64_t eng__sampler_kept_mass_scalar(const float *e, int32_t from, int32_t to, float e_cut,
                                       int32_t id_cut)
{
    uint64_t sum = 0;
    for (int32_t i = from; i < to; i++)
        sum += sampler_mass(e[i]) & (0 - (uint64_t)sampler_at_or_before(e[i], i, e_cut, id_cut));
    return sum;
}

int32_t eng__sampler_range_scalar(const float *e, int32_t from, int32_t to, uint32_t lo,
                                  uint32_t hi, uint64_t *above, int32_t *out)
{
    int32_t m = 0;
    for (int32_t b0 = from; b0 < to; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = to - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : to;
        uint64_t a = 0;
        for (int32_t i = b0; i < b1; i++) {
            uint32_t key = sampler_bits(e[i]) >> 20;
            a += sampler_mass(e[i]) & (0 - (uint64_t)(key > hi));
            /* without a branch: members are scattered, a branch mispredicts */
            out[m] = i;
            m += key >= lo && key <= hi;
        }
        above[(b0 - from) / ENG_SAMPLER_BLOCK] = a;
    }
    return m;
}

/* ---- passes over the candidates, split between lent threads ------------ */

/* Fewer candidates stay on one thread: the hand-off would cost more than
 * half a pass. */
#define SAMPLER_PARALLEL_MIN 16384
/* top-p's gather takes the top-level buckets this close to the estimate's */
#define SAMPLER_SPREAD 1
/* ... and every bucket above when the estimate puts at most this many
 * candidates there */
#define SAMPLER_FEW_ABOVE 1024
/* top-p's estimate weighs at most this many heavy candidates exactly */
#define SAMPLER_HEAVY_MAX 2048

/* One pass over the candidates in n_chunks contiguous chunks (1, 2 or 4,
 * each a whole number of blocks but the last: chunk c builds its part of
 * top-p's estimate in lane c of mass_part), what each chunk found, and the
 * pass's inputs. The results do not depend on the
 * chunking: maxima and integer sums combine exactly, block sums are per
 * block, and gathers are concatenated in chunk order. */
typedef struct sampler_pass {
    eng_sampler *s;
    int32_t n, n_chunks;
    float *logits;                 /* sanitize: the whole vocabulary */
    bool lanes;                    /* sanitize: the lane maxima too */
    int32_t stride;                /* the estimate's: eng__sampler_stride(n) */
    const float *values;           /* weigh: the candidates' logits */
    float max, scale, min_p;       /* weigh: min_p >= 0 */
    bool store;                    /* weigh: store the weights */
    uint32_t lo, hi;               /* gather: the range of top-level buckets */
    int32_t top_k;                 /* top_k: the k of each chunk's selection */
    float chunk_max[SAMPLER_LANES];
    int32_t found[SAMPLER_LANES];
    uint64_t chunk_total[SAMPLER_LANES]; /* coarse: the chunk's mass; rank: the
                                             mass before the proposal */
    int32_t prop;                  /* rank: top-p's proposal, its weight */
    float prop_e;
    bool weigh_all;                /* rank: weigh every block not yet weighed */
    uint64_t chunk_gain[SAMPLER_LANES]; /* rank: what the chunk's blocks add to w_low */
} sampler_pass;

static void sampler_chunk(const sampler_pass *ps, int32_t c, int32_t *begin, int32_t *end)
{
    /* chunks of whole blocks (whole vectors, whole lines) */
    int64_t per = ((int64_t)ps->n + ps->n_chunks - 1) / ps->n_chunks;
    per = (per + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK * ENG_SAMPLER_BLOCK;
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
    ps->chunk_max[c] =
        ps->lanes ? ps->s->kern->sanitize_lanes(
                        ps->logits + b, e - b,
                        ps->s->lane_max + b / ENG_SAMPLER_BLOCK * ENG_SAMPLER_LANES)
                  : ps->s->kern->sanitize_max(ps->logits + b, e - b);
}

static inline uint32_t sampler_key(float e)
{
    return sampler_bits(e) >> 20; /* the top 12 bits: 0..1016 for e in [0, 1] */
}

/* The estimate's bucket of weight e: its top-level bucket, those without
 * mass (below SAMPLER_KEY_MASS) all in the one just below. */
static inline uint32_t sampler_estimate_key(float e)
{
    uint32_t key = sampler_key(e);
    return key >= SAMPLER_KEY_MASS ? key : SAMPLER_KEY_MASS - 1;
}

/* A chunk's masses summed per block (of those with e >= min_p), into
 * kept; its weights stored when ps->store. */
static void sampler_weigh_task(void *arg, int32_t c)
{
    sampler_pass *ps = arg;
    int32_t b, e;
    sampler_chunk(ps, c, &b, &e);
    ps->s->kern->weights(ps->values + b, e - b, ps->max, ps->scale, ps->min_p,
                         ps->store ? ps->s->weight + b : NULL,
                         ps->s->kept + b / ENG_SAMPLER_BLOCK);
}

/* The k-th largest of v[0..n) (1 <= k <= n, no NaN), by quickselect;
 * reorders v. */
static float sampler_kth_largest(float *v, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n - 1;
    const int32_t want = k - 1; /* its index in descending order */
    while (lo < hi) {
        float pivot = v[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot)
                i++;
            while (v[j] < pivot)
                j--;
            if (i <= j) {
                float tmp = v[i];
                v[i++] = v[j];
                v[j--] = tmp;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            return v[want];
    }
    return v[want];
}

/* top-k's selection among the candidates [from, to) of logits (from a
 * whole number of blocks), into cand[0..k) as a heap, from their lane
 * maxima (sanitize's), when k is at most half their blocks (or else a
 * quarter of their lanes): with t the k-th largest of the blocks' (or the lanes')
 * maxima, finite, k blocks hold a logit of t at least, so the k-th largest
 * logit is t or above, and each of the k best (and every logit tied with
 * the k-th) is a logit of t or above in a lane whose maximum is t or above.
 * Those, gathered in id order (the room of weights, group_a, group_b and
 * values from `from` on), go through the heap selection: the same set as
 * the range's. Returns false, having done nothing, where it does not
 * apply. */
static bool sampler_top_k_lanes(eng_sampler *s, const float *logits, int32_t from, int32_t to,
                                int32_t k, eng_candidate *cand)
{
    const int32_t n = to - from, b_first = from / ENG_SAMPLER_BLOCK;
    const int32_t n_blocks = (n + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK;
    const int32_t n_lanes = n_blocks * ENG_SAMPLER_LANES;
    const float *lane_max = s->lane_max + (size_t)b_first * ENG_SAMPLER_LANES;
    if (k > n_lanes / 4 || n < n_lanes) /* group_a and values hold n lanes */
        return false;
    float t;
    if (k <= n_blocks / 2) {
        float *block_max = s->block_emax + b_first; /* the envelope's room, free until it */
        for (int32_t b = 0; b < n_blocks; b++)
            block_max[b] =
                s->kern->max(lane_max + (size_t)b * ENG_SAMPLER_LANES, ENG_SAMPLER_LANES);
        t = sampler_kth_largest(block_max, n_blocks, k);
    } else { /* few blocks: the k-th largest lane maximum, the same bound */
        memcpy(s->values + from, lane_max, sizeof *s->values * (size_t)n_lanes);
        t = sampler_kth_largest(s->values + from, n_lanes, k);
    }
    if (!(t > -INFINITY))
        return false;
    int32_t *lane = s->group_a + from, *ids = s->group_b + from;
    float *values = s->weight + from;
    const float below = nextafterf(t, -INFINITY);
    int32_t m = s->kern->above(lane_max, n_lanes, below, lane, n_lanes);
    int32_t g = 0;
    for (int32_t j = 0; j < m;) {
        const int32_t b = lane[j] / ENG_SAMPLER_LANES;
        uint32_t mask = 0;
        for (; j < m && lane[j] / ENG_SAMPLER_LANES == b; j++)
            mask |= 1u << (lane[j] % ENG_SAMPLER_LANES);
        const int32_t b0 = from + b * ENG_SAMPLER_BLOCK;
        for (int32_t row = b0; row < to && row < b0 + ENG_SAMPLER_BLOCK; row += ENG_SAMPLER_LANES)
            for (uint32_t rest = mask; rest; rest &= rest - 1) {
                int32_t i = row + __builtin_ctz(rest);
                if (i < to && logits[i] > below) {
                    values[g] = logits[i];
                    ids[g++] = i;
                }
            }
    }
    sampler_select_top_k(s->kern, cand, values, 0, g, k);
    for (int32_t i = 0; i < k; i++)
        cand[i].id = ids[cand[i].id];
    return true;
}

/* A chunk's top-k (ps->top_k of its logits, with their ids) as a heap at
 * cand + its start. */
static void sampler_top_k_task(void *arg, int32_t c)
{
    sampler_pass *ps = arg;
    int32_t b, e;
    sampler_chunk(ps, c, &b, &e);
    if (!sampler_top_k_lanes(ps->s, ps->logits, b, e, ps->top_k, ps->s->cand + b))
        sampler_select_top_k(ps->s->kern, ps->s->cand + b, ps->logits + b, b, e - b, ps->top_k);
}

/* top-k's selection into cand[0..k), a heap: each chunk's k best (on its
 * thread, whose core's cache holds its logits), then the k best of theirs
 * (the same set: each of the k best overall is among its chunk's), where
 * every chunk has k logits at least; else on one thread. */
static void sampler_top_k(eng_sampler *s, sampler_pass *ps, int32_t k)
{
    int32_t b, e;
    sampler_chunk(ps, ps->n_chunks - 1, &b, &e);
    if (ps->n_chunks == 1 || e - b < k) {
        if (!sampler_top_k_lanes(s, ps->logits, 0, ps->n, k, s->cand))
            sampler_select_top_k(s->kern, s->cand, ps->logits, 0, ps->n, k);
        return;
    }
    ps->top_k = k;
    sampler_run(ps, sampler_top_k_task);
    for (int32_t c = 1; c < ps->n_chunks; c++) {
        sampler_chunk(ps, c, &b, &e);
        memmove(s->cand + (size_t)c * (size_t)k, s->cand + b, sizeof *s->cand * (size_t)k);
    }
    for (int32_t i = k; i < ps->n_chunks * k; i++)
        if (sampler_before(&s->cand[i], &s->cand[0])) {
            s->cand[0] = s->cand[i];
            sampler_heap_down(s->cand, (size_t)k, 0);
        }
}

/* A chunk's coarse masses into coarse, its masses per block (min-p's) into
 * kept, all of them into chunk_total. */
static void sampler_coarse_task(void *arg, int32_t c)
{
    sampler_pass *ps = arg;
    eng_sampler *s = ps->s;
    int32_t b, e;
    sampler_chunk(ps, c, &b, &e);
    s->kern->coarse(ps->values + b, e - b, ps->max, ps->scale, ps->min_p, s->coarse + b,
                    s->kept + b / ENG_SAMPLER_BLOCK, &ps->chunk_total[c]);
}

/* The weights stored, every candidate's, for the exact checks and the
 * cut's search (kept stays min-p's, as the coarse pass left it). */
static void sampler_store_weights(sampler_pass *ps)
{
    ps->store = true;
    sampler_run(ps, sampler_weigh_task);
}

/* A chunk's members of the top-level buckets [lo, hi], at group_a + its
 * start, and the masses above hi per block, into kept. */
static void sampler_gather_task(void *arg, int32_t c)
{
    sampler_pass *ps = arg;
    eng_sampler *s = ps->s;
    int32_t b, e;
    sampler_chunk(ps, c, &b, &e);
    ps->found[c] = s->kern->range(s->weight, b, e, ps->lo, ps->hi,
                                  s->kept + b / ENG_SAMPLER_BLOCK, s->group_a + b);
}

/* The members each chunk left at group_a + its start (ps->found[c] of
 * them), moved together in chunk order; returns how many. */
static int32_t sampler_concat(eng_sampler *s, const sampler_pass *ps)
{
    int32_t m = ps->found[0];
    for (int32_t c = 1; c < ps->n_chunks; c++) { /* the chunks' members, in order */
        int32_t begin, end;
        sampler_chunk(ps, c, &begin, &end);
        memmove(s->group_a + m, s->group_a + begin, sizeof *s->group_a * (size_t)ps->found[c]);
        m += ps->found[c];
    }
    return m;
}

/* Gathers the members of the top-level buckets [lo, hi] into group_a (in
 * index order; returns how many), leaving the masses above hi per block in
 * kept. */
static int32_t sampler_gather(eng_sampler *s, sampler_pass *ps, uint32_t lo, uint32_t hi)
{
    ps->lo = lo;
    ps->hi = hi;
    sampler_run(ps, sampler_gather_task);
    return sampler_concat(s, ps);
}

/* top-p's estimate of the histogram of the masses, before any weight is
 * computed, into mass_top and count_top (the candidates per bucket): every
 * ps->stride-th candidate weighed (into sample_w), its mass and its count
 * stride times (summed in mass_part's lanes, sample j in lane j %
 * SAMPLER_LANES: neighbours in one bucket, the common case, would otherwise
 * wait on each other's read-modify-write). A sample sees by luck
 * the few tokens that may hold most of a peaked distribution's mass, and
 * the total it estimates (which places the cut) with them: unless the
 * buckets where the sample puts the SAMPLER_HEAVY_MAX / 8 heaviest
 * candidates hold under 1/64 of its mass (a flat distribution), the
 * candidates at or above their bottom are found by one scan of the logits
 * and weighed exactly instead of sampled (unless they turn out to be more
 * than SAMPLER_HEAVY_MAX: many, which a sample sees well). */
static void sampler_estimate(eng_sampler *s, const sampler_pass *ps)
{
    float x[ENG_SAMPLER_BLOCK], w[ENG_SAMPLER_BLOCK];
    uint64_t unused;
    const int32_t stride = ps->stride, n_samples = (ps->n + stride - 1) / stride;
    const float *sw = s->sample_w;
    for (int32_t j0 = 0; j0 < n_samples; j0 += ENG_SAMPLER_BLOCK) {
        int32_t k = n_samples - j0 < ENG_SAMPLER_BLOCK ? n_samples - j0 : ENG_SAMPLER_BLOCK;
        for (int32_t j = 0; j < k; j++)
            x[j] = ps->values[(int64_t)(j0 + j) * stride];
        s->kern->weights(x, k, ps->max, ps->scale, 0.0f, s->sample_w + j0, &unused);
    }
    /* a lane's entry: the samples' count above bit 48, their mass below
     * (at most 2^25 times n_samples); the buckets below SAMPLER_KEY_MASS
     * hold no mass, and their samples are counted in the one below it */
    const uint64_t one = (uint64_t)1 << 48, below48 = one - 1;
    const uint32_t low = SAMPLER_KEY_MASS - 1;
    for (int32_t l = 0; l < SAMPLER_LANES; l++)
        memset(s->mass_part[l] + low, 0, sizeof(uint64_t) * (SAMPLER_BUCKETS - low));
    for (int32_t j = 0; j < n_samples; j++)
        s->mass_part[j % SAMPLER_LANES][sampler_estimate_key(sw[j])] += one + sampler_mass(sw[j]);
    memset(s->mass_top, 0, sizeof(uint64_t) * low);
    memset(s->count_top, 0, sizeof(uint32_t) * low);
    uint64_t all = 0;
    for (int32_t k = (int32_t)low; k < SAMPLER_BUCKETS; k++) {
        uint64_t m = 0, n = 0;
        for (int32_t l = 0; l < SAMPLER_LANES; l++) {
            m += s->mass_part[l][k] & below48;
            n += s->mass_part[l][k] >> 48;
        }
        s->mass_top[k] = m * (uint64_t)stride;
        s->count_top[k] = (uint32_t)n * (uint32_t)stride;
        all += s->mass_top[k];
    }
    /* the heavy ones, weighed exactly when they matter and are few */
    int32_t b = SAMPLER_BUCKETS;
    uint64_t top_mass = 0;
    for (uint32_t seen = 0; b > 0 && seen < SAMPLER_HEAVY_MAX / 8;) {
        seen += s->count_top[--b];
        top_mass += s->mass_top[b];
    }
    if (b == 0 || top_mass < all / 64)
        return;
    uint32_t bits = (uint32_t)b << 20;
    float e_b;
    memcpy(&e_b, &bits, sizeof e_b);
    const float heavy = nextafterf(ps->max + log2f(e_b) / ps->scale, -INFINITY);
    int32_t n_heavy = s->kern->above(ps->values, ps->n, heavy, s->group_b, SAMPLER_HEAVY_MAX);
    if (n_heavy > SAMPLER_HEAVY_MAX)
        return;
    for (int32_t j = 0; j < n_samples; j++) /* out of the sample... */
        if (ps->values[(int64_t)j * stride] > heavy) {
            s->mass_top[sampler_estimate_key(sw[j])] -= sampler_mass(sw[j]) * (uint64_t)stride;
            s->count_top[sampler_estimate_key(sw[j])] -= (uint32_t)stride;
        }
    for (int32_t j0 = 0; j0 < n_heavy; j0 += ENG_SAMPLER_BLOCK) { /* ... and weighed */
        int32_t k = n_heavy - j0 < ENG_SAMPLER_BLOCK ? n_heavy - j0 : ENG_SAMPLER_BLOCK;
        for (int32_t j = 0; j < k; j++)
            x[j] = ps->values[s->group_b[j0 + j]];
        s->kern->weights(x, k, ps->max, ps->scale, 0.0f, w, &unused);
        for (int32_t j = 0; j < k; j++) {
            s->mass_top[sampler_estimate_key(w[j])] += sampler_mass(w[j]);
            s->count_top[sampler_estimate_key(w[j])]++;
        }
    }
}

/* The top-level buckets [lo, hi] to gather around the cut the estimate in
 * mass_top and count_top points at: walking from the bottom
 * (the many light candidates are what a sample estimates well), the bucket
 * where the estimated mass below reaches the share the cut leaves out (1 -
 * top_p of the estimate's total) is b, and [lo, hi] = b -+ SAMPLER_SPREAD.
 * Where few candidates lie above that (a peaked distribution, whose heavy
 * tokens a sample sees badly or not at all), or b is the highest bucket
 * the sample saw with the mass still short there, hi is the top: the
 * window then holds every candidate above the cut. */
static void sampler_estimate_window(eng_sampler *s, float top_p, uint32_t *lo, uint32_t *hi)
{
    const int32_t low = SAMPLER_KEY_MASS - 1; /* no mass below: sampler_estimate */
    uint64_t est_total = 0;
    int32_t top = low;
    for (int32_t k = low; k < SAMPLER_BUCKETS; k++) {
        est_total += s->mass_top[k];
        top = s->mass_top[k] ? k : top;
    }
    uint64_t below = est_total - (uint64_t)((double)top_p * (double)est_total), acc = 0;
    int32_t b = low;
    while (b < top && acc + s->mass_top[b] < below)
        acc += s->mass_top[b++];
    uint32_t n_above = 0;
    for (int32_t k = b + SAMPLER_SPREAD + 1; k < SAMPLER_BUCKETS; k++)
        n_above += s->count_top[k];
    *lo = b > SAMPLER_SPREAD ? (uint32_t)(b - SAMPLER_SPREAD) : 0;
    *hi = b < top && n_above > SAMPLER_FEW_ABOVE ? (uint32_t)(b + SAMPLER_SPREAD)
                                                 : SAMPLER_BUCKETS - 1;
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

/* Groups at least this large are bucketed by their top-level buckets in
 * SAMPLER_LANES partial histograms (sampler_bucket_masses). */
#define SAMPLER_LANES_MIN 256

/* The masses of e[group[j]], j < m (group NULL: e[j]), by bits shift to
 * shift + 9 of their weights (shift 20: the top-level bucket, the top 12
 * bits, at most 1016 for e <= 1), into mass. At shift 20 the buckets lie in
 * [lo, hi], and a large group goes through SAMPLER_LANES partial
 * histograms over that range (member j into lane j % SAMPLER_LANES of
 * part), since neighbouring members often share a top-level bucket (a
 * window has a few) and would otherwise wait on each other's
 * read-modify-write; the finer levels spread over all 1024 buckets. The
 * sums are integers, the same in any order. */
static void sampler_bucket_masses(uint64_t *mass, uint64_t (*part)[SAMPLER_BUCKETS],
                                  const float *e, const int32_t *group, int32_t m, int shift,
                                  uint32_t lo, uint32_t hi)
{
    memset(mass, 0, sizeof(uint64_t) * SAMPLER_BUCKETS);
    if (m < SAMPLER_LANES_MIN || shift != 20) {
        for (int32_t j = 0; j < m; j++) {
            float v = e[group ? group[j] : j];
            mass[(sampler_bits(v) >> shift) & (SAMPLER_BUCKETS - 1)] += sampler_mass(v);
        }
        return;
    }
    for (int32_t l = 0; l < SAMPLER_LANES; l++)
        memset(part[l] + lo, 0, sizeof(uint64_t) * (hi - lo + 1));
    int32_t j = 0;
    for (; j + SAMPLER_LANES <= m; j += SAMPLER_LANES)
        for (int32_t l = 0; l < SAMPLER_LANES; l++) {
            float v = e[group ? group[j + l] : j + l];
            part[l][sampler_key(v)] += sampler_mass(v);
        }
    for (; j < m; j++) {
        float v = e[group ? group[j] : j];
        part[0][sampler_key(v)] += sampler_mass(v);
    }
    for (uint32_t b = lo; b <= hi; b++) {
        uint64_t sum = 0;
        for (int32_t l = 0; l < SAMPLER_LANES; l++)
            sum += part[l][b];
        mass[b] = sum;
    }
}

/* The first candidate of the order whose cumulative mass exceeds target,
 * among group[0..m) (indices into the weights e, in index order; NULL:
 * e[0..m) itself), all of whose members rank after the mass *acc already
 * counted and share the bits of their weights above bit shift + 10 (shift
 * 20: any weights). Level by
 * level, the members are bucketed by the next 10 (at shift 20, 12) bits
 * of their weights, and only the bucket where the cumulative mass crosses
 * target is kept (into group_b and group_c in turn: group is left as it
 * is); what is left after the last level has equal weights, so it is in
 * the order already, and a group of at most SAMPLER_SMALL is sorted
 * directly. At shift 20 the members' top-level buckets lie in [lo, hi].
 * Returns the index, with *through = the cumulative mass up to and
 * including it, or -1 when the group's mass does not reach target. */
static int32_t sampler_refine(eng_sampler *s, const float *e, const int32_t *group, int32_t m,
                              int shift, uint32_t lo, uint32_t hi, uint64_t target,
                              uint64_t *acc, uint64_t *through)
{
    int32_t *out = s->group_b;
    /* group NULL: every index of e, in order (read in order) */
    for (; shift >= 0 && m > SAMPLER_SMALL; shift -= 10) {
        sampler_bucket_masses(s->mass_sub, s->mass_part, e, group, m, shift, lo, hi);
        int32_t b = sampler_walk(s->mass_sub, target, acc);
        if (b < 0)
            return -1;
        int32_t k = 0;
        for (int32_t j = 0; j < m; j++) {
            int32_t g = group ? group[j] : j;
            out[k] = g;
            k += ((sampler_bits(e[g]) >> shift) & (SAMPLER_BUCKETS - 1)) == (uint32_t)b;
        }
        group = out;
        out = out == s->group_b ? s->group_c : s->group_b;
        m = k;
    }
    if (!group) {
        for (int32_t j = 0; j < m; j++)
            out[j] = j;
        group = out;
        out = s->group_c;
    }
    int32_t *sorted = (int32_t *)group;
    if (m <= SAMPLER_SMALL) {
        if (group != out) { /* group may be the caller's: sort a copy */
            memcpy(out, group, sizeof *out * (size_t)m);
            sorted = out;
        }
        sampler_sort_small(e, sorted, m);
    }
    for (int32_t j = 0; j < m; j++) {
        *acc += sampler_mass(e[sorted[j]]);
        if (*acc > target) {
            *through = *acc;
            return sorted[j];
        }
    }
    return -1;
}

/* top-p's cut: the first candidate of the order whose cumulative mass
 * exceeds target (below the total mass s->total), with *through = the mass
 * up to and including it. The weights are stored, the gather has put
 * the m members of the top-level buckets [ps->lo, ps->hi] into group_a and
 * left the masses above ps->hi per block in kept; mass_top holds the
 * estimated histogram. When the cut lies among the members it is refined
 * there; when it lies above them, among the candidates above (few, where
 * the sample missed the heavy tokens of a peaked distribution); when below,
 * among the buckets below where the estimate points with the exact total
 * (a sample's total is what heavy tokens make uncertain); otherwise the
 * exact histogram decides. group_a and kept are left with the members of
 * the buckets searched last and the masses above them (sampler_pick_members
 * reads them). */
static int32_t sampler_cut(eng_sampler *s, sampler_pass *ps, int32_t *n_members,
                           uint64_t target, uint64_t *through)
{
    int32_t m = *n_members;
    const int32_t n_blocks = (ps->n + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK;
    uint64_t acc = 0;
    for (int32_t k = 0; k < n_blocks; k++)
        acc += s->kept[k];
    int32_t at = -1, path = 0;
    if (acc > target && ps->hi < SAMPLER_BUCKETS - 1) { /* above the members */
        m = sampler_gather(s, ps, ps->hi + 1, SAMPLER_BUCKETS - 1);
        acc = 0;
        path = 1;
    }
    if (acc <= target) {
        at = sampler_refine(s, s->weight, s->group_a, m, 20, ps->lo, ps->hi, target, &acc,
                            through);
        if (at < 0 && path == 0 && ps->lo > 0) { /* below the members */
            const uint64_t below = s->total - target;
            uint64_t est = 0;
            uint32_t b = 0;
            while (b + 1 < ps->lo && est + s->mass_top[b] < below)
                est += s->mass_top[b++];
            uint32_t lo = b > SAMPLER_SPREAD ? b - SAMPLER_SPREAD : 0;
            m = sampler_gather(s, ps, lo, ps->lo - 1);
            acc = 0;
            for (int32_t k = 0; k < n_blocks; k++)
                acc += s->kept[k];
            path = 2;
            at = acc <= target
                     ? sampler_refine(s, s->weight, s->group_a, m, 20, ps->lo, ps->hi, target,
                                      &acc, through)
                     : -1;
        }
    }
    if (at >= 0) {
        s->cut_paths[path]++;
        *n_members = m;
        return at;
    }
    s->cut_paths[3]++;
    /* the estimate missed: the exact histogram, then its bucket */
    sampler_bucket_masses(s->mass_top, s->mass_part, s->weight, NULL, ps->n, 20, 0,
                          SAMPLER_BUCKETS - 1);
    acc = 0;
    int32_t b = sampler_walk(s->mass_top, target, &acc);
    if (b >= 0) {
        m = sampler_gather(s, ps, (uint32_t)b, (uint32_t)b);
        at = sampler_refine(s, s->weight, s->group_a, m, 10, 0, SAMPLER_BUCKETS - 1, target, &acc,
                            through);
    }
    *n_members = m;
    if (at < 0) { /* unreachable while target < total: the best stays valid */
        *through = s->total;
        return 0;
    }
    return at;
}

/* The pick after a cut (e_cut, id_cut) that sampler_cut found among the
 * members in group_a[0..m): each block's kept mass is the mass above the
 * members' buckets (kept) and that of its members at or before the cut;
 * the walk then reads the stored weights of the block it lands in. */
static int32_t sampler_pick_members(eng_sampler *s, const sampler_pass *ps, int32_t m,
                                    uint64_t target, float e_cut, int32_t id_cut)
{
    const int32_t n = ps->n;
    const int32_t *idx = s->group_a;
    const float *w = s->weight;
    uint64_t acc = 0;
    int32_t j = 0;
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n;
        uint64_t k = s->kept[b0 / ENG_SAMPLER_BLOCK];
        for (; j < m && idx[j] < b1; j++)
            k += sampler_mass(w[idx[j]]) &
                 (0 - (uint64_t)sampler_at_or_before(w[idx[j]], idx[j], e_cut, id_cut));
        if (acc + k <= target) {
            acc += k;
            continue;
        }
        for (int32_t i = b0; i < b1; i++) {
            if (sampler_at_or_before(w[i], i, e_cut, id_cut)) {
                acc += sampler_mass(w[i]);
                if (acc > target)
                    return i;
            }
        }
        break; /* unreachable: the block's kept mass takes acc past target */
    }
    return 0;
}

/* The draw's pick: the index of the first kept candidate, in index (= id)
 * order, whose cumulative mass exceeds target (below the kept mass). Kept:
 * with a cut, the candidates at or before it in the order (their weights
 * are stored; each block's kept mass is summed as the walk reaches it);
 * without,
 * those with e >= ps->min_p, whose sums per block the weigh pass left in
 * kept (their weights are recomputed for the one block the pick lies in). */
static int32_t sampler_pick(eng_sampler *s, const sampler_pass *ps, uint64_t target, bool cut,
                            float e_cut, int32_t id_cut)
{
    const int32_t n = ps->n;
    uint64_t acc = 0;
    for (int32_t b0 = 0; b0 < n; b0 += ENG_SAMPLER_BLOCK) {
        int32_t b1 = n - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : n;
        uint64_t m = cut ? s->kern->kept_mass(s->weight, b0, b1, e_cut, id_cut)
                         : s->kept[b0 / ENG_SAMPLER_BLOCK];
        if (acc + m <= target) {
            acc += m;
            continue;
        }
        if (!cut) {
            uint64_t block_kept;
            s->kern->weights(ps->values + b0, b1 - b0, ps->max, ps->scale, ps->min_p,
                             s->weight + b0, &block_kept);
        }
        for (int32_t i = b0; i < b1; i++) {
            float e = s->weight[i];
            if (cut ? sampler_at_or_before(e, i, e_cut, id_cut) : e >= ps->min_p) {
                acc += sampler_mass(e);
                if (acc > target)
                    return i;
            }
        }
        break; /* unreachable: the block's kept mass takes acc past target */
    }
    return 0;
}

/* ---- the envelope's trials ----------------------------------------------- */

/* Trial with the uniform integer u: target = floor(u * E / 2^53) in the
 * envelope E, the block and lane where the envelope's cumulative mass
 * exceeds it (blocks ascending, then lanes), r = what is left of target
 * there; the lane's member r / v (v its envelope mass) is proposed and kept
 * when r mod v is below its mass and its weight is at least min-p's. Every
 * candidate is kept with probability mass / E. Returns its index, or -1. */
static int32_t sampler_trial(eng_sampler *s, const sampler_pass *ps, uint64_t u)
{
    const int32_t n = ps->n, n_blocks = (n + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK;
    const uint64_t target = sampler_scale_u53(u, s->env_cum[n_blocks]);
    int32_t lo = 0, hi = n_blocks; /* env_cum[lo] <= target < env_cum[hi] */
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        if (s->env_cum[mid] <= target)
            lo = mid;
        else
            hi = mid;
    }
    uint64_t r = target - s->env_cum[lo];
    const uint32_t *env = s->lane_env + (size_t)lo * ENG_SAMPLER_LANES;
    int32_t l = 0;
    for (; l < ENG_SAMPLER_LANES - 1; l++) {
        uint64_t lane = (uint64_t)env[l] * (uint64_t)sampler_lane_members(n, lo, l);
        if (r < lane)
            break;
        r -= lane;
    }
    const int32_t i = lo * ENG_SAMPLER_BLOCK + l + ENG_SAMPLER_LANES * (int32_t)(r / env[l]);
    const float e = eng__sampler_exp2((ps->values[i] - ps->max) * ps->scale);
    return r % env[l] < sampler_mass(e) && e >= ps->min_p ? i : -1;
}

/* top-p's prefix for a total mass W: the candidates with at most this
 * mass ranked before them (trunc(top_p * W) - 1; at least the first) */
static uint64_t sampler_top_p_target(float top_p, uint64_t total)
{
    uint64_t need = top_p > 0.0f ? (uint64_t)((double)top_p * (double)total) : 0;
    return need > 0 ? need - 1 : 0;
}

/* A chunk's part of the check of top-p's proposal (ps->prop, of weight
 * ps->prop_e): over its blocks that can hold candidates ranked before it
 * (their largest weight within the exponential's fall of its own), the
 * mass of those (before it in the block: e' >= e, i.e. above the float
 * below e; from it on: e' > e) into chunk_total; or, with ps->weigh_all,
 * the masses of its blocks not yet weighed. Each block weighed for the first
 * time marks block_known, and what its mass adds to its lower bound (its
 * lanes' largest) goes into chunk_gain. */
static void sampler_rank_task(void *arg, int32_t c)
{
    sampler_pass *ps = arg;
    eng_sampler *s = ps->s;
    int32_t from, to;
    sampler_chunk(ps, c, &from, &to);
    const int32_t i = ps->prop;
    const float e = ps->prop_e, near = e * ENG_SAMPLER_NEAR;
    uint64_t before = 0, gain = 0;
    for (int32_t b0 = from; b0 < to; b0 += ENG_SAMPLER_BLOCK) {
        const int32_t b = b0 / ENG_SAMPLER_BLOCK;
        const int32_t b1 = to - b0 > ENG_SAMPLER_BLOCK ? b0 + ENG_SAMPLER_BLOCK : to;
        uint64_t mass = 0;
        if (ps->weigh_all) {
            if (s->block_known[b])
                continue;
            s->kern->weights(ps->values + b0, b1 - b0, ps->max, ps->scale, 0.0f, NULL, &mass);
        } else {
            if (s->block_emax[b] < near)
                continue;
            const int32_t mid = i < b0 ? b0 : i > b1 ? b1 : i;
            uint64_t t = 0;
            if (mid > b0) {
                before += s->kern->rank(ps->values + b0, mid - b0, ps->max, ps->scale,
                                        nextafterf(e, 0.0f), &t);
                mass += t;
            }
            if (mid < b1) {
                before += s->kern->rank(ps->values + mid, b1 - mid, ps->max, ps->scale, e, &t);
                mass += t;
            }
        }
        if (!s->block_known[b]) {
            s->block_known[b] = 1;
            gain += mass - s->block_low[b];
        }
    }
    ps->chunk_total[c] = before;
    ps->chunk_gain[c] = gain;
}

/* The check's pass on every chunk: the mass ranked before the proposal
 * (or nothing, weighing all), w_low raised by what the blocks weighed add. */
static uint64_t sampler_rank(eng_sampler *s, sampler_pass *ps, bool weigh_all)
{
    ps->weigh_all = weigh_all;
    sampler_run(ps, sampler_rank_task);
    uint64_t before = 0;
    for (int32_t c = 0; c < ps->n_chunks; c++) {
        before += ps->chunk_total[c];
        s->w_low += ps->chunk_gain[c];
    }
    return before;
}

/* Whether candidate i lies in top-p's prefix: the mass ranked before it,
 * from the blocks that can hold such candidates, against the target of a
 * lower bound of the total (their masses, and the others' lanes' largest);
 * where that cannot tell, against the exact total (every block weighed).
 * A draw with threads weighs each chunk's blocks on its thread. */
static bool sampler_in_top_p(eng_sampler *s, sampler_pass *ps, int32_t i, float top_p)
{
    ps->prop = i;
    ps->prop_e = eng__sampler_exp2((ps->values[i] - ps->max) * ps->scale);
    const uint64_t before = sampler_rank(s, ps, false);
    if (before <= sampler_top_p_target(top_p, s->w_low))
        return true;
    s->proposals[2]++;
    sampler_rank(s, ps, true);
    return before <= sampler_top_p_target(top_p, s->w_low);
}

int32_t eng_sampler_sample(eng_sampler *s, float *logits, const int32_t *history,
                           size_t n_history)
{
    const eng_sampler_params *p = &s->params;
    const eng__sampler_kernels *kern = sampler_kernels();
    s->kern = kern;
    const int32_t n = s->n_vocab;
    const uint64_t draw = s->draws++;
    const uint64_t u = sampler_uniform_bits(p->seed, draw, 0);

    int32_t chunks = 1;
    if (s->threads.for_each && s->threads.n_threads >= 2)
        chunks = s->threads.n_threads >= 4 ? 4 : 2;
    /* the lane maxima of the vocabulary: the envelope's, or top-k's */
    const bool lanes = p->temperature > 0.0f && !(p->min_p > 1.0f);
    sampler_pass ps = {.s = s, .n = n, .n_chunks = n >= SAMPLER_PARALLEL_MIN ? chunks : 1,
                       .logits = logits, .lanes = lanes,
                       .stride = eng__sampler_stride(n)};
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
        max = lanes ? kern->sanitize_lanes(logits, n, s->lane_max) : kern->max(logits, n);

    /* Greedy, or min-p keeping only the best: the first candidate at the
     * maximum (ties to the lowest id; all -inf: id 0). */
    if (!(p->temperature > 0.0f) || p->min_p > 1.0f) {
        int32_t i = kern->first_above(logits, 0, n, nextafterf(max, -INFINITY));
        return i < n ? i : 0;
    }

    /* top-k: the survivors, in id order, with their logits in values[] */
    int32_t n_cand = n;
    const float *values = logits;
    eng_candidate *cand = NULL;
    if (p->top_k > 0 && p->top_k < n) {
        n_cand = p->top_k;
        cand = s->cand;
        sampler_top_k(s, &ps, n_cand);
        qsort(cand, (size_t)n_cand, sizeof *cand, sampler_cmp_id);
        for (int32_t i = 0; i < n_cand; i++)
            s->values[i] = cand[i].value;
        values = s->values;
        max = kern->sanitize_lanes(s->values, n_cand, s->lane_max);
    }
    if (!(max > -INFINITY) || max == INFINITY) {
        /* Degenerate: nothing has finite mass (all -inf), or +inf
         * dominates. The best-ranked candidate is the answer. */
        int32_t i = kern->first_above(values, 0, n_cand, nextafterf(max, -INFINITY));
        i = i < n_cand ? i : 0;
        return cand ? cand[i].id : i;
    }

    float scale = ENG_SAMPLER_LOG2E / p->temperature;
    if (!(scale <= FLT_MAX))
        scale = FLT_MAX;
    const float min_p = p->min_p > 0.0f ? p->min_p : 0.0f; /* 0: every candidate */
    ps.n = n_cand;
    ps.n_chunks = n_cand >= SAMPLER_PARALLEL_MIN ? chunks : 1;
    ps.stride = eng__sampler_stride(n_cand);
    ps.values = values;
    ps.max = max;
    ps.scale = scale;
    ps.min_p = min_p;
    const int32_t n_blocks = (n_cand + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK;
    kern->envelope(s->lane_max, n_cand, max, scale, min_p * ENG_SAMPLER_NEAR, s->lane_env,
                   s->env_cum + 1, s->block_low, s->block_emax);
    s->env_cum[0] = 0;
    for (int32_t b = 0; b < n_blocks; b++)
        s->env_cum[b + 1] += s->env_cum[b];
    /* the number after the trials', for the walk when they run out */
    const uint64_t j_last = ENG_SAMPLER_TRIALS;
    if (!(p->top_p < 1.0f)) {
        for (int32_t j = 0; j < ENG_SAMPLER_TRIALS; j++) {
            int32_t pos = sampler_trial(s, &ps, j ? sampler_uniform_bits(p->seed, draw, j) : u);
            if (pos >= 0)
                return cand ? cand[pos].id : pos;
        }
        /* every trial refused: the walk */
        sampler_run(&ps, sampler_weigh_task);
        uint64_t kept = 0;
        for (int32_t b = 0; b < n_blocks; b++)
            kept += s->kept[b]; /* min-p's set (the best at least), or every mass */
        int32_t pos = sampler_pick(
            s, &ps, sampler_scale_u53(sampler_uniform_bits(p->seed, draw, j_last), kept), false,
            0.0f, 0);
        return cand ? cand[pos].id : pos;
    }

    /* top-p: proposals from the envelope's trials, each kept when it lies
     * in top-p's prefix; after s->attempts refusals, the cut searched for */
    memset(s->block_known, 0, (size_t)n_blocks);
    s->w_low = 0;
    for (int32_t b = 0; b < n_blocks; b++)
        s->w_low += s->block_low[b];
    for (int32_t j = 0, proposed = 0; j < ENG_SAMPLER_TRIALS && proposed < s->attempts; j++) {
        int32_t pos = sampler_trial(s, &ps, j ? sampler_uniform_bits(p->seed, draw, j) : u);
        if (pos < 0)
            continue;
        proposed++;
        if (sampler_in_top_p(s, &ps, pos, p->top_p)) {
            s->proposals[0]++;
            return cand ? cand[pos].id : pos;
        }
        s->proposals[1]++;
    }
    sampler_run(&ps, sampler_coarse_task);
    s->total = 0;
    for (int32_t c = 0; c < ps.n_chunks; c++)
        s->total += ps.chunk_total[c];
    const uint64_t target = sampler_top_p_target(p->top_p, s->total);
    if (target < ((uint64_t)1 << 25)) {
        /* top-p keeps only the first in the order (the best's mass, 2^25,
         * reaches the target): the lowest id of weight 1, whose coarse mass
         * is the largest there is */
        int32_t pos = 0;
        while (pos < n_cand - 1 && s->coarse[pos] != (1u << (25 - ENG_SAMPLER_COARSE_SHIFT)))
            pos++;
        return cand ? cand[pos].id : pos;
    }
    sampler_store_weights(&ps);
    const uint64_t u_last = sampler_uniform_bits(p->seed, draw, j_last);
    /* the exact search: the estimate, the buckets around its cut gathered,
     * the cut searched for from there */
    sampler_estimate(s, &ps);
    sampler_estimate_window(s, p->top_p, &ps.lo, &ps.hi);
    int32_t m = sampler_gather(s, &ps, ps.lo, ps.hi);
    uint64_t through = 0;
    int32_t at = sampler_cut(s, &ps, &m, target, &through);
    if (min_p > 0.0f) {
        uint64_t above = kern->kept_mass(s->weight, 0, n_cand, min_p, INT32_MAX);
        if (above <= through) { /* min-p's prefix is the shorter */
            int32_t pos =
                sampler_pick(s, &ps, sampler_scale_u53(u_last, above), true, min_p, INT32_MAX);
            return cand ? cand[pos].id : pos;
        }
    }
    int32_t pos = sampler_pick_members(s, &ps, m, sampler_scale_u53(u_last, through),
                                       s->weight[at], at);
    return cand ? cand[pos].id : pos;
}

void eng_log_softmax(const float *logits, float *logprobs, int32_t n)
{
    if (n <= 0)
        return;
    /* The sampler's kernels, on a copy (NaN becomes -inf): the maximum,
     * then the fine masses of exp(logit - max) summed per block, exact
     * integers (a token below ~1e-12 of the best adds nothing), so the
     * result is the same on every instruction set. */
    const eng__sampler_kernels *kern = sampler_kernels();
    memcpy(logprobs, logits, sizeof *logprobs * (size_t)n);
    const float max_logit = kern->sanitize_max(logprobs, n);
    if (max_logit == INFINITY) {
        /* +inf entries share all the mass. */
        int32_t n_inf = 0;
        for (int32_t i = 0; i < n; i++)
            n_inf += logprobs[i] == INFINITY;
        const float lp = (float)-log((double)n_inf);
        for (int32_t i = 0; i < n; i++)
            logprobs[i] = logprobs[i] == INFINITY ? lp : -INFINITY;
        return;
    }
    if (max_logit == -INFINITY) {
        /* No finite logit (all -inf or NaN): no information, uniform. */
        const float lp = (float)-log((double)n);
        for (int32_t i = 0; i < n; i++)
            logprobs[i] = lp;
        return;
    }
    enum { BLOCKS = 64 };
    uint64_t kept[BLOCKS], sum = 0;
    for (int32_t b = 0; b < n; b += BLOCKS * ENG_SAMPLER_BLOCK) {
        int32_t len = n - b < BLOCKS * ENG_SAMPLER_BLOCK ? n - b : BLOCKS * ENG_SAMPLER_BLOCK;
        kern->fine_sums(logprobs + b, len, max_logit, kept);
        for (int32_t k = 0; k < (len + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK; k++)
            sum += kept[k];
    }
    /* (l - max) - log(sum), not l - (max + log(sum)): with max = 1e30 the
     * latter would lose log(sum) to rounding. The best's mass is 2^40. */
    const double log_sum = log((double)sum) - 40.0 * M_LN2;
    for (int32_t i = 0; i < n; i++)
        logprobs[i] = (float)(((double)logprobs[i] - (double)max_logit) - log_sum);
}
