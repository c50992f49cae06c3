/* test_json_schema_generate.c - seeded generation under JSON schemas on the
 * random test models, judged by an independent validator.
 *
 * A model made by `spillway model make` (preset tiny; the full sweep adds
 * qwen3-tiny) samples at temperature 1 with top-k, top-p and min-p off, so
 * it writes whatever the constraint allows. Every schema of the JSON Schema
 * Test Suite (../shared/jsonschema-test-suite, drafts 2020-12 and 7) that
 * compiles, and every fixture of tests/data/schemas (what zod 4 and
 * pydantic 2 emit for typical models), is generated under with fixed seeds
 * through eng_generate with the constraint: the loop the worker's batched
 * decode shares (eng_constraint_sample: mask, one sampler draw, feed), in
 * process for speed. Every generation must end complete within its budget,
 * and every output must validate with python3-jsonschema
 * (tests/jsonschema_check.py, Debian's python3-jsonschema preferred).
 *
 * By default each suite group gets three seeded generations and each
 * fixture sixteen, on the tiny model: seconds. SPILLWAY_SCHEMA_GEN_FULL=1
 * runs the full sweep: 16 seeds per group, 64 per fixture, on both models.
 * Counts per draft and file are printed (ctest -R test_json_schema_generate -V).
 */
#include "testutil.h"
#include "schema_check.h"

#include "common/alloc.h"
#include "common/error.h"
#include "grammar/constrain.h"
#include "engine/generate.h"
#include "grammar/json_schema.h"
#include "engine/model.h"
#include "modelgen/model_make.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_GEN_TOKENS 1024
#define N_CTX 1536

typedef struct gen_model {
    const char *preset;
    char path[512];
    eng_model *model;
    eng_context *ctx;
    const eng_tokenizer *tok;
    eng_cs_vocab *vocab;
    int32_t *prompt;
    size_t n_prompt;
} gen_model;

typedef struct gen_counts {
    int groups, compiled, outputs, failures;
} gen_counts;

static bool g_full;
static json_t *g_records;

static void model_open(gen_model *m, const char *preset)
{
    memset(m, 0, sizeof *m);
    m->preset = preset;
    eng_model_make_params p;
    assert_int_equal(eng_model_make_preset(preset, &p), SW_OK);
    char name[64];
    snprintf(name, sizeof name, "schema-gen-%s.gguf", preset);
    snprintf(m->path, sizeof m->path, "%s", tu_tmp_path(name));
    sw_error err;
    if (eng_model_make(&p, m->path, &err) != SW_OK)
        fail_msg("model make %s: %s", preset, err.message);
    if (eng_model_load(m->path, &m->model, &err) != SW_OK)
        fail_msg("load %s: %s", preset, err.message);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = N_CTX;
    cp.n_seq_max = 1;
    cp.n_threads = 1;
    if (eng_context_create(m->model, &cp, &m->ctx, &err) != SW_OK)
        fail_msg("context %s: %s", preset, err.message);
    m->tok = eng_model_tokenizer(m->model);
    if (eng_cs_vocab_create(m->tok, &m->vocab, &err) != SW_OK)
        fail_msg("vocab %s: %s", preset, err.message);
    const char *text = "The answer as JSON:";
    m->n_prompt = tu_tokenize(m->tok, text, strlen(text), eng_tokenizer_add_bos(m->tok), false,
                              &m->prompt);
}

static void model_close(gen_model *m)
{
    sw_free(m->prompt);
    eng_cs_vocab_free(m->vocab);
    eng_context_free(m->ctx);
    eng_model_free(m->model);
    remove(m->path);
}

typedef struct collected {
    int32_t tokens[MAX_GEN_TOKENS];
    int32_t n;
} collected;

static bool collect(void *user, const eng_generate_step *step)
{
    collected *c = user;
    if (c->n < MAX_GEN_TOKENS)
        c->tokens[c->n++] = step->token;
    return true;
}

