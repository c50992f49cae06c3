/* json_schema.c - compiles a JSON Schema subset into the node graph of
 * constrain-impl.h (see json_schema.h for the subset and why).
 *
 * Children are compiled before their parent node is created, so every
 * node's children have lower indices and each node's minimum length can be
 * computed once, at creation. Errors carry a JSON pointer ("#/properties/
 * a/items") to the offending keyword.
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

/* ---- errors and paths ---------------------------------------------------- */

/* Appends "/seg" (JSON pointer escaping) to the path at len; returns the new
 * length (the path is cut short, never overflowed). */
size_t eng__sc_pointer_push(char *path, size_t cap, size_t len, const char *seg)
{
    if (len + 1 < cap)
        path[len++] = '/';
    for (const char *p = seg; *p && len + 2 < cap; p++) {
        if (*p == '~' || *p == '/') {
            path[len++] = '~';
            path[len++] = *p == '~' ? '0' : '1';
        } else {
            path[len++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
        }
    }
    path[len] = '\0';
    return len;
}

size_t eng__sc_path_push(builder *b, size_t len, const char *seg)
{
    return eng__sc_pointer_push(b->path, sizeof b->path, len, seg);
}

size_t eng__sc_path_push_index(builder *b, size_t len, size_t i)
{
    char seg[24];
    snprintf(seg, sizeof seg, "%zu", i);
    return eng__sc_path_push(b, len, seg);
}

int eng__sc_fail_at(builder *b, size_t len, int code, const char *what)
{
    b->path[len] = '\0';
    return sw_error_set(b->err, code, "%s (at %s)", what, b->path);
}

/* A text copy of a JSON value (compact), sw_malloc'd. */
char *eng__sc_dump_value(const json_t *v, int32_t *len_out)
{
    char *j = sw_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY); /* markers: their numbers */
    if (!j)
        return NULL;
    size_t n = strlen(j);
    char *copy = n < (size_t)CS_LEN_CAP ? sw_strndup(j, n) : NULL;
    free(j);
    if (copy)
        *len_out = (int32_t)n;
    return copy;
}

/* ---- the compiler ----------------------------------------------------------- */

/* Keywords that constrain values of one type: a schema without "type" that
 * holds some of them generates values of those types only (a narrowing:
 * {"minLength": 2} also allows any number). */
static const char *const object_keywords[] = {
    "properties", "required", "additionalProperties", "patternProperties", "minProperties",
    "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
};
static const char *const array_keywords[] = {"items", "prefixItems", "additionalItems",
                                             "minItems", "maxItems", "contains",
                                             "minContains", "maxContains", "uniqueItems"};
static const char *const string_keywords[] = {"minLength", "maxLength", "pattern"};
static const char *const number_keywords[] = {"minimum", "maximum", "exclusiveMinimum",
                                              "exclusiveMaximum", "multipleOf"};

/* Whether no array satisfies the schema's contains: contains false
 * (without minContains 0), or minContains above maxContains. */
static bool contains_unsatisfiable(const json_t *s)
{
    const json_t *c = json_object_get(s, "contains");
    const json_t *lo = json_object_get(s, "minContains"), *hi = json_object_get(s, "maxContains");
    if (!c)
        return false;
    double min = json_is_number(lo) ? json_number_value(lo) : 1;
    if (json_is_false(c) && min > 0)
        return true;
    return json_is_number(hi) && min > json_number_value(hi);
}

static int inferred_types(const json_t *s)
{
    int m = 0;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (IN_LIST(k, object_keywords))
            m |= T_OBJECT;
        else if (IN_LIST(k, array_keywords) && !(strcmp(k, "uniqueItems") == 0 && json_is_false(v)))
            m |= T_ARRAY;
        else if (IN_LIST(k, string_keywords))
            m |= T_STRING;
        else if (IN_LIST(k, number_keywords))
            m |= T_NUMBER | T_INTEGER;
    }
    return m ? m : T_ALL;
}

/* The first keyword of s that is a known assertion the compiler cannot
 * enforce, or NULL. Unknown keywords are annotations. */
static const char *refused_keyword(const sc_doc *d, const json_t *s)
{
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (!eng__sc_is_known_keyword(key))
            continue;
        if (strcmp(key, "uniqueItems") == 0)
            continue; /* at most one item is generated */
        if (strcmp(key, "format") == 0) {
            if (json_is_string(v) && IN_LIST(json_string_value(v), known_formats) &&
                !eng_format_pattern(json_string_value(v), NULL))
                return key;
            continue;
        }
        if (strcmp(key, "items") == 0 || strcmp(key, "additionalItems") == 0)
            continue; /* draft 7 tuples too */
        if (strcmp(key, "minContains") == 0 || strcmp(key, "maxContains") == 0 ||
            strcmp(key, "then") == 0 || strcmp(key, "else") == 0) {
            continue; /* without contains / if: no effect; with them: refused there */
        }
        if (strcmp(key, "$ref") == 0 && d->dialect == SC_2020)
            continue;
        if (strcmp(key, "$ref") == 0)
            return NULL; /* draft 7: the other keywords are ignored */
        if (
            strcmp(key, "unevaluatedItems") == 0 || strcmp(key, "unevaluatedProperties") == 0 ||
            strcmp(key, "$dynamicRef") == 0 || strcmp(key, "$recursiveRef") == 0)
            return key;
    }
    return NULL;
}

/* A string the compiler reads as a C string (a type, format or property
 * name, a URI) that holds U+0000, which would cut it short: the keyword
 * holding it, or NULL. Data (const, enum, pattern, ...) are read with
 * their lengths and may hold it. */
static bool has_nul(const json_t *v)
{
    if (json_is_string(v))
        return memchr(json_string_value(v), 0, json_string_length(v)) != NULL;
    for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++)
        if (has_nul(json_array_get(v, i)))
            return true;
    return false;
}

