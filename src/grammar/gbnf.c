/* gbnf.c - the GBNF parser and the reference matcher (see gbnf.h).
 *
 * Recursive descent over the text, building a node pool: each rule's body
 * is an ALT of SEQs; a literal becomes a SEQ of one-character classes.
 * Rule names are interned as they are met (a reference may come before
 * the definition); after parsing, every named rule must have a body and
 * `root` must exist. The matcher works on code points: for a node and a
 * start position it returns the set of end positions (a bitset), rules
 * memoized by start position.
 */
#include "grammar/gbnf.h"

#include "common/alloc.h"

#include <string.h>

typedef struct gb_rule {
    char *name;
    int32_t body; /* -1 until defined */
    size_t line;  /* of the first reference, for the error */
} gb_rule;

struct eng_gbnf {
    eng_gbnf_node *nodes;
    int32_t n_nodes, cap_nodes;
    eng_gbnf_range *ranges;
    int32_t n_ranges, cap_ranges;
    gb_rule *rules;
    int32_t n_rules, cap_rules;
    int32_t root;
};

typedef struct gb_parser {
    eng_gbnf *g;
    const uint8_t *p;
    size_t len, pos;
    int depth;
    int rc;
    sw_error *err;
} gb_parser;

static void where(const gb_parser *ps, size_t pos, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos && i < ps->len; i++) {
        if (ps->p[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static int32_t gb_fail(gb_parser *ps, int code, const char *what)
{
    if (!ps->rc) {
        size_t line, col;
        where(ps, ps->pos, &line, &col);
        ps->rc = code;
        sw_error_set(ps->err, code, "grammar: %s at line %zu, column %zu", what, line, col);
    }
    return -1;
}

static int grow(void **p, int32_t *cap, int32_t need, size_t size, int32_t limit)
{
    if (need <= *cap)
        return SW_OK;
    if (need > limit)
        return SW_ERANGE;
    int32_t c = *cap ? *cap : 16;
    while (c < need)
        c = c > limit / 2 ? limit : c * 2;
    void *q = sw_realloc(*p, (size_t)c * size);
    if (!q)
        return SW_ENOMEM;
    *p = q;
    *cap = c;
    return SW_OK;
}

static int32_t gb_node(gb_parser *ps, eng_gbnf_kind kind)
{
    eng_gbnf *g = ps->g;
    int rc = grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes,
                  ENG_GBNF_MAX_NODES);
    if (rc)
        return gb_fail(ps, rc, rc == SW_ERANGE ? "grammar too large" : "out of memory");
    int32_t id = g->n_nodes++;
    memset(&g->nodes[id], 0, sizeof g->nodes[id]);
    g->nodes[id].kind = kind;
    g->nodes[id].first = g->nodes[id].next = -1;
    return id;
}

/* Appends child to parent's list; last is the parent's last child (or -1). */
static void gb_append(eng_gbnf *g, int32_t parent, int32_t *last, int32_t child)
{
    if (*last < 0)
        g->nodes[parent].first = child;
    else
        g->nodes[*last].next = child;
    *last = child;
}

static int gb_range(gb_parser *ps, uint32_t lo, uint32_t hi)
{
    eng_gbnf *g = ps->g;
    int rc = grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + 1, sizeof *g->ranges,
                  ENG_GBNF_MAX_NODES);
    if (rc)
        return gb_fail(ps, rc, rc == SW_ERANGE ? "grammar too large" : "out of memory"), rc;
    g->ranges[g->n_ranges++] = (eng_gbnf_range){lo, hi};
    return SW_OK;
}

/* A one-character class node of lo..hi. */
static int32_t gb_char(gb_parser *ps, uint32_t lo, uint32_t hi, bool negated)
{
    int32_t n = gb_node(ps, ENG_GBNF_CLASS);
    if (n < 0)
        return -1;
    ps->g->nodes[n].negated = negated;
    ps->g->nodes[n].range_off = ps->g->n_ranges;
    if (gb_range(ps, lo, hi))
        return -1;
    ps->g->nodes[n].n_ranges = 1;
    return n;
}

static int32_t gb_rule_ref(gb_parser *ps, const char *name, size_t n)
{
    eng_gbnf *g = ps->g;
    for (int32_t i = 0; i < g->n_rules; i++)
        if (strlen(g->rules[i].name) == n && memcmp(g->rules[i].name, name, n) == 0)
            return i;
    int rc = grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules,
                  ENG_GBNF_MAX_NODES);
    char *copy = rc ? NULL : sw_strndup(name, n);
    if (rc || !copy)
        return gb_fail(ps, rc ? rc : SW_ENOMEM,
                       rc == SW_ERANGE ? "too many rules" : "out of memory");
    size_t line, col;
    where(ps, ps->pos, &line, &col);
    g->rules[g->n_rules] = (gb_rule){copy, -1, line};
    return g->n_rules++;
}

