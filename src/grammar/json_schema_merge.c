/* json_schema_merge.c - keywords, types, numbers of any size and the
 * merge of allOf into one schema, for the compiler and the validator.
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

/* ---- keywords ---------------------------------------------------------------
 * JSON Schema's assertions and applicators. A keyword not in this list is
 * an annotation (title, $comment, x-anything, ...) and is ignored, as the
 * specification says. */
static const char *const known_keywords[] = {
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "properties", "patternProperties", "additionalProperties",
    "propertyNames", "items", "prefixItems", "additionalItems", "contains", "allOf", "anyOf",
    "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies",
    "unevaluatedItems", "unevaluatedProperties", "$ref", "$dynamicRef", "$recursiveRef",
    "format",
};

/* Formats with a defined syntax: the ones formats.h has a pattern for are
 * enforced (CS_PATTERN), the others refused; any other format is an
 * annotation. */

bool eng__sc_in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0)
            return true;
    return false;
}

bool eng__sc_is_known_keyword(const char *k)
{
    return IN_LIST(k, known_keywords);
}

/* ---- allOf: merging schemas into one -----------------------------------------
 * allOf (and a $ref beside other keywords, which means the same) is
 * compiled as one schema holding every constraint: bounds take the
 * tighter value, types and enums intersect, required and properties
 * unite (a property's schema is the allOf of both sides' schemas for it,
 * additionalProperties standing in where a side does not declare it),
 * anyOf lists multiply out. Two different values of a keyword that cannot
 * be combined (two patterns, two multipleOf, two contains, ...) are
 * refused. The merged schemas live in the document's arena; their
 * subschemas are the document's own (so their base URIs stay known). */


static const char *const type_names[] = {"object", "array", "string", "number", "integer",
                                         "boolean", "null"};

static int type_bit(const char *t)
{
    for (int i = 0; i < 7; i++)
        if (strcmp(t, type_names[i]) == 0)
            return 1 << i;
    return 0;
}

/* The types a "type" keyword allows (number includes integer); -1 when
 * malformed. Absent: all. */
int eng__sc_type_mask(const json_t *type)
{
    if (!type)
        return T_ALL;
    int m = 0;
    if (json_is_string(type)) {
        m = type_bit(json_string_value(type));
        if (!m)
            return -1;
    } else if (json_is_array(type)) {
        for (size_t i = 0; i < json_array_size(type); i++) {
            const char *t = json_string_value(json_array_get(type, i));
            int bit = t ? type_bit(t) : 0;
            if (!bit)
                return -1;
            m |= bit;
        }
    } else {
        return -1;
    }
    if (m & T_NUMBER)
        m |= T_INTEGER;
    return m;
}

static json_t *type_json(int m)
{
    if ((m & T_NUMBER) && (m & T_INTEGER))
        m &= ~T_INTEGER;
    json_t *a = json_array();
    for (int i = 0; a && i < 7; i++)
        if (m & (1 << i))
            json_array_append_new(a, json_string(type_names[i]));
    return a;
}

bool eng__sc_is_num(const json_t *v);
int eng__sc_num_cmp(const json_t *a, const json_t *b);

/* JSON equality where 1 and 1.0 are the same number (JSON Schema's). */
bool eng__sc_val_equal(const json_t *a, const json_t *b)
{
    if ((sw_json_big_text(a) || sw_json_big_text(b)) && eng__sc_is_num(a) && eng__sc_is_num(b))
        return eng__sc_num_cmp(a, b) == 0;
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_is_array(a) && json_is_array(b)) {
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!eng__sc_val_equal(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    }
    if (json_is_object(a) && json_is_object(b)) {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)a, k, x) {
            const json_t *y = json_object_get(b, k);
            if (!y || !eng__sc_val_equal(x, y))
                return false;
        }
        return true;
    }
    return json_equal((json_t *)a, (json_t *)b);
}

