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
 * with a message (a compile refuses only what parses); the mask agrees
 * with feeding (checked on the first 8 states and every 16th after them)
 * and never allows a byte that feeding refuses; complete exactly when the
 * shortest completion is 0 bytes, the end token allowed exactly then;
 * every complete text is in the grammar's language by the parser's
 * reference matcher (short texts: it is exponential in the worst case);
 * with a budget of exactly the shortest completion some token is always
 * allowed and each shrinks it, so the text always completes in time.
 */
#include "engine/constrain.h"
#include "engine/gbnf.h"

#include "fuzzlib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_CANDIDATE 256
#define FZ_MAX_COMPLETION 1024
/* the reference matcher judges texts this short, of grammars this small
 * (its memory is rules x bytes^2 bits) */
#define FZ_MAX_MATCHED 48
#define FZ_MAX_MATCHED_RULES 512
#define FZ_BIG_BUDGET ((int64_t)1 << 40)

static const char *const fz_multi[] = {
    "ab", "abc", "  ", "\n", "()", "[]", "{\"", "\":", "12", "-1", "true", "x y",
    "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x8E\x89", "\xC3",
};
#define FZ_N_MULTI ((int32_t)(sizeof fz_multi / sizeof fz_multi[0]))
#define FZ_N_TOKENS (256 + FZ_N_MULTI + 1)
#define FZ_END_ID (FZ_N_TOKENS - 1)

static bool bit(const uint32_t *mask, int32_t id)
{
    return (mask[id / 32] >> (id % 32)) & 1;
}

typedef struct fz_run {
    const eng_gbnf *ref;
    eng_constraint *c;
    char text[FZ_MAX_CANDIDATE + FZ_MAX_COMPLETION * 8];
    size_t len;
    uint32_t mask[(FZ_N_TOKENS + 31) / 32];
} fz_run;

static void check_state(fz_run *r, bool with_mask)
{
    bool complete = eng_constraint_is_complete(r->c);
    int64_t min = eng_constraint_min_bytes(r->c);
    FZ_CHECK(min >= 0 && complete == (min == 0));
    FZ_CHECK(!eng_constraint_is_closed(r->c) || complete);
    if (with_mask) {
        eng_constraint_mask(r->c, FZ_BIG_BUDGET, r->mask);
        FZ_CHECK(bit(r->mask, FZ_END_ID) == complete);
    }
    if (complete && r->len <= FZ_MAX_MATCHED && eng_gbnf_n_rules(r->ref) <= FZ_MAX_MATCHED_RULES)
        FZ_CHECK(eng_gbnf_match(r->ref, r->text, r->len));
}

static void check_refusals(fz_run *r)
{
    eng_constraint_mask(r->c, FZ_BIG_BUDGET, r->mask);
    for (int b = 0; b < 256; b++) {
        char byte = (char)b;
        if (!bit(r->mask, b))
            FZ_CHECK(!eng_constraint_feed(r->c, &byte, 1));
    }
}

static void walk(fz_run *r, const uint8_t *cand, size_t n)
{
    check_refusals(r);
    bool masked = true;
    check_state(r, masked);
    for (size_t i = 0, fed_bytes = 0; i < n && i < FZ_MAX_CANDIDATE; i++) {
        char byte = (char)cand[i];
        bool fed = eng_constraint_feed(r->c, &byte, 1);
        FZ_CHECK(!masked || fed == bit(r->mask, cand[i]));
        if (!fed)
            continue;
        r->text[r->len++] = byte;
        fed_bytes++;
        masked = fed_bytes < 8 || fed_bytes % 16 == 0;
        check_state(r, masked);
    }
    check_refusals(r);
    check_state(r, true);

    int64_t min = eng_constraint_min_bytes(r->c);
    if (min > FZ_MAX_COMPLETION)
        return;
    uint32_t pick = n ? cand[n - 1] : 0;
    for (int step = 0; !eng_constraint_is_complete(r->c); step++) {
        FZ_CHECK(step < FZ_MAX_COMPLETION);
        int32_t n_allowed = eng_constraint_mask(r->c, min, r->mask);
        FZ_CHECK(n_allowed > 0 && !bit(r->mask, FZ_END_ID));
        int32_t k = (int32_t)((pick = pick * 1103515245u + 12345u) >> 8) % n_allowed, chosen = -1;
        for (int32_t id = 0; id < FZ_N_TOKENS && chosen < 0; id++)
            if (bit(r->mask, id) && k-- == 0)
                chosen = id;
        FZ_CHECK(chosen >= 0 && chosen != FZ_END_ID);
        FZ_CHECK(eng_constraint_accept_token(r->c, chosen));
        const char *piece = chosen < 256 ? (const char[]){(char)chosen} : fz_multi[chosen - 256];
        size_t piece_len = chosen < 256 ? 1 : strlen(fz_multi[chosen - 256]);
        FZ_CHECK(r->len + piece_len <= sizeof r->text);
        memcpy(r->text + r->len, piece, piece_len);
        r->len += piece_len;
        int64_t next = eng_constraint_min_bytes(r->c);
        FZ_CHECK(next <= min - 1);
        min = next;
    }
    check_state(r, true);
    FZ_CHECK(eng_constraint_accept_token(r->c, FZ_END_ID));
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
    memset(&r, 0, sizeof r);
    r.ref = ref;
    if (eng_constraint_create(g, v, &r.c, &err) == SW_OK) {
        FZ_CHECK(eng_constraint_min_bytes(r.c) == eng_grammar_min_bytes(g));
        walk(&r, cand, cand_len);
        eng_constraint_free(r.c);
    }
    eng_grammar_free(g);
    eng_gbnf_free(ref);
    return 0;
}
