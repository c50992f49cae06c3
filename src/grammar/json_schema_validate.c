/* json_schema_validate.c - eng_json_validate: a value checked against a
 * schema with JSON Schema's own meaning.
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

/* ---- validation ---------------------------------------------------------------
 * A parsed value checked against a schema with JSON Schema's own meaning
 * (the router checks a model's tool-call arguments before it calls the
 * tool: they may come from an engine that did not generate them under this
 * grammar; the compiler filters enum values through it). Exact wherever it
 * judges: any property order, additional properties, a keyword constrains
 * only values of its type, numbers of any size, oneOf as exactly one. What
 * it cannot judge (formats without a pattern, unevaluated*, $dynamicRef, a
 * remote $ref) is SW_EUNSUPPORTED. */

typedef struct validator {
    const sc_doc *doc;
    sw_error *err;
    const char *base;
    int32_t depth;
    int64_t steps;          /* checks made: alternatives inside alternatives multiply them */
    char path[256];         /* JSON pointer into the value */
} validator;

#define VAL_MAX_STEPS 200000
#define VAL_MAX_DEPTH 64

static size_t val_push(validator *v, size_t len, const char *seg)
{
    return eng__sc_pointer_push(v->path, sizeof v->path, len, seg);
}

static size_t val_push_index(validator *v, size_t len, size_t i)
{
    char seg[24];
    snprintf(seg, sizeof seg, "%zu", i);
    return val_push(v, len, seg);
}

static int val_fail(validator *v, size_t len, int code, const char *what)
{
    v->path[len] = '\0';
    if (code == SW_EINVAL)
        return sw_error_set(v->err, code, "%s (at %s)", what, v->path);
    return sw_error_set(v->err, code, "the schema cannot be checked: %s (at %s)", what, v->path);
}

/* A count keyword of the schema. */
static int val_count(validator *v, const json_t *s, const char *key, size_t plen, int64_t dflt,
                     int64_t *out)
{
    const json_t *c = json_object_get(s, key);
    if (!c) {
        *out = dflt;
        return SW_OK;
    }
    if (json_is_real(c) && json_real_value(c) >= 0 &&
        json_real_value(c) == floor(json_real_value(c))) {
        *out = json_real_value(c) > 9e18 ? INT64_MAX : (int64_t)json_real_value(c);
        return SW_OK;
    }
    if (!json_is_integer(c) || json_integer_value(c) < 0)
        return val_fail(v, plen, SW_EUNSUPPORTED, "a count keyword is not a non-negative integer");
    *out = json_integer_value(c);
    return SW_OK;
}

static bool type_matches(const json_t *x, int bit)
{
    switch (bit) {
    case T_OBJECT: return json_is_object(x);
    case T_ARRAY: return json_is_array(x);
    case T_STRING: return json_is_string(x) && !sw_json_big_text(x);
    case T_NUMBER: return eng__sc_is_num(x);
    case T_INTEGER:
        /* a marker with a fraction or an exponent is taken as no integer
         * (an enum keeps fewer values: a narrowing) */
        if (json_is_integer(x) || eng__sc_big_ok(x))
            return true;
        if (json_is_real(x)) {
            /* a whole number (1.0, 1e300) */
            double d = json_real_value(x);
            return isfinite(d) && d == floor(d);
        }
        return false;
    case T_BOOLEAN: return json_is_boolean(x);
    default: return json_is_null(x);
    }
}

static int val_check(validator *v, const json_t *s, const json_t *x, size_t plen);

/* Runs a check whose failure is an answer, not an error: *ok tells. */
static int val_try(validator *v, const json_t *s, const json_t *x, size_t plen, bool *ok)
{
    sw_error *outer = v->err;
    sw_error mine;
    v->err = &mine;
    int rc = val_check(v, s, x, plen);
    v->err = outer;
    if (rc == SW_OK || rc == SW_EINVAL) {
        *ok = rc == SW_OK;
        return SW_OK;
    }
    return sw_error_set(outer, rc, "%s", mine.message);
}