/* {"allOf":[a,b]}, or the one that is not true. New reference. */
static json_t *allof2(const json_t *a, const json_t *b)
{
    if (!a || json_is_true(a))
        return b ? json_incref((json_t *)b) : json_true();
    if (!b || json_is_true(b))
        return json_incref((json_t *)a);
    if (json_is_false(a) || json_is_false(b))
        return json_false();
    return json_pack("{s:[OO]}", "allOf", a, b);
}

/* ---- numbers past 64 bits ----
 * A body's number that jansson cannot hold is a marker string with the
 * literal's text (json_big.h). Integers of up to ENG_CS_MAX_BIG_DIGITS
 * digits are exact everywhere a schema compares numbers (bounds, const,
 * enum); a fraction or an exponent past a double's range is refused where
 * a keyword would need its value. */

bool eng__sc_is_num(const json_t *v)
{
    return json_is_number(v) || sw_json_big_text(v);
}

/* The marker of an integer the compiler can use exactly. */
bool eng__sc_big_ok(const json_t *v)
{
    const char *t = sw_json_big_text(v);
    return t && !strpbrk(t, ".eE") && strlen(t) <= ENG_CS_MAX_BIG_DIGITS;
}

/* A whole value held exactly: int64, a marker integer or a whole double. */
static bool num_exact_whole(const json_t *v)
{
    if (json_is_integer(v) || eng__sc_big_ok(v))
        return true;
    return json_is_real(v) && isfinite(json_real_value(v)) &&
           json_real_value(v) == floor(json_real_value(v));
}

double eng__sc_num_double(const json_t *v)
{
    const char *t = sw_json_big_text(v);
    return t ? strtod(t, NULL) : json_number_value(v);
}


static void mag_inc(char *m)
{
    size_t n = strlen(m);
    size_t i = n;
    while (i > 0 && m[i - 1] == '9')
        m[--i] = '0';
    if (i > 0) {
        m[i - 1]++;
    } else if (n + 2 < sizeof((dec *)0)->mag) {
        memmove(m + 1, m, n + 1);
        m[0] = '1';
    }
}

static void mag_dec(char *m)
{
    size_t n = strlen(m);
    size_t i = n;
    while (i > 0 && m[i - 1] == '0')
        m[--i] = '9';
    if (i > 0)
        m[i - 1]--;
    size_t z = 0;
    while (m[z] == '0' && m[z + 1])
        z++;
    memmove(m, m + z, strlen(m + z) + 1);
}

/* floor (down) or ceil of a JSON number, exactly (a number past 64 bits:
 * an integer of at most ENG_CS_MAX_BIG_DIGITS digits, big_ok). */
void eng__sc_dec_round(const json_t *v, bool down, dec *out)
{
    const char *big = sw_json_big_text(v);
    if (big) {
        out->neg = big[0] == '-';
        snprintf(out->mag, sizeof out->mag, "%s", big + out->neg);
        return;
    }
    if (json_is_integer(v)) {
        char t[32];
        snprintf(t, sizeof t, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        out->neg = t[0] == '-';
        snprintf(out->mag, sizeof out->mag, "%s", t + out->neg);
        return;
    }
    double d = json_real_value(v), c = down ? floor(d) : ceil(d);
    snprintf(out->mag, sizeof out->mag, "%.0f", fabs(c));
    out->neg = c < 0 && strcmp(out->mag, "0") != 0;
}

bool eng__sc_num_whole(const json_t *v)
{
    return json_is_integer(v) || sw_json_big_text(v) ||
           json_real_value(v) == floor(json_real_value(v));
}

void eng__sc_dec_negate(dec *x)
{
    x->neg = !x->neg && strcmp(x->mag, "0") != 0;
}

/* x += delta (+1 or -1) */
void eng__sc_dec_step(dec *x, int delta)
{
    if ((delta > 0) != x->neg) {
        mag_inc(x->mag);
    } else if (strcmp(x->mag, "0") == 0) {
        x->neg = delta < 0;
        strcpy(x->mag, "1");
    } else {
        mag_dec(x->mag);
        if (strcmp(x->mag, "0") == 0)
            x->neg = false;
    }
}

static int mag_cmp(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la != lb)
        return la < lb ? -1 : 1;
    int c = strcmp(a, b);
    return c < 0 ? -1 : c > 0;
}

