/* test_chat_reasoning.c - a thinking model's reply split into reasoning and
 * content (chat/chat_reasoning.h), and the prompts of the families that
 * think: Qwen3 (enable_thinking), DeepSeek-R1 and gpt-oss's harmony format
 * (chat/chat_template.h, chat_harmony.c).
 *
 * The splitter is checked on whole replies, on the same replies cut at
 * every byte (a stream's pieces must add up to the whole answer), and on a
 * reply continued by a second splitter from the text a first one had seen
 * (a resumed stream). The expected prompts were written by hand from the
 * families' published formats; the template snippets for detection are
 * abbreviated from the families' templates, keeping their markers.
 */
#include "testutil.h"

#include "chat/chat_reasoning.h"
#include "chat/chat_template.h"
#include "common/alloc.h"

#include <stdio.h>
#include <string.h>

typedef struct split {
    char reasoning[1024];
    char content[1024];
} split;

static void add(split *out, const eng_reasoning_delta *d)
{
    if (d->reasoning.len)
        strncat(out->reasoning, d->reasoning.p, sizeof out->reasoning - strlen(out->reasoning) - 1);
    if (d->content.len)
        strncat(out->content, d->content.p, sizeof out->content - strlen(out->content) - 1);
}

/* The reply fed in pieces of `piece` bytes (0: whole), then finished. */
static void run_split(eng_reasoning_syntax syn, const char *text, size_t piece, split *out,
                      eng_reasoning *keep)
{
    eng_reasoning r;
    eng_reasoning_delta d = {0};
    eng_reasoning_init(&r, syn);
    memset(out, 0, sizeof *out);
    size_t len = strlen(text);
    for (size_t at = 0; at < len;) {
        size_t n = piece && piece < len - at ? piece : len - at;
        eng_reasoning_delta_clear(&d);
        assert_int_equal(eng_reasoning_push(&r, text + at, n, &d), SW_OK);
        add(out, &d);
        at += n;
    }
    eng_reasoning_delta_clear(&d);
    assert_int_equal(eng_reasoning_finish(&r, &d), SW_OK);
    add(out, &d);
    eng_reasoning_delta_free(&d);
    if (keep)
        *keep = r;
    else
        eng_reasoning_free(&r);
}

/* Whole, byte by byte and in 3-byte pieces: always the same split. */
static void expect_split(eng_reasoning_syntax syn, const char *text, const char *reasoning,
                         const char *content)
{
    const size_t pieces[] = {0, 1, 3, 7};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        split s;
        run_split(syn, text, pieces[i], &s, NULL);
        if (strcmp(s.reasoning, reasoning) != 0 || strcmp(s.content, content) != 0)
            print_error("pieces of %zu: reasoning '%s' content '%s'\n", pieces[i], s.reasoning,
                        s.content);
        assert_string_equal(s.reasoning, reasoning);
        assert_string_equal(s.content, content);
    }
}

static void test_qwen3_think(void **state)
{
    (void)state;
    expect_split(ENG_REASONING_THINK, "<think>\nLet me add: 2+2=4.\n</think>\n\nIt is 4.",
                 "Let me add: 2+2=4.", "It is 4.");
    /* white space before the thought; a thought with lines */
    expect_split(ENG_REASONING_THINK, "\n<think>\na\n\nb\n</think>\n\nc\n", "a\n\nb", "c\n");
    /* enable_thinking false: the prompt held the empty thought, the reply
     * is all answer, a later "<think>" included */
    expect_split(ENG_REASONING_THINK, "Hello <think> there", "", "Hello <think> there");
    /* "<" that is not the start of "<think>" */
    expect_split(ENG_REASONING_THINK, "<b>bold</b>", "", "<b>bold</b>");
    /* an empty thought */
    expect_split(ENG_REASONING_THINK, "<think>\n\n</think>\n\nAnswer", "", "Answer");
    /* "</think>" look-alikes inside the thought stay reasoning */
    expect_split(ENG_REASONING_THINK, "<think>a </thin b</think>c", "a </thin b", "c");
}