static const char *nul_name(const json_t *s)
{
    static const char *const named[] = {"type", "format", "required", "$ref", "$id",
                                        "$anchor", "$schema", "id"};
    for (size_t i = 0; i < sizeof named / sizeof *named; i++)
        if (has_nul(json_object_get(s, named[i])))
            return named[i];
    static const char *const lists[] = {"dependentRequired", "dependencies"};
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
        const char *k;
        const json_t *v;
        json_object_foreach(json_object_get(s, lists[i]), k, v) {
            if (json_is_array(v) && has_nul(v))
                return lists[i];
        }
    }
    return NULL;
}

/* True when every keyword of s other than `except` is an annotation. */
bool eng__sc_only_annotations(const json_t *s, const char *except)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (strcmp(k, except) != 0 && eng__sc_is_known_keyword(k))
            return false;
    }
    return true;
}

/* ---- flattening allOf and $ref ---- */

/* Appends to atoms the schemas whose conjunction s is, without allOf or
 * $ref; base is where s's references resolve. */
static int flatten(sc_doc *d, const json_t *s, const char *base, json_t *atoms, int chain,
                   sw_error *err)
{
    if (json_is_true(s))
        return SW_OK;
    if (!json_is_object(s)) {
        if (json_is_false(s))
            return json_array_append(atoms, (json_t *)s) ? SW_ENOMEM : SW_OK;
        return sw_error_set(err, SW_EINVAL, "a schema must be an object or a boolean");
    }
    if (chain > SC_MAX_REF_CHAIN || json_array_size(atoms) > 256)
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "allOf / $ref nest too deeply (a $ref cycle that never reaches a "
                            "value?)");
    const char *mine = eng__sc_doc_base_of(d, s);
    if (!mine)
        mine = base;
    const json_t *ref = json_object_get(s, "$ref");
    const json_t *all = json_object_get(s, "allOf");
    int rc;
    if (ref && !json_is_string(ref))
        return sw_error_set(err, SW_EINVAL, "'$ref' must be a string");
    if (all && (!json_is_array(all) || json_array_size(all) == 0))
        return sw_error_set(err, SW_EINVAL, "'allOf' must be a non-empty array of schemas");
    bool ref_only = ref && d->dialect != SC_2020;
    if (!ref_only) {
        if (!ref && !all) {
            if (json_array_append(atoms, (json_t *)s))
                return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
        } else {
            json_t *rest = json_copy((json_t *)s);
            if (!rest)
                return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
            json_object_del(rest, "$ref");
            json_object_del(rest, "allOf");
            char key[32];
            eng__sc_ptr_key(rest, key, sizeof key);
            if (!eng__sc_doc_keep(d, rest) ||
                json_object_set_new(d->bases, key, json_string(mine)) ||
                json_array_append(atoms, rest))
                return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
        }
        for (size_t i = 0; all && i < json_array_size(all); i++)
            if ((rc = flatten(d, json_array_get(all, i), mine, atoms, chain + 1, err)))
                return rc;
    }
    if (ref) {
        const json_t *target;
        if ((rc = eng__sc_doc_resolve(d, mine, json_string_value(ref), &target, err)))
            return rc;
        const char *tb = eng__sc_doc_base_of(d, target);
        if ((rc = flatten(d, target, tb ? tb : mine, atoms, chain + 1, err)))
            return rc;
    }
    return SW_OK;
}

/* s without allOf / $ref: one schema (borrowed: the document's or its
 * arena's), or false. */
int eng__sc_effective(sc_doc *d, const json_t *s, const char *base, const json_t **out,
                      sw_error *err)
{
    if (!json_is_object(s) || (!json_object_get(s, "allOf") && !json_object_get(s, "$ref"))) {
        *out = s;
        return SW_OK;
    }
    json_t *atoms = json_array();
    if (!atoms)
        return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
    int rc = flatten(d, s, base, atoms, 0, err);
    json_t *acc = NULL;
    for (size_t i = 0; rc == SW_OK && i < json_array_size(atoms); i++) {
        const json_t *x = json_array_get(atoms, i);
        if (json_is_false(x)) {
            json_decref(acc);
            acc = json_false();
            break;
        }
        if (!acc) {
            acc = json_incref((json_t *)x);
            continue;
        }
        json_t *m = NULL;
        rc = eng__sc_merge2(acc, x, &m, err);
        json_decref(acc);
        acc = m;
        if (json_is_false(acc))
            break;
    }
    json_decref(atoms);
    if (rc) {
        json_decref(acc);
        return rc;
    }
    if (!acc)
        acc = json_true();
    if (json_is_boolean(acc)) {
        *out = json_is_true(acc) ? json_true() : json_false();
        json_decref(acc);
        return SW_OK;
    }
    char key[32];
    eng__sc_ptr_key(acc, key, sizeof key);
    bool known = eng__sc_doc_base_of(d, acc) != NULL;
    if (!eng__sc_doc_keep(d, acc) ||
        (!known && json_object_set_new(d->bases, key, json_string(base))))
        return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
    *out = acc;
    return SW_OK;
}

/* ---- compiling one schema ---- */

int eng__sc_compile(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out);
int eng__sc_val_judge(const sc_doc *d, const json_t *schema, const json_t *value, sw_error *err);

int eng__sc_oom(builder *b)
{
    return sw_error_set(b->err, SW_ENOMEM, "out of memory compiling the schema");
}

/* A non-negative integer keyword, clamped to INT32_MAX; absent: dflt. */
int eng__sc_get_count(builder *b, const json_t *s, const char *key, size_t plen, int32_t dflt,
                      int32_t *out)
{
    const json_t *v = json_object_get(s, key);
    if (!v) {
        *out = dflt;
        return SW_OK;
    }
    if (json_is_real(v) && json_real_value(v) >= 0 &&
        json_real_value(v) == floor(json_real_value(v))) {
        double d = json_real_value(v);
        *out = d > INT32_MAX ? INT32_MAX : (int32_t)d;
        return SW_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        size_t l = eng__sc_path_push(b, plen, key);
        return eng__sc_fail_at(b, l, SW_EINVAL, "expected a non-negative integer");
    }
    json_int_t i = json_integer_value(v);
    *out = i > INT32_MAX ? INT32_MAX : (int32_t)i;
    return SW_OK;
}