static int64_t utf8_count(const char *t, size_t n)
{
    int64_t chars = 0;
    for (size_t i = 0; i < n; i++)
        chars += ((unsigned char)t[i] & 0xC0) != 0x80; /* code points */
    return chars;
}

static int val_object(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    const json_t *names = json_object_get(s, "propertyNames");
    int rc;
    if ((props && !json_is_object(props)) || (req && !json_is_array(req)) ||
        (addl && !json_is_boolean(addl) && !json_is_object(addl)))
        return val_fail(v, plen, SW_EUNSUPPORTED,
                        "'properties', 'required' or 'additionalProperties' has the wrong type");
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *name = json_string_value(json_array_get(req, i));
        if (!name)
            return val_fail(v, plen, SW_EUNSUPPORTED, "'required' must be an array of strings");
        /* a name holding U+0000 is no key jansson can hold: missing */
        if (!json_object_get(x, name) ||
            memchr(name, 0, json_string_length(json_array_get(req, i)))) {
            char what[160];
            snprintf(what, sizeof what, "the required property '%.64s' is missing", name);
            return val_fail(v, plen, SW_EINVAL, what);
        }
    }
    int64_t lo, hi;
    if ((rc = val_count(v, s, "minProperties", plen, 0, &lo)) ||
        (rc = val_count(v, s, "maxProperties", plen, INT64_MAX, &hi)))
        return rc;
    if ((int64_t)json_object_size(x) < lo || (int64_t)json_object_size(x) > hi)
        return val_fail(v, plen, SW_EINVAL, "the object has too few or too many properties");
    /* dependentRequired, dependentSchemas and draft 7's dependencies */
    static const char *const dep_keys[] = {"dependentRequired", "dependentSchemas",
                                           "dependencies"};
    for (size_t d = 0; d < 3; d++) {
        const json_t *deps = json_object_get(s, dep_keys[d]);
        const char *k;
        const json_t *dv;
        json_object_foreach((json_t *)deps, k, dv) {
            if (!json_object_get(x, k))
                continue;
            if (json_is_array(dv)) {
                for (size_t i = 0; i < json_array_size(dv); i++) {
                    const char *name = json_string_value(json_array_get(dv, i));
                    if (name && (!json_object_get(x, name) ||
                                 memchr(name, 0, json_string_length(json_array_get(dv, i)))))
                        return val_fail(v, plen, SW_EINVAL,
                                        "a property that another one depends on is missing");
                }
            } else if ((rc = val_check(v, dv, x, plen))) {
                return rc;
            }
        }
    }
    const json_t *pprops = json_object_get(s, "patternProperties");
    if (pprops && !json_is_object(pprops))
        return val_fail(v, plen, SW_EUNSUPPORTED, "'patternProperties' must be an object");
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)x, key, val) {
        const json_t *sub = json_object_get(props, key);
        size_t l = val_push(v, plen, key);
        bool matched = false;
        const char *pat;
        const json_t *ps;
        json_object_foreach((json_t *)pprops, pat, ps) {
            sw_error perr;
            int m = eng__sc_pattern_match_name(pat, key, &perr);
            if (m < 0)
                return val_fail(v, plen, SW_EUNSUPPORTED, perr.message);
            if (m) {
                matched = true;
                if ((rc = val_check(v, ps, val, l)))
                    return rc;
            }
        }
        if (names) {
            json_t *ks = json_string(key);
            if (!ks)
                return sw_error_set(v->err, SW_ENOMEM, "out of memory validating");
            rc = val_check(v, names, ks, l);
            json_decref(ks);
            if (rc)
                return rc;
        }
        if (sub) {
            if ((rc = val_check(v, sub, val, l)))
                return rc;
        } else if (!matched && addl && (rc = val_check(v, addl, val, l))) {
            return rc;
        }
    }
    return SW_OK;
}

