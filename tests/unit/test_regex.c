/* test_regex.c - the ECMA-262 pattern compiler (src/grammar/regex.c).
 *
 * Verdicts come from three independent places: a hand table written from
 * ECMA-262's wording; regex_cases.h, generated once by Python's re from
 * equivalent Python patterns (tests/unit/gen_regex_cases.py, the table is
 * compiled in: no Python at test time); and the JSON Schema Test Suite's
 * pattern files (../shared/jsonschema-test-suite; skipped when absent),
 * where every pattern that compiles must give the suite's verdict on
 * every string. Then the automaton's own promises: every state step()
 * returns can still reach a match, the completion costs agree with a
 * brute-force search, hostile patterns fail fast with SW_ERANGE, refused
 * constructs give SW_EUNSUPPORTED, and a failed allocation at any point
 * is reported, not crashed on (ASan checks nothing leaks).
 */
#include "testutil.h"

#include "common/alloc.h"
#include "grammar/formats.h"
#include "grammar/regex.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "regex_cases.h"

static bool match_text(const char *pattern, const char *text, size_t len)
{
    eng_regex *re = NULL;
    sw_error err;
    int rc = eng_regex_compile(pattern, strlen(pattern), &re, &err);
    if (rc) {
        print_error("compile /%s/: %s\n", pattern, err.message);
        fail();
    }
    bool m = eng_regex_match(re, text, len);
    eng_regex_free(re);
    return m;
}

/* Written from ECMA-262 (and JSON Schema: no implicit anchors). */
typedef struct hcase {
    const char *pattern, *text;
    bool match;
} hcase;

static const hcase g_hand[] = {
    {"a", "xay", true},           /* not anchored */
    {"a", "xyz", false},
    {"^a", "ba", false},
    {"a$", "ab", false},
    {"^$", "", true},
    {"", "anything", true},
    {"^abc$", "abc", true},
    {"^abc$", "abcd", false},
    {"^[a-c]+$", "abcabc", true},
    {"^[a-c]+$", "abcd", false},
    {"^[^a-c]+$", "xyz", true},
    {"^[^a-c]+$", "xaz", false},
    {"^.$", "\xc3\xa9", true},        /* one code point, two bytes */
    {"^..$", "\xc3\xa9", false},
    {"^.$", "\xf0\x9f\x98\x80", true}, /* U+1F600: one code point, not two */
    {"^.$", "\n", false},
    {"^.$", "\xe2\x80\xa8", false},   /* U+2028 is a line terminator */
    {"^\\d{3}$", "123", true},
    {"^\\d{3}$", "12a", false},
    {"^\\d$", "\xd9\xa3", false},     /* ARABIC-INDIC DIGIT THREE: \d is ASCII */
    {"^\\w+$", "a_Z9", true},
    {"^\\w$", "\xc3\xa9", false},
    {"^\\s$", "\xc2\xa0", true},      /* NBSP is WhiteSpace */
    {"^\\s$", "\xef\xbb\xbf", true},  /* U+FEFF too */
    {"^\\S$", " ", false},
    {"^\\p{L}+$", "Hello\xcf\x80", true}, /* pi is a letter */
    {"^\\p{L}+$", "a1", false},
    {"^\\P{L}+$", "123", true},
    {"^\\p{Letter}$", "\xe4\xb8\xad", true},
    {"^\\p{N}+$", "12\xd9\xa3", true},
    {"^\\u00e9$", "\xc3\xa9", true},
    {"^\\u{1F600}$", "\xf0\x9f\x98\x80", true},
    {"^\\uD83D\\uDE00$", "\xf0\x9f\x98\x80", true},
    {"^\\x41$", "A", true},
    {"^\\t\\n\\r\\f\\v$", "\t\n\r\f\v", true},
    {"^a\\/b$", "a/b", true},
    {"^[\\b]$", "\b", true},          /* \b in a class is backspace */
    {"^(ab)*$", "ababab", true},
    {"^(ab)*$", "aba", false},
    {"^(?:a|bc){2}$", "bca", true},
    {"^(?:a|bc){2}$", "bcbcb", false},
    {"^a{2,4}$", "a", false},
    {"^a{2,4}$", "aaaa", true},
    {"^a{2,4}$", "aaaaa", false},
    {"^a{2,}$", "aaaaaaaa", true},
    {"^a+?$", "aaa", true},            /* lazy matches the same strings */
    {"^(a|ab)(c|bcd)(d*)$", "abcd", true},
    {"[]", "a", false},
    {"[^]", "\n", true},
    {"^[^]*$", "", true},
    {"a^", "a", false},
    {"$a", "a", false},
    {"^$|x", "", true},
    {"^$|x", "y", false},
    {"^[\\d-z]+$", "1-z", true},      /* Annex B: \d, '-' and 'z' */
    {"^[\\d-z]+$", "y", false},
};