/* ---- numbers ----
 * Bounds become integer bounds on the integer part, written as decimal
 * digit strings, so any bound JSON can write is exact (1e308 has its 309
 * digits): minimum 1.5 is 2 for the integer part, exclusiveMaximum 10 is
 * 9. A fraction is generated only after an integer part strictly inside
 * (constrain-impl.h), so 9.5 is never generated under exclusiveMaximum
 * 10 (a narrowing). */

/* multipleOf 10^-p (0.1, 0.01, ...): p, else 0. */
static int32_t decimal_step(double mo)
{
    for (int32_t p = 1; p <= ENG_CS_MAX_FRAC_DIGITS; p++)
        if (mo == pow(10.0, -p))
            return p;
    return 0;
}

/* m = a / 2^j with a odd and j in 1..20, a below 214748364: a, else 0
 * (m is not such a fraction; every such double is exact). */
static int32_t dyadic_numerator(double m)
{
    double x = m;
    for (int j = 1; j <= 20; j++) {
        x *= 2;
        if (x == floor(x))
            return x < INT32_MAX / 10 ? (int32_t)x : 0;
    }
    return 0;
}

static int compile_number(builder *b, const json_t *s, bool integer, size_t plen, int32_t *out)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = integer ? CS_INTEGER : CS_NUMBER;
    for (size_t i = 0; i < 4; i++) {
        const json_t *v = json_object_get(s, bound_keys[i]);
        if (v && !eng__sc_is_num(v) && !(i >= 2 && json_is_boolean(v)))
            return eng__sc_fail_at(b, eng__sc_path_push(b, plen, bound_keys[i]), SW_EINVAL,
                                   "a bound must be a number");
        if (sw_json_big_text(v) && !eng__sc_big_ok(v))
            return eng__sc_fail_at(
                b, eng__sc_path_push(b, plen, bound_keys[i]), SW_EUNSUPPORTED,
                "a bound past a double's range is supported as an integer of at most "
                "400 digits only (no fraction, no exponent)");
    }
    const json_t *mo = json_object_get(s, "multipleOf");
    if (sw_json_big_text(mo))
        return eng__sc_fail_at(b, eng__sc_path_push(b, plen, "multipleOf"), SW_EUNSUPPORTED,
                               "'multipleOf' above 214748364 is not supported");
    if (mo) {
        double m = json_number_value(mo);
        if (!json_is_number(mo) || !(m > 0))
            return eng__sc_fail_at(b, eng__sc_path_push(b, plen, "multipleOf"), SW_EINVAL,
                                   "'multipleOf' must be a positive number");
        if (m == floor(m)) {
            if (m > INT32_MAX / 10)
                return eng__sc_fail_at(b, eng__sc_path_push(b, plen, "multipleOf"), SW_EUNSUPPORTED,
                                       "'multipleOf' above 214748364 is not supported");
            /* numbers too: whole multiples only (a narrowing) */
            nd.kind = CS_INTEGER;
            nd.multiple_of = m == 1 ? 0 : (int32_t)m;
        } else if (decimal_step(m) > 0 && decimal_step(m) != 5) {
            /* 0.1, 0.01, ...: whole numbers only (a narrowing). Their
             * fractions are multiples too, but validators that divide in
             * doubles (python-jsonschema) call 0.07 / 0.01 inexact; a whole
             * number divides exactly for these steps (not for 1e-5) */
            nd.kind = CS_INTEGER;
        } else if (dyadic_numerator(m) > 0) {
            /* m = a / 2^j, a odd (1.5, 2.5, 0.25): an integer is a multiple
             * of m exactly when a divides it, and n / m is then exact in
             * doubles too; numbers get those integers only (a narrowing:
             * 4.5 is never generated for 1.5) */
            nd.kind = CS_INTEGER;
            int32_t a = dyadic_numerator(m);
            nd.multiple_of = a == 1 ? 0 : a;
        } else if (!(integer && 1 / m == floor(1 / m))) {
            return eng__sc_fail_at(b, eng__sc_path_push(b, plen, "multipleOf"), SW_EUNSUPPORTED,
                                   "'multipleOf' is enforced for whole numbers, 10^-k and "
                                   "fractions a / 2^j only");
        }
    }
    num_bound lo = eng__sc_bound_get(s, true), hi = eng__sc_bound_get(s, false);
    if (lo.v || hi.v) {
        nd.ranged = true;
        /* Per sign, the magnitude's bounds: the non-negative side sees
         * [lo, hi], the negative one [-hi, -lo]. */
        for (int sign = 0; sign < 2; sign++) {
            num_bound l = sign ? hi : lo, h = sign ? lo : hi;
            /* magnitude bounds, rounded inwards: floor / ceil of the
             * value, negated for the negative side */
            dec il, ih, fl, fh;
            bool has_l = l.v != NULL, has_h = h.v != NULL;
            if (has_l) {
                eng__sc_dec_round(l.v, sign, &il); /* ceil(lo), or -floor(hi) */
                if (sign)
                    eng__sc_dec_negate(&il);
                fl = il;
                if (l.excl && eng__sc_num_whole(l.v))
                    eng__sc_dec_step(&il, +1);
            }
            if (has_h) {
                eng__sc_dec_round(h.v, !sign, &ih); /* floor(hi), or -ceil(lo) */
                if (sign)
                    eng__sc_dec_negate(&ih);
                if (h.excl && eng__sc_num_whole(h.v))
                    eng__sc_dec_step(&ih, -1);
                eng__sc_dec_round(h.v, !sign, &fh); /* floor(hi) - 1, or -ceil(lo) - 1 */
                if (sign)
                    eng__sc_dec_negate(&fh);
                eng__sc_dec_step(&fh, -1);
            }
            bool nonzero = has_l && l.excl && eng__sc_num_whole(l.v);
            dec zero = {false, "0"};
            if (!has_l || il.neg)
                il = zero;
            if (!has_l || fl.neg) {
                fl = zero; /* below zero: any fraction of 0 is inside */
                nonzero = false;
            }
            /* the integer part may be as long as the bounds (not with a
             * multiple: its arithmetic is in int64) */
            size_t digits = ENG_CS_MAX_INT_DIGITS;
            if (nd.multiple_of == 0) {
                if (has_l && strlen(il.mag) > digits)
                    digits = strlen(il.mag);
                if (has_h && !ih.neg && strlen(ih.mag) > digits)
                    digits = strlen(ih.mag);
                if (digits > ENG_CS_MAX_BIG_DIGITS)
                    digits = ENG_CS_MAX_BIG_DIGITS;
                if ((int32_t)digits > nd.int_digits)
                    nd.int_digits = (int32_t)digits;
            }
            bool int_ok =
                (!has_h || (!ih.neg && eng__sc_dec_cmp(&il, &ih) <= 0)) && strlen(il.mag) <= digits;
            bool frac_ok = !integer && nd.kind == CS_NUMBER &&
                           (!has_h || (!fh.neg && eng__sc_dec_cmp(&fl, &fh) <= 0)) &&
                           strlen(fl.mag) <= ENG_CS_MAX_INT_DIGITS;
            /* every value generated is below a bound past the digits */
            bool ih_cap = has_h && strlen(ih.mag) <= digits;
            bool fh_cap = has_h && strlen(fh.mag) <= ENG_CS_MAX_INT_DIGITS;
            nd.int_ok[sign] = int_ok;
            nd.frac_ok[sign] = frac_ok;
            nd.frac_nonzero[sign] = frac_ok && nonzero;
            if ((int_ok && (!(nd.int_lo[sign] = sw_strdup(il.mag)) ||
                            (ih_cap && !(nd.int_hi[sign] = sw_strdup(ih.mag))))) ||
                (frac_ok && (!(nd.frac_lo[sign] = sw_strdup(fl.mag)) ||
                             (fh_cap && !(nd.frac_hi[sign] = sw_strdup(fh.mag)))))) {
                eng__sc_node_clear(&nd);
                return eng__sc_oom(b);
            }
        }
        for (int sign = 0; sign < 2 && nd.multiple_of > 0; sign++) {
            /* with a multiple: the least magnitude is the first multiple at
             * or above int_lo (none in range: no value of that sign) */
            if (!nd.int_ok[sign])
                continue;
            long long lv = strtoll(nd.int_lo[sign], NULL, 10), m = nd.multiple_of;
            long long q = (lv + m - 1) / m * m;
            bool ok = q < 1000000000000000LL &&
                      (!nd.int_hi[sign] || q <= strtoll(nd.int_hi[sign], NULL, 10));
            char t[24];
            snprintf(t, sizeof t, "%lld", q);
            sw_free(nd.int_lo[sign]);
            nd.int_lo[sign] = ok ? sw_strdup(t) : NULL;
            nd.int_ok[sign] = ok && nd.int_lo[sign];
            if (ok && !nd.int_lo[sign]) {
                eng__sc_node_clear(&nd);
                return eng__sc_oom(b);
            }
        }
        if (!nd.int_ok[0] && !nd.int_ok[1] && !nd.frac_ok[0] && !nd.frac_ok[1]) {
            eng__sc_node_clear(&nd);
            *out = CS_NEVER;
            return SW_OK;
        }
    }
    if ((*out = eng__sc_add_node(b->g, &nd)) < 0)
        return eng__sc_oom(b);
    return SW_OK;
}

