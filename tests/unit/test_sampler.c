/* test_sampler.c - the sampler: greedy and its tie rule, the counter-based
 * random stream and resumption, top-k / top-p / min-p sets derived by hand,
 * exact penalty amounts, the empirical distribution against a softmax the
 * test computes itself (temperature alone and under each truncation), the
 * same token as a sort-everything reference of the documented order on
 * random logits (ties, -inf, NaN; every instruction set; passes split into
 * chunks for lent threads), and a stable
 * log-softmax. Everything uses fixed seeds, so the statistical checks are
 * deterministic. */
#include "testutil.h"

#include "common/alloc.h"
#include "device/cpu/cpu_kernels.h"
#include "engine/sampler-impl.h"
#include "engine/sampler.h"

#include <stdlib.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The test's own pseudo-random numbers (a 64-bit LCG, top bits), independent
 * of the sampler's generator. */
static uint64_t test_rng_state = 88172645463325252ULL;
static double test_rand(void)
{
    test_rng_state = test_rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(test_rng_state >> 11) / 9007199254740992.0;
}

static eng_sampler_params plain_params(float temperature, uint64_t seed)
{
    eng_sampler_params p = eng_sampler_default_params();
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

static int32_t argmax_lowest(const float *v, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static void test_defaults(void **state)
{
    (void)state;
    eng_sampler_params p = eng_sampler_default_params();
    assert_true(p.temperature == 0.8f);
    assert_int_equal(p.top_k, 40);
    assert_true(p.top_p == 0.95f);
    assert_true(p.min_p == 0.05f);
    assert_true(p.repeat_penalty == 1.0f);
    assert_int_equal(p.penalty_last_n, 64);
    assert_null(eng_sampler_create(&p, 0));
    assert_null(eng_sampler_create(NULL, 10));
    /* each of create's allocations can fail cleanly */
    for (long n = 0; n < 6; n++) {
        sw_alloc_fail_after(n);
        eng_sampler *s = eng_sampler_create(&p, 100);
        sw_alloc_fail_after(-1);
        assert_null(s);
    }
    eng_sampler *s = eng_sampler_create(&p, 100);
    assert_non_null(s);
    eng_sampler_free(s);
    eng_sampler_free(NULL);
}

static void test_greedy_and_ties(void **state)
{
    (void)state;
    eng_sampler_params p = plain_params(0.0f, 7);
    eng_sampler *s = eng_sampler_create(&p, 10);
    assert_non_null(s);
    float logits[10] = {0.1f, 3.0f, -2.0f, 5.0f, 1.0f, 4.9f, 5.0f, 0.0f, -INFINITY, 5.0f};
    assert_int_equal(eng_sampler_sample(s, logits, NULL, 0), 3);
    assert_int_equal(eng_sampler_draws(s), 1); /* greedy consumes a draw too */
    float flat[10] = {0};
    assert_int_equal(eng_sampler_sample(s, flat, NULL, 0), 0);
    float nan_first[10] = {NAN, 1.0f, 2.0f, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(eng_sampler_sample(s, nan_first, NULL, 0), 2);
    assert_int_equal(eng_sampler_draws(s), 3);
    /* A negative temperature is greedy as well. */
    eng_sampler_free(s);
    p.temperature = -1.0f;
    s = eng_sampler_create(&p, 10);
    float l2[10] = {0, 0, 0, 0, 0, 0, 0, 2.0f, 0, 2.0f};
    assert_int_equal(eng_sampler_sample(s, l2, NULL, 0), 7);
    eng_sampler_free(s);
}

/* logit_bias: added to the listed logits before the penalties and the
 * choice, greedy included; -inf stays -inf; ids outside the vocabulary
 * are ignored; repeats add up; the sampler keeps its own copy. */
static void test_logit_bias(void **state)
{
    (void)state;
    eng_sampler_params p = plain_params(0.0f, 3);
    int32_t ids[] = {2, 0, 99, -1, 4, 4};
    float values[] = {10.0f, -100.0f, 50.0f, 50.0f, 0.75f, 0.75f};
    p.bias_ids = ids;
    p.bias_values = values;
    p.n_bias = 6;
    eng_sampler *s = eng_sampler_create(&p, 6);
    assert_non_null(s);
    ids[0] = 5; /* the caller's array changes after create: no effect */
    float logits[6] = {9.0f, 1.0f, 0.5f, 3.0f, 2.0f, -INFINITY};
    /* 2 gets 10.5 and wins over 0 (9 - 100) and 4 (2 + 1.5 = 3.5) */
    assert_int_equal(eng_sampler_sample(s, logits, NULL, 0), 2);
    assert_true(fabs(logits[0] - -91.0f) < 1e-5f);
    assert_true(fabs(logits[4] - 3.5f) < 1e-6f);
    assert_true(isinf(logits[5]) && logits[5] < 0);
    float masked[6] = {1.0f, 0.0f, -INFINITY, 0.5f, 0.0f, 0.0f};
    /* 2 is masked (-inf): its +10 does not bring it back; 4 has 1.5 */
    assert_int_equal(eng_sampler_sample(s, masked, NULL, 0), 4);
    assert_true(isinf(masked[2]) && masked[2] < 0);
    eng_sampler_free(s);

    /* with temperature: a bias of -100 on all but one token leaves that
     * token certain whatever the draw */
    p = plain_params(1.0f, 11);
    int32_t all[5] = {0, 1, 2, 4, 5};
    float minus[5] = {-100, -100, -100, -100, -100};
    p.bias_ids = all;
    p.bias_values = minus;
    p.n_bias = 5;
    s = eng_sampler_create(&p, 6);
    for (int k = 0; k < 50; k++) {
        float l[6] = {3.0f, 3.0f, 3.0f, 0.0f, 3.0f, 3.0f};
        assert_int_equal(eng_sampler_sample(s, l, NULL, 0), 3);
    }
    eng_sampler_free(s);
}

static void test_uniform_stream(void **state)
{
    (void)state;
    enum { N = 200000, BINS = 20 };
    int hist[BINS] = {0};
    double sum = 0.0;
    for (uint64_t k = 0; k < N; k++) {
        double u = eng_sampler_uniform(12345, k);
        assert_true(u >= 0.0 && u < 1.0);
        hist[(int)(u * BINS)]++;
        sum += u;
    }
    /* A pure function of (seed, k). */
    for (uint64_t k = 0; k < 100; k += 7)
        assert_true(eng_sampler_uniform(12345, k) == eng_sampler_uniform(12345, k));
    /* Seeds and neighbours differ. */
    assert_true(eng_sampler_uniform(1, 0) != eng_sampler_uniform(2, 0));
    assert_true(eng_sampler_uniform(1, 1) != eng_sampler_uniform(2, 0));
    assert_true(eng_sampler_uniform(0, 0) != eng_sampler_uniform(0, 1));
    /* Chi-square over 20 bins (19 degrees of freedom): the 99.99% point is
     * about 49; a stream that is uniform passes for this fixed seed. */
    double chi2 = 0.0, expect = (double)N / BINS;
    for (int b = 0; b < BINS; b++)
        chi2 += (hist[b] - expect) * (hist[b] - expect) / expect;
    assert_true(chi2 < 49.0);
    assert_true(fabs(sum / N - 0.5) < 0.005);
    /* Consecutive values are not correlated (lag-1 correlation near 0). */
    double sxy = 0.0;
    for (uint64_t k = 0; k < N; k++)
        sxy += (eng_sampler_uniform(99, k) - 0.5) * (eng_sampler_uniform(99, k + 1) - 0.5);
    assert_true(fabs(sxy / N / (1.0 / 12.0)) < 0.02);
}

/* A fixed sequence of logit vectors for the reproducibility tests. */
enum { SEQ_N = 60, SEQ_V = 300 };
static float seq_logits[SEQ_N][SEQ_V];

static void fill_seq(void)
{
    test_rng_state = 42;
    for (int t = 0; t < SEQ_N; t++)
        for (int v = 0; v < SEQ_V; v++)
            seq_logits[t][v] = (float)(test_rand() * 8.0 - 4.0);
}

static void run_seq(const eng_sampler_params *p, int from, uint64_t draws, int32_t *history,
                    int32_t *out)
{
    eng_sampler *s = eng_sampler_create(p, SEQ_V);
    assert_non_null(s);
    eng_sampler_set_draws(s, draws);
    float work[SEQ_V];
    for (int t = from; t < SEQ_N; t++) {
        memcpy(work, seq_logits[t], sizeof work);
        /* history = a 5-token prompt followed by what was generated */
        out[t] = eng_sampler_sample(s, work, history, (size_t)(5 + t));
        history[5 + t] = out[t];
    }
    assert_int_equal(eng_sampler_draws(s), draws + (uint64_t)(SEQ_N - from));
    eng_sampler_free(s);
}

static void test_same_seed_same_tokens_and_resume(void **state)
{
    (void)state;
    fill_seq();
    eng_sampler_params p = eng_sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 50;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.repeat_penalty = 1.3f;
    p.presence_penalty = 0.2f;
    p.frequency_penalty = 0.1f;
    p.seed = 2024;
    int32_t hist_a[5 + SEQ_N] = {1, 10, 20, 30, 10}, out_a[SEQ_N];
    int32_t hist_b[5 + SEQ_N] = {1, 10, 20, 30, 10}, out_b[SEQ_N];
    run_seq(&p, 0, 0, hist_a, out_a);
    run_seq(&p, 0, 0, hist_b, out_b);
    assert_memory_equal(out_a, out_b, sizeof out_a);

    /* The draws are not all the same token: the stream really varies. */
    int distinct = 0;
    for (int t = 1; t < SEQ_N; t++)
        distinct += out_a[t] != out_a[0];
    assert_true(distinct > 10);

    /* Resume at several points: a fresh sampler with set_draws(k), the
     * history up to k, and logits k..n-1 gives the identical tail. */
    const int cuts[] = {1, 17, 33, 59};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        int k = cuts[c];
        int32_t hist_c[5 + SEQ_N], out_c[SEQ_N];
        memcpy(hist_c, hist_a, sizeof hist_c);
        memset(out_c, 0xff, sizeof out_c);
        run_seq(&p, k, (uint64_t)k, hist_c, out_c);
        assert_memory_equal(out_c + k, out_a + k, sizeof(int32_t) * (size_t)(SEQ_N - k));
    }

    /* A different seed gives a different sequence. */
    p.seed = 2025;
    int32_t hist_d[5 + SEQ_N] = {1, 10, 20, 30, 10}, out_d[SEQ_N];
    run_seq(&p, 0, 0, hist_d, out_d);
    assert_true(memcmp(out_a, out_d, sizeof out_a) != 0);
}

static void test_top_k_one_is_greedy(void **state)
{
    (void)state;
    enum { V = 1000 };
    float logits[V], copy[V];
    eng_sampler_params pg = plain_params(0.0f, 3);
    eng_sampler_params pk = plain_params(1.5f, 3);
    pk.top_k = 1;
    eng_sampler *g = eng_sampler_create(&pg, V);
    eng_sampler *k = eng_sampler_create(&pk, V);
    test_rng_state = 7;
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < V; i++)
            logits[i] = (float)(int)(test_rand() * 50.0); /* many ties */
        memcpy(copy, logits, sizeof copy);
        int32_t want = argmax_lowest(logits, V);
        assert_int_equal(eng_sampler_sample(g, logits, NULL, 0), want);
        assert_int_equal(eng_sampler_sample(k, copy, NULL, 0), want);
    }
    eng_sampler_free(g);
    eng_sampler_free(k);
}