static bool is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

/* Spaces, tabs and comments; newlines too when newline_ok. */
static void gb_space(gb_parser *ps, bool newline_ok)
{
    while (ps->pos < ps->len) {
        uint8_t c = ps->p[ps->pos];
        if (c == ' ' || c == '\t') {
            ps->pos++;
        } else if (c == '#') {
            while (ps->pos < ps->len && ps->p[ps->pos] != '\n')
                ps->pos++;
        } else if (newline_ok && (c == '\n' || c == '\r')) {
            ps->pos++;
        } else {
            break;
        }
    }
}

static int gb_peek(const gb_parser *ps)
{
    return ps->pos < ps->len ? ps->p[ps->pos] : -1;
}

/* One UTF-8 code point; -1 when malformed. */
static int64_t gb_utf8(gb_parser *ps)
{
    const uint8_t *s = ps->p + ps->pos;
    size_t avail = ps->len - ps->pos, k;
    uint32_t cp;
    if (s[0] < 0x80) {
        ps->pos++;
        return s[0];
    }
    if (s[0] >= 0xC2 && s[0] <= 0xDF) {
        k = 2;
        cp = s[0] & 0x1F;
    } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        k = 3;
        cp = s[0] & 0x0F;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        k = 4;
        cp = s[0] & 0x07;
    } else {
        return gb_fail(ps, SW_EINVAL, "invalid UTF-8");
    }
    if (avail < k)
        return gb_fail(ps, SW_EINVAL, "invalid UTF-8");
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return gb_fail(ps, SW_EINVAL, "invalid UTF-8");
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return gb_fail(ps, SW_EINVAL, "invalid UTF-8");
    ps->pos += k;
    return cp;
}

static int64_t gb_hex(gb_parser *ps, int n)
{
    if (ps->len - ps->pos < (size_t)n)
        return gb_fail(ps, SW_EINVAL, "short hex escape");
    int64_t v = 0;
    for (int i = 0; i < n; i++) {
        int c = ps->p[ps->pos + (size_t)i], h;
        if (c >= '0' && c <= '9')
            h = c - '0';
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
            h = (c | 0x20) - 'a' + 10;
        else
            return gb_fail(ps, SW_EINVAL, "bad hex escape");
        v = v * 16 + h;
    }
    ps->pos += (size_t)n;
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return gb_fail(ps, SW_EINVAL, "escape outside Unicode scalar values");
    return v;
}

/* A character of a literal or a class, escapes decoded. */
static int64_t gb_char_lit(gb_parser *ps)
{
    if (ps->pos >= ps->len)
        return gb_fail(ps, SW_EINVAL, "unexpected end");
    if (ps->p[ps->pos] != '\\')
        return gb_utf8(ps);
    ps->pos++;
    int c = gb_peek(ps);
    ps->pos++;
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': return '\\';
    case '"': return '"';
    case '[': return '[';
    case ']': return ']';
    case '-': return '-';
    case '^': return '^';
    case 'x': return gb_hex(ps, 2);
    case 'u': return gb_hex(ps, 4);
    case 'U': return gb_hex(ps, 8);
    default: ps->pos--; return gb_fail(ps, SW_EINVAL, "unknown escape");
    }
}

static int32_t gb_alternates(gb_parser *ps, bool nested);

