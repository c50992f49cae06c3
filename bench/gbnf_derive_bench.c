/* gbnf_derive_bench.c - bench/gbnf-derive.sh's program: the time to write
 * a schema as GBNF (eng_grammar_to_gbnf) and to advance a grammar over a
 * text (eng_gbnf_derive), which a resume on llama-server pays twice (the
 * replay table's check, then the request). Prints figures; asserts
 * nothing.
 *
 *   gbnf_derive_bench SCHEMA_FILE
 */
#define _POSIX_C_SOURCE 200809L

#include "common/alloc.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "gbnf_testdata.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* A JSON text of about n bytes: {"items":[{...},...]}, with spaces after
 * ':' and ',' when spaced. */
static size_t json_text(char *out, size_t cap, size_t n, bool spaced)
{
    const char *sep = spaced ? ", " : ",", *colon = spaced ? ": " : ":";
    size_t len = (size_t)snprintf(out, cap, "{\"items\"%s[", colon);
    for (int i = 0; len + 200 < cap && len < n; i++)
        len += (size_t)snprintf(out + len, cap - len,
                                "%s{\"id\"%s%d%s\"name\"%s\"item %d\"%s\"tags\"%s[\"a\"%s\"b\"]%s\"ok\"%strue}",
                                i ? sep : "", colon, i, sep, colon, i, sep, colon, sep, sep, colon);
    return len;
}

/* The least time of 5 derivatives of g by text. */
static void derive_row(const char *what, const eng_gbnf *g, const char *text, size_t len)
{
    double best = 1e30;
    size_t out_len = 0;
    int rc = 0;
    for (int r = 0; r < 5; r++) {
        char *out = NULL;
        sw_error err;
        double t0 = now_ms();
        rc = eng_gbnf_derive(g, text, len, &out, &err);
        double t = now_ms() - t0;
        best = t < best ? t : best;
        out_len = out ? strlen(out) : 0;
        sw_free(out);
    }
    printf("  %-34s %7zu bytes of text: %8.3f ms (rc %d, %zu bytes of grammar)\n", what, len, best,
           rc, out_len);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCHEMA_FILE\n", argv[0]);
        return 2;
    }
    static char text[1 << 20];
    sw_error err;
    json_t *schema = json_load_file(argv[1], 0, NULL);
    eng_grammar *g = NULL;
    if (!schema || eng_grammar_from_schema(schema, &g, &err)) {
        fprintf(stderr, "%s: %s\n", argv[1], schema ? err.message : "does not load");
        return 1;
    }
    char *form = NULL;
    double best = 1e30;
    int rc = 0;
    for (int r = 0; r < 5; r++) {
        sw_free(form);
        form = NULL;
        double t0 = now_ms();
        rc = eng_grammar_to_gbnf(g, &form, &err);
        double t = now_ms() - t0;
        best = t < best ? t : best;
    }
    eng_gbnf *fg = NULL;
    if (rc == SW_OK && eng_gbnf_parse(form, strlen(form), &fg, &err) == SW_OK)
        printf("%s as GBNF: %zu bytes, %d rules, %.3f ms\n", argv[1], strlen(form),
               (int)eng_gbnf_n_rules(fg), best);
    else
        printf("%s as GBNF: refused after %.3f ms (%s)\n", argv[1], best, err.message);
    eng_gbnf_free(fg);
    sw_free(form);
    eng_grammar_free(g);
    json_decref(schema);

    /* the derivative: llama.cpp's json.gbnf shape (spaces allowed) and a
     * schema's compact form, over texts of growing length */
    eng_gbnf *jg = NULL;
    eng_gbnf_parse(tu_gbnf_json, strlen(tu_gbnf_json), &jg, &err);
    json_t *items = json_loads(
        "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"type\":"
        "\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":0},\"name\":{\"type\":"
        "\"string\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"ok\":{\"type\":"
        "\"boolean\"}},\"required\":[\"id\",\"name\",\"tags\",\"ok\"]}}},\"required\":[\"items\"]}",
        0, NULL);
    eng_grammar *ig = NULL;
    char *iform = NULL;
    eng_gbnf *isg = NULL;
    if (eng_grammar_from_schema(items, &ig, &err) || eng_grammar_to_gbnf(ig, &iform, &err) ||
        eng_gbnf_parse(iform, strlen(iform), &isg, &err)) {
        fprintf(stderr, "the items schema: %s\n", err.message);
        return 1;
    }
    printf("the derivative (least of 5):\n");
    for (size_t n = 1000; n <= 64000; n *= 4) {
        size_t len = json_text(text, sizeof text, n, true);
        derive_row("json.gbnf (spaces allowed)", jg, text, len);
        len = json_text(text, sizeof text, n, false);
        derive_row("the items schema's form (compact)", isg, text, len);
    }
    eng_gbnf_free(jg);
    eng_gbnf_free(isg);
    sw_free(iform);
    eng_grammar_free(ig);
    json_decref(items);
    return 0;
}