static int val_array(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    int64_t lo, hi;
    int rc;
    const json_t *items = json_object_get(s, "items");
    const json_t *prefix = json_object_get(s, "prefixItems");
    const json_t *rest = items;
    if (json_is_array(items) && (v->doc->dialect != SC_2020 || !prefix)) {
        prefix = items;
        rest = json_object_get(s, "additionalItems");
    } else if (json_is_array(items)) {
        return val_fail(v, plen, SW_EUNSUPPORTED, "'items' must be a schema");
    }
    if ((rc = val_count(v, s, "minItems", plen, 0, &lo)) ||
        (rc = val_count(v, s, "maxItems", plen, INT64_MAX, &hi)))
        return rc;
    size_t n = json_array_size(x);
    if ((int64_t)n < lo || (int64_t)n > hi)
        return val_fail(v, plen, SW_EINVAL, "the array has too few or too many items");
    size_t np = json_array_size(prefix);
    for (size_t i = 0; i < n; i++) {
        const json_t *sub = i < np ? json_array_get(prefix, i) : rest;
        if (sub && (rc = val_check(v, sub, json_array_get(x, i), val_push_index(v, plen, i))))
            return rc;
    }
    const json_t *contains = json_object_get(s, "contains");
    if (contains) {
        int64_t cmin, cmax, found = 0;
        if ((rc = val_count(v, s, "minContains", plen, 1, &cmin)) ||
            (rc = val_count(v, s, "maxContains", plen, INT64_MAX, &cmax)))
            return rc;
        if (v->doc->dialect != SC_2020) {
            cmin = 1;
            cmax = INT64_MAX;
        }
        for (size_t i = 0; i < n; i++) {
            bool ok = false;
            if ((rc = val_try(v, contains, json_array_get(x, i), val_push_index(v, plen, i), &ok)))
                return rc;
            found += ok;
        }
        if (found < cmin || found > cmax)
            return val_fail(v, plen, SW_EINVAL, "too few or too many items match 'contains'");
    }
    if (json_is_true(json_object_get(s, "uniqueItems"))) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++)
                if (eng__sc_val_equal(json_array_get(x, i), json_array_get(x, j)))
                    return val_fail(v, plen, SW_EINVAL, "the array's items are not unique");
    }
    return SW_OK;
}

/* x mod m for a marker integer, exactly (0 < m < 2^59). */
static int64_t big_mod(const char *t, int64_t m)
{
    int64_t r = 0;
    for (const char *p = t + (t[0] == '-'); *p; p++)
        r = (r * 10 + (*p - '0')) % m;
    return r;
}

static int val_number(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    double d = eng__sc_num_double(x);
    for (int lower = 0; lower < 2; lower++) {
        num_bound nb = eng__sc_bound_get(s, lower);
        if (!nb.v)
            continue;
        int c = eng__sc_num_cmp(x, nb.v);
        if (lower ? (c < 0 || (c == 0 && nb.excl)) : (c > 0 || (c == 0 && nb.excl)))
            return val_fail(v, plen, SW_EINVAL,
                            lower ? "the number is below the minimum"
                                  : "the number is above the maximum");
    }
    const json_t *mo = json_object_get(s, "multipleOf");
    if (mo) {
        if (sw_json_big_text(mo))
            return val_fail(v, plen, SW_EUNSUPPORTED,
                            "'multipleOf' past 64 bits is not supported");
        if (!json_is_number(mo) || json_number_value(mo) <= 0)
            return val_fail(v, plen, SW_EUNSUPPORTED, "'multipleOf' must be a positive number");
        bool ok = false;
        if (json_is_integer(mo) && json_is_integer(x)) {
            ok = json_integer_value(x) % json_integer_value(mo) == 0;
        } else if (json_is_integer(mo) && eng__sc_big_ok(x) &&
                   json_integer_value(mo) < (1LL << 59)) {
            ok = big_mod(sw_json_big_text(x), json_integer_value(mo)) == 0;
        } else if (sw_json_big_text(x)) {
            return val_fail(v, plen, SW_EUNSUPPORTED,
                            "'multipleOf' of a number past 64 bits: only whole multiples below "
                            "2^59 are checked");
        } else {
            /* in doubles 44.5988 / 0.0001 is 445987.99999999994: a
             * quotient this close to a whole number is taken as one */
            double q = d / json_number_value(mo);
            if (!isfinite(q))
                return val_fail(v, plen, SW_EUNSUPPORTED, "'multipleOf' overflows");
            ok = fabs(q - nearbyint(q)) <= 1e-9 * fmax(1.0, fabs(q));
        }
        if (!ok)
            return val_fail(v, plen, SW_EINVAL, "the number is not a multiple of 'multipleOf'");
    }
    return SW_OK;
}