static void test_deepseek_open(void **state)
{
    (void)state;
    /* the prompt ended with "<think>\n": the reply starts in the thought */
    expect_split(ENG_REASONING_THINK_OPEN, "Okay, the user says hi.\n</think>\n\nHello!",
                 "Okay, the user says hi.", "Hello!");
    /* a model that writes "<think>" again anyway */
    expect_split(ENG_REASONING_THINK_OPEN, "<think>\nHmm.\n</think>\n\nYes.", "Hmm.", "Yes.");
    /* "<" at the start that is not "<think>" is reasoning */
    expect_split(ENG_REASONING_THINK_OPEN, "<x> is a tag</think>ok", "<x> is a tag", "ok");
}

/* A thought never closed (max_tokens cut it): all of it is reasoning, a
 * partial "</think>" included, the trailing white space dropped. */
static void test_unclosed(void **state)
{
    (void)state;
    expect_split(ENG_REASONING_THINK, "<think>\nStill thinking about it\n</thi",
                 "Still thinking about it\n</thi", "");
    expect_split(ENG_REASONING_THINK_OPEN, "First, I need to  \n\n", "First, I need to", "");
    expect_split(ENG_REASONING_THINK, "<thi", "", "<thi");
    expect_split(ENG_REASONING_THINK_OPEN, "", "", "");
}

/* A resumed stream: a splitter fed the first k bytes (output dropped:
 * the client has it) then the rest gives exactly what the whole reply
 * gives after the first k bytes' output, at every k. */
static void check_resume(eng_reasoning_syntax syn, const char *text)
{
    split whole;
    run_split(syn, text, 0, &whole, NULL);
    size_t len = strlen(text);
    for (size_t k = 0; k <= len; k++) {
        eng_reasoning first, second;
        eng_reasoning_delta d1 = {0}, d2 = {0};
        eng_reasoning_init(&first, syn);
        eng_reasoning_init(&second, syn);
        assert_int_equal(eng_reasoning_push(&first, text, k, &d1), SW_OK);
        /* the resumed worker: same prefix, output discarded */
        assert_int_equal(eng_reasoning_push(&second, text, k, &d2), SW_OK);
        assert_int_equal(eng_reasoning_in_thought(&first), eng_reasoning_in_thought(&second));
        eng_reasoning_delta_clear(&d2);
        assert_int_equal(eng_reasoning_push(&second, text + k, len - k, &d2), SW_OK);
        assert_int_equal(eng_reasoning_finish(&second, &d2), SW_OK);
        split got;
        memset(&got, 0, sizeof got);
        add(&got, &d1);
        add(&got, &d2);
        assert_string_equal(got.reasoning, whole.reasoning);
        assert_string_equal(got.content, whole.content);
        eng_reasoning_delta_free(&d1);
        eng_reasoning_delta_free(&d2);
        eng_reasoning_free(&first);
        eng_reasoning_free(&second);
    }
}

static void test_resume_mid_thought(void **state)
{
    (void)state;
    check_resume(ENG_REASONING_THINK, "<think>\nStep one. Step two.\n</think>\n\nDone.");
    check_resume(ENG_REASONING_THINK_OPEN, "Thinking hard\n\n</think>\n\nThe answer.");
    check_resume(ENG_REASONING_HARMONY,
                 "<|channel|>analysis<|message|>Plan it.<|end|><|start|>assistant<|channel|>"
                 "final<|message|>Planned.");
    /* the splitter knows it is inside the thought after a cut there */
    eng_reasoning r;
    eng_reasoning_delta d = {0};
    eng_reasoning_init(&r, ENG_REASONING_THINK);
    assert_int_equal(eng_reasoning_push(&r, "<think>\nhalf a tho", 18, &d), SW_OK);
    assert_true(eng_reasoning_in_thought(&r));
    assert_int_equal(eng_reasoning_push(&r, "ught</think>x", 13, &d), SW_OK);
    assert_false(eng_reasoning_in_thought(&r));
    assert_string_equal(d.reasoning.p, "half a thought");
    assert_string_equal(d.content.p, "x");
    eng_reasoning_delta_free(&d);
    eng_reasoning_free(&r);
}