/* Samples `draws` times from logits (copied each time) and counts tokens. */
static void sample_counts(const eng_sampler_params *p, const float *logits, int32_t n,
                          int draws, long *counts)
{
    eng_sampler *s = eng_sampler_create(p, n);
    float *work = sw_malloc(sizeof(float) * (size_t)n);
    assert_non_null(s);
    assert_non_null(work);
    memset(counts, 0, sizeof(long) * (size_t)n);
    for (int d = 0; d < draws; d++) {
        memcpy(work, logits, sizeof(float) * (size_t)n);
        int32_t t = eng_sampler_sample(s, work, NULL, 0);
        assert_true(t >= 0 && t < n);
        counts[t]++;
    }
    sw_free(work);
    eng_sampler_free(s);
}

static void test_top_k_set(void **state)
{
    (void)state;
    /* Logits 0..9 at shuffled ids; top-3 must only ever give the ids of
     * the three largest, in proportion e^9 : e^8 : e^7. */
    enum { V = 10 };
    const int32_t id_of_rank[V] = {4, 9, 0, 7, 2, 5, 1, 8, 3, 6}; /* rank 0 = largest */
    float logits[V];
    for (int r = 0; r < V; r++)
        logits[id_of_rank[r]] = (float)(9 - r);
    eng_sampler_params p = plain_params(1.0f, 11);
    p.top_k = 3;
    long counts[V];
    sample_counts(&p, logits, V, 30000, counts);
    for (int r = 3; r < V; r++)
        assert_int_equal(counts[id_of_rank[r]], 0);
    double z = exp(9.0) + exp(8.0) + exp(7.0);
    for (int r = 0; r < 3; r++)
        assert_true(fabs(counts[id_of_rank[r]] / 30000.0 - exp(9.0 - r) / z) < 0.015);
}

static void test_top_p_set(void **state)
{
    (void)state;
    /* Probabilities 1/2, 1/4, 1/8, 1/16, 1/16 at shuffled ids. */
    enum { V = 5 };
    const int32_t id_of_rank[V] = {3, 0, 4, 1, 2};
    const double prob[V] = {0.5, 0.25, 0.125, 0.0625, 0.0625};
    float logits[V];
    for (int r = 0; r < V; r++)
        logits[id_of_rank[r]] = (float)log(prob[r]);
    long counts[V];
    eng_sampler_params p = plain_params(1.0f, 5);

    /* top_p 0.7: the smallest prefix reaching 0.7 is {1/2, 1/4} (0.75);
     * renormalised 2/3 : 1/3. */
    p.top_p = 0.7f;
    sample_counts(&p, logits, V, 30000, counts);
    assert_int_equal(counts[id_of_rank[2]] + counts[id_of_rank[3]] + counts[id_of_rank[4]], 0);
    assert_true(fabs(counts[id_of_rank[0]] / 30000.0 - 2.0 / 3.0) < 0.015);

    /* top_p 0.8: {1/2, 1/4, 1/8} (0.875). */
    p.top_p = 0.8f;
    sample_counts(&p, logits, V, 30000, counts);
    assert_int_equal(counts[id_of_rank[3]] + counts[id_of_rank[4]], 0);
    assert_true(counts[id_of_rank[2]] > 0);
    assert_true(fabs(counts[id_of_rank[2]] / 30000.0 - 1.0 / 7.0) < 0.015);

    /* top_p 0.4: at least the first token, alone. */
    p.top_p = 0.4f;
    sample_counts(&p, logits, V, 1000, counts);
    assert_int_equal(counts[id_of_rank[0]], 1000);
}

static void test_min_p_set(void **state)
{
    (void)state;
    /* Probabilities 0.4, 0.3, 0.2, 0.1 at ids 2, 0, 3, 1. */
    enum { V = 4 };
    float logits[V] = {(float)log(0.3), (float)log(0.1), (float)log(0.4), (float)log(0.2)};
    long counts[V];
    eng_sampler_params p = plain_params(1.0f, 9);
    /* min_p 0.3: threshold 0.12 drops only the 0.1 (id 1). */
    p.min_p = 0.3f;
    sample_counts(&p, logits, V, 30000, counts);
    assert_int_equal(counts[1], 0);
    assert_true(fabs(counts[3] / 30000.0 - 0.2 / 0.9) < 0.015);
    /* min_p 0.6: threshold 0.24 keeps 0.4 and 0.3: 4/7 : 3/7. */
    p.min_p = 0.6f;
    sample_counts(&p, logits, V, 30000, counts);
    assert_int_equal(counts[1] + counts[3], 0);
    assert_true(fabs(counts[2] / 30000.0 - 4.0 / 7.0) < 0.015);
    /* min_p 1.5: only the most likely token can stay. */
    p.min_p = 1.5f;
    sample_counts(&p, logits, V, 500, counts);
    assert_int_equal(counts[2], 500);
}