/* ---- pattern and format ------------------------------------------------------
 * A string's `pattern` and enforced `format` as one automaton over its
 * content (regex.h, formats.h; both: their intersection). *re is NULL when
 * the schema has neither. *max_chars: the format's own length bound
 * (hostname: 253), INT32_MAX when none. *key names the keyword at fault. */
int eng__sc_string_automaton(const json_t *s, eng_regex **re, int32_t *max_chars, const char **key,
                             sw_error *err)
{
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    eng_regex *a = NULL;
    int rc;
    *re = NULL;
    *max_chars = INT32_MAX;
    *key = "pattern";
    if (pat) {
        if (!json_is_string(pat))
            return sw_error_set(err, SW_EINVAL, "'pattern' must be a string");
        if ((rc = eng_regex_compile(json_string_value(pat), json_string_length(pat), &a, err)))
            return rc;
    }
    const eng_regex *shared = NULL; /* formats.h's, compiled once */
    if (json_is_string(fmt) &&
        (rc = eng_format_regex(json_string_value(fmt), &shared, max_chars, err))) {
        *key = "format";
        eng_regex_free(a);
        return rc;
    }
    if (a && shared) {
        rc = eng_regex_intersect(a, shared, re, err);
        eng_regex_free(a);
        return rc;
    }
    if (shared) {
        *key = "format";
        return eng_regex_clone(shared, re, err);
    }
    *re = a;
    return SW_OK;
}

/* An enforced format: an untyped schema holding one is not "any value"
 * (its strings must match; other types are free). */
static bool has_enforced_format(const json_t *s)
{
    const json_t *fmt = json_object_get(s, "format");
    return json_is_string(fmt) && eng_format_pattern(json_string_value(fmt), NULL);
}

