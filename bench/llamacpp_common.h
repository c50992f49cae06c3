/* llamacpp_common.h - what the bench tools built against llama.cpp
 * (crosscheck_llamacpp.c, golden_llamacpp.c) share: a silent log callback
 * and the log-softmax of a row of logits. Header-only: each tool is one
 * translation unit compiled by its script. */
#ifndef SPILLWAY_BENCH_LLAMACPP_COMMON_H
#define SPILLWAY_BENCH_LLAMACPP_COMMON_H

#include <math.h>

#include "llama.h"

static inline void quiet_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)level, (void)text, (void)user;
}

/* log-softmax of one row of logits into out. */
static inline void log_probs(const float *logits, int n, double *out)
{
    double max = logits[0], sum = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > max)
            max = logits[i];
    for (int i = 0; i < n; i++)
        sum += exp((double)logits[i] - max);
    double lse = max + log(sum);
    for (int i = 0; i < n; i++)
        out[i] = (double)logits[i] - lse;
}

#endif
