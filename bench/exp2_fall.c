/* exp2_fall.c - how much eng__sampler_exp2 (sampler.c) can fall as its
 * argument rises, over every float in [-116, 0]: the largest drop of its
 * mass trunc(e * 2^25) below the largest mass at a smaller argument, and
 * the largest relative drop of e below the largest e before it.
 * sampler-impl.h's ENG_SAMPLER_SLACK and ENG_SAMPLER_NEAR rest on these
 * (test_sampler checks runs of consecutive floats in every unit). About
 * 20 s on one core; prints figures, asserts nothing.
 *
 *   cc -O2 -std=c11 -Isrc -o exp2_fall bench/exp2_fall.c \
 *     $(cat build/spillway-libs.txt) -ljansson -lm -lpthread && ./exp2_fall */
#include "engine/sampler-impl.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

int main(void)
{
    float runmax = 0.0f;
    int64_t run_mass = 0, worst_mass = 0;
    double worst_rel = 0.0;
    uint64_t n = 0;
    for (float t = ENG_SAMPLER_EXP2_MIN; t <= 0.0f; t = nextafterf(t, 1.0f), n++) {
        float e = eng__sampler_exp2(t);
        int64_t m = (int64_t)(int32_t)(e * ENG_SAMPLER_MASS_SCALE);
        if (run_mass - m > worst_mass)
            worst_mass = run_mass - m;
        if (runmax > e && ((double)runmax - e) / e > worst_rel)
            worst_rel = ((double)runmax - e) / e;
        run_mass = m > run_mass ? m : run_mass;
        runmax = e > runmax ? e : runmax;
    }
    printf("%llu floats: mass falls by %lld at most (ENG_SAMPLER_SLACK %d), e by %.3g of "
           "itself (1 - ENG_SAMPLER_NEAR %.3g)\n",
           (unsigned long long)n, (long long)worst_mass, ENG_SAMPLER_SLACK, worst_rel,
           1.0 - (double)ENG_SAMPLER_NEAR);
    return 0;
}
