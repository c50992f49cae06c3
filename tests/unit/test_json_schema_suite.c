/* test_json_schema_suite.c - the official JSON Schema Test Suite
 * (../shared/jsonschema-test-suite, drafts 2020-12 and 7) run through the
 * schema compiler and the constraint automaton.
 *
 * For every group of every keyword file: the schema is compiled; where it
 * compiles, each test instance is serialized the way the generator writes
 * JSON and fed to the automaton byte by byte. The rule checked is the
 * engine's: a compiled schema enforces every keyword it holds, so
 *   - a `valid: false` instance must be rejected in every serialization
 *     tried (accepting one would let the generator write invalid output);
 *   - a `valid: true` instance must be accepted in at least one, unless the
 *     group is listed in g_narrowings below with the reason;
 *   - every prefix the automaton accepts can still complete (the budget
 *     logic relies on it: a stuck state would end a generation early);
 *   - eng_json_validate, wherever it judges, agrees with the suite, and
 *     accepts every random output of the automaton (it checks tool calls
 *     that were generated under this grammar).
 * A refused schema must be refused with a typed error (SW_EUNSUPPORTED or
 * SW_EINVAL), never crash or hang. Counts per file are printed (ctest -R
 * test_json_schema_suite -V shows them).
 *
 * Serializations: what the generator emits. Compact JSON (no whitespace
 * outside strings), strings with the escapes \" \\ \b \f \n \r \t only
 * (other control characters would need \u00XX, which the automaton never
 * writes), numbers in plain decimal (never an exponent: 1e2 is written
 * 100), an integer-valued number also as an integer (1.0 as 1, the same
 * JSON Schema value). Object keys in every order (up to a cap), because
 * the generator writes declared properties in their declared order and the
 * instance's own order is arbitrary.
 *
 * Draft 7 files carry no "$schema"; the driver adds the draft 7 URI to each
 * root schema object so the compiler applies draft 7 meanings ($ref beside
 * other keywords, items as an array, dependencies).
 */
#include "testutil.h"
#include "schema_check.h"

#include "common/alloc.h"
#include "common/error.h"
#include "grammar/constrain.h"
#include "grammar/json_schema.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the deliberate narrowings ----------------------------------------------
 * Valid instances the generator never writes. Each entry names a keyword
 * file (NULL: any), a group description and a test description (NULL: the
 * whole group), matched exactly, and the reason. The test fails on a valid
 * instance that is rejected and not listed; a listed one that is accepted
 * is only reported (the narrowing may be stale). */
typedef struct narrowing {
    const char *file;
    const char *group;
    const char *test;
    const char *reason;
} narrowing;

#define WHY_ADDL "additional properties (not in 'properties') are never generated"
#define WHY_FRAC                                                                               \
    "a number's fraction is generated only after an integer part within the integer bounds "    \
    "(minimum 1.1: 2, 3, 2.5 but not 1.1 or 1.5)"
#define WHY_CONTAINS                                                                           \
    "every item is generated matching 'contains' (items that do not are never generated)"
#define WHY_UNIQUE "uniqueItems: arrays of at most one item are generated"
#define WHY_DEP "dependentSchemas apply whether or not their property is present"
#define WHY_IF                                                                                 \
    "if, then and else in separate allOf subschemas are merged into one conditional (only "     \
    "values satisfying if and then, or not if and else, are generated)"
#define WHY_PATTERN                                                                            \
    "a free key (no declared properties) is generated with a value satisfying every "           \
    "patternProperties schema and additionalProperties, whichever it matches"
#define WHY_MULT                                                                               \
    "multipleOf 0.1, 0.01, ...: whole numbers only (validators that divide in doubles call "    \
    "0.07 / 0.01 inexact)"
#define WHY_MULT_DYADIC                                                                        \
    "multipleOf 1.5 (a / 2^j): the whole multiples only (3, 6, ...; 4.5 is never generated)"
#define WHY_ONEOF                                                                              \
    "oneOf alternatives that may overlap are generated as 'this one and not the others'; "      \
    "what that not cannot express is left out (not integer: no numbers)"
#define WHY_DEPREQ                                                                             \
    "an object of free keys never has a key that has dependentRequired dependents (the "       \
    "dependents beside it would make it valid)"
#define WHY_TYPE                                                                               \
    "a schema without 'type' whose keywords all concern one type (properties, items, "          \
    "minLength, ...) generates only values of that type"