static void test_penalties_exact(void **state)
{
    (void)state;
    enum { V = 8 };
    eng_sampler_params p = plain_params(0.0f, 1);
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_last_n = 6;
    eng_sampler *s = eng_sampler_create(&p, V);
    assert_non_null(s);
    /* history: token 7 appears only before the window; the window (the
     * last 6) holds 1 x3, 3 x2, 2 x1. */
    const int32_t hist8[] = {7, 7, 1, 3, 1, 2, 3, 1};
    float logits[V] = {1.0f, 3.0f, -1.0f, 0.0f, 2.0f, 2.0f, 2.0f, 4.0f};
    eng_sampler_apply_penalties(s, logits, hist8, 8);
    /* token 1: count 3, 3/2 - 0.5 - 0.75 = 0.25 */
    assert_true(fabs(logits[1] - 0.25f) < 1e-6f);
    /* token 2: count 1, -1*2 - 0.5 - 0.25 = -2.75 */
    assert_true(fabs(logits[2] - -2.75f) < 1e-6f);
    /* token 3: count 2, 0 stays 0 under rp, - 0.5 - 0.5 = -1.0 */
    assert_true(fabs(logits[3] - -1.0f) < 1e-6f);
    /* untouched: 0, 4, 5, 6, and 7 (outside the window) */
    assert_true(logits[0] == 1.0f && logits[4] == 2.0f && logits[7] == 4.0f);

    /* Out-of-range ids in the history are ignored without harm. */
    const int32_t bad[] = {-5, 99, 8, 1};
    float l2[V] = {0, 3.0f, 0, 0, 0, 0, 0, 0};
    eng_sampler_apply_penalties(s, l2, bad, 4);
    assert_true(fabs(l2[1] - (1.5f - 0.5f - 0.25f)) < 1e-6f);
    for (int i = 2; i < V; i++)
        assert_true(l2[i] == 0.0f);

    /* The same penalties inside sample(): greedy moves off the repeated
     * token. Without penalties 7 wins; with 7 repeated in the window it
     * drops to 4/2 - 0.5 - 0.25 = 1.25, below token 4's 2.0. */
    float l3[V] = {1.0f, 3.0f, -1.0f, 0.0f, 2.0f, 1.0f, 1.0f, 4.0f};
    const int32_t h3[] = {7};
    assert_int_equal(eng_sampler_sample(s, l3, h3, 1), 1); /* 3.0 beats 2.0 */
    float l4[V] = {1.0f, 3.0f, -1.0f, 0.0f, 2.0f, 1.0f, 1.0f, 4.0f};
    const int32_t h4[] = {7, 1};
    assert_int_equal(eng_sampler_sample(s, l4, h4, 2), 4);
    eng_sampler_free(s);

    /* penalty_last_n 0: no penalties; negative: the whole history. */
    p.penalty_last_n = 0;
    s = eng_sampler_create(&p, V);
    float l5[V] = {0, 3.0f, 0, 0, 0, 0, 0, 0};
    eng_sampler_apply_penalties(s, l5, hist8, 8);
    assert_true(l5[1] == 3.0f);
    eng_sampler_free(s);
    p.penalty_last_n = -1;
    s = eng_sampler_create(&p, V);
    float l6[V] = {0, 0, 0, 0, 0, 0, 0, 4.0f};
    eng_sampler_apply_penalties(s, l6, hist8, 8);
    assert_true(fabs(l6[7] - (2.0f - 0.5f - 0.5f)) < 1e-6f);
    /* Calling twice applies twice (no state is left behind between calls). */
    float l7[V] = {0, 0, 0, 0, 0, 0, 0, 4.0f};
    eng_sampler_apply_penalties(s, l7, hist8, 8);
    assert_true(l7[7] == l6[7]);
    eng_sampler_free(s);
}

static void check_distribution(const float *logits, int32_t n, float temperature, int draws,
                               uint64_t seed)
{
    long *counts = sw_calloc((size_t)n, sizeof *counts);
    eng_sampler_params p = plain_params(temperature, seed);
    sample_counts(&p, logits, n, draws, counts);
    double mx = -INFINITY, z = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] / temperature > mx)
            mx = logits[i] / temperature;
    for (int32_t i = 0; i < n; i++)
        z += exp(logits[i] / temperature - mx);
    double chi2 = 0.0;
    for (int32_t i = 0; i < n; i++) {
        double pr = exp(logits[i] / temperature - mx) / z;
        double expect = pr * draws;
        /* max abs diff: std of a frequency is at most 0.5/sqrt(draws) */
        assert_true(fabs(counts[i] / (double)draws - pr) < 4.5 * 0.5 / sqrt((double)draws));
        chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
    }
    /* n-1 = 11 degrees of freedom: the 99.99% point is about 35.7 */
    assert_true(chi2 < 35.7);
    sw_free(counts);
}

static void test_distribution_matches_softmax(void **state)
{
    (void)state;
    const float logits[12] = {0.3f, -1.2f, 2.0f, 1.1f, 0.0f, -0.5f,
                              1.9f, 0.7f, -2.5f, 0.2f, 1.4f, -0.1f};
    check_distribution(logits, 12, 1.0f, 200000, 31337);
    check_distribution(logits, 12, 0.6f, 200000, 4242);
    check_distribution(logits, 12, 1.7f, 200000, 777);
}

/* ---- truncated distributions ------------------------------------------------ */

/* The distribution the documented steps give, in double precision: top-k
 * by logit (ties: lower id), softmax at temperature T, min-p, top-p (the
 * shortest prefix by probability reaching top_p), renormalised. The test's
 * logits keep every cut away from a boundary, so the sampler's float
 * arithmetic makes the same cuts. */