/* "{m}", "{m,}", "{m,n}" after '{'. */
static bool gb_braces(gb_parser *ps, int32_t *min, int32_t *max)
{
    int64_t a = 0, b;
    int digits = 0;
    gb_space(ps, false);
    while (gb_peek(ps) >= '0' && gb_peek(ps) <= '9') {
        a = a * 10 + (ps->p[ps->pos++] - '0');
        if (a > ENG_GBNF_MAX_COUNT + 1)
            a = ENG_GBNF_MAX_COUNT + 1;
        digits++;
    }
    gb_space(ps, false);
    if (!digits)
        return gb_fail(ps, SW_EINVAL, "expected a count"), false;
    b = a;
    if (gb_peek(ps) == ',') {
        ps->pos++;
        gb_space(ps, false);
        b = -1;
        if (gb_peek(ps) >= '0' && gb_peek(ps) <= '9') {
            b = 0;
            while (gb_peek(ps) >= '0' && gb_peek(ps) <= '9') {
                b = b * 10 + (ps->p[ps->pos++] - '0');
                if (b > ENG_GBNF_MAX_COUNT + 1)
                    b = ENG_GBNF_MAX_COUNT + 1;
            }
            gb_space(ps, false);
        }
    }
    if (gb_peek(ps) != '}')
        return gb_fail(ps, SW_EINVAL, "expected }"), false;
    ps->pos++;
    if (a > ENG_GBNF_MAX_COUNT || b > ENG_GBNF_MAX_COUNT)
        return gb_fail(ps, SW_ERANGE, "repetition count too large"), false;
    if (b >= 0 && a > b)
        return gb_fail(ps, SW_EINVAL, "repetition bounds out of order"), false;
    *min = (int32_t)a;
    *max = (int32_t)b;
    return true;
}

static int32_t gb_element(gb_parser *ps)
{
    eng_gbnf *g = ps->g;
    int c = gb_peek(ps);
    if (c == '"') {
        ps->pos++;
        int32_t seq = gb_node(ps, ENG_GBNF_SEQ), last = -1;
        if (seq < 0)
            return -1;
        while (gb_peek(ps) != '"') {
            if (gb_peek(ps) < 0 || gb_peek(ps) == '\n')
                return gb_fail(ps, SW_EINVAL, "unterminated string");
            int64_t cp = gb_char_lit(ps);
            if (cp < 0)
                return -1;
            int32_t ch = gb_char(ps, (uint32_t)cp, (uint32_t)cp, false);
            if (ch < 0)
                return -1;
            gb_append(g, seq, &last, ch);
        }
        ps->pos++;
        return seq;
    }
    if (c == '[') {
        ps->pos++;
        int32_t n = gb_node(ps, ENG_GBNF_CLASS);
        if (n < 0)
            return -1;
        if (gb_peek(ps) == '^') {
            ps->pos++;
            g->nodes[n].negated = true;
        }
        g->nodes[n].range_off = g->n_ranges;
        while (gb_peek(ps) != ']') {
            if (gb_peek(ps) < 0)
                return gb_fail(ps, SW_EINVAL, "unterminated character class");
            int64_t lo = gb_char_lit(ps), hi = lo;
            if (lo < 0)
                return -1;
            if (gb_peek(ps) == '-' && ps->pos + 1 < ps->len && ps->p[ps->pos + 1] != ']') {
                ps->pos++;
                if ((hi = gb_char_lit(ps)) < 0)
                    return -1;
                if (hi < lo)
                    return gb_fail(ps, SW_EINVAL, "class range out of order");
            }
            if (gb_range(ps, (uint32_t)lo, (uint32_t)hi))
                return -1;
            g->nodes[n].n_ranges++;
        }
        ps->pos++;
        return n;
    }
    if (c == '.') {
        ps->pos++;
        return gb_char(ps, 0, 0x10FFFF, false);
    }
    if (c == '(') {
        ps->pos++;
        if (++ps->depth > ENG_GBNF_MAX_DEPTH)
            return gb_fail(ps, SW_ERANGE, "groups nested too deeply");
        gb_space(ps, true);
        int32_t inner = gb_alternates(ps, true);
        ps->depth--;
        if (inner < 0)
            return -1;
        if (gb_peek(ps) != ')')
            return gb_fail(ps, SW_EINVAL, "expected )");
        ps->pos++;
        return inner;
    }
    if (is_name_char(c)) {
        size_t start = ps->pos;
        while (is_name_char(gb_peek(ps)))
            ps->pos++;
        int32_t rule = gb_rule_ref(ps, (const char *)ps->p + start, ps->pos - start);
        if (rule < 0)
            return -1;
        int32_t n = gb_node(ps, ENG_GBNF_REF);
        if (n < 0)
            return -1;
        g->nodes[n].rule = rule;
        return n;
    }
    return gb_fail(ps, SW_EINVAL, "expected an element");
}

