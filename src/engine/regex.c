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
 */
#include "engine/regex.h"

#include "common/alloc.h"
#include "engine/unicode_tables.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define RE_MAX_DEPTH 128
#define RE_MAX_COUNT 100000     /* largest {m,n} bound */
#define RE_WORK_MAX (1L << 25)  /* NFA states visited by the subset construction */
#define RE_MAX_CP 0x10FFFFu

/* ---- code point sets --------------------------------------------------- */

typedef struct re_range {
    uint32_t lo, hi;
} re_range;

typedef struct re_set {
    re_range *r;
    int32_t n, cap;
} re_set;

static int set_add(re_set *s, uint32_t lo, uint32_t hi)
{
    if (s->n == s->cap) {
        int32_t cap = s->cap ? s->cap * 2 : 8;
        if (cap > (1 << 20))
            return SW_ERANGE;
        re_range *r = sw_realloc(s->r, (size_t)cap * sizeof *r);
        if (!r)
            return SW_ENOMEM;
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n++] = (re_range){lo, hi};
    return SW_OK;
}

static int range_cmp(const void *pa, const void *pb)
{
    const re_range *a = pa, *b = pb;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Sorts and merges overlapping or adjacent ranges. */
static void set_normalize(re_set *s)
{
    if (s->n < 2)
        return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, range_cmp);
    int32_t w = 0;
    for (int32_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[w].hi + 1) {
            if (s->r[i].hi > s->r[w].hi)
                s->r[w].hi = s->r[i].hi;
        } else {
            s->r[++w] = s->r[i];
        }
    }
    s->n = w + 1;
}

