/* regex_parse.c - the pattern text to a syntax tree (stage 1 of regex.c's
 * overview): code point sets (sorted, merged ranges; \d \w \s \p{..}) and
 * the recursive-descent parser, its nesting bounded by RE_MAX_DEPTH.
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"
#include "text/unicode_tables.h"

#include <stdlib.h>
#include <string.h>

/* ---- code point sets --------------------------------------------------- */

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

int32_t eng__rx_p_fail(re_parser *p, int code, const char *what)
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
            return eng__rx_p_fail(p, SW_ERANGE, "pattern too large");
        re_ast *n = sw_realloc(p->nodes, (size_t)cap * sizeof *n);
        if (!n)
            return eng__rx_p_fail(p, SW_ENOMEM, "out of memory");
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
        eng__rx_p_fail(p, rc, rc == SW_ENOMEM ? "out of memory" : "class too large");
        goto done;
    }
    if ((id = p_node(p, A_SET)) < 0)
        goto done;
    p->nodes[id].set_off = p->pool.n;
    p->nodes[id].set_n = s->n;
    for (int32_t i = 0; i < s->n; i++) {
        if ((rc = set_add(&p->pool, s->r[i].lo, s->r[i].hi))) {
            id = eng__rx_p_fail(p, rc, rc == SW_ENOMEM ? "out of memory" : "pattern too large");
            goto done;
        }
    }
done:
    sw_free(s->r);
    memset(s, 0, sizeof *s);
    return id;
}

/* A one-character set node: its range straight into the pool (a literal
 * is most of a pattern; a set of its own would be allocated, copied and
 * freed for each). */
static int32_t p_char_node(re_parser *p, uint32_t cp)
{
    int32_t id = p_node(p, A_SET);
    if (id < 0)
        return -1;
    int32_t off = p->pool.n;
    int rc = set_add(&p->pool, cp, cp);
    if (rc)
        return eng__rx_p_fail(p, rc, rc == SW_ENOMEM ? "out of memory" : "pattern too large");
    p->nodes[id].set_off = off;
    p->nodes[id].set_n = 1;
    return id;
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
        return eng__rx_p_fail(p, SW_EINVAL, "invalid UTF-8");
    }
    if (avail < k)
        return eng__rx_p_fail(p, SW_EINVAL, "invalid UTF-8");
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return eng__rx_p_fail(p, SW_EINVAL, "invalid UTF-8");
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > RE_MAX_CP)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return eng__rx_p_fail(p, SW_EINVAL, "invalid UTF-8");
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
                return eng__rx_p_fail(p, SW_EINVAL, "\\u{...} beyond U+10FFFF");
            digits++;
        }
        if (!digits || !p_eat(p, '}'))
            return eng__rx_p_fail(p, SW_EINVAL, "malformed \\u{...} escape");
        if (v >= 0xD800 && v <= 0xDFFF)
            return eng__rx_p_fail(p, SW_EUNSUPPORTED, "a lone surrogate");
        return v;
    }
    int64_t v = p_hex(p, 4);
    if (v < 0)
        return eng__rx_p_fail(p, SW_EINVAL, "malformed \\u escape");
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
        return eng__rx_p_fail(p, SW_EUNSUPPORTED, "a lone surrogate");
    return v;
}

/* \p{...} / \P{...} after the letter: the categories unicode_tables.h has. */
static int p_property(re_parser *p, re_set *s, bool negate)
{
    if (!p_eat(p, '{'))
        return eng__rx_p_fail(p, SW_EINVAL, "\\p needs {name}"), -1;
    size_t start = p->pos;
    while (p->pos < p->len && p->p[p->pos] != '}')
        p->pos++;
    if (p->pos >= p->len)
        return eng__rx_p_fail(p, SW_EINVAL, "unterminated \\p{"), -1;
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
        return eng__rx_p_fail(p, SW_EUNSUPPORTED, "this Unicode property (only L and N)"), -1;
#undef RE_IS
    if (rc)
        return eng__rx_p_fail(p, rc, "out of memory"), -1;
    if (negate) {
        set_normalize(s);
        if ((rc = set_negate(s)))
            return eng__rx_p_fail(p, rc, "out of memory"), -1;
    }
    return 0;
}

/* An escape after the backslash. Returns 0 with *cp for a character, 1
 * with s filled for a class, -1 on error. */
