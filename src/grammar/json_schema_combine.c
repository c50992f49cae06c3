/* json_schema_combine.c - compiling not, anyOf / oneOf, dependencies and
 * if / then / else.
 */
#include "grammar/json_schema.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "grammar/constrain-impl.h"
#include "grammar/formats.h"
#include "grammar/json_schema-impl.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int eng__sc_analyze_not(builder *b, const json_t *n, size_t plen, not_info *ni, int nest)
{
    if (json_is_false(n))
        return SW_OK;
    if (json_is_true(n)) {
        ni->types_only = 0;
        return SW_OK;
    }
    const json_t *eff;
    int rc;
    if (nest > 8)
        return eng__sc_fail_at(b, plen, SW_EUNSUPPORTED, "'not' nested too deeply");
    if ((rc = eng__sc_effective(b->doc, n, b->base, &eff, b->err)))
        return rc;
    if (json_is_boolean(eff))
        return eng__sc_analyze_not(b, eff, plen, ni, nest + 1);
    const char *k;
    const json_t *v;
    int kinds = 0;
    json_object_foreach((json_t *)eff, k, v) {
        if (!eng__sc_is_known_keyword(k))
            continue;
        kinds++;
        if (strcmp(k, "type") == 0 || strcmp(k, "const") == 0 || strcmp(k, "enum") == 0)
            continue;
        if (strcmp(k, "required") == 0 && json_array_size(v) > 0 &&
            json_is_string(json_array_get(v, 0)))
            continue;
        if (strcmp(k, "anyOf") == 0 && json_is_array(v))
            continue;
        return eng__sc_fail_at(b, plen, SW_EUNSUPPORTED,
                               "'not' is enforced only for type, const, enum and required");
    }
    const json_t *any = json_object_get(eff, "anyOf");
    if (any) {
        if (kinds != 1)
            return eng__sc_fail_at(b, plen, SW_EUNSUPPORTED,
                                   "'not' is enforced only for type, const, enum and required");
        /* not (A or B) = not A and not B */
        for (size_t i = 0; i < json_array_size(any); i++)
            if ((rc = eng__sc_analyze_not(b, json_array_get(any, i), plen, ni, nest + 1)))
                return rc;
        return SW_OK;
    }
    if (json_object_get(eff, "const") || json_object_get(eff, "enum")) {
        ni->filter = true;
        return SW_OK;
    }
    const json_t *req = json_object_get(eff, "required");
    int tm = eng__sc_type_mask(json_object_get(eff, "type"));
    if (tm < 0)
        return eng__sc_fail_at(b, plen, SW_EINVAL, "a malformed 'type' inside 'not'");
    if (req) {
        if (json_object_get(eff, "type"))
            return eng__sc_fail_at(b, plen, SW_EUNSUPPORTED,
                                   "'not' with both type and required is not supported");
        /* not required [a, ...]: an object that lacks one of them; a (the
         * first) is never generated */
        ni->types_only &= T_OBJECT;
        if (!ni->forbid)
            ni->forbid = json_string_value(json_array_get(req, 0));
        else if (strcmp(ni->forbid, json_string_value(json_array_get(req, 0))) != 0)
            return eng__sc_fail_at(b, plen, SW_EUNSUPPORTED, "two 'not required' in one schema");
        return SW_OK;
    }
    ni->types_out |= tm;
    return SW_OK;
}

/* True where lo (a lower bound) lies above hi (an upper one): no number
 * is within both. */
static bool bounds_apart(num_bound lo, num_bound hi)
{
    if (!lo.v || !hi.v)
        return false;
    int c = eng__sc_num_cmp(lo.v, hi.v);
    return c > 0 || (c == 0 && (lo.excl || hi.excl));
}

/* Can two alternatives of a oneOf match the same value? false only when
 * that is sure: different types, or enum / const values the other
 * refuses, or a required property both declare with such values. */
static bool may_overlap(builder *b, const json_t *x, const json_t *y, int nest)
{
    if (json_is_false(x) || json_is_false(y))
        return false;
    if (!json_is_object(x) || !json_is_object(y) || nest > 4)
        return true;
    int tx = eng__sc_type_mask(json_object_get(x, "type")),
        ty = eng__sc_type_mask(json_object_get(y, "type"));
    if (tx >= 0 && ty >= 0 && (tx & ty) == 0)
        return false;
    /* numbers only in common, in ranges apart */
    if (tx >= 0 && ty >= 0 && ((tx & ty) & ~(T_NUMBER | T_INTEGER)) == 0 &&
        (bounds_apart(eng__sc_bound_get(x, true), eng__sc_bound_get(y, false)) ||
         bounds_apart(eng__sc_bound_get(y, true), eng__sc_bound_get(x, false))))
        return false;
    for (int side = 0; side < 2; side++) {
        const json_t *p = side ? y : x, *q = side ? x : y;
        const json_t *c = json_object_get(p, "const"), *e = json_object_get(p, "enum");
        if (!c && !json_is_array(e))
            continue;
        size_t n = c ? 1 : json_array_size(e);
        bool all_refused = true;
        for (size_t i = 0; i < n && all_refused; i++) {
            sw_error verr;
            if (eng__sc_val_judge(b->doc, q, c ? c : json_array_get(e, i), &verr) != SW_EINVAL)
                all_refused = false;
        }
        if (all_refused)
            return false;
    }
    /* values in common can only be objects, and one requires a name the
     * other forbids (properties: {name: false}, or additionalProperties
     * false without the name) */
    if (tx >= 0 && ty >= 0 && (tx & ty) == T_OBJECT) {
        for (int side = 0; side < 2; side++) {
            const json_t *p = side ? y : x, *q = side ? x : y;
            const json_t *req = json_object_get(p, "required");
            const json_t *qprops = json_object_get(q, "properties");
            bool closed = json_is_false(json_object_get(q, "additionalProperties")) &&
                          !json_object_get(q, "patternProperties");
            for (size_t i = 0; i < json_array_size(req); i++) {
                const char *name = json_string_value(json_array_get(req, i));
                const json_t *qs = name ? json_object_get(qprops, name) : NULL;
                if (name && (json_is_false(qs) || (closed && !qs)))
                    return false;
            }
        }
    }
    /* a property required by both, whose schemas cannot overlap */
    const json_t *rx = json_object_get(x, "required"), *ry = json_object_get(y, "required");
    for (size_t i = 0; i < json_array_size(rx); i++) {
        const char *name = json_string_value(json_array_get(rx, i));
        bool in_y = false;
        for (size_t j = 0; name && j < json_array_size(ry) && !in_y; j++)
            in_y = json_string_value(json_array_get(ry, j)) &&
                   strcmp(json_string_value(json_array_get(ry, j)), name) == 0;
        if (!in_y)
            continue;
        json_t *px = NULL, *py = NULL;
        const json_t *ex, *ey;
        sw_error scratch;
        bool apart = false;
        if (!eng__sc_prop_schema(x, name, &px, &scratch) &&
            !eng__sc_prop_schema(y, name, &py, &scratch) &&
            eng__sc_doc_keep(b->doc, json_incref(px)) &&
            eng__sc_doc_keep(b->doc, json_incref(py)) &&
            !eng__sc_effective(b->doc, px, b->base, &ex, &scratch) &&
            !eng__sc_effective(b->doc, py, b->base, &ey, &scratch))
            apart = !may_overlap(b, ex, ey, nest + 1);
        json_decref(px);
        json_decref(py);
        if (apart)
            return false;
    }
    return true;
}