/* What each content byte costs in the JSON text: escapes are longer. */
static void json_byte_costs(uint8_t cost[256])
{
    for (int c = 0; c < 256; c++)
        cost[c] = c < 0x20 ? 6 : 1; /* \u00XX */
    cost['"'] = cost['\\'] = 2;
    cost['\b'] = cost['\f'] = cost['\n'] = cost['\r'] = cost['\t'] = 2;
}

/* A CS_PATTERN node for re (taken over) and lo..hi code points; CS_NEVER
 * when no string within the bounds matches (an error at the root). key:
 * the keyword below plen that errors name (NULL: plen itself). */
int eng__sc_make_pattern(builder *b, eng_regex *re, int32_t lo, int32_t hi, size_t plen,
                         const char *key, int32_t *out)
{
    uint8_t cost[256];
    eng_regex_costs *t = NULL;
    sw_error e;
    size_t at = key ? eng__sc_path_push(b, plen, key) : plen;
    json_byte_costs(cost);
    /* A long maxLength beside a large automaton: at most as many code
     * points as the costs table holds are generated (a narrowing). */
    int64_t cap = ENG_REGEX_MAX_COST_CELLS / eng_regex_n_states(re) - 1;
    if (hi != INT32_MAX && hi > cap && cap >= lo)
        hi = (int32_t)cap;
    int rc = eng_regex_costs_build(re, cost, lo, hi, &t, &e);
    if (rc) {
        eng_regex_free(re);
        return eng__sc_fail_at(b, at, rc, e.message);
    }
    int64_t m = eng_regex_costs_get(t, eng_regex_start(re), 0);
    if (m < 0) {
        eng_regex_free(re);
        eng_regex_costs_free(t);
        *out = CS_NEVER;
        return plen <= 1 ? eng__sc_fail_at(b, at, SW_EINVAL,
                                           "no string of the allowed lengths matches")
                         : SW_OK;
    }
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_PATTERN;
    nd.min_chars = lo;
    nd.max_chars = hi;
    nd.re = re;
    nd.re_costs = t;
    nd.min_bytes = eng__sc_len_add(2, m);
    if ((*out = eng__sc_add_node(b->g, &nd)) < 0)
        return eng__sc_oom(b);
    return SW_OK;
}

static int compile_typed(builder *b, const json_t *s, int type, const char *forbid,
                         int32_t depth, size_t plen, int32_t *out)
{
    eng_grammar *g = b->g;
    int rc;
    switch (type) {
    case T_OBJECT: return eng__sc_compile_object(b, s, forbid, depth, plen, out);
    case T_ARRAY: return eng__sc_compile_array(b, s, depth, plen, out);
    case T_STRING: {
        int32_t lo, hi;
        if ((rc = eng__sc_get_count(b, s, "minLength", plen, 0, &lo)) ||
            (rc = eng__sc_get_count(b, s, "maxLength", plen, INT32_MAX, &hi)))
            return rc;
        if (lo > hi) {
            *out = CS_NEVER;
            return plen <= 1 ? eng__sc_fail_at(b, eng__sc_path_push(b, plen, "minLength"),
                                               SW_EINVAL, "minLength is larger than maxLength")
                             : SW_OK;
        }
        eng_regex *re = NULL;
        int32_t fmt_max;
        const char *key;
        sw_error e;
        if ((rc = eng__sc_string_automaton(s, &re, &fmt_max, &key, &e)))
            return eng__sc_fail_at(b, eng__sc_path_push(b, plen, key), rc, e.message);
        if (re)
            return eng__sc_make_pattern(b, re, lo, hi < fmt_max ? hi : fmt_max, plen, key, out);
        *out = eng__sc_make_string(g, lo, hi);
        break;
    }
    case T_NUMBER:
    case T_INTEGER: return compile_number(b, s, type == T_INTEGER, plen, out);
    case T_BOOLEAN: *out = eng__sc_make_bool(g); break;
    default: {
        json_t *z = json_null();
        const json_t *v[1] = {z};
        *out = eng__sc_make_literals(g, v, 1);
        break;
    }
    }
    if (*out < 0)
        return eng__sc_oom(b);
    return SW_OK;
}

/* Appends to alts (n of them so far, room for 7 more) the nodes of s for
 * each type of the mask tm that can hold a value, in a fixed order (an
 * integer is left to number when both are in tm). */
static int compile_types(builder *b, const json_t *s, int tm, const char *forbid,
                         int32_t depth, size_t plen, int32_t *alts, int32_t *n)
{
    static const int order[] = {T_OBJECT, T_ARRAY, T_STRING, T_NUMBER, T_INTEGER, T_BOOLEAN,
                                T_NULL};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        int t = order[i], rc;
        if (!(tm & t) || (t == T_INTEGER && (tm & T_NUMBER)))
            continue;
        int32_t a;
        if ((rc = compile_typed(b, s, t, forbid, depth, plen, &a)))
            return rc;
        if (a != CS_NEVER)
            alts[(*n)++] = a;
    }
    return SW_OK;
}

