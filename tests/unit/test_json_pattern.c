/* test_json_pattern.c - `pattern` and `format` through the whole path:
 * json_schema.c compiles them into CS_PATTERN nodes, constrain.c runs the
 * node's automaton over the string's decoded content.
 *
 * Checked against eng_json_validate and the pattern automaton itself
 * (regex.h), not against the constraint's own idea of the language:
 *   - random generation over a hand vocabulary (single bytes, escapes,
 *     multi-byte pieces) from barely enough budget to roomy: every output
 *     completes within the budget, parses, validates, and its string
 *     content matches;
 *   - fed texts: valid values (with short escapes, \u00XX escapes of
 *     control characters, UTF-8) are accepted, invalid ones refused, and
 *     eng_grammar_min_bytes is the length of the shortest text;
 *   - on the qwen2 vocabulary (../shared; skipped when absent) random walks
 *     validate too, and the mask time per token is printed.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "grammar/constrain.h"
#include "grammar/formats.h"
#include "grammar/gbnf.h"
#include "engine/generate.h"
#include "gguf/gguf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (!j)
        fail_msg("bad JSON in the test: %s: %s", text, e.text);
    return j;
}

static const char *const g_schemas[] = {
    "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,5}-\\\\d{3}$\"}",
    "{\"type\":\"string\",\"pattern\":\"\\\\d\"}",
    "{\"type\":\"string\",\"pattern\":\"^[^x]*\\\"$\"}",
    "{\"type\":\"string\",\"pattern\":\"^[\\\\x00-\\\\x1f]{2}$\"}",
    "{\"type\":\"string\",\"pattern\":\"^(\\\\\\\\|/)+$\",\"maxLength\":3}",
    "{\"type\":\"string\",\"pattern\":\"^a+$\",\"minLength\":3,\"maxLength\":4}",
    "{\"type\":\"string\",\"pattern\":\"\\u00e9|\\ud83d\\ude00\"}",
    "{\"type\":\"string\",\"pattern\":\"^\\\\p{L}{2}$\"}",
    "{\"type\":\"string\",\"format\":\"date\"}",
    "{\"type\":\"string\",\"format\":\"time\"}",
    "{\"type\":\"string\",\"format\":\"date-time\"}",
    "{\"type\":\"string\",\"format\":\"duration\"}",
    "{\"type\":\"string\",\"format\":\"email\"}",
    "{\"type\":\"string\",\"format\":\"email\",\"minLength\":10,\"maxLength\":20}",
    "{\"type\":\"string\",\"format\":\"hostname\"}",
    "{\"type\":\"string\",\"format\":\"ipv4\"}",
    "{\"type\":\"string\",\"format\":\"ipv6\"}",
    "{\"type\":\"string\",\"format\":\"uuid\"}",
    "{\"type\":\"string\",\"format\":\"uri\"}",
    "{\"type\":\"string\",\"format\":\"uri-reference\",\"maxLength\":12}",
    "{\"type\":\"string\",\"format\":\"json-pointer\"}",
    "{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"^2024\"}",
    "{\"format\":\"ipv4\"}",
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"x\":{\"type\":\"string\","
    "\"pattern\":\"^x\"}},\"required\":[\"d\",\"x\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"email\"},\"minItems\":1,"
    "\"maxItems\":2}",
    "{\"anyOf\":[{\"type\":\"string\",\"format\":\"ipv4\"},{\"type\":\"string\","
    "\"format\":\"ipv6\"}]}",
    /* past the costs table: maxLength narrowed to what it holds */
    "{\"type\":\"string\",\"pattern\":\"^[a-z]{1,30}x\",\"maxLength\":1000000}",
};
#define N_SCHEMAS (sizeof g_schemas / sizeof g_schemas[0])

/* Every string in the value whose schema has a pattern or a format matches
 * it (the validator checks that; this checks the validator's verdict is
 * not vacuous: the root string against the automaton directly). */
