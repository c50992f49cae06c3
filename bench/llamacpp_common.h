/* llamacpp_common.h - what the bench tools built against llama.cpp
 * (crosscheck_llamacpp.c, golden_llamacpp.c) share: loading a model
 * without llama.cpp's log and the log-softmax of a row of logits. Header-only: each tool is one
 * translation unit compiled by its script. */
#ifndef SPILLWAY_BENCH_LLAMACPP_COMMON_H
#define SPILLWAY_BENCH_LLAMACPP_COMMON_H

#include <math.h>
#include <stdio.h>

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

/* Loads a model with llama.cpp's logging silenced; NULL (and a message)
 * when it cannot. */
static inline struct llama_model *load_quietly(const char *path)
{
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(path, llama_model_default_params());
    if (!model)
        fprintf(stderr, "%s: llama.cpp cannot load it\n", path);
    return model;
}

#endif