int eng__sc_compile_anyof(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    eng_grammar *g = b->g;
    const json_t *any = json_object_get(s, "anyOf");
    const char *key = "anyOf";
    bool one = false;
    if (!any) {
        any = json_object_get(s, "oneOf");
        key = "oneOf";
        one = true;
    }
    size_t n = json_array_size(any);
    size_t l = eng__sc_path_push(b, plen, key);
    int rc;
    if (!json_is_array(any) || n == 0)
        return eng__sc_fail_at(b, l, SW_EINVAL, "expected a non-empty array of schemas");
    if (n > 64)
        return eng__sc_fail_at(b, l, SW_EUNSUPPORTED, "more than 64 alternatives");
    if (b->anyof_nesting[depth] >= ENG_CS_MAX_ANYOF_NESTING)
        return eng__sc_fail_at(b, l, SW_EUNSUPPORTED, "anyOf/oneOf nested too deeply");
    /* the other keywords go into every alternative */
    json_t *rest = json_copy((json_t *)s);
    if (!rest || !eng__sc_doc_keep(b->doc, rest))
        return eng__sc_oom(b);
    json_object_del(rest, key);
    bool siblings = !eng__sc_only_annotations(rest, "");
    const json_t *alts_s[64];
    bool excluded[64] = {false};
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(any, i);
        if (siblings) {
            json_t *w = json_pack("{s:[OO]}", "allOf", rest, a);
            if (!w || !eng__sc_doc_keep(b->doc, w))
                return eng__sc_oom(b);
            a = w;
        }
        alts_s[i] = a;
    }
    if (one) {
        /* exactly one: generated as any one of them, so they must not
         * overlap (a value of one must fail the others) */
        const json_t *eff[64];
        for (size_t i = 0; i < n; i++) {
            sw_error e;
            if ((rc = eng__sc_effective(b->doc, alts_s[i], b->base, &eff[i], &e)))
                return eng__sc_fail_at(b, eng__sc_path_push_index(b, l, i), rc, e.message);
        }
        /* Alternatives that may overlap are generated as "this one and not
         * the others it may overlap" where that not can be enforced (else
         * the alternative is left out, a narrowing) */
        const json_t *orig[64];
        memcpy(orig, alts_s, n * sizeof *orig);
        for (size_t i = 0; i < n; i++) {
            json_t *excl = NULL;
            for (size_t j = 0; j < n; j++) {
                if (j == i || !may_overlap(b, eff[i], eff[j], 0))
                    continue;
                if (!excl && !(excl = json_array()))
                    return eng__sc_oom(b);
                json_array_append_new(excl, json_pack("{s:O}", "not", orig[j]));
            }
            if (!excl)
                continue;
            json_array_insert(excl, 0, (json_t *)orig[i]);
            json_t *w = json_pack("{s:o}", "allOf", excl);
            if (!w || !eng__sc_doc_keep(b->doc, w))
                return eng__sc_oom(b);
            alts_s[i] = w;
            excluded[i] = true;
        }
    }
    int32_t alts[64], kept = 0, dropped = 0;
    b->anyof_nesting[depth]++;
    for (size_t i = 0; i < n; i++) {
        int32_t a;
        if ((rc = eng__sc_compile(b, alts_s[i], depth, eng__sc_path_push_index(b, l, i), &a))) {
            if (rc == SW_EUNSUPPORTED && excluded[i]) {
                dropped++; /* its "not the others" cannot be enforced: left out */
                continue;
            }
            b->anyof_nesting[depth]--;
            return rc;
        }
        if (a != CS_NEVER)
            alts[kept++] = a;
    }
    b->anyof_nesting[depth]--;
    if (kept == 0 && dropped > 0)
        return eng__sc_fail_at(
            b, l, SW_EUNSUPPORTED,
            "oneOf alternatives may both match a value, and excluding the others "
            "cannot be enforced");
    if (kept == 0) {
        *out = CS_NEVER;
        return SW_OK;
    }
    if (kept == 1) {
        *out = alts[0];
        return SW_OK;
    }
    /* alternatives may each be several branches (an untyped one, a oneOf
     * alternative written as "this one and not the others"): past the
     * bound, the widest keeps only its first branch (a narrowing) until
     * they fit; every node that is no anyOf is one branch, and there are
     * at most 64 alternatives, so they always do */
    int64_t total = 0;
    for (int32_t i = 0; i < kept; i++)
        total += g->nodes[alts[i]].n_branches;
    while (total > ENG_CS_MAX_BRANCHES) {
        int32_t widest = -1;
        for (int32_t i = 0; i < kept; i++)
            if (g->nodes[alts[i]].kind == CS_ANYOF && g->nodes[alts[i]].n_alts > 1 &&
                (widest < 0 || g->nodes[alts[i]].n_branches > g->nodes[alts[widest]].n_branches))
                widest = i;
        if (widest < 0)
            break;
        total -= g->nodes[alts[widest]].n_branches;
        alts[widest] = g->nodes[alts[widest]].alts[0];
        total += g->nodes[alts[widest]].n_branches;
    }
    if ((*out = eng__sc_make_anyof(g, alts, kept)) < 0)
        return eng__sc_oom(b);
    if (g->nodes[*out].n_branches > ENG_CS_MAX_BRANCHES)
        return eng__sc_fail_at(b, l, SW_EUNSUPPORTED,
                               "anyOf/oneOf alternatives expand to more than 64 branches");
    return SW_OK;
}

