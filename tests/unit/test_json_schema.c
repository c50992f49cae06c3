/* test_json_schema.c - the JSON-schema compiler and the constrained decoder.
 *
 * Outputs are checked by a validator written here, independent of the
 * compiler: it walks the parsed JSON (jansson) against the schema. Parts:
 *   - the byte automaton accepts and refuses hand-picked texts;
 *   - masks over a small hand-made vocabulary, end tokens, budget forcing;
 *   - unsupported and malformed schemas give clear errors;
 *   - random walks over real vocabularies (uniform among allowed tokens,
 *     tight budgets) always end in a value that parses and validates; the
 *     mask time per token on the qwen2 vocabulary is printed (not asserted);
 *   - the acceptance runs: 100 seeded generations at temperature 1 per
 *     case (forced tool calls with one and several tools, nested / array /
 *     enum / integer / boolean schemas, json_object) on an SPM model
 *     (llama-2-tiny-random, byte fallback) and a BPE model (a `model make`
 *     model given the GPT-2 vocabulary), all parse and validate.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "grammar/constrain.h"
#include "engine/generate.h"
#include "gguf/gguf.h"
#include "grammar/json_schema.h"
#include "engine/model.h"
#include "modelgen/model_make.h"
#include "engine/sampler.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seeded generations per case and model: the acceptance figure. Under the
 * sanitizers (10x slower) a sample of them, so `make test` stays quick. */
#ifdef __SANITIZE_ADDRESS__
#define MODEL_RUNS 6
#define WALK_RUNS 5
#else
#define MODEL_RUNS 100
#define WALK_RUNS 40
#endif

/* ---- an independent validator -------------------------------------------- */

static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static bool type_ok(const json_t *v, const char *t)
{
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    return false;
}

static bool validate(const json_t *v, const json_t *s, char *why, size_t cap);

static bool fail_why(char *why, size_t cap, const char *msg)
{
    snprintf(why, cap, "%s", msg);
    return false;
}

static bool validate(const json_t *v, const json_t *s, char *why, size_t cap)
{
    if (json_is_true(s))
        return true;
    const json_t *any = json_object_get(s, "anyOf");
    if (any) {
        for (size_t i = 0; i < json_array_size(any); i++)
            if (validate(v, json_array_get(any, i), why, cap))
                return true;
        return fail_why(why, cap, "no anyOf alternative matches");
    }
    const json_t *one = json_object_get(s, "oneOf");
    if (one) {
        int hits = 0;
        for (size_t i = 0; i < json_array_size(one); i++)
            hits += validate(v, json_array_get(one, i), why, cap);
        return hits == 1 ? true : fail_why(why, cap, "oneOf: not exactly one match");
    }
    const json_t *type = json_object_get(s, "type");
    if (json_is_string(type) && !type_ok(v, json_string_value(type)))
        return fail_why(why, cap, "wrong type");
    if (json_is_array(type)) {
        bool ok = false;
        for (size_t i = 0; i < json_array_size(type); i++)
            ok |= type_ok(v, json_string_value(json_array_get(type, i)));
        if (!ok)
            return fail_why(why, cap, "wrong type (list)");
    }
    const json_t *e = json_object_get(s, "enum");
    if (e) {
        bool ok = false;
        for (size_t i = 0; i < json_array_size(e); i++)
            ok |= json_equal(v, json_array_get(e, i));
        if (!ok)
            return fail_why(why, cap, "not in enum");
    }
    const json_t *c = json_object_get(s, "const");
    if (c && !json_equal(v, c))
        return fail_why(why, cap, "not the const");
    if (json_is_string(v)) {
        size_t n = utf8_chars(json_string_value(v), json_string_length(v));
        const json_t *lo = json_object_get(s, "minLength"), *hi = json_object_get(s, "maxLength");
        if (lo && n < (size_t)json_integer_value(lo))
            return fail_why(why, cap, "string too short");
        if (hi && n > (size_t)json_integer_value(hi))
            return fail_why(why, cap, "string too long");
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties");
        const json_t *req = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i))))
                return fail_why(why, cap, "required property missing");
        const char *k;
        json_t *pv;
        json_object_foreach((json_t *)v, k, pv) {
            const json_t *ps = json_object_get(props, k);
            if (!ps) {
                if (json_is_false(json_object_get(s, "additionalProperties")))
                    return fail_why(why, cap, "additional property");
                continue;
            }
            if (!validate(pv, ps, why, cap))
                return false;
        }
    }
    if (json_is_array(v)) {
        const json_t *items = json_object_get(s, "items");
        const json_t *lo = json_object_get(s, "minItems"), *hi = json_object_get(s, "maxItems");
        if (lo && json_array_size(v) < (size_t)json_integer_value(lo))
            return fail_why(why, cap, "too few items");
        if (hi && json_array_size(v) > (size_t)json_integer_value(hi))
            return fail_why(why, cap, "too many items");
        for (size_t i = 0; items && i < json_array_size(v); i++)
            if (!validate(json_array_get(v, i), items, why, cap))
                return false;
    }
    return true;
}

/* Parses text (exactly, nothing after the value) and validates it. */
static void expect_valid(const char *text, size_t len, const json_t *schema, const char *what)
{
    json_error_t je;
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v)
        fail_msg("%s: output does not parse (%s): %.*s", what, je.text, (int)len, text);
    char why[128] = "";
    if (!validate(v, schema, why, sizeof why))
        fail_msg("%s: output does not validate (%s): %.*s", what, why, (int)len, text);
    json_decref(v);
}

/* A tool call {"name":..,"arguments":{..}} against tool schemas. */
static void expect_valid_call(const char *text, size_t len, json_t *const *params,
                              const char *const *names, size_t n, const char *what)
{
    json_error_t je;
    json_t *v = json_loadb(text, len, 0, &je);
    if (!v)
        fail_msg("%s: tool call does not parse (%s): %.*s", what, je.text, (int)len, text);
    assert_int_equal(json_object_size(v), 2);
    const char *name = json_string_value(json_object_get(v, "name"));
    json_t *args = json_object_get(v, "arguments");
    assert_non_null(name);
    assert_true(json_is_object(args));
    size_t k = 0;
    while (k < n && strcmp(names[k], name) != 0)
        k++;
    if (k == n)
        fail_msg("%s: unknown tool name '%s'", what, name);
    char why[128] = "";
    json_t *empty = json_pack("{s:s, s:{}, s:b}", "type", "object", "properties",
                              "additionalProperties", 0);
    if (!validate(args, params[k] ? params[k] : empty, why, sizeof why))
        fail_msg("%s: arguments do not validate (%s): %.*s", what, why, (int)len, text);
    json_decref(empty);
    json_decref(v);
}

static json_t *parse(const char *text)
{
    json_error_t je;
    /* as a request body is read: numbers past 64 bits kept (json_big.h) */
    json_t *v = sw_json_loadb_big(text, strlen(text), JSON_DECODE_ANY, &je);
    if (!v)
        fail_msg("bad test JSON: %s: %s", je.text, text);
    return v;
}

static eng_grammar *compile_ok(const char *schema_text)
{
    json_t *s = parse(schema_text);
    eng_grammar *g = NULL;
    sw_error err;
    if (eng_grammar_from_schema(s, &g, &err))
        fail_msg("compile %s: %s", schema_text, err.message);
    json_decref(s);
    return g;
}

/* ---- byte-level ----------------------------------------------------------- */

static eng_cs_vocab *byte_vocab(void) { return tu_byte_vocab(); }