static const narrowing g_narrowings[] = {
    {NULL, "*", "ignores *", WHY_TYPE},
    {NULL, "*", "JavaScript pseudo-array is valid", WHY_TYPE},
    {NULL, "object properties validation", "doesn't invalidate other properties", WHY_ADDL},
    {NULL, "additionalProperties with schema", "an additional valid property is valid", WHY_ADDL},
    {NULL, "additionalProperties are allowed by default", NULL, WHY_ADDL},
    {NULL, "anyOf complex types", "both anyOf valid (complex)", WHY_ADDL},
    {NULL, "forbidden property", "property absent", WHY_ADDL},
    {"minimum.json", "minimum validation", "boundary point is valid", WHY_FRAC},
    {"exclusiveMinimum.json", "exclusiveMinimum validation", "above the exclusiveMinimum is valid",
     WHY_FRAC},
    {"exclusiveMaximum.json", "exclusiveMaximum validation", "below the exclusiveMaximum is valid",
     WHY_FRAC},
    {NULL, "root pointer ref", NULL, WHY_TYPE},
    {"format.json", "*", "invalid *",
     "the formats with a pattern (formats.h) are enforced, as assertions, not annotations"},
    {"contains.json", "contains keyword validation", "array with*", WHY_CONTAINS},
    {"contains.json", "contains keyword validation", "not array is valid", WHY_TYPE},
    {"contains.json", "contains keyword with const keyword", NULL, WHY_CONTAINS},
    {"minContains.json", "minContains=*", "some elements match*", WHY_CONTAINS},
    {"maxContains.json", "maxContains with contains", "some elements match*", WHY_CONTAINS},
    {"uniqueItems.json", "uniqueItems*", NULL, WHY_UNIQUE},
    {"dependentSchemas.json", "single dependency", "no dependency", WHY_DEP},
    {"dependentSchemas.json", "boolean subschemas", NULL, WHY_DEP},
    {"dependentSchemas.json", "dependent subschema incompatible with root", NULL, WHY_DEP},
    {"dependentRequired.json", "single dependency", "with dependency", WHY_DEPREQ},
    {"dependentRequired.json", "multiple dependents required", "with dependencies", WHY_DEPREQ},
    {"dependentRequired.json", "dependencies with escaped characters", "CRLF", WHY_DEPREQ},
    {"dependentRequired.json", "dependencies with escaped characters", "quoted quotes",
     WHY_DEPREQ},
    {"dependencies.json", "dependencies", "with dependency", WHY_DEPREQ},
    {"dependencies.json", "multiple dependencies", "with dependencies", WHY_DEPREQ},
    {NULL, "*", "non-object is valid", WHY_TYPE},
    {"dependencies.json", "dependencies with boolean subschemas", NULL, WHY_DEP},
    {"dependencies.json", "dependent subschema incompatible with root", NULL, WHY_DEP},
    {"dependencies.json", "multiple dependencies subschema", NULL, WHY_DEP},
    {"if-then-else.json", "non-interference across combined schemas", NULL, WHY_IF},
    {"additionalProperties.json",
     "additionalProperties being false does not allow other properties",
     "patternProperties are not additional properties", WHY_ADDL},
    {"additionalProperties.json", "non-ASCII pattern with additionalProperties", NULL, WHY_ADDL},
    {"properties.json", "properties, patternProperties, additionalProperties interaction", NULL,
     WHY_ADDL},
    {"patternProperties.json", "multiple simultaneous patternProperties are validated", NULL,
     WHY_PATTERN},
    {"patternProperties.json", "regexes are not anchored by default and are case sensitive", NULL,
     WHY_PATTERN},
    {"patternProperties.json", "patternProperties with boolean schemas", NULL, WHY_PATTERN},
    {"multipleOf.json", "by small number", "0.0075 is multiple of 0.0001", WHY_MULT},
    {"multipleOf.json", "by number", "4.5 is multiple of 1.5", WHY_MULT_DYADIC},
    {"multipleOf.json", "by number", "-4.5 is multiple of 1.5", WHY_MULT_DYADIC},
    {"oneOf.json", "oneOf", "second oneOf valid", WHY_ONEOF},
    {"vocabulary.json", "schema that uses custom metaschema with with no validation vocabulary",
     NULL, "metaschemas are not fetched: the validation keywords always apply"},
};