/* dependentSchemas (and draft 7's schema dependencies): each schema is
 * applied whether its property is there or not (a narrowing: such a value
 * satisfies "if p then S" either way), false as "p is never generated". */
int eng__sc_compile_dependent(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    json_t *rest = json_copy((json_t *)s);
    json_t *all = json_array();
    if (!rest || !eng__sc_doc_keep(b->doc, rest) || !all || !eng__sc_doc_keep(b->doc, all))
        return eng__sc_oom(b);
    json_object_del(rest, "dependentSchemas");
    json_t *arrays = json_object(); /* dependencies that are lists stay */
    if (!arrays || json_array_append_new(all, arrays))
        return eng__sc_oom(b);
    json_array_append(all, rest);
    static const char *const keys[] = {"dependentSchemas", "dependencies"};
    for (int d = 0; d < 2; d++) {
        const json_t *deps = json_object_get(s, keys[d]);
        const char *k;
        const json_t *v;
        if (!json_is_object(deps))
            continue;
        json_object_foreach((json_t *)deps, k, v) {
            if (json_is_array(v)) {
                json_object_set(arrays, k, (json_t *)v);
            } else if (json_is_false(v)) {
                if (json_array_append_new(all, json_pack("{s:{s:b}}", "properties", k, 0)))
                    return eng__sc_oom(b);
            } else if (json_is_object(v)) {
                json_array_append(all, (json_t *)v);
            } else if (!json_is_true(v)) {
                return eng__sc_fail_at(
                    b, eng__sc_path_push(b, eng__sc_path_push(b, plen, keys[d]), k), SW_EINVAL,
                    "a dependency must be a schema or a list of names");
            }
        }
    }
    json_object_del(rest, "dependencies");
    if (json_object_size(arrays))
        json_object_set(rest, "dependentRequired", arrays);
    json_array_remove(all, 0);
    json_t *w = json_pack("{s:O}", "allOf", all);
    if (!w || !eng__sc_doc_keep(b->doc, w))
        return eng__sc_oom(b);
    return eng__sc_compile(b, w, depth, plen, out);
}

/* if / then / else: the values of (if and then) or of (not if and else).
 * Where "not if" cannot be enforced (docs/api.md, not), only the first
 * alternative is generated (a narrowing). */
int eng__sc_compile_if(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    const json_t *cond = json_object_get(s, "if");
    const json_t *then = json_object_get(s, "then"), *other = json_object_get(s, "else");
    json_t *rest = json_copy((json_t *)s);
    if (!rest || !eng__sc_doc_keep(b->doc, rest))
        return eng__sc_oom(b);
    json_object_del(rest, "if");
    json_object_del(rest, "then");
    json_object_del(rest, "else");
    json_t *yes = json_pack("{s:[OOO]}", "allOf", rest, cond, then ? then : json_true());
    json_t *no = json_pack("{s:[O{s:O}O]}", "allOf", rest, "not", cond,
                           other ? other : json_true());
    if (!yes || !eng__sc_doc_keep(b->doc, yes) || !no || !eng__sc_doc_keep(b->doc, no))
        return eng__sc_oom(b);
    int32_t alts[2], n = 0, a;
    int rc = eng__sc_compile(b, yes, depth, eng__sc_path_push(b, plen, "then"), &a);
    if (rc)
        return rc;
    if (a != CS_NEVER)
        alts[n++] = a;
    rc = eng__sc_compile(b, no, depth, eng__sc_path_push(b, plen, "else"), &a);
    if (rc == SW_EUNSUPPORTED && n > 0)
        rc = SW_OK, a = CS_NEVER; /* "not if" cannot be enforced: then only */
    if (rc)
        return rc;
    if (a != CS_NEVER)
        alts[n++] = a;
    if (n == 0) {
        *out = CS_NEVER;
        return SW_OK;
    }
    if (n == 1) {
        *out = alts[0];
        return SW_OK;
    }
    if ((*out = eng__sc_make_anyof(b->g, alts, n)) < 0)
        return eng__sc_oom(b);
    if (b->g->nodes[*out].n_branches > ENG_CS_MAX_BRANCHES)
        return eng__sc_fail_at(b, plen, SW_EUNSUPPORTED,
                               "if/then/else alternatives expand to more than 64 branches");
    return SW_OK;
}

/* A positive schema meaning "not n", for the simple forms: one numeric
 * bound (not minimum 5: a number below 5), or one property's schema (not
 * {properties: {p: S}}: an object with p, not S). New reference, or NULL
 * when n is not of those forms. */
json_t *eng__sc_negate_simple(const json_t *n)
{
    if (!json_is_object(n))
        return NULL;
    const char *k, *only = NULL;
    const json_t *v;
    json_object_foreach((json_t *)n, k, v) {
        if (!eng__sc_is_known_keyword(k))
            continue;
        if (only)
            return NULL;
        only = k;
    }
    if (!only)
        return NULL;
    v = json_object_get(n, only);
    if (strcmp(only, "not") == 0 && json_is_object(v))
        return json_incref((json_t *)v); /* not not S: S */
    static const char *const flip[4][2] = {{"minimum", "exclusiveMaximum"},
                                           {"maximum", "exclusiveMinimum"},
                                           {"exclusiveMinimum", "maximum"},
                                           {"exclusiveMaximum", "minimum"}};
    for (int i = 0; i < 4; i++)
        if (strcmp(only, flip[i][0]) == 0 && eng__sc_is_num(v))
            return json_pack("{s:s,s:O}", "type", "number", flip[i][1], v);
    if (strcmp(only, "properties") == 0 && json_is_object(v) && json_object_size(v) == 1) {
        void *it = json_object_iter((json_t *)v);
        const char *p = json_object_iter_key(it);
        json_t *sub = json_object_iter_value(it);
        return json_pack("{s:s,s:[s],s:{s:{s:O}}}", "type", "object", "required", p,
                         "properties", p, "not", sub);
    }
    return NULL;
}