/* Whether text is accepted as a whole value. */
static bool accepts(const eng_grammar *g, const eng_cs_vocab *v, const char *text, bool *complete)
{
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    bool ok = eng_constraint_feed(c, text, strlen(text));
    *complete = ok && eng_constraint_is_complete(c);
    eng_constraint_free(c);
    return ok;
}

static void expect_whole(const eng_grammar *g, const eng_cs_vocab *v, const char *text)
{
    bool complete;
    if (!accepts(g, v, text, &complete) || !complete)
        fail_msg("expected '%s' to be accepted as a whole value", text);
}

static void expect_prefix_only(const eng_grammar *g, const eng_cs_vocab *v, const char *text)
{
    bool complete;
    if (!accepts(g, v, text, &complete) || complete)
        fail_msg("expected '%s' to be an incomplete prefix", text);
}

static void expect_refused(const eng_grammar *g, const eng_cs_vocab *v, const char *text)
{
    bool complete;
    if (accepts(g, v, text, &complete))
        fail_msg("expected '%s' to be refused", text);
}

static void test_bytes_object(void **state)
{
    (void)state;
    eng_cs_vocab *v = byte_vocab();
    eng_grammar *g = compile_ok(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
        "\"b\":{\"type\":\"string\",\"maxLength\":3},\"c\":{\"type\":\"boolean\"}},"
        "\"required\":[\"b\"]}");
    expect_whole(g, v, "{\"b\":\"\"}");
    expect_whole(g, v, "{\"a\":-12,\"b\":\"xyz\",\"c\":true}");
    expect_whole(g, v, "{\"b\":\"\\n\\\"\xc3\xa9\"}");
    expect_whole(g, v, "{\"a\":0,\"b\":\"x\"}");
    expect_prefix_only(g, v, "{\"a\":1");
    expect_prefix_only(g, v, "{\"b\":\"ab");
    expect_refused(g, v, "{}");                      /* b is required */
    expect_refused(g, v, "{\"b\":\"abcd\"}");        /* maxLength */
    expect_refused(g, v, "{\"c\":true,\"b\":\"\"}");  /* declared order */
    expect_refused(g, v, "{ \"b\":\"\"}");           /* compact: no whitespace */
    expect_refused(g, v, "{\"a\":01");               /* leading zero */
    expect_refused(g, v, "{\"a\":1.5");              /* integer */
    expect_refused(g, v, "{\"b\":\"\\u0041\"}");     /* no \u escapes */
    expect_refused(g, v, "{\"b\":\"\xc3\x28\"}");    /* invalid UTF-8 */
    expect_refused(g, v, "{\"b\":\"\xed\xa0\x80\"}"); /* a surrogate */
    expect_refused(g, v, "{\"b\":\"\x01\"}");        /* control byte */
    expect_refused(g, v, "{\"b\":\"\"}x");           /* nothing after the value */
    eng_grammar_free(g);

    g = compile_ok("{\"type\":\"array\",\"items\":{\"enum\":[1,12,\"x\",null,{\"k\":[true]}]},"
                   "\"minItems\":1,\"maxItems\":3}");
    expect_whole(g, v, "[1]");
    expect_whole(g, v, "[12,1,\"x\"]");
    expect_whole(g, v, "[null,{\"k\":[true]}]");
    expect_refused(g, v, "[]");
    expect_refused(g, v, "[1,1,1,1]");
    expect_refused(g, v, "[2]");
    expect_refused(g, v, "[123]");
    eng_grammar_free(g);

    g = compile_ok("{\"type\":\"number\"}");
    expect_whole(g, v, "-0.25");
    expect_whole(g, v, "7");
    expect_prefix_only(g, v, "-");
    expect_prefix_only(g, v, "3.");
    expect_refused(g, v, "1e5");
    eng_grammar_free(g);

    /* anyOf with a shared prefix: both stay possible until they differ. */
    g = compile_ok("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"},"
                   "\"x\":{\"type\":\"integer\"}},\"required\":[\"k\",\"x\"]},"
                   "{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"b\"},"
                   "\"y\":{\"type\":\"boolean\"}},\"required\":[\"k\",\"y\"]}]}");
    expect_whole(g, v, "{\"k\":\"a\",\"x\":5}");
    expect_whole(g, v, "{\"k\":\"b\",\"y\":false}");
    expect_refused(g, v, "{\"k\":\"a\",\"y\":false}");
    eng_grammar_free(g);

    assert_int_equal(eng_grammar_json_object(&g, NULL), SW_OK);
    expect_whole(g, v, "{}");
    expect_whole(g, v, "{\"a\":[1,{\"b\":null}],\"\":\"\\t\"}");
    expect_refused(g, v, "[]");
    expect_refused(g, v, "\"x\"");
    eng_grammar_free(g);
    eng_cs_vocab_free(v);
}

/* ---- masks on a hand-made vocabulary --------------------------------------- */

static const char *const hand_pieces[] = {
    "{", "}", "\"", "\":", "\"name\":", "a", "ab", "abc", "\"}", ",", "1", "12", "-",
    "true", "tr", "ue", "false", " ", "\"x", "\xc3", "\xa9", "\xc3\xa9", "<end>", "[", "]",
};
#define N_HAND ((int32_t)(sizeof hand_pieces / sizeof hand_pieces[0]))
#define HAND_END 22

static eng_cs_vocab *hand_vocab(void)
{
    size_t lens[N_HAND];
    for (int32_t i = 0; i < N_HAND; i++)
        lens[i] = strlen(hand_pieces[i]);
    int32_t end = HAND_END;
    eng_cs_vocab *v = NULL;
    assert_int_equal(eng_cs_vocab_create_from_pieces(hand_pieces, lens, N_HAND, &end, 1, &v, NULL),
                     SW_OK);
    return v;
}

static bool bit(const uint32_t *mask, int32_t id)
{
    return (mask[id >> 5] >> (id & 31)) & 1u;
}

/* Ids allowed, as a string of piece indices, for messages. */
static void expect_mask(eng_constraint *c, int64_t budget, const int32_t *want, int32_t n_want)
{
    uint32_t mask[(N_HAND + 31) / 32];
    int32_t count = eng_constraint_mask(c, budget, mask);
    char got[256] = "";
    for (int32_t i = 0; i < N_HAND; i++)
        if (bit(mask, i))
            snprintf(got + strlen(got), sizeof got - strlen(got), "'%s' ", hand_pieces[i]);
    bool ok = count == n_want;
    for (int32_t i = 0; ok && i < n_want; i++)
        ok = bit(mask, want[i]);
    if (!ok)
        fail_msg("mask (budget %lld) allows %s", (long long)budget, got);
}

static int32_t piece(const char *p)
{
    for (int32_t i = 0; i < N_HAND; i++)
        if (!strcmp(hand_pieces[i], p))
            return i;
    fail_msg("no piece %s", p);
    return -1;
}