static int compile_inner(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    eng_grammar *g = b->g;
    int rc;
    if (json_is_true(s)) {
        if ((*out = eng__sc_make_any(g, eng__sc_any_levels(depth))) < 0)
            return eng__sc_oom(b);
        return SW_OK;
    }
    if (json_is_false(s)) {
        *out = CS_NEVER;
        return SW_OK;
    }
    if (!json_is_object(s))
        return eng__sc_fail_at(b, plen, SW_EINVAL, "a schema must be an object");
    const char *nul_key = nul_name(s);
    if (nul_key)
        return eng__sc_fail_at(b, eng__sc_path_push(b, plen, nul_key), SW_EUNSUPPORTED,
                               "a name, type or URI holding U+0000 (\\u0000) is not supported "
                               "(const, enum and pattern may hold it)");
    const json_t *ref = json_object_get(s, "$ref");
    bool draft_ref = ref && b->doc->dialect != SC_2020;
    if (!draft_ref) {
        const char *key = refused_keyword(b->doc, s);
        if (key) {
            char what[160];
            snprintf(what, sizeof what, "unsupported JSON-schema keyword '%.64s'%s", key,
                     strcmp(key, "items") == 0 ? " (tuple 'items', an array of schemas)" : "");
            return eng__sc_fail_at(b, eng__sc_path_push(b, plen, key), SW_EUNSUPPORTED, what);
        }
    }
    if (ref && !json_object_get(s, "allOf") && (draft_ref || eng__sc_only_annotations(s, "$ref"))) {
        /* a plain reference: compile the target itself (so a recursive
         * schema reuses its nodes level by level) */
        const json_t *target;
        if (!json_is_string(ref))
            return eng__sc_fail_at(b, eng__sc_path_push(b, plen, "$ref"), SW_EINVAL,
                                   "'$ref' must be a string");
        sw_error e;
        if ((rc = eng__sc_doc_resolve(b->doc, b->base, json_string_value(ref), &target, &e)))
            return eng__sc_fail_at(b, eng__sc_path_push(b, plen, "$ref"), rc, e.message);
        if (b->chain[depth] >= SC_MAX_REF_CHAIN)
            return eng__sc_fail_at(b, eng__sc_path_push(b, plen, "$ref"), SW_EUNSUPPORTED,
                                   "a $ref cycle that never reaches a value");
        b->chain[depth]++;
        rc = eng__sc_compile(b, target, depth, eng__sc_path_push(b, plen, "$ref"), out);
        b->chain[depth]--;
        return rc;
    }
    if (ref || json_object_get(s, "allOf")) {
        const json_t *m;
        sw_error e;
        if ((rc = eng__sc_effective(b->doc, s, b->base, &m, &e)))
            return eng__sc_fail_at(b, plen, rc, e.message);
        if (b->chain[depth] >= SC_MAX_REF_CHAIN)
            return eng__sc_fail_at(b, plen, SW_EUNSUPPORTED,
                                   "a $ref cycle that never reaches a value");
        b->chain[depth]++;
        rc = eng__sc_compile(b, m, depth, plen, out);
        b->chain[depth]--;
        return rc;
    }
    if (json_object_get(s, "dependentSchemas") ||
        (json_is_object(json_object_get(s, "dependencies")) && b->doc->dialect != SC_2020))
        return eng__sc_compile_dependent(b, s, depth, plen, out);
    if (json_object_get(s, "if") && (json_object_get(s, "then") || json_object_get(s, "else")))
        return eng__sc_compile_if(b, s, depth, plen, out);
    if (json_object_get(s, "anyOf") || json_object_get(s, "oneOf"))
        return eng__sc_compile_anyof(b, s, depth, plen, out);

    const json_t *type = json_object_get(s, "type");
    int tm = eng__sc_type_mask(type);
    if (tm < 0)
        return eng__sc_fail_at(b, eng__sc_path_push(b, plen, "type"), SW_EINVAL,
                               "unknown type (expected object, array, string, number, integer, "
                               "boolean or null, or a list of them)");
    for (size_t i = 0; json_is_array(type) && i < json_array_size(type); i++)
        for (size_t j = 0; j < i; j++)
            if (json_equal(json_array_get(type, i), json_array_get(type, j)))
                return eng__sc_fail_at(
                    b, eng__sc_path_push_index(b, eng__sc_path_push(b, plen, "type"), i), SW_EINVAL,
                    "'type' lists a type twice");
    if (json_is_array(type) && json_array_size(type) == 0)
        return eng__sc_fail_at(b, eng__sc_path_push(b, plen, "type"), SW_EINVAL,
                               "'type' is an empty array");
    const json_t *not = json_object_get(s, "not");
    json_t *positive = not ? eng__sc_negate_simple(not ) : NULL;
    if (positive) {
        /* not of one bound or one property: an equivalent positive schema */
        json_t *rest = json_copy((json_t *)s);
        json_t *w = rest ? json_pack("{s:[OO]}", "allOf", rest, positive) : NULL;
        json_decref(positive);
        json_decref(rest);
        if (!w || !eng__sc_doc_keep(b->doc, w))
            return eng__sc_oom(b);
        json_object_del(json_array_get(json_object_get(w, "allOf"), 0), "not");
        return eng__sc_compile(b, w, depth, plen, out);
    }
    not_info ni = {0, T_ALL, NULL, false};
    bool literals = json_object_get(s, "enum") || json_object_get(s, "const");
    if (not &&(rc = eng__sc_analyze_not(b, not, eng__sc_path_push(b, plen, "not"), &ni, 0))) {
        /* what the node cannot fold in: a union of positive schemas */
        if (rc == SW_EUNSUPPORTED && !literals)
            return eng__sc_compile_not(b, s, depth, plen, out);
        if (!literals)
            return rc;
    }
    if (literals)
        return eng__sc_compile_literals(b, s, plen, out);
    int inferred = T_ALL;
    if (!type)
        tm = inferred = inferred_types(s);
    bool untyped = !type && tm == T_ALL && !has_enforced_format(s);
    tm &= ~ni.types_out;
    tm &= ni.types_only;
    /* not integer: the numbers left are fractions, which the number node
     * cannot tell apart; no number is generated (a narrowing) */
    if (ni.types_out & T_INTEGER)
        tm &= ~(T_NUMBER | T_INTEGER);
    if (ni.filter) {
        /* a finite set of values: true, false, null */
        if (tm & ~(T_BOOLEAN | T_NULL))
            return eng__sc_compile_not(b, s, depth, plen, out);
        json_t *e = json_array();
        if (!e || !eng__sc_doc_keep(b->doc, e))
            return eng__sc_oom(b);
        if (tm & T_BOOLEAN) {
            json_array_append(e, json_true());
            json_array_append(e, json_false());
        }
        if (tm & T_NULL)
            json_array_append(e, json_null());
        if (json_array_size(e) == 0) {
            *out = CS_NEVER;
            return SW_OK;
        }
        json_t *with = json_copy((json_t *)s);
        if (!with || !eng__sc_doc_keep(b->doc, with))
            return eng__sc_oom(b);
        json_object_set(with, "enum", e);
        return eng__sc_compile_literals(b, with, plen, out);
    }
    if (untyped && ni.types_out == 0 && ni.types_only == T_ALL) {
        if ((*out = eng__sc_make_any(g, eng__sc_any_levels(depth))) < 0)
            return eng__sc_oom(b);
        return SW_OK;
    }
    int32_t alts[8], n = 0;
    if ((rc = compile_types(b, s, tm, ni.forbid, depth, plen, alts, &n)))
        return rc;
    if (n == 0 && !type && inferred == T_ARRAY && contains_unsatisfiable(s)) {
        /* no array can satisfy contains ({"contains": false}, maxContains
         * below minContains): the values of the other types, which those
         * keywords do not constrain, are still valid. Only there: where
         * the compiler's own narrowings leave no array, a 400 says so
         * rather than a string standing in for the array */
        int other = T_ALL & ~inferred & ~ni.types_out & ni.types_only;
        if (ni.types_out & T_INTEGER)
            other &= ~(T_NUMBER | T_INTEGER);
        if ((rc = compile_types(b, s, other, ni.forbid, depth, plen, alts, &n)))
            return rc;
    }
    if (n == 0) {
        *out = CS_NEVER;
        return SW_OK;
    }
    if (n == 1) {
        *out = alts[0];
        return SW_OK;
    }
    if ((*out = eng__sc_make_anyof(g, alts, n)) < 0)
        return eng__sc_oom(b);
    return SW_OK;
}

