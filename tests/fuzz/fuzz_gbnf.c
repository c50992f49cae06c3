/* fuzz_gbnf.c - libFuzzer harness for GBNF grammars: the parser (gbnf.h),
 * the compiler into the constraint automaton (gbnf_compile.c) and the
 * automaton running it (constrain.h).
 *
 * Input: a grammar, a NUL byte, then candidate bytes, which the automaton
 * is fed (a refused byte is skipped) on a vocabulary of the 256 single
 * bytes, some longer pieces and one end token; afterwards the text is
 * completed under the tightest budget that allows it.
 *
 * Invariants: parsing and compiling are bounded and their errors typed
 * with a message (a compile refuses only what parses); fz_cs_run's
 * (fuzzlib.h): the mask agrees with feeding (checked on a bounded sample
 * of the states) and never allows a byte that feeding
 * refuses; complete exactly when the
 * shortest completion is 0 bytes, the end token allowed exactly then;
 * every complete text is in the grammar's language by the parser's
 * reference matcher (short texts: it is exponential in the worst case);
 * with a budget of exactly the shortest completion some token is always
 * allowed and each shrinks it, so the text always completes in time.
 * The derivative (eng_gbnf_derive) by the first half of the candidate
 * bytes is typed when refused and otherwise parses, and (short texts,
 * small grammars) accepts each longer piece of the candidate exactly when
 * the grammar accepts the half then that piece.
 *
 * Bounded for speed (docs/operations.md, Fuzzing): the fuzz build caps a
 * pattern at 2048 DFA states, 32768 NFA states and 2^22 subset-construction
 * steps (not 8192, 200000 and 2^25), so a larger one is the typed
 * SW_ERANGE, and scripts/fuzz-run.sh gives inputs of at most 1024 bytes;
 * a text is completed only when its shortest completion is at most
 * FZ_MAX_COMPLETION bytes (256: one mask per byte, and the longer ones
 * were half of the harness's time; their steps run the same code).
 */
#include "grammar/constrain.h"
#include "grammar/gbnf.h"

#include "fuzzlib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_CANDIDATE 256
#define FZ_MAX_COMPLETION 256
/* the reference matcher judges texts this short, of grammars this small
 * (its memory is rules x bytes^2 bits) */
#define FZ_MAX_MATCHED 48
#define FZ_MAX_MATCHED_RULES 512

static const char *const fz_multi[] = {
    "ab", "abc", "  ", "\n", "()", "[]", "{\"", "\":", "12", "-1", "true", "x y",
    "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x8E\x89", "\xC3",
};
#define FZ_N_MULTI ((int32_t)(sizeof fz_multi / sizeof fz_multi[0]))
#define FZ_N_TOKENS (256 + FZ_N_MULTI + 1)
#define FZ_END_ID (FZ_N_TOKENS - 1)

typedef struct fz_run {
    const eng_gbnf *ref;
    fz_cs_walk w;
    char text[FZ_MAX_CANDIDATE + FZ_MAX_COMPLETION * 8];
    uint32_t mask[(FZ_N_TOKENS + 31) / 32];
} fz_run;

/* A complete text is in the language (judged where the matcher is cheap). */
static void check_text(const fz_cs_walk *w)
{
    const fz_run *r = w->user;
    if (w->len <= FZ_MAX_MATCHED && eng_gbnf_n_rules(r->ref) <= FZ_MAX_MATCHED_RULES)
        FZ_CHECK(eng_gbnf_match(r->ref, w->text, w->len));
}

/* The derivative by the candidate's first half, against the matcher. */
static void check_derivative(const eng_gbnf *ref, const uint8_t *cand, size_t cand_len)
{
    size_t half = cand_len / 2;
    char *text = NULL;
    sw_error err;
    int rc = eng_gbnf_derive(ref, (const char *)cand, half, &text, &err);
    if (rc != SW_OK) {
        FZ_CHECK(rc == SW_EINVAL || rc == SW_ERANGE || rc == SW_ENOMEM);
        FZ_CHECK(err.code == rc && err.message[0] && !text);
        return;
    }
    eng_gbnf *d = NULL;
    rc = eng_gbnf_parse(text, strlen(text), &d, &err);
    FZ_CHECK(rc == SW_OK || rc == SW_ERANGE || rc == SW_ENOMEM);
    if (d && cand_len <= FZ_MAX_MATCHED && eng_gbnf_n_rules(ref) <= FZ_MAX_MATCHED_RULES &&
        eng_gbnf_n_rules(d) <= FZ_MAX_MATCHED_RULES)
        for (size_t end = half; end <= cand_len; end++)
            FZ_CHECK(eng_gbnf_match(d, (const char *)cand + half, end - half) ==
                     eng_gbnf_match(ref, (const char *)cand, end));
    eng_gbnf_free(d);
    sw_free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fz_run r;
    const eng_cs_vocab *v = fz_byte_vocab(fz_multi, FZ_N_MULTI);
    if (!v)
        return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t gr_len = nul ? (size_t)(nul - data) : size;
    const uint8_t *cand = nul ? nul + 1 : data + size;
    size_t cand_len = (size_t)(data + size - cand);

    eng_gbnf *ref = NULL;
    sw_error err;
    int rc = eng_gbnf_parse((const char *)data, gr_len, &ref, &err);
    if (rc != SW_OK) {
        FZ_CHECK(rc == SW_EINVAL || rc == SW_ERANGE || rc == SW_ENOMEM);
        FZ_CHECK(err.code == rc && err.message[0] && !ref);
        eng_grammar *g = NULL;
        FZ_CHECK(eng_grammar_from_gbnf((const char *)data, gr_len, &g, &err) == rc && !g);
        return 0;
    }
    eng_grammar *g = NULL;
    rc = eng_grammar_from_gbnf((const char *)data, gr_len, &g, &err);
    if (rc != SW_OK) {
        FZ_CHECK(rc == SW_EINVAL || rc == SW_ERANGE || rc == SW_ENOMEM);
        FZ_CHECK(err.code == rc && err.message[0] && !g);
        eng_gbnf_free(ref);
        return 0;
    }
    check_derivative(ref, cand, cand_len);
    memset(&r, 0, sizeof r);
    r.ref = ref;
    r.w = (fz_cs_walk){NULL,          fz_multi, FZ_N_TOKENS, FZ_END_ID, r.text, 0,
                       sizeof r.text, r.mask,   check_text,  &r};
    if (eng_constraint_create(g, v, &r.w.c, &err) == SW_OK) {
        FZ_CHECK(eng_constraint_min_bytes(r.w.c) == eng_grammar_min_bytes(g));
        fz_cs_run(&r.w, cand, cand_len, FZ_MAX_CANDIDATE, FZ_MAX_COMPLETION);
        eng_constraint_free(r.w.c);
    }
    eng_grammar_free(g);
    eng_gbnf_free(ref);
    return 0;
}