int eng__sc_dec_cmp(const dec *a, const dec *b)
{
    if (a->neg != b->neg)
        return a->neg ? -1 : 1;
    int c = mag_cmp(a->mag, b->mag);
    return a->neg ? -c : c;
}

int eng__sc_num_cmp(const json_t *a, const json_t *b)
{
    if (json_is_integer(a) && json_is_integer(b))
        return json_integer_value(a) < json_integer_value(b)
                   ? -1
                   : json_integer_value(a) > json_integer_value(b);
    if (num_exact_whole(a) && num_exact_whole(b)) {
        dec x, y;
        eng__sc_dec_round(a, true, &x);
        eng__sc_dec_round(b, true, &y);
        return eng__sc_dec_cmp(&x, &y);
    }
    /* a fraction is within 2^53, a marker integer beyond 2^63: doubles
     * order them rightly */
    double x = eng__sc_num_double(a), y = eng__sc_num_double(b);
    return x < y ? -1 : x > y;
}

num_bound eng__sc_bound_get(const json_t *s, bool lower)
{
    num_bound r = {NULL, false};
    const json_t *plain = json_object_get(s, lower ? "minimum" : "maximum");
    const json_t *ex = json_object_get(s, lower ? "exclusiveMinimum" : "exclusiveMaximum");
    if (eng__sc_is_num(plain))
        r.v = plain;
    if (json_is_true(ex) && r.v) {
        r.excl = true;
    } else if (eng__sc_is_num(ex)) {
        int c = r.v ? eng__sc_num_cmp(ex, r.v) : (lower ? 1 : -1);
        if (lower ? c >= 0 : c <= 0) {
            r.v = ex;
            r.excl = true;
        }
    }
    return r;
}

/* The tighter of two bounds. */
static num_bound bound_tighter(num_bound a, num_bound b, bool lower)
{
    if (!a.v)
        return b;
    if (!b.v)
        return a;
    int c = eng__sc_num_cmp(a.v, b.v);
    if (c == 0)
        return a.excl ? a : b;
    return (lower ? c > 0 : c < 0) ? a : b;
}


/* Whether a patternProperties pattern matches a property name: 1, 0, or
 * the regex module's error (a pattern it refuses). */
int eng__sc_pattern_match_name(const char *pattern, const char *name, sw_error *err)
{
    eng_regex *re = NULL;
    int rc = eng_regex_compile(pattern, strlen(pattern), &re, err);
    if (rc)
        return rc;
    bool m = eng_regex_match(re, name, strlen(name));
    eng_regex_free(re);
    return m ? 1 : 0;
}

/* The schema a side gives property `name` (new reference): its properties
 * entry and the patternProperties that match the name, else its
 * additionalProperties (true when absent). */
int eng__sc_prop_schema(const json_t *s, const char *name, json_t **out, sw_error *err)
{
    const json_t *p = json_object_get(json_object_get(s, "properties"), name);
    const json_t *pp = json_object_get(s, "patternProperties");
    json_t *acc = p ? json_incref((json_t *)p) : NULL;
    const char *pat;
    const json_t *ps;
    json_object_foreach((json_t *)pp, pat, ps) {
        int m = eng__sc_pattern_match_name(pat, name, err);
        if (m < 0) {
            json_decref(acc);
            return m;
        }
        if (m) {
            json_t *w = allof2(acc, ps);
            json_decref(acc);
            acc = w;
        }
    }
    if (!acc) {
        const json_t *a = json_object_get(s, "additionalProperties");
        acc = a ? json_incref((json_t *)a) : json_true();
    }
    *out = acc;
    return acc ? SW_OK : sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
}

/* A pattern for "the string begins with a match of p", to stand inside a
 * lookahead at the string's start: JSON Schema's patterns are not
 * anchored, so that is [\s\S]*(?:p), or p itself where it starts with ^
 * and has no | (sw_malloc'd; NULL: out of memory). */
