/* test_json_validate.c - eng_json_validate, the schema check the router
 * applies to a model's tool-call arguments before calling the tool.
 *
 * Each case is a schema, a value and the verdict JSON Schema (draft
 * 2020-12, the validation vocabulary) gives for it, written from the
 * specification's wording, not from the code: valid, invalid (with the
 * JSON pointer of the offending value in the message), or outside the
 * supported subset (the value is not judged); and a schema nested past
 * the bound is refused rather than recursed into.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "grammar/json_schema.h"

#include <jansson.h>
#include <string.h>

typedef struct vcase {
    const char *schema, *value;
    int want;            /* SW_OK, SW_EINVAL or SW_EUNSUPPORTED */
    const char *where;   /* for SW_EINVAL: a text the message must hold */
} vcase;

static const vcase g_cases[] = {
    /* type */
    {"{\"type\":\"object\"}", "{}", SW_OK, NULL},
    {"{\"type\":\"object\"}", "[]", SW_EINVAL, "(at #)"},
    {"{\"type\":\"integer\"}", "3", SW_OK, NULL},
    {"{\"type\":\"integer\"}", "3.0", SW_OK, NULL}, /* a whole number is an integer */
    {"{\"type\":\"integer\"}", "3.5", SW_EINVAL, "(at #)"},
    {"{\"type\":\"number\"}", "12345678901234567890.25", SW_OK, NULL},
    {"{\"type\":[\"string\",\"null\"]}", "null", SW_OK, NULL},
    {"{\"type\":[\"string\",\"null\"]}", "true", SW_EINVAL, "(at #)"},
    {"{\"type\":\"boolean\"}", "false", SW_OK, NULL},
    /* properties, required, additionalProperties; order is free */
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":"
     "\"integer\"}},\"required\":[\"a\"]}",
     "{\"b\":2,\"a\":\"x\"}", SW_OK, NULL},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}",
     "{\"b\":2}", SW_EINVAL, "'a' is missing"},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}", "{\"a\":1}", SW_EINVAL,
     "(at #/a)"},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}", "{\"z\":1}", SW_OK,
     NULL},
    {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":false}",
     "{\"a\":1,\"z\":1}", SW_EINVAL, "(at #/z)"},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
     "{\"p\":1,\"q/r\":\"s\"}", SW_EINVAL, "(at #/q~1r)"},
    /* strings: lengths in code points */
    {"{\"type\":\"string\",\"maxLength\":2}", "\"\xc3\xa9\xc3\xa9\"", SW_OK, NULL},
    {"{\"type\":\"string\",\"maxLength\":2}", "\"abc\"", SW_EINVAL, "maxLength"},
    {"{\"type\":\"string\",\"minLength\":2}", "\"a\"", SW_EINVAL, "minLength"},
    {"{\"maxLength\":1}", "12345", SW_OK, NULL}, /* applies to strings only */
    /* arrays */
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":3}", "[1,2,\"x\"]",
     SW_EINVAL, "(at #/2)"},
    {"{\"type\":\"array\",\"minItems\":2}", "[1]", SW_EINVAL, "(at #)"},
    {"{\"type\":\"array\",\"maxItems\":1}", "[1,2]", SW_EINVAL, "(at #)"},
    /* enum, const: 1 and 1.0 are equal */
    {"{\"enum\":[\"a\",1,{\"k\":[1]}]}", "{\"k\":[1.0]}", SW_OK, NULL},
    {"{\"enum\":[\"a\",1]}", "\"b\"", SW_EINVAL, "enum"},
    {"{\"const\":2}", "2.0", SW_OK, NULL},
    {"{\"const\":2}", "3", SW_EINVAL, "const"},
    /* anyOf, oneOf */
    {"{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "7", SW_OK, NULL},
    {"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "[]", SW_EINVAL, "none"},
    /* nested */
    {"{\"type\":\"object\",\"properties\":{\"l\":{\"type\":\"array\",\"items\":{\"type\":"
     "\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"]}}}}",
     "{\"l\":[{\"n\":1},{\"m\":2}]}", SW_EINVAL, "(at #/l/1)"},
    /* true / false schemas */
    {"true", "[1,{\"a\":null}]", SW_OK, NULL},
    {"{\"type\":\"object\",\"properties\":{\"a\":false}}", "{\"a\":1}", SW_EINVAL, "(at #/a)"},
    /* outside the subset: not judged */
    {"{\"type\":\"string\",\"pattern\":\"^a\"}", "\"b\"", SW_EINVAL, "'pattern' (at #)"},
    {"{\"type\":\"string\",\"pattern\":\"^a\"}", "\"ab\"", SW_OK, NULL},
    {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "\"aa\"", SW_EUNSUPPORTED, NULL},
    {"{\"type\":\"string\",\"format\":\"email\"}", "\"b\"", SW_EINVAL, "'format' (at #)"},
    {"{\"type\":\"string\",\"format\":\"email\"}", "\"a@b.c\"", SW_OK, NULL},
    {"{\"format\":\"date\"}", "12", SW_OK, NULL}, /* formats constrain strings only */
    {"{\"format\":\"hostname\"}", "\"a.b\"", SW_OK, NULL},
    {"{\"type\":\"string\",\"format\":\"idn-hostname\"}", "\"b\"", SW_EUNSUPPORTED, NULL},
    {"{\"type\":\"string\",\"format\":\"x-custom\"}", "\"b\"", SW_OK, NULL}, /* annotation */
    {"{\"$ref\":\"https://example.com/s.json\"}", "1", SW_EUNSUPPORTED, NULL},
    /* a required name holding U+0000 is no key an object can have */
    {"{\"required\":[\"a\\u0000\"]}", "{\"a\":1}", SW_EINVAL, "missing"},
    {"{\"dependentRequired\":{\"b\":[\"a\\u0000\"]}}", "{\"a\":1,\"b\":2}", SW_EINVAL,
     "missing"},
    /* judged exactly */
    {"{\"type\":\"integer\",\"minimum\":3}", "1", SW_EINVAL, "minimum"},
    {"{\"type\":\"integer\",\"exclusiveMaximum\":3}", "3", SW_EINVAL, "maximum"},
    {"{\"type\":\"array\",\"uniqueItems\":true}", "[1,1.0]", SW_EINVAL, "unique"},
    {"{\"oneOf\":[{\"type\":\"integer\"},{\"minimum\":2}]}", "3", SW_EINVAL, "more than one"},
    {"{\"not\":{\"type\":\"string\"}}", "\"s\"", SW_EINVAL, "not"},
    {"{\"$defs\":{\"n\":{\"type\":\"integer\"}},\"properties\":{\"a\":{\"$ref\":"
     "\"#/$defs/n\"}}}", "{\"a\":\"x\"}", SW_EINVAL, "(at #/a)"},
    {"{\"allOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}", "{\"a\":1}", SW_EINVAL,
     "'b'"},
    {"{\"x-vendor\":1,\"id\":\"s\",\"type\":\"integer\"}", "1", SW_OK, NULL},
    {"{\"type\":\"frobnicate\"}", "1", SW_EUNSUPPORTED, NULL},
    /* items as an array: a tuple (draft 7's meaning) */
    {"{\"type\":\"array\",\"items\":[{\"type\":\"integer\"}]}", "[1,\"x\"]", SW_OK, NULL},
    {"{\"type\":\"array\",\"items\":[{\"type\":\"integer\"}]}", "[\"x\"]", SW_EINVAL, "#/0"},
    /* if: only with then or else, whatever its value without them (the
     * compiler ignores such an if too; fuzz_json_schema found the two
     * disagreeing on {"if":"number"}) */
    {"{\"if\":\"number\"}", "0", SW_OK, NULL},
    {"{\"if\":{\"type\":\"integer\"},\"then\":{\"minimum\":5}}", "3", SW_EINVAL, "minimum"},
    {"{\"if\":{\"type\":\"integer\"},\"else\":{\"type\":\"string\"}}", "true", SW_EINVAL,
     "(at #)"},
    /* ignored annotations */
    {"{\"type\":\"string\",\"description\":\"d\",\"title\":\"t\",\"default\":\"x\"}", "\"y\"",
     SW_OK, NULL},
};