static void test_no_syntax(void **state)
{
    (void)state;
    expect_split(ENG_REASONING_NONE, "<think>a</think>b", "", "<think>a</think>b");
}

static void test_harmony_channels(void **state)
{
    (void)state;
    expect_split(ENG_REASONING_HARMONY,
                 "<|channel|>analysis<|message|>User greets. Reply.<|end|><|start|>assistant"
                 "<|channel|>final<|message|>Hello! How can I help?",
                 "User greets. Reply.", "Hello! How can I help?");
    /* cut in the analysis (max_tokens): all reasoning */
    expect_split(ENG_REASONING_HARMONY, "<|channel|>analysis<|message|>Long thought <|e",
                 "Long thought <|e", "");
    /* a final answer without analysis; <|return|> ends it */
    expect_split(ENG_REASONING_HARMONY, "<|channel|>final<|message|>Just this.<|return|>", "",
                 "Just this.");
    /* a text with "<" that is no marker */
    expect_split(ENG_REASONING_HARMONY, "<|channel|>final<|message|>a < b <| c", "", "a < b <| c");
}

static void expect_call(const char *text, const char *reasoning, const char *name,
                        const char *args)
{
    split s;
    eng_reasoning r;
    run_split(ENG_REASONING_HARMONY, text, 1, &s, &r);
    assert_string_equal(s.reasoning, reasoning);
    assert_string_equal(s.content, "");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.calls[0].name, name);
    assert_string_equal(r.calls[0].arguments.p, args);
    eng_reasoning_free(&r);
}

