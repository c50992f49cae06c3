/* sampler_topp_mix.c - what a top-p draw costs over varied distributions:
 * eng_sampler_sample at
 * temperature 0.8, top_p 0.95 on 120 fixed logit vectors of six shapes
 * (normal, Gumbel, normal with a few lifted tokens, normal with a dead
 * region, Laplace, one dominant token over a narrow normal; spreads drawn
 * from 1 to 5), each drawn 3 times, in CPU time on one thread (the process's
 * CPU clock; the logits' copies not counted). Prints the mean per draw, the
 * token sum (the same from every build that draws the same tokens) and how
 * many proposals were kept and refused; then the same for the exact search
 * alone (no proposals, eng__sampler_set_attempts 0), where the estimate of
 * the cut sometimes misses, with how many cuts each path found
 * (sampler-impl.h, eng__sampler_cut_paths). Built and run by
 * bench/sampling.sh; asserts nothing.
 *
 *   sampler_topp_mix N_VOCAB
 */
#include "engine/sampler-impl.h"
#include "engine/sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { SHAPES = 6, PER_SHAPE = 20, ROUNDS = 3 };

static uint64_t lcg_state = 777;

static double uniform(void)
{
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return ((double)(lcg_state >> 11) + 0.5) / 9007199254740992.0;
}

static double normal(void)
{
    return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
}

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Logit vector k (shape k / PER_SHAPE) into out. */
static void make_logits(float *out, int n, int k)
{
    int shape = k / PER_SHAPE;
    double spread = 1.0 + 4.0 * uniform();
    int dominant = (int)((uint64_t)k * 7919u % (uint64_t)n);
    for (int i = 0; i < n; i++) {
        double v;
        if (shape == 0)
            v = spread * normal();
        else if (shape == 1)
            v = -spread * log(-log(uniform()));
        else if (shape == 2)
            v = spread * normal() + (uniform() < 0.001 ? 8.0 : 0.0);
        else if (shape == 3)
            v = spread * normal() - (i > n * 2 / 3 ? 10.0 : 0.0);
        else if (shape == 4)
            v = spread * (uniform() < 0.5 ? 1.0 : -1.0) * log(uniform());
        else
            v = spread * normal() * 0.5 + (i == dominant ? 20.0 + 10.0 * uniform() : 0.0);
        out[i] = (float)v;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: sampler_topp_mix N_VOCAB\n");
        return 2;
    }
    int n = atoi(argv[1]);
    if (n <= 0)
        return 2;
    const int n_sets = SHAPES * PER_SHAPE;
    float *sets = malloc(sizeof(float) * (size_t)n * (size_t)n_sets);
    float *l = malloc(sizeof(float) * (size_t)n);
    if (!sets || !l)
        return 1;
    for (int k = 0; k < n_sets; k++)
        make_logits(sets + (size_t)k * (size_t)n, n, k);
    eng_sampler_params p = eng_sampler_default_params();
    p.temperature = 0.8f;
    p.top_k = 0;
    p.top_p = 0.95f;
    p.min_p = 0.0f;
    for (int search = 0; search < 2; search++) {
        eng_sampler *s = eng_sampler_create(&p, n);
        if (!s)
            return 1;
        if (search)
            eng__sampler_set_attempts(s, 0);
        double t = 0;
        long sum = 0;
        for (int r = 0; r < ROUNDS; r++)
            for (int k = 0; k < n_sets; k++) {
                memcpy(l, sets + (size_t)k * (size_t)n, sizeof(float) * (size_t)n);
                double t0 = cpu_s();
                sum += eng_sampler_sample(s, l, NULL, 0);
                t += cpu_s() - t0;
            }
        uint64_t paths[4], proposals[3];
        eng__sampler_cut_paths(s, paths);
        eng__sampler_proposals(s, proposals);
        printf("vocabulary %d, top_p 0.95 over %d mixed distributions%s: %.1f us per draw (CPU "
               "time, one thread; token sum %ld); proposals kept %llu, refused %llu; cuts found "
               "among the estimate's buckets %llu, above them %llu, below them %llu, from the "
               "exact histogram %llu\n",
               n, n_sets, search ? ", the exact search alone" : "", t * 1e6 / (ROUNDS * n_sets),
               sum, (unsigned long long)proposals[0], (unsigned long long)proposals[1],
               (unsigned long long)paths[0], (unsigned long long)paths[1],
               (unsigned long long)paths[2], (unsigned long long)paths[3]);
        eng_sampler_free(s);
    }
    free(sets);
    free(l);
    return 0;
}