static bool is_leaf_kind(int kind)
{
    return kind == CS_STRING || kind == CS_PATTERN || kind == CS_INTEGER || kind == CS_NUMBER;
}

int eng__sc_compile(builder *b, const json_t *s, int32_t depth, size_t plen, int32_t *out)
{
    if (++b->steps > SC_MAX_COMPILE_STEPS || b->g->n_nodes > SC_MAX_NODES)
        return eng__sc_fail_at(b, plen, SW_EUNSUPPORTED,
                               "the schema is too large to compile (too many nodes or steps)");
    /* A value in the last frame of the stack cannot hold anything: deeper
     * values are never generated (recursive schemas stop here). */
    if (depth + 1 > ENG_CS_MAX_DEPTH) {
        *out = CS_NEVER;
        return SW_OK;
    }
    const char *saved = b->base;
    const char *mine = json_is_object(s) ? eng__sc_doc_base_of(b->doc, s) : NULL;
    char key[48];
    if (mine)
        b->base = mine;
    /* A string or number node holds no frame of the stack: the one made
     * at any depth serves every depth ("%p/leaf"). A recursive schema's
     * patterns (the metaschema's $id, $anchor, ...) are then compiled once,
     * not once per level. */
    char leaf_key[48];
    snprintf(leaf_key, sizeof leaf_key, "%p/leaf", (const void *)s);
    snprintf(key, sizeof key, "%p/%d", (const void *)s, (int)depth);
    const json_t *memo = NULL;
    if (json_is_object(s) && !(memo = json_object_get(b->memo, leaf_key)))
        memo = json_object_get(b->memo, key);
    int rc = SW_OK;
    if (memo) {
        *out = (int32_t)json_integer_value(memo);
    } else {
        int64_t steps_before = b->steps;
        rc = compile_inner(b, s, depth, plen, out);
        if (rc == SW_OK && json_is_object(s) &&
            json_object_set_new(b->memo, key, json_integer(*out)))
            rc = eng__sc_oom(b);
        /* only where nothing below was compiled: an anyOf whose recursive
         * alternative ended at the stack's bottom is a string there, not
         * above */
        bool leaf = rc == SW_OK && b->steps == steps_before && *out >= 0 &&
                    is_leaf_kind(b->g->nodes[*out].kind);
        if (rc == SW_OK && json_is_object(s) && leaf &&
            json_object_set_new(b->memo, leaf_key, json_integer(*out)))
            rc = eng__sc_oom(b);
    }
    b->base = saved;
    return rc;
}

/* A pattern too large for the automata (regex.h: SW_ERANGE) is, for a
 * schema, a construct outside what can be enforced: json_schema.h's
 * SW_EUNSUPPORTED, the message kept. */
static int too_large_unsupported(int rc, sw_error *err)
{
    if (rc == SW_ERANGE) {
        rc = SW_EUNSUPPORTED;
        if (err)
            err->code = rc;
    }
    return rc;
}

int eng_grammar_from_schema(const json_t *schema, eng_grammar **out, sw_error *err)
{
    builder b;
    sc_doc doc;
    memset(&b, 0, sizeof b);
    b.err = err;
    strcpy(b.path, "#");
    if (!schema || !out)
        return sw_error_set(err, SW_EINVAL, "eng_grammar_from_schema: NULL argument");
    int rc = eng__sc_doc_init(&doc, schema, err);
    if (rc)
        return rc;
    b.doc = &doc;
    b.base = SC_DEFAULT_BASE;
    b.memo = json_object();
    if (!b.memo || !(b.g = eng__sc_grammar_new())) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory compiling the schema");
        goto fail;
    }
    rc = eng__sc_compile(&b, schema, 1, 1, &b.g->root);
    if (rc == SW_OK && b.g->root == CS_NEVER)
        rc = sw_error_set(err, SW_EUNSUPPORTED,
                          "the schema accepts no value that can be generated (it is 'false', "
                          "contradicts itself, or requires values that nest too deeply: at "
                          "most %d levels)",
                          ENG_CS_MAX_DEPTH - 2);
    if (rc)
        goto fail;
    json_decref(b.memo);
    eng__sc_doc_free(&doc);
    *out = b.g;
    return SW_OK;
