/* sampler.h - choosing the next token from the logits.
 *
 * Greedy (temperature 0), temperature, top-k, top-p, min-p, and repetition /
 * presence / frequency penalties over the recent history. Its random stream
 * is counter-based: draw k uses a uniform number that is a pure function of
 * (seed, k), so a generation can be resumed exactly by setting the draw
 * counter. Every call to eng_sampler_sample consumes exactly one draw,
 * greedy included, so "advanced k draws" means "k tokens sampled".
 *
 * Order of operations (sampler.c has the details): NaN -> -inf; logit bias;
 * penalties (also in greedy mode); temperature <= 0: argmax, ties to the lowest id;
 * else top-k -> temperature -> softmax (each candidate's weight relative to
 * the best, from a single-precision exponential that is bit-identical on
 * every instruction set, and its integer mass) -> top-p (a prefix of the
 * tokens by probability descending, ties by id ascending) -> min-p ->
 * renormalise -> pick with draw k's uniform number, walking the kept tokens
 * by id (with top-p, by rejection: proposals from min-p's tokens until
 * one lies in top-p's prefix). Linear time, no sort; all sums are integer
 * sums, so a draw is a
 * pure function of (logits, parameters, seed, k) whatever the machine.
 */
#ifndef SPILLWAY_ENGINE_SAMPLER_H
#define SPILLWAY_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct eng_sampler_params {
    float temperature;       /* <= 0: greedy */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off; llama.cpp semantics */
    int32_t penalty_last_n;  /* tokens of history the penalties look at;
                                0: none, < 0: the whole history */
    float presence_penalty;  /* 0: off; OpenAI semantics */
    float frequency_penalty; /* 0: off; OpenAI semantics */
    uint64_t seed;
    /* OpenAI's logit_bias: bias_values[j] is added to the logit of token
     * bias_ids[j] before anything else (in greedy mode too; a -inf logit,
     * e.g. masked by a constraint, stays -inf). Ids outside the vocabulary
     * are ignored; a repeated id adds up. eng_sampler_create copies them. */
    const int32_t *bias_ids;
    const float *bias_values;
    int32_t n_bias;
} eng_sampler_params;

/* Defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties
 * off, penalty_last_n 64, seed 0. */
eng_sampler_params eng_sampler_default_params(void);

typedef struct eng_sampler eng_sampler;

/* NULL for n_vocab outside [1, 2^23] (sampler.c: its sums stay below 2^64)
 * or when memory runs out. Allocates everything a draw uses. */
eng_sampler *eng_sampler_create(const eng_sampler_params *params, int32_t n_vocab);
void eng_sampler_free(eng_sampler *s);

/* Picks a token from n_vocab logits (which it may modify in place).
 * history: the tokens so far (prompt and generated), for the penalties. */
int32_t eng_sampler_sample(eng_sampler *s, float *logits, const int32_t *history,
                           size_t n_history);

/* Step 1 of eng_sampler_sample on its own (sampler.c documents the order):
 * applies the repetition / presence / frequency penalties of the last
 * penalty_last_n history tokens to logits in place. Exposed so callers that
 * report logprobs and tests can see exactly what the sampler saw. */
void eng_sampler_apply_penalties(eng_sampler *s, float *logits, const int32_t *history,
                                 size_t n_history);

/* Constrained decoding (constrain.h): sets logits[i] to -inf for every id
 * whose bit (i % 32) of allowed[i / 32] is clear, and for ids at or past
 * n_allowed_ids. Sampling afterwards still takes exactly one draw, so a
 * constrained generation resumes exactly like any other. */
void eng_sampler_mask_logits(float *logits, int32_t n_logits, const uint32_t *allowed,
                             int32_t n_allowed_ids);

uint64_t eng_sampler_draws(const eng_sampler *s);
void eng_sampler_set_draws(eng_sampler *s, uint64_t draws);

/* Threads a draw may use: for_each(ctx, n, fn, arg) calls fn(arg, i) for
 * every i in [0, n), on up to n_threads threads, and returns when all are
 * done (e.g. eng_context_parallel_for on a context's pool). */
typedef struct eng_sampler_threads {
    void (*for_each)(void *ctx, int32_t n_items, void (*fn)(void *arg, int32_t item),
                     void *arg);
    void *ctx;
    int32_t n_threads;
} eng_sampler_threads;

/* Lends threads to the draws of s until called again (NULL: none). A draw
 * over at least 16384 candidates then splits its passes over the
 * vocabulary into 2 or 4 chunks, one item each; the token is the same
 * (sums are exact, gathers keep their order). The threads must be free
 * while s draws: not the loop that runs the draw itself. */
void eng_sampler_set_threads(eng_sampler *s, const eng_sampler_threads *threads);

/* The (first) uniform number in [0, 1) of draw k for a seed: the
 * counter-based stream. */
double eng_sampler_uniform(uint64_t seed, uint64_t k);

/* Natural-log softmax of logits into logprobs (n values), numerically stable. */
void eng_log_softmax(const float *logits, float *logprobs, int32_t n);

#endif