static void check_output(const char *schema_text, const json_t *schema, const char *out,
                         size_t len)
{
    json_error_t e;
    json_t *val = json_loadb(out, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (!val)
        fail_msg("schema %s: output %.*s does not parse: %s", schema_text, (int)len, out, e.text);
    sw_error err;
    int rc = eng_json_validate(schema, val, &err);
    if (rc != SW_OK)
        fail_msg("schema %s: output %.*s does not validate: %s", schema_text, (int)len, out,
                 err.message);
    const json_t *pat = json_object_get(schema, "pattern");
    const json_t *fmt = json_object_get(schema, "format");
    if (json_is_string(val) && (pat || fmt)) {
        const char *p = pat ? json_string_value(pat)
                            : eng_format_pattern(json_string_value(fmt), NULL);
        eng_regex *re = NULL;
        assert_int_equal(eng_regex_compile(p, strlen(p), &re, NULL), SW_OK);
        if (!eng_regex_match(re, json_string_value(val), json_string_length(val)))
            fail_msg("schema %s: output %.*s does not match", schema_text, (int)len, out);
        eng_regex_free(re);
    }
    json_decref(val);
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static bool bit(const uint32_t *mask, int32_t id)
{
    return mask[id >> 5] >> (id & 31) & 1u;
}

/* One walk: tokens uniformly among the allowed ones; the text goes to out. */
static size_t walk(const eng_grammar *g, const eng_cs_vocab *v, const char *const *pieces,
                   const size_t *lens, const eng_tokenizer *tok, uint64_t seed, int64_t budget,
                   char *out, size_t cap, double *mask_s, int *n_masks)
{
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    int32_t n = eng_cs_vocab_n_tokens(v);
    uint32_t *mask = sw_calloc(((size_t)n + 31) / 32, sizeof *mask);
    size_t len = 0;
    uint64_t rng = seed * 2654435761ULL + 7;
    for (int64_t left = budget; left > 0; left--) {
        double t0 = eng_now_seconds();
        int32_t allowed = eng_constraint_mask(c, left, mask);
        if (mask_s) {
            *mask_s += eng_now_seconds() - t0;
            (*n_masks)++;
        }
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
        if (tok) {
            len += eng_token_to_bytes(tok, id, out + len, cap - len);
        } else {
            memcpy(out + len, pieces[id], lens[id]);
            len += lens[id];
        }
        assert_true(len < cap);
        if (eng_constraint_is_closed(c))
            break;
    }
    assert_true(eng_constraint_is_complete(c));
    sw_free(mask);
    eng_constraint_free(c);
    return len;
}

/* Every byte, and pieces that cross the string's parts. */
static const char *const g_extra[] = {
    "\\n", "\\u00", "\\u001f", "\\\"", "\\\\", "\\/", "ab", "-1", "2024-", "-02-29", "T12:",
    ":00Z", "@example.com", "://", "é", "😀", "\"}", "\",\"", "::", "0.", "\"2", "x\"",
};
#define N_EXTRA (sizeof g_extra / sizeof g_extra[0])

static void hand_vocab(eng_cs_vocab **v, const char **pieces, size_t *lens, char *bytes)
{
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        pieces[i] = &bytes[i];
        lens[i] = 1;
    }
    for (size_t i = 0; i < N_EXTRA; i++) {
        pieces[256 + i] = g_extra[i];
        lens[256 + i] = strlen(g_extra[i]);
    }
    pieces[256 + N_EXTRA] = NULL; /* the end token */
    lens[256 + N_EXTRA] = 0;
    int32_t end = 256 + (int32_t)N_EXTRA;
    assert_int_equal(eng_cs_vocab_create_from_pieces(pieces, lens, 257 + (int32_t)N_EXTRA, &end,
                                                     1, v, NULL),
                     SW_OK);
}

static void test_generate(void **state)
{
    (void)state;
    const char *pieces[257 + N_EXTRA];
    size_t lens[257 + N_EXTRA];
    char bytes[256];
    eng_cs_vocab *v = NULL;
    hand_vocab(&v, pieces, lens, bytes);
    char *out = sw_malloc(1 << 14);
    for (size_t k = 0; k < N_SCHEMAS; k++) {
        json_t *schema = parse(g_schemas[k]);
        eng_grammar *g = NULL;
        sw_error err;
        if (eng_grammar_from_schema(schema, &g, &err))
            fail_msg("schema %s: %s", g_schemas[k], err.message);
        int64_t min = eng_grammar_min_bytes(g);
        for (int r = 0; r < 60; r++) {
            int64_t budget = min + (r * 13) % 90;
            size_t len = walk(g, v, pieces, lens, NULL, (uint64_t)(r + 100 * k), budget, out,
                              1 << 14, NULL, NULL);
            check_output(g_schemas[k], schema, out, len);
        }
        eng_grammar_free(g);
        json_decref(schema);
    }
    sw_free(out);
    eng_cs_vocab_free(v);
}

/* Texts fed byte by byte: accepted exactly when the value is valid in the
 * form the generator writes. */
static void test_feed(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *text;
        bool accepted;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\\\\nb$\"}", "\"a\\nb\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^a\\\\nb$\"}", "\"a\\u000ab\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^a\\\\nb$\"}", "\"a\\u000Ab\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^a\\\\nb$\"}", "\"ab\"", false},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\x01$\"}", "\"\\u0001\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\x01$\"}", "\"\\u0002\"", false},
        {"{\"type\":\"string\",\"pattern\":\"^\\\"$\"}", "\"\\\"\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\\\\\$\"}", "\"\\\\\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^/$\"}", "\"\\/\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^A$\"}", "\"\\u0041\"", false}, /* written as A */
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\xc3\xa9\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\xc3\"", false},
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\xed\xa0\x80\"", false}, /* surrogate */
        {"{\"type\":\"string\",\"pattern\":\"b\"}", "\"abc\"", true},
        {"{\"type\":\"string\",\"pattern\":\"b\"}", "\"ac\"", false},
        {"{\"type\":\"string\",\"pattern\":\"^a*$\",\"maxLength\":2}", "\"aa\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^a*$\",\"maxLength\":2}", "\"aaa\"", false},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-29\"", true},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2023-02-29\"", false},
        {"{\"type\":\"string\",\"format\":\"email\"}", "\"a.b@c.de\"", true},
        {"{\"type\":\"string\",\"format\":\"email\"}", "\"\\\"a b\\\"@c.de\"", true},
        {"{\"type\":\"string\",\"format\":\"email\"}", "\"a..b@c.de\"", false},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "\"a.b\"", true},
        {"{\"type\":\"string\",\"format\":\"ipv4\"}", "\"1.2.3.04\"", false},
        {"{\"format\":\"ipv4\"}", "12", true},
        {"{\"format\":\"ipv4\"}", "\"12\"", false},
        {"{\"type\":\"string\",\"format\":\"x-unknown\"}", "\"anything\"", true},
    };
    const char *pieces[257 + N_EXTRA];
    size_t lens[257 + N_EXTRA];
    char bytes[256];
    eng_cs_vocab *v = NULL;
    hand_vocab(&v, pieces, lens, bytes);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *schema = parse(cases[i].schema);
        eng_grammar *g = NULL;
        sw_error err;
        if (eng_grammar_from_schema(schema, &g, &err))
            fail_msg("schema %s: %s", cases[i].schema, err.message);
        eng_constraint *c = NULL;
        assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
        bool ok = eng_constraint_feed(c, cases[i].text, strlen(cases[i].text)) &&
                  eng_constraint_is_complete(c);
        if (ok != cases[i].accepted)
            fail_msg("schema %s, text %s: accepted %d, want %d", cases[i].schema, cases[i].text,
                     ok, cases[i].accepted);
        if (ok) { /* the validator agrees */
            json_t *val = parse(cases[i].text);
            assert_int_equal(eng_json_validate(schema, val, NULL), SW_OK);
            json_decref(val);
        }
        eng_constraint_free(c);
        eng_grammar_free(g);
        json_decref(schema);
    }
    /* The shortest texts, in bytes. */
    static const struct {
        const char *schema;
        int64_t min_bytes;
    } mins[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a{3}$\"}", 5},
        {"{\"type\":\"string\",\"pattern\":\"^\\\"$\"}", 4},      /* "\"" */
        {"{\"type\":\"string\",\"pattern\":\"^\\\\x01$\"}", 8},   /* "\u0001" */
        {"{\"type\":\"string\",\"pattern\":\"x\",\"minLength\":3}", 5},
        {"{\"type\":\"string\",\"format\":\"date\"}", 12},
        {"{\"type\":\"string\",\"format\":\"ipv6\"}", 4}, /* "::" */
        {"{\"type\":\"string\",\"format\":\"uuid\"}", 38},
    };
    for (size_t i = 0; i < sizeof mins / sizeof mins[0]; i++) {
        json_t *schema = parse(mins[i].schema);
        eng_grammar *g = NULL;
        assert_int_equal(eng_grammar_from_schema(schema, &g, NULL), SW_OK);
        if (eng_grammar_min_bytes(g) != mins[i].min_bytes)
            fail_msg("schema %s: min_bytes %lld, want %lld", mins[i].schema,
                     (long long)eng_grammar_min_bytes(g), (long long)mins[i].min_bytes);
        eng_grammar_free(g);
        json_decref(schema);
    }
    eng_cs_vocab_free(v);
}