static void test_masks(void **state)
{
    (void)state;
    eng_cs_vocab *v = hand_vocab();
    eng_grammar *g = compile_ok("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
                                "\"maxLength\":4}},\"required\":[\"name\"]}");
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    assert_int_equal(eng_grammar_min_bytes(g), 11); /* {"name":""} */
    int32_t start[] = {piece("{")};
    expect_mask(c, 100, start, 1);
    assert_true(eng_constraint_accept_token(c, piece("{")));
    /* '"' alone and the whole key; not "x (no such key), not '}' */
    int32_t key[] = {piece("\""), piece("\"name\":")};
    expect_mask(c, 100, key, 2);
    assert_true(eng_constraint_accept_token(c, piece("\"name\":")));
    int32_t open[] = {piece("\""), piece("\"x"), piece("\"}"), piece("\":")};
    /* '"}' is an empty string and the end; '":' opens a string holding ':' */
    expect_mask(c, 100, open, 4);
    assert_true(eng_constraint_accept_token(c, piece("\"")));
    /* inside the string: plain characters, the lone UTF-8 lead, the whole
     * é, the closing quote and '"}'; never the lone continuation byte, nor
     * '":' (a colon cannot follow the value) */
    int32_t inside[] = {piece("a"),  piece("ab"), piece("abc"), piece("\"}"), piece(","),
                        piece("1"),  piece("12"), piece("-"),   piece("true"), piece("tr"),
                        piece("ue"), piece(" "), piece("\xc3"), piece("\xc3\xa9"),
                        piece("\""), piece("{"), piece("}"), piece("["), piece("]")};
    /* not "false": 5 characters, maxLength is 4 */
    expect_mask(c, 100, inside, (int32_t)(sizeof inside / sizeof *inside));
    /* with 2 tokens left only what can still close: '"}' closes at once;
     * after "a" one more token ('"}') is needed, which fits */
    assert_true(eng_constraint_accept_token(c, piece("abc")));
    /* one character of room left: 4-char pieces are out */
    int32_t tight[] = {piece("a"), piece("\"}"), piece(","), piece("1"), piece("-"), piece(" "),
                       piece("\xc3"), piece("\xc3\xa9"), piece("\""), piece("{"), piece("}"),
                       piece("["), piece("]")};
    expect_mask(c, 100, tight, (int32_t)(sizeof tight / sizeof *tight));
    int32_t last[] = {piece("\"}")};
    expect_mask(c, 1, last, 1); /* budget 1: only the token that completes */
    assert_false(eng_constraint_is_complete(c));
    assert_true(eng_constraint_accept_token(c, piece("\"}")));
    assert_true(eng_constraint_is_complete(c));
    assert_true(eng_constraint_is_closed(c));
    int32_t end[] = {HAND_END};
    expect_mask(c, 100, end, 1);
    assert_false(eng_constraint_accept_token(c, piece(",")));
    assert_true(eng_constraint_accept_token(c, HAND_END));
    eng_constraint_free(c);
    eng_grammar_free(g);

    /* budget forcing in an array: with budget 3 after "[1", only ']' or
     * a digit that still leaves room for ']' */
    g = compile_ok("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}");
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    assert_true(eng_constraint_accept_token(c, piece("[")));
    assert_true(eng_constraint_accept_token(c, piece("1")));
    /* ',' would need an item and ']' after it: 2 more tokens */
    int32_t two[] = {piece("]"), piece("1"), piece("12")};
    expect_mask(c, 2, two, 3);
    int32_t one[] = {piece("]")};
    expect_mask(c, 1, one, 1);
    assert_int_equal(eng_constraint_min_bytes(c), 1);
    int32_t none[] = {0};
    expect_mask(c, 0, none, 0);
    eng_constraint_free(c);
    eng_grammar_free(g);
    eng_cs_vocab_free(v);
}

/* ---- errors ----------------------------------------------------------------- */

static void expect_error(const char *schema, int code, const char *needle)
{
    json_t *s = parse(schema);
    eng_grammar *g = NULL;
    sw_error err;
    sw_error_clear(&err);
    int rc = eng_grammar_from_schema(s, &g, &err);
    json_decref(s);
    if (rc != code || !strstr(err.message, needle))
        fail_msg("%s: got %d '%s', expected %d with '%s'", schema, rc, err.message, code, needle);
    assert_null(g);
}

static void test_errors(void **state)
{
    (void)state;
    expect_error("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", SW_EUNSUPPORTED,
                 "backreferences");
    expect_error("{\"type\":\"string\",\"pattern\":\"(a\"}", SW_EINVAL, "#/pattern");
    expect_error("{\"type\":\"string\",\"pattern\":\"^a{3}$\",\"maxLength\":2}", SW_EINVAL,
                 "no string of the allowed lengths");
    expect_error("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\","
                 "\"format\":\"idn-hostname\"}}}",
                 SW_EUNSUPPORTED, "#/properties/d/format");
    expect_error("{\"$ref\":\"#/$defs/x\"}", SW_EINVAL, "names no schema");
    expect_error("{\"$ref\":\"https://example.com/s.json\"}", SW_EUNSUPPORTED, "remote $ref");
    expect_error("{\"$ref\":\"#\"}", SW_EUNSUPPORTED, "cycle");
    expect_error("{\"oneOf\":[{\"multipleOf\":2},{\"multipleOf\":3}]}", SW_EUNSUPPORTED,
                 "may both match");
    eng_grammar_free(compile_ok("{\"oneOf\":[{\"type\":\"object\"},{\"required\":[\"a\","
                                "\"b\"],\"minProperties\":2}]}"));
    eng_grammar_free(compile_ok("{\"not\":{\"type\":\"string\",\"minLength\":3}}"));
    expect_error("{\"not\":{\"multipleOf\":2}}", SW_EUNSUPPORTED, "'not' of 'multipleOf'");
    /* uniqueItems: at most one item (a narrowing); two required: refused */
    eng_grammar_free(compile_ok("{\"type\":\"array\",\"uniqueItems\":true}"));
    expect_error("{\"type\":\"array\",\"uniqueItems\":true,\"minItems\":2}", SW_EUNSUPPORTED,
                 "no value");
    /* free keys could name a property with dependencies: that name is left
     * out of the free keys (a narrowing), so the keyword holds */
    {
        eng_cs_vocab *dv = byte_vocab();
        eng_grammar *dg = compile_ok("{\"dependentRequired\":{\"a\":[\"b\"]}}");
        expect_whole(dg, dv, "{}");
        expect_refused(dg, dv, "{\"a\":1}");
        eng_grammar_free(dg);
        eng_cs_vocab_free(dv);
    }
    expect_error("{\"minProperties\":2}", SW_EUNSUPPORTED, "minProperties");
    {
        /* free keys counted: at most 2 entries, at least 1 */
        eng_cs_vocab *bv = byte_vocab();
        eng_grammar *pg = compile_ok("{\"type\":\"object\",\"additionalProperties\":{\"type\":"
                                     "\"integer\"},\"maxProperties\":2,\"minProperties\":1}");
        expect_refused(pg, bv, "{}");
        expect_whole(pg, bv, "{\"a\":1}");
        expect_whole(pg, bv, "{\"a\":1,\"b\":2}");
        expect_refused(pg, bv, "{\"a\":1,\"b\":2,");
        eng_grammar_free(pg);
        eng_cs_vocab_free(bv);
    }
    /* tuples: prefixItems, or items as an array (draft 7) with additionalItems */
    {
        eng_cs_vocab *bv = byte_vocab();
        eng_grammar *tg = compile_ok("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},"
                                     "{\"enum\":[\"a\",\"b\"]}],\"items\":false,\"minItems\":1}");
        expect_whole(tg, bv, "[1,\"a\"]");
        expect_whole(tg, bv, "[7]");
        expect_refused(tg, bv, "[]");
        expect_refused(tg, bv, "[\"a\"]");
        expect_refused(tg, bv, "[1,\"a\",2]");
        eng_grammar_free(tg);
        tg = compile_ok("{\"type\":\"array\",\"items\":[{\"type\":\"null\"}],"
                        "\"additionalItems\":{\"type\":\"boolean\"},\"minItems\":3}");
        expect_whole(tg, bv, "[null,true,false]");
        expect_refused(tg, bv, "[true]");
        expect_prefix_only(tg, bv, "[null,true");
        eng_grammar_free(tg);
        eng_cs_vocab_free(bv);
    }
    expect_error("false", SW_EUNSUPPORTED, "false");
    expect_error("{\"type\":\"strin\"}", SW_EINVAL, "unknown type");
    expect_error("{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", SW_EINVAL, "minLength");
    expect_error("{\"type\":\"array\",\"minItems\":-1}", SW_EINVAL, "minItems");
    expect_error("{\"enum\":[]}", SW_EINVAL, "enum");
    expect_error("{\"type\":\"string\",\"enum\":[1,2]}", SW_EINVAL, "matches");
    expect_error("{\"anyOf\":[]}", SW_EINVAL, "anyOf");
    /* nesting deeper than the automaton's stack */
    char deep[2048] = "";
    for (int i = 0; i < 20; i++)
        strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 20; i++)
        strcat(deep, "}");
    /* arrays may be empty: the deepest levels are never generated */
    eng_grammar_free(compile_ok(deep));
    deep[0] = '\0';
    for (int i = 0; i < 20; i++)
        strcat(deep, "{\"type\":\"array\",\"minItems\":1,\"items\":");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 20; i++)
        strcat(deep, "}");
    expect_error(deep, SW_EUNSUPPORTED, "nest too deeply");
    /* anyOf fan-out is bounded: nesting, and branches per value */
    deep[0] = '\0';
    for (int i = 0; i < 10; i++)
        strcat(deep, "{\"anyOf\":[{\"type\":\"null\"},");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 10; i++)
        strcat(deep, "]}");
    expect_error(deep, SW_EUNSUPPORTED, "nested too deeply");
    /* past 64 branches the widest alternatives keep their first branch
     * only (a narrowing), until they fit */
    char wide[4096] = "{\"anyOf\":[";
    for (int i = 0; i < 40; i++)
        strcat(wide, i ? ",{}" : "{}"); /* each {} is any value: 5 branches */
    strcat(wide, "]}");
    eng_grammar_free(compile_ok(wide));
    /* a repeated type would compile the same subschemas once per entry,
     * level after level (7^12 nodes from 1.5 KB) */
    expect_error("{\"type\":[\"object\",\"null\",\"object\"]}", SW_EINVAL, "twice");
    /* an enum value of 1e300 is an integer (a whole number) */
    eng_grammar_free(compile_ok("{\"type\":\"integer\",\"enum\":[1e300,\"x\"]}"));
    expect_error("{\"type\":\"integer\",\"enum\":[1.5]}", SW_EINVAL, "no value");
    deep[0] = '\0';
    for (int i = 0; i < 12; i++)
        strcat(deep, "{\"type\":[\"object\",\"object\"],\"properties\":{\"a\":");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 12; i++)
        strcat(deep, "}}");
    expect_error(deep, SW_EINVAL, "twice");
    /* enums are bounded (every generated byte is checked against each) */
    {
        size_t cap = 4097 * 8 + 64, len = 0;
        char *big = sw_malloc(cap);
        assert_non_null(big);
        len += (size_t)snprintf(big + len, cap - len, "{\"enum\":[");
        for (int i = 0; i < 4097; i++)
            len += (size_t)snprintf(big + len, cap - len, "%s%d", i ? "," : "", i);
        snprintf(big + len, cap - len, "]}");
        expect_error(big, SW_EUNSUPPORTED, "4096 enum values");
        sw_free(big);
    }
    /* ignored annotations are fine */
    eng_grammar_free(compile_ok("{\"title\":\"t\",\"description\":\"d\",\"type\":\"object\","
                                "\"additionalProperties\":false,\"properties\":{\"a\":{"
                                "\"type\":\"string\",\"default\":\"x\",\"examples\":[\"y\"]}}}"));
    /* tool parameters must be an object */
    json_t *p = parse("{\"type\":\"string\"}");
    eng_grammar_tool t = {"f", p};
    eng_grammar *g = NULL;
    sw_error err;
    assert_int_equal(eng_grammar_tool_call(&t, 1, &g, &err), SW_EUNSUPPORTED);
    assert_non_null(strstr(err.message, "object"));
    json_decref(p);
}

