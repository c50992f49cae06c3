/* test_chat_real_templates.c - spillway's chat rendering against the real
 * templates model files carry.
 *
 * tests/data/templates/NAME.jinja is a model's own chat template (its
 * Hugging Face repository's, via llama.cpp's models/templates), and
 * NAME.renders.json what llama.cpp's Jinja engine made of a fixed set of
 * chat bodies with it (bench/record-templates.sh). For each template the
 * family must be detected from the text (the right one, not the ChatML
 * fallback), and every recorded body, read by the worker's own parsers
 * (api_chat_messages_parse, api_tools_parse, api_chat_options_parse),
 * must render to the recorded prompt byte for byte, except where
 * docs/chat-templates.md documents a difference: those are listed in
 * known_differences below and checked as exactly that difference.
 */
#include "testutil.h"

#include "api/api.h"
#include "chat/chat_template.h"
#include "common/alloc.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* The recorded templates (bench/record-templates.sh's table). */
static const char *const templates[] = {
    "Qwen-Qwen3-0.6B",
    "Qwen-QwQ-32B",
    "Qwen-Qwen2.5-7B-Instruct",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "openai-gpt-oss-120b",
    "microsoft-Phi-3.5-mini-instruct",
    "mistralai-Mistral-Nemo-Instruct-2407",
};
#define N_TEMPLATES (sizeof templates / sizeof templates[0])

static void print_difference(const char *name, const char *want, const char *got);

/* The differences docs/chat-templates.md documents ("Differences from the
 * real templates"), each checked as exactly that difference. A template
 * or case name ending in '*' is a prefix. Kinds:
 *   SUBST   the recording with `recorded` replaced by `spillway` (every
 *           occurrence; it must occur) is spillway's prompt;
 *   FORMAT  a different format for the same thing: the recording holds
 *           `recorded` and not `spillway`, spillway's prompt the reverse;
 *   REFUSED the template raised an error holding `recorded`; spillway
 *           renders the conversation and its prompt holds `spillway`, or,
 *           when `spillway` starts with '!', refuses it too with an error
 *           holding the rest;
 *   SPILLWAY_REFUSES  the template renders a prompt holding `recorded`;
 *           spillway refuses the conversation with an error holding
 *           `spillway`. */
typedef enum diff_kind { SUBST, FORMAT, REFUSED, SPILLWAY_REFUSES } diff_kind;
typedef struct known_difference {
    const char *template_name;
    const char *case_name;
    diff_kind kind;
    const char *recorded;
    const char *spillway;
} known_difference;

#define DS_BAR "\xef\xbd\x9c"
#define DS_SPACE "\xe2\x96\x81"