/* Hostile or unsupported patterns: typed errors, fast. */
static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        int code;
    } cases[] = {
        /* too large for the automata: SW_ERANGE from regex.h, which the
         * compiler reports as json_schema.h's SW_EUNSUPPORTED */
        {"{\"type\":\"string\",\"pattern\":\"(a|b)*a(a|b){20}\"}", SW_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"((a{100}){100}){100}\"}", SW_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]{1,30}x$\",\"minLength\":100000}",
         SW_EUNSUPPORTED}, /* the costs table */
        {"{\"type\":\"string\",\"pattern\":\"a\\\\d{0,99999999999999999999}\"}",
         SW_EUNSUPPORTED}, /* fuzz_json_schema found it passed through as SW_ERANGE */
        {"{\"type\":\"string\",\"pattern\":\"(?:(?=ab)a)*\"}", SW_EUNSUPPORTED},
        {"{\"type\":\"string\",\"pattern\":\"[\"}", SW_EINVAL},
        {"{\"type\":\"string\",\"pattern\":7}", SW_EINVAL},
        {"{\"type\":\"string\",\"format\":\"uri-template\"}", SW_EUNSUPPORTED},
        {"{\"type\":\"string\",\"format\":\"date\",\"maxLength\":9}", SW_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *schema = parse(cases[i].schema);
        eng_grammar *g = NULL;
        sw_error err;
        double t0 = eng_now_seconds();
        int rc = eng_grammar_from_schema(schema, &g, &err);
        double dt = eng_now_seconds() - t0;
        printf("%s: %s (%.1f ms)\n", cases[i].schema, rc ? err.message : "compiled", dt * 1e3);
        if (rc != cases[i].code)
            fail_msg("schema %s: got %d, want %d", cases[i].schema, rc, cases[i].code);
        assert_null(g);
        json_decref(schema);
    }
}