/* Bugs the driver found that later commits fix: reported, not failed, so
 * the driver could land first. Emptied as they are fixed. */
static const narrowing g_known_bugs[] = {
    /* none open: the ones it found first (oneOf generated as anyOf,
     * additionalProperties ignored, -2.0 written as a real) are fixed */
    {NULL, "", NULL, NULL},
};

/* Exact, or a prefix where the pattern ends with '*'. */
static bool matches(const char *pattern, const char *s)
{
    size_t n = strlen(pattern);
    if (n > 0 && pattern[n - 1] == '*')
        return strncmp(pattern, s, n - 1) == 0;
    return strcmp(pattern, s) == 0;
}

static const narrowing *listed(const narrowing *table, size_t n, const char *file,
                               const char *group, const char *test)
{
    for (size_t i = 0; i < n; i++) {
        const narrowing *w = &table[i];
        const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
        if ((!w->file || strcmp(w->file, base) == 0) && matches(w->group, group) &&
            (!w->test || (test && matches(w->test, test))))
            return w;
    }
    return NULL;
}

static const narrowing *narrowed(const char *file, const char *group, const char *test)
{
    return listed(g_narrowings, sizeof g_narrowings / sizeof g_narrowings[0], file, group, test);
}

static const narrowing *known_bug(const char *file, const char *group, const char *test)
{
    return listed(g_known_bugs, sizeof g_known_bugs / sizeof g_known_bugs[0], file, group, test);
}

/* ---- serializations ---------------------------------------------------------- */

/* Serializations tried per value: a cap on the product of key orders and
 * nested choices. */
#define SER_CAP 256

typedef struct strlist {
    char **s;
    size_t n, cap;
} strlist;

static void sl_free(strlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->s[i]);
    free(l->s);
    memset(l, 0, sizeof *l);
}

static void sl_add(strlist *l, char *s)
{
    if (l->n >= SER_CAP) {
        free(s);
        return;
    }
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 8;
        l->s = realloc(l->s, l->cap * sizeof *l->s);
        assert_non_null(l->s);
    }
    l->s[l->n++] = s;
}

static char *cat3(const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *r = malloc(la + lb + lc + 1);
    assert_non_null(r);
    memcpy(r, a, la);
    memcpy(r + la, b, lb);
    memcpy(r + la + lb, c, lc + 1);
    return r;
}

/* A string as the generator writes it. */
static char *ser_string(const char *s, size_t n)
{
    char *r = malloc(n * 6 + 3), *p = r;
    assert_non_null(r);
    *p++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default: break;
        }
        if (esc) {
            p += sprintf(p, "%s", esc);
        } else if (c < 0x20) {
            p += sprintf(p, "\\u%04x", c);
        } else {
            *p++ = (char)c;
        }
    }
    *p++ = '"';
    *p = '\0';
    return r;
}

/* A double in plain decimal (the shortest digits that read back the same,
 * never an exponent). */
static char *ser_real(double d)
{
    char e[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, d);
        if (strtod(e, NULL) == d)
            break;
    }
    /* e = [-]D.DDDDe[+-]XX */
    const char *p = e;
    bool neg = *p == '-';
    if (neg)
        p++;
    char digits[32];
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    /* value = 0.digits * 10^(exp10 + 1) */
    int point = exp10 + 1;
    size_t cap = nd + (size_t)abs(point) + 8;
    char *r = malloc(cap), *o = r;
    assert_non_null(r);
    if (neg)
        *o++ = '-';
    if (point <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -point; i++)
            *o++ = '0';
        memcpy(o, digits, nd);
        o += nd;
    } else {
        for (int i = 0; i < point; i++)
            *o++ = (size_t)i < nd ? digits[i] : '0';
        if ((size_t)point < nd) {
            *o++ = '.';
            memcpy(o, digits + point, nd - (size_t)point);
            o += nd - (size_t)point;
        } else {
            *o++ = '.';
            *o++ = '0';
        }
    }
    *o = '\0';
    return r;
}

static void ser(const json_t *v, strlist *out);

/* out += every a + b for a in prefix, b in tail (capped). */
static void cross(const strlist *prefix, const strlist *tail, const char *sep, strlist *out)
{
    for (size_t i = 0; i < prefix->n; i++)
        for (size_t j = 0; j < tail->n && out->n < SER_CAP; j++)
            sl_add(out, cat3(prefix->s[i], sep, tail->s[j]));
}