/* ---- numbers with bounds --------------------------------------------------- */

/* Every integer in [-1200, 1200] is accepted exactly when it is valid, no
 * accepted prefix is a dead end, and every accepted fraction is valid
 * (fractions near the bounds may be narrowed away). */
static void test_number_bounds(void **state)
{
    (void)state;
    static const char *const schemas[] = {
        "{\"type\":\"integer\",\"minimum\":3,\"maximum\":250}",
        "{\"type\":\"integer\",\"minimum\":-17}",
        "{\"type\":\"integer\",\"maximum\":-17}",
        "{\"type\":\"integer\",\"exclusiveMinimum\":-100,\"exclusiveMaximum\":100}",
        "{\"type\":\"integer\",\"minimum\":-1000,\"maximum\":-998}",
        "{\"type\":\"integer\",\"minimum\":0,\"maximum\":0}",
        "{\"type\":\"integer\",\"minimum\":99,\"maximum\":1001}",
        "{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":7.5}",
        "{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}",
        "{\"type\":\"integer\",\"maximum\":1e300}",
        "{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":true}",
        "{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":300}",
        "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}",
        "{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
        "{\"type\":\"number\",\"maximum\":-0.5}",
        "{\"type\":\"integer\",\"multipleOf\":7}",
        "{\"type\":\"number\",\"multipleOf\":0.01,\"minimum\":-3}",
        "{\"type\":\"number\",\"multipleOf\":25}",
        "{\"type\":\"integer\",\"multipleOf\":3,\"minimum\":2,\"maximum\":400}",
        "{\"type\":\"integer\",\"multipleOf\":7,\"exclusiveMinimum\":-50}",
        "{\"type\":\"integer\",\"multipleOf\":10,\"minimum\":95,\"maximum\":1000}",
        "{\"type\":\"integer\",\"multipleOf\":13,\"minimum\":-1000,\"maximum\":-900}",
        "{\"type\":\"number\",\"multipleOf\":1.5,\"minimum\":-20,\"maximum\":20}",
        "{\"type\":\"integer\",\"multipleOf\":2.5}",
        "{\"multipleOf\":0.25,\"exclusiveMaximum\":9}",
    };
    eng_cs_vocab *v = byte_vocab();
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        json_t *sj = parse(schemas[i]);
        eng_grammar *g = compile_ok(schemas[i]);
        for (int x = -1200; x <= 1200; x++) {
            for (int scale = 1; scale <= 100; scale *= 10) {
                char text[48];
                if (scale == 1)
                    snprintf(text, sizeof text, "%d", x);
                else
                    snprintf(text, sizeof text, "%s%d.%0*d", x < 0 ? "-" : "", abs(x) / scale,
                             scale == 10 ? 1 : 2, abs(x) % scale);
                eng_constraint *c = NULL;
                assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
                bool fed = true;
                for (size_t k = 0; text[k] && fed; k++) {
                    fed = eng_constraint_feed(c, &text[k], 1);
                    if (fed && eng_constraint_min_bytes(c) > 64)
                        fail_msg("%s: the prefix '%.*s' of %s cannot complete", schemas[i],
                                 (int)k + 1, text, text);
                }
                bool accepted = fed && eng_constraint_is_complete(c);
                eng_constraint_free(c);
                json_t *xv = parse(text);
                bool valid = eng_json_validate(sj, xv, NULL) == SW_OK;
                json_decref(xv);
                if (accepted && !valid)
                    fail_msg("%s: the invalid %s is accepted", schemas[i], text);
                if (scale == 1 && valid && !accepted)
                    fail_msg("%s: the valid %s is refused", schemas[i], text);
            }
        }
        eng_grammar_free(g);
        json_decref(sj);
    }
    eng_cs_vocab_free(v);
    /* an empty range */
    expect_error("{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}", SW_EUNSUPPORTED,
                 "no value");
    expect_error("{\"type\":\"integer\",\"multipleOf\":25,\"minimum\":10,\"maximum\":19}",
                 SW_EUNSUPPORTED, "no value");
}