/* The qwen2 vocabulary of ../shared, its tokenizer and constraint index;
 * false (the test skipped, said why) when it is absent. */
typedef struct qwen2_vocab {
    eng_gguf *gg;
    eng_tokenizer *tok;
    eng_cs_vocab *v;
} qwen2_vocab;

static bool qwen2_open(qwen2_vocab *q)
{
    memset(q, 0, sizeof *q);
    const char *path = tu_shared_path("vocab/ggml-vocab-qwen2.gguf");
    if (!path)
        return false;
    assert_int_equal(eng_gguf_open(path, &q->gg, NULL), SW_OK);
    assert_int_equal(eng_tokenizer_load(q->gg, &q->tok, NULL), SW_OK);
    assert_int_equal(eng_cs_vocab_create(q->tok, &q->v, NULL), SW_OK);
    return true;
}

static void qwen2_close(qwen2_vocab *q)
{
    eng_cs_vocab_free(q->v);
    eng_tokenizer_free(q->tok);
    eng_gguf_close(q->gg);
}

static void test_qwen2(void **state)
{
    (void)state;
    qwen2_vocab q;
    if (!qwen2_open(&q))
        return;
    eng_cs_vocab *v = q.v;
    const eng_tokenizer *tok = q.tok;
    char *out = sw_malloc(1 << 16);
    static const size_t picks[] = {0, 8, 10, 12, 18, 23};
    for (size_t p = 0; p < sizeof picks / sizeof picks[0]; p++) {
        const char *text = g_schemas[picks[p]];
        json_t *schema = parse(text);
        eng_grammar *g = NULL;
        double t0 = eng_now_seconds();
        assert_int_equal(eng_grammar_from_schema(schema, &g, NULL), SW_OK);
        double compile_s = eng_now_seconds() - t0, mask_s = 0;
        int n_masks = 0;
        for (int r = 0; r < 6; r++) {
            int64_t budget = eng_grammar_min_bytes(g) + r * 9;
            size_t len = walk(g, v, NULL, NULL, tok, (uint64_t)r + 50 * p, budget, out, 1 << 16,
                              &mask_s, &n_masks);
            check_output(text, schema, out, len);
        }
        printf("qwen2 %s: compile %.1f ms, %.3f ms per mask (%d masks)\n", text,
               compile_s * 1e3, 1e3 * mask_s / (n_masks ? n_masks : 1), n_masks);
        eng_grammar_free(g);
        json_decref(schema);
    }
    sw_free(out);
    qwen2_close(&q);
}

