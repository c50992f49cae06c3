/* fuzz_json_schema.c - libFuzzer harness for the JSON-schema compiler and
 * the constraint automaton (public API only: json_schema.h, constrain.h).
 *
 * Input: a mode byte, a schema (JSON), a NUL byte, then candidate bytes.
 * Mode 0 compiles the schema (eng_grammar_from_schema), mode 1 makes the
 * tool-call grammar of one or two tools: "f" with the schema as its
 * parameters and "g" (when there are two) with a fixed small schema, so
 * that the input's schema is compiled once; mode 2 is response_format
 * json_object (the schema is ignored). The automaton then runs over the
 * candidate bytes (a refused byte is skipped) on a vocabulary of the 256
 * single bytes, some multi-byte pieces and one end token, and afterwards
 * completes the value under the tightest budget it allows.
 *
 * Invariants: a compile error is typed and says why; fz_cs_run's
 * (fuzzlib.h): the mask agrees with feeding (a byte is allowed exactly
 * when it is accepted; checked on a bounded sample of the states, a mask
 * being costly: fuzzlib.h) and allows no byte that feeding refuses;
 * complete exactly when the shortest completion is 0 bytes, the end token
 * allowed exactly when complete; whatever the automaton accepts as
 * complete parses as JSON (jansson) and validates with eng_json_validate
 * against the schema (a tool call: a known name and arguments that
 * validate against that tool's schema); with a budget of exactly the
 * shortest completion, some token is always allowed and every step
 * shrinks that completion by at least one byte, so the value always
 * completes in time. The grammar's GBNF form (eng_grammar_to_gbnf) is
 * typed when refused and otherwise parses, and (short values) accepts
 * every complete value the automaton accepts.
 *
 * Bounded for speed (docs/operations.md, Fuzzing): the fuzz build caps a
 * pattern at 2048 DFA states, 32768 NFA states and 2^22 subset-construction
 * steps (not 8192, 200000 and 2^25), so a larger one is the typed
 * SW_ERANGE, and scripts/fuzz-run.sh gives inputs of at most 1024 bytes.
 */
#include "grammar/constrain.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"

#include "fuzzlib.h"

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_CANDIDATE 512
#define FZ_MAX_COMPLETION 2048

static const char *const fz_multi[] = {
    "{\"", "\":", "\",\"", "\"}", "},", "[]", "{}", "true", "false", "null", "12", "-0.5",
    "\\n", "\\\"", "ab", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x8E\x89", "name", "\"arguments\":",
};
#define FZ_N_MULTI (sizeof fz_multi / sizeof fz_multi[0])
#define FZ_N_TOKENS ((int32_t)(256 + FZ_N_MULTI + 1))
#define FZ_END_ID (FZ_N_TOKENS - 1)

static const eng_cs_vocab *fz_vocab(void)
{
    return fz_byte_vocab(fz_multi, (int32_t)FZ_N_MULTI);
}

typedef struct fz_run {
    int mode;
    json_t *schema, *g_schema; /* tool "f"'s and tool "g"'s (mode 1) */
    eng_gbnf *gbnf;            /* the grammar's GBNF form, when it has one */
    fz_cs_walk w;
    char text[FZ_MAX_CANDIDATE + FZ_MAX_COMPLETION * 16]; /* a piece is at most 16 bytes */
    uint32_t mask[(FZ_N_TOKENS + 31) / 32];
} fz_run;