/* Elements until '|', ')' or the end of the rule. */
static int32_t gb_sequence(gb_parser *ps, bool nested)
{
    eng_gbnf *g = ps->g;
    int32_t seq = gb_node(ps, ENG_GBNF_SEQ), last = -1;
    if (seq < 0)
        return -1;
    for (;;) {
        int c = gb_peek(ps);
        if (c < 0 || c == '|' || c == ')' || c == '\n' || c == '\r')
            break;
        int32_t el = gb_element(ps);
        if (el < 0)
            return -1;
        int32_t min = -2, max = -2;
        c = gb_peek(ps);
        if (c == '*')
            min = 0, max = -1;
        else if (c == '+')
            min = 1, max = -1;
        else if (c == '?')
            min = 0, max = 1;
        if (min != -2) {
            ps->pos++;
        } else if (c == '{') {
            ps->pos++;
            if (!gb_braces(ps, &min, &max))
                return -1;
        }
        if (min != -2) {
            int32_t rep = gb_node(ps, ENG_GBNF_REP), none = -1;
            if (rep < 0)
                return -1;
            g->nodes[rep].min = min;
            g->nodes[rep].max = max;
            gb_append(g, rep, &none, el);
            el = rep;
        }
        gb_append(g, seq, &last, el);
        gb_space(ps, nested);
    }
    return seq;
}

static int32_t gb_alternates(gb_parser *ps, bool nested)
{
    eng_gbnf *g = ps->g;
    int32_t alt = gb_node(ps, ENG_GBNF_ALT), last = -1;
    if (alt < 0)
        return -1;
    for (;;) {
        int32_t seq = gb_sequence(ps, nested);
        if (seq < 0)
            return -1;
        gb_append(g, alt, &last, seq);
        if (gb_peek(ps) != '|')
            break;
        ps->pos++;
        gb_space(ps, true);
    }
    return alt;
}

void eng_gbnf_free(eng_gbnf *g)
{
    if (!g)
        return;
    for (int32_t i = 0; i < g->n_rules; i++)
        sw_free(g->rules[i].name);
    sw_free(g->rules);
    sw_free(g->nodes);
    sw_free(g->ranges);
    sw_free(g);
}

int eng_gbnf_parse(const char *text, size_t len, eng_gbnf **out, sw_error *err)
{
    *out = NULL;
    if (len > ENG_GBNF_MAX_BYTES)
        return sw_error_set(err, SW_ERANGE, "grammar: longer than %d bytes", ENG_GBNF_MAX_BYTES);
    eng_gbnf *g = sw_calloc(1, sizeof *g);
    if (!g)
        return sw_error_set(err, SW_ENOMEM, "grammar: out of memory");
    gb_parser ps = {g, (const uint8_t *)text, len, 0, 0, SW_OK, err};
    for (;;) {
        gb_space(&ps, true);
        if (ps.pos >= ps.len)
            break;
        size_t start = ps.pos;
        while (is_name_char(gb_peek(&ps)))
            ps.pos++;
        if (ps.pos == start) {
            gb_fail(&ps, SW_EINVAL, "expected a rule name");
            goto fail;
        }
        int32_t rule = gb_rule_ref(&ps, text + start, ps.pos - start);
        if (rule < 0)
            goto fail;
        gb_space(&ps, false);
        if (ps.len - ps.pos < 3 || memcmp(ps.p + ps.pos, "::=", 3) != 0) {
            gb_fail(&ps, SW_EINVAL, "expected ::=");
            goto fail;
        }
        ps.pos += 3;
        gb_space(&ps, true);
        if (g->rules[rule].body >= 0) {
            gb_fail(&ps, SW_EINVAL, "rule defined twice");
            goto fail;
        }
        int32_t body = gb_alternates(&ps, false);
        if (body < 0)
            goto fail;
        g->rules[rule].body = body;
        int c = gb_peek(&ps);
        if (c >= 0 && c != '\n' && c != '\r') {
            gb_fail(&ps, SW_EINVAL, "expected the end of the rule");
            goto fail;
        }
    }
    for (int32_t i = 0; i < g->n_rules; i++) {
        if (g->rules[i].body < 0) {
            sw_error_set(err, SW_EINVAL, "grammar: rule '%.64s' (line %zu) is not defined",
                         g->rules[i].name, g->rules[i].line);
            ps.rc = SW_EINVAL;
            goto fail;
        }
    }
    if ((g->root = eng_gbnf_rule(g, "root")) < 0) {
        sw_error_set(err, SW_EINVAL, "grammar: no 'root' rule");
        ps.rc = SW_EINVAL;
        goto fail;
    }
    *out = g;
    return SW_OK;
fail:
    eng_gbnf_free(g);
    return ps.rc ? ps.rc : SW_EINTERNAL;
}