static int p_escape(re_parser *p, bool in_class, re_set *s, uint32_t *cp)
{
    if (p->pos >= p->len)
        return eng__rx_p_fail(p, SW_EINVAL, "trailing backslash"), -1;
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
            return eng__rx_p_fail(p, SW_EINVAL, "\\c needs a letter"), -1;
        p->pos++;
        *cp = (uint32_t)(l % 32);
        return 0;
    }
    case '0':
        if (p_peek(p) >= '0' && p_peek(p) <= '9')
            return eng__rx_p_fail(p, SW_EUNSUPPORTED, "legacy octal escapes"), -1;
        *cp = 0;
        return 0;
    case 'x': {
        int64_t v = p_hex(p, 2);
        if (v < 0)
            return eng__rx_p_fail(p, SW_EINVAL, "malformed \\x escape"), -1;
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
        return eng__rx_p_fail(p, SW_EUNSUPPORTED, "word boundaries (\\b)"), -1;
    case 'B':
        return eng__rx_p_fail(p, SW_EUNSUPPORTED, "word boundaries (\\B)"), -1;
    case 'k':
        return eng__rx_p_fail(p, SW_EUNSUPPORTED, "backreferences (\\k)"), -1;
    case '-':
        *cp = '-';
        return 0;
    default:
        break;
    }
    if (c >= '1' && c <= '9')
        return eng__rx_p_fail(p, SW_EUNSUPPORTED, "backreferences"), -1;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return eng__rx_p_fail(p, SW_EINVAL, "unknown escape"), -1;
    /* An identity escape: the character itself. */
    p->pos--;
    int64_t v = p_utf8(p);
    if (v < 0)
        return -1;
    *cp = (uint32_t)v;
    return 0;
cls:
    if (rc)
        return eng__rx_p_fail(p, rc, "out of memory"), -1;
    if (c >= 'A' && c <= 'Z') {
        set_normalize(s);
        if ((rc = set_negate(s)))
            return eng__rx_p_fail(p, rc, "out of memory"), -1;
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
                    return eng__rx_p_fail(p, SW_ENOMEM, "out of memory"), -1;
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
            return eng__rx_p_fail(p, SW_EINVAL, "unterminated character class");
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
                return eng__rx_p_fail(p, SW_EINVAL, "class range out of order");
            }
            if (set_add(&s, a, b))
                goto oom;
        } else if (ra == 0 && set_add(&s, a, a)) {
            goto oom;
        }
    }
    return p_set_node(p, &s, negate);
oom:
    eng__rx_p_fail(p, SW_ENOMEM, "out of memory");
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

int32_t eng__rx_p_disjunction(re_parser *p);

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
        return eng__rx_p_fail(p, SW_EINVAL, "nothing to repeat");
    case '{':
        if (p_braces(p, &qa, &qb))
            return eng__rx_p_fail(p, SW_EINVAL, "nothing to repeat");
        p->pos++;
        return p_char_node(p, '{');
    case '.': {
        p->pos++;
        re_set s = {0};
        if (set_add(&s, '\n', '\n') || set_add(&s, '\r', '\r') || set_add(&s, 0x2028, 0x2029)) {
            sw_free(s.r);
            return eng__rx_p_fail(p, SW_ENOMEM, "out of memory");
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
                bool neg = p->p[p->pos++] == '!';
                if (++p->depth > RE_MAX_DEPTH)
                    return eng__rx_p_fail(p, SW_ERANGE, "groups nested too deeply");
                int32_t inner = eng__rx_p_disjunction(p);
                p->depth--;
                if (inner < 0)
                    return -1;
                if (!p_eat(p, ')'))
                    return eng__rx_p_fail(p, SW_EINVAL, "missing )");
                int32_t look = p_node(p, A_LOOK);
                if (look < 0)
                    return -1;
                p->nodes[look].min = neg;
                p_append(p, look, inner);
                return look;
            } else if (p_eat(p, '<')) {
                if (p_peek(p) == '=' || p_peek(p) == '!')
                    return eng__rx_p_fail(p, SW_EUNSUPPORTED, "lookbehind");
                int n = 0;
                while (p->pos < p->len && p->p[p->pos] != '>') {
                    int ch = p->p[p->pos];
                    if (!(ch == '_' || ch == '$' || ch >= 0x80 || (ch >= '0' && ch <= '9' && n) ||
                          (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')))
                        return eng__rx_p_fail(p, SW_EINVAL, "bad group name");
                    p->pos++;
                    n++;
                }
                if (!n || !p_eat(p, '>'))
                    return eng__rx_p_fail(p, SW_EINVAL, "bad group name");
            } else {
                return eng__rx_p_fail(p, SW_EINVAL, "unknown group syntax (?");
            }
        }
        if (++p->depth > RE_MAX_DEPTH)
            return eng__rx_p_fail(p, SW_ERANGE, "groups nested too deeply");
        int32_t inner = eng__rx_p_disjunction(p);
        p->depth--;
        if (inner < 0)
            return -1;
        if (!p_eat(p, ')'))
            return eng__rx_p_fail(p, SW_EINVAL, "missing )");
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
            return eng__rx_p_fail(p, SW_EINVAL, "numbers out of order in {}");
        if (min > RE_MAX_COUNT || max > RE_MAX_COUNT)
            return eng__rx_p_fail(p, SW_ERANGE, "repetition count too large");
    } else {
        return atom;
    }
    p_eat(p, '?'); /* lazy: the same strings match */
    uint8_t k = p->nodes[atom].kind;
    if (k == A_BOL || k == A_EOL || k == A_LOOK)
        return eng__rx_p_fail(p, SW_EINVAL, "nothing to repeat");
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

int32_t eng__rx_p_disjunction(re_parser *p)
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