/* Whether token t is allowed after `prefix` with `left` tokens to go, by
 * feeding it to a fresh constraint: the judge of the masks below. */
static bool token_allowed(const eng_grammar *g, const eng_cs_vocab *v, const char *prefix,
                          int32_t t, int64_t left)
{
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, v, &c, NULL), SW_OK);
    assert_true(eng_constraint_feed(c, prefix, strlen(prefix)));
    bool end = eng_constraint_is_end_token(c, t);
    bool ok = eng_constraint_accept_token(c, t) && (end || eng_constraint_min_bytes(c) <= left - 1);
    eng_constraint_free(c);
    return ok;
}

/* A state to judge: a schema or a GBNF grammar, the text fed, the budget. */
typedef struct mask_case {
    const char *schema, *gbnf, *prefix;
    int64_t left;
} mask_case;

/* Whether token t (its bytes: piece, len of them, len past sizeof piece
 * when cut) is one the test checks by feeding; count[] is the picker's,
 * zero at each case. */
typedef bool (*token_pick)(int32_t t, const char *piece, size_t len, size_t cap,
                           int32_t count[2]);

/* The mask of the case's state agrees with feeding on every token `pick`
 * chooses, and counts its own bits. */
static void check_mask_case(const qwen2_vocab *q, uint32_t *mask, const mask_case *mc,
                            token_pick pick)
{
    eng_grammar *g = NULL;
    sw_error err;
    const char *what = mc->schema ? mc->schema : mc->gbnf;
    if (mc->schema) {
        json_t *schema = parse(mc->schema);
        if (eng_grammar_from_schema(schema, &g, &err))
            fail_msg("%s: %s", what, err.message);
        json_decref(schema);
    } else if (eng_grammar_from_gbnf(mc->gbnf, strlen(mc->gbnf), &g, &err)) {
        fail_msg("%s: %s", what, err.message);
    }
    eng_constraint *c = NULL;
    assert_int_equal(eng_constraint_create(g, q->v, &c, NULL), SW_OK);
    assert_true(eng_constraint_feed(c, mc->prefix, strlen(mc->prefix)));
    int32_t allowed = eng_constraint_mask(c, mc->left, mask), checked = 0, ones = 0;
    int32_t count[2] = {0, 0};
    int32_t n = eng_cs_vocab_n_tokens(q->v);
    for (int32_t t = 0; t < n; t++) {
        char piece[512];
        size_t len = eng_token_to_bytes(q->tok, t, piece, sizeof piece);
        ones += bit(mask, t);
        if (!pick(t, piece, len, sizeof piece, count))
            continue;
        checked++;
        if (bit(mask, t) != token_allowed(g, q->v, mc->prefix, t, mc->left))
            fail_msg("%s after %s (%lld left): token %d (%.*s) %s by the mask, not by feeding",
                     what, mc->prefix, (long long)mc->left, t,
                     (int)(len < sizeof piece ? len : sizeof piece), piece,
                     bit(mask, t) ? "allowed" : "refused");
    }
    assert_int_equal(allowed, ones);
    printf("%s after %s (%lld left): %d allowed, %d checked by feeding\n", what, mc->prefix,
           (long long)mc->left, allowed, checked);
    eng_constraint_free(c);
    eng_grammar_free(g);
}