/* ---- not of any schema --------------------------------------------------
 * "not S" beyond what eng__sc_analyze_not folds into the node (types, one
 * required name, literal filters) is compiled as a union of positive
 * schemas, each the context (the schema's other keywords) and one way of
 * failing one keyword of S: not {minLength: 3} is a string of at most 2
 * code points, not {required: [a]} an object without a, not {properties:
 * {p: P}} an object whose p is not P, not {pattern: p} a string matching
 * ^(?![\s\S]*(?:p)), not (A or B) the products of not A and not B, ... A
 * keyword whose failing values have no such form (multipleOf, uniqueItems,
 * additionalProperties, ...) adds no alternative: its failing values are
 * never generated (a narrowing), and where nothing is left the schema is
 * refused, naming the keyword. Each alternative is a subset of "not S", so
 * none can let a value of S through. */

#define NEG_MAX_TERMS 64
#define NEG_MAX_NEST 8
/* The alternatives a product of negations keeps at each step */
#define NEG_PRODUCT_WIDTH 8

typedef struct neg_ctx {
    builder *b;
    const char *left_out; /* the first keyword whose failing values are not generated */
    bool over;            /* SC_MAX_NEG_MERGES reached */
    size_t cap;           /* alternatives the list being filled may take */
    char why[200];        /* the first alternative refused while merging, or "" */
} neg_ctx;

static json_t *types_json(int m)
{
    static const struct {
        int bit;
        const char *name;
    } names[] = {{T_OBJECT, "object"}, {T_ARRAY, "array"},     {T_STRING, "string"},
                 {T_NUMBER, "number"}, {T_INTEGER, "integer"}, {T_BOOLEAN, "boolean"},
                 {T_NULL, "null"}};
    json_t *a = json_array();
    for (size_t i = 0; a && i < sizeof names / sizeof *names; i++) {
        if (!(m & names[i].bit) || (names[i].bit == T_INTEGER && (m & T_NUMBER)))
            continue;
        json_array_append_new(a, json_string(names[i].name));
    }
    return a;
}

/* True where the merged schema m admits no value for a reason visible
 * without compiling it. */
static bool neg_empty(const json_t *m)
{
    if (json_is_false(m))
        return true;
    if (!json_is_object(m))
        return false;
    const json_t *req = json_object_get(m, "required");
    const json_t *props = json_object_get(m, "properties");
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *name = json_string_value(json_array_get(req, i));
        const json_t *ps = name ? json_object_get(props, name) : NULL;
        if (json_is_false(ps))
            return true;
        /* S and not S, as merging a property's schema with its negation
         * writes it */
        const json_t *all = json_object_get(ps, "allOf");
        if (json_array_size(all) == 2 && json_object_size(ps) == 1) {
            for (int side = 0; side < 2; side++) {
                const json_t *x = json_array_get(all, side), *y = json_array_get(all, !side);
                if (json_object_size(y) == 1 && json_equal(json_object_get(y, "not"), (json_t *)x))
                    return true;
            }
        }
    }
    int tm = eng__sc_type_mask(json_object_get(m, "type"));
    if (tm >= 0 && (tm & ~(T_NUMBER | T_INTEGER)) == 0 &&
        bounds_apart(eng__sc_bound_get(m, true), eng__sc_bound_get(m, false)))
        return true;
    for (size_t i = 0; i < 3; i++) {
        const json_t *lo = json_object_get(m, min_keys[i]), *hi = json_object_get(m, max_keys[i]);
        if (json_is_integer(lo) && json_is_integer(hi) &&
            json_integer_value(lo) > json_integer_value(hi))
            return true;
    }
    return false;
}

/* Appends to out ctx and d merged (d: a new reference, taken), unless that
 * is visibly empty, or cannot be merged (remembered), or out is full (a
 * narrowing). */
static int neg_term(neg_ctx *c, const json_t *ctx, json_t *d, json_t *out)
{
    builder *b = c->b;
    if (!d)
        return eng__sc_oom(b);
    if (json_array_size(out) >= c->cap) {
        json_decref(d);
        if (!c->left_out)
            c->left_out = "anyOf";
        return SW_OK;
    }
    b->neg_work += 1 + (int64_t)json_object_size(json_object_get(ctx, "properties")) +
                   (int64_t)json_object_size(json_object_get(d, "properties"));
    if (b->neg_work > SC_MAX_NEG_WORK) {
        json_decref(d);
        if (!c->over && !c->why[0])
            snprintf(c->why, sizeof c->why,
                     "excluding the values of the other alternatives takes too many merged "
                     "schemas");
        c->over = true;
        return SW_OK;
    }
    json_t *w = json_pack("{s:[Oo]}", "allOf", ctx, d);
    if (!w || !eng__sc_doc_keep(b->doc, w))
        return eng__sc_oom(b);
    const json_t *m;
    sw_error e;
    int rc = eng__sc_effective(b->doc, w, b->base, &m, &e);
    if (rc == SW_EUNSUPPORTED || rc == SW_EINVAL) {
        if (!c->why[0])
            snprintf(c->why, sizeof c->why, "%.199s", e.message);
        return SW_OK;
    }
    if (rc)
        return sw_error_set(b->err, rc, "%s", e.message);
    if (neg_empty(m))
        return SW_OK;
    return json_array_append(out, (json_t *)m) ? eng__sc_oom(b) : SW_OK;
}