static const known_difference known_differences[] = {
    /* Qwen 2.5's default system message when the conversation has none */
    {"Qwen-Qwen2.5-7B-Instruct", "user", SUBST,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
     "assistant.<|im_end|>\n", ""},
    {"Qwen-Qwen2.5-7B-Instruct", "multi_turn_inline_think", SUBST,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
     "assistant.<|im_end|>\n", ""},
    {"Qwen-Qwen2.5-7B-Instruct", "tool_loop_reasoning", SUBST,
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
     "assistant.\n\n# Tools", "<|im_start|>system\n# Tools"},
    /* QwQ's tools section without a system message follows an empty one */
    {"Qwen-QwQ-32B", "tool_loop_reasoning", SUBST, "<|im_start|>system\n\n\n# Tools",
     "<|im_start|>system\n# Tools"},
    /* QwQ's template drops every turn's thought; spillway keeps a tool
     * loop's, as Qwen3's templates (the Thinking-2507 ones too) do */
    {"Qwen-QwQ-32B", "tool_loop_reasoning", SUBST, "<|im_start|>assistant\n<tool_call>",
     "<|im_start|>assistant\n<think>\nI need both cities.\n</think>\n\n<tool_call>"},
    /* QwQ has no enable_thinking; llama.cpp closes the opened thought itself */
    {"Qwen-QwQ-32B", "system_user_no_thinking", SUBST,
     "<|im_start|>assistant\n<think>\n</think>", "<|im_start|>assistant\n<think>\n"},
    /* The R1 distills' templates never show the tools; spillway the Hermes
     * section */
    {"deepseek-ai-DeepSeek-R1-Distill-*", "tool_*", FORMAT,
     "<" DS_BAR "tool" DS_SPACE "output" DS_SPACE "begin" DS_BAR ">",
     "# Tools\n\nYou may call one or more functions"},
    /* Phi-3.5's template has no tools: it drops the definitions, the call
     * and the result; spillway writes the generic Hermes format */
    {"microsoft-Phi-3.5-mini-instruct", "tool_*", FORMAT, "<|assistant|>\n<|end|>\n",
     "# Tools\n\nYou may call one or more functions"},
    /* Mistral Nemo (the v3 "tekken" format): [INST] without spaces, the
     * system text before the last user message, [AVAILABLE_TOOLS]; spillway
     * writes the v1 format */
    {"mistralai-Mistral-Nemo-Instruct-2407", "user", FORMAT, "?[/INST]", "? [/INST]"},
    {"mistralai-Mistral-Nemo-Instruct-2407", "system_user", FORMAT, "?[/INST]", "? [/INST]"},
    {"mistralai-Mistral-Nemo-Instruct-2407", "multi_turn_*", FORMAT, "?[/INST]", "? [/INST]"},
    {"mistralai-Mistral-Nemo-Instruct-2407", "tool_call", FORMAT, "[AVAILABLE_TOOLS]",
     "# Tools\n\nYou may call one or more functions"},
    {"mistralai-Mistral-Nemo-Instruct-2407", "whitespace", FORMAT, "[INST]\n Hi there  [/INST]",
     "[INST]   Be brief."},
    /* v1 has no tool role: two results in a row break its alternation */
    {"mistralai-Mistral-Nemo-Instruct-2407", "tool_loop_reasoning", SPILLWAY_REFUSES,
     "[TOOL_RESULTS]", "needs user and assistant messages to alternate"},
    /* gpt-oss: a call and its result as the harmony format writes them (what
     * the model generates), not as the Hugging Face template does */
    {"openai-gpt-oss-120b", "tool_*", SUBST,
     "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>",
     "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
     "<|message|>"},
    {"openai-gpt-oss-120b", "tool_call", SUBST, "<|message|>\"{\\\"temp_c\\\": 18}\"<|end|>",
     "<|message|>{\"temp_c\": 18}<|end|>"},
    /* ... and the template writes only the first call of a turn */
    {"openai-gpt-oss-120b", "tool_loop_reasoning", SUBST, "{\"city\": \"Paris\"}<|call|>",
     "{\"city\": \"Paris\"}<|call|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>"},
    {"openai-gpt-oss-120b", "tool_loop_reasoning", SUBST, "<|message|>\"18 C\"<|end|>",
     "<|message|>18 C<|end|>"},
    {"openai-gpt-oss-120b", "tool_loop_reasoning", SUBST, "<|message|>\"9 C\"<|end|>",
     "<|message|>9 C<|end|>"},
};
#define N_KNOWN (sizeof known_differences / sizeof known_differences[0])

static bool name_matches(const char *pattern, const char *name)
{
    size_t n = strlen(pattern);
    if (n > 0 && pattern[n - 1] == '*')
        return strncmp(pattern, name, n - 1) == 0;
    return strcmp(pattern, name) == 0;
}

/* s with every occurrence of from replaced by to (sw_free), or NULL when
 * from does not occur. */
