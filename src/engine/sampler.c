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
 *      selection, so small k never sorts the vocabulary), then division by
 *      the temperature, softmax over the survivors, top-p (the smallest
 *      prefix, in the order below, whose cumulative probability reaches
 *      top_p; at least one token), min-p (drop tokens whose probability is
 *      below min_p times the largest), renormalise, and pick with the draw's
 *      uniform number u by walking the cumulative distribution in order of
 *      probability descending, ties by id ascending: the first token whose
 *      cumulative mass exceeds u * total.
 *      top-p and min-p both keep a prefix of that order, computed with the
 *      probabilities of step 3's softmax, so the kept set is the shorter of
 *      the two prefixes whatever order they run in; the code applies min-p
 *      first because it is a linear-time filter that shrinks what is sorted.
 *   Every call consumes exactly one draw (the counter goes up by one), greedy
 *   included, so a resumed generation sets the counter to the number of
 *   tokens already sampled.
 *
 * The random stream is counter-based: the uniform number of draw k is a
 * pure function of (seed, k), built from the splitmix64 finaliser, so
 * there is no hidden state to save or restore beyond the counter.
 *
 * Memory: every buffer (candidates, penalty counts, the bias list) is
 * allocated once at create; sampling allocates nothing.
 */
#include "engine/sampler.h"

#include "common/alloc.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct eng_candidate {
    float value; /* logit, then probability */
    int32_t id;
} eng_candidate;

