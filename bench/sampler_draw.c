/* sampler_draw.c - what one draw costs: eng_sampler_sample on fixed
 * logits, per mode (greedy, temperature alone, top_k 40, top_p 0.95,
 * min_p 0.05, all at temperature 0.8), in CPU time on one thread (the
 * process's CPU clock, so that a neighbour taking the core does not count),
 * the best of 10 rounds. The logits are normal with a given spread (the
 * wider, the more peaked the distribution), or with --model those of a
 * real decode: STEPS tokens of the model (one thread, tokens drawn with
 * top_p 0.95 at temperature 0.8), each step's logits kept, and the draws
 * go round them. Built and run by bench/sampling.sh; prints figures,
 * asserts nothing.
 *
 *   sampler_draw N_VOCAB SPREAD [ITERS]
 *   sampler_draw --model FILE [STEPS [ITERS]]
 */
#include "engine/model.h"
#include "engine/sampler-impl.h"
#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
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

/* steps rows of the model's logits, a decode of steps tokens after a
 * fixed prompt, into *out (*n_vocab each); 0, or 1 with a message. */
static int model_logits(const char *path, int steps, float **out, int *n_vocab)
{
    sw_error err;
    eng_model *model = NULL;
    eng_context *ctx = NULL;
    if (eng_model_load(path, &model, &err) != SW_OK) {
        fprintf(stderr, "sampler_draw: %s: %s\n", path, err.message);
        return 1;
    }
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = steps + 16;
    cp.n_threads = 1;
    if (eng_context_create(model, &cp, &ctx, &err) != SW_OK) {
        fprintf(stderr, "sampler_draw: context: %s\n", err.message);
        eng_model_free(model);
        return 1;
    }
    const int n = (int)eng_model_hparams(model)->n_vocab;
    eng_sampler_params p = eng_sampler_default_params();
    p.top_k = 0;
    p.min_p = 0.0f;
    p.seed = 7;
    eng_sampler *s = eng_sampler_create(&p, n);
    float *rows = malloc(sizeof(float) * (size_t)n * (size_t)steps);
    float *l = malloc(sizeof(float) * (size_t)n);
    int rc = !s || !rows || !l;
    int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t n_tok = 8;
    for (int k = 0; !rc && k < steps; k++) {
        if (eng_decode(ctx, 0, tokens, n_tok, rows + (size_t)k * (size_t)n, &err) != SW_OK) {
            fprintf(stderr, "sampler_draw: decode: %s\n", err.message);
            rc = 1;
            break;
        }
        memcpy(l, rows + (size_t)k * (size_t)n, sizeof(float) * (size_t)n);
        tokens[0] = eng_sampler_sample(s, l, NULL, 0);
        n_tok = 1;
    }
    free(l);
    eng_sampler_free(s);
    eng_context_free(ctx);
    eng_model_free(model);
    if (rc) {
        free(rows);
        return 1;
    }
    *out = rows;
    *n_vocab = n;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: sampler_draw N_VOCAB SPREAD [ITERS]\n"
                        "       sampler_draw --model FILE [STEPS [ITERS]]\n");
        return 2;
    }
    const bool from_model = strcmp(argv[1], "--model") == 0;
    int n = from_model ? 0 : atoi(argv[1]), iters = argc > 3 ? atoi(argv[3]) : 300;
    int n_rows = from_model ? (argc > 3 ? atoi(argv[3]) : 32) : 1;
    if (from_model)
        iters = argc > 4 ? atoi(argv[4]) : 300;
    double spread = from_model ? 0.0 : atof(argv[2]);
    float *base = NULL;
    if (from_model && (n_rows <= 0 || model_logits(argv[2], n_rows, &base, &n) != 0))
        return n_rows <= 0 ? 2 : 1;
    if (n <= 0 || iters <= 0)
        return 2;
    if (!base)
        base = malloc(sizeof(float) * (size_t)n);
    float *l = malloc(sizeof(float) * (size_t)n);
    if (!base || !l)
        return 1;
    /* a fixed normal sample (Box-Muller on a 64-bit LCG) */
    uint64_t x = 12345;
    for (int i = 0; !from_model && i < n; i++) {
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
            memcpy(l, base + (size_t)(k % n_rows) * (size_t)n, sizeof(float) * (size_t)n);
            __asm__ volatile("" ::"r"(l) : "memory");
        }
        double t = (cpu_s() - t0) / iters;
        copy = t < copy ? t : copy;
    }
    const char *names[] = {"greedy", "temp", "top_k", "top_p", "min_p"};
    double greedy = 0;
    if (from_model)
        printf("vocabulary %d, %d steps of %s: us per draw (CPU time, one thread, the logits' "
               "copy taken out)\n",
               n, n_rows, argv[2]);
    else
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
                memcpy(l, base + (size_t)(k % n_rows) * (size_t)n, sizeof(float) * (size_t)n);
                sum += eng_sampler_sample(s, l, NULL, 0);
            }
            double t = (cpu_s() - t0) / iters;
            best = t < best ? t : best;
        }
        double us = (best - copy) * 1e6;
        if (m == 0)
            greedy = us;
        printf("  %-7s %8.1f us  (+%.1f over greedy; token sum %ld)", names[m], us, us - greedy,
               sum);
        if (m == 3) { /* top-p's proposals (sampler-impl.h) */
            uint64_t proposals[3];
            eng__sampler_proposals(s, proposals);
            printf("  proposals refused: %.1f%%, decided on the exact total: %.1f%%",
                   100.0 * (double)proposals[1] / (double)(proposals[0] + proposals[1]),
                   100.0 * (double)proposals[2] / (double)(proposals[0] + proposals[1]));
        }
        printf("\n");
        eng_sampler_free(s);
    }
    free(base);
    free(l);
    return 0;
}