static char *replace_all(const char *s, const char *from, const char *to)
{
    size_t nf = strlen(from), nt = strlen(to), count = 0;
    for (const char *p = s; (p = strstr(p, from)) != NULL; p += nf)
        count++;
    if (count == 0)
        return NULL;
    char *out = sw_malloc(strlen(s) + count * nt + 1), *w = out;
    assert_non_null(out);
    for (const char *p = s, *q; *p; p = q + nf) {
        if (!(q = strstr(p, from))) {
            strcpy(w, p);
            return out;
        }
        memcpy(w, p, (size_t)(q - p));
        w += q - p;
        memcpy(w, to, nt);
        w += nt;
        *w = '\0';
        if (!q[nf])
            return out;
    }
    return out;
}

/* Whether spillway's prompt got (NULL: refused, why) is the recorded
 * outcome with the case's documented differences; used[k] is set for each
 * difference that applied. */
static bool check_case(const char *tname, const char *cname, const char *want,
                       const char *error, const char *got, const char *why, bool *used)
{
    char label[256];
    snprintf(label, sizeof label, "%s/%s", tname, cname);
    char *expect = sw_strdup(want ? want : "");
    assert_non_null(expect);
    bool ok = true, substituted = false, format = false, refused = false;
    for (size_t k = 0; k < N_KNOWN; k++) {
        const known_difference *d = &known_differences[k];
        if (!name_matches(d->template_name, tname) || !name_matches(d->case_name, cname))
            continue;
        used[k] = true;
        if (d->kind == SUBST) {
            char *next = want ? replace_all(expect, d->recorded, d->spillway) : NULL;
            if (!next) {
                fprintf(stderr, "%s: documented difference not in the recording: %s\n", label,
                        d->recorded);
                ok = false;
                continue;
            }
            sw_free(expect);
            expect = next;
            substituted = true;
        } else if (d->kind == FORMAT) {
            format = true;
            if (!got || !want || !strstr(want, d->recorded) || strstr(want, d->spillway) ||
                !strstr(got, d->spillway) || strstr(got, d->recorded)) {
                fprintf(stderr, "%s: not the documented format difference (%s / %s)\n", label,
                        d->recorded, d->spillway);
                ok = false;
            }
        } else if (d->kind == REFUSED) {
            refused = true;
            bool both = d->spillway[0] == '!';
            if (!error || !strstr(error, d->recorded) ||
                (both ? got || !strstr(why, d->spillway + 1) : !got || !strstr(got, d->spillway))) {
                fprintf(stderr, "%s: not the documented refusal (%s)\n", label, d->recorded);
                ok = false;
            }
        } else {
            refused = true;
            if (!want || !strstr(want, d->recorded) || got || !strstr(why, d->spillway)) {
                fprintf(stderr, "%s: not spillway's documented refusal (%s)\n", label,
                        d->spillway);
                ok = false;
            }
        }
    }
    if (!format && !refused) {
        if (error) {
            fprintf(stderr, "%s: the template refused it: %.200s\n", label, error);
            ok = false;
        } else if (!got) {
            fprintf(stderr, "%s: %s\n", label, why);
            ok = false;
        } else if (strcmp(expect, got) != 0) {
            print_difference(label, expect, got);
            ok = false;
        } else if (!substituted) {
            fprintf(stderr, "%s: byte for byte\n", label);
        }
    }
    sw_free(expect);
    return ok;
}

/* spillway's prompt for one recorded body, or NULL with the reason in why. */
static char *render_body(eng_chat_family f, json_t *body, const char *date, char *why,
                         size_t why_cap)
{
    api_error e;
    memset(&e, 0, sizeof e);
    api_tools t;
    api_chat_messages m;
    memset(&m, 0, sizeof m);
    eng_chat_options o;
    memset(&o, 0, sizeof o);
    char today[11];
    char *text = NULL;
    bool ok = api_tools_parse(body, true, &t, &e) && api_chat_options_parse(body, &o, today, &e) &&
              api_chat_messages_parse(json_object_get(body, "messages"), &m, &e);
    if (ok) {
        o.tools_text = api_tools_in_prompt(&t, body) ? t.text : NULL;
        o.add_generation_prompt = true;
        o.date = date; /* the recording's fixed date, not today's */
        o.reasoning = m.reasoning;
        sw_error err;
        if (eng_chat_render_with(f, m.msgs, m.tools, m.n, &o, &text, NULL, NULL, NULL, &err)) {
            snprintf(why, why_cap, "render: %s", err.message);
            text = NULL;
        }
    } else {
        snprintf(why, why_cap, "parse: %s", e.msg);
    }
    api_chat_messages_free(&m);
    api_tools_free(&t);
    return text;
}