static void test_harmony_calls(void **state)
{
    (void)state;
    /* the recipient after the channel, with <|constrain|>; <|call|> is a
     * stop token, so the reply may end right after the arguments */
    expect_call("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                "{\"location\":\"Paris\"}",
                "Need the weather.", "get_weather", "{\"location\":\"Paris\"}");
    /* the recipient in the role part, ended by <|call|> */
    expect_call("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f"
                "<|channel|>commentary json<|message|>{}<|call|>",
                "x", "f", "{}");
    /* two calls */
    split s;
    eng_reasoning r;
    run_split(ENG_REASONING_HARMONY,
              "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{\"i\":1}<|call|>"
              "<|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json"
              "<|message|>{\"i\":2}<|call|>",
              2, &s, &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.calls[1].name, "b");
    assert_string_equal(r.calls[1].arguments.p, "{\"i\":2}");
    eng_reasoning_free(&r);
    /* commentary without a recipient (a preamble) is content */
    expect_split(ENG_REASONING_HARMONY, "<|channel|>commentary<|message|>Checking.<|end|>", "",
                 "Checking.");
}

static void test_format_names(void **state)
{
    (void)state;
    eng_reasoning_format f;
    assert_int_equal(eng_reasoning_format_from_name("none", &f), SW_OK);
    assert_int_equal(f, ENG_REASONING_FORMAT_NONE);
    assert_int_equal(eng_reasoning_format_from_name("deepseek", &f), SW_OK);
    assert_int_equal(f, ENG_REASONING_FORMAT_DEEPSEEK);
    assert_int_equal(eng_reasoning_format_from_name("auto", &f), SW_OK);
    assert_int_equal(eng_reasoning_format_from_name("DeepSeek", &f), SW_EINVAL);
    assert_int_equal(eng_reasoning_format_from_name("", &f), SW_EINVAL);
    assert_int_equal(eng_chat_reasoning_syntax(ENG_CHAT_QWEN3), ENG_REASONING_THINK);
    assert_int_equal(eng_chat_reasoning_syntax(ENG_CHAT_DEEPSEEK_R1), ENG_REASONING_THINK_OPEN);
    assert_int_equal(eng_chat_reasoning_syntax(ENG_CHAT_HARMONY), ENG_REASONING_HARMONY);
    assert_int_equal(eng_chat_reasoning_syntax(ENG_CHAT_CHATML), ENG_REASONING_NONE);
}

/* ---- the families' prompts ------------------------------------------------ */

static void test_detect(void **state)
{
    (void)state;
    /* Qwen3's template (abbreviated): ChatML markers and the thought */
    static const char qwen3[] =
        "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
        "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}"
        "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
        "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and "
        "enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";
    /* DeepSeek-R1-Distill-Qwen's (abbreviated) */
    static const char r1[] =
        "{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}"
        "{%- if message['role'] == 'user' %}{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + "
        "message['content']}}{%- endif %}{%- endfor %}{% if add_generation_prompt %}"
        "{{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c><think>\\n'}}{% endif %}";
    /* gpt-oss's (abbreviated) */
    static const char oss[] =
        "{{- \"<|start|>system<|message|>\" }}{{- build_system_message() }}{{- \"<|end|>\" }}"
        "{%- if message.role == 'assistant' %}{{- \"<|start|>assistant<|channel|>final"
        "<|message|>\" + message.content + \"<|end|>\" }}{%- endif %}"
        "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}";
    bool fb = true;
    assert_int_equal(eng_chat_detect(qwen3, sizeof qwen3 - 1, &fb), ENG_CHAT_QWEN3);
    assert_false(fb);
    assert_int_equal(eng_chat_detect(r1, sizeof r1 - 1, &fb), ENG_CHAT_DEEPSEEK_R1);
    /* DeepSeek-V3's own format (no thought) is not R1's */
    static const char v3[] =
        "{{ bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
        "{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + message['content']}}{%- endif %}{%- endfor %}"
        "{% if add_generation_prompt %}{{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>'}}{% endif %}";
    assert_int_not_equal(eng_chat_detect(v3, sizeof v3 - 1, NULL), ENG_CHAT_DEEPSEEK_R1);
    assert_int_equal(eng_chat_detect(oss, sizeof oss - 1, &fb), ENG_CHAT_HARMONY);
    /* Qwen3-*-Thinking-2507's (abbreviated): the prompt opens the thought */
    static const char qwen3_thinking[] =
        "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
        "{%- set content = content.split('</think>')[-1] %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}";
    assert_int_equal(eng_chat_detect(qwen3_thinking, sizeof qwen3_thinking - 1, NULL),
                     ENG_CHAT_QWEN3_THINKING);
    assert_int_equal(eng_chat_reasoning_syntax(ENG_CHAT_QWEN3_THINKING), ENG_REASONING_THINK_OPEN);
    eng_chat_family f;
    assert_int_equal(eng_chat_family_from_name("gpt-oss", &f), SW_OK);
    assert_int_equal(f, ENG_CHAT_HARMONY);
    assert_int_equal(eng_chat_family_from_name("deepseek-r1", &f), SW_OK);
    assert_int_equal(f, ENG_CHAT_DEEPSEEK_R1);
    assert_int_equal(eng_chat_family_from_name("qwen3", &f), SW_OK);
    assert_int_equal(f, ENG_CHAT_QWEN3);
    assert_string_equal(eng_chat_family_name(ENG_CHAT_DEEPSEEK_R1), "deepseek-r1");
}

static char *render(eng_chat_family f, const eng_chat_message *m,
                    const eng_chat_message_tools *ext, size_t n, const eng_chat_options *o,
                    eng_chat_segment **segs, size_t *n_segs)
{
    char *text = NULL;
    sw_error err;
    int rc = eng_chat_render_with(f, m, ext, n, o, &text, NULL, segs, n_segs, &err);
    if (rc)
        print_error("render: %s\n", err.message);
    assert_int_equal(rc, SW_OK);
    return text;
}

static void test_qwen3_enable_thinking(void **state)
{
    (void)state;
    const eng_chat_message m[] = {
        {"user", "Hi"},
        {"assistant", "<think>\nold thought\n</think>\n\nHello!"},
        {"user", "2+2?"},
    };
    eng_chat_options o = {.add_generation_prompt = true};
    char *t = render(ENG_CHAT_QWEN3, m, NULL, 3, &o, NULL, NULL);
    /* the history's thought is left out, as Qwen3's template does */
    assert_string_equal(t, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
                           "<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                           "<|im_start|>assistant\n");
    sw_free(t);
    o.thinking_off = true;
    t = render(ENG_CHAT_QWEN3, m, NULL, 3, &o, NULL, NULL);
    assert_string_equal(t, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
                           "<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                           "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    sw_free(t);
    /* the thinking-only models open the thought, whatever the switch */
    t = render(ENG_CHAT_QWEN3_THINKING, m + 2, NULL, 1, &o, NULL, NULL);
    assert_string_equal(t, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n");
    sw_free(t);
    /* ChatML ignores it */
    t = render(ENG_CHAT_CHATML, m + 2, NULL, 1, &o, NULL, NULL);
    assert_string_equal(t, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
    sw_free(t);
}

/* A tool loop in progress (assistant turns after the last user message)
 * keeps its thought, as Qwen3's and gpt-oss's templates do: Qwen3 takes it
 * from reasoning_content or inline in the content; harmony writes the
 * reasoning_content as the analysis before the calls. Before the last
 * user message thoughts are left out. */
static void test_tool_loop_thought(void **state)
{
    (void)state;
    const eng_chat_message m[] = {
        {"user", "Hi"},
        {"assistant", "<think>\nold\n</think>\n\nHello!"},
        {"user", "Weather?"},
        {"assistant", "<think>\nNeed the tool.\n</think>\n\nChecking."},
        {"tool", "sunny"},
    };
    eng_chat_options o = {.add_generation_prompt = true};
    char *t = render(ENG_CHAT_QWEN3, m, NULL, 5, &o, NULL, NULL);
    assert_string_equal(t, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
                           "<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
                           "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n"
                           "Checking.<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n"
                           "</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n");
    sw_free(t);
    /* reasoning_content sent back: the same */
    const eng_chat_message m2[] = {
        {"user", "Weather?"}, {"assistant", "Checking."}, {"tool", "sunny"}};
    const char *const thoughts[] = {NULL, "Need the tool.", NULL};
    o.reasoning = thoughts;
    t = render(ENG_CHAT_QWEN3, m2, NULL, 3, &o, NULL, NULL);
    assert_string_equal(t, "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
                           "<think>\nNeed the tool.\n</think>\n\nChecking.<|im_end|>\n"
                           "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>"
                           "<|im_end|>\n<|im_start|>assistant\n");
    sw_free(t);
    /* harmony: the analysis before the call */
    const eng_chat_tool_call call = {"c1", "get_weather", "{}"};
    const eng_chat_message m3[] = {{"user", "Weather?"}, {"assistant", ""}, {"tool", "sunny"}};
    const eng_chat_message_tools ext[] = {{0}, {&call, 1, NULL}, {NULL, 0, "c1"}};
    eng_chat_options h = {.add_generation_prompt = true, .reasoning = thoughts};
    t = render(ENG_CHAT_HARMONY, m3, ext, 3, &h, NULL, NULL);
    assert_non_null(strstr(t, "<|start|>user<|message|>Weather?<|end|><|start|>assistant"
                              "<|channel|>analysis<|message|>Need the tool.<|end|>"
                              "<|start|>assistant"
                              "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                              "<|message|>{}<|call|><|start|>functions.get_weather to=assistant"
                              "<|channel|>commentary<|message|>sunny<|end|><|start|>assistant"));
    sw_free(t);
}

static void test_deepseek_render(void **state)
{
    (void)state;
    const eng_chat_message m[] = {
        {"system", "Be brief."},
        {"user", "Hi"},
        {"assistant", "Let me think.</think>\n\nHello!"},
        {"user", "Bye"},
    };
    eng_chat_options o = {.add_generation_prompt = true};
    char *t = render(ENG_CHAT_DEEPSEEK_R1, m, NULL, 4, &o, NULL, NULL);
    assert_string_equal(t, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
                           "Be brief.<\xef\xbd\x9cUser\xef\xbd\x9c>Hi<\xef\xbd\x9c"
                           "Assistant\xef\xbd\x9c>\n\nHello!<\xef\xbd\x9c"
                           "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser"
                           "\xef\xbd\x9c>Bye<\xef\xbd\x9c" "Assistant\xef\xbd\x9c><think>\n");
    sw_free(t);
    const char *stops[4];
    assert_int_equal(eng_chat_stop_strings(ENG_CHAT_DEEPSEEK_R1, stops, 4), 1);
    assert_string_equal(stops[0],
                        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    assert_false(eng_chat_tokenize_add_bos(ENG_CHAT_DEEPSEEK_R1, true));
}

static void test_harmony_render(void **state)
{
    (void)state;
    const eng_chat_tool_call call = {"call_1", "get_weather", "{\"city\":\"Paris\"}"};
    const eng_chat_message m[] = {
        {"system", "Answer in French."},
        {"user", "Weather in Paris?"},
        {"assistant", ""},
        {"tool", "{\"temp\":21}"},
    };
    const eng_chat_message_tools ext[] = {{0}, {0}, {&call, 1, NULL}, {NULL, 0, "call_1"}};
    const char *tools =
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
        "\"Current weather.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
        "{\"type\":\"string\",\"description\":\"The city.\"},\"unit\":{\"type\":\"string\","
        "\"enum\":[\"c\",\"f\"],\"default\":\"c\"}},\"required\":[\"city\"]}}}\n"
        "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}\n";
    eng_chat_options o = {.add_generation_prompt = true, .tools_text = tools,
                          .date = "2026-12-06", .reasoning_effort = "high"};
    eng_chat_segment *segs = NULL;
    size_t n_segs = 0;
    char *t = render(ENG_CHAT_HARMONY, m, ext, 4, &o, &segs, &n_segs);
    const char *expected =
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2026-12-06\n\nReasoning: high\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nAnswer in French.\n\n"
        "# Tools\n\n## functions\n\nnamespace functions {\n\n"
        "// Current weather.\ntype get_weather = (_: {\n// The city.\ncity: string,\n"
        "unit?: \"c\" | \"f\", // default: \"c\"\n}) => any;\n\n"
        "type now = () => any;\n\n} // namespace functions<|end|>"
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        "<|message|>{\"city\":\"Paris\"}<|call|>"
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
        "{\"temp\":21}<|end|><|start|>assistant";
    assert_string_equal(t, expected);
    /* client text is never template text (no special tokens parsed there) */
    bool found_user = false;
    for (size_t i = 0; i < n_segs; i++) {
        if (segs[i].len == 17 && memcmp(t + segs[i].offset, "Weather in Paris?", 17) == 0) {
            assert_false(segs[i].is_template);
            found_user = true;
        }
        if (!segs[i].is_template)
            assert_null(memmem(t + segs[i].offset, segs[i].len, "<|", 2));
    }
    assert_true(found_user);
    sw_free(t);
    sw_free(segs);

    /* no system message, no tools, an earlier answer: the final channel;
     * no date: the line is left out; the default effort */
    const eng_chat_message m2[] = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
    eng_chat_options o2 = {.add_generation_prompt = true};
    t = render(ENG_CHAT_HARMONY, m2, NULL, 3, &o2, NULL, NULL);
    assert_string_equal(t,
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final"
        "<|message|>Hello!<|end|><|start|>user<|message|>Bye<|end|><|start|>assistant");
    sw_free(t);
    const char *stops[4];
    assert_int_equal(eng_chat_stop_strings(ENG_CHAT_HARMONY, stops, 4), 2);
    assert_string_equal(stops[0], "<|return|>");
    assert_string_equal(stops[1], "<|call|>");
    assert_int_equal(eng_chat_tool_syntax_of(ENG_CHAT_HARMONY), ENG_CHAT_TOOLS_HARMONY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_think),
        cmocka_unit_test(test_deepseek_open),
        cmocka_unit_test(test_unclosed),
        cmocka_unit_test(test_resume_mid_thought),
        cmocka_unit_test(test_no_syntax),
        cmocka_unit_test(test_harmony_channels),
        cmocka_unit_test(test_harmony_calls),
        cmocka_unit_test(test_format_names),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_qwen3_enable_thinking),
        cmocka_unit_test(test_tool_loop_thought),
        cmocka_unit_test(test_deepseek_render),
        cmocka_unit_test(test_harmony_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