static int val_check_inner(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    int rc;
    if (json_is_true(s))
        return SW_OK;
    if (json_is_false(s))
        return val_fail(v, plen, SW_EINVAL, "the schema allows no value here");
    if (!json_is_object(s))
        return val_fail(v, plen, SW_EUNSUPPORTED, "a schema must be an object");
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const json_t *target;
        sw_error e;
        if (!json_is_string(ref) ||
            (rc = eng__sc_doc_resolve(v->doc, v->base, json_string_value(ref), &target, &e)))
            return val_fail(v, plen, SW_EUNSUPPORTED, json_is_string(ref) ? e.message : "$ref");
        if ((rc = val_check(v, target, x, plen)))
            return rc;
        if (v->doc->dialect != SC_2020)
            return SW_OK; /* draft 7: the other keywords are ignored */
    }
    static const char *const refused[] = {"unevaluatedItems", "unevaluatedProperties",
                                          "$dynamicRef", "$recursiveRef"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (json_object_get(s, refused[i])) {
            char what[96];
            snprintf(what, sizeof what, "'%s' is not supported", refused[i]);
            return val_fail(v, plen, SW_EUNSUPPORTED, what);
        }
    const json_t *fmt = json_object_get(s, "format");
    if (json_is_string(fmt) && IN_LIST(json_string_value(fmt), known_formats) &&
        !eng_format_pattern(json_string_value(fmt), NULL) &&
        json_is_string(x))
        return val_fail(v, plen, SW_EUNSUPPORTED, "'format' is not supported");
    const json_t *type = json_object_get(s, "type");
    if (type) {
        int tm = eng__sc_type_mask(type);
        if (tm < 0)
            return val_fail(v, plen, SW_EUNSUPPORTED, "an unknown 'type'");
        bool match = false;
        for (int bit = 1; bit < 128; bit <<= 1)
            if ((tm & bit) && type_matches(x, bit))
                match = true;
        if (!match)
            return val_fail(v, plen, SW_EINVAL, "the value has the wrong type");
    }
    const json_t *c = json_object_get(s, "const");
    const json_t *e = json_object_get(s, "enum");
    if (e && !json_is_array(e))
        return val_fail(v, plen, SW_EUNSUPPORTED, "'enum' must be an array");
    if (c && !eng__sc_val_equal(c, x))
        return val_fail(v, plen, SW_EINVAL, "the value is not the schema's const");
    if (e) {
        bool found = false;
        for (size_t i = 0; i < json_array_size(e) && !found; i++)
            found = eng__sc_val_equal(json_array_get(e, i), x);
        if (!found)
            return val_fail(v, plen, SW_EINVAL, "the value is not one of the enum values");
    }
    const json_t *all = json_object_get(s, "allOf");
    for (size_t i = 0; i < json_array_size(all); i++)
        if ((rc = val_check(v, json_array_get(all, i), x, plen)))
            return rc;
    static const char *const alt_keys[] = {"anyOf", "oneOf"};
    for (int k = 0; k < 2; k++) {
        const json_t *any = json_object_get(s, alt_keys[k]);
        if (!any)
            continue;
        size_t n = json_array_size(any), matched = 0;
        if (!json_is_array(any) || n == 0)
            return val_fail(v, plen, SW_EUNSUPPORTED, "anyOf/oneOf must be a non-empty array");
        for (size_t i = 0; i < n && (k == 1 || matched == 0); i++) {
            bool ok = false;
            if ((rc = val_try(v, json_array_get(any, i), x, plen, &ok)))
                return rc;
            matched += ok;
        }
        if (matched == 0)
            return val_fail(v, plen, SW_EINVAL,
                            "the value matches none of the anyOf/oneOf alternatives");
        if (k == 1 && matched > 1)
            return val_fail(v, plen, SW_EINVAL,
                            "the value matches more than one oneOf alternative");
    }
    const json_t *not = json_object_get(s, "not");
    if (not) {
        bool ok = false;
        if ((rc = val_try(v, not, x, plen, &ok)))
            return rc;
        if (ok)
            return val_fail(v, plen, SW_EINVAL, "the value matches the schema of 'not'");
    }
    /* `if` without `then` or `else` has no effect, whatever its value (the
     * compiler ignores it too) */
    const json_t *cond = json_object_get(s, "if");
    if (cond && (json_object_get(s, "then") || json_object_get(s, "else"))) {
        bool ok = false;
        if ((rc = val_try(v, cond, x, plen, &ok)))
            return rc;
        const json_t *branch = json_object_get(s, ok ? "then" : "else");
        if (branch && (rc = val_check(v, branch, x, plen)))
            return rc;
    }
    if (json_is_object(x))
        return val_object(v, s, x, plen);
    if (json_is_array(x))
        return val_array(v, s, x, plen);
    if (eng__sc_is_num(x))
        return val_number(v, s, x, plen);
    if (json_is_string(x)) {
        int64_t lo, hi;
        if ((rc = val_count(v, s, "minLength", plen, 0, &lo)) ||
            (rc = val_count(v, s, "maxLength", plen, INT64_MAX, &hi)))
            return rc;
        int64_t chars = utf8_count(json_string_value(x), json_string_length(x));
        if (chars < lo)
            return val_fail(v, plen, SW_EINVAL, "the string is shorter than minLength");
        if (chars > hi)
            return val_fail(v, plen, SW_EINVAL, "the string is longer than maxLength");
        eng_regex *re = NULL;
        int32_t fmt_max;
        const char *key;
        sw_error perr;
        if ((rc = eng__sc_string_automaton(s, &re, &fmt_max, &key, &perr)))
            return val_fail(v, plen, SW_EUNSUPPORTED, perr.message);
        bool ok = !re || (chars <= fmt_max &&
                          eng_regex_match(re, json_string_value(x), json_string_length(x)));
        eng_regex_free(re);
        if (!ok)
            return val_fail(v, plen, SW_EINVAL,
                            strcmp(key, "format") == 0 ? "the string does not match its 'format'"
                                                       : "the string does not match 'pattern'");
    }
    return SW_OK;
}