/* Where the two strings first differ, with some context, on stderr. */
static void print_difference(const char *name, const char *want, const char *got)
{
    size_t i = 0;
    while (want[i] && want[i] == got[i])
        i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "%s: differs at byte %zu\n  want: ", name, i);
    for (size_t k = from; want[k] && k < i + 80; k++)
        fputs(want[k] == '\n' ? "\\n" : (char[2]){want[k], 0}, stderr);
    fprintf(stderr, "\n  got:  ");
    for (size_t k = from; got[k] && k < i + 80; k++)
        fputs(got[k] == '\n' ? "\\n" : (char[2]){got[k], 0}, stderr);
    fprintf(stderr, "\n");
}

static void test_real_templates(void **state)
{
    (void)state;
    size_t n_cases = 0, n_failed = 0;
    bool used[N_KNOWN] = {false};
    for (size_t ti = 0; ti < N_TEMPLATES; ti++) {
        char rel[256];
        snprintf(rel, sizeof rel, "templates/%s.jinja", templates[ti]);
        const char *path = tu_data_path(rel);
        if (!path)
            return;
        size_t len = 0;
        char *jinja = tu_read_file(path, &len);
        assert_non_null(jinja);
        bool fallback = true;
        eng_chat_family f = eng_chat_detect(jinja, len, &fallback);
        sw_free(jinja);

        snprintf(rel, sizeof rel, "templates/%s.renders.json", templates[ti]);
        path = tu_data_path(rel);
        if (!path)
            return;
        json_error_t jerr;
        json_t *rec = json_load_file(path, 0, &jerr);
        assert_non_null(rec);
        const char *want_family = json_string_value(json_object_get(rec, "family"));
        assert_non_null(want_family);
        if (fallback || strcmp(eng_chat_family_name(f), want_family) != 0) {
            fprintf(stderr, "%s: detected %s%s, want %s\n", templates[ti],
                    eng_chat_family_name(f), fallback ? " (fallback)" : "", want_family);
            fail();
        }
        const char *date = json_string_value(json_object_get(rec, "date"));
        json_t *cases = json_object_get(rec, "cases");
        assert_true(json_array_size(cases) > 0);
        size_t i;
        json_t *c;
        json_array_foreach(cases, i, c) {
            const char *case_name = json_string_value(json_object_get(c, "name"));
            const char *want = json_string_value(json_object_get(c, "prompt"));
            const char *error = json_string_value(json_object_get(c, "error"));
            assert_non_null(case_name);
            assert_true(want || error);
            char why[600] = "";
            char *got = render_body(f, json_object_get(c, "body"), date, why, sizeof why);
            n_cases++;
            if (!check_case(templates[ti], case_name, want, error, got, why, used))
                n_failed++;
            sw_free(got);
        }
        json_decref(rec);
    }
    for (size_t k = 0; k < N_KNOWN; k++)
        if (!used[k]) {
            fprintf(stderr, "documented difference %zu (%s/%s) met no recorded case\n", k,
                    known_differences[k].template_name, known_differences[k].case_name);
            n_failed++;
        }
    fprintf(stderr, "%zu recorded prompts, %zu failed\n", n_cases, n_failed);
    assert_int_equal(n_failed, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_templates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