fail:
    json_decref(b.memo);
    eng__sc_doc_free(&doc);
    eng_grammar_free(b.g);
    return too_large_unsupported(rc, err);
}

int eng_grammar_json_object(eng_grammar **out, sw_error *err)
{
    eng_grammar *g = eng__sc_grammar_new();
    if (!g || (g->root = eng__sc_make_any_object(g, eng__sc_any_levels(1))) < 0) {
        eng_grammar_free(g);
        return sw_error_set(err, SW_ENOMEM, "out of memory building the json_object grammar");
    }
    *out = g;
    return SW_OK;
}

/* A tool's parameters (NULL: none, an empty argument list) as an object
 * node in frame 2, with the document of those parameters. */
static int compile_params(builder *b, const json_t *params, size_t plen, int32_t *out)
{
    json_t *empty = NULL;
    sc_doc doc;
    int rc;
    if (!params) {
        empty = json_pack("{s:s, s:{}, s:b}", "type", "object", "properties",
                          "additionalProperties", 0);
        if (!empty)
            return eng__sc_oom(b);
        params = empty;
    }
    if ((rc = eng__sc_doc_init(&doc, params, b->err))) {
        json_decref(empty);
        return rc;
    }
    b->doc = &doc;
    b->base = SC_DEFAULT_BASE;
    b->memo = json_object();
    rc = b->memo ? eng__sc_compile(b, params, 2, plen, out) : eng__sc_oom(b);
    if (rc == SW_OK && (*out == CS_NEVER || (b->g->nodes[*out].kind != CS_OBJECT &&
                                             b->g->nodes[*out].kind != CS_ANYOBJ)))
        rc = eng__sc_fail_at(b, plen, SW_EUNSUPPORTED,
                             "a tool's parameters must be an object schema");
    json_decref(b->memo);
    b->memo = NULL;
    b->doc = NULL;
    eng__sc_doc_free(&doc);
    json_decref(empty);
    return rc;
}

int eng_grammar_tool_call(const eng_grammar_tool *tools, size_t n_tools, eng_grammar **out,
                          sw_error *err)
{
    builder b;
    memset(&b, 0, sizeof b);
    b.err = err;
    if (!tools || n_tools == 0 || !out)
        return sw_error_set(err, SW_EINVAL, "eng_grammar_tool_call: no tools");
    if (n_tools > 64)
        return sw_error_set(err, SW_EUNSUPPORTED, "at most 64 tools can be offered at once");
    if (!(b.g = eng__sc_grammar_new()))
        return sw_error_set(err, SW_ENOMEM, "out of memory compiling the tools");
    eng_grammar *g = b.g;
    int32_t wrappers[64];
    int rc = SW_OK;
    for (size_t t = 0; t < n_tools; t++) {
        int32_t args;
        int l = snprintf(b.path, sizeof b.path, "tools[%zu].function.parameters#", t);
        size_t plen = l > 0 && (size_t)l < sizeof b.path ? (size_t)l : 0;
        /* frames: root 1, the wrapper 2, the arguments 3 */
        if ((rc = compile_params(&b, tools[t].parameters, plen, &args)))
            goto fail;
        json_t *name = json_string(tools[t].name ? tools[t].name : "");
        const json_t *nv[1] = {name};
        int32_t name_node = name ? eng__sc_make_literals(g, nv, 1) : -1;
        json_decref(name);
        cs_node nd;
        memset(&nd, 0, sizeof nd);
        nd.kind = CS_OBJECT;
        nd.n_props = 0;
        nd.keys = sw_calloc(2, sizeof *nd.keys);
        nd.key_lens = sw_calloc(2, sizeof *nd.key_lens);
        nd.children = sw_calloc(2, sizeof *nd.children);
        nd.required = sw_calloc(2, sizeof *nd.required);
        nd.req_from = sw_calloc(3, sizeof *nd.req_from);
        nd.any_from = sw_calloc(3, sizeof *nd.any_from);
        nd.next_req = sw_calloc(3, sizeof *nd.next_req);
        if (name_node < 0 || !nd.keys || !nd.key_lens || !nd.children || !nd.required ||
            !nd.req_from || !nd.any_from || !nd.next_req ||
            !(nd.keys[0] = sw_strdup("\"name\":")) || !(nd.keys[1] = sw_strdup("\"arguments\":"))) {
            nd.n_props = 2;
            eng__sc_node_clear(&nd);
            rc = sw_error_set(err, SW_ENOMEM, "out of memory compiling the tools");
            goto fail;
        }
        nd.n_props = 2;
        nd.key_lens[0] = 7;
        nd.key_lens[1] = 12;
        nd.children[0] = name_node;
        nd.children[1] = args;
        nd.required[0] = nd.required[1] = true;
        int32_t one1 = eng__sc_len_add(12, g->nodes[args].min_bytes);
        int32_t one0 = eng__sc_len_add(7, g->nodes[name_node].min_bytes);
        nd.req_from[2] = 0;
        nd.req_from[1] = eng__sc_len_add(1, one1);
        nd.req_from[0] = eng__sc_len_add(eng__sc_len_add(1, one0), nd.req_from[1]);
        nd.any_from[2] = CS_LEN_CAP;
        nd.any_from[1] = one1;
        nd.any_from[0] = one0 < one1 ? one0 : one1;
        nd.next_req[0] = 0;
        nd.next_req[1] = 1;
        nd.next_req[2] = 2;
        if ((wrappers[t] = eng__sc_add_node(g, &nd)) < 0) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory compiling the tools");
            goto fail;
        }
    }
    if (n_tools == 1)
        g->root = wrappers[0];
    else if ((g->root = eng__sc_make_anyof(g, wrappers, (int32_t)n_tools)) < 0) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory compiling the tools");
        goto fail;
    }
    *out = g;
    return SW_OK;
fail:
    eng_grammar_free(g);
    return too_large_unsupported(rc, err);
}