/* ---- numbers past 64 bits ------------------------------------------------ */

/* Feeds text byte by byte: the index of the first byte refused, or -1 when
 * all are taken (*complete: the value may end there). */
static int feed_bytes(const eng_grammar *g, const eng_cs_vocab *v, const char *text,
                      bool *complete)
{
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    int at = -1;
    for (size_t k = 0; text[k]; k++) {
        if (!eng_constraint_feed(c, &text[k], 1)) {
            at = (int)k;
            break;
        }
        if (eng_constraint_min_bytes(c) > 512)
            fail_msg("the prefix '%.*s' cannot complete", (int)k + 1, text);
    }
    *complete = at < 0 && eng_constraint_is_complete(c);
    eng_constraint_free(c);
    return at;
}

static void expect_taken(const eng_grammar *g, const eng_cs_vocab *v, const char *text)
{
    bool complete;
    int at = feed_bytes(g, v, text, &complete);
    if (at >= 0 || !complete)
        fail_msg("%s: refused at byte %d (complete %d)", text, at, complete);
}

/* refused exactly at byte `at` (-1: every byte taken, but incomplete) */
static void expect_refused_at(const eng_grammar *g, const eng_cs_vocab *v, const char *text,
                              int at)
{
    bool complete;
    int got = feed_bytes(g, v, text, &complete);
    if (got != at || complete)
        fail_msg("%s: refused at byte %d (complete %d), expected %d", text, got, complete, at);
}

/* Bounds, const and enum past 64 bits, exact to the last digit; the
 * validator agrees; a dump writes the numbers back. */
static void test_big_numbers(void **state)
{
    (void)state;
    eng_cs_vocab *v = byte_vocab();
    const char *max_text = "{\"type\":\"integer\",\"minimum\":0,"
                           "\"maximum\":100000000000000000000000}";
    eng_grammar *g = compile_ok(max_text);
    expect_taken(g, v, "100000000000000000000000"); /* max */
    expect_refused_at(g, v, "100000000000000000000001", 23); /* max + 1: the last digit */
    expect_taken(g, v, "99999999999999999999999");
    expect_taken(g, v, "123456789012345678901"); /* past 64 bits, within the bound */
    expect_taken(g, v, "0");
    expect_refused_at(g, v, "1000000000000000000000000", 24); /* 25 digits */
    expect_refused_at(g, v, "-1", 1); /* "-0" is zero */
    eng_grammar_free(g);
    /* the dump writes the client's text back */
    json_t *sj = parse(max_text);
    char *d = sw_json_dumps(sj, JSON_COMPACT);
    assert_non_null(d);
    assert_non_null(strstr(d, "\"maximum\":100000000000000000000000}"));
    free(d);
    json_t *x = parse("100000000000000000000000");
    assert_int_equal(eng_json_validate(sj, x, NULL), SW_OK);
    json_decref(x);
    x = parse("100000000000000000000001");
    assert_int_equal(eng_json_validate(sj, x, NULL), SW_EINVAL);
    json_decref(x);
    json_decref(sj);

    /* per schema: texts and the byte each is refused at (TAKEN: the whole
     * text is a value; -1: every byte taken but it cannot end there, as
     * -(2^64 - 1) under maximum -2^64: a prefix of longer valid values);
     * the last: the schema beside an enum judges each value exactly */
    enum { TAKEN = -2 };
    static const struct {
        const char *schema;
        struct {
            const char *text;
            int refused_at;
        } texts[6];
    } cases[] = {
        {"{\"type\":\"integer\",\"exclusiveMaximum\":100000000000000000000000}",
         {{"100000000000000000000000", 23}, {"99999999999999999999999", TAKEN}, {"-5", TAKEN}}},
        {"{\"type\":\"integer\",\"minimum\":18446744073709551616}",
         {{"18446744073709551616", TAKEN}, {"18446744073709551615", 19},
          {"18446744073709551617", TAKEN}, {"99999999999999999999", TAKEN},
          {"9223372036854775807", -1}, {"-1", 0}}},
        {"{\"type\":\"integer\",\"minimum\":-100000000000000000000000,"
          "\"maximum\":-18446744073709551616}",
         {{"-18446744073709551616", TAKEN}, {"-18446744073709551615", -1},
          {"-100000000000000000000000", TAKEN}, {"-100000000000000000000001", 24}, {"5", 0}}},
        {"{\"type\":\"number\",\"minimum\":-2.5,"
          "\"maximum\":100000000000000000000000}",
         {{"100000000000000000000000", TAKEN}, {"100000000000000000000001", 23}, {"12.5", TAKEN}}},
        {"{\"const\":123456789012345678901234567890}",
         {{"123456789012345678901234567890", TAKEN}, {"123456789012345678901234567891", 29},
          {"12345678901234567890123456789", -1}, {"1234567890123456789012345678900", 30}}},
        {"{\"enum\":[18446744073709551616,-98765432109876543210,\"x\",7]}",
         {{"18446744073709551616", TAKEN}, {"-98765432109876543210", TAKEN}, {"\"x\"", TAKEN},
          {"7", TAKEN}, {"18446744073709551617", 19}}},
        {"{\"type\":\"integer\",\"maximum\":18446744073709551616,"
          "\"enum\":[18446744073709551616,18446744073709551617]}",
         {{"18446744073709551616", TAKEN}, {"18446744073709551617", 19}}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        g = compile_ok(cases[i].schema);
        for (size_t k = 0; k < 6 && cases[i].texts[k].text; k++) {
            if (cases[i].texts[k].refused_at == TAKEN)
                expect_taken(g, v, cases[i].texts[k].text);
            else
                expect_refused_at(g, v, cases[i].texts[k].text, cases[i].texts[k].refused_at);
        }
        eng_grammar_free(g);
    }
    /* a marker is a number, never a string */
    expect_error("{\"type\":\"string\",\"enum\":[18446744073709551616]}", SW_EINVAL,
                 "no value");
    /* refused with a typed error: a huge real bound, a huge multipleOf */
    expect_error("{\"type\":\"integer\",\"maximum\":1e400}", SW_EUNSUPPORTED,
                 "past a double's range");
    expect_error("{\"type\":\"number\",\"multipleOf\":0.3}", SW_EUNSUPPORTED, "multipleOf");
    expect_error("{\"type\":\"integer\",\"multipleOf\":100000000000000000000}",
                 SW_EUNSUPPORTED, "multipleOf");

    /* the JSON Schema Test Suite's optional bignum groups: every invalid
     * instance refused; a valid one refused only without a bound (15
     * digits then: a narrowing); the validator agrees with every verdict */
    const char *path =
        tu_shared_path("jsonschema-test-suite/tests/draft2020-12/optional/bignum.json");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (f) {
        static char text[1 << 16];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = '\0';
        json_t *groups = parse(text);
        size_t gi, ti;
        json_t *group, *t;
        int taken = 0, narrowed = 0;
        json_array_foreach(groups, gi, group) {
            json_t *schema = json_object_get(group, "schema");
            eng_grammar *bg = NULL;
            sw_error err;
            if (eng_grammar_from_schema(schema, &bg, &err))
                fail_msg("bignum group %zu: %s", gi, err.message);
            bool bounded = !json_object_get(schema, "type");
            json_array_foreach(json_object_get(group, "tests"), ti, t) {
                json_t *data = json_object_get(t, "data");
                bool valid = json_is_true(json_object_get(t, "valid"));
                char *dt = sw_json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);
                assert_non_null(dt);
                bool complete;
                bool accepted = feed_bytes(bg, v, dt, &complete) < 0 && complete;
                if (accepted && !valid)
                    fail_msg("bignum group %zu: the invalid %s is accepted", gi, dt);
                if (valid && !accepted && bounded)
                    fail_msg("bignum group %zu: the valid %s is refused", gi, dt);
                if ((eng_json_validate(schema, data, NULL) == SW_OK) != valid)
                    fail_msg("bignum group %zu: the validator misjudges %s", gi, dt);
                taken += accepted && valid;
                narrowed += valid && !accepted;
                free(dt);
            }
            eng_grammar_free(bg);
        }
        print_message("  bignum.json: %d valid taken, %d narrowed (no bound: 15 digits)\n", taken,
                      narrowed);
        json_decref(groups);
    }
    eng_cs_vocab_free(v);
}