static void test_hand(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof g_hand / sizeof g_hand[0]; i++) {
        const hcase *c = &g_hand[i];
        if (!c->text)
            continue;
        bool m = match_text(c->pattern, c->text, strlen(c->text));
        if (m != c->match) {
            print_error("/%s/ on \"%s\": got %d, want %d\n", c->pattern, c->text, m, c->match);
            fail();
        }
    }
}

static void test_python_table(void **state)
{
    (void)state;
    const char *last = NULL;
    eng_regex *re = NULL;
    size_t n = sizeof g_xcases / sizeof g_xcases[0], bad = 0;
    for (size_t i = 0; i < n; i++) {
        const struct regex_xcase *c = &g_xcases[i];
        if (!last || strcmp(last, c->pattern) != 0) {
            eng_regex_free(re);
            sw_error err;
            if (eng_regex_compile(c->pattern, strlen(c->pattern), &re, &err)) {
                print_error("compile /%s/: %s\n", c->pattern, err.message);
                fail();
            }
            last = c->pattern;
        }
        bool m = eng_regex_match(re, c->text, c->text_len);
        if (m != c->match) {
            print_error("/%s/ on \"%.*s\": got %d, Python says %d\n", c->pattern,
                        (int)c->text_len, c->text, m, c->match);
            bad++;
        }
    }
    eng_regex_free(re);
    printf("regex: %zu cross-checked cases, %zu disagree\n", n, bad);
    assert_int_equal(bad, 0);
}

/* ---- the JSON Schema Test Suite ---------------------------------------- */

typedef struct suite_count {
    int compiled, refused, strings, right, wrong;
} suite_count;

static void suite_file(const char *rel, suite_count *cnt, bool require_all)
{
    const char *path = tu_shared_path(rel);
    if (!path)
        return;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &jerr);
    assert_non_null(root);
    size_t gi;
    json_t *group;
    json_array_foreach(root, gi, group) {
        json_t *schema = json_object_get(group, "schema");
        json_t *pat = json_is_object(schema) ? json_object_get(schema, "pattern") : NULL;
        json_t *props = json_is_object(schema) ? json_object_get(schema, "patternProperties")
                                               : NULL;
        /* The patterns of "pattern" and of "patternProperties" keys. */
        const char *pats[16];
        size_t lens[16], n_pats = 0;
        if (json_is_string(pat)) {
            pats[n_pats] = json_string_value(pat);
            lens[n_pats++] = json_string_length(pat);
        }
        const char *key;
        json_t *val;
        if (json_is_object(props))
            json_object_foreach(props, key, val) if (n_pats < 16) {
                pats[n_pats] = key;
                lens[n_pats++] = strlen(key);
            }
        for (size_t p = 0; p < n_pats; p++) {
            eng_regex *re = NULL;
            sw_error err;
            int rc = eng_regex_compile(pats[p], lens[p], &re, &err);
            if (rc) {
                if (rc != SW_EUNSUPPORTED || require_all) {
                    print_error("%s: /%s/: %s\n", rel, pats[p], err.message);
                    fail();
                }
                cnt->refused++;
                continue;
            }
            cnt->compiled++;
            /* Only "pattern" decides a string's validity alone. */
            if (pats[p] == json_string_value(pat)) {
                size_t ti;
                json_t *t;
                json_array_foreach(json_object_get(group, "tests"), ti, t) {
                    json_t *data = json_object_get(t, "data");
                    if (!json_is_string(data))
                        continue;
                    bool want = json_is_true(json_object_get(t, "valid"));
                    bool got = eng_regex_match(re, json_string_value(data),
                                               json_string_length(data));
                    cnt->strings++;
                    if (got == want) {
                        cnt->right++;
                    } else {
                        cnt->wrong++;
                        print_error("%s: /%s/ on \"%s\": got %d, the suite says %d\n", rel,
                                    pats[p], json_string_value(data), got, want);
                    }
                }
            }
            eng_regex_free(re);
        }
    }
    json_decref(root);
}