/* States that nearly every character keeps (inside `.*`, a GBNF string
 * refusing 0x7F): their lists are the plain-token mask less the tokens
 * holding a refused character. The mask, with the budget far and near and
 * the length bounded or not, agrees token by token with feeding: every
 * token holding 0x7F or a character that starts with 0xE2 (U+2028 and
 * U+2029 are refused by `.`) and every 37th other token. Under ASan (a
 * fresh constraint per token costs about 10 ms there) every 4th such token
 * and every 997th other one. */
#ifdef __SANITIZE_ADDRESS__
#define WHOLE_ODD_STRIDE 4
#define WHOLE_STRIDE 997
#else
#define WHOLE_ODD_STRIDE 1
#define WHOLE_STRIDE 37
#endif

/* count[0]: the odd tokens seen */
static bool pick_whole(int32_t t, const char *piece, size_t len, size_t cap, int32_t count[2])
{
    size_t have = len < cap ? len : cap;
    bool odd = memchr(piece, 0x7F, have) || memchr(piece, 0xE2, have);
    return odd ? count[0]++ % WHOLE_ODD_STRIDE == 0 : t % WHOLE_STRIDE == 0;
}

static void test_qwen2_whole_states(void **state)
{
    (void)state;
    qwen2_vocab q;
    if (!qwen2_open(&q))
        return;
    static const mask_case cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^/.*$\"}", NULL, "\"/", 1000},
        {"{\"type\":\"string\",\"pattern\":\"^/.*$\"}", NULL, "\"/ab", 4},
        {"{\"type\":\"string\",\"pattern\":\"^/.*$\",\"maxLength\":12}", NULL, "\"/x", 1000},
        {NULL, "root ::= \"\\\"\" [^\"\\\\\\x7F\\x00-\\x1F]* \"\\\"\"", "\"ab", 1000},
        {NULL, "root ::= \"\\\"\" [^\"\\\\\\x7F\\x00-\\x1F]* \"\\\"\"", "\"ab", 3},
    };
    uint32_t *mask = sw_calloc(((size_t)eng_cs_vocab_n_tokens(q.v) + 31) / 32, sizeof *mask);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_mask_case(&q, mask, &cases[i], pick_whole);
    sw_free(mask);
    qwen2_close(&q);
}

