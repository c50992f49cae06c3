/* regex.c - ECMA-262 patterns to a byte DFA (see regex.h for the subset).
 *
 * Three stages, each bounded:
 *  1. A recursive-descent parser builds a small syntax tree; classes are
 *     sorted, merged code point ranges. Nesting is bounded (RE_MAX_DEPTH)
 *     so a pattern cannot exhaust the C stack.
 *  2. A Thompson NFA over bytes, built back to front (every fragment is
 *     emitted knowing the state that follows it, so no patch lists). A
 *     code point range becomes the UTF-8 byte sequences that encode it
 *     (split where the encodings' lengths and prefixes change, so each
 *     sequence is a product of byte ranges). Search semantics come from
 *     an any-character loop before the pattern and after it. ^ and $ are
 *     epsilon edges taken only at the start (when the initial state is
 *     closed) and only at the end (when acceptance is decided).
 *     Bounded by ENG_REGEX_MAX_NFA_STATES: {m,n} copies its operand.
 *  3. Subset construction over byte classes (bytes no NFA range tells
 *     apart share a column), bounded by ENG_REGEX_MAX_STATES and a work
 *     counter, so the exponential cases fail fast with SW_ERANGE. A set
 *     that reaches the trailing loop has matched for good and collapses
 *     into one "matched" state. Then liveness: states from which no
 *     accepting state is reachable become ENG_REGEX_DEAD transitions.
 * No minimization: the bounds are on the unminimized automaton, which is
 * what the construction pays for anyway.
 *
 * Files: regex_parse.c (1), regex_nfa.c (2), regex_dfa.c (3),
 * regex_look.c (lookahead), regex_costs.c (completion costs),
 * regex_intersect.c (intersection, clone), regex_rows.c (an automaton's
 * rows and flags while it is built); regex-impl.h holds what they share. This file: compiling a pattern, and stepping the automaton.
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"

int eng_regex_compile(const char *pattern, size_t len, eng_regex **out, sw_error *err)
{
    re_parser p = {0};
    re_nfa m = {0};
    eng_regex *re = NULL;
    int rc;
    *out = NULL;
    if (!pattern && len)
        return sw_error_set(err, SW_EINVAL, "pattern: NULL");
    p.p = (const uint8_t *)pattern;
    p.len = len;
    p.err = err;
    int32_t root = eng__rx_p_disjunction(&p);
    if (root >= 0 && p.pos < p.len)
        root = eng__rx_p_fail(&p, SW_EINVAL, "unmatched )");
    if (root < 0) {
        rc = p.rc;
        goto fail;
    }
    int32_t match = eng__rx_nfa_add(&m, NS_MATCH, 0, 0, -1, -1);
    int32_t tail = eng__rx_emit_any_star(&m, match);
    int32_t body = eng__rx_emit(&m, &p, root, tail);
    int32_t head = body >= 0 ? eng__rx_emit_any_star(&m, body) : -1;
    if (head < 0) {
        rc = m.rc ? m.rc : SW_EINTERNAL;
        if (rc == SW_EUNSUPPORTED)
            sw_error_set(err, rc, "pattern: a lookahead inside an unbounded repetition "
                                  "(* + {m,})");
        else
            sw_error_set(err, rc,
                         rc == SW_ERANGE ? "pattern too large (more than %d NFA states, a "
                                           "lookahead's automaton past %d states, or more than "
                                           "%d lookaheads with their copies)"
                                         : "pattern: out of memory",
                         ENG_REGEX_MAX_NFA_STATES, ENG_REGEX_MAX_STATES, RE_MAX_LOOKS);
        goto fail;
    }
    re = sw_calloc(1, sizeof *re);
    if (!re) {
        rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
        goto fail;
    }
    rc = eng__rx_dfa_build_all(&m, head, tail, re, true);
    if (rc) {
        sw_error_set(err, rc, rc == SW_ERANGE ? "pattern too large (its automaton passes %d "
                                                "states or the construction's work bound)"
                                              : "pattern: out of memory",
                     ENG_REGEX_MAX_STATES);
        goto fail;
    }
    sw_free(p.nodes);
    sw_free(p.pool.r);
    eng__rx_nfa_free(&m);
    *out = re;
    return SW_OK;
fail:
    sw_free(p.nodes);
    sw_free(p.pool.r);
    eng__rx_nfa_free(&m);
    eng_regex_free(re);
    return rc;
}

int32_t eng_regex_start(const eng_regex *re)
{
    return re->start;
}

int32_t eng_regex_step(const eng_regex *re, int32_t state, uint8_t byte)
{
    return re->trans[(size_t)state * (size_t)re->n_classes + re->class_of[byte]];
}

bool eng_regex_accepting(const eng_regex *re, int32_t state)
{
    return state >= 0 && re->accept[state];
}

bool eng_regex_can_accept(const eng_regex *re, int32_t state)
{
    return state >= 0 && re->live[state];
}

int eng_regex_pending(const eng_regex *re, int32_t state)
{
    return state >= 0 ? re->pend[state] : 0;
}

bool eng_regex_universal(const eng_regex *re, int32_t state)
{
    return state >= 0 && re->universal[state];
}

int32_t eng_regex_n_states(const eng_regex *re)
{
    return re->n_states;
}

bool eng_regex_match(const eng_regex *re, const char *s, size_t n)
{
    int32_t st = re->start;
    for (size_t i = 0; i < n && st >= 0; i++)
        st = eng_regex_step(re, st, (uint8_t)s[i]);
    return eng_regex_accepting(re, st);
}