int32_t eng_gbnf_n_rules(const eng_gbnf *g)
{
    return g->n_rules;
}

int32_t eng_gbnf_n_nodes(const eng_gbnf *g)
{
    return g->n_nodes;
}

int32_t eng_gbnf_rule(const eng_gbnf *g, const char *name)
{
    for (int32_t i = 0; i < g->n_rules; i++)
        if (strcmp(g->rules[i].name, name) == 0)
            return i;
    return -1;
}

const char *eng_gbnf_rule_name(const eng_gbnf *g, int32_t rule)
{
    return g->rules[rule].name;
}

int32_t eng_gbnf_rule_body(const eng_gbnf *g, int32_t rule)
{
    return g->rules[rule].body;
}

const eng_gbnf_node *eng_gbnf_node_at(const eng_gbnf *g, int32_t node)
{
    return &g->nodes[node];
}

const eng_gbnf_range *eng_gbnf_class_ranges(const eng_gbnf *g, const eng_gbnf_node *nd)
{
    return nd->n_ranges > 0 ? g->ranges + nd->range_off : NULL;
}

/* ---- the reference matcher ---------------------------------------------- */

typedef struct gb_match {
    const eng_gbnf *g;
    const uint32_t *cp;
    size_t n;       /* code points */
    size_t words;   /* per bitset */
    uint64_t *memo; /* rule x start: end positions */
    uint8_t *state; /* rule x start: 0 not done, 1 in progress, 2 done */
    bool oom;
} gb_match;

static void set_bit(uint64_t *s, size_t i)
{
    s[i >> 6] |= 1ull << (i & 63);
}

static bool has_bit(const uint64_t *s, size_t i)
{
    return s[i >> 6] >> (i & 63) & 1;
}

/* The first set bit at or after i, or past the end (words * 64). */
static size_t next_bit(const uint64_t *s, size_t words, size_t i)
{
    size_t w = i >> 6;
    if (w >= words)
        return words * 64;
    uint64_t rest = s[w] & (~0ull << (i & 63));
    while (!rest) {
        if (++w == words)
            return words * 64;
        rest = s[w];
    }
    return w * 64 + (size_t)__builtin_ctzll(rest);
}

/* Bitsets of texts up to 255 code points (the tests' and the fuzz
 * harness's) live on the C stack: an allocation per node visit was most
 * of the matcher's time. Longer texts' are allocated. */
#define GB_MATCH_LOCAL_WORDS 4

static uint64_t *bits_get(const gb_match *m, uint64_t *local)
{
    return m->words <= GB_MATCH_LOCAL_WORDS ? local : sw_malloc(m->words * sizeof *local);
}

static void bits_put(const gb_match *m, uint64_t *bits) /* NULL is fine */
{
    if (m->words > GB_MATCH_LOCAL_WORDS)
        sw_free(bits);
}

/* End positions of node from every start in `from` into `to` (cleared). */
static void m_node(gb_match *m, int32_t node, const uint64_t *from, uint64_t *to);

static void m_rule(gb_match *m, int32_t rule, size_t start, uint64_t *to)
{
    size_t w = m->words;
    uint64_t *slot = m->memo + ((size_t)rule * (m->n + 1) + start) * w;
    uint8_t *st = &m->state[(size_t)rule * (m->n + 1) + start];
    if (*st == 1)
        return; /* left recursion: nothing through it */
    if (*st == 0) {
        *st = 1;
        uint64_t local[GB_MATCH_LOCAL_WORDS];
        uint64_t *from = bits_get(m, local);
        if (!from) {
            m->oom = true;
            return;
        }
        memset(from, 0, w * sizeof *from);
        set_bit(from, start);
        m_node(m, m->g->rules[rule].body, from, slot);
        bits_put(m, from);
        *st = 2;
    }
    for (size_t i = 0; i < w; i++)
        to[i] |= slot[i];
}