/* Whether the token's bytes are all label-key characters ([A-Za-z0-9._/-]). */
static bool key_class_only(const char *piece, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char ch = piece[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-' || ch == '/'))
            return false;
    }
    return len > 0;
}

/* States whose lists are built by the scan of the flat plain trie (not
 * whole: every character moves the automaton on), and strings whose
 * length bound is near (plain tokens by code points, the short ones from
 * masks, the long ones from a list): the mask agrees token by token with
 * feeding. The label-key pattern of Kubernetes maps counts up to 63 per
 * part, so a key after 0, 30, 61 and 62 characters, after its '/', and in
 * its second part only, and with the budget near; strings with maxLength
 * near, with minLength and the budget near, and a whole state with
 * maxLength and the budget near (the GBNF lists' undecided entries are
 * judged by test_generate). Checked: every token of 17 or more bytes
 * (past the per-count masks, near the counts' ends), every 5th made of key
 * characters, every 61st other one (under ASan, where a fresh constraint
 * per token costs about 10 ms: every 16th, 100th and 2003rd). */
#ifdef __SANITIZE_ADDRESS__
#define LIST_LONG_STRIDE 16
#define LIST_KEY_STRIDE 100
#define LIST_STRIDE 2003
#else
#define LIST_LONG_STRIDE 1
#define LIST_KEY_STRIDE 5
#define LIST_STRIDE 61
#endif

/* count[0]: the long tokens seen, count[1]: the key-character ones */
static bool pick_list(int32_t t, const char *piece, size_t len, size_t cap, int32_t count[2])
{
    if (len >= 17 && len <= cap)
        return count[0]++ % LIST_LONG_STRIDE == 0;
    if (key_class_only(piece, len < cap ? len : 0))
        return count[1]++ % LIST_KEY_STRIDE == 0;
    return t % LIST_STRIDE == 0;
}

static void test_qwen2_list_states(void **state)
{
    (void)state;
    qwen2_vocab q;
    if (!qwen2_open(&q))
        return;
    static const char *const key_map =
        "{\"type\":\"object\",\"propertyNames\":{\"pattern\":"
        "\"^([a-z0-9.-]{1,63}/)?[A-Za-z0-9._-]{1,63}$\"},"
        "\"additionalProperties\":{\"type\":\"string\",\"maxLength\":63}}";
    char key30[64], key61[80], key62[80];
    snprintf(key30, sizeof key30, "{\"%.30s", "abcdefghijklmnopqrstuvwxyz0123456789");
    snprintf(key61, sizeof key61, "{\"%.61s", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    snprintf(key62, sizeof key62, "{\"%.62s", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    const mask_case cases[] = {
        {key_map, NULL, "{\"", 1000},
        {key_map, NULL, key30, 1000},
        {key_map, NULL, key61, 1000},
        {key_map, NULL, key62, 1000},
        {key_map, NULL, "{\"app.k8s.io/", 1000},
        {key_map, NULL, "{\"Ab", 1000},
        {key_map, NULL, "{\"ab", 5},
        {"{\"type\":\"string\",\"maxLength\":20}", NULL, "\"abc", 1000},
        {"{\"type\":\"string\",\"minLength\":10,\"maxLength\":40}", NULL, "\"ab", 6},
        {"{\"type\":\"string\",\"pattern\":\"^/.*$\",\"maxLength\":40}", NULL, "\"/x", 10},
    };
    uint32_t *mask = sw_calloc(((size_t)eng_cs_vocab_n_tokens(q.v) + 31) / 32, sizeof *mask);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_mask_case(&q, mask, &cases[i], pick_list);
    sw_free(mask);
    qwen2_close(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_feed),
        cmocka_unit_test(test_generate),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen2_whole_states),
        cmocka_unit_test(test_qwen2_list_states),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