static uint64_t fnv(const char *a, const char *b)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *s = a; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    for (const char *s = b; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* n_seeds generations under g; each output appended to outputs. Returns
 * the number of failed generations (printed). */
static int generate_under(gen_model *m, const eng_grammar *g, const json_t *schema,
                          const char *file, const char *group, int n_seeds, json_t *outputs)
{
    int failures = 0;
    int64_t need = eng_grammar_min_bytes(g);
    int64_t room = N_CTX - (int64_t)m->n_prompt;
    if (room > MAX_GEN_TOKENS)
        room = MAX_GEN_TOKENS;
    if (need + 8 > room) {
        print_message("  (%s / %s: the shortest value, %lld bytes, does not fit; not generated)\n",
                      file, group, (long long)need);
        return 0;
    }
    int64_t max_tokens = need + 96 < room ? need + 96 : room;
    for (int s = 0; s < n_seeds; s++) {
        eng_constraint *c = NULL;
        sw_error err;
        assert_int_equal(eng_constraint_create(g, m->vocab, &c, &err), SW_OK);
        eng_generate_params gp = eng_generate_default_params();
        gp.max_tokens = (int32_t)max_tokens;
        gp.sampling.temperature = 1.0f;
        gp.sampling.top_k = 0;
        gp.sampling.top_p = 1.0f;
        gp.sampling.min_p = 0.0f;
        gp.sampling.seed = fnv(file, group) + (uint64_t)s;
        gp.constraint = c;
        collected got = {.n = 0};
        eng_generate_stats stats;
        int rc = eng_generate(m->ctx, m->prompt, (int32_t)m->n_prompt, &gp, collect, &got, &stats,
                              &err);
        size_t len = 0;
        char *text = eng_detokenize_ex(m->tok, got.tokens, (size_t)got.n, false, &len);
        assert_non_null(text);
        if (rc != SW_OK || !eng_constraint_is_complete(c)) {
            print_message("FAIL %s %s / %s seed %d: %s after %d tokens: \"%.200s\"\n", m->preset,
                          file, group, s, rc != SW_OK ? err.message : "incomplete", got.n, text);
            failures++;
        } else {
            json_array_append_new(outputs, json_stringn(text, len));
            /* the engine's own validator too, where jansson reads the text
             * (not past 64-bit integers) and the validator judges */
            json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            if (v && eng_json_validate(schema, v, &err) == SW_EINVAL) {
                print_message("FAIL %s %s / %s seed %d: eng_json_validate refuses \"%.200s\": "
                              "%s\n",
                              m->preset, file, group, s, text, err.message);
                failures++;
            }
            json_decref(v);
        }
        sw_free(text);
        eng_constraint_free(c);
    }
    return failures;
}

static void run_draft(gen_model *m, const char *draft, int *failures)
{
    json_t *files = sc_suite_load(draft);
    if (!files)
        return;
    bool draft7 = strcmp(draft, "draft7") == 0;
    int seeds = g_full ? 16 : 3;
    gen_counts total = {0};
    print_message("%s on %s, %d seed(s) per group: per file: groups compiled/all, outputs, "
                  "failed generations\n",
                  draft, m->preset, seeds);
    size_t i;
    json_t *entry;
    json_array_foreach (files, i, entry) {
        const char *name = json_string_value(json_object_get(entry, "name"));
        const json_t *root = json_object_get(entry, "groups");
        char file[300];
        snprintf(file, sizeof file, "%s/%s", draft, name);
        gen_counts k = {0};
        for (size_t gi = 0; gi < json_array_size(root); gi++) {
            const json_t *group = json_array_get(root, gi);
            const char *gdesc = json_string_value(json_object_get(group, "description"));
            json_t *schema = json_deep_copy(json_object_get(group, "schema"));
            if (draft7 && json_is_object(schema) && !json_object_get(schema, "$schema"))
                json_object_set_new(schema, "$schema",
                                    json_string("http://json-schema.org/draft-07/schema#"));
            k.groups++;
            eng_grammar *g = NULL;
            sw_error err;
            if (eng_grammar_from_schema(schema, &g, &err) == SW_OK) {
                k.compiled++;
                json_t *rec = sc_record(file, gdesc, schema);
                json_object_set(rec, "tests", json_object_get(group, "tests"));
                k.failures += generate_under(m, g, schema, file, gdesc, seeds, sc_outputs(rec));
                k.outputs += (int)json_array_size(sc_outputs(rec));
                json_array_append_new(g_records, rec);
                eng_grammar_free(g);
            }
            json_decref(schema);
        }
        print_message("  %-28s %3d/%-3d %4d %d\n", name, k.compiled, k.groups, k.outputs,
                      k.failures);
        total.groups += k.groups;
        total.compiled += k.compiled;
        total.outputs += k.outputs;
        total.failures += k.failures;
    }
    json_decref(files);
    print_message("  %-28s %3d/%-3d %4d %d\n", "TOTAL", total.compiled, total.groups,
                  total.outputs, total.failures);
    *failures += total.failures;
}

/* Fixtures the compiler refuses today, with the words its typed error must
 * hold: a fixture listed here that compiles fails the test (update the
 * table), as does one refused with another message. */
typedef struct refused_fixture {
    const char *file;
    const char *words;
    const char *why;
} refused_fixture;

static const refused_fixture g_refused[] = {
    {NULL, NULL, NULL}, /* none today */
};

static const refused_fixture *refused(const char *file)
{
    for (size_t i = 0; i < sizeof g_refused / sizeof *g_refused; i++)
        if (g_refused[i].file && strcmp(g_refused[i].file, file) == 0)
            return &g_refused[i];
    return NULL;
}

static void run_fixtures(gen_model *m, int *failures)
{
    json_t *fixtures = sc_fixtures_load();
    if (!fixtures)
        return;
    int seeds = g_full ? 64 : 16;
    print_message("fixtures (tests/data/schemas) on %s, %d seeds each: outputs, failed "
                  "generations\n",
                  m->preset, seeds);
    for (size_t i = 0; i < json_array_size(fixtures); i++) {
        const json_t *f = json_array_get(fixtures, i);
        const char *name = json_string_value(json_object_get(f, "file"));
        json_t *schema = json_object_get(f, "schema");
        eng_grammar *g = NULL;
        sw_error err;
        int rc = eng_grammar_from_schema(schema, &g, &err);
        const refused_fixture *r = refused(name);
        if (r && rc == SW_EUNSUPPORTED && strstr(err.message, r->words)) {
            print_message("  %-28s refused, as listed (%s): %s\n", name, r->why, err.message);
            continue;
        }
        if (r && rc == SW_OK) {
            print_message("FAIL fixture %s compiles: take it out of g_refused\n", name);
            (*failures)++;
            eng_grammar_free(g);
            continue;
        }
        if (rc != SW_OK) {
            print_message("FAIL fixture %s does not compile: %s\n", name, err.message);
            (*failures)++;
            continue;
        }
        char file[300];
        snprintf(file, sizeof file, "fixtures/%s", name);
        json_t *rec = sc_record(file, name, schema);
        int bad = generate_under(m, g, schema, file, name, seeds, sc_outputs(rec));
        print_message("  %-28s %4zu %d\n", name, json_array_size(sc_outputs(rec)), bad);
        *failures += bad;
        json_array_append_new(g_records, rec);
        eng_grammar_free(g);
    }
    json_decref(fixtures);
}

static void test_generate(void **state)
{
    (void)state;
    const char *full = getenv("SPILLWAY_SCHEMA_GEN_FULL");
    g_full = full && *full && strcmp(full, "0") != 0;
    if (!tu_shared_path("jsonschema-test-suite/tests"))
        return;
    static const char *const presets[] = {"tiny", "qwen3-tiny"};
    int n_models = g_full ? 2 : 1, failures = 0;
    g_records = json_array();
    for (int i = 0; i < n_models; i++) {
        gen_model m;
        model_open(&m, presets[i]);
        double t0 = eng_now_seconds();
        run_draft(&m, "draft2020-12", &failures);
        run_draft(&m, "draft7", &failures);
        run_fixtures(&m, &failures);
        print_message("%s: generated in %.1f s\n", presets[i], eng_now_seconds() - t0);
        model_close(&m);
    }
    if (sc_check(g_records, "schema-gen") > 0)
        failures++;
    json_decref(g_records);
    g_records = NULL;
    if (failures)
        fail_msg("%d failures (listed above)", failures);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
