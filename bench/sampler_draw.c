/* sampler_draw.c - what one draw costs: eng_sampler_sample on fixed
 * logits, per mode (greedy, temperature alone, top_k 40, top_p 0.95,
 * min_p 0.05, all at temperature 0.8), in CPU time on one thread (the
 * process's CPU clock, so that a neighbour taking the core does not count),
 * the best of 10 rounds. The logits are normal with a given spread (the
 * wider, the more peaked the distribution). Built and run by
 * bench/sampling.sh; prints figures, asserts nothing.
 *
 *   sampler_draw N_VOCAB SPREAD [ITERS]
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: sampler_draw N_VOCAB SPREAD [ITERS]\n");
        return 2;
    }
    int n = atoi(argv[1]), iters = argc > 3 ? atoi(argv[3]) : 300;
    double spread = atof(argv[2]);
    if (n <= 0 || iters <= 0)
        return 2;
    float *base = malloc(sizeof(float) * (size_t)n), *l = malloc(sizeof(float) * (size_t)n);
    if (!base || !l)
        return 1;
    /* a fixed normal sample (Box-Muller on a 64-bit LCG) */
    uint64_t x = 12345;
    for (int i = 0; i < n; i++) {
        double u[2];
        for (int k = 0; k < 2; k++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            u[k] = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
        }
        base[i] = (float)(spread * sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
    }
    /* the copy each draw starts from (the sampler edits its logits) */
    double copy = 1e9;
    for (int r = 0; r < 10; r++) {
        double t0 = cpu_s();
        for (int k = 0; k < iters; k++) {
            memcpy(l, base, sizeof(float) * (size_t)n);
            __asm__ volatile("" ::"r"(l) : "memory");
        }
        double t = (cpu_s() - t0) / iters;
        copy = t < copy ? t : copy;
    }
    const char *names[] = {"greedy", "temp", "top_k", "top_p", "min_p"};
    double greedy = 0;
    printf("vocabulary %d, spread %g: us per draw (CPU time, one thread, the logits' copy "
           "taken out)\n",
           n, spread);
    for (int m = 0; m < 5; m++) {
        eng_sampler_params p = eng_sampler_default_params();
        p.temperature = m ? 0.8f : 0.0f;
        p.top_k = m == 2 ? 40 : 0;
        p.top_p = m == 3 ? 0.95f : 1.0f;
        p.min_p = m == 4 ? 0.05f : 0.0f;
        eng_sampler *s = eng_sampler_create(&p, n);
        if (!s)
            return 1;
        double best = 1e9;
        long sum = 0;
        for (int r = 0; r < 10; r++) {
            double t0 = cpu_s();
            for (int k = 0; k < iters; k++) {
                memcpy(l, base, sizeof(float) * (size_t)n);
                sum += eng_sampler_sample(s, l, NULL, 0);
            }
            double t = (cpu_s() - t0) / iters;
            best = t < best ? t : best;
        }
        double us = (best - copy) * 1e6;
        if (m == 0)
            greedy = us;
        printf("  %-7s %8.1f us  (+%.1f over greedy; token sum %ld)\n", names[m], us, us - greedy,
               sum);
        eng_sampler_free(s);
    }
    free(base);
    free(l);
    return 0;
}