static void test_suite(void **state)
{
    (void)state;
    static const struct {
        const char *rel;
        bool require_all;
    } files[] = {
        {"jsonschema-test-suite/tests/draft2020-12/pattern.json", false},
        {"jsonschema-test-suite/tests/draft2020-12/patternProperties.json", true},
        {"jsonschema-test-suite/tests/draft2020-12/optional/ecmascript-regex.json", false},
        {"jsonschema-test-suite/tests/draft2020-12/optional/non-bmp-regex.json", true},
        {"jsonschema-test-suite/tests/draft7/pattern.json", false},
        {"jsonschema-test-suite/tests/draft7/optional/ecmascript-regex.json", false},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        suite_count cnt = {0};
        suite_file(files[i].rel, &cnt, files[i].require_all);
        printf("regex suite %s: %d patterns compiled, %d refused; %d/%d strings right\n",
               strrchr(files[i].rel, '/') + 1, cnt.compiled, cnt.refused, cnt.right,
               cnt.strings);
        assert_int_equal(cnt.wrong, 0);
    }
}

/* ---- formats ------------------------------------------------------------ */

/* Valid values the format patterns refuse on purpose (formats.c says
 * why); everything else must get the suite's verdict. */
static const char *const g_format_narrowed[] = {
    "1998-12-31T15:59:60.123-08:00", /* leap second at an offset */
    "1998-12-31T15:59:60.123-08:00",
    "15:59:60-08:00",
    "01:29:60+01:30",
    "23:29:60+23:30",
    "15:59:60-08:00",
    "00:29:60+00:30",
    "22:59:60-01:00",
    "00:29:60-23:30",
};

static bool format_narrowed(const char *s)
{
    for (size_t i = 0; i < sizeof g_format_narrowed / sizeof g_format_narrowed[0]; i++)
        if (strcmp(g_format_narrowed[i], s) == 0)
            return true;
    return false;
}

/* Formats enforced as their ASCII subsets, and hostnames without A-labels
 * ("xn--"): narrowings formats.c explains. */
static bool ascii_only(const char *format)
{
    return strcmp(format, "idn-email") == 0 || strcmp(format, "iri") == 0 ||
           strcmp(format, "iri-reference") == 0;
}

static bool is_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80)
            return false;
    return true;
}

static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((uint8_t)s[i] & 0xC0) != 0x80;
    return c;
}