/* ---- hostile schemas ---------------------------------------------------------- */

/* Schemas built to blow up compile time or memory get a typed error (or
 * compile within the bounds), never a hang: ctest's time-out would catch
 * one. */
static void test_hostile(void **state)
{
    (void)state;
    char *big = sw_malloc(1 << 16);
    assert_non_null(big);
    /* "billion laughs": each definition refers to the next twice */
    size_t len = (size_t)snprintf(big, 1 << 16, "{\"$ref\":\"#/$defs/d0\",\"$defs\":{");
    for (int i = 0; i < 40; i++)
        len += (size_t)snprintf(big + len, (1 << 16) - len,
                                "%s\"d%d\":{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":"
                                "\"#/$defs/d%d\"},\"b\":{\"$ref\":\"#/$defs/d%d\"}}}",
                                i ? "," : "", i, i + 1, i + 1);
    snprintf(big + len, (1 << 16) - len, ",\"d40\":{\"type\":\"null\"}}}");
    json_t *sj = parse(big);
    eng_grammar *g = NULL;
    sw_error err;
    int rc = eng_grammar_from_schema(sj, &g, &err);
    assert_true(rc == SW_OK || rc == SW_EUNSUPPORTED);
    eng_grammar_free(g);
    json_decref(sj);
    /* anyOf alternatives that refer to each other: distributed fan-out */
    len = (size_t)snprintf(big, 1 << 16, "{\"$ref\":\"#/$defs/d0\",\"$defs\":{");
    for (int i = 0; i < 30; i++)
        len += (size_t)snprintf(big + len, (1 << 16) - len,
                                "%s\"d%d\":{\"anyOf\":[{\"$ref\":\"#/$defs/d%d\"},{\"allOf\":[{\"$ref\":"
                                "\"#/$defs/d%d\"},{\"minLength\":%d}]}]}",
                                i ? "," : "", i, i + 1, i + 1, i);
    snprintf(big + len, (1 << 16) - len, ",\"d30\":{\"type\":\"string\"}}}");
    sj = parse(big);
    g = NULL;
    rc = eng_grammar_from_schema(sj, &g, &err);
    assert_true(rc == SW_OK || rc == SW_EUNSUPPORTED);
    eng_grammar_free(g);
    json_decref(sj);
    /* allOf of allOf ... each merging large property sets */
    len = (size_t)snprintf(big, 1 << 16, "{\"allOf\":[");
    for (int i = 0; i < 200; i++)
        len += (size_t)snprintf(big + len, (1 << 16) - len,
                                "%s{\"properties\":{\"p%d\":{\"minimum\":%d},\"q\":{\"maximum\":%d}}}",
                                i ? "," : "", i, i, 1000 - i);
    snprintf(big + len, (1 << 16) - len, "]}");
    sj = parse(big);
    g = NULL;
    rc = eng_grammar_from_schema(sj, &g, &err);
    assert_true(rc == SW_OK || rc == SW_EUNSUPPORTED);
    eng_grammar_free(g);
    json_decref(sj);
    /* if / then / else on a property's value, and not of a bound */
    {
        eng_cs_vocab *bv = byte_vocab();
        eng_grammar *ig = compile_ok(
            "{\"type\":\"object\",\"properties\":{\"country\":{\"enum\":[\"US\",\"CA\"]},\"zip\":{"
            "\"type\":\"string\"}},\"required\":[\"country\"],\"if\":{\"properties\":{\"country\":{"
            "\"const\":\"US\"}}},\"then\":{\"required\":[\"zip\"]},\"else\":{\"properties\":{\"zip\":"
            "false}}}");
        expect_whole(ig, bv, "{\"country\":\"US\",\"zip\":\"1\"}");
        expect_whole(ig, bv, "{\"country\":\"CA\"}");
        expect_refused(ig, bv, "{\"country\":\"US\"}");
        expect_refused(ig, bv, "{\"country\":\"CA\",");
        eng_grammar_free(ig);
        ig = compile_ok("{\"type\":\"integer\",\"not\":{\"minimum\":5}}");
        expect_whole(ig, bv, "4");
        expect_whole(ig, bv, "-40");
        expect_refused(ig, bv, "5");
        eng_grammar_free(ig);
        eng_cs_vocab_free(bv);
    }
    /* a $ref cycle through allOf never reaches a value */
    expect_error("{\"$defs\":{\"a\":{\"allOf\":[{\"$ref\":\"#/$defs/b\"}]},\"b\":{\"allOf\":[{"
                 "\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}",
                 SW_EUNSUPPORTED, "cycle");
    sw_free(big);
}

/* ---- the test cases used by the random walks and the model runs ----------- */

static const char *const weather_params =
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
    "\"days\":{\"type\":\"integer\"},\"units\":{\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\",\"days\"]}";
static const char *const search_params =
    "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"minLength\":1,"
    "\"maxLength\":20},\"limit\":{\"type\":\"integer\"},\"exact\":{\"type\":\"boolean\"}},"
    "\"required\":[\"query\"]}";
static const char *const nested_schema =
    "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":5},\"maxItems\":3},"
    "\"age\":{\"type\":[\"integer\",\"null\"]}},\"required\":[\"name\",\"tags\"]},"
    "\"flags\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":4},"
    "\"score\":{\"type\":\"number\"},"
    "\"kind\":{\"anyOf\":[{\"type\":\"string\",\"enum\":[\"a\",\"bb\"]},{\"type\":\"object\","
    "\"properties\":{\"x\":{\"const\":1}},\"required\":[\"x\"]}]}},"
    "\"required\":[\"user\",\"flags\",\"kind\"]}";

typedef enum case_kind { CASE_SCHEMA, CASE_TOOLS, CASE_JSON_OBJECT } case_kind;

typedef struct test_case {
    const char *name;
    case_kind kind;
    const char *schema;         /* CASE_SCHEMA */
    int n_tools;                /* CASE_TOOLS: weather, search, noop (in that order) */
} test_case;

static const test_case cases[] = {
    {"one tool", CASE_TOOLS, NULL, 1},
    {"three tools (required)", CASE_TOOLS, NULL, 3},
    {"nested json_schema", CASE_SCHEMA, NULL, 0},
    {"one tool, nested parameters", CASE_TOOLS, NULL, -1},
    {"json_object", CASE_JSON_OBJECT, NULL, 0},
};
#define N_CASES (sizeof cases / sizeof cases[0])

typedef struct built_case {
    eng_grammar *g;
    json_t *schema;
    json_t *params[3];
    const char *names[3];
    int n_tools;
} built_case;