static void test_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++) {
        const vcase *c = &g_cases[i];
        json_t *s = json_loads(c->schema, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        json_t *v = json_loads(c->value, JSON_DECODE_ANY, NULL);
        assert_non_null(s);
        assert_non_null(v);
        sw_error err;
        sw_error_clear(&err);
        int rc = eng_json_validate(s, v, &err);
        if (rc != c->want)
            fail_msg("case %zu: schema %s value %s: got %d (%s), want %d", i, c->schema, c->value,
                     rc, err.message, c->want);
        if (c->where && !strstr(err.message, c->where))
            fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err.message, c->where);
        json_decref(s);
        json_decref(v);
    }
}

/* A deeply nested schema is refused as unsupported, not recursed into
 * without bound. */
static void test_deep_schema(void **state)
{
    (void)state;
    char s[4096] = "", v[1024] = "";
    for (int i = 0; i < 80; i++)
        strcat(s, "{\"type\":\"array\",\"items\":");
    strcat(s, "true");
    for (int i = 0; i < 80; i++)
        strcat(s, "}");
    for (int i = 0; i < 80; i++)
        strcat(v, "[");
    for (int i = 0; i < 80; i++)
        strcat(v, "]");
    json_t *sj = json_loads(s, 0, NULL), *vj = json_loads(v, 0, NULL);
    assert_non_null(sj);
    assert_non_null(vj);
    assert_int_equal(eng_json_validate(sj, vj, NULL), SW_EUNSUPPORTED);
    json_decref(sj);
    json_decref(vj);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_deep_schema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