static void test_formats(void **state)
{
    (void)state;
    static const char *const names[] = {
        "date",  "time",          "date-time",     "duration",     "email",
        "idn-email", "hostname", "ipv4",          "ipv6",         "uuid",
        "uri",   "iri",           "uri-reference", "iri-reference", "json-pointer",
        "relative-json-pointer",
    };
    static const char *const drafts[] = {"draft2020-12", "draft7"};
    int total_wrong = 0;
    const char *dir = tu_shared_path("jsonschema-test-suite/tests");
    if (!dir)
        return;
    char base[512];
    snprintf(base, sizeof base, "%s", dir);
    for (size_t d = 0; d < 2; d++) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            char path[700];
            snprintf(path, sizeof path, "%s/%s/optional/format/%s.json", base, drafts[d],
                     names[i]);
            int32_t max_chars;
            const char *pat = eng_format_pattern(names[i], &max_chars);
            assert_non_null(pat);
            eng_regex *re = NULL;
            sw_error err;
            if (eng_regex_compile(pat, strlen(pat), &re, &err)) {
                print_error("format %s: %s\n", names[i], err.message);
                fail();
            }
            json_t *root = json_load_file(path, JSON_ALLOW_NUL, NULL);
            if (!root) { /* draft7 lacks some formats */
                eng_regex_free(re);
                continue;
            }
            int right = 0, narrowed = 0, wrong = 0, n = 0;
            size_t gi, ti;
            json_t *group, *t;
            json_array_foreach(root, gi, group) {
                json_array_foreach(json_object_get(group, "tests"), ti, t) {
                    json_t *data = json_object_get(t, "data");
                    if (!json_is_string(data))
                        continue;
                    const char *s = json_string_value(data);
                    size_t len = json_string_length(data);
                    bool want = json_is_true(json_object_get(t, "valid"));
                    bool got = eng_regex_match(re, s, len) &&
                               utf8_chars(s, len) <= (size_t)max_chars;
                    n++;
                    if (got == want) {
                        right++;
                    } else if (want && (format_narrowed(s) ||
                                        (ascii_only(names[i]) && !is_ascii(s, len)) ||
                                        strcasestr(s, "xn--"))) {
                        narrowed++;
                    } else {
                        wrong++;
                        print_error("format %s (%s): \"%s\" (%s): got %d, the suite says %d\n",
                                    names[i], drafts[d],  s,
                                    json_string_value(json_object_get(t, "description")), got,
                                    want);
                    }
                }
            }
            printf("format %-22s %-12s %2d/%2d right, %d narrowed (%d states)\n", names[i],
                   drafts[d], right, n, narrowed, (int)eng_regex_n_states(re));
            total_wrong += wrong;
            json_decref(root);
            eng_regex_free(re);
        }
    }
    assert_int_equal(total_wrong, 0);
    /* Hand cases the suite does not have: month lengths and leap years. */
    static const struct {
        const char *format, *text;
        bool valid;
    } hand[] = {
        {"date", "2024-02-29", true},  {"date", "2023-02-29", false},
        {"date", "1900-02-29", false}, {"date", "2000-02-29", true},
        {"date", "2400-02-29", true},  {"date", "2100-02-29", false},
        {"date", "0004-02-29", true},  {"date", "0000-01-01", false}, /* narrowed */
        {"date", "2023-04-31", false}, {"date", "2023-12-31", true},
        {"date", "2023-11-31", false}, {"date", "2023-06-30", true},
        {"date-time", "2023-06-30T23:59:60Z", true},
        {"date-time", "2023-06-30t12:00:00.5+05:30", true},
        {"time", "24:00:00Z", false},  {"duration", "PT", false},
        {"duration", "P1Y2M3DT4H5M6S", true}, {"duration", "P2W", true},
        {"ipv6", "::ffff:192.168.0.1", true}, {"ipv6", "1:2:3:4:5:6:7:8", true},
        {"ipv6", "1:2:3:4:5:6:7:8:9", false}, {"ipv6", "1::2::3", false},
        {"email", "a.b+c@example.com", true}, {"email", "\"a b\"@x.org", true},
        {"email", "a@[10.0.0.1]", true}, {"email", "a@-x.org", false},
        {"hostname", "a-b.c0", true},  {"hostname", "a..b", false},
        {"uri", "urn:isbn:0451450523", true}, {"uri", "http://[::1]:80/a?b#c", true},
        {"uri", "//no-scheme", false}, {"uri-reference", "//no-scheme", true},
        {"uri-reference", "a:b:c", true}, {"uri-reference", "%zz", false},
    };
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
        const char *pat = eng_format_pattern(hand[i].format, NULL);
        bool got = match_text(pat, hand[i].text, strlen(hand[i].text));
        if (got != hand[i].valid) {
            print_error("format %s on \"%s\": got %d, want %d\n", hand[i].format, hand[i].text,
                        got, hand[i].valid);
            fail();
        }
    }
    /* The shared automata: compiled once, the same each time; a clone
     * matches what it matches. */
    const eng_regex *s1 = NULL, *s2 = NULL;
    int32_t mx = 0;
    assert_int_equal(eng_format_regex("hostname", &s1, &mx, NULL), SW_OK);
    assert_int_equal(eng_format_regex("hostname", &s2, NULL, NULL), SW_OK);
    assert_non_null(s1);
    assert_ptr_equal(s1, s2);
    assert_int_equal(mx, 253);
    eng_regex *copy = NULL;
    assert_int_equal(eng_regex_clone(s1, &copy, NULL), SW_OK);
    assert_true(eng_regex_match(copy, "a.b-c", 5) && !eng_regex_match(copy, "a..b", 4));
    assert_int_equal(eng_regex_n_states(copy), eng_regex_n_states(s1));
    eng_regex_free(copy);
    assert_int_equal(eng_format_regex("x-unknown", &s1, &mx, NULL), SW_OK);
    assert_null(s1);
    assert_null(eng_format_pattern("uri-template", NULL)); /* an annotation */
    assert_null(eng_format_pattern("no-such-format", NULL));
}