/* A pattern matching the strings that are none of names' strings. */
static json_t *neg_exclusion_pattern(const json_t *names)
{
    size_t cap = 16;
    for (size_t i = 0; i < json_array_size(names); i++)
        cap += json_string_length(json_array_get(names, i)) * 12 + 1;
    char *pat = sw_malloc(cap), *p = pat;
    if (!pat)
        return NULL;
    p += sprintf(p, "^(?!(?:");
    for (size_t i = 0; i < json_array_size(names); i++) {
        const unsigned char *u = (const unsigned char *)json_string_value(json_array_get(names, i));
        size_t n = json_string_length(json_array_get(names, i));
        if (i)
            *p++ = '|';
        for (size_t j = 0; j < n;) {
            uint32_t cp = u[j]; /* valid UTF-8: jansson checks it */
            size_t len = cp < 0x80 ? 1 : cp < 0xE0 ? 2 : cp < 0xF0 ? 3 : 4;
            if (len > 1)
                cp &= 0x3Fu >> (len - 1);
            for (size_t t = 1; t < len && j + t < n; t++)
                cp = (cp << 6) | (u[j + t] & 0x3Fu);
            p += sprintf(p, "\\u{%X}", (unsigned)cp);
            j += len;
        }
    }
    p += sprintf(p, ")$)");
    json_t *s = json_stringn(pat, (size_t)(p - pat));
    sw_free(pat);
    return s;
}

/* not (enum / const): a value of another type, or of the same type that
 * none of the values is. */
static int neg_literals(neg_ctx *c, const json_t *ctx, const json_t *vals, int tm, json_t *out)
{
    int present = 0;
    bool has_true = false, has_false = false, empty_obj = false, other_obj = false;
    bool empty_arr = false, other_arr = false;
    const json_t *lo = NULL, *hi = NULL;
    json_t *strs = json_array();
    if (!strs || !eng__sc_doc_keep(c->b->doc, strs))
        return eng__sc_oom(c->b);
    for (size_t i = 0; i < json_array_size(vals); i++) {
        const json_t *v = json_array_get(vals, i);
        if (json_is_true(v))
            has_true = true, present |= T_BOOLEAN;
        else if (json_is_false(v))
            has_false = true, present |= T_BOOLEAN;
        else if (json_is_null(v))
            present |= T_NULL;
        else if (eng__sc_is_num(v)) {
            present |= T_NUMBER | T_INTEGER;
            if (!lo || eng__sc_num_cmp(v, lo) < 0)
                lo = v;
            if (!hi || eng__sc_num_cmp(v, hi) > 0)
                hi = v;
        } else if (json_is_string(v)) {
            present |= T_STRING;
            json_array_append(strs, (json_t *)v);
        } else if (json_is_object(v)) {
            present |= T_OBJECT;
            *(json_object_size(v) ? &other_obj : &empty_obj) = true;
        } else if (json_is_array(v)) {
            present |= T_ARRAY;
            *(json_array_size(v) ? &other_arr : &empty_arr) = true;
        }
    }
    int rc;
    int absent = T_ALL & ~present & tm;
    if (absent && (rc = neg_term(c, ctx, json_pack("{s:o}", "type", types_json(absent)), out)))
        return rc;
    if (has_true != has_false && (tm & T_BOOLEAN) &&
        (rc = neg_term(c, ctx, json_pack("{s:b}", "const", !has_true), out)))
        return rc;
    if ((present & T_STRING) && (tm & T_STRING)) {
        json_t *p = neg_exclusion_pattern(strs);
        if (!p || (rc = neg_term(c, ctx, json_pack("{s:s,s:o}", "type", "string", "pattern", p),
                                 out)))
            return p ? rc : eng__sc_oom(c->b);
    }
    if (lo && (tm & T_INTEGER)) {
        if ((rc = neg_term(c, ctx, json_pack("{s:s,s:O}", "type", "number", "exclusiveMinimum", hi),
                           out)) ||
            (rc = neg_term(c, ctx, json_pack("{s:s,s:O}", "type", "number", "exclusiveMaximum", lo),
                           out)))
            return rc;
    }
    if ((present & T_OBJECT) && (tm & T_OBJECT) && (!empty_obj || !other_obj) &&
        (rc = neg_term(c, ctx,
                       json_pack("{s:s,s:i}", "type", "object",
                                 empty_obj ? "minProperties" : "maxProperties", empty_obj ? 1 : 0),
                       out)))
        return rc;
    if ((present & T_ARRAY) && (tm & T_ARRAY) && (!empty_arr || !other_arr) &&
        (rc = neg_term(c, ctx,
                       json_pack("{s:s,s:i}", "type", "array", empty_arr ? "minItems" : "maxItems",
                                 empty_arr ? 1 : 0),
                       out)))
        return rc;
    if ((present & T_OBJECT) && empty_obj && other_obj && !c->left_out)
        c->left_out = "enum";
    if ((present & T_ARRAY) && empty_arr && other_arr && !c->left_out)
        c->left_out = "enum";
    return SW_OK;
}

static int negate(neg_ctx *c, const json_t *ctx, const json_t *s, json_t *out, int nest);

/* Values of ctx that fail every schema of list (anyOf / oneOf none
 * matching): the products of their negations, at most NEG_MAX_TERMS. */
/* Appends to flat the schemas of list, an anyOf directly inside it (what
 * merging "not A" and "not B" makes: not {anyOf: [A, B]}) spliced in. */
static int neg_flatten(const json_t *list, json_t *flat, int nest)
{
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *x = json_array_get(list, i);
        const json_t *inner = json_object_get(x, "anyOf");
        if (json_is_array(inner) && nest < 64 && eng__sc_only_annotations(x, "anyOf")) {
            if (neg_flatten(inner, flat, nest + 1))
                return SW_ENOMEM;
            continue;
        }
        if (json_array_size(flat) >= 4 * NEG_MAX_TERMS || json_array_append(flat, (json_t *)x))
            return json_array_size(flat) >= 4 * NEG_MAX_TERMS ? SW_ERANGE : SW_ENOMEM;
    }
    return SW_OK;
}

