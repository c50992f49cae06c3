/* quant_testutil.h - helpers shared by the tests of the weight types and
 * CPU kernels (test_quant.c for the older types, test_quant_more.c for
 * Q3_K, Q2_K, IQ4_XS, IQ4_NL) and of made models (test_model_make.c), so
 * that each check is written once.
 *
 * Expected values stay independent of quant/quant.c: the random numbers
 * and the half decoder are written here from their definitions; the
 * matmul check compares the kernels against the scalar reference with a
 * tolerance the caller computes from its own block decoder.
 */
#ifndef SPILLWAY_QUANT_TESTUTIL_H
#define SPILLWAY_QUANT_TESTUTIL_H

#include "modelgen/model_make.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct eng_model;

/* xorshift64 on *state (never 0): each test file keeps its own state, so
 * its sequence does not depend on what other files draw. */
uint64_t qtu_rand(uint64_t *state);
/* uniform in [-1, 1), from qtu_rand */
float qtu_randf(uint64_t *state);

/* An independent half decoder: value = (-1)^s * 2^(e-15) * (1 + m/1024);
 * subnormals, infinities and NaN too. */
double qtu_half_value(uint16_t h);

/* How many kernel levels this machine has (levels 0..best); leaves the
 * best one forced, as cpu_kernels_force_isa(CPU_ISA_AMX) does. */
int qtu_n_isa(void);

/* What a test expects eng_type_traits_get(id) to say. */
typedef struct qtu_traits_row {
    uint32_t id;
    const char *name;
    int64_t block_size;
    size_t block_bytes;
    bool supported;
} qtu_traits_row;

/* Fails the test unless each of the n rows is what eng_type_traits_get
 * says of its id. */
void qtu_check_traits(const qtu_traits_row *rows, size_t n);

/* sum_i |w_i x_i| of the reference dot product of one weight row and one
 * row of activations (eng_vec_dot_type), by the caller's own decoder. */
typedef double (*qtu_abs_terms_fn)(uint32_t type, int64_t n, const void *w, const void *x);

/* cpu_matmul_rows at every level against eng_vec_dot_ref, for rows
 * [r0, r1) of w (rows w_row_bytes apart, at least r1 of them) and n_tokens
 * rows of activations x (x_stride floats apart): the activations convert
 * bit-exactly to eng_quantize_row's; every result is within
 * 1e-5 * abs_terms + 1e-30 of the reference; y outside [r0, r1) (y_stride
 * >= r1) stays untouched; cpu_vec_dot agrees too (first row and
 * token). no_allocs: the products must not allocate. Ends with the best
 * level forced. */
void qtu_check_matmul(uint32_t type, const void *w, size_t w_row_bytes, int64_t n_in,
                      const float *x, int64_t x_stride, int64_t n_tokens, int64_t y_stride,
                      int64_t r0, int64_t r1, qtu_abs_terms_fn abs_terms, bool no_allocs);

/* Fills n_out weight rows of type (w_row_bytes each) and n_x activations
 * (max_tokens rows of n_in floats) with the caller's test data. */
typedef void (*qtu_fill_fn)(uint32_t type, unsigned char *w, size_t w_row_bytes, int64_t n_out,
                            int64_t n_in, float *x, int64_t n_x);

/* cpu_matmul_rows_per_token at every level, for each of the n_types types
 * (fresh data from fill for every level and type, in that order): for
 * call sizes 2, 2 + step, ... up to max_tokens, every token's n_out
 * results are bit for bit those of a one-token call. Ends with the best
 * level forced. */
void qtu_check_per_token(const uint32_t *types, size_t n_types, int64_t n_in, int64_t n_out,
                         int64_t max_tokens, int64_t step, qtu_fill_fn fill);

/* Greedy decoding of n_gen tokens after a prompt (one call: the prefill
 * path) in a fresh context of 64 positions; the logits after the prompt
 * go to first_logits (n_vocab floats). */
void qtu_greedy(struct eng_model *model, const int32_t *prompt, int32_t n_prompt, int32_t n_gen,
                int32_t *out, float *first_logits);

/* Pearson correlation of a and b (n values). */
double qtu_correlation(const float *a, const float *b, int32_t n);

/* The small model the model tests make: 256 wide, 4 heads (2 of K/V), a
 * vocabulary of 600; n_layer layers, FFN width n_ff, weights weight_type;
 * the rest eng_model_make_default_params's. */
eng_model_make_params qtu_small_model_params(int32_t n_layer, int32_t n_ff, uint32_t weight_type);

/* The type a mix's rule gives the matrix blk.LAYER.WHAT (layer -1, what ""
 * for a matrix outside the blocks other than output.weight). */
typedef uint32_t (*qtu_mix_rule_fn)(int layer, const char *what, const void *arg);

/* Makes the model of params at path (failing the test on an error) and
 * checks every tensor's type: F32 for 1-D tensors, Q6_K for output.weight
 * (every mix keeps it there), rule(layer, what, arg) for the others.
 * Returns how many tensors are Q6_K; the file stays. */
int qtu_make_check_types(const eng_model_make_params *params, const char *path,
                         qtu_mix_rule_fn rule, const void *arg);

#endif