static int val_check(validator *v, const json_t *s, const json_t *x, size_t plen)
{
    if (++v->steps > VAL_MAX_STEPS)
        return val_fail(v, plen, SW_EUNSUPPORTED, "too many alternatives to try");
    if (v->depth >= VAL_MAX_DEPTH)
        return val_fail(v, plen, SW_EUNSUPPORTED, "the schema nests too deeply");
    const char *saved = v->base;
    const char *mine = json_is_object(s) ? eng__sc_doc_base_of(v->doc, s) : NULL;
    if (mine)
        v->base = mine;
    v->depth++;
    int rc = val_check_inner(v, s, x, plen);
    v->depth--;
    v->base = saved;
    return rc;
}

/* The compiler's use: schema belongs to d (or its arena). */
int eng__sc_val_judge(const sc_doc *d, const json_t *schema, const json_t *value, sw_error *err)
{
    validator v;
    memset(&v, 0, sizeof v);
    v.doc = d;
    v.err = err;
    v.base = SC_DEFAULT_BASE;
    strcpy(v.path, "#");
    return val_check(&v, schema, value, 1);
}

int eng_json_validate(const json_t *schema, const json_t *value, sw_error *err)
{
    if (!schema || !value)
        return sw_error_set(err, SW_EUNSUPPORTED, "eng_json_validate: NULL argument");
    sc_doc d;
    sw_error e;
    int rc = eng__sc_doc_init(&d, schema, &e);
    if (rc)
        return sw_error_set(err, rc == SW_ENOMEM ? SW_ENOMEM : SW_EUNSUPPORTED,
                            "the schema cannot be checked: %s", e.message);
    rc = eng__sc_val_judge(&d, schema, value, err);
    eng__sc_doc_free(&d);
    return rc;
}