char *eng__sc_pattern_prefix_form(const json_t *p)
{
    const char *t = json_string_value(p);
    size_t n = json_string_length(p);
    bool anchored = n > 0 && t[0] == '^' && !memchr(t, '|', n);
    char *out = sw_malloc(n + 16);
    if (!out)
        return NULL;
    size_t o = 0;
    if (!anchored) {
        static const char any_then[] = "[\\s\\S]*(?:";
        memcpy(out, any_then, sizeof any_then - 1);
        o = sizeof any_then - 1;
    }
    memcpy(out + o, t, n);
    o += n;
    if (!anchored)
        out[o++] = ')';
    out[o] = '\0';
    return out;
}

/* Two patterns as one: ^(?=X)(?=Y), each a string beginning with a match
 * of one (the lookaheads are products of automata: their intersection).
 * New reference, or NULL (out of memory, or a NUL in a pattern). */
static json_t *pattern_and(const json_t *a, const json_t *b)
{
    char *x = eng__sc_pattern_prefix_form(a), *y = eng__sc_pattern_prefix_form(b);
    json_t *out = NULL;
    if (x && y && strlen(x) + strlen(y) < (size_t)1 << 20) {
        size_t n = strlen(x) + strlen(y) + 16;
        char *t = sw_malloc(n);
        if (t) {
            snprintf(t, n, "^(?=%s)(?=%s)", x, y);
            out = json_string(t);
            sw_free(t);
        }
    }
    sw_free(x);
    sw_free(y);
    return out;
}

/* m as n / d in lowest terms, d a power of two up to 2^20 or of ten up
 * to 10^6 where m is that quotient exactly as a double; false otherwise. */
static bool as_fraction(double m, int64_t *n, int64_t *d)
{
    if (!(m > 0) || m > 1e9)
        return false;
    int64_t best = 0;
    for (int64_t p = 1; p <= (1 << 20); p *= 2) {
        double x = m * (double)p;
        if (x == floor(x) && x < 2147483648.0 && x / (double)p == m) {
            best = p;
            break;
        }
    }
    for (int64_t p = 10; p <= 1000000 && !best; p *= 10) {
        double x = m * (double)p;
        if (x == floor(x) && x < 2147483648.0 && x / (double)p == m)
            best = p;
    }
    if (!best)
        return false;
    int64_t x = (int64_t)(m * (double)best), g = x, h = best;
    while (h) {
        int64_t t = g % h;
        g = h;
        h = t;
    }
    *n = x / g;
    *d = best / g;
    return true;
}

/* The least common multiple of two multipleOf values where it is exact, as
 * a multipleOf the compiler takes (new reference), or NULL. A fraction
 * with a decimal denominator (0.1) is not a double: a multiple of it that
 * is not whole would fail a validator that divides in doubles, so the
 * result is then rounded up to a whole multiple (a narrowing). */
static json_t *multiple_lcm(double x, double y)
{
    int64_t nx, dx, ny, dy;
    if (!as_fraction(x, &nx, &dx) || !as_fraction(y, &ny, &dy))
        return NULL;
    int64_t g = nx, h = ny;
    while (h) {
        int64_t t = g % h;
        g = h;
        h = t;
    }
    int64_t num = nx / g * ny; /* both below 2^31: no overflow */
    g = dx, h = dy;
    while (h) {
        int64_t t = g % h;
        g = h;
        h = t;
    }
    if (num > INT32_MAX)
        return NULL;
    if (g == 1 || dx % 5 == 0 || dy % 5 == 0)
        return json_integer(num);
    return json_real((double)num / (double)g);
}

/* The types a schema's values can have, as far as its own "type", "const"
 * or "enum" show (T_ALL where they do not). */