struct eng_sampler {
    eng_sampler_params params;
    int32_t n_vocab;
    uint64_t draws;
    eng_candidate *cand;  /* n_vocab: the working set of a call */
    uint32_t *counts;     /* n_vocab: penalty counts, all zero between calls */
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
    if (!params || n_vocab <= 0)
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
    if (!s->cand || !s->counts)
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

double eng_sampler_uniform(uint64_t seed, uint64_t k)
{
    /* The seed is mixed on its own first so that (seed, k) and (seed + 1,
     * k - 1) do not collide, then the counter is added on the Weyl sequence
     * splitmix64 itself uses, and the sum mixed twice. */
    uint64_t key = sampler_mix64(seed ^ 0x6a09e667f3bcc909ULL);
    uint64_t z = sampler_mix64(key + (k + 1) * 0x9e3779b97f4a7c15ULL);
    z = sampler_mix64(z ^ 0xbb67ae8584caa73bULL);
    return (double)(z >> 11) * (1.0 / 9007199254740992.0); /* 2^-53 */
}

/* "a ranks before b": larger value first, then smaller id. NaN never
 * reaches here (sanitised to -inf first). */
static bool sampler_before(const eng_candidate *a, const eng_candidate *b)
{
    if (a->value != b->value)
        return a->value > b->value;
    return a->id < b->id;
}

static int sampler_cmp(const void *pa, const void *pb)
{
    const eng_candidate *a = pa, *b = pb;
    if (sampler_before(a, b))
        return -1;
    if (sampler_before(b, a))
        return 1;
    return 0;
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

/* Puts the k best of logits[0..n) into cand[0..k), unordered. */
static void sampler_select_top_k(eng_candidate *cand, const float *logits, int32_t n, int32_t k)
{
    for (int32_t i = 0; i < k; i++) {
        cand[i].value = logits[i];
        cand[i].id = i;
    }
    for (size_t i = (size_t)k / 2; i-- > 0;)
        sampler_heap_down(cand, (size_t)k, i);
    for (int32_t i = k; i < n; i++) {
        eng_candidate c = {logits[i], i};
        if (sampler_before(&c, &cand[0])) {
            cand[0] = c;
            sampler_heap_down(cand, (size_t)k, 0);
        }
    }
}

int32_t eng_sampler_sample(eng_sampler *s, float *logits, const int32_t *history,
                           size_t n_history)
{
    const eng_sampler_params *p = &s->params;
    const int32_t n = s->n_vocab;
    const double u = eng_sampler_uniform(p->seed, s->draws);
    s->draws++;

    for (int32_t i = 0; i < n; i++)
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
    for (int32_t j = 0; j < p->n_bias; j++) {
        int32_t id = p->bias_ids[j];
        if (id >= 0 && id < n && logits[id] != -INFINITY)
            logits[id] += p->bias_values[j];
    }
    eng_sampler_apply_penalties(s, logits, history, n_history);

    if (!(p->temperature > 0.0f)) {
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (logits[i] > logits[best])
                best = i;
        return best;
    }

    /* top-k */
    int32_t n_cand = n;
    eng_candidate *cand = s->cand;
    if (p->top_k > 0 && p->top_k < n) {
        n_cand = p->top_k;
        sampler_select_top_k(cand, logits, n, n_cand);
    } else {
        for (int32_t i = 0; i < n; i++) {
            cand[i].value = logits[i];
            cand[i].id = i;
        }
    }

    /* temperature + softmax (max subtraction; the sum in double) */
    float max_logit = -INFINITY;
    int32_t best = 0;
    for (int32_t i = 0; i < n_cand; i++)
        if (sampler_before(&cand[i], &cand[best]))
            best = i;
    max_logit = cand[best].value;
    if (!(max_logit > -INFINITY) || max_logit == INFINITY) {
        /* Degenerate: nothing has finite mass (all -inf), or +inf dominates.
         * The best-ranked candidate is the only sensible answer. */
        return cand[best].id;
    }
    double sum = 0.0;
    const double inv_temp = 1.0 / (double)p->temperature;
    for (int32_t i = 0; i < n_cand; i++) {
        double e = exp(((double)cand[i].value - (double)max_logit) * inv_temp);
        cand[i].value = (float)e;
        sum += e;
    }
    /* Probabilities of the softmax, as floats in [0, 1]. */
    const double inv_sum = 1.0 / sum;
    for (int32_t i = 0; i < n_cand; i++)
        cand[i].value = (float)((double)cand[i].value * inv_sum);
    const float max_prob = (float)inv_sum; /* exp(0) / sum */

    /* min-p: a threshold on the probability, linear time (see top comment
     * on why doing it before top-p gives the documented result). */
    if (p->min_p > 0.0f) {
        const float threshold = p->min_p * max_prob;
        int32_t kept = 0;
        for (int32_t i = 0; i < n_cand; i++)
            if (cand[i].value >= threshold || i == best)
                cand[kept++] = cand[i];
        n_cand = kept;
    } else {
        /* Candidates without mass (masked tokens of constrained decoding,
         * logits far below the best) can never be picked, and dropping
         * them keeps the order and the sums of the others: the same pick,
         * without sorting the whole vocabulary. */
        int32_t kept = 0;
        for (int32_t i = 0; i < n_cand; i++)
            if (cand[i].value > 0.0f)
                cand[kept++] = cand[i];
        n_cand = kept;
    }

    qsort(cand, (size_t)n_cand, sizeof *cand, sampler_cmp);

    /* top-p: the smallest prefix whose mass (under the full softmax)
     * reaches top_p. */
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        int32_t kept = n_cand;
        for (int32_t i = 0; i < n_cand; i++) {
            cum += cand[i].value;
            if (cum >= (double)p->top_p) {
                kept = i + 1;
                break;
            }
        }
        n_cand = kept;
    }

    /* renormalise implicitly: walk to u * (mass kept) */
    double total = 0.0;
    for (int32_t i = 0; i < n_cand; i++)
        total += cand[i].value;
    const double target = u * total;
    double cum = 0.0;
    for (int32_t i = 0; i < n_cand; i++) {
        cum += cand[i].value;
        if (cum > target)
            return cand[i].id;
    }
    /* Rounding left target at or above the last cumulative value: the last
     * token with non-zero mass. */
    for (int32_t i = n_cand; i-- > 0;)
        if (cand[i].value > 0.0f)
            return cand[i].id;
    return cand[0].id;
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