static int neg_none_of(neg_ctx *c, const json_t *ctx, const json_t *nested, json_t *out,
                       int nest)
{
    builder *b = c->b;
    json_t *list = json_array();
    if (!list || !eng__sc_doc_keep(b->doc, list))
        return eng__sc_oom(b);
    int frc = neg_flatten(nested, list, 0);
    if (frc == SW_ERANGE) {
        if (!c->left_out)
            c->left_out = "anyOf";
        return SW_OK;
    }
    if (frc)
        return eng__sc_oom(b);
    json_t *cur = json_array();
    if (!cur || !eng__sc_doc_keep(b->doc, cur) || json_array_append(cur, (json_t *)ctx))
        return eng__sc_oom(b);
    for (size_t i = 0; i < json_array_size(list) && json_array_size(cur) && !c->over; i++) {
        json_t *next = json_array();
        if (!next || !eng__sc_doc_keep(b->doc, next))
            return eng__sc_oom(b);
        /* each element of the product so far takes a share of the width,
         * at least one way of failing the next alternative (fewer ways:
         * a narrowing) */
        size_t quota = NEG_PRODUCT_WIDTH / json_array_size(cur), saved = c->cap;
        for (size_t j = 0; j < json_array_size(cur); j++) {
            json_t *one = json_array();
            if (!one || !eng__sc_doc_keep(b->doc, one))
                return eng__sc_oom(b);
            c->cap = quota ? quota : 1;
            int rc = negate(c, json_array_get(cur, j), json_array_get(list, i), one, nest + 1);
            c->cap = saved;
            if (rc)
                return rc;
            if (json_array_extend(next, one))
                return eng__sc_oom(b);
        }
        cur = next;
    }
    if (c->over)
        return SW_OK; /* a product cut short negates only some of them */
    for (size_t j = 0; j < json_array_size(cur); j++) {
        if (json_array_size(out) >= c->cap) {
            if (!c->left_out)
                c->left_out = "anyOf";
            break;
        }
        if (json_array_append(out, json_array_get(cur, j)))
            return eng__sc_oom(b);
    }
    return SW_OK;
}

/* ctx merged with d (taken), for a negation inside it; NULL where empty. */
static int neg_narrow(neg_ctx *c, const json_t *ctx, json_t *d, const json_t **out)
{
    json_t *one = json_array();
    if (!one || !eng__sc_doc_keep(c->b->doc, one))
        return eng__sc_oom(c->b);
    int rc = neg_term(c, ctx, d, one);
    *out = json_array_size(one) ? json_array_get(one, 0) : NULL;
    return rc;
}