static int visible_types(const json_t *s)
{
    if (json_is_false(s))
        return 0;
    if (!json_is_object(s))
        return T_ALL;
    int m = T_ALL;
    const json_t *t = json_object_get(s, "type");
    if (t && eng__sc_type_mask(t) >= 0)
        m = eng__sc_type_mask(t);
    const json_t *c = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    if (c || json_is_array(e)) {
        int v = 0;
        for (size_t i = 0; i < (c ? 1 : json_array_size(e)); i++) {
            const json_t *x = c ? c : json_array_get(e, i);
            v |= json_is_object(x)    ? T_OBJECT
                 : json_is_array(x)   ? T_ARRAY
                 : json_is_string(x)  ? (eng__sc_is_num(x) ? T_NUMBER | T_INTEGER : T_STRING)
                 : json_is_number(x)  ? T_NUMBER | T_INTEGER
                 : json_is_boolean(x) ? T_BOOLEAN
                                      : T_NULL;
        }
        m &= v;
    }
    return m;
}

static int merge_fail(sw_error *err, const char *key)
{
    return sw_error_set(err, SW_EUNSUPPORTED,
                        "allOf: two different '%.64s' cannot be merged into one schema", key);
}

/* a and b: schema objects without allOf or $ref. *out: new reference. */
int eng__sc_merge2(const json_t *a, const json_t *b, json_t **out, sw_error *err)
{
    json_t *m = json_object();
    if (!m)
        return sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
    int rc = SW_OK;
    const char *k;
    const json_t *v;
    /* keywords of one side only, or equal on both: copied */
    for (int side = 0; side < 2; side++) {
        const json_t *x = side ? b : a, *y = side ? a : b;
        json_object_foreach((json_t *)x, k, v) {
            if (!eng__sc_is_known_keyword(k) || json_object_get(m, k))
                continue;
            const json_t *w = json_object_get(y, k);
            if (!w || json_equal((json_t *)v, (json_t *)w))
                json_object_set(m, k, (json_t *)v);
        }
    }
    /* types */
    int ta = eng__sc_type_mask(json_object_get(a, "type")),
        tb = eng__sc_type_mask(json_object_get(b, "type"));
    if (ta < 0 || tb < 0) {
        rc = sw_error_set(err, SW_EINVAL, "allOf: a malformed 'type'");
        goto fail;
    }
    if ((ta & tb) != T_ALL) {
        json_object_set_new(m, "type", type_json(ta & tb));
        if ((ta & tb) == 0) {
            json_decref(m);
            *out = json_false();
            return SW_OK;
        }
    }
    /* counts and bounds */
    for (size_t i = 0; i < 4; i++) {
        const json_t *x = json_object_get(a, min_keys[i]), *y = json_object_get(b, min_keys[i]);
        if (x && y)
            json_object_set(m, min_keys[i], eng__sc_num_cmp(x, y) >= 0 ? (json_t *)x : (json_t *)y);
        x = json_object_get(a, max_keys[i]);
        y = json_object_get(b, max_keys[i]);
        if (x && y)
            json_object_set(m, max_keys[i], eng__sc_num_cmp(x, y) <= 0 ? (json_t *)x : (json_t *)y);
    }
    for (size_t i = 0; i < 4; i++)
        json_object_del(m, bound_keys[i]);
    for (int lower = 0; lower < 2; lower++) {
        num_bound t =
            bound_tighter(eng__sc_bound_get(a, lower), eng__sc_bound_get(b, lower), lower);
        if (t.v)
            json_object_set(m, t.excl ? (lower ? "exclusiveMinimum" : "exclusiveMaximum")
                                      : (lower ? "minimum" : "maximum"),
                            (json_t *)t.v);
    }
    /* enum / const: the values of both */
    const json_t *ea = json_object_get(a, "enum"), *eb = json_object_get(b, "enum");
    const json_t *ca = json_object_get(a, "const"), *cb = json_object_get(b, "const");
    if ((ea || ca) && (eb || cb)) {
        json_object_del(m, "enum");
        json_object_del(m, "const");
        json_t *both = json_array();
        size_t na = ca ? 1 : json_array_size(ea), nb = cb ? 1 : json_array_size(eb);
        for (size_t i = 0; both && i < na; i++) {
            const json_t *x = ca ? ca : json_array_get(ea, i);
            for (size_t j = 0; j < nb; j++)
                if (eng__sc_val_equal(x, cb ? cb : json_array_get(eb, j))) {
                    json_array_append(both, (json_t *)x);
                    break;
                }
        }
        if (json_array_size(both) == 0) {
            json_decref(both);
            json_decref(m);
            *out = json_false();
            return SW_OK;
        }
        json_object_set_new(m, "enum", both);
    }
    /* required: both lists */
    const json_t *ra = json_object_get(a, "required"), *rb = json_object_get(b, "required");
    if (ra && rb) {
        json_t *r = json_array();
        for (int side = 0; r && side < 2; side++) {
            const json_t *l = side ? rb : ra;
            for (size_t i = 0; i < json_array_size(l); i++) {
                bool dup = false;
                for (size_t j = 0; j < json_array_size(r) && !dup; j++)
                    dup = json_equal(json_array_get(r, j), json_array_get(l, i));
                if (!dup)
                    json_array_append(r, json_array_get(l, i));
            }
        }
        json_object_set_new(m, "required", r);
    }
    /* properties and additionalProperties */
    const json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    const json_t *aa = json_object_get(a, "additionalProperties");
    const json_t *ab = json_object_get(b, "additionalProperties");
    const json_t *qa = json_object_get(a, "patternProperties");
    const json_t *qb = json_object_get(b, "patternProperties");
    if (pa || pb || aa || ab || qa || qb) {
        json_t *props = json_object();
        for (int side = 0; props && side < 2; side++) {
            json_object_foreach((json_t *)(side ? pb : pa), k, v) {
                if (json_object_get(props, k))
                    continue;
                json_t *x = NULL, *y = NULL;
                if ((rc = eng__sc_prop_schema(a, k, &x, err)) ||
                    (rc = eng__sc_prop_schema(b, k, &y, err))) {
                    json_decref(x);
                    json_decref(props);
                    goto fail;
                }
                json_object_set_new(props, k, allof2(x, y));
                json_decref(x);
                json_decref(y);
            }
        }
        /* a name matching one side's pattern gets the other side's
         * additionalProperties too (stricter where the other side has a
         * pattern of its own for it: a narrowing) */
        json_t *pats = json_object();
        for (int side = 0; pats && side < 2; side++) {
            const json_t *q = side ? qb : qa, *other = side ? a : b;
            const json_t *oq = json_object_get(other, "patternProperties");
            const json_t *oa = json_object_get(other, "additionalProperties");
            json_object_foreach((json_t *)q, k, v) {
                if (json_object_get(pats, k))
                    continue;
                json_t *mine = allof2(v, json_object_get(oq, k));
                json_t *w = json_object_get(oq, k) ? json_incref(mine) : allof2(mine, oa);
                json_decref(mine);
                json_object_set_new(pats, k, w);
            }
        }
        json_object_del(m, "patternProperties");
        if (pats && json_object_size(pats))
            json_object_set_new(m, "patternProperties", pats);
        else
            json_decref(pats);
        if (props && json_object_size(props))
            json_object_set_new(m, "properties", props);
        else
            json_decref(props);
        json_object_del(m, "additionalProperties");
        if (aa || ab)
            json_object_set_new(m, "additionalProperties", allof2(aa, ab));
    }
    /* items (a schema on both sides) */
    const json_t *ia = json_object_get(a, "items"), *ib = json_object_get(b, "items");
    const json_t *fa = json_object_get(a, "prefixItems"), *fb = json_object_get(b, "prefixItems");
    if ((fa || fb) && !json_equal((json_t *)fa, (json_t *)fb) && (!fa || json_is_array(fa)) &&
        (!fb || json_is_array(fb)) && (!ia || !json_is_array(ia)) &&
        (!ib || !json_is_array(ib))) {
        /* 2020-12 tuples: position by position, a side's items standing
         * for the positions past its tuple */
        size_t la = json_array_size(fa), lb = json_array_size(fb), n = la > lb ? la : lb;
        json_t *tuple = json_array();
        for (size_t i = 0; tuple && i < n; i++) {
            const json_t *x = i < la ? json_array_get(fa, i) : ia;
            const json_t *y = i < lb ? json_array_get(fb, i) : ib;
            if (json_array_append_new(tuple, allof2(x, y))) {
                json_decref(tuple);
                tuple = NULL;
            }
        }
        if (!tuple) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
            goto fail;
        }
        json_object_set_new(m, "prefixItems", tuple);
        json_object_del(m, "items");
        if (ia || ib)
            json_object_set_new(m, "items", allof2(ia, ib));
    } else if (ia && ib && !json_equal((json_t *)ia, (json_t *)ib)) {
        if (json_is_array(ia) || json_is_array(ib) || json_object_get(a, "prefixItems") ||
            json_object_get(b, "prefixItems")) {
            rc = merge_fail(err, "items");
            goto fail;
        }
        json_object_set_new(m, "items", allof2(ia, ib));
    } else if ((ia && !ib && json_object_get(b, "prefixItems")) ||
               (ib && !ia && json_object_get(a, "prefixItems"))) {
        /* one side's items would cover the other's tuple positions too */
        rc = merge_fail(err, "items");
        goto fail;
    }
    /* anyOf on both sides: every pair */
    const json_t *xa = json_object_get(a, "anyOf"), *xb = json_object_get(b, "anyOf");
    if (xa && xb && !json_equal((json_t *)xa, (json_t *)xb)) {
        /* pairs of visibly different types hold no value and are left
         * out; at most 64 are kept */
        json_t *l = json_array();
        for (size_t i = 0; l && i < json_array_size(xa); i++)
            for (size_t j = 0; l && j < json_array_size(xb); j++) {
                const json_t *x = json_array_get(xa, i), *y = json_array_get(xb, j);
                if ((visible_types(x) & visible_types(y)) == 0)
                    continue;
                if (json_array_size(l) >= 64) {
                    json_decref(l);
                    rc = sw_error_set(
                        err, SW_EUNSUPPORTED,
                        "allOf: two anyOf lists multiply out to more than 64 alternatives");
                    goto fail;
                }
                json_array_append_new(l, allof2(x, y));
            }
        if (!l) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
            goto fail;
        }
        if (json_array_size(l) == 0) {
            json_decref(l);
            json_decref(m);
            *out = json_false();
            return SW_OK;
        }
        json_object_set_new(m, "anyOf", l);
    }
    /* not: neither */
    const json_t *na_ = json_object_get(a, "not"), *nb_ = json_object_get(b, "not");
    if (na_ && nb_ && !json_equal((json_t *)na_, (json_t *)nb_))
        json_object_set_new(m, "not", json_pack("{s:[OO]}", "anyOf", na_, nb_));
    /* multipleOf of two whole numbers: their least common multiple */
    const json_t *ma = json_object_get(a, "multipleOf"), *mb = json_object_get(b, "multipleOf");
    if (ma && mb && !json_equal((json_t *)ma, (json_t *)mb) && json_is_integer(ma) &&
        json_is_integer(mb) && json_integer_value(ma) > 0 && json_integer_value(mb) > 0) {
        long long x = json_integer_value(ma), y = json_integer_value(mb), g = x, h = y;
        while (h) {
            long long t = g % h;
            g = h;
            h = t;
        }
        if (x / g <= INT32_MAX / y)
            json_object_set_new(m, "multipleOf", json_integer(x / g * y));
    }
    /* pattern: both, as one pattern of two lookaheads */
    const json_t *pta = json_object_get(a, "pattern"), *ptb = json_object_get(b, "pattern");
    if (json_is_string(pta) && json_is_string(ptb) && !json_equal((json_t *)pta, (json_t *)ptb) &&
        !memchr(json_string_value(pta), '\0', json_string_length(pta)) &&
        !memchr(json_string_value(ptb), '\0', json_string_length(ptb))) {
        /* each must be a pattern on its own: pasted into one, an unclosed
         * class of one would swallow the other's text */
        for (int side = 0; side < 2; side++) {
            const json_t *pt = side ? ptb : pta;
            eng_regex *re = NULL;
            if ((rc = eng_regex_compile(json_string_value(pt), json_string_length(pt), &re,
                                        err)))
                goto fail;
            eng_regex_free(re);
        }
        json_t *both = pattern_and(pta, ptb);
        if (!both) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
            goto fail;
        }
        json_object_set_new(m, "pattern", both);
    }
    /* multipleOf of two fractions: their least common multiple */
    if (ma && mb && !json_object_get(m, "multipleOf") && !json_equal((json_t *)ma, (json_t *)mb) &&
        json_is_number(ma) && json_is_number(mb)) {
        json_t *l = multiple_lcm(json_number_value(ma), json_number_value(mb));
        if (l)
            json_object_set_new(m, "multipleOf", l);
    }
    /* oneOf on both sides: exactly one of each is exactly one pair (a value
     * matching two of one side matches two pairs with the other's one) */
    const json_t *oa = json_object_get(a, "oneOf"), *ob = json_object_get(b, "oneOf");
    if (oa && ob && !json_equal((json_t *)oa, (json_t *)ob)) {
        if (json_array_size(oa) * json_array_size(ob) > 64) {
            rc = sw_error_set(err, SW_EUNSUPPORTED,
                              "allOf: two oneOf lists multiply out to more than 64 alternatives");
            goto fail;
        }
        json_t *l = json_array();
        for (size_t i = 0; l && i < json_array_size(oa); i++)
            for (size_t j = 0; j < json_array_size(ob); j++)
                json_array_append_new(l, allof2(json_array_get(oa, i), json_array_get(ob, j)));
        json_object_set_new(m, "oneOf", l);
    }
    /* if / then / else on both sides: b's conditional holds in both of a's
     * branches (if A then (T and C) else (E and C)) */
    const json_t *ifa = json_object_get(a, "if"), *ifb = json_object_get(b, "if");
    if (ifa && ifb &&
        !(json_equal((json_t *)ifa, (json_t *)ifb) &&
          json_equal(json_object_get(a, "then"), json_object_get(b, "then")) &&
          json_equal(json_object_get(a, "else"), json_object_get(b, "else")))) {
        static const char *const cond_keys[] = {"if", "then", "else"};
        json_t *cond = json_object();
        for (size_t i = 0; cond && i < 3; i++)
            if (json_object_get(b, cond_keys[i]))
                json_object_set(cond, cond_keys[i], json_object_get(b, cond_keys[i]));
        if (!cond) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory merging allOf");
            goto fail;
        }
        json_object_set(m, "if", (json_t *)ifa);
        json_object_set_new(m, "then", allof2(json_object_get(a, "then"), cond));
        json_object_set_new(m, "else", allof2(json_object_get(a, "else"), cond));
        json_decref(cond);
    }
    /* uniqueItems: either */
    if (json_is_true(json_object_get(a, "uniqueItems")) ||
        json_is_true(json_object_get(b, "uniqueItems")))
        json_object_set(m, "uniqueItems", json_true());
    /* anything else on both sides with different values */
    json_object_foreach((json_t *)a, k, v) {
        if (!eng__sc_is_known_keyword(k) || json_object_get(m, k))
            continue;
        if (IN_LIST(k, min_keys) || IN_LIST(k, max_keys) || IN_LIST(k, bound_keys) ||
            ((strcmp(k, "const") == 0 || strcmp(k, "enum") == 0) && json_object_get(m, "enum")))
            continue;
        rc = merge_fail(err, k);
        goto fail;
    }
    json_object_foreach((json_t *)b, k, v) {
        if (!eng__sc_is_known_keyword(k) || json_object_get(m, k))
            continue;
        if (IN_LIST(k, min_keys) || IN_LIST(k, max_keys) || IN_LIST(k, bound_keys) ||
            ((strcmp(k, "const") == 0 || strcmp(k, "enum") == 0) && json_object_get(m, "enum")))
            continue;
        rc = merge_fail(err, k);
        goto fail;
    }
    *out = m;
    return SW_OK;
fail:
    json_decref(m);
    return rc;
}