static void build_case(const test_case *tc, built_case *b)
{
    memset(b, 0, sizeof *b);
    sw_error err;
    if (tc->kind == CASE_TOOLS && tc->n_tools < 0) {
        /* the nested schema as a tool's parameters */
        b->names[0] = "profile";
        b->params[0] = parse(nested_schema);
        b->n_tools = 1;
        eng_grammar_tool t = {b->names[0], b->params[0]};
        if (eng_grammar_tool_call(&t, 1, &b->g, &err))
            fail_msg("tools: %s", err.message);
    } else if (tc->kind == CASE_TOOLS) {
        eng_grammar_tool tools[3];
        b->names[0] = "get_weather";
        b->names[1] = "search";
        b->names[2] = "noop";
        b->params[0] = parse(weather_params);
        b->params[1] = parse(search_params);
        b->params[2] = NULL;
        b->n_tools = tc->n_tools;
        for (int i = 0; i < 3; i++)
            tools[i] = (eng_grammar_tool){b->names[i], b->params[i]};
        if (eng_grammar_tool_call(tools, (size_t)tc->n_tools, &b->g, &err))
            fail_msg("tools: %s", err.message);
    } else if (tc->kind == CASE_SCHEMA) {
        b->schema = parse(nested_schema);
        if (eng_grammar_from_schema(b->schema, &b->g, &err))
            fail_msg("schema: %s", err.message);
    } else {
        b->schema = parse("{\"type\":\"object\"}");
        assert_int_equal(eng_grammar_json_object(&b->g, NULL), SW_OK);
    }
}

static void free_case(built_case *b)
{
    eng_grammar_free(b->g);
    json_decref(b->schema);
    for (int i = 0; i < 3; i++)
        json_decref(b->params[i]);
}

static void check_output(const built_case *b, const char *text, size_t len, const char *what)
{
    if (b->n_tools)
        expect_valid_call(text, len, b->params, b->names, (size_t)b->n_tools, what);
    else
        expect_valid(text, len, b->schema, what);
}

/* ---- random walks over real vocabularies ------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Text of one walk: tokens chosen uniformly among the allowed ones. */
static size_t random_walk(const eng_tokenizer *tok, const eng_cs_vocab *v, const eng_grammar *g,
                          uint64_t seed, int64_t budget, char *out, size_t cap, double *mask_s,
                          int *n_masks)
{
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    int32_t n = eng_cs_vocab_n_tokens(v);
    uint32_t *mask = sw_calloc(((size_t)n + 31) / 32, sizeof *mask);
    size_t len = 0;
    uint64_t rng = seed * 2654435761ULL + 1;
    for (int64_t left = budget; left > 0; left--) {
        double t0 = eng_now_seconds();
        int32_t allowed = eng_constraint_mask(c, left, mask);
        *mask_s += eng_now_seconds() - t0;
        (*n_masks)++;
        assert_true(allowed > 0);
        int32_t pick = (int32_t)(rng_next(&rng) % (uint64_t)allowed), id = -1;
        for (int32_t i = 0; i < n; i++)
            if (bit(mask, i) && pick-- == 0) {
                id = i;
                break;
            }
        assert_true(id >= 0);
        if (eng_constraint_is_end_token(c, id))
            break;
        assert_true(eng_constraint_accept_token(c, id));
        len += eng_token_to_bytes(tok, id, out + len, cap - len);
        assert_true(len < cap);
        if (eng_constraint_is_closed(c))
            break;
    }
    assert_true(eng_constraint_is_complete(c));
    sw_free(mask);
    eng_constraint_free(c);
    return len;
}

static void walk_vocab(const char *rel, int runs, bool report)
{
    const char *path = tu_shared_path(rel);
    if (!path)
        return;
    eng_gguf *gg = NULL;
    eng_tokenizer *tok = NULL;
    eng_cs_vocab *v = NULL;
    sw_error err;
    assert_int_equal(eng_gguf_open(path, &gg, &err), SW_OK);
    assert_int_equal(eng_tokenizer_load(gg, &tok, &err), SW_OK);
    double t0 = eng_now_seconds();
    assert_int_equal(eng_cs_vocab_create(tok, &v, &err), SW_OK);
    double build_s = eng_now_seconds() - t0;
    char *out = sw_malloc(1 << 16);
    for (size_t k = 0; k < N_CASES; k++) {
        built_case b;
        build_case(&cases[k], &b);
        double mask_s = 0;
        int n_masks = 0;
        for (int r = 0; r < runs; r++) {
            /* budgets from barely enough to roomy */
            int64_t budget = eng_grammar_min_bytes(b.g) + (r * 7) % 60;
            size_t len = random_walk(tok, v, b.g, (uint64_t)r + 1000 * k, budget, out, 1 << 16,
                                     &mask_s, &n_masks);
            char what[96];
            snprintf(what, sizeof what, "%s walk %d (%s)", rel, r, cases[k].name);
            check_output(&b, out, len, what);
        }
        if (report)
            printf("  %s, %s: %d masks, %.3f ms per token\n", rel, cases[k].name, n_masks,
                   1e3 * mask_s / (n_masks ? n_masks : 1));
        free_case(&b);
    }
    if (report)
        printf("  %s: %d tokens indexed in %.1f ms\n", rel, eng_tokenizer_n_vocab(tok),
               build_s * 1e3);
    sw_free(out);
    eng_cs_vocab_free(v);
    eng_tokenizer_free(tok);
    eng_gguf_close(gg);
}

static void test_walk_spm(void **state)
{
    (void)state;
    walk_vocab("vocab/ggml-vocab-llama-spm.gguf", WALK_RUNS, false);
}

static void test_walk_qwen2(void **state)
{
    (void)state;
    walk_vocab("vocab/ggml-vocab-qwen2.gguf", WALK_RUNS / 5, true);
}

/* ---- the acceptance runs on tiny models ------------------------------------- */


/* A `model make` model (qwen2 layout) with the vocabulary of vocab_path:
 * a BPE model for the tests. Returns the path or NULL (skipped). */
static const char *make_bpe_model(const char *vocab_rel)
{
    const char *vp = tu_shared_path(vocab_rel);
    if (!vp)
        return NULL;
    char vocab_path[1024];
    snprintf(vocab_path, sizeof vocab_path, "%s", vp);
    eng_gguf *voc = NULL, *made = NULL;
    sw_error err;
    assert_int_equal(eng_gguf_open(vocab_path, &voc, &err), SW_OK);
    eng_gguf_value_type et;
    uint64_t n_tokens = 0;
    assert_int_equal(eng_gguf_get_arr(voc, "tokenizer.ggml.tokens", &et, &n_tokens, &err), SW_OK);
    eng_model_make_params p = eng_model_make_default_params();
    p.architecture = "qwen2";
    p.n_vocab = (int32_t)n_tokens;
    p.tied_output = true;
    static char src[1024], dst[1024];
    snprintf(src, sizeof src, "%s", tu_tmp_path("bpe-src.gguf"));
    snprintf(dst, sizeof dst, "%s", tu_tmp_path("bpe-tiny.gguf"));
    if (eng_model_make(&p, src, &err))
        fail_msg("model make: %s", err.message);
    assert_int_equal(eng_gguf_open(src, &made, &err), SW_OK);
    eng_gguf_writer *w = eng_gguf_writer_create();
    for (int64_t i = 0; i < eng_gguf_n_kv(made); i++)
        if (strncmp(eng_gguf_kv_key(made, i), "tokenizer.", 10) != 0)
            assert_int_equal(eng_gguf_writer_copy_kv(w, made, i, NULL), SW_OK);
    for (int64_t i = 0; i < eng_gguf_n_kv(voc); i++)
        if (strncmp(eng_gguf_kv_key(voc, i), "tokenizer.", 10) == 0)
            assert_int_equal(eng_gguf_writer_copy_kv(w, voc, i, NULL), SW_OK);
    for (int64_t i = 0; i < eng_gguf_n_tensors(made); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(made, i);
        eng_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size_bytes);
    }
    if (eng_gguf_writer_write(w, dst, &err))
        fail_msg("write: %s", err.message);
    eng_gguf_writer_free(w);
    eng_gguf_close(made);
    eng_gguf_close(voc);
    remove(src);
    return dst;
}