static void expected_distribution(const float *logits, int32_t n, float t, int32_t top_k,
                                  float top_p, float min_p, double *prob)
{
    int32_t *order = sw_malloc(sizeof(int32_t) * (size_t)n);
    assert_non_null(order);
    for (int32_t i = 0; i < n; i++)
        order[i] = i;
    for (int32_t i = 1; i < n; i++) /* insertion sort: logit desc, id asc */
        for (int32_t j = i; j > 0 && logits[order[j]] > logits[order[j - 1]]; j--) {
            int32_t x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    int32_t kept = top_k > 0 && top_k < n ? top_k : n;
    double z = 0.0;
    for (int32_t r = 0; r < kept; r++)
        z += exp((logits[order[r]] - logits[order[0]]) / (double)t);
    int32_t cut = kept;
    double cum = 0.0;
    for (int32_t r = 0; r < kept; r++) {
        double pr = exp((logits[order[r]] - logits[order[0]]) / (double)t) / z;
        if (min_p > 0.0f && r > 0 && pr < min_p * (1.0 / z)) {
            cut = r < cut ? r : cut;
            break;
        }
        cum += pr;
        if (top_p < 1.0f && cum >= top_p) {
            cut = r + 1 < cut ? r + 1 : cut;
            break;
        }
    }
    double zk = 0.0;
    for (int32_t r = 0; r < cut; r++)
        zk += exp((logits[order[r]] - logits[order[0]]) / (double)t);
    for (int32_t i = 0; i < n; i++)
        prob[i] = 0.0;
    for (int32_t r = 0; r < cut; r++)
        prob[order[r]] = exp((logits[order[r]] - logits[order[0]]) / (double)t) / zk;
    sw_free(order);
}

static void check_truncated(const float *logits, int32_t n, float t, int32_t top_k, float top_p,
                            float min_p, int draws, uint64_t seed)
{
    long *counts = sw_calloc((size_t)n, sizeof *counts);
    double *prob = sw_calloc((size_t)n, sizeof *prob);
    assert_non_null(counts);
    assert_non_null(prob);
    eng_sampler_params p = plain_params(t, seed);
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    sample_counts(&p, logits, n, draws, counts);
    expected_distribution(logits, n, t, top_k, top_p, min_p, prob);
    double chi2 = 0.0;
    int df = -1;
    for (int32_t i = 0; i < n; i++) {
        if (prob[i] == 0.0) {
            assert_int_equal(counts[i], 0); /* cut off: never drawn */
            continue;
        }
        double expect = prob[i] * draws;
        assert_true(fabs(counts[i] / (double)draws - prob[i]) < 4.5 * 0.5 / sqrt((double)draws));
        chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
        df++;
    }
    /* a bound past the 99.99% point of chi-square for df <= 20 */
    if (df > 0)
        assert_true(chi2 < df + 8.0 * sqrt(2.0 * df) + 10.0);
    sw_free(counts);
    sw_free(prob);
}

static void test_truncated_distributions(void **state)
{
    (void)state;
    /* 16 logits at shuffled ids; the cuts below fall between values whose
     * probabilities differ clearly. */
    const float logits[16] = {0.3f, -1.2f, 2.0f, 1.1f, 0.0f, -0.5f, 1.6f, 0.7f,
                              -2.5f, 0.2f, 1.4f, -0.1f, -3.0f, 0.9f, -1.8f, 2.6f};
    const int draws = 200000;
    check_truncated(logits, 16, 0.8f, 0, 1.0f, 0.0f, draws, 101);     /* temperature only */
    check_truncated(logits, 16, 1.0f, 5, 1.0f, 0.0f, draws, 102);     /* top-k */
    check_truncated(logits, 16, 0.8f, 0, 0.75f, 0.0f, draws, 103);    /* top-p */
    check_truncated(logits, 16, 1.3f, 0, 1.0f, 0.12f, draws, 104);    /* min-p */
    check_truncated(logits, 16, 0.9f, 8, 0.9f, 0.0f, draws, 105);     /* top-k + top-p */
    check_truncated(logits, 16, 1.1f, 10, 1.0f, 0.1f, draws, 106);    /* top-k + min-p */
    check_truncated(logits, 16, 1.0f, 0, 0.8f, 0.15f, draws, 107);    /* top-p + min-p */
    check_truncated(logits, 16, 1.2f, 12, 0.85f, 0.05f, draws, 108);  /* all three */
    /* the same over a larger vocabulary, where the search has to split
     * buckets (many tokens per top-level bucket) */
    enum { V = 3000 };
    float *big = sw_malloc(sizeof(float) * V);
    assert_non_null(big);
    test_rng_state = 2024;
    for (int i = 0; i < V; i++)
        big[i] = (float)(test_rand() * 3.0);
    big[17] = 9.0f;
    big[2900] = 8.5f;
    big[1234] = 8.0f;
    check_truncated(big, V, 1.0f, 0, 0.5f, 0.0f, 100000, 109); /* top-p inside the head */
    check_truncated(big, V, 1.0f, 0, 1.0f, 0.2f, 100000, 110); /* min-p keeps three */
    sw_free(big);
}

/* ---- the order contract: a sort-everything reference ----------------------- */

typedef struct ref_cand {
    float e;
    int32_t id;
} ref_cand;

static int ref_cmp(const void *pa, const void *pb)
{
    const ref_cand *a = pa, *b = pb;
    if (a->e != b->e)
        return a->e > b->e ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static int ref_cmp_id(const void *pa, const void *pb)
{
    const ref_cand *a = pa, *b = pb;
    return (a->id > b->id) - (a->id < b->id);
}

static int ref_cmp_logit(const void *pa, const void *pb)
{
    return ref_cmp(pa, pb); /* the same order on a logit in .e */
}

/* The pick from n candidates in id order, of mass total, with the uniform
 * integer u: the first whose cumulative mass exceeds floor(u * total / 2^53). */
static int32_t ref_pick(const ref_cand *c, int32_t n, uint64_t total, uint64_t u)
{
    uint64_t target = (uint64_t)(((unsigned __int128)u * total) >> 53), cum = 0;
    for (int32_t i = 0; i < n; i++) {
        cum += (uint64_t)(int32_t)(c[i].e * ENG_SAMPLER_MASS_SCALE);
        if (cum > target)
            return c[i].id;
    }
    return -1;
}

/* The documented draw (sampler.c's top comment), written as plainly as
 * possible: sort every candidate, cut, walk (top-p's proposals first, at
 * most attempts of them). Only the exponential is the sampler's own
 * (eng__sampler_exp2), as the contract defines it. */
static int32_t ref_sample_attempts(const eng_sampler_params *p, float *logits, int32_t n,
                                   uint64_t draw, int32_t attempts)
{
    for (int32_t i = 0; i < n; i++)
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
    if (!(p->temperature > 0.0f)) {
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (logits[i] > logits[best])
                best = i;
        return best;
    }
    ref_cand *c = sw_malloc(sizeof *c * (size_t)n);
    assert_non_null(c);
    for (int32_t i = 0; i < n; i++)
        c[i] = (ref_cand){logits[i], i};
    qsort(c, (size_t)n, sizeof *c, ref_cmp_logit);
    int32_t m = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    float max = c[0].e;
    if (!(max > -INFINITY) || max == INFINITY) {
        int32_t id = c[0].id;
        sw_free(c);
        return id;
    }
    float scale = ENG_SAMPLER_LOG2E / p->temperature;
    scale = scale <= FLT_MAX ? scale : FLT_MAX;
    for (int32_t i = 0; i < m; i++)
        c[i].e = eng__sampler_exp2((c[i].e - max) * scale);
    qsort(c, (size_t)m, sizeof *c, ref_cmp);
    uint64_t total = 0, above = 0;
    for (int32_t i = 0; i < m; i++) {
        uint64_t w = (uint64_t)(int32_t)(c[i].e * ENG_SAMPLER_MASS_SCALE);
        total += w;
        if (c[i].e >= p->min_p)
            above += w;
    }
    /* the kept set: the shorter of min-p's and top-p's prefixes of the
     * order, of L candidates */
    int32_t len = m;
    uint64_t kept = total;
    if (p->min_p > 0.0f) {
        kept = above > (1ULL << 25) ? above : (1ULL << 25); /* the best at least */
        len = 1;
        while (len < m && c[len].e >= p->min_p)
            len++;
    }
    if (p->top_p < 1.0f) {
        uint64_t need = p->top_p > 0.0f ? (uint64_t)((double)p->top_p * (double)total) : 0;
        uint64_t cum = 0;
        int32_t i = 0;
        for (; i < m; i++) {
            cum += (uint64_t)(int32_t)(c[i].e * ENG_SAMPLER_MASS_SCALE);
            if (cum >= need && cum > 0)
                break;
        }
        if (cum < kept) {
            kept = cum;
            len = i + 1;
        }
    }
    ref_cand *sorted = sw_malloc(sizeof *sorted * (size_t)m); /* the order */
    assert_non_null(sorted);
    memcpy(sorted, c, sizeof *sorted * (size_t)m);
    /* the envelope's trials over the candidates in id order: lane l of
     * block b holds positions b * ENG_SAMPLER_BLOCK + l + 16 r; a lane's
     * envelope mass is its largest logit's mass + ENG_SAMPLER_SLACK when
     * that weight is positive and at least min_p * ENG_SAMPLER_NEAR */
    qsort(c, (size_t)m, sizeof *c, ref_cmp_id);
    const float min_p = p->min_p > 0.0f ? p->min_p : 0.0f;
    const int32_t n_lanes = (m + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK * ENG_SAMPLER_LANES;
    uint64_t *env = sw_calloc((size_t)n_lanes, sizeof *env);
    int32_t *members = sw_calloc((size_t)n_lanes, sizeof *members);
    assert_non_null(env);
    assert_non_null(members);
    uint64_t env_total = 0;
    for (int32_t k = 0; k < n_lanes; k++) {
        int32_t b = k / ENG_SAMPLER_LANES, l = k % ENG_SAMPLER_LANES;
        float largest = -INFINITY;
        for (int32_t i = b * ENG_SAMPLER_BLOCK + l;
             i < m && i < (b + 1) * ENG_SAMPLER_BLOCK; i += ENG_SAMPLER_LANES) {
            members[k]++;
            largest = logits[c[i].id] > largest ? logits[c[i].id] : largest;
        }
        float e = eng__sampler_exp2((largest - max) * scale);
        if (e > 0.0f && e >= min_p * ENG_SAMPLER_NEAR)
            env[k] = (uint64_t)(int32_t)(e * ENG_SAMPLER_MASS_SCALE) + ENG_SAMPLER_SLACK;
        env_total += env[k] * (uint64_t)members[k];
    }
    int32_t j = 0, proposed = 0;
    /* no envelope: min_p > 1, greedy's token (the kept set's one) */
    for (; env_total > 0 && j < ENG_SAMPLER_TRIALS && (p->top_p >= 1.0f || proposed < attempts);
         j++) {
        uint64_t target = (uint64_t)(((unsigned __int128)eng__sampler_uniform_bits(
                                          p->seed, draw, (uint64_t)j) *
                                      env_total) >>
                                     53);
        int32_t k = 0;
        for (; target >= env[k] * (uint64_t)members[k]; k++)
            target -= env[k] * (uint64_t)members[k];
        int32_t pos = k / ENG_SAMPLER_LANES * ENG_SAMPLER_BLOCK + k % ENG_SAMPLER_LANES +
                      ENG_SAMPLER_LANES * (int32_t)(target / env[k]);
        float e = c[pos].e;
        if (target % env[k] >= (uint64_t)(int32_t)(e * ENG_SAMPLER_MASS_SCALE) || !(e >= min_p))
            continue;
        /* kept: the token, or top-p's proposal, kept when it ranks in the
         * kept set */
        bool in_kept = p->top_p >= 1.0f;
        for (int32_t r = 0; r < len && !in_kept; r++)
            in_kept = sorted[r].id == c[pos].id;
        proposed++;
        if (in_kept) {
            int32_t id = c[pos].id;
            sw_free(c);
            sw_free(sorted);
            sw_free(env);
            sw_free(members);
            return id;
        }
    }
    /* the pick walks the kept candidates by id, with the number after the
     * trials' */
    qsort(sorted, (size_t)len, sizeof *sorted, ref_cmp_id);
    int32_t id = ref_pick(sorted, len, kept,
                          eng__sampler_uniform_bits(p->seed, draw, ENG_SAMPLER_TRIALS));
    sw_free(c);
    sw_free(sorted);
    sw_free(env);
    sw_free(members);
    return id;
}

static int32_t ref_sample(const eng_sampler_params *p, float *logits, int32_t n, uint64_t draw)
{
    return ref_sample_attempts(p, logits, n, draw, ENG_SAMPLER_ATTEMPTS);
}

/* A for_each that runs the items last to first on the calling thread: a
 * draw split into chunks must not depend on the order they finish in. */
static int reverse_calls;
static void reverse_for_each(void *ctx, int32_t n_items, void (*fn)(void *arg, int32_t item),
                             void *arg)
{
    (void)ctx;
    reverse_calls++;
    for (int32_t i = n_items; i-- > 0;)
        fn(arg, i);
}

static void test_same_token_as_reference(void **state)
{
    (void)state;
    const int32_t sizes[] = {1, 2, 7, 40, 300, 2000, 20000};
    const float temps[] = {0.0f, 0.3f, 0.8f, 1.0f, 2.5f, 1e-6f};
    const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.0f};
    const float min_ps[] = {0.0f, 0.05f, 0.5f, 1.5f};
    const cpu_isa isas[] = {CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVX512};
    float *logits = sw_malloc(sizeof(float) * 20000);
    float *a = sw_malloc(sizeof(float) * 20000), *b = sw_malloc(sizeof(float) * 20000);
    assert_non_null(logits);
    assert_non_null(a);
    assert_non_null(b);
    test_rng_state = 777;
    long checked = 0;
    uint64_t proposals[3] = {0, 0, 0};
    for (int round = 0; round < 12; round++) {
        for (size_t zi = 0; zi < sizeof sizes / sizeof sizes[0]; zi++) {
            int32_t n = sizes[zi];
            /* kinds: spread values, few distinct values (ties), -inf and
             * NaN sprinkled, a narrow range (many tokens per bucket) */
            int kind = round % 4;
            for (int32_t i = 0; i < n; i++) {
                double r = test_rand();
                if (kind == 0)
                    logits[i] = (float)(r * 20.0 - 10.0);
                else if (kind == 1)
                    logits[i] = (float)((int)(r * 5.0)) * 0.5f;
                else if (kind == 2)
                    logits[i] = r < 0.2 ? -INFINITY : r < 0.25 ? NAN : (float)(r * 6.0);
                else
                    logits[i] = (float)(r * 1e-3);
            }
            eng_sampler_params p = plain_params(temps[round % 6], 1000 + (uint64_t)round);
            p.top_k = round % 3 == 0 ? 0 : round % 3 == 1 ? 5 : n / 2;
            p.top_p = top_ps[(round + zi) % 4];
            p.min_p = min_ps[(round / 4 + zi) % 4];
            for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
                cpu_kernels_force_isa(isas[ii]);
                eng_sampler *s = eng_sampler_create(&p, n);
                assert_non_null(s);
                /* lent threads (2 or 4 chunks) for large vocabularies */
                eng_sampler *st = eng_sampler_create(&p, n);
                assert_non_null(st);
                eng_sampler_threads th = {reverse_for_each, NULL, round % 2 ? 4 : 2};
                eng_sampler_set_threads(st, &th);
                eng_sampler *sx = eng_sampler_create(&p, n);
                assert_non_null(sx);
                eng_sampler_set_threads(sx, &th);
                eng__sampler_set_attempts(sx, 0);
                for (uint64_t d = 0; d < 8; d++) {
                    memcpy(a, logits, sizeof(float) * (size_t)n);
                    memcpy(b, logits, sizeof(float) * (size_t)n);
                    eng_sampler_set_draws(s, d * 977);
                    int32_t got = eng_sampler_sample(s, a, NULL, 0);
                    int32_t want = ref_sample(&p, b, n, d * 977);
                    if (got != want)
                        fail_msg("n %d kind %d T %g top_k %d top_p %g min_p %g isa %d draw %d: "
                                 "%d, reference %d", n, kind, (double)p.temperature, p.top_k,
                                 (double)p.top_p, (double)p.min_p, (int)isas[ii], (int)d, got,
                                 want);
                    memcpy(a, logits, sizeof(float) * (size_t)n);
                    eng_sampler_set_draws(st, d * 977);
                    assert_int_equal(eng_sampler_sample(st, a, NULL, 0), want);
                    /* top-p's exact search, without proposals */
                    memcpy(a, logits, sizeof(float) * (size_t)n);
                    memcpy(b, logits, sizeof(float) * (size_t)n);
                    eng_sampler_set_draws(sx, d * 977);
                    assert_int_equal(eng_sampler_sample(sx, a, NULL, 0),
                                     ref_sample_attempts(&p, b, n, d * 977, 0));
                    checked++;
                }
                uint64_t got_proposals[3];
                eng__sampler_proposals(s, got_proposals);
                for (int k = 0; k < 3; k++)
                    proposals[k] += got_proposals[k];
                eng_sampler_free(s);
                eng_sampler_free(st);
                eng_sampler_free(sx);
            }
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AMX); /* back to the best the CPU has */
    assert_true(checked > 1000);
    assert_true(reverse_calls > 0); /* the 20000-token vocabularies split */
    /* top-p's proposals: some kept, some refused, some decided on the
     * exact total where its lower bound could not */
    for (int k = 0; k < 3; k++)
        if (!(proposals[k] > 0))
            fail_msg("no top-p proposal %s (%llu %llu %llu)",
                     k == 0 ? "kept" : k == 1 ? "refused" : "decided on the exact total",
                     (unsigned long long)proposals[0], (unsigned long long)proposals[1],
                     (unsigned long long)proposals[2]);
    sw_free(logits);
    sw_free(a);
    sw_free(b);
}

/* top-p's cut comes from an estimate (the heavy candidates weighed, a
 * sample of the others); where the estimate misleads (the sample sees only
 * light candidates, or only heavy ones, too many to weigh), the exact search
 * still gives the reference's token. Each way of finding the cut is taken. */
static void test_top_p_estimate_paths(void **state)
{
    (void)state;
    enum { V = 40000 };
    float *logits = sw_malloc(sizeof(float) * V);
    float *a = sw_malloc(sizeof(float) * V), *b = sw_malloc(sizeof(float) * V);
    assert_non_null(logits);
    assert_non_null(a);
    assert_non_null(b);
    uint64_t paths[4] = {0, 0, 0, 0};
    test_rng_state = 99;
    const int32_t st = eng__sampler_stride(V); /* the estimate samples one in st */
    for (int kind = 0; kind < 6; kind++) {
        for (int32_t i = 0; i < V; i++) {
            bool sampled = i % st == 0;
            if (kind == 0) /* a smooth spread: the estimate's range holds the cut */
                logits[i] = (float)(test_rand() * 12.0);
            else if (kind == 1) /* the sample sees only light ones */
                logits[i] = sampled ? -3.0f : (float)(test_rand() * 0.5);
            else if (kind == 2) /* the sample sees only heavy ones */
                logits[i] = sampled ? (float)(test_rand() * 0.5) : -3.0f;
            else if (kind == 3) /* one heavy token, the rest a light spread */
                logits[i] = i == 12345 ? 14.0f : (float)(test_rand() * 4.0);
            else if (kind == 4) /* a sampled spread of middling ones, unsampled heavy ones */
                logits[i] = i % st == 0 ? (float)(2.0 + test_rand() * 4.0)
                            : i % st < 3 ? 12.0f
                                         : -20.0f;
            else /* the sampled ones a little heavier than the rest */
                logits[i] = sampled ? (float)(test_rand() * 6.0)
                                    : (float)(test_rand() * 6.0 - 0.7);
        }
        const float top_ps[] = {0.95f, 0.6f, 0.2f};
        for (size_t pi = 0; pi < sizeof top_ps / sizeof top_ps[0]; pi++) {
            eng_sampler_params p = plain_params(1.0f, 7 + (uint64_t)kind);
            p.top_p = top_ps[pi];
            eng_sampler *s = eng_sampler_create(&p, V);
            assert_non_null(s);
            eng__sampler_set_attempts(s, 0); /* the search at once */
            for (uint64_t d = 0; d < 6; d++) {
                memcpy(a, logits, sizeof(float) * V);
                memcpy(b, logits, sizeof(float) * V);
                eng_sampler_set_draws(s, d * 31);
                assert_int_equal(eng_sampler_sample(s, a, NULL, 0),
                                 ref_sample_attempts(&p, b, V, d * 31, 0));
            }
            uint64_t got[4];
            eng__sampler_cut_paths(s, got);
            for (int k = 0; k < 4; k++)
                paths[k] += got[k];
            eng_sampler_free(s);
        }
    }
    for (int k = 0; k < 4; k++)
        if (!(paths[k] > 0))
            fail_msg("no top-p cut found by path %d (%llu %llu %llu %llu)", k,
                     (unsigned long long)paths[0], (unsigned long long)paths[1],
                     (unsigned long long)paths[2], (unsigned long long)paths[3]);
    sw_free(logits);
    sw_free(a);
    sw_free(b);
}

/* The vector kernels give the scalar exponential's bits on every input,
 * -inf, the cut-off and values around it included, and the scalar masses
 * and sums. */
static void test_kernels_match_scalar(void **state)
{
    (void)state;
    enum { V = 4099 };
    float *logits = sw_malloc(sizeof(float) * V);
    float *want = sw_malloc(sizeof(float) * V), *got = sw_malloc(sizeof(float) * V);
    int32_t *members = sw_malloc(sizeof(int32_t) * V);
    int32_t *want_members = sw_malloc(sizeof(int32_t) * V);
    assert_non_null(logits);
    assert_non_null(want);
    assert_non_null(got);
    assert_non_null(members);
    assert_non_null(want_members);
    test_rng_state = 31;
    for (int i = 0; i < V; i++)
        logits[i] = (float)(test_rand() * 100.0 - 95.0);
    logits[3] = -INFINITY;
    logits[10] = 5.0f;
    logits[11] = 5.0f + ENG_SAMPLER_EXP2_MIN;
    logits[12] = nextafterf(logits[11], -INFINITY);
    for (int i = 200; i < 210; i++) /* ties with logits[100] */
        logits[i] = logits[100];
    const float scales[] = {1.0f, 1.25f, 0.37f, 3.0e38f};
    for (size_t t = 0; t < sizeof scales / sizeof scales[0]; t++) {
        for (int i = 0; i < V; i++)
            want[i] = eng__sampler_exp2((logits[i] - 5.0f) * scales[t]);
        assert_true(want[10] == 1.0f);
#if defined(__x86_64__) || defined(__i386__)
        const eng__sampler_kernels *ks[] = {&eng__sampler_kernels_avx2,
                                            &eng__sampler_kernels_avx512};
        const cpu_isa need[] = {CPU_ISA_AVX2, CPU_ISA_AVX512};
        for (int k = 0; k < 2; k++) {
            if (cpu_kernels_force_isa(need[k]) < need[k])
                continue; /* this CPU lacks it */
            /* every combination of stores, and a vocabulary that is not a
             * whole number of blocks or vectors */
            enum { NB = (V + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK };
            uint64_t kept[NB], want_kept[NB];
            for (int stores = 0; stores < 4; stores++) {
                float min_p = stores % 2 ? 0.0f : 0.01f; /* 0: every mass kept */
                eng__sampler_weights_scalar(logits, V, 5.0f, scales[t], min_p, NULL,
                                            want_kept);
                memset(got, 0, sizeof(float) * V);
                memset(kept, 0, sizeof kept);
                ks[k]->weights(logits, V, 5.0f, scales[t], min_p, stores >= 2 ? got : NULL,
                               kept);
                assert_memory_equal(want_kept, kept, sizeof kept);
                if (stores >= 2)
                    assert_memory_equal(want, got, sizeof(float) * V);
            }
            /* the coarse masses, with the same kept sums and the total of
             * every mass; then their sums above thresholds (none, a mass some
             * share, the largest coarse mass and past it), from an odd start */
            for (int with_min_p = 0; with_min_p < 2; with_min_p++) {
                float min_p = with_min_p ? 0.01f : 0.0f;
                uint16_t *c = (uint16_t *)(void *)members, *want_c = (uint16_t *)(void *)want_members;
                uint64_t total = 0, want_total = 0, all = 0;
                eng__sampler_weights_scalar(logits, V, 5.0f, scales[t], min_p, NULL, want_kept);
                eng__sampler_coarse_scalar(logits, V, 5.0f, scales[t], min_p, want_c, kept,
                                           &want_total);
                assert_memory_equal(want_kept, kept, sizeof kept);
                ks[k]->coarse(logits, V, 5.0f, scales[t], min_p, c, kept, &total);
                assert_memory_equal(want_kept, kept, sizeof kept);
                assert_memory_equal(want_c, c, sizeof(uint16_t) * V);
                assert_true(total == want_total);
                for (int i = 0; i < V; i++) {
                    assert_int_equal(c[i], (uint32_t)(want[i] * ENG_SAMPLER_MASS_SCALE) >>
                                               ENG_SAMPLER_COARSE_SHIFT);
                    all += (uint64_t)(want[i] * ENG_SAMPLER_MASS_SCALE);
                }
                assert_true(total == all);
            }
            /* the lane maxima (NaN cleaned) and the envelope: lengths that
             * end inside a block, on a block's end, inside the first; with
             * and without min-p's live rule */
            {
                const int32_t lens[] = {V, 5 * ENG_SAMPLER_BLOCK, 5 * ENG_SAMPLER_BLOCK + 7, 300,
                                        7};
                enum { NL = NB * ENG_SAMPLER_LANES };
                float lanes[NL], want_lanes[NL], emax[NB], want_emax[NB];
                uint32_t env[NL], want_env[NL];
                uint64_t benv[NB], want_benv[NB], low[NB], want_low[NB];
                for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                    int32_t len = lens[li], nb = (len + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK;
                    memcpy(got, logits, sizeof(float) * V);
                    memcpy(want, logits, sizeof(float) * V);
                    got[70] = got[len - 1] = want[70] = want[len - 1] = NAN;
                    float m = ks[k]->sanitize_lanes(got, len, lanes);
                    assert_true(m == eng__sampler_sanitize_lanes_scalar(want, len, want_lanes));
                    assert_memory_equal(got, want, sizeof(float) * (size_t)len);
                    assert_memory_equal(lanes, want_lanes,
                                        sizeof(float) * (size_t)nb * ENG_SAMPLER_LANES);
                    for (int32_t i = 0; i < len; i++) {
                        float *lm = &want_lanes[i / ENG_SAMPLER_BLOCK * ENG_SAMPLER_LANES +
                                                i % ENG_SAMPLER_LANES];
                        assert_true(i == 70 || i == len - 1 ? got[i] == -INFINITY
                                                            : got[i] == logits[i] && *lm >= got[i]);
                    }
                    for (int mp = 0; mp < 2; mp++) {
                        float min_env = mp ? 0.01f : 0.0f;
                        ks[k]->envelope(lanes, len, m, scales[t], min_env, env, benv, low, emax);
                        eng__sampler_envelope_scalar(lanes, len, m, scales[t], min_env, want_env,
                                                     want_benv, want_low, want_emax);
                        assert_memory_equal(env, want_env,
                                            sizeof(uint32_t) * (size_t)nb * ENG_SAMPLER_LANES);
                        assert_memory_equal(benv, want_benv, sizeof(uint64_t) * (size_t)nb);
                        assert_memory_equal(low, want_low, sizeof(uint64_t) * (size_t)nb);
                        assert_memory_equal(emax, want_emax, sizeof(float) * (size_t)nb);
                    }
                }
                /* the ranks of a block's candidates above thresholds: none, a
                 * weight some share and the float below it, the largest */
                for (int i = 0; i < V; i++)
                    want[i] = eng__sampler_exp2((logits[i] - 5.0f) * scales[t]);
                const float thresholds[] = {-1.0f, 0.0f, want[100], nextafterf(want[100], 0.0f),
                                            0.5f, 1.0f};
                for (size_t ti = 0; ti < sizeof thresholds / sizeof thresholds[0]; ti++)
                    for (int32_t from = 0; from < V; from += 997) {
                        int32_t len = V - from < ENG_SAMPLER_BLOCK ? V - from : ENG_SAMPLER_BLOCK;
                        len -= from % 3; /* inside a vector */
                        uint64_t total = 0, want_total = 0, above = 0, all = 0;
                        uint64_t r = ks[k]->rank(logits + from, len, 5.0f, scales[t],
                                                 thresholds[ti], &total);
                        assert_true(r == eng__sampler_rank_scalar(logits + from, len, 5.0f,
                                                                  scales[t], thresholds[ti],
                                                                  &want_total));
                        assert_true(total == want_total);
                        for (int32_t i = from; i < from + len; i++) {
                            uint64_t w = (uint64_t)(int32_t)(want[i] * ENG_SAMPLER_MASS_SCALE);
                            all += w;
                            above += want[i] > thresholds[ti] ? w : 0;
                        }
                        assert_true(r == above && total == all);
                    }
            }
            /* a range of top-level buckets: its members and the masses above
             * it, from the start and from a later block */
            const uint32_t ranges[][2] = {{0, 1016}, {1000, 1010}, {1012, 1012}, {500, 990}};
            for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++)
                for (int32_t from = 0; from < V; from += 3 * ENG_SAMPLER_BLOCK) {
                    uint64_t above[NB], want_above[NB];
                    int32_t m = ks[k]->range(want, from, V, ranges[ri][0], ranges[ri][1], above,
                                             members);
                    int32_t want_m = eng__sampler_range_scalar(want, from, V, ranges[ri][0],
                                                               ranges[ri][1], want_above,
                                                               want_members);
                    assert_int_equal(m, want_m);
                    assert_memory_equal(members, want_members, sizeof(int32_t) * (size_t)m);
                    size_t nb = (size_t)(V - from + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK;
                    assert_memory_equal(above, want_above, sizeof(uint64_t) * nb);
                }
            /* the logits above a threshold, up to a cap */
            for (int32_t cap = 0; cap < V; cap += 700) {
                int32_t got_n = ks[k]->above(logits, V, -50.0f, members, cap);
                int32_t want_n = eng__sampler_above_scalar(logits, V, -50.0f, want_members, cap);
                assert_int_equal(got_n, want_n);
                if (got_n <= cap)
                    assert_memory_equal(members, want_members, sizeof(int32_t) * (size_t)got_n);
            }
            /* NaN cleaning with the maximum: lengths that end inside a
             * vector, on a vector's end; NaN in the vector part and in the
             * tail */
            {
                const int32_t lens[] = {V, 5 * 64, 5 * 64 + 7, 7, 1};
                for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                    int32_t len = lens[li];
                    memcpy(got, logits, sizeof(float) * V);
                    float top = -INFINITY;
                    for (int32_t i = 0; i < len; i++)
                        top = i != 70 && i != len - 1 && logits[i] > top ? logits[i] : top;
                    got[70] = got[len - 1] = NAN;
                    assert_true(ks[k]->sanitize_max(got, len) == top);
                    for (int32_t i = 0; i < len; i++)
                        assert_true(i == 70 || i == len - 1 ? got[i] == -INFINITY
                                                            : got[i] == logits[i]);
                }
            }
            /* log-softmax's fine sums */
            uint64_t fine[NB], want_fine[NB];
            ks[k]->fine_sums(logits, V, 5.0f, fine);
            eng__sampler_fine_sums_scalar(logits, V, 5.0f, want_fine);
            assert_memory_equal(fine, want_fine, sizeof fine);
            /* the masses a cut keeps: cuts at a weight some candidates share
             * (ids before and after the cut), at one no candidate has, at 0 */
            const float cuts[] = {want[10], want[100], 0.5f, 0.0f};
            const int32_t id_cuts[] = {-1, 100, 205, 1030, V};
            for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++)
                for (size_t ii = 0; ii < sizeof id_cuts / sizeof id_cuts[0]; ii++)
                    for (int32_t from = 0; from < 40; from += 13)
                        assert_true(
                            ks[k]->kept_mass(want, from, V - from / 2, cuts[ci], id_cuts[ii]) ==
                            eng__sampler_kept_mass_scalar(want, from, V - from / 2, cuts[ci],
                                                          id_cuts[ii]));
        }
        cpu_kernels_force_isa(CPU_ISA_AMX);
#endif
    }
#if defined(__x86_64__) || defined(__i386__)
    /* every weight 1 (all logits tie at the maximum): each 32-bit lane of a
     * block's sum reaches its bound (2^31 with 8 lanes), the block's sum
     * is still every mass */
    {
        enum { NB = (V + ENG_SAMPLER_BLOCK - 1) / ENG_SAMPLER_BLOCK };
        for (int i = 0; i < V; i++)
            logits[i] = 2.5f;
        const eng__sampler_kernels *ks[] = {&eng__sampler_kernels_avx2,
                                            &eng__sampler_kernels_avx512};
        const cpu_isa need[] = {CPU_ISA_AVX2, CPU_ISA_AVX512};
        for (int k = 0; k < 2; k++) {
            if (cpu_kernels_force_isa(need[k]) < need[k])
                continue;
            uint64_t kept[NB], total = 0;
            ks[k]->weights(logits, V, 2.5f, 1.0f, 0.5f, NULL, kept);
            for (int b = 0; b < NB; b++) {
                int32_t len = V - b * ENG_SAMPLER_BLOCK < ENG_SAMPLER_BLOCK
                                  ? V - b * ENG_SAMPLER_BLOCK
                                  : ENG_SAMPLER_BLOCK;
                assert_true(kept[b] == (uint64_t)len << 25);
            }
            for (int b = 0; b < NB; b++)
                total += kept[b];
            assert_true(total == (uint64_t)V << 25);
            for (int i = 0; i < V; i++)
                want[i] = 1.0f;
            assert_true(ks[k]->kept_mass(want, 0, 0, 0.0f, 0) == 0);
            assert_true(ks[k]->kept_mass(want, 0, V, 0.5f, 0) == (uint64_t)V << 25);
            assert_true(ks[k]->kept_mass(want, 0, V, 1.0f, V) == (uint64_t)V << 25);
            /* each lane's envelope 2^25 + the slack, the ranks' 32-bit
             * lanes at their bound */
            float lanes[NB * ENG_SAMPLER_LANES], emax[NB];
            uint32_t env[NB * ENG_SAMPLER_LANES];
            uint64_t benv[NB], low[NB];
            assert_true(ks[k]->sanitize_lanes(logits, V, lanes) == 2.5f);
            ks[k]->envelope(lanes, V, 2.5f, 1.0f, 0.0f, env, benv, low, emax);
            for (int b = 0; b < NB; b++) {
                int32_t len = V - b * ENG_SAMPLER_BLOCK < ENG_SAMPLER_BLOCK
                                  ? V - b * ENG_SAMPLER_BLOCK
                                  : ENG_SAMPLER_BLOCK;
                int32_t live = len < ENG_SAMPLER_LANES ? len : ENG_SAMPLER_LANES;
                assert_true(benv[b] == (uint64_t)len * ((1u << 25) + ENG_SAMPLER_SLACK));
                assert_true(low[b] == (uint64_t)live << 25);
                assert_true(emax[b] == 1.0f);
            }
            uint64_t all = 0;
            assert_true(ks[k]->rank(logits, ENG_SAMPLER_BLOCK, 2.5f, 1.0f, 0.5f, &all) ==
                        (uint64_t)ENG_SAMPLER_BLOCK << 25);
            assert_true(all == (uint64_t)ENG_SAMPLER_BLOCK << 25);
        }
        cpu_kernels_force_isa(CPU_ISA_AMX);
    }
#endif
    /* the power of two itself: within 2e-7 of 2^t over its range, the
     * halves (where the rounding turns) included; exact at integers */
    for (float x = -115.0f; x <= 0.0f; x += 0.013f) {
        double ref = exp2((double)x), e = eng__sampler_exp2(x);
        assert_true(fabs(e - ref) <= 2e-7 * ref);
    }
    for (int k = -115; k <= 0; k++) {
        for (int d = -1; d <= 1; d += 2) {
            float x = nextafterf((float)k + 0.5f, d < 0 ? -INFINITY : INFINITY);
            double ref = exp2((double)x), e = eng__sampler_exp2(x);
            assert_true(fabs(e - ref) <= 2e-7 * ref);
        }
        assert_true(eng__sampler_exp2((float)k) == (float)exp2((double)k));
    }
    assert_true(eng__sampler_exp2(-INFINITY) == 0.0f);
    assert_true(eng__sampler_exp2(nextafterf(ENG_SAMPLER_EXP2_MIN, -INFINITY)) == 0.0f);
    sw_free(logits);
    sw_free(want);
    sw_free(got);
    sw_free(members);
    sw_free(want_members);
}

/* The envelope's margins: as its argument rises, eng__sampler_exp2 loses
 * at most ENG_SAMPLER_SLACK masses and less than 1 - ENG_SAMPLER_NEAR of
 * itself (rounding). bench/exp2_fall.c checks every float in [-116, 0];
 * here, runs of 4096 consecutive floats at each quarter of every unit. */
static void test_exp2_fall(void **state)
{
    (void)state;
    int64_t worst_mass = 0;
    double worst_rel = 0.0;
    for (int k = -116; k < 0; k++)
        for (int q = 0; q < 4; q++) {
            float t = (float)k + 0.25f * (float)q, top = 0.0f;
            int64_t top_mass = 0;
            for (int i = 0; i < 4096; i++, t = nextafterf(t, 1.0f)) {
                float e = eng__sampler_exp2(t);
                int64_t m = (int64_t)(int32_t)(e * ENG_SAMPLER_MASS_SCALE);
                worst_mass = top_mass - m > worst_mass ? top_mass - m : worst_mass;
                if (top > e && ((double)top - e) / e > worst_rel)
                    worst_rel = ((double)top - e) / e;
                top_mass = m > top_mass ? m : top_mass;
                top = e > top ? e : top;
            }
        }
    assert_true(worst_mass <= ENG_SAMPLER_SLACK);
    assert_true(worst_rel < 1.0 - (double)ENG_SAMPLER_NEAR);
    assert_true(worst_mass > 0); /* it does fall: the slack is needed */
}

static void test_large_vocab_top_k(void **state)
{
    (void)state;
    enum { V = 256000 };
    float *logits = sw_malloc(sizeof(float) * V);
    float *copy = sw_malloc(sizeof(float) * V);
    assert_non_null(logits);
    test_rng_state = 99;
    for (int i = 0; i < V; i++)
        logits[i] = (float)(test_rand() * 10.0);
    /* The 40th largest, computed by the test with a counting pass. */
    eng_sampler_params p = eng_sampler_default_params(); /* top_k 40 */
    p.seed = 5;
    eng_sampler *s = eng_sampler_create(&p, V);
    assert_non_null(s);
    for (int d = 0; d < 50; d++) {
        memcpy(copy, logits, sizeof(float) * V);
        int32_t t = eng_sampler_sample(s, copy, NULL, 0);
        assert_true(t >= 0 && t < V);
        int larger = 0;
        for (int i = 0; i < V; i++)
            larger += logits[i] > logits[t];
        assert_true(larger < 40);
    }
    eng_sampler_free(s);
    /* No top-k at all: the whole vocabulary, still correct. */
    p = plain_params(1.0f, 6);
    s = eng_sampler_create(&p, V);
    memcpy(copy, logits, sizeof(float) * V);
    int32_t t = eng_sampler_sample(s, copy, NULL, 0);
    assert_true(t >= 0 && t < V);
    eng_sampler_free(s);
    sw_free(logits);
    sw_free(copy);
}

static void test_degenerate_logits(void **state)
{
    (void)state;
    enum { V = 6 };
    eng_sampler_params p = plain_params(1.0f, 1);
    eng_sampler *s = eng_sampler_create(&p, V);
    float all_ninf[V] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(eng_sampler_sample(s, all_ninf, NULL, 0), 0);
    float one_pinf[V] = {0, 1, INFINITY, 3, INFINITY, 0};
    assert_int_equal(eng_sampler_sample(s, one_pinf, NULL, 0), 2);
    /* Only one finite token among -inf ones: always that one. */
    for (int d = 0; d < 100; d++) {
        float one[V] = {-INFINITY, -INFINITY, -INFINITY, 0.5f, -INFINITY, NAN};
        assert_int_equal(eng_sampler_sample(s, one, NULL, 0), 3);
    }
    eng_sampler_free(s);
}

static void test_log_softmax(void **state)
{
    (void)state;
    enum { V = 1000 };
    float logits[V], lp[V];
    test_rng_state = 1234;
    for (int i = 0; i < V; i++)
        logits[i] = (float)(test_rand() * 40.0 - 20.0);
    eng_log_softmax(logits, lp, V);
    double total = 0.0;
    for (int i = 0; i < V; i++) {
        assert_true(lp[i] <= 0.0f);
        total += exp((double)lp[i]);
    }
    assert_true(fabs(total - 1.0) < 1e-5);
    /* differences are preserved */
    assert_true(fabs((lp[1] - lp[0]) - (logits[1] - logits[0])) < 1e-3);
    /* within rounding of a log-softmax in double, and the same bits on
     * every instruction set */
    double max = -INFINITY, sum = 0.0;
    for (int i = 0; i < V; i++)
        max = logits[i] > max ? logits[i] : max;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - max);
    for (int i = 0; i < V; i++)
        assert_true(fabs(lp[i] - (((double)logits[i] - max) - log(sum))) < 4e-6);
    const cpu_isa isas[] = {CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVX512};
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        float other[V];
        cpu_kernels_force_isa(isas[k]);
        eng_log_softmax(logits, other, V);
        assert_memory_equal(lp, other, sizeof other);
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);

    /* Huge logits: no overflow. */
    const float huge[4] = {1e30f, 1e30f, 0.0f, -1e30f};
    float lh[4];
    eng_log_softmax(huge, lh, 4);
    assert_true(fabs(lh[0] - (float)-log(2.0)) < 1e-6f);
    assert_true(fabs(lh[1] - (float)-log(2.0)) < 1e-6f);
    assert_true(isfinite(lh[2]) && lh[2] < -1e29f);

    /* -inf entries get -inf and the rest still sum to 1. */
    const float with_inf[5] = {-INFINITY, 1.0f, 2.0f, -INFINITY, 3.0f};
    float li[5];
    eng_log_softmax(with_inf, li, 5);
    assert_true(isinf(li[0]) && li[0] < 0 && isinf(li[3]) && li[3] < 0);
    double t2 = exp(li[1]) + exp(li[2]) + exp(li[4]);
    assert_true(fabs(t2 - 1.0) < 1e-6);
    double z = exp(-2.0) + exp(-1.0) + 1.0;
    assert_true(fabs(li[4] - (float)-log(z)) < 1e-6f);

    /* All -inf: uniform by convention. */
    const float none[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    float ln[4];
    eng_log_softmax(none, ln, 4);
    for (int i = 0; i < 4; i++)
        assert_true(fabs(ln[i] - (float)-log(4.0)) < 1e-6f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_greedy_and_ties),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_uniform_stream),
        cmocka_unit_test(test_same_seed_same_tokens_and_resume),
        cmocka_unit_test(test_top_k_one_is_greedy),
        cmocka_unit_test(test_top_k_set),
        cmocka_unit_test(test_top_p_set),
        cmocka_unit_test(test_min_p_set),
        cmocka_unit_test(test_penalties_exact),
        cmocka_unit_test(test_distribution_matches_softmax),
        cmocka_unit_test(test_truncated_distributions),
        cmocka_unit_test(test_same_token_as_reference),
        cmocka_unit_test(test_kernels_match_scalar),
        cmocka_unit_test(test_top_p_estimate_paths),
        cmocka_unit_test(test_exp2_fall),
        cmocka_unit_test(test_large_vocab_top_k),
        cmocka_unit_test(test_degenerate_logits),
        cmocka_unit_test(test_log_softmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
