/* testutil.h - helpers shared by the unit tests (cmocka).
 *
 * Paths: ../shared (models and vocabularies with reference outputs) comes
 * from SPILLWAY_SHARED, set by CTest; tests that need it call
 * tu_shared_path(), which skips the test with a clear message when absent;
 * tests/data (SPILLWAY_TEST_DATA) likewise through tu_data_path().
 */
#ifndef SPILLWAY_TESTUTIL_H
#define SPILLWAY_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/generate.h"

/* Full path of a file under ../shared, or NULL after printing
 * "SKIP: ... needs ../shared ..." and marking the test skipped (the caller
 * must return). The string is static storage, valid until the next call. */
const char *tu_shared_path(const char *relative);

/* The same for a file under tests/data (SPILLWAY_TEST_DATA, set by CTest):
 * small reference data committed with the tests, each file's origin in
 * tests/data/README.md. */
const char *tu_data_path(const char *relative);

/* What an eng_generate callback (tu_collect_step, user = a tu_steps
 * zeroed by the caller) saw: the first TU_STEPS_MAX tokens and the whole
 * first step, with its top log-probabilities. */
#define TU_STEPS_MAX 512
typedef struct tu_steps {
    int32_t tokens[TU_STEPS_MAX];
    eng_generate_step first;
    int32_t n;
} tu_steps;
bool tu_collect_step(void *user, const eng_generate_step *step);

/* The ids of a JSON array of integers (a golden file's tokens) in a new
 * buffer (sw_free); *n is the count. */
struct json_t;
int32_t *tu_json_ids(const struct json_t *array, size_t *n);

/* A fresh scratch file path under the build tree (SPILLWAY_TEST_TMP or
 * /tmp) unique to this process; static storage, valid until the next call. */
const char *tu_tmp_path(const char *name);

/* Reads a whole file into a new buffer (sw_free); NULL on error. */
char *tu_read_file(const char *path, size_t *len_out);

/* Path of the spillway binary (SPILLWAY_BIN), or NULL. */
const char *tu_spillway_bin(void);

/* Runs argv (NULL-terminated) and captures stdout into a new buffer (sw_free)
 * and the exit status; returns 0 when it ran. Time-out in seconds. */
int tu_run_capture(char *const argv[], int timeout_s, char **stdout_out, int *exit_status);

/* Tokenizes or fails the test with the tokenizer's message; *ids (sw_free). */
struct eng_tokenizer;
size_t tu_tokenize(const struct eng_tokenizer *tok, const char *text, size_t len, bool add_bos,
                   bool parse_special, int32_t **ids);
/* The index of the largest of v[0..n), the lowest on a tie. */
int32_t tu_argmax(const float *v, int32_t n);
/* Fails the test, printing both sequences, unless they are equal. */
void tu_assert_ids_equal(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want,
                         const char *what);
/* Strict RFC 3629 UTF-8 validation, independent of the engine's decoder. */
bool tu_valid_utf8(const char *s, size_t n);

/* One case of a vocabulary's test vectors (format: ../shared/vocab/README.md). */
typedef struct tu_vocab_case {
    char *text;       /* NUL-terminated copy; len bytes (may hold NULs) */
    size_t len;
    int32_t *ids;     /* the expected token ids */
    size_t n_ids;
} tu_vocab_case;

/* Reads GGUF_PATH.inp and GGUF_PATH.out (fails the test if they are
 * malformed); free with tu_vocab_cases_free. */
tu_vocab_case *tu_vocab_cases_load(const char *gguf_path, size_t *n_out);
void tu_vocab_cases_free(tu_vocab_case *cases, size_t n);

/* The logits (n_vocab floats, sw_free) of the model file at path after a
 * fixed 20-token prompt (positions well past 0, so RoPE acts): an F32 KV
 * cache, 2 threads. For tests that compare two files' arithmetic. */
float *tu_prompt_logits(const char *path, int32_t *n_vocab_out);

/* The constraint tests' vocabulary: the 256 single bytes as tokens 0..255
 * and one end token, 256. Fails the test when it cannot be made. */
struct eng_cs_vocab;
struct eng_cs_vocab *tu_byte_vocab(void);

#endif