static void m_node(gb_match *m, int32_t node, const uint64_t *from, uint64_t *to)
{
    const eng_gbnf *g = m->g;
    const eng_gbnf_node *nd = &g->nodes[node];
    size_t w = m->words;
    memset(to, 0, w * sizeof *to);
    if (m->oom)
        return;
    switch (nd->kind) {
    case ENG_GBNF_CLASS:
        for (size_t i = next_bit(from, w, 0); i < m->n; i = next_bit(from, w, i + 1)) {
            bool in = false;
            for (int32_t r = 0; r < nd->n_ranges && !in; r++) {
                const eng_gbnf_range *rg = &g->ranges[nd->range_off + r];
                in = m->cp[i] >= rg->lo && m->cp[i] <= rg->hi;
            }
            if (in != nd->negated)
                set_bit(to, i + 1);
        }
        return;
    case ENG_GBNF_REF:
        for (size_t i = next_bit(from, w, 0); i <= m->n; i = next_bit(from, w, i + 1))
            m_rule(m, nd->rule, i, to);
        return;
    case ENG_GBNF_ALT:
    case ENG_GBNF_SEQ:
    case ENG_GBNF_REP: {
        uint64_t cur_local[GB_MATCH_LOCAL_WORDS], tmp_local[GB_MATCH_LOCAL_WORDS];
        uint64_t *cur = bits_get(m, cur_local), *tmp = bits_get(m, tmp_local);
        if (!cur || !tmp) {
            m->oom = true;
            bits_put(m, cur);
            bits_put(m, tmp);
            return;
        }
        memcpy(cur, from, w * sizeof *cur);
        if (nd->kind == ENG_GBNF_ALT) {
            for (int32_t c = nd->first; c >= 0; c = g->nodes[c].next) {
                m_node(m, c, from, tmp);
                for (size_t i = 0; i < w; i++)
                    to[i] |= tmp[i];
            }
        } else if (nd->kind == ENG_GBNF_SEQ) {
            for (int32_t c = nd->first; c >= 0; c = g->nodes[c].next) {
                m_node(m, c, cur, tmp);
                memcpy(cur, tmp, w * sizeof *cur);
            }
            memcpy(to, cur, w * sizeof *to);
        } else {
            /* min copies, then up to max - min more (or until nothing new) */
            for (int32_t k = 0; k < nd->min; k++) {
                m_node(m, nd->first, cur, tmp);
                memcpy(cur, tmp, w * sizeof *cur);
            }
            memcpy(to, cur, w * sizeof *to);
            for (int32_t k = nd->min; nd->max < 0 || k < nd->max; k++) {
                m_node(m, nd->first, cur, tmp);
                bool grew = false;
                for (size_t i = 0; i < w; i++) {
                    if (tmp[i] & ~to[i])
                        grew = true;
                    to[i] |= tmp[i];
                }
                memcpy(cur, tmp, w * sizeof *cur);
                if (!grew && nd->max < 0)
                    break;
            }
        }
        bits_put(m, cur);
        bits_put(m, tmp);
        return;
    }
    }
}

bool eng_gbnf_match(const eng_gbnf *g, const char *text, size_t len)
{
    gb_match m = {g, NULL, 0, 0, NULL, NULL, false};
    uint32_t *cp = sw_malloc((len + 1) * sizeof *cp);
    bool ok = false;
    if (!cp)
        return false;
    gb_parser ps = {NULL, (const uint8_t *)text, len, 0, 0, SW_OK, NULL};
    while (ps.pos < len) {
        int64_t c = gb_utf8(&ps);
        if (c < 0)
            goto done;
        cp[m.n++] = (uint32_t)c;
    }
    m.cp = cp;
    m.words = (m.n + 1 + 63) / 64;
    m.memo = sw_calloc((size_t)g->n_rules * (m.n + 1) * m.words, sizeof *m.memo);
    m.state = sw_calloc((size_t)g->n_rules * (m.n + 1), 1);
    uint64_t *to = sw_calloc(m.words, sizeof *to);
    if (m.memo && m.state && to) {
        m_rule(&m, g->root, 0, to);
        ok = !m.oom && has_bit(to, m.n);
    }
    sw_free(to);
done:
    sw_free(m.memo);
    sw_free(m.state);
    sw_free(cp);
    return ok;
}