/* One generation at temperature 1 under the constraint, as the worker does
 * it (eng_constraint_sample between decodes). Returns the text length. */
static size_t generate(eng_context *ctx, const eng_cs_vocab *v, const eng_grammar *g,
                       const int32_t *prompt, int32_t n_prompt, uint64_t seed, int32_t max_tokens,
                       char *out, size_t cap)
{
    const eng_model *m = eng_context_model(ctx);
    const eng_tokenizer *tok = eng_model_tokenizer(m);
    int32_t n_vocab = eng_model_hparams(m)->n_vocab;
    float *logits = sw_malloc((size_t)n_vocab * sizeof *logits);
    eng_sampler_params sp = eng_sampler_default_params();
    sp.temperature = 1.0f;
    sp.top_k = 40; /* temperature 1 over the 40 best allowed tokens: random text,
                      without sorting the whole vocabulary per token */
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = seed;
    eng_sampler *s = eng_sampler_create(&sp, n_vocab);
    eng_constraint *c = NULL;
    sw_error err;
    assert_int_equal(eng_constraint_create(g, v, &c, &err), SW_OK);
    eng_seq_clear(ctx, 0);
    if (eng_decode(ctx, 0, prompt, n_prompt, logits, &err))
        fail_msg("decode: %s", err.message);
    size_t len = 0;
    for (int32_t i = 0; i < max_tokens; i++) {
        int32_t token;
        bool end;
        if (eng_constraint_sample(c, s, logits, n_vocab, NULL, 0, max_tokens - i, &token, &end,
                                  &err))
            fail_msg("sample: %s", err.message);
        assert_int_equal(eng_sampler_draws(s), (uint64_t)i + 1);
        if (end)
            break;
        len += eng_token_to_bytes(tok, token, out + len, cap - len);
        assert_true(len < cap);
        if (eng_constraint_is_closed(c))
            break;
        if (eng_decode(ctx, 0, &token, 1, logits, &err))
            fail_msg("decode: %s", err.message);
    }
    assert_true(eng_constraint_is_complete(c));
    eng_seq_clear(ctx, 0);
    eng_constraint_free(c);
    eng_sampler_free(s);
    sw_free(logits);
    return len;
}

static void run_model(const char *path, const char *label, int runs)
{
    eng_model *m = NULL;
    eng_context *ctx = NULL;
    eng_cs_vocab *v = NULL;
    sw_error err;
    if (eng_model_load(path, &m, &err))
        fail_msg("load %s: %s", path, err.message);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 1;
    assert_int_equal(eng_context_create(m, &cp, &ctx, &err), SW_OK);
    const eng_tokenizer *tok = eng_model_tokenizer(m);
    assert_int_equal(eng_cs_vocab_create(tok, &v, &err), SW_OK);
    int32_t *prompt = NULL;
    const char *text = "Call a tool with JSON arguments:";
    size_t n_prompt = tu_tokenize(tok, text, strlen(text), eng_tokenizer_add_bos(tok), false,
                                  &prompt);
    char *out = sw_malloc(1 << 16);
    double t0 = eng_now_seconds();
    int total = 0;
    for (size_t k = 0; k < N_CASES; k++) {
        built_case b;
        build_case(&cases[k], &b);
        for (int r = 0; r < runs; r++) {
            /* budgets from the minimum up: the tight ones force completion */
            int32_t budget = (int32_t)eng_grammar_min_bytes(b.g) + (r * 13) % 50;
            size_t len = generate(ctx, v, b.g, prompt, (int32_t)n_prompt, 7000 + (uint64_t)r,
                                  budget, out, 1 << 16);
            char what[128];
            snprintf(what, sizeof what, "%s seed %d (%s)", label, 7000 + r, cases[k].name);
            check_output(&b, out, len, what);
            total++;
        }
        free_case(&b);
    }
    printf("  %s: %d constrained generations valid (%.1f s)\n", label, total,
           eng_now_seconds() - t0);
    sw_free(out);
    sw_free(prompt);
    eng_cs_vocab_free(v);
    eng_context_free(ctx);
    eng_model_free(m);
}

static void test_models_spm(void **state)
{
    (void)state;
    const char *path = tu_shared_path("models/llama-2-tiny-random.gguf");
    if (!path)
        return;
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", path);
    run_model(copy, "llama-2-tiny-random (SPM)", MODEL_RUNS);
}

static void test_models_bpe(void **state)
{
    (void)state;
    const char *path = make_bpe_model("vocab/ggml-vocab-gpt-2.gguf");
    if (!path)
        return;
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", path);
    run_model(copy, "tiny qwen2 + GPT-2 vocabulary (BPE)", MODEL_RUNS);
    remove(copy);
}

/* `spillway run --json-schema FILE` (a real process): the text is valid. */
static void test_cli_run(void **state)
{
    (void)state;
    const char *bin = tu_spillway_bin();
    if (!bin) {
        skip();
        return;
    }
    char model[1024], schema_path[1024];
    snprintf(model, sizeof model, "%s", tu_tmp_path("cli-schema.gguf"));
    eng_model_make_params p = eng_model_make_default_params();
    assert_int_equal(eng_model_make(&p, model, NULL), SW_OK);
    snprintf(schema_path, sizeof schema_path, "%s", tu_tmp_path("cli-schema.json"));
    FILE *f = fopen(schema_path, "w");
    assert_non_null(f);
    fputs(nested_schema, f);
    fclose(f);
    json_t *schema = parse(nested_schema);
    for (int seed = 1; seed <= 3; seed++) {
        char seed_text[16], *out = NULL;
        snprintf(seed_text, sizeof seed_text, "%d", seed);
        char *const argv[] = {(char *)bin, "run", "-m", model, "-p", "JSON:", "-n", "90",
                              "--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0",
                              "--seed", seed_text, "--json-schema", schema_path, "--json", NULL};
        int status = -1;
        assert_int_equal(tu_run_capture(argv, 60, &out, &status), 0);
        assert_int_equal(status, 0);
        json_t *rec = json_loads(out, 0, NULL);
        assert_non_null(rec);
        const char *text = json_string_value(json_object_get(rec, "text"));
        assert_non_null(text);
        expect_valid(text, strlen(text), schema, "spillway run --json-schema");
        json_decref(rec);
        sw_free(out);
    }
    /* a schema outside the subset: a clear error, exit status 1 */
    f = fopen(schema_path, "w");
    fputs("{\"type\":\"string\",\"format\":\"idn-hostname\"}", f);
    fclose(f);
    char *out = NULL;
    int status = -1;
    char *const bad_argv[] = {(char *)bin, "run", "-m", model, "-p", "x", "--json-schema",
                              schema_path, NULL};
    assert_int_equal(tu_run_capture(bad_argv, 60, &out, &status), 0);
    assert_int_equal(status, 1);
    sw_free(out);
    json_decref(schema);
    remove(schema_path);
    remove(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_object),
        cmocka_unit_test(test_masks),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_number_bounds),
        cmocka_unit_test(test_big_numbers),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_walk_spm),
        cmocka_unit_test(test_walk_qwen2),
        cmocka_unit_test(test_models_spm),
        cmocka_unit_test(test_models_bpe),
        cmocka_unit_test(test_cli_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
