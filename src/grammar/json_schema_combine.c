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