/* ---- refusals and bounds ------------------------------------------------ */

static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *pattern;
        int code;
    } cases[] = {
        {"(a)\\1", SW_EUNSUPPORTED},        {"(?<n>a)\\k<n>", SW_EUNSUPPORTED},
        {"(?:(?=ab)a)*", SW_EUNSUPPORTED},  {"(?!a)+b", SW_EINVAL},
        {"(?<=a)b", SW_EUNSUPPORTED},       {"(?<!a)b", SW_EUNSUPPORTED},
        {"\\bword\\b", SW_EUNSUPPORTED},    {"\\B", SW_EUNSUPPORTED},
        {"\\p{Lu}", SW_EUNSUPPORTED},       {"\\p{Script=Greek}", SW_EUNSUPPORTED},
        {"\\uD800", SW_EUNSUPPORTED},       {"\\01", SW_EUNSUPPORTED},
        {"(", SW_EINVAL},                   {")", SW_EINVAL},
        {"[a", SW_EINVAL},                  {"a**", SW_EINVAL},
        {"*a", SW_EINVAL},                  {"a{2}{3}", SW_EINVAL},
        {"[z-a]", SW_EINVAL},               {"a{3,2}", SW_EINVAL},
        {"\\", SW_EINVAL},                  {"\\q", SW_EINVAL},
        {"\\x4", SW_EINVAL},                {"\\u12", SW_EINVAL},
        {"(?x)", SW_EINVAL},                {"^*", SW_EINVAL},
        {"\xff", SW_EINVAL},                {"\xc3", SW_EINVAL},
        {"a{100001}", SW_ERANGE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        eng_regex *re = NULL;
        sw_error err;
        int rc = eng_regex_compile(cases[i].pattern, strlen(cases[i].pattern), &re, &err);
        if (rc != cases[i].code) {
            print_error("/%s/: got %d (%s), want %d\n", cases[i].pattern, rc,
                        rc ? err.message : "compiled", cases[i].code);
            fail();
        }
        assert_null(re);
        assert_true(strlen(err.message) > 0);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_hostile(void **state)
{
    (void)state;
    char deep[2100];
    memset(deep, '(', 1000);
    memset(deep + 1000, ')', 1000);
    deep[2000] = 0;
    const char *cases[] = {
        "(a|b)*a(a|b){20}",
        "^(a|b)*a(a|b){20}$",
        "((a{100}){100}){100}",
        "(\\p{L}{50}){50}",
        "(.*.*.*.*.*){10000}",
        "[\\s\\S]*a[\\s\\S]{30}",
        "((?=(a|b)*a(a|b){12})a){40}", /* a lookahead's automaton copied 40 times */
        "(?=(a|b)*a(a|b){20})",
        deep,
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        eng_regex *re = NULL;
        sw_error err;
        double t0 = now_s();
        int rc = eng_regex_compile(cases[i], strlen(cases[i]), &re, &err);
        double dt = now_s() - t0;
        printf("hostile /%.40s/: %s in %.3f s\n", cases[i], rc ? err.message : "compiled", dt);
        assert_int_equal(rc, SW_ERANGE);
        assert_null(re);
    }
    /* Large but reasonable patterns do compile. */
    const char *ok[] = {"(a|b)*a(a|b){6}", "^\\p{L}{1,20}$", "^[a-z0-9._%+-]+@[a-z0-9.-]+$"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        eng_regex *re = NULL;
        sw_error err;
        int rc = eng_regex_compile(ok[i], strlen(ok[i]), &re, &err);
        if (rc)
            print_error("/%s/: %s\n", ok[i], err.message);
        assert_int_equal(rc, SW_OK);
        printf("/%s/: %d states\n", ok[i], (int)eng_regex_n_states(re));
        eng_regex_free(re);
    }
}

/* ---- the automaton's promises ------------------------------------------ */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

/* Random walks through live transitions only: they never get stuck, the
 * pending counts follow UTF-8, and a walk that stops where the automaton
 * accepts is a string that matches. */
static void test_liveness(void **state)
{
    (void)state;
    const char *pats[] = {"^a{3}$", "^[a-c]*d$", "x", "^[\\u00e0-\\u00ff]{2}[0-9]$",
                          "^(\\p{L}|_)+$", "^$", "😀$", "^(ab|cd){2,3}$"};
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++) {
        eng_regex *re = NULL;
        assert_int_equal(eng_regex_compile(pats[i], strlen(pats[i]), &re, NULL), SW_OK);
        int32_t start = eng_regex_start(re);
        assert_true(eng_regex_can_accept(re, start));
        for (int walk = 0; walk < 200; walk++) {
            int32_t st = start;
            char text[64];
            size_t n = 0;
            while (n < sizeof text) {
                if (eng_regex_accepting(re, st) && rnd() % 4 == 0)
                    break;
                uint8_t next[256];
                int n_next = 0;
                for (int b = 0; b < 256; b++) {
                    int32_t t = eng_regex_step(re, st, (uint8_t)b);
                    if (t != ENG_REGEX_DEAD) {
                        assert_true(eng_regex_can_accept(re, t));
                        next[n_next++] = (uint8_t)b;
                    }
                }
                if (n_next == 0) {
                    assert_true(eng_regex_accepting(re, st)); /* never stuck */
                    break;
                }
                uint8_t b = next[rnd() % (uint32_t)n_next];
                int pend = eng_regex_pending(re, st);
                st = eng_regex_step(re, st, b);
                text[n++] = (char)b;
                int want = pend > 0 ? pend - 1 : b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
                assert_int_equal(eng_regex_pending(re, st), want);
            }
            if (eng_regex_accepting(re, st)) {
                assert_true(tu_valid_utf8(text, n));
                assert_true(eng_regex_match(re, text, n));
            }
        }
        eng_regex_free(re);
    }
    /* Matched for good: universal, and only then. */
    {
        eng_regex *u = NULL;
        assert_int_equal(eng_regex_compile("ab", 2, &u, NULL), SW_OK);
        int32_t s = eng_regex_start(u);
        assert_false(eng_regex_universal(u, s));
        s = eng_regex_step(u, s, 'a');
        assert_false(eng_regex_universal(u, s));
        s = eng_regex_step(u, s, 'b');
        assert_true(eng_regex_universal(u, s));
        assert_true(eng_regex_universal(u, eng_regex_step(u, s, 'z')));
        eng_regex_free(u);
        assert_int_equal(eng_regex_compile("^ab$", 4, &u, NULL), SW_OK);
        s = eng_regex_step(u, eng_regex_step(u, eng_regex_start(u), 'a'), 'b');
        assert_true(eng_regex_accepting(u, s));
        assert_false(eng_regex_universal(u, s));
        eng_regex_free(u);
    }
    /* A pattern that matches nothing: the start cannot accept. */
    eng_regex *re = NULL;
    assert_int_equal(eng_regex_compile("a^b", 3, &re, NULL), SW_OK);
    assert_false(eng_regex_can_accept(re, eng_regex_start(re)));
    assert_int_equal(eng_regex_step(re, eng_regex_start(re), 'a'), ENG_REGEX_DEAD);
    eng_regex_free(re);
}

/* Least cost of a completion by brute force: every string over the
 * alphabet up to depth bytes. */
static int64_t brute_cost(const eng_regex *re, const uint8_t *cost, const char *alpha,
                          int32_t st, int64_t chars, int32_t lo, int32_t hi, int depth)
{
    int64_t best = -1;
    if (eng_regex_accepting(re, st) && chars >= lo && chars <= hi)
        best = 0;
    if (depth == 0)
        return best;
    for (const char *a = alpha; *a; a++) {
        int32_t t = eng_regex_step(re, st, (uint8_t)*a);
        if (t == ENG_REGEX_DEAD || chars + 1 > hi)
            continue;
        int64_t c = brute_cost(re, cost, alpha, t, chars + 1, lo, hi, depth - 1);
        if (c >= 0 && (best < 0 || c + cost[(uint8_t)*a] < best))
            best = c + cost[(uint8_t)*a];
    }
    return best;
}

static void test_costs(void **state)
{
    (void)state;
    uint8_t cost[256];
    for (int b = 0; b < 256; b++)
        cost[b] = 1;
    cost['"'] = 2;
    cost['\\'] = 2;
    const struct {
        const char *pattern;
        int32_t lo, hi;
    } cases[] = {
        {"^[a-c]*$", 3, 5},       {"^(ab)*$", 3, 3},    {"^(ab)*$", 3, 6},
        {"^a*\"b*$", 0, INT32_MAX}, {"b", 2, INT32_MAX}, {"^(\"|ab)+$", 1, 4},
        {"^a{2}$", 0, 1},          {"^[ab\"]{1,3}b$", 0, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        eng_regex *re = NULL;
        eng_regex_costs *t = NULL;
        assert_int_equal(eng_regex_compile(cases[i].pattern, strlen(cases[i].pattern), &re, NULL),
                         SW_OK);
        assert_int_equal(eng_regex_costs_build(re, cost, cases[i].lo, cases[i].hi, &t, NULL),
                         SW_OK);
        /* Every state reachable in a few bytes, at every length so far. */
        const char *alpha = "abc\"";
        int32_t frontier[64] = {eng_regex_start(re)};
        int64_t fchars[64] = {0};
        int nf = 1;
        for (int k = 0; k < nf && nf < 60; k++)
            for (const char *a = alpha; *a && nf < 60; a++) {
                int32_t s = eng_regex_step(re, frontier[k], (uint8_t)*a);
                if (s != ENG_REGEX_DEAD && fchars[k] < 6) {
                    frontier[nf] = s;
                    fchars[nf++] = fchars[k] + 1;
                }
            }
        for (int k = 0; k < nf; k++) {
            int64_t hi = cases[i].hi == INT32_MAX ? 16 : cases[i].hi;
            int64_t want = brute_cost(re, cost, alpha, frontier[k], fchars[k], cases[i].lo,
                                      (int32_t)hi, 10);
            int64_t got = eng_regex_costs_get(t, frontier[k], fchars[k]);
            if (got != want) {
                print_error("/%s/ [%d,%d] state %d after %lld chars: got %lld, want %lld\n",
                            cases[i].pattern, cases[i].lo, cases[i].hi, frontier[k],
                            (long long)fchars[k], (long long)got, (long long)want);
                fail();
            }
        }
        eng_regex_costs_free(t);
        eng_regex_free(re);
    }
    /* Too many cells: a typed refusal. */
    eng_regex *re = NULL;
    eng_regex_costs *t = NULL;
    assert_int_equal(eng_regex_compile("^[a-z]+$", 8, &re, NULL), SW_OK);
    assert_int_equal(eng_regex_costs_build(re, cost, 0, ENG_REGEX_MAX_COST_CELLS, &t, NULL),
                     SW_ERANGE);
    eng_regex_free(re);
}

/* The product automaton matches exactly what both match. */
static void test_intersect(void **state)
{
    (void)state;
    static const char *const pairs[][2] = {
        {"^a+$", "^.{2,3}$"},  {"b", "^[ab]*$"}, {"^(ab)*$", "^.{0,4}$"},
        {"^a", "a$"},           {"^a$", "^b$"},   {"^\\d{4}$", "^(19|20)"},
    };
    const char *alpha = "ab1920";
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        eng_regex *a = NULL, *b = NULL, *both = NULL;
        assert_int_equal(eng_regex_compile(pairs[i][0], strlen(pairs[i][0]), &a, NULL), SW_OK);
        assert_int_equal(eng_regex_compile(pairs[i][1], strlen(pairs[i][1]), &b, NULL), SW_OK);
        assert_int_equal(eng_regex_intersect(a, b, &both, NULL), SW_OK);
        for (int k = 0; k < 400; k++) {
            char s[8];
            size_t n = rnd() % 7;
            for (size_t j = 0; j < n; j++)
                s[j] = alpha[rnd() % 6];
            bool want = eng_regex_match(a, s, n) && eng_regex_match(b, s, n);
            assert_int_equal(eng_regex_match(both, s, n), want);
        }
        eng_regex_free(a);
        eng_regex_free(b);
        eng_regex_free(both);
    }
}

static void test_alloc_faults(void **state)
{
    (void)state;
    /* the second with lookaheads, one holding ^ (their product copies) */
    static const char *const pats[] = {"^(\\p{L}|[0-9]){2,5}@[a-z]+$",
                                       "^(?!^b)(?=[a-z]*\\d)[a-z\\d]{2,5}$"};
    int failures = 0;
    for (size_t k = 0; k < sizeof pats / sizeof *pats; k++) {
        for (long n = 0;; n++) {
            const char *pat = pats[k];
            eng_regex *re = NULL;
            eng_regex_costs *t = NULL;
            uint8_t cost[256];
            memset(cost, 1, sizeof cost);
            sw_alloc_fail_after(n);
            int rc = eng_regex_compile(pat, strlen(pat), &re, NULL);
            if (!rc)
                rc = eng_regex_costs_build(re, cost, 1, 9, &t, NULL);
            sw_alloc_fail_after(-1);
            eng_regex_costs_free(t);
            eng_regex_free(re);
            if (rc == SW_OK)
                break;
            assert_int_equal(rc, SW_ENOMEM);
            failures++;
        }
    }
    printf("regex: %d injected allocation failures all reported\n", failures);
    assert_true(failures > 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand),        cmocka_unit_test(test_python_table),
        cmocka_unit_test(test_suite),       cmocka_unit_test(test_refused),
        cmocka_unit_test(test_hostile),     cmocka_unit_test(test_liveness),
        cmocka_unit_test(test_costs),       cmocka_unit_test(test_alloc_faults),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_intersect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