/* Complement within 0..U+10FFFF; s must be normalized. */
static int set_negate(re_set *s)
{
    re_set out = {0};
    uint32_t next = 0;
    int rc = SW_OK;
    for (int32_t i = 0; i < s->n && !rc; i++) {
        if (s->r[i].lo > next)
            rc = set_add(&out, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (!rc && next <= RE_MAX_CP)
        rc = set_add(&out, next, RE_MAX_CP);
    if (rc) {
        sw_free(out.r);
        return rc;
    }
    sw_free(s->r);
    *s = out;
    return SW_OK;
}

static int set_add_table(re_set *s, const eng_unicode_range *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = set_add(s, t[i].first, t[i].last);
        if (rc)
            return rc;
    }
    return SW_OK;
}

/* ECMA-262 WhiteSpace and LineTerminator (what \s matches). */
static int set_add_space(re_set *s)
{
    static const re_range sp[] = {
        {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
        {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
        {0x3000, 0x3000}, {0xFEFF, 0xFEFF},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        int rc = set_add(s, sp[i].lo, sp[i].hi);
        if (rc)
            return rc;
    }
    return SW_OK;
}

static int set_add_word(re_set *s)
{
    int rc = set_add(s, '0', '9');
    if (!rc)
        rc = set_add(s, 'A', 'Z');
    if (!rc)
        rc = set_add(s, '_', '_');
    if (!rc)
        rc = set_add(s, 'a', 'z');
    return rc;
}

/* ---- the syntax tree ---------------------------------------------------- */

enum { A_EMPTY, A_SET, A_CAT, A_ALT, A_REP, A_BOL, A_EOL };

typedef struct re_ast {
    uint8_t kind;
    int32_t first, last; /* A_CAT, A_ALT, A_REP: children (linked by next) */
    int32_t next;
    int32_t n_children;
    int32_t min, max;    /* A_REP: max -1 = unbounded */
    int32_t set_off, set_n; /* A_SET: ranges in the parser's pool */
} re_ast;

typedef struct re_parser {
    const uint8_t *p;
    size_t len, pos;
    re_ast *nodes;
    int32_t n_nodes, cap_nodes;
    re_set pool; /* every class's ranges, normalized, back to back */
    int depth;
    int rc;
    sw_error *err;
} re_parser;

static int32_t p_fail(re_parser *p, int code, const char *what)
{
    if (!p->rc) {
        p->rc = code;
        sw_error_set(p->err, code, "pattern: %s at offset %zu", what, p->pos);
    }
    return -1;
}

static int32_t p_node(re_parser *p, uint8_t kind)
{
    if (p->n_nodes == p->cap_nodes) {
        int32_t cap = p->cap_nodes ? p->cap_nodes * 2 : 32;
        if (cap > ENG_REGEX_MAX_NFA_STATES)
            return p_fail(p, SW_ERANGE, "pattern too large");
        re_ast *n = sw_realloc(p->nodes, (size_t)cap * sizeof *n);
        if (!n)
            return p_fail(p, SW_ENOMEM, "out of memory");
        p->nodes = n;
        p->cap_nodes = cap;
    }
    int32_t id = p->n_nodes++;
    memset(&p->nodes[id], 0, sizeof p->nodes[id]);
    p->nodes[id].kind = kind;
    p->nodes[id].first = p->nodes[id].last = p->nodes[id].next = -1;
    return id;
}

static void p_append(re_parser *p, int32_t parent, int32_t child)
{
    re_ast *a = &p->nodes[parent];
    if (a->last < 0)
        a->first = child;
    else
        p->nodes[a->last].next = child;
    a->last = child;
    a->n_children++;
}

/* A set node from s (consumed: freed here). */
static int32_t p_set_node(re_parser *p, re_set *s, bool negate)
{
    set_normalize(s);
    int rc = negate ? set_negate(s) : SW_OK;
    int32_t id = -1;
    if (rc) {
        p_fail(p, rc, rc == SW_ENOMEM ? "out of memory" : "class too large");
        goto done;
    }
    if ((id = p_node(p, A_SET)) < 0)
        goto done;
    p->nodes[id].set_off = p->pool.n;
    p->nodes[id].set_n = s->n;
    for (int32_t i = 0; i < s->n; i++) {
        if ((rc = set_add(&p->pool, s->r[i].lo, s->r[i].hi))) {
            id = p_fail(p, rc, rc == SW_ENOMEM ? "out of memory" : "pattern too large");
            goto done;
        }
    }
done:
    sw_free(s->r);
    memset(s, 0, sizeof *s);
    return id;
}

static int32_t p_char_node(re_parser *p, uint32_t cp)
{
    re_set s = {0};
    if (set_add(&s, cp, cp))
        return p_fail(p, SW_ENOMEM, "out of memory");
    return p_set_node(p, &s, false);
}

static bool p_eat(re_parser *p, char c)
{
    if (p->pos < p->len && p->p[p->pos] == (uint8_t)c) {
        p->pos++;
        return true;
    }
    return false;
}

static int p_peek(const re_parser *p)
{
    return p->pos < p->len ? p->p[p->pos] : -1;
}

/* One UTF-8 code point of the pattern text; -1 (and an error) if malformed. */
static int64_t p_utf8(re_parser *p)
{
    const uint8_t *s = p->p + p->pos;
    size_t avail = p->len - p->pos;
    uint32_t c = s[0], cp;
    size_t k;
    if (c < 0x80) {
        p->pos++;
        return c;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        k = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        cp = c & 0x07;
    } else {
        return p_fail(p, SW_EINVAL, "invalid UTF-8");
    }
    if (avail < k)
        return p_fail(p, SW_EINVAL, "invalid UTF-8");
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return p_fail(p, SW_EINVAL, "invalid UTF-8");
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > RE_MAX_CP)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return p_fail(p, SW_EINVAL, "invalid UTF-8");
    p->pos += k;
    return cp;
}

static int hex_val(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* n hex digits; -1 when they are not there (nothing consumed). */
static int64_t p_hex(re_parser *p, int n)
{
    if (p->len - p->pos < (size_t)n)
        return -1;
    int64_t v = 0;
    for (int i = 0; i < n; i++) {
        int h = hex_val(p->p[p->pos + (size_t)i]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    p->pos += (size_t)n;
    return v;
}

/* \u escapes after the "\u": HHHH (a surrogate pair written as two
 * escapes is one code point) or {H...}. */
static int64_t p_unicode_escape(re_parser *p)
{
    if (p_eat(p, '{')) {
        int64_t v = 0;
        int digits = 0;
        while (hex_val(p_peek(p)) >= 0) {
            v = v * 16 + hex_val(p->p[p->pos++]);
            if (v > RE_MAX_CP)
                return p_fail(p, SW_EINVAL, "\\u{...} beyond U+10FFFF");
            digits++;
        }
        if (!digits || !p_eat(p, '}'))
            return p_fail(p, SW_EINVAL, "malformed \\u{...} escape");
        if (v >= 0xD800 && v <= 0xDFFF)
            return p_fail(p, SW_EUNSUPPORTED, "a lone surrogate");
        return v;
    }
    int64_t v = p_hex(p, 4);
    if (v < 0)
        return p_fail(p, SW_EINVAL, "malformed \\u escape");
    if (v >= 0xD800 && v <= 0xDBFF && p->len - p->pos >= 6 && p->p[p->pos] == '\\' &&
        p->p[p->pos + 1] == 'u') {
        size_t save = p->pos;
        p->pos += 2;
        int64_t lo = p_hex(p, 4);
        if (lo >= 0xDC00 && lo <= 0xDFFF)
            return 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        p->pos = save;
    }
    if (v >= 0xD800 && v <= 0xDFFF)
        return p_fail(p, SW_EUNSUPPORTED, "a lone surrogate");
    return v;
}

/* \p{...} / \P{...} after the letter: the categories unicode_tables.h has. */
static int p_property(re_parser *p, re_set *s, bool negate)
{
    if (!p_eat(p, '{'))
        return p_fail(p, SW_EINVAL, "\\p needs {name}"), -1;
    size_t start = p->pos;
    while (p->pos < p->len && p->p[p->pos] != '}')
        p->pos++;
    if (p->pos >= p->len)
        return p_fail(p, SW_EINVAL, "unterminated \\p{"), -1;
    const char *name = (const char *)p->p + start;
    size_t n = p->pos - start;
    p->pos++;
#define RE_IS(lit) (n == sizeof(lit) - 1 && memcmp(name, lit, n) == 0)
    int rc;
    if (RE_IS("L") || RE_IS("Letter") || RE_IS("gc=L") || RE_IS("General_Category=Letter"))
        rc = set_add_table(s, eng_unicode_letters, eng_unicode_letters_count);
    else if (RE_IS("N") || RE_IS("Number") || RE_IS("gc=N") ||
             RE_IS("General_Category=Number"))
        rc = set_add_table(s, eng_unicode_numbers, eng_unicode_numbers_count);
    else
        return p_fail(p, SW_EUNSUPPORTED, "this Unicode property (only L and N)"), -1;
#undef RE_IS
    if (rc)
        return p_fail(p, rc, "out of memory"), -1;
    if (negate) {
        set_normalize(s);
        if ((rc = set_negate(s)))
            return p_fail(p, rc, "out of memory"), -1;
    }
    return 0;
}

/* An escape after the backslash. Returns 0 with *cp for a character, 1
 * with s filled for a class, -1 on error. */
static int p_escape(re_parser *p, bool in_class, re_set *s, uint32_t *cp)
{
    if (p->pos >= p->len)
        return p_fail(p, SW_EINVAL, "trailing backslash"), -1;
    int c = p->p[p->pos++];
    int rc = SW_OK;
    switch (c) {
    case 'd': case 'D':
        rc = set_add(s, '0', '9');
        goto cls;
    case 'w': case 'W':
        rc = set_add_word(s);
        goto cls;
    case 's': case 'S':
        rc = set_add_space(s);
        goto cls;
    case 'p': case 'P':
        return p_property(p, s, c == 'P') < 0 ? -1 : 1;
    case 't': *cp = 9; return 0;
    case 'n': *cp = 10; return 0;
    case 'v': *cp = 11; return 0;
    case 'f': *cp = 12; return 0;
    case 'r': *cp = 13; return 0;
    case 'c': {
        int l = p_peek(p);
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')))
            return p_fail(p, SW_EINVAL, "\\c needs a letter"), -1;
        p->pos++;
        *cp = (uint32_t)(l % 32);
        return 0;
    }
    case '0':
        if (p_peek(p) >= '0' && p_peek(p) <= '9')
            return p_fail(p, SW_EUNSUPPORTED, "legacy octal escapes"), -1;
        *cp = 0;
        return 0;
    case 'x': {
        int64_t v = p_hex(p, 2);
        if (v < 0)
            return p_fail(p, SW_EINVAL, "malformed \\x escape"), -1;
        *cp = (uint32_t)v;
        return 0;
    }
    case 'u': {
        int64_t v = p_unicode_escape(p);
        if (v < 0)
            return -1;
        *cp = (uint32_t)v;
        return 0;
    }
    case 'b':
        if (in_class) {
            *cp = 8;
            return 0;
        }
        return p_fail(p, SW_EUNSUPPORTED, "word boundaries (\\b)"), -1;
    case 'B':
        return p_fail(p, SW_EUNSUPPORTED, "word boundaries (\\B)"), -1;
    case 'k':
        return p_fail(p, SW_EUNSUPPORTED, "backreferences (\\k)"), -1;
    case '-':
        *cp = '-';
        return 0;
    default:
        break;
    }
    if (c >= '1' && c <= '9')
        return p_fail(p, SW_EUNSUPPORTED, "backreferences"), -1;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return p_fail(p, SW_EINVAL, "unknown escape"), -1;
    /* An identity escape: the character itself. */
    p->pos--;
    int64_t v = p_utf8(p);
    if (v < 0)
        return -1;
    *cp = (uint32_t)v;
    return 0;
cls:
    if (rc)
        return p_fail(p, rc, "out of memory"), -1;
    if (c >= 'A' && c <= 'Z') {
        set_normalize(s);
        if ((rc = set_negate(s)))
            return p_fail(p, rc, "out of memory"), -1;
    }
    return 1;
}

/* One class atom: 0 with *cp, 1 with a set added to s, -1 on error. */
static int p_class_atom(re_parser *p, re_set *s, uint32_t *cp)
{
    if (p_eat(p, '\\')) {
        re_set tmp = {0};
        int r = p_escape(p, true, &tmp, cp);
        if (r == 1) {
            for (int32_t i = 0; i < tmp.n; i++)
                if (set_add(s, tmp.r[i].lo, tmp.r[i].hi)) {
                    sw_free(tmp.r);
                    return p_fail(p, SW_ENOMEM, "out of memory"), -1;
                }
        }
        sw_free(tmp.r);
        return r;
    }
    int64_t v = p_utf8(p);
    if (v < 0)
        return -1;
    *cp = (uint32_t)v;
    return 0;
}

static int32_t p_class(re_parser *p)
{
    bool negate = p_eat(p, '^');
    re_set s = {0};
    for (;;) {
        if (p->pos >= p->len) {
            sw_free(s.r);
            return p_fail(p, SW_EINVAL, "unterminated character class");
        }
        if (p_eat(p, ']'))
            break;
        uint32_t a, b;
        int ra = p_class_atom(p, &s, &a);
        if (ra < 0)
            goto fail;
        if (p->pos + 1 < p->len && p->p[p->pos] == '-' && p->p[p->pos + 1] != ']') {
            p->pos++;
            int rb = p_class_atom(p, &s, &b);
            if (rb < 0)
                goto fail;
            if (ra == 1 || rb == 1) {
                /* Annex B: [\d-z] is \d, '-' and z. */
                if ((ra == 0 && set_add(&s, a, a)) || set_add(&s, '-', '-') ||
                    (rb == 0 && set_add(&s, b, b)))
                    goto oom;
                continue;
            }
            if (a > b) {
                sw_free(s.r);
                return p_fail(p, SW_EINVAL, "class range out of order");
            }
            if (set_add(&s, a, b))
                goto oom;
        } else if (ra == 0 && set_add(&s, a, a)) {
            goto oom;
        }
    }
    return p_set_node(p, &s, negate);
oom:
    p_fail(p, SW_ENOMEM, "out of memory");
fail:
    sw_free(s.r);
    return -1;
}

/* "{m}", "{m,}" or "{m,n}" at pos: true (consumed) with the bounds; false
 * (nothing consumed) when the brace does not start a quantifier. */
static bool p_braces(re_parser *p, int64_t *min, int64_t *max)
{
    size_t save = p->pos;
    if (!p_eat(p, '{'))
        return false;
    int64_t a = 0, b;
    int digits = 0;
    while (p_peek(p) >= '0' && p_peek(p) <= '9') {
        a = a * 10 + (p->p[p->pos++] - '0');
        if (a > INT32_MAX)
            a = INT32_MAX;
        digits++;
    }
    if (!digits)
        goto no;
    b = a;
    if (p_eat(p, ',')) {
        b = -1;
        if (p_peek(p) >= '0' && p_peek(p) <= '9') {
            b = 0;
            while (p_peek(p) >= '0' && p_peek(p) <= '9') {
                b = b * 10 + (p->p[p->pos++] - '0');
                if (b > INT32_MAX)
                    b = INT32_MAX;
            }
        }
    }
    if (!p_eat(p, '}'))
        goto no;
    *min = a;
    *max = b;
    return true;
no:
    p->pos = save;
    return false;
}

static int32_t p_disjunction(re_parser *p);

static int32_t p_atom(re_parser *p)
{
    int c = p_peek(p);
    int64_t qa, qb;
    switch (c) {
    case '^':
        p->pos++;
        return p_node(p, A_BOL);
    case '$':
        p->pos++;
        return p_node(p, A_EOL);
    case '*': case '+': case '?':
        return p_fail(p, SW_EINVAL, "nothing to repeat");
    case '{':
        if (p_braces(p, &qa, &qb))
            return p_fail(p, SW_EINVAL, "nothing to repeat");
        p->pos++;
        return p_char_node(p, '{');
    case '.': {
        p->pos++;
        re_set s = {0};
        if (set_add(&s, '\n', '\n') || set_add(&s, '\r', '\r') || set_add(&s, 0x2028, 0x2029)) {
            sw_free(s.r);
            return p_fail(p, SW_ENOMEM, "out of memory");
        }
        return p_set_node(p, &s, true);
    }
    case '[':
        p->pos++;
        return p_class(p);
    case '(': {
        p->pos++;
        if (p_eat(p, '?')) {
            if (p_eat(p, ':')) {
                /* a non-capturing group */
            } else if (p_peek(p) == '=' || p_peek(p) == '!') {
                return p_fail(p, SW_EUNSUPPORTED, "lookahead");
            } else if (p_eat(p, '<')) {
                if (p_peek(p) == '=' || p_peek(p) == '!')
                    return p_fail(p, SW_EUNSUPPORTED, "lookbehind");
                int n = 0;
                while (p->pos < p->len && p->p[p->pos] != '>') {
                    int ch = p->p[p->pos];
                    if (!(ch == '_' || ch == '$' || ch >= 0x80 || (ch >= '0' && ch <= '9' && n) ||
                          (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')))
                        return p_fail(p, SW_EINVAL, "bad group name");
                    p->pos++;
                    n++;
                }
                if (!n || !p_eat(p, '>'))
                    return p_fail(p, SW_EINVAL, "bad group name");
            } else {
                return p_fail(p, SW_EINVAL, "unknown group syntax (?");
            }
        }
        if (++p->depth > RE_MAX_DEPTH)
            return p_fail(p, SW_ERANGE, "groups nested too deeply");
        int32_t inner = p_disjunction(p);
        p->depth--;
        if (inner < 0)
            return -1;
        if (!p_eat(p, ')'))
            return p_fail(p, SW_EINVAL, "missing )");
        return inner;
    }
    case '\\': {
        p->pos++;
        re_set s = {0};
        uint32_t cp;
        int r = p_escape(p, false, &s, &cp);
        if (r < 0) {
            sw_free(s.r);
            return -1;
        }
        if (r == 1)
            return p_set_node(p, &s, false);
        sw_free(s.r);
        return p_char_node(p, cp);
    }
    default: {
        int64_t v = p_utf8(p);
        if (v < 0)
            return -1;
        return p_char_node(p, (uint32_t)v);
    }
    }
}

/* An atom with its quantifier, if any. */
static int32_t p_term(re_parser *p)
{
    int32_t atom = p_atom(p);
    if (atom < 0)
        return -1;
    int64_t min, max;
    int c = p_peek(p);
    if (c == '*') {
        min = 0, max = -1;
        p->pos++;
    } else if (c == '+') {
        min = 1, max = -1;
        p->pos++;
    } else if (c == '?') {
        min = 0, max = 1;
        p->pos++;
    } else if (c == '{' && p_braces(p, &min, &max)) {
        if (max >= 0 && min > max)
            return p_fail(p, SW_EINVAL, "numbers out of order in {}");
        if (min > RE_MAX_COUNT || max > RE_MAX_COUNT)
            return p_fail(p, SW_ERANGE, "repetition count too large");
    } else {
        return atom;
    }
    p_eat(p, '?'); /* lazy: the same strings match */
    uint8_t k = p->nodes[atom].kind;
    if (k == A_BOL || k == A_EOL)
        return p_fail(p, SW_EINVAL, "nothing to repeat");
    int32_t rep = p_node(p, A_REP);
    if (rep < 0)
        return -1;
    p->nodes[rep].min = (int32_t)min;
    p->nodes[rep].max = (int32_t)max;
    p_append(p, rep, atom);
    return rep;
}

static int32_t p_alternative(re_parser *p)
{
    int32_t cat = p_node(p, A_CAT);
    if (cat < 0)
        return -1;
    while (p->pos < p->len && p->p[p->pos] != '|' && p->p[p->pos] != ')') {
        int32_t t = p_term(p);
        if (t < 0)
            return -1;
        p_append(p, cat, t);
    }
    return cat;
}

static int32_t p_disjunction(re_parser *p)
{
    int32_t first = p_alternative(p);
    if (first < 0 || p_peek(p) != '|')
        return first;
    int32_t alt = p_node(p, A_ALT);
    if (alt < 0)
        return -1;
    p_append(p, alt, first);
    while (p_eat(p, '|')) {
        int32_t a = p_alternative(p);
        if (a < 0)
            return -1;
        p_append(p, alt, a);
    }
    return alt;
}

/* ---- the NFA ------------------------------------------------------------ */

enum { NS_BYTE, NS_SPLIT, NS_EPS, NS_BOL, NS_EOL, NS_MATCH, NS_FAIL };

typedef struct nfa_state {
    uint8_t kind;
    uint8_t lo, hi; /* NS_BYTE */
    int32_t out, out2;
} nfa_state;

typedef struct re_nfa {
    nfa_state *s;
    int32_t n, cap;
    int rc;
} re_nfa;

static int32_t nfa_add(re_nfa *m, uint8_t kind, uint8_t lo, uint8_t hi, int32_t out, int32_t out2)
{
    if (m->rc)
        return -1;
    if (m->n == m->cap) {
        int32_t cap = m->cap ? m->cap * 2 : 256;
        if (m->n >= ENG_REGEX_MAX_NFA_STATES) {
            m->rc = SW_ERANGE;
            return -1;
        }
        if (cap > ENG_REGEX_MAX_NFA_STATES)
            cap = ENG_REGEX_MAX_NFA_STATES;
        nfa_state *s = sw_realloc(m->s, (size_t)cap * sizeof *s);
        if (!s) {
            m->rc = SW_ENOMEM;
            return -1;
        }
        m->s = s;
        m->cap = cap;
    }
    m->s[m->n] = (nfa_state){kind, lo, hi, out, out2};
    return m->n++;
}

typedef struct byte_seq {
    int n;
    uint8_t lo[4], hi[4];
} byte_seq;

static int utf8_encode(uint32_t cp, uint8_t *b)
{
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | cp >> 6);
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | cp >> 12);
        b[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | cp >> 18);
    b[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    b[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    b[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* A class as bytes: the UTF-8 sequences of its ranges, in code point
 * order, form a trie whose sibling byte ranges are disjoint (the
 * sequences are aligned rectangles of disjoint code points); it is emitted
 * bottom-up with equal subtrees shared. The class is then deterministic
 * in the NFA: after any prefix exactly one of its states is live, so the
 * subset construction gains no states from it (\p{L} would otherwise
 * produce thousands). */
typedef struct cls_edge {
    uint8_t lo, hi;
    int32_t child; /* trie node, or -1: the class ends here */
    int32_t next;  /* sibling edge, or -1 */
    int32_t state; /* the child's NFA state, once emitted */
} cls_edge;

typedef struct cls_node {
    int32_t first, last; /* edges */
} cls_node;

typedef struct cls_memo {
    uint32_t hash;
    int32_t n_edges;
    int32_t key;   /* offset of 3 * n_edges ints in keys */
    int32_t state; /* the NFA state, -1: empty slot */
} cls_memo;

typedef struct cls_build {
    re_nfa *m;
    int32_t next;
    cls_node *nodes;
    int32_t n_nodes, cap_nodes;
    cls_edge *edges;
    int32_t n_edges, cap_edges;
    byte_seq prev;
    int32_t path[5];
    cls_memo *memo;
    int32_t memo_cap;
    int32_t *keys;
    int32_t n_keys;
} cls_build;

static int grow(void **p, int32_t *cap, int32_t need, size_t size)
{
    if (need <= *cap)
        return SW_OK;
    int32_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > ENG_REGEX_MAX_NFA_STATES)
            return SW_ERANGE;
        c *= 2;
    }
    void *q = sw_realloc(*p, (size_t)c * size);
    if (!q)
        return SW_ENOMEM;
    *p = q;
    *cap = c;
    return SW_OK;
}

static int32_t cls_new_node(cls_build *b)
{
    int rc = grow((void **)&b->nodes, &b->cap_nodes, b->n_nodes + 1, sizeof *b->nodes);
    if (rc) {
        b->m->rc = rc;
        return -1;
    }
    b->nodes[b->n_nodes] = (cls_node){-1, -1};
    return b->n_nodes++;
}

static int32_t cls_new_edge(cls_build *b, int32_t node, uint8_t lo, uint8_t hi)
{
    int rc = grow((void **)&b->edges, &b->cap_edges, b->n_edges + 1, sizeof *b->edges);
    if (rc) {
        b->m->rc = rc;
        return -1;
    }
    int32_t e = b->n_edges++;
    b->edges[e] = (cls_edge){lo, hi, -1, -1, -1};
    if (b->nodes[node].last < 0)
        b->nodes[node].first = e;
    else
        b->edges[b->nodes[node].last].next = e;
    b->nodes[node].last = e;
    return e;
}

static void seq_out(cls_build *b, const byte_seq *q)
{
    if (b->m->rc)
        return;
    int l = 0;
    if (b->prev.n == q->n)
        while (l < q->n - 1 && b->prev.lo[l] == q->lo[l] && b->prev.hi[l] == q->hi[l])
            l++;
    int32_t node = b->path[l];
    for (int i = l; i < q->n; i++) {
        int32_t e = cls_new_edge(b, node, q->lo[i], q->hi[i]);
        if (e < 0)
            return;
        if (i + 1 < q->n) {
            int32_t child = cls_new_node(b);
            if (child < 0)
                return;
            b->edges[e].child = child;
            b->path[i + 1] = child;
            node = child;
        }
    }
    b->prev = *q;
}

/* Emits the UTF-8 sequences of code points lo..hi (surrogates skipped). */
static void seq_range(cls_build *e, uint32_t lo, uint32_t hi)
{
    if (e->m->rc || lo > hi)
        return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800)
            seq_range(e, lo, 0xD7FF);
        if (hi > 0xDFFF)
            seq_range(e, 0xE000, hi);
        return;
    }
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++) {
        if (lo <= bounds[i] && hi > bounds[i]) {
            seq_range(e, lo, bounds[i]);
            seq_range(e, bounds[i] + 1, hi);
            return;
        }
    }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                seq_range(e, lo, lo | m);
                seq_range(e, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                seq_range(e, lo, (hi & ~m) - 1);
                seq_range(e, hi & ~m, hi);
                return;
            }
        }
    }
    utf8_encode(hi, b);
    byte_seq q = {n, {0}, {0}};
    for (int i = 0; i < n; i++) {
        q.lo[i] = a[i];
        q.hi[i] = b[i];
    }
    seq_out(e, &q);
}

/* The NFA state of trie node `node`: its edges, each to its child's
 * state (or to next), shared with an equal node emitted before. */
static int32_t cls_emit(cls_build *b, int32_t node)
{
    int32_t n = 0;
    for (int32_t e = b->nodes[node].first; e >= 0; e = b->edges[e].next) {
        b->edges[e].state = b->edges[e].child < 0 ? b->next : cls_emit(b, b->edges[e].child);
        if (b->edges[e].state < 0)
            return -1;
        n++;
    }
    /* keys has room for every edge (emit_set); a node's key is written
     * after its children's, so they do not overlap. */
    int32_t base = b->n_keys, k = base;
    uint32_t h = 2166136261u;
    for (int32_t e = b->nodes[node].first; e >= 0; e = b->edges[e].next) {
        b->keys[k++] = b->edges[e].lo;
        b->keys[k++] = b->edges[e].hi;
        b->keys[k++] = b->edges[e].state;
    }
    for (int32_t i = base; i < k; i++) {
        h ^= (uint32_t)b->keys[i];
        h *= 16777619u;
    }
    uint32_t slot = h & (uint32_t)(b->memo_cap - 1);
    for (;; slot = (slot + 1) & (uint32_t)(b->memo_cap - 1)) {
        cls_memo *mm = &b->memo[slot];
        if (mm->state < 0)
            break;
        if (mm->hash == h && mm->n_edges == n &&
            memcmp(b->keys + mm->key, b->keys + base, (size_t)(3 * n) * sizeof *b->keys) == 0) {
            b->n_keys = base; /* not kept */
            return mm->state;
        }
    }
    int32_t t = -1;
    for (int32_t i = 0; i < n; i++) {
        const int32_t *kk = b->keys + base + 3 * i;
        int32_t s = nfa_add(b->m, NS_BYTE, (uint8_t)kk[0], (uint8_t)kk[1], kk[2], -1);
        t = t < 0 ? s : nfa_add(b->m, NS_SPLIT, 0, 0, t, s);
    }
    if (b->m->rc)
        return -1;
    b->n_keys = k;
    b->memo[slot] = (cls_memo){h, n, base, t};
    return t;
}

static int32_t emit_set(re_nfa *m, const re_range *r, int32_t n, int32_t next)
{
    cls_build b = {0};
    b.m = m;
    b.next = next;
    int32_t out = -1;
    if (cls_new_node(&b) < 0)
        goto done;
    for (int32_t i = 0; i < n; i++)
        seq_range(&b, r[i].lo, r[i].hi);
    if (m->rc)
        goto done;
    if (b.n_edges == 0) {
        out = nfa_add(m, NS_FAIL, 0, 0, -1, -1);
        goto done;
    }
    b.memo_cap = 16;
    while (b.memo_cap < 2 * b.n_nodes)
        b.memo_cap *= 2;
    b.memo = sw_malloc((size_t)b.memo_cap * sizeof *b.memo);
    b.keys = sw_malloc((size_t)(3 * b.n_edges + 1) * sizeof *b.keys);
    if (!b.memo || !b.keys) {
        m->rc = SW_ENOMEM;
        goto done;
    }
    for (int32_t i = 0; i < b.memo_cap; i++)
        b.memo[i].state = -1;
    out = cls_emit(&b, 0);
done:
    sw_free(b.nodes);
    sw_free(b.edges);
    sw_free(b.memo);
    sw_free(b.keys);
    return m->rc ? -1 : out;
}

static const re_range any_char[] = {{0, RE_MAX_CP}};

/* A loop over any code point, then next; the loop's split state. */
static int32_t emit_any_star(re_nfa *m, int32_t next)
{
    int32_t s = nfa_add(m, NS_SPLIT, 0, 0, -1, next);
    int32_t body = emit_set(m, any_char, 1, s);
    if (body < 0)
        return -1;
    m->s[s].out = body;
    return s;
}

static int32_t emit(re_nfa *m, const re_parser *p, int32_t id, int32_t next)
{
    if (m->rc || next < 0)
        return -1;
    const re_ast *a = &p->nodes[id];
    switch (a->kind) {
    case A_EMPTY:
        return next;
    case A_SET:
        /* an empty class ([]) may come before any range exists: no pointer
         * arithmetic on the pool's NULL */
        return emit_set(m, a->set_n ? p->pool.r + a->set_off : NULL, a->set_n, next);
    case A_BOL:
        return nfa_add(m, NS_BOL, 0, 0, next, -1);
    case A_EOL:
        return nfa_add(m, NS_EOL, 0, 0, next, -1);
    case A_CAT: {
        if (a->n_children == 0)
            return next;
        int32_t *kids = sw_malloc((size_t)a->n_children * sizeof *kids);
        if (!kids) {
            m->rc = SW_ENOMEM;
            return -1;
        }
        int32_t k = 0;
        for (int32_t c = a->first; c >= 0; c = p->nodes[c].next)
            kids[k++] = c;
        int32_t t = next;
        for (int32_t i = k - 1; i >= 0 && t >= 0; i--)
            t = emit(m, p, kids[i], t);
        sw_free(kids);
        return t;
    }
    case A_ALT: {
        int32_t t = -1;
        for (int32_t c = a->first; c >= 0; c = p->nodes[c].next) {
            int32_t s = emit(m, p, c, next);
            if (s < 0)
                return -1;
            t = t < 0 ? s : nfa_add(m, NS_SPLIT, 0, 0, t, s);
        }
        return t;
    }
    case A_REP: {
        int32_t t = next;
        if (a->max < 0) {
            int32_t s = nfa_add(m, NS_SPLIT, 0, 0, -1, next);
            if (s < 0)
                return -1;
            int32_t body = emit(m, p, a->first, s);
            if (body < 0)
                return -1;
            m->s[s].out = body;
            t = s;
        } else {
            for (int32_t i = a->min; i < a->max && t >= 0; i++) {
                int32_t body = emit(m, p, a->first, t);
                t = nfa_add(m, NS_SPLIT, 0, 0, body, next);
            }
        }
        for (int32_t i = 0; i < a->min && t >= 0; i++)
            t = emit(m, p, a->first, t);
        return t;
    }
    }
    return -1;
}

/* ---- the DFA ------------------------------------------------------------ */

struct eng_regex {
    int32_t n_states, n_classes;
    int32_t start;
    uint8_t class_of[256];
    int32_t *trans;    /* n_states * n_classes */
    uint8_t *accept;   /* n_states */
    uint8_t *live;     /* n_states */
    uint8_t *pend;     /* n_states */
    uint8_t *universal; /* n_states: every well-formed continuation matches */
};

typedef struct dfa_build {
    const re_nfa *m;
    int32_t tail;      /* the trailing loop's split state */
    /* closure scratch */
    uint32_t *mark;    /* m->n: generation of the last visit */
    uint32_t gen;
    int32_t *stack;    /* m->n */
    int32_t *tmp;      /* m->n: the closure being built */
    int32_t n_tmp;
    bool collapsed;    /* the last closure matched for good */
    long work;
    /* the sets of the DFA states */
    int32_t *pool;
    size_t n_pool, cap_pool;
    size_t *set_off;
    int32_t *set_len;
    int32_t *htab;     /* open addressing, RE_HTAB entries: state or -1 */
    int rc;
} dfa_build;

#define RE_HTAB (ENG_REGEX_MAX_STATES * 4)
#define RE_MAX_POOL ((size_t)1 << 24)

static int int_cmp(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return a < b ? -1 : a > b;
}

/* Closes the seeds (in b->tmp, b->n_tmp of them) over epsilon edges:
 * splits always, ^ only at the start, $ never (acceptance decides it).
 * Keeps the states that matter for a set: bytes, $, the match. */
static void closure(dfa_build *b, bool at_start)
{
    const nfa_state *s = b->m->s;
    int32_t sp = 0, out = 0;
    if (++b->gen == 0) {
        memset(b->mark, 0, (size_t)b->m->n * sizeof *b->mark);
        b->gen = 1;
    }
    for (int32_t i = 0; i < b->n_tmp; i++) {
        int32_t x = b->tmp[i];
        if (b->mark[x] != b->gen) {
            b->mark[x] = b->gen;
            b->stack[sp++] = x;
        }
    }
    bool matched = false;
    while (sp > 0) {
        int32_t x = b->stack[--sp];
        b->work++;
        if (x == b->tail)
            matched = true;
        const nfa_state *st = &s[x];
        int32_t nx[2] = {-1, -1};
        switch (st->kind) {
        case NS_BYTE:
        case NS_EOL:
        case NS_MATCH:
            b->tmp[out++] = x;
            break;
        case NS_SPLIT:
            nx[0] = st->out;
            nx[1] = st->out2;
            break;
        case NS_EPS:
            nx[0] = st->out;
            break;
        case NS_BOL:
            if (at_start)
                nx[0] = st->out;
            break;
        default:
            break;
        }
        for (int k = 0; k < 2; k++) {
            if (nx[k] >= 0 && b->mark[nx[k]] != b->gen) {
                b->mark[nx[k]] = b->gen;
                b->stack[sp++] = nx[k];
            }
        }
    }
    b->n_tmp = out;
    b->collapsed = matched;
    if (matched) {
        /* Matched for good: every continuation is accepted. One state:
         * the trailing loop's closure alone. */
        sp = out = 0;
        ++b->gen;
        b->mark[b->tail] = b->gen;
        b->stack[sp++] = b->tail;
        while (sp > 0) {
            int32_t x = b->stack[--sp];
            const nfa_state *st = &s[x];
            if (st->kind == NS_BYTE || st->kind == NS_MATCH) {
                b->tmp[out++] = x;
            } else if (st->kind == NS_SPLIT) {
                int32_t nx[2] = {st->out, st->out2};
                for (int k = 0; k < 2; k++)
                    if (nx[k] >= 0 && b->mark[nx[k]] != b->gen) {
                        b->mark[nx[k]] = b->gen;
                        b->stack[sp++] = nx[k];
                    }
            }
        }
        b->n_tmp = out;
    }
    qsort(b->tmp, (size_t)b->n_tmp, sizeof *b->tmp, int_cmp);
}

/* Whether a set accepts at the end of the string: the match is in it, or
 * reachable through $ (and further epsilons; ^ too at the start). */
static bool set_accepts(dfa_build *b, const int32_t *set, int32_t n, bool at_start)
{
    const nfa_state *s = b->m->s;
    int32_t sp = 0;
    ++b->gen;
    for (int32_t i = 0; i < n; i++) {
        if (s[set[i]].kind == NS_MATCH)
            return true;
        if (s[set[i]].kind == NS_EOL && b->mark[s[set[i]].out] != b->gen) {
            b->mark[s[set[i]].out] = b->gen;
            b->stack[sp++] = s[set[i]].out;
        }
    }
    while (sp > 0) {
        int32_t x = b->stack[--sp];
        b->work++;
        const nfa_state *st = &s[x];
        int32_t nx[2] = {-1, -1};
        switch (st->kind) {
        case NS_MATCH: return true;
        case NS_SPLIT: nx[0] = st->out; nx[1] = st->out2; break;
        case NS_EPS:
        case NS_EOL: nx[0] = st->out; break;
        case NS_BOL: if (at_start) nx[0] = st->out; break;
        default: break;
        }
        for (int k = 0; k < 2; k++)
            if (nx[k] >= 0 && b->mark[nx[k]] != b->gen) {
                b->mark[nx[k]] = b->gen;
                b->stack[sp++] = nx[k];
            }
    }
    return false;
}

static uint32_t set_hash(const int32_t *set, int32_t n, bool initial)
{
    uint32_t h = 2166136261u ^ (initial ? 0x9E3779B9u : 0);
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)set[i];
        h *= 16777619u;
    }
    return h;
}

/* The DFA state of the set in b->tmp: found, or added (with its
 * acceptance). -1 with b->rc on a bound or out of memory. */
static int32_t dfa_state(dfa_build *b, eng_regex *re, bool initial)
{
    const int32_t *set = b->tmp;
    int32_t n = b->n_tmp;
    uint32_t h = set_hash(set, n, initial) & (RE_HTAB - 1);
    for (;; h = (h + 1) & (RE_HTAB - 1)) {
        int32_t id = b->htab[h];
        if (id < 0)
            break;
        if ((id == re->start) == initial && b->set_len[id] == n &&
            memcmp(b->pool + b->set_off[id], set, (size_t)n * sizeof *set) == 0)
            return id;
    }
    if (re->n_states >= ENG_REGEX_MAX_STATES) {
        b->rc = SW_ERANGE;
        return -1;
    }
    if (b->n_pool + (size_t)n > b->cap_pool) {
        size_t cap = b->cap_pool ? b->cap_pool * 2 : 4096;
        while (cap < b->n_pool + (size_t)n)
            cap *= 2;
        if (cap > RE_MAX_POOL) {
            b->rc = SW_ERANGE;
            return -1;
        }
        int32_t *pool = sw_realloc(b->pool, cap * sizeof *pool);
        if (!pool) {
            b->rc = SW_ENOMEM;
            return -1;
        }
        b->pool = pool;
        b->cap_pool = cap;
    }
    int32_t id = re->n_states++;
    memcpy(b->pool + b->n_pool, set, (size_t)n * sizeof *set);
    b->set_off[id] = b->n_pool;
    b->set_len[id] = n;
    b->n_pool += (size_t)n;
    b->htab[h] = id;
    re->accept[id] = set_accepts(b, set, n, initial);
    re->universal[id] = b->collapsed;
    return id;
}

void eng_regex_free(eng_regex *re)
{
    if (!re)
        return;
    sw_free(re->trans);
    sw_free(re->accept);
    sw_free(re->live);
    sw_free(re->pend);
    sw_free(re->universal);
    sw_free(re);
}

static int utf8_role(uint8_t c)
{
    if (c < 0x80)
        return 0; /* a whole character */
    if (c < 0xC0)
        return -1; /* a continuation */
    if (c < 0xE0)
        return 1;
    if (c < 0xF0)
        return 2;
    return 3;
}

/* Liveness (reverse reachability from the accepting states), pruning of
 * the transitions into dead states, pending continuation bytes. */
static int dfa_finish(eng_regex *re)
{
    int32_t ns = re->n_states, nc = re->n_classes;
    size_t edges = (size_t)ns * (size_t)nc;
    int32_t *count = sw_calloc((size_t)ns + 1, sizeof *count);
    int32_t *rev = sw_malloc((edges ? edges : 1) * sizeof *rev);
    int32_t *queue = sw_malloc((size_t)ns * sizeof *queue);
    re->live = sw_calloc((size_t)ns, 1);
    re->pend = sw_calloc((size_t)ns, 1);
    uint8_t *seen = sw_calloc((size_t)ns, 1);
    int rc = SW_OK;
    if (!count || !rev || !queue || !re->live || !re->pend || !seen) {
        rc = SW_ENOMEM;
        goto done;
    }
    for (size_t e = 0; e < edges; e++)
        if (re->trans[e] >= 0)
            count[re->trans[e] + 1]++;
    for (int32_t i = 0; i < ns; i++)
        count[i + 1] += count[i];
    int32_t *fill = queue; /* reused as a cursor first */
    for (int32_t i = 0; i < ns; i++)
        fill[i] = count[i];
    for (size_t e = 0; e < edges; e++)
        if (re->trans[e] >= 0)
            rev[fill[re->trans[e]]++] = (int32_t)(e / (size_t)nc);
    int32_t qh = 0, qt = 0;
    for (int32_t i = 0; i < ns; i++)
        if (re->accept[i]) {
            re->live[i] = 1;
            queue[qt++] = i;
        }
    while (qh < qt) {
        int32_t t = queue[qh++];
        for (int32_t k = count[t]; k < count[t + 1]; k++) {
            int32_t s = rev[k];
            if (!re->live[s]) {
                re->live[s] = 1;
                queue[qt++] = s;
            }
        }
    }
    for (size_t e = 0; e < edges; e++)
        if (re->trans[e] >= 0 && !re->live[re->trans[e]])
            re->trans[e] = ENG_REGEX_DEAD;
    /* Pending bytes, breadth first from the start. */
    uint8_t rep[256];
    for (int b = 255; b >= 0; b--)
        rep[re->class_of[b]] = (uint8_t)b;
    qh = qt = 0;
    queue[qt++] = re->start;
    seen[re->start] = 1;
    while (qh < qt) {
        int32_t s = queue[qh++];
        for (int32_t c = 0; c < nc; c++) {
            int32_t t = re->trans[(size_t)s * (size_t)nc + (size_t)c];
            if (t < 0 || seen[t])
                continue;
            int role = utf8_role(rep[c]);
            re->pend[t] = (uint8_t)(re->pend[s] > 0 ? re->pend[s] - 1 : (role > 0 ? role : 0));
            seen[t] = 1;
            queue[qt++] = t;
        }
    }
done:
    sw_free(count);
    sw_free(rev);
    sw_free(queue);
    sw_free(seen);
    return rc;
}

static int dfa_build_all(const re_nfa *m, int32_t head, int32_t tail, eng_regex *re)
{
    dfa_build b = {0};
    b.m = m;
    b.tail = tail;
    int rc = SW_OK;
    /* Byte classes: bytes between the same NFA range boundaries. */
    uint8_t cut[257] = {0};
    for (int32_t i = 0; i < m->n; i++)
        if (m->s[i].kind == NS_BYTE) {
            cut[m->s[i].lo] = 1;
            cut[m->s[i].hi + 1] = 1;
        }
    int32_t nc = 0;
    uint8_t rep[256];
    for (int c = 0; c < 256; c++) {
        if (c > 0 && cut[c])
            nc++;
        re->class_of[c] = (uint8_t)nc;
        if (c == 0 || cut[c])
            rep[nc] = (uint8_t)c;
    }
    re->n_classes = ++nc;
    b.mark = sw_calloc((size_t)m->n, sizeof *b.mark);
    b.stack = sw_malloc((size_t)m->n * sizeof *b.stack);
    b.tmp = sw_malloc((size_t)m->n * sizeof *b.tmp);
    b.set_off = sw_malloc(ENG_REGEX_MAX_STATES * sizeof *b.set_off);
    b.set_len = sw_malloc(ENG_REGEX_MAX_STATES * sizeof *b.set_len);
    b.htab = sw_malloc(RE_HTAB * sizeof *b.htab);
    re->accept = sw_calloc(ENG_REGEX_MAX_STATES, 1);
    re->universal = sw_calloc(ENG_REGEX_MAX_STATES, 1);
    size_t cap_trans = 64 * (size_t)nc;
    re->trans = sw_malloc(cap_trans * sizeof *re->trans);
    if (!b.mark || !b.stack || !b.tmp || !b.set_off || !b.set_len || !b.htab || !re->accept ||
        !re->universal || !re->trans) {
        rc = SW_ENOMEM;
        goto done;
    }
    memset(b.htab, 0xFF, RE_HTAB * sizeof *b.htab);
    re->start = -1;
    b.tmp[0] = head;
    b.n_tmp = 1;
    closure(&b, true);
    re->start = dfa_state(&b, re, true);
    if (re->start < 0) {
        rc = b.rc;
        goto done;
    }
    int32_t *seed = sw_malloc((size_t)m->n * sizeof *seed);
    if (!seed) {
        rc = SW_ENOMEM;
        goto done;
    }
    for (int32_t s = 0; s < re->n_states; s++) {
        while ((size_t)re->n_states * (size_t)nc > cap_trans) {
            size_t cap = cap_trans * 2;
            int32_t *t = sw_realloc(re->trans, cap * sizeof *t);
            if (!t) {
                rc = SW_ENOMEM;
                break;
            }
            re->trans = t;
            cap_trans = cap;
        }
        for (int32_t c = 0; c < nc; c++) {
            /* Reread: dfa_state() may move the pool. */
            const int32_t *set = b.pool + b.set_off[s];
            int32_t n = b.set_len[s], n_seed = 0;
            uint8_t r = rep[c];
            for (int32_t i = 0; i < n; i++) {
                const nfa_state *st = &m->s[set[i]];
                if (st->kind == NS_BYTE && st->lo <= r && r <= st->hi)
                    seed[n_seed++] = st->out;
            }
            b.work += n;
            int32_t t = ENG_REGEX_DEAD;
            if (n_seed) {
                memcpy(b.tmp, seed, (size_t)n_seed * sizeof *seed);
                b.n_tmp = n_seed;
                closure(&b, false);
                t = b.n_tmp ? dfa_state(&b, re, false) : ENG_REGEX_DEAD;
                if (b.rc) {
                    rc = b.rc;
                    break;
                }
            }
            re->trans[(size_t)s * (size_t)nc + (size_t)c] = t;
            if (b.work > RE_WORK_MAX) {
                rc = SW_ERANGE;
                break;
            }
        }
        if (rc)
            break;
    }
    sw_free(seed);
    if (!rc)
        rc = dfa_finish(re);
done:
    sw_free(b.mark);
    sw_free(b.stack);
    sw_free(b.tmp);
    sw_free(b.pool);
    sw_free(b.set_off);
    sw_free(b.set_len);
    sw_free(b.htab);
    return rc;
}

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
    int32_t root = p_disjunction(&p);
    if (root >= 0 && p.pos < p.len)
        root = p_fail(&p, SW_EINVAL, "unmatched )");
    if (root < 0) {
        rc = p.rc;
        goto fail;
    }
    int32_t match = nfa_add(&m, NS_MATCH, 0, 0, -1, -1);
    int32_t tail = emit_any_star(&m, match);
    int32_t body = emit(&m, &p, root, tail);
    int32_t head = body >= 0 ? emit_any_star(&m, body) : -1;
    if (head < 0) {
        rc = m.rc ? m.rc : SW_EINTERNAL;
        sw_error_set(err, rc, rc == SW_ERANGE ? "pattern too large (more than %d NFA states)"
                                              : "pattern: out of memory",
                     ENG_REGEX_MAX_NFA_STATES);
        goto fail;
    }
    re = sw_calloc(1, sizeof *re);
    if (!re) {
        rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
        goto fail;
    }
    rc = dfa_build_all(&m, head, tail, re);
    if (rc) {
        sw_error_set(err, rc, rc == SW_ERANGE ? "pattern too large (its automaton passes %d "
                                                "states or the construction's work bound)"
                                              : "pattern: out of memory",
                     ENG_REGEX_MAX_STATES);
        goto fail;
    }
    sw_free(p.nodes);
    sw_free(p.pool.r);
    sw_free(m.s);
    *out = re;
    return SW_OK;
fail:
    sw_free(p.nodes);
    sw_free(p.pool.r);
    sw_free(m.s);
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

/* ---- completion costs under a length bound ----------------------------- */

struct eng_regex_costs {
    int32_t n_states, levels;
    int32_t min_chars, max_chars;
    bool unbounded;
    int32_t *cell; /* n_states * levels: least cost, or INT32_MAX */
};

void eng_regex_costs_free(eng_regex_costs *t)
{
    if (!t)
        return;
    sw_free(t->cell);
    sw_free(t);
}

int64_t eng_regex_costs_get(const eng_regex_costs *t, int32_t state, int64_t chars)
{
    if (state < 0 || chars < 0 || chars > t->max_chars)
        return -1;
    int64_t lvl = t->unbounded && chars > t->min_chars ? t->min_chars : chars;
    int32_t v = t->cell[(size_t)state * (size_t)t->levels + (size_t)lvl];
    return v == INT32_MAX ? -1 : v;
}

static int32_t cost_add(int32_t a, int32_t b)
{
    if (a == INT32_MAX || b == INT32_MAX)
        return INT32_MAX;
    int64_t s = (int64_t)a + b;
    return s >= INT32_MAX ? INT32_MAX - 1 : (int32_t)s;
}

/* One level (chars = lvl) of the table when every lead byte goes to level
 * lvl_next (a row of the table, or NULL: no more characters allowed), the
 * continuations staying at this level. Boundary states first, then the
 * states by pending bytes (1, 2, 3), each depending only on the ones
 * before. */
static void costs_level(const eng_regex *re, const int32_t *class_cost, const uint8_t *lead,
                        int32_t *row, const int32_t *row_next, bool accept_here, int32_t levels)
{
    int32_t nc = re->n_classes;
    for (int p = 0; p <= 3; p++) {
        for (int32_t s = 0; s < re->n_states; s++) {
            if (re->pend[s] != p)
                continue;
            int32_t best = accept_here && re->accept[s] ? 0 : INT32_MAX;
            for (int32_t c = 0; c < nc; c++) {
                int32_t t = re->trans[(size_t)s * (size_t)nc + (size_t)c];
                if (t < 0)
                    continue;
                int32_t v;
                if (lead[c])
                    v = row_next ? row_next[(size_t)t * (size_t)levels] : INT32_MAX;
                else
                    v = row[(size_t)t * (size_t)levels];
                v = cost_add(v, class_cost[c]);
                if (v < best)
                    best = v;
            }
            row[(size_t)s * (size_t)levels] = best;
        }
    }
}

/* The level where the length no longer matters (unbounded, chars >=
 * min_chars): shortest paths to acceptance, Dijkstra over the reversed
 * edges. */
static int costs_free_level(const eng_regex *re, const int32_t *class_cost, int32_t *row,
                            int32_t levels)
{
    int32_t ns = re->n_states, nc = re->n_classes;
    size_t edges = (size_t)ns * (size_t)nc;
    int32_t *start = sw_calloc((size_t)ns + 1, sizeof *start);
    int32_t *from = sw_malloc((edges ? edges : 1) * sizeof *from);
    int32_t *via = sw_malloc((edges ? edges : 1) * sizeof *via);
    int32_t *dist = sw_malloc((size_t)ns * sizeof *dist);
    uint8_t *done = sw_calloc((size_t)ns, 1);
    int rc = SW_OK;
    if (!start || !from || !via || !dist || !done) {
        rc = SW_ENOMEM;
        goto out;
    }
    for (size_t e = 0; e < edges; e++)
        if (re->trans[e] >= 0)
            start[re->trans[e] + 1]++;
    for (int32_t i = 0; i < ns; i++)
        start[i + 1] += start[i];
    for (int32_t i = 0; i < ns; i++)
        dist[i] = start[i]; /* a fill cursor for now */
    for (size_t e = 0; e < edges; e++) {
        int32_t t = re->trans[e];
        if (t >= 0) {
            from[dist[t]] = (int32_t)(e / (size_t)nc);
            via[dist[t]++] = (int32_t)(e % (size_t)nc);
        }
    }
    for (int32_t i = 0; i < ns; i++)
        dist[i] = re->accept[i] ? 0 : INT32_MAX;
    for (;;) {
        int32_t u = -1;
        for (int32_t i = 0; i < ns; i++)
            if (!done[i] && dist[i] != INT32_MAX && (u < 0 || dist[i] < dist[u]))
                u = i;
        if (u < 0)
            break;
        done[u] = 1;
        for (int32_t k = start[u]; k < start[u + 1]; k++) {
            int32_t v = cost_add(dist[u], class_cost[via[k]]);
            if (v < dist[from[k]])
                dist[from[k]] = v;
        }
    }
    for (int32_t i = 0; i < ns; i++)
        row[(size_t)i * (size_t)levels] = dist[i];
out:
    sw_free(start);
    sw_free(from);
    sw_free(via);
    sw_free(dist);
    sw_free(done);
    return rc;
}

int eng_regex_costs_build(const eng_regex *re, const uint8_t byte_cost[256], int32_t min_chars,
                          int32_t max_chars, eng_regex_costs **out, sw_error *err)
{
    *out = NULL;
    if (min_chars < 0 || max_chars < min_chars)
        return sw_error_set(err, SW_EINVAL, "pattern: length bounds out of order");
    bool unbounded = max_chars == INT32_MAX;
    int64_t levels = (int64_t)(unbounded ? min_chars : max_chars) + 1;
    if (levels * re->n_states > ENG_REGEX_MAX_COST_CELLS)
        return sw_error_set(err, SW_ERANGE,
                            "pattern with length bounds too large (%d automaton states x %lld "
                            "lengths)",
                            (int)re->n_states, (long long)levels);
    eng_regex_costs *t = sw_calloc(1, sizeof *t);
    int32_t *class_cost = sw_malloc((size_t)re->n_classes * sizeof *class_cost);
    uint8_t *lead = sw_calloc((size_t)re->n_classes, 1);
    int rc = SW_OK;
    if (!t || !class_cost || !lead ||
        !(t->cell = sw_malloc((size_t)levels * (size_t)re->n_states * sizeof *t->cell))) {
        rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
        goto fail;
    }
    t->n_states = re->n_states;
    t->levels = (int32_t)levels;
    t->min_chars = min_chars;
    t->max_chars = max_chars;
    t->unbounded = unbounded;
    for (int32_t c = 0; c < re->n_classes; c++)
        class_cost[c] = INT32_MAX;
    for (int b = 0; b < 256; b++) {
        int32_t c = re->class_of[b];
        if (byte_cost[b] < class_cost[c])
            class_cost[c] = byte_cost[b];
        lead[c] = utf8_role((uint8_t)b) >= 0;
    }
    int32_t top = t->levels - 1;
    if (unbounded) {
        if ((rc = costs_free_level(re, class_cost, t->cell + top, t->levels))) {
            sw_error_set(err, rc, "pattern: out of memory");
            goto fail;
        }
    } else {
        costs_level(re, class_cost, lead, t->cell + top, NULL, top >= min_chars, t->levels);
    }
    for (int32_t lvl = top - 1; lvl >= 0; lvl--)
        costs_level(re, class_cost, lead, t->cell + lvl, t->cell + lvl + 1, lvl >= min_chars,
                    t->levels);
    sw_free(class_cost);
    sw_free(lead);
    *out = t;
    return SW_OK;
fail:
    sw_free(class_cost);
    sw_free(lead);
    eng_regex_costs_free(t);
    return rc;
}

/* ---- intersection ------------------------------------------------------- */

int eng_regex_intersect(const eng_regex *a, const eng_regex *b, eng_regex **out, sw_error *err)
{
    *out = NULL;
    eng_regex *re = sw_calloc(1, sizeof *re);
    int32_t *pair_a = sw_malloc(ENG_REGEX_MAX_STATES * sizeof *pair_a);
    int32_t *pair_b = sw_malloc(ENG_REGEX_MAX_STATES * sizeof *pair_b);
    int32_t *htab = sw_malloc(RE_HTAB * sizeof *htab);
    int rc = SW_OK;
    if (!re || !pair_a || !pair_b || !htab ||
        !(re->accept = sw_calloc(ENG_REGEX_MAX_STATES, 1)) ||
        !(re->universal = sw_calloc(ENG_REGEX_MAX_STATES, 1))) {
        rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
        goto fail;
    }
    /* Classes: bytes that both automata treat alike. */
    uint8_t rep[256];
    int32_t nc = 0;
    for (int x = 0; x < 256; x++) {
        int32_t c = -1;
        for (int y = 0; y < x; y++)
            if (a->class_of[y] == a->class_of[x] && b->class_of[y] == b->class_of[x]) {
                c = re->class_of[y];
                break;
            }
        if (c < 0) {
            c = nc++;
            rep[c] = (uint8_t)x;
        }
        re->class_of[x] = (uint8_t)c;
    }
    re->n_classes = nc;
    size_t cap_trans = 64 * (size_t)nc;
    if (!(re->trans = sw_malloc(cap_trans * sizeof *re->trans))) {
        rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
        goto fail;
    }
    memset(htab, 0xFF, RE_HTAB * sizeof *htab);
    int32_t nb = b->n_states;
    /* Start; then breadth first, adding pairs as they are reached. */
    pair_a[0] = a->start;
    pair_b[0] = b->start;
    re->n_states = 1;
    re->start = 0;
    htab[((uint32_t)a->start * (uint32_t)nb + (uint32_t)b->start) * 2654435761u &
         (RE_HTAB - 1)] = 0;
    for (int32_t s = 0; s < re->n_states; s++) {
        re->accept[s] = a->accept[pair_a[s]] && b->accept[pair_b[s]];
        re->universal[s] = a->universal[pair_a[s]] && b->universal[pair_b[s]];
        while ((size_t)re->n_states * (size_t)nc > cap_trans) {
            int32_t *t = sw_realloc(re->trans, 2 * cap_trans * sizeof *t);
            if (!t) {
                rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
                goto fail;
            }
            re->trans = t;
            cap_trans *= 2;
        }
        for (int32_t c = 0; c < nc; c++) {
            int32_t ta = eng_regex_step(a, pair_a[s], rep[c]);
            int32_t tb = ta < 0 ? -1 : eng_regex_step(b, pair_b[s], rep[c]);
            int32_t t = ENG_REGEX_DEAD;
            if (ta >= 0 && tb >= 0) {
                uint32_t key = (uint32_t)ta * (uint32_t)nb + (uint32_t)tb;
                uint32_t h = key * 2654435761u & (RE_HTAB - 1);
                for (;; h = (h + 1) & (RE_HTAB - 1)) {
                    int32_t id = htab[h];
                    if (id < 0 || (pair_a[id] == ta && pair_b[id] == tb))
                        break;
                }
                if (htab[h] >= 0) {
                    t = htab[h];
                } else {
                    if (re->n_states >= ENG_REGEX_MAX_STATES) {
                        rc = sw_error_set(err, SW_ERANGE,
                                          "pattern and format together too large (their "
                                          "automaton passes %d states)",
                                          ENG_REGEX_MAX_STATES);
                        goto fail;
                    }
                    t = re->n_states++;
                    pair_a[t] = ta;
                    pair_b[t] = tb;
                    htab[h] = t;
                }
            }
            re->trans[(size_t)s * (size_t)nc + (size_t)c] = t;
        }
    }
    if ((rc = dfa_finish(re))) {
        sw_error_set(err, rc, "pattern: out of memory");
        goto fail;
    }
    sw_free(pair_a);
    sw_free(pair_b);
    sw_free(htab);
    *out = re;
    return SW_OK;
fail:
    sw_free(pair_a);
    sw_free(pair_b);
    sw_free(htab);
    eng_regex_free(re);
    return rc;
}

int eng_regex_clone(const eng_regex *re, eng_regex **out, sw_error *err)
{
    size_t ns = (size_t)re->n_states, cells = ns * (size_t)re->n_classes;
    eng_regex *c = sw_calloc(1, sizeof *c);
    *out = NULL;
    if (!c || !(c->trans = sw_malloc((cells ? cells : 1) * sizeof *c->trans)) ||
        !(c->accept = sw_malloc(ns ? ns : 1)) || !(c->live = sw_malloc(ns ? ns : 1)) ||
        !(c->pend = sw_malloc(ns ? ns : 1)) || !(c->universal = sw_malloc(ns ? ns : 1))) {
        eng_regex_free(c);
        return sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
    }
    c->n_states = re->n_states;
    c->n_classes = re->n_classes;
    c->start = re->start;
    memcpy(c->class_of, re->class_of, sizeof c->class_of);
    memcpy(c->trans, re->trans, cells * sizeof *c->trans);
    memcpy(c->accept, re->accept, ns);
    memcpy(c->live, re->live, ns);
    memcpy(c->pend, re->pend, ns);
    memcpy(c->universal, re->universal, ns);
    *out = c;
    return SW_OK;
}