/* The text so far is a complete value: it must be JSON that validates. */
static void check_value(const fz_cs_walk *w)
{
    const fz_run *r = w->user;
    json_error_t jerr;
    sw_error err;
    /* a string may hold \u0000, which the schema allows: JSON_ALLOW_NUL */
    json_t *value = json_loadb(w->text, w->len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    FZ_CHECK(value != NULL);
    if (r->mode == 0) {
        FZ_CHECK(eng_json_validate(r->schema, value, &err) == SW_OK);
    } else if (r->mode == 1) {
        const char *name = json_string_value(json_object_get(value, "name"));
        json_t *args = json_object_get(value, "arguments");
        FZ_CHECK(json_is_object(value) && json_object_size(value) == 2 && name && args);
        FZ_CHECK(!strcmp(name, "f") || (!strcmp(name, "g") && r->g_schema));
        FZ_CHECK(eng_json_validate(!strcmp(name, "f") ? r->schema : r->g_schema, args, &err) ==
                 SW_OK);
    } else {
        FZ_CHECK(json_is_object(value));
    }
    /* the matcher's memory is rules x bytes^2 bits: short values only */
    if (r->gbnf && w->len <= 48 && eng_gbnf_n_rules(r->gbnf) <= 512)
        FZ_CHECK(eng_gbnf_match(r->gbnf, w->text, w->len));
    json_decref(value);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fz_run r;
    const eng_cs_vocab *v = fz_vocab();
    if (!v || size < 1)
        return 0;
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    size_t schema_len = nul ? (size_t)(nul - (data + 1)) : size - 1;
    const uint8_t *cand = nul ? nul + 1 : data + size;
    size_t cand_len = (size_t)(data + size - cand);

    memset(&r, 0, sizeof r);
    r.mode = data[0] % 3;
    json_error_t jerr;
    r.schema = r.mode == 2 ? json_pack("{s:s}", "type", "object")
                           : json_loadb((const char *)data + 1, schema_len, JSON_DECODE_ANY, &jerr);
    if (!r.schema)
        return 0;

    eng_grammar *g = NULL;
    sw_error err;
    int rc;
    if (r.mode == 0) {
        rc = eng_grammar_from_schema(r.schema, &g, &err);
    } else if (r.mode == 1) {
        int n_tools = 1 + (data[0] & 4 ? 1 : 0);
        if (n_tools == 2)
            r.g_schema = json_pack("{s:s,s:{s:{s:s}}}", "type", "object", "properties", "k",
                                   "type", "integer");
        if (n_tools == 2 && !r.g_schema) {
            json_decref(r.schema);
            return 0;
        }
        eng_grammar_tool tools[2] = {{"f", r.schema}, {"g", r.g_schema}};
        rc = eng_grammar_tool_call(tools, n_tools, &g, &err);
    } else {
        rc = eng_grammar_json_object(&g, &err);
    }
    if (rc != SW_OK) {
        FZ_CHECK(rc == SW_EUNSUPPORTED || rc == SW_EINVAL || rc == SW_ERANGE || rc == SW_ENOMEM);
        FZ_CHECK(err.code == rc && err.message[0]);
        FZ_CHECK(r.mode != 2 || rc == SW_ENOMEM);
        json_decref(r.g_schema);
        json_decref(r.schema);
        return 0;
    }
    char *gbnf_text = NULL;
    rc = eng_grammar_to_gbnf(g, &gbnf_text, &err);
    if (rc != SW_OK) {
        FZ_CHECK(rc == SW_EUNSUPPORTED || rc == SW_ERANGE || rc == SW_ENOMEM);
        FZ_CHECK(err.code == rc && err.message[0] && !gbnf_text);
    } else {
        rc = eng_gbnf_parse(gbnf_text, strlen(gbnf_text), &r.gbnf, &err);
        FZ_CHECK(rc == SW_OK || rc == SW_ERANGE || rc == SW_ENOMEM);
        sw_free(gbnf_text);
    }
    r.w = (fz_cs_walk){NULL,          fz_multi, FZ_N_TOKENS, FZ_END_ID, r.text, 0,
                       sizeof r.text, r.mask,   check_value, &r};
    if (eng_constraint_create(g, v, &r.w.c, &err) == SW_OK) {
        FZ_CHECK(eng_constraint_min_bytes(r.w.c) == eng_grammar_min_bytes(g));
        fz_cs_run(&r.w, cand, cand_len, FZ_MAX_CANDIDATE, FZ_MAX_COMPLETION);
        eng_constraint_free(r.w.c);
    }
    eng_grammar_free(g);
    eng_gbnf_free(r.gbnf);
    json_decref(r.g_schema);
    json_decref(r.schema);
    return 0;
}