static bool next_perm(size_t *a, size_t n)
{
    if (n < 2)
        return false;
    size_t i = n - 1;
    while (i > 0 && a[i - 1] >= a[i])
        i--;
    if (i == 0)
        return false;
    size_t j = n - 1;
    while (a[j] <= a[i - 1])
        j--;
    size_t t = a[i - 1];
    a[i - 1] = a[j];
    a[j] = t;
    for (size_t l = i, r = n - 1; l < r; l++, r--) {
        t = a[l];
        a[l] = a[r];
        a[r] = t;
    }
    return true;
}

static void ser(const json_t *v, strlist *out)
{
    switch (json_typeof(v)) {
    case JSON_NULL: sl_add(out, strdup("null")); return;
    case JSON_TRUE: sl_add(out, strdup("true")); return;
    case JSON_FALSE: sl_add(out, strdup("false")); return;
    case JSON_INTEGER: {
        char b[32];
        snprintf(b, sizeof b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        sl_add(out, strdup(b));
        return;
    }
    case JSON_REAL: {
        double d = json_real_value(v);
        char *r = ser_real(d);
        size_t l = strlen(r);
        if (l > 2 && strcmp(r + l - 2, ".0") == 0) {
            /* 1.0: also as the integer 1 */
            char *i = strdup(r);
            i[l - 2] = '\0';
            sl_add(out, i);
        }
        sl_add(out, r);
        return;
    }
    case JSON_STRING: sl_add(out, ser_string(json_string_value(v), json_string_length(v))); return;
    case JSON_ARRAY: {
        strlist acc = {0};
        sl_add(&acc, strdup(""));
        for (size_t i = 0; i < json_array_size(v); i++) {
            strlist item = {0}, next = {0};
            ser(json_array_get(v, i), &item);
            cross(&acc, &item, i ? "," : "", &next);
            sl_free(&item);
            sl_free(&acc);
            acc = next;
        }
        for (size_t i = 0; i < acc.n; i++)
            sl_add(out, cat3("[", acc.s[i], "]"));
        sl_free(&acc);
        return;
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(v), k = 0;
        const char **keys = calloc(n ? n : 1, sizeof *keys);
        size_t *order = calloc(n ? n : 1, sizeof *order);
        strlist *kv = calloc(n ? n : 1, sizeof *kv); /* "key":value per key */
        const char *key;
        const json_t *x;
        assert_true(keys && order && kv);
        json_object_foreach((json_t *)v, key, x) {
            keys[k] = key;
            strlist val = {0}, kl = {0};
            ser(x, &val);
            sl_add(&kl, ser_string(key, strlen(key)));
            cross(&kl, &val, ":", &kv[k]);
            sl_free(&val);
            sl_free(&kl);
            order[k] = k;
            k++;
        }
        size_t perms = 0;
        do {
            strlist acc = {0};
            sl_add(&acc, strdup(""));
            for (size_t i = 0; i < n; i++) {
                strlist next = {0};
                cross(&acc, &kv[order[i]], i ? "," : "", &next);
                sl_free(&acc);
                acc = next;
            }
            for (size_t i = 0; i < acc.n; i++)
                sl_add(out, cat3("{", acc.s[i], "}"));
            sl_free(&acc);
        } while (++perms < 120 && out->n < SER_CAP && next_perm(order, n));
        for (size_t i = 0; i < n; i++)
            sl_free(&kv[i]);
        free(kv);
        free(keys);
        free(order);
        return;
    }
    }
}

/* ---- driving the automaton ------------------------------------------------------ */

typedef struct counts {
    int groups, compiled, tests;
    int valid, accepted, narrowed;
    int invalid, rejected;
    int failures;
    int val_judged, val_agree;
    int known;
    /* why groups were refused: distinct messages (the first group refused
     * with each), with how many */
    char reason_group[8][64], reason[8][320];
    int reason_count[8], n_reasons;
} counts;

static void note_refusal(counts *k, const char *gdesc, const char *message)
{
    for (int i = 0; i < k->n_reasons; i++)
        if (strcmp(k->reason[i], message) == 0) {
            k->reason_count[i]++;
            return;
        }
    if (k->n_reasons < 8) {
        snprintf(k->reason_group[k->n_reasons], sizeof k->reason_group[0], "%s", gdesc);
        snprintf(k->reason[k->n_reasons], sizeof k->reason[0], "%s", message);
        k->reason_count[k->n_reasons++] = 1;
    }
}

/* A failure, or a known bug (g_known_bugs) reported as such. */
static void report(counts *k, const char *file, const char *group, const char *test,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void report(counts *k, const char *file, const char *group, const char *test,
                   const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    bool known = known_bug(file, group, test) != NULL;
    print_message("%s %s / %s%s%s: %s\n", known ? "KNOWN" : "FAIL", file, group,
                  test ? " / " : "", test ? test : "", what);
    if (known)
        k->known++;
    else
        k->failures++;
}

static eng_cs_vocab *g_vocab; /* the 256 single bytes and one end token (256) */

static void make_vocab(void) { g_vocab = tu_byte_vocab(); }

/* Feeds text byte by byte; true when the whole text is a complete value.
 * *stuck is set when an accepted prefix has no completion. */
static bool feed_text(const eng_grammar *g, const char *text, bool *stuck)
{
    eng_constraint *c = NULL;
    sw_error err;
    assert_int_equal(eng_constraint_create(g, g_vocab, &c, &err), SW_OK);
    bool ok = true;
    for (size_t i = 0; text[i]; i++) {
        if (!eng_constraint_feed(c, &text[i], 1)) {
            ok = false;
            break;
        }
        if (eng_constraint_min_bytes(c) >= ((int64_t)1 << 39))
            *stuck = true;
    }
    ok = ok && eng_constraint_is_complete(c);
    eng_constraint_free(c);
    return ok;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

/* The random outputs of the current group, and every (schema, outputs)
 * record for the independent check (python3-jsonschema, when installed). */
static json_t *g_walks;
static json_t *g_records;

static uint64_t rng_next(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* A random output of the automaton (uniform among the allowed bytes, a
 * budget of 120 bytes): it must parse and eng_json_validate must accept
 * it wherever it judges. Returns false (and prints) when it does not. */
static bool random_walk_ok(const eng_grammar *g, const json_t *schema, char *why, size_t cap)
{
    eng_constraint *c = NULL;
    sw_error err;
    uint32_t mask[(257 + 31) / 32];
    char out[512];
    size_t n = 0;
    assert_int_equal(eng_constraint_create(g, g_vocab, &c, &err), SW_OK);
    int64_t budget = 120;
    if (eng_grammar_min_bytes(g) + 20 > budget)
        budget = eng_grammar_min_bytes(g) + 20;
    if (budget > (int64_t)sizeof out - 1) {
        eng_constraint_free(c);
        return true; /* too long to walk here */
    }
    for (;;) {
        int32_t allowed = eng_constraint_mask(c, budget - (int64_t)n, mask);
        if (allowed == 0) {
            snprintf(why, cap, "the random walk got stuck after \"%.*s\"", (int)n, out);
            eng_constraint_free(c);
            return false;
        }
        int32_t pick = (int32_t)(rng_next() % (uint64_t)allowed), tok = -1;
        for (int32_t id = 0; id < 257; id++)
            if (mask[id >> 5] >> (id & 31) & 1u) {
                if (pick-- == 0) {
                    tok = id;
                    break;
                }
            }
        if (tok == 256)
            break;
        assert_true(eng_constraint_accept_token(c, tok));
        out[n++] = (char)tok;
    }
    eng_constraint_free(c);
    out[n] = '\0';
    if (g_walks)
        json_array_append_new(g_walks, json_stringn(out, n));
    json_error_t jerr;
    json_t *v = json_loadb(out, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (!v) {
        snprintf(why, cap, "the random output \"%s\" does not parse", out);
        return false;
    }
    int rc = eng_json_validate(schema, v, &err);
    json_decref(v);
    if (rc == SW_EINVAL) {
        snprintf(why, cap, "the random output \"%.200s\" fails eng_json_validate: %.200s", out,
                 err.message);
        return false;
    }
    return true;
}

static void run_group(const char *file, const json_t *group, bool draft7, counts *k)
{
    const char *gdesc = json_string_value(json_object_get(group, "description"));
    json_t *schema = json_deep_copy(json_object_get(group, "schema"));
    const json_t *tests = json_object_get(group, "tests");
    assert_non_null(schema);
    if (draft7 && json_is_object(schema) && !json_object_get(schema, "$schema"))
        json_object_set_new(schema, "$schema",
                            json_string("http://json-schema.org/draft-07/schema#"));
    k->groups++;
    eng_grammar *g = NULL;
    sw_error err;
    sw_error_clear(&err);
    int rc = eng_grammar_from_schema(schema, &g, &err);
    if (rc != SW_OK && rc != SW_EUNSUPPORTED && rc != SW_EINVAL) {
        report(k, file, gdesc, NULL, "compiling gave %d (%s)", rc, err.message);
    }
    if (getenv("SUITE_VERBOSE") && rc != SW_OK)
        print_message("  refused %s / %s: %s\n", file, gdesc, err.message);
    if (rc != SW_OK)
        note_refusal(k, gdesc, err.message);
    if (rc == SW_OK)
        k->compiled++;
    for (size_t t = 0; t < json_array_size(tests); t++) {
        const json_t *test = json_array_get(tests, t);
        const char *tdesc = json_string_value(json_object_get(test, "description"));
        const json_t *data = json_object_get(test, "data");
        bool valid = json_is_true(json_object_get(test, "valid"));
        /* the validator, wherever it judges */
        sw_error verr;
        int vrc = eng_json_validate(schema, data, &verr);
        if (vrc == SW_OK || vrc == SW_EINVAL) {
            k->val_judged++;
            if ((vrc == SW_OK) == valid) {
                k->val_agree++;
            } else if (valid && narrowed(file, gdesc, tdesc)) {
                k->val_agree++; /* stricter, as documented */
            } else {
                report(k, file, gdesc, tdesc, "eng_json_validate says %s (%s)",
                       vrc == SW_OK ? "valid" : "invalid", verr.message);
            }
        }
        k->tests++;
        if (rc != SW_OK)
            continue;
        if (valid)
            k->valid++;
        else
            k->invalid++;
        strlist texts = {0};
        ser(data, &texts);
        bool any = false, stuck = false;
        const char *accepted_text = NULL;
        for (size_t i = 0; i < texts.n; i++)
            if (feed_text(g, texts.s[i], &stuck)) {
                any = true;
                accepted_text = texts.s[i];
                if (valid)
                    break;
            }
        if (stuck) {
            report(k, file, gdesc, tdesc, "an accepted prefix has no completion");
        }
        if (valid && any) {
            k->accepted++;
        } else if (valid) {
            const narrowing *nw = narrowed(file, gdesc, tdesc);
            if (nw) {
                k->narrowed++;
            } else {
                report(k, file, gdesc, tdesc, "the valid instance %s is refused",
                       texts.n ? texts.s[0] : "?");
            }
        } else if (any) {
            report(k, file, gdesc, tdesc, "the invalid instance %s is accepted", accepted_text);
        } else {
            k->rejected++;
        }
        sl_free(&texts);
    }
    if (rc == SW_OK) {
        char why[1024];
        /* the group's own tests go along: the checker trusts a validator on
         * this schema only where it agrees with them */
        json_t *rec = sc_record(file, gdesc, schema);
        json_object_set(rec, "tests", (json_t *)tests);
        g_walks = sc_outputs(rec);
        for (int i = 0; i < 16; i++)
            if (!random_walk_ok(g, schema, why, sizeof why)) {
                report(k, file, gdesc, NULL, "%s", why);
                break;
            }
        if (g_records)
            json_array_append_new(g_records, rec);
        else
            json_decref(rec);
        g_walks = NULL;
    }
    eng_grammar_free(g);
    json_decref(schema);
}

static void run_draft(const char *draft, int *failures)
{
    json_t *files = sc_suite_load(draft);
    if (!files)
        return;
    counts total = {0};
    char none[2048] = ""; /* the files that compile no group */
    print_message("%s: per file: groups compiled/all; tests; in the compiled groups: valid "
                  "accepted (+narrowed)/valid, invalid rejected/invalid; validator "
                  "agrees/judged (all groups); failures\n",
                  draft);
    size_t i;
    json_t *entry;
    json_array_foreach (files, i, entry) {
        const char *name = json_string_value(json_object_get(entry, "name"));
        const json_t *groups = json_object_get(entry, "groups");
        counts k = {0};
        char file[300];
        snprintf(file, sizeof file, "%s/%s", draft, name);
        for (size_t gi = 0; gi < json_array_size(groups); gi++) {
            run_group(file, json_array_get(groups, gi), strcmp(draft, "draft7") == 0, &k);
        }
        /* the invalid instances of the compiled groups only */
        print_message("  %-28s %3d/%-3d %4d  %3d(+%d)/%-3d  %3d/%-3d  %3d/%-3d  %d\n", name,
                      k.compiled, k.groups, k.tests, k.accepted, k.narrowed, k.valid, k.rejected,
                      k.invalid, k.val_agree, k.val_judged, k.failures);
        total.groups += k.groups;
        total.compiled += k.compiled;
        total.tests += k.tests;
        total.valid += k.valid;
        total.accepted += k.accepted;
        total.narrowed += k.narrowed;
        total.invalid += k.invalid;
        total.rejected += k.rejected;
        total.val_agree += k.val_agree;
        total.val_judged += k.val_judged;
        total.failures += k.failures;
        total.known += k.known;
        if (k.compiled == 0 && k.groups > 0) {
            /* a file none of whose groups compiles: why, every time */
            for (int r = 0; r < k.n_reasons; r++)
                print_message("      refused (%d group%s, e.g. \"%s\"): %s\n", k.reason_count[r],
                              k.reason_count[r] == 1 ? "" : "s", k.reason_group[r], k.reason[r]);
            snprintf(none + strlen(none), sizeof none - strlen(none), "%s%s",
                     none[0] ? ", " : "", name);
        }
    }
    json_decref(files);
    print_message("  %-28s %3d/%-3d %4d  %3d(+%d)/%-3d  %3d/%-3d  %3d/%-3d  %d\n", "TOTAL",
                  total.compiled, total.groups, total.tests, total.accepted, total.narrowed,
                  total.valid, total.rejected, total.invalid, total.val_agree, total.val_judged,
                  total.failures);
    print_message("  files that compile no group: %s\n", none[0] ? none : "none");
    if (total.known)
        print_message("  (%d known bugs, listed as KNOWN above, not counted as failures)\n",
                      total.known);
    *failures += total.failures;
}

/* ---- fixtures: what zod 4 and pydantic 2 emit ------------------------------
 * tests/data/schemas (schema_check.h): typical models, as those libraries
 * write them (z.toJSONSchema, model_json_schema). Each that compiles has
 * its random outputs go through eng_json_validate and the independent
 * check; the ones refused today are listed, with the reason, in
 * test_json_schema_generate. */
static void run_fixtures(int *failures)
{
    json_t *fixtures = sc_fixtures_load();
    if (!fixtures)
        return;
    print_message("fixtures (tests/data/schemas):\n");
    for (size_t i = 0; i < json_array_size(fixtures); i++) {
        const json_t *f = json_array_get(fixtures, i);
        const char *name = json_string_value(json_object_get(f, "file"));
        json_t *schema = json_object_get(f, "schema");
        eng_grammar *g = NULL;
        sw_error err;
        int rc = eng_grammar_from_schema(schema, &g, &err);
        if (rc != SW_OK) {
            print_message("  %-28s refused: %s\n", name, err.message);
            if (rc != SW_EUNSUPPORTED)
                (*failures)++;
            continue;
        }
        char why[1024];
        int ok = 0;
        json_t *rec = sc_record("fixtures", name, schema);
        g_walks = sc_outputs(rec);
        for (int w = 0; w < 32; w++) {
            if (!random_walk_ok(g, schema, why, sizeof why)) {
                print_message("FAIL fixture %s: %s\n", name, why);
                (*failures)++;
                break;
            }
            ok++;
        }
        print_message("  %-28s %d outputs\n", name, ok);
        json_array_append_new(g_records, rec);
        g_walks = NULL;
        eng_grammar_free(g);
    }
    json_decref(fixtures);
}

static void test_suite(void **state)
{
    (void)state;
    int failures = 0;
    if (!tu_shared_path("jsonschema-test-suite/tests"))
        return;
    make_vocab();
    g_records = json_array();
    run_draft("draft2020-12", &failures);
    run_draft("draft7", &failures);
    run_fixtures(&failures);
    eng_cs_vocab_free(g_vocab);
    g_vocab = NULL;
    if (sc_check(g_records, "suite-walks") > 0)
        failures++;
    json_decref(g_records);
    g_records = NULL;
    if (failures)
        fail_msg("%d failures (listed above)", failures);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_suite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
