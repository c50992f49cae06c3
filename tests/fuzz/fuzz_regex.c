/* fuzz_regex.c - libFuzzer harness for the regular-expression compiler
 * (regex.h: ECMA-262 patterns to a byte DFA) and what is built on its
 * automata: completion costs, copies and intersections.
 *
 * Input: a pattern, a NUL byte, then a candidate string.
 *
 * Invariants: compiling is bounded (no hang, no abort: the harness's time
 * and memory limits catch the rest) and an error is typed (SW_EINVAL,
 * SW_EUNSUPPORTED, SW_ERANGE, SW_ENOMEM) with a message; every state step()
 * returns can still reach a match; stepping the candidate's bytes agrees
 * with eng_regex_match on every prefix; a universal state is accepting
 * and stays universal on any well-formed continuation byte; pending()
 * counts the UTF-8 continuation bytes a state still needs; the completion
 * cost is known exactly where a match is reachable and 0 where the state
 * accepts; a clone has the same states; the intersection with a fixed
 * pattern matches exactly what both match.
 *
 * Bounded for speed (docs/operations.md, Fuzzing): the fuzz build caps a
 * pattern at 2048 DFA states, 32768 NFA states and 2^22 subset-construction
 * steps (not 8192, 200000 and 2^25), so a larger one is the typed
 * SW_ERANGE, and scripts/fuzz-run.sh gives inputs of at most 1024 bytes.
 */
#include "grammar/regex.h"

#include "fuzzlib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_CANDIDATE 256

static const eng_regex *fz_fixed(void)
{
    static eng_regex *re;
    static bool tried;
    if (!tried) {
        tried = true;
        if (eng_regex_compile("^[a-m0-9\\u00e9]*$", 17, &re, NULL))
            re = NULL;
    }
    return re;
}

static void check_walk(const eng_regex *re, const eng_regex_costs *costs, const uint8_t *cand,
                       size_t n)
{
    int32_t st = eng_regex_start(re);
    FZ_CHECK(eng_regex_pending(re, st) == 0);
    FZ_CHECK(eng_regex_can_accept(re, st) == (eng_regex_costs_get(costs, st, 0) >= 0));
    for (size_t i = 0; i < n && i < FZ_MAX_CANDIDATE; i++) {
        int32_t next = eng_regex_step(re, st, cand[i]);
        if (next == ENG_REGEX_DEAD) {
            FZ_CHECK(!eng_regex_universal(re, st) || eng_regex_pending(re, st) > 0 ||
                     cand[i] >= 0x80);
            return;
        }
        FZ_CHECK(next >= 0 && next < eng_regex_n_states(re));
        FZ_CHECK(eng_regex_can_accept(re, next));
        int64_t cost = eng_regex_costs_get(costs, next, 0);
        FZ_CHECK(cost >= 0 && (cost == 0) == eng_regex_accepting(re, next));
        FZ_CHECK(!eng_regex_universal(re, next) || eng_regex_accepting(re, next));
        /* an ASCII byte after a universal state between code points keeps it */
        if (eng_regex_universal(re, st) && eng_regex_pending(re, st) == 0 && cand[i] < 0x80)
            FZ_CHECK(eng_regex_universal(re, next));
        if (cand[i] >= 0xC2 && cand[i] <= 0xF4)
            FZ_CHECK(eng_regex_pending(re, next) > 0);
        st = next;
        FZ_CHECK(eng_regex_accepting(re, st) == eng_regex_match(re, (const char *)cand, i + 1));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t ones[256];
    if (!ones[0])
        memset(ones, 1, sizeof ones);
    const uint8_t *nul = memchr(data, 0, size);
    size_t pat_len = nul ? (size_t)(nul - data) : size;
    const uint8_t *cand = nul ? nul + 1 : data + size;
    size_t cand_len = (size_t)(data + size - cand);

    eng_regex *re = NULL;
    sw_error err;
    int rc = eng_regex_compile((const char *)data, pat_len, &re, &err);
    if (rc != SW_OK) {
        FZ_CHECK(rc == SW_EINVAL || rc == SW_EUNSUPPORTED || rc == SW_ERANGE || rc == SW_ENOMEM);
        FZ_CHECK(err.code == rc && err.message[0] && !re);
        return 0;
    }
    FZ_CHECK(eng_regex_n_states(re) > 0 && eng_regex_n_states(re) <= ENG_REGEX_MAX_STATES);
    eng_regex_costs *costs = NULL;
    if (eng_regex_costs_build(re, ones, 0, INT32_MAX, &costs, &err) == SW_OK) {
        check_walk(re, costs, cand, cand_len);
        eng_regex_costs_free(costs);
    }
    eng_regex *copy = NULL;
    if (eng_regex_clone(re, &copy, &err) == SW_OK) {
        FZ_CHECK(eng_regex_n_states(copy) == eng_regex_n_states(re));
        eng_regex_free(copy);
    }
    const eng_regex *fixed = fz_fixed();
    eng_regex *both = NULL;
    if (fixed && eng_regex_intersect(re, fixed, &both, &err) == SW_OK) {
        size_t n = cand_len < FZ_MAX_CANDIDATE ? cand_len : FZ_MAX_CANDIDATE;
        for (size_t k = 0; k <= n; k += 1 + k / 4)
            FZ_CHECK(eng_regex_match(both, (const char *)cand, k) ==
                     (eng_regex_match(re, (const char *)cand, k) &&
                      eng_regex_match(fixed, (const char *)cand, k)));
        eng_regex_free(both);
    }
    eng_regex_free(re);
    return 0;
}