/* Appends to out schemas whose values are values of ctx failing s. */
static int negate(neg_ctx *c, const json_t *ctx, const json_t *s, json_t *out, int nest)
{
    builder *b = c->b;
    if (json_is_true(s))
        return SW_OK;
    if (json_is_false(s))
        return neg_term(c, ctx, json_object(), out);
    if (nest > NEG_MAX_NEST) {
        if (!c->left_out)
            c->left_out = "not";
        return SW_OK;
    }
    const json_t *eff;
    sw_error e;
    int rc = eng__sc_effective(b->doc, s, b->base, &eff, &e);
    if (rc == SW_EUNSUPPORTED && json_is_array(json_object_get(s, "allOf")) &&
        !json_object_get(s, "$ref")) {
        /* not (A and B): not A, or not B, and not the other keywords */
        json_t *rest = json_copy((json_t *)s);
        if (!rest || !eng__sc_doc_keep(b->doc, rest))
            return eng__sc_oom(b);
        json_object_del(rest, "allOf");
        const json_t *all = json_object_get(s, "allOf");
        for (size_t i = 0; i < json_array_size(all); i++)
            if ((rc = negate(c, ctx, json_array_get(all, i), out, nest + 1)))
                return rc;
        return negate(c, ctx, rest, out, nest + 1);
    }
    if (rc == SW_EUNSUPPORTED || rc == SW_EINVAL) {
        if (!c->why[0])
            snprintf(c->why, sizeof c->why, "%.199s", e.message);
        return SW_OK;
    }
    if (rc)
        return sw_error_set(b->err, rc, "%s", e.message);
    if (json_is_boolean(eff))
        return negate(c, ctx, eff, out, nest + 1);
    int tm = eng__sc_type_mask(json_object_get(eff, "type"));
    if (tm < 0) {
        if (!c->why[0])
            snprintf(c->why, sizeof c->why, "a malformed 'type' inside 'not'");
        return SW_OK;
    }
    bool draft7 = b->doc->dialect != SC_2020;
    const char *k;
    const json_t *v;
    /* the ways of failing that need no schema compiled in turn first: a
     * product of negations keeps the first ones of each */
    for (int pass = 0; pass < 2; pass++) {
        json_object_foreach((json_t *)eff, k, v) {
            if (!eng__sc_is_known_keyword(k))
                continue;
            bool direct = strcmp(k, "type") == 0 || strcmp(k, "required") == 0 ||
                          strcmp(k, "const") == 0 || strcmp(k, "enum") == 0 ||
                          strcmp(k, "pattern") == 0 || strcmp(k, "dependentRequired") == 0 ||
                          IN_LIST(k, min_keys) || IN_LIST(k, max_keys) || IN_LIST(k, bound_keys);
            if (direct != (pass == 0))
                continue;
            rc = SW_OK;
            if (strcmp(k, "type") == 0) {
                int other = T_ALL & ~tm;
                /* not integer: the numbers left are fractions, which no node
                 * generates apart (a narrowing) */
                if ((other & T_NUMBER) && !(other & T_INTEGER))
                    other &= ~T_NUMBER;
                if (other)
                    rc = neg_term(c, ctx, json_pack("{s:o}", "type", types_json(other)), out);
            } else if (strcmp(k, "const") == 0 || strcmp(k, "enum") == 0) {
                json_t *vals =
                    strcmp(k, "const") == 0 ? json_pack("[O]", v) : json_incref((json_t *)v);
                if (!vals || !eng__sc_doc_keep(b->doc, vals))
                    return eng__sc_oom(b);
                if (json_is_array(vals))
                    rc = neg_literals(c, ctx, vals, tm, out);
            } else if (IN_LIST(k, min_keys) || IN_LIST(k, max_keys)) {
                static const char *const flip[][3] = {
                    {"minLength", "maxLength", "string"},  {"maxLength", "minLength", "string"},
                    {"minItems", "maxItems", "array"},      {"maxItems", "minItems", "array"},
                    {"minProperties", "maxProperties", "object"},
                    {"maxProperties", "minProperties", "object"}};
                bool is_min = IN_LIST(k, min_keys);
                for (size_t i = 0; i < sizeof flip / sizeof *flip; i++) {
                    if (strcmp(k, flip[i][0]) != 0 || !json_is_integer(v))
                        continue;
                    json_int_t n = json_integer_value(v);
                    if ((is_min && n <= 0) || n < 0 || n >= INT32_MAX - 1)
                        break;
                    rc = neg_term(c, ctx,
                                  json_pack("{s:s,s:I}", "type", flip[i][2], flip[i][1],
                                            (json_int_t)(is_min ? n - 1 : n + 1)),
                                  out);
                }
                if (strcmp(k, "minContains") == 0 || strcmp(k, "maxContains") == 0)
                    continue; /* with contains below */
            } else if (IN_LIST(k, bound_keys)) {
                if (b->doc->dialect == SC_DRAFT4)
                    goto left_out;
                if (!(tm & T_INTEGER))
                    continue;
                bool lower = strcmp(k, "minimum") == 0 || strcmp(k, "exclusiveMinimum") == 0;
                bool excl = strncmp(k, "exclusive", 9) == 0;
                if (!eng__sc_is_num(v))
                    continue;
                const char *key = lower ? (excl ? "maximum" : "exclusiveMaximum")
                                        : (excl ? "minimum" : "exclusiveMinimum");
                rc = neg_term(c, ctx, json_pack("{s:s,s:O}", "type", "number", key, v), out);
            } else if (strcmp(k, "pattern") == 0) {
                if (!json_is_string(v) || !(tm & T_STRING))
                    continue;
                if (memchr(json_string_value(v), '\0', json_string_length(v)))
                    goto left_out;
                char *x = eng__sc_pattern_prefix_form(v);
                size_t n = x ? strlen(x) + 8 : 0;
                char *pat = x ? sw_malloc(n) : NULL;
                if (pat)
                    snprintf(pat, n, "^(?!%s)", x);
                json_t *ps = pat ? json_string(pat) : NULL;
                sw_free(x);
                sw_free(pat);
                if (!ps)
                    return eng__sc_oom(b);
                rc = neg_term(c, ctx, json_pack("{s:s,s:o}", "type", "string", "pattern", ps), out);
            } else if (strcmp(k, "required") == 0) {
                for (size_t i = 0; !rc && i < json_array_size(v); i++) {
                    const char *name = json_string_value(json_array_get(v, i));
                    if (name && (tm & T_OBJECT))
                        rc = neg_term(c, ctx,
                                      json_pack("{s:s,s:{s:b}}", "type", "object",
                                                "properties", name, 0),
                                      out);
                }
            } else if (strcmp(k, "properties") == 0) {
                const char *name;
                const json_t *ps;
                if (!(tm & T_OBJECT))
                    continue;
                json_object_foreach((json_t *)v, name, ps) {
                    if (json_is_true(ps) || (json_is_object(ps) && json_object_size(ps) == 0))
                        continue;
                    if ((rc = neg_term(c, ctx,
                                       json_pack("{s:s,s:[s],s:{s:{s:O}}}", "type", "object",
                                                 "required", name, "properties", name, "not", ps),
                                       out)))
                        break;
                }
            } else if (strcmp(k, "dependentRequired") == 0 ||
                       (strcmp(k, "dependencies") == 0 && draft7)) {
                const char *name;
                const json_t *dv;
                if (!(tm & T_OBJECT))
                    continue;
                json_object_foreach((json_t *)v, name, dv) {
                    if (json_is_array(dv)) {
                        for (size_t i = 0; !rc && i < json_array_size(dv); i++) {
                            const char *o = json_string_value(json_array_get(dv, i));
                            if (o)
                                rc = neg_term(c, ctx,
                                              json_pack("{s:s,s:[s],s:{s:b}}", "type", "object",
                                                        "required", name, "properties", o, 0),
                                              out);
                        }
                    } else {
                        const json_t *with;
                        if (!(rc = neg_narrow(c, ctx,
                                              json_pack("{s:s,s:[s]}", "type", "object", "required",
                                                        name),
                                              &with)) &&
                            with)
                            rc = negate(c, with, dv, out, nest + 1);
                    }
                    if (rc)
                        break;
                }
            } else if (strcmp(k, "dependentSchemas") == 0) {
                const char *name;
                const json_t *dv;
                if (!(tm & T_OBJECT))
                    continue;
                json_object_foreach((json_t *)v, name, dv) {
                    const json_t *with;
                    if ((rc = neg_narrow(
                             c, ctx, json_pack("{s:s,s:[s]}", "type", "object", "required", name),
                             &with)))
                        break;
                    if (with && (rc = negate(c, with, dv, out, nest + 1)))
                        break;
                }
            } else if (strcmp(k, "items") == 0 && !json_is_array(v) &&
                       !json_object_get(eff, "prefixItems")) {
                if (tm & T_ARRAY)
                    rc = neg_term(c, ctx,
                                  json_pack("{s:s,s:i,s:{s:O}}", "type", "array", "minItems", 1,
                                            "items", "not", v),
                                  out);
            } else if (strcmp(k, "prefixItems") == 0 || (strcmp(k, "items") == 0 && draft7)) {
                for (size_t i = 0; !rc && i < json_array_size(v) && (tm & T_ARRAY); i++) {
                    json_t *tuple = json_array();
                    for (size_t j = 0; tuple && j < i; j++)
                        json_array_append(tuple, json_true());
                    if (!tuple ||
                        json_array_append_new(tuple,
                                              json_pack("{s:O}", "not", json_array_get(v, i))))
                        return eng__sc_oom(b);
                    rc = neg_term(c, ctx,
                                  json_pack("{s:s,s:I,s:o}", "type", "array", "minItems",
                                            (json_int_t)i + 1, k, tuple),
                                  out);
                }
                if (strcmp(k, "prefixItems") == 0 && json_object_get(eff, "items"))
                    goto left_out;
            } else if (strcmp(k, "contains") == 0) {
                const json_t *mc = json_object_get(eff, "minContains");
                if (json_is_integer(mc) && json_integer_value(mc) == 0)
                    continue;
                if (json_object_get(eff, "maxContains") && !c->left_out)
                    c->left_out = "maxContains";
                if (tm & T_ARRAY)
                    rc = neg_term(c, ctx,
                                  json_pack("{s:s,s:{s:O}}", "type", "array", "items", "not", v),
                                  out);
            } else if (strcmp(k, "not") == 0) {
                rc = neg_term(c, ctx, json_incref((json_t *)v), out);
            } else if (strcmp(k, "anyOf") == 0 || strcmp(k, "oneOf") == 0) {
                if (!json_is_array(v))
                    continue;
                /* none of them (for oneOf, two matching would fail it too: those
                 * values are left out) */
                rc = neg_none_of(c, ctx, v, out, nest);
            } else if (strcmp(k, "if") == 0) {
                const json_t *then = json_object_get(eff, "then");
                const json_t *other = json_object_get(eff, "else");
                if (then) {
                    const json_t *with;
                    if (!(rc = neg_narrow(c, ctx, json_incref((json_t *)v), &with)) && with)
                        rc = negate(c, with, then, out, nest + 1);
                }
                if (!rc && other) {
                    json_t *both = json_pack("[OO]", v, other);
                    if (!both || !eng__sc_doc_keep(b->doc, both))
                        return eng__sc_oom(b);
                    rc = neg_none_of(c, ctx, both, out, nest);
                }
            } else if (strcmp(k, "additionalProperties") == 0 && !json_is_true(v)) {
                /* a name the context declares that s leaves to
                 * additionalProperties, present with a value failing it */
                const char *name;
                const json_t *cs;
                bool any = false;
                if (!(tm & T_OBJECT))
                    continue;
                json_object_foreach(json_object_get(ctx, "properties"), name, cs) {
                    if (json_is_false(cs) ||
                        json_object_get(json_object_get(eff, "properties"), name))
                        continue;
                    const char *pat;
                    const json_t *ps;
                    bool matched = false;
                    json_object_foreach(json_object_get(eff, "patternProperties"), pat, ps) {
                        sw_error perr;
                        if (eng__sc_pattern_match_name(pat, name, &perr) != 0)
                            matched = true; /* or an error: not a sure way of failing */
                    }
                    if (matched)
                        continue;
                    any = true;
                    if ((rc = neg_term(c, ctx,
                                       json_pack("{s:s,s:[s],s:{s:{s:O}}}", "type", "object",
                                                 "required", name, "properties", name, "not", v),
                                       out)))
                        break;
                }
                if (!any && !c->left_out)
                    c->left_out = k;
            } else if (strcmp(k, "then") == 0 || strcmp(k, "else") == 0 ||
                       (strcmp(k, "uniqueItems") == 0 && !json_is_true(v))) {
                continue;
            } else if (strcmp(k, "format") == 0 &&
                       !(json_is_string(v) && IN_LIST(json_string_value(v), known_formats))) {
                continue; /* an annotation */
            } else {
            left_out:
                if (!c->left_out)
                    c->left_out = k;
                continue;
            }
            if (rc)
                return rc;
        }
    }
    return SW_OK;
}

int eng__sc_compile_not(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    size_t l = eng__sc_path_push(b, plen, "not");
    json_t *rest = json_copy((json_t *)s);
    json_t *terms = json_array();
    if (!rest || !eng__sc_doc_keep(b->doc, rest) || !terms || !eng__sc_doc_keep(b->doc, terms))
        return eng__sc_oom(b);
    json_object_del(rest, "not");
    neg_ctx c = {b, NULL, false, NEG_MAX_TERMS, ""};
    int rc = negate(&c, rest, json_object_get(s, "not"), terms, 0);
    if (rc)
        return rc;
    if (b->chain[depth] >= SC_MAX_REF_CHAIN)
        return eng__sc_fail_at(b, l, SW_EUNSUPPORTED,
                               "'not' nests too deeply (a $ref cycle inside 'not'?)");
    int32_t alts[NEG_MAX_TERMS], kept = 0;
    const char *refused = NULL;
    char why[256] = "";
    b->chain[depth]++;
    for (size_t i = 0; i < json_array_size(terms); i++) {
        int32_t a;
        rc = eng__sc_compile(b, json_array_get(terms, i), depth, l, &a);
        if (rc == SW_EUNSUPPORTED && b->steps <= SC_MAX_COMPILE_STEPS) {
            if (!refused) {
                snprintf(why, sizeof why, "%.255s", b->err ? b->err->message : "");
                refused = why;
            }
            rc = SW_OK;
            continue; /* this way of failing is not generated (a narrowing) */
        }
        if (rc)
            break;
        if (a != CS_NEVER)
            alts[kept++] = a;
    }
    b->chain[depth]--;
    if (rc)
        return rc;
    if (kept == 0 && (c.left_out || c.why[0] || refused)) {
        char what[480];
        if (refused)
            return sw_error_set(b->err, SW_EUNSUPPORTED, "'not' cannot be enforced: %s",
                                refused);
        if (c.why[0])
            snprintf(what, sizeof what, "'not' cannot be enforced here: %s", c.why);
        else
            snprintf(what, sizeof what,
                     "'not' of '%.64s' cannot be enforced (no value failing it can be generated)",
                     c.left_out);
        return eng__sc_fail_at(b, l, SW_EUNSUPPORTED, what);
    }
    if (kept == 0) {
        *out = CS_NEVER;
        return SW_OK;
    }
    if (kept == 1) {
        *out = alts[0];
        return SW_OK;
    }
    if ((*out = eng__sc_make_anyof(b->g, alts, kept)) < 0)
        return eng__sc_oom(b);
    if (b->g->nodes[*out].n_branches > ENG_CS_MAX_BRANCHES)
        return eng__sc_fail_at(b, l, SW_EUNSUPPORTED,
                               "'not' expands to more than 64 alternatives");
    return SW_OK;
}
