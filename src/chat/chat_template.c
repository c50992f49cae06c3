/* chat_template.c - chat messages -> prompt text per model family (see
 * chat_template.h for the contract and docs/chat-templates.md for the
 * published formats each renderer follows).
 *
 * Rendering: validate() checks roles, contents and the family's ordering
 * rules without allocating; then the family's renderer runs twice over a
 * builder, once to measure and once to write (see chat_builder). The
 * builder records, for each byte range, whether it is template text or
 * client content: keeping the two apart is what lets
 * eng_chat_render_segments tell the caller where special tokens may be
 * parsed.
 */
#include "chat/chat_template.h"
#include "chat/chat_template-impl.h"

#include "common/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef enum chat_role {
    ROLE_SYSTEM,
    ROLE_USER,
    ROLE_ASSISTANT,
    ROLE_TOOL,
} chat_role;

static const char *const family_names[ENG_CHAT_N_FAMILIES] = {
    [ENG_CHAT_CHATML] = "chatml",   [ENG_CHAT_LLAMA2] = "llama2",
    [ENG_CHAT_LLAMA3] = "llama3",   [ENG_CHAT_MISTRAL] = "mistral",
    [ENG_CHAT_ZEPHYR] = "zephyr",   [ENG_CHAT_PHI3] = "phi3",
    [ENG_CHAT_GEMMA] = "gemma",     [ENG_CHAT_PHI4] = "phi4",
    [ENG_CHAT_QWEN3] = "qwen3",     [ENG_CHAT_DEEPSEEK_R1] = "deepseek-r1",
    [ENG_CHAT_HARMONY] = "harmony", [ENG_CHAT_QWEN3_THINKING] = "qwen3-thinking",
    [ENG_CHAT_LLAMA31] = "llama3.1",
};

static bool family_valid(eng_chat_family f)
{
    return (int)f >= 0 && (int)f < ENG_CHAT_N_FAMILIES;
}

const char *eng_chat_family_name(eng_chat_family f)
{
    return family_valid(f) ? family_names[f] : "unknown";
}

/* Lower-case, drop '-' and '_'; false when the result would not fit. */
static bool normalize_name(const char *name, char *buf, size_t cap)
{
    size_t k = 0;
    for (const char *p = name; *p; p++) {
        char c = *p;
        if (c == '-' || c == '_')
            continue;
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (k + 1 >= cap)
            return false;
        buf[k++] = c;
    }
    buf[k] = '\0';
    return true;
}

int eng_chat_family_from_name(const char *name, eng_chat_family *out)
{
    char norm[16], known[16];
    if (!name || !out || !normalize_name(name, norm, sizeof norm))
        return SW_EINVAL;
    if (strcmp(norm, "gptoss") == 0) {
        *out = ENG_CHAT_HARMONY;
        return SW_OK;
    }
    for (int i = 0; i < ENG_CHAT_N_FAMILIES; i++) {
        normalize_name(family_names[i], known, sizeof known);
        if (strcmp(norm, known) == 0) {
            *out = (eng_chat_family)i;
            return SW_OK;
        }
    }
    return SW_EINVAL;
}

const char *eng_chat_source_name(eng_chat_source s)
{
    switch (s) {
    case ENG_CHAT_FROM_OVERRIDE: return "override";
    case ENG_CHAT_FROM_TEMPLATE: return "template";
    case ENG_CHAT_FALLBACK_MISSING: return "fallback-missing";
    case ENG_CHAT_FALLBACK_UNKNOWN: return "fallback-unknown";
    }
    return "unknown";
}

/* ---- detection ---------------------------------------------------------- */

/* memmem over a template that need not be NUL-terminated. */
static bool contains(const char *hay, size_t len, const char *needle)
{
    return memmem(hay, len, needle, strlen(needle)) != NULL;
}

/* Order matters: a template is classified by the first rule it matches.
 * Harmony's and DeepSeek's markers are their own (DeepSeek's with a
 * thought: R1's templates write "<think>" or drop "</think>" from earlier
 * turns, V3's do neither); a ChatML template that writes "<think>" is
 * Qwen3's (or a fine-tune's of it), and one whose generation prompt opens
 * the thought ("assistant\n<think>\n" in the Jinja source) a thinking-only
 * Qwen3's. Phi-4 writes ChatML's markers with its own separator, so it goes
 * first (as in llama.cpp's detection); then ChatML, because ChatML
 * fine-tunes of other bases keep their base's vocabulary but not its
 * markers; "[INST]" with "<<SYS>>" must be tried before plain "[INST]".
 * Zephyr's template writes its turn end as the eos_token variable rather
 * than a literal "</s>", hence both. */
static bool detect(const char *t, size_t len, eng_chat_family *out)
{
    if (!t || len == 0)
        return false;
    if (contains(t, len, "<|channel|>"))
        *out = ENG_CHAT_HARMONY;
    else if (contains(t, len, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>") && /* <｜Assistant｜> */
             contains(t, len, "think>"))
        *out = ENG_CHAT_DEEPSEEK_R1; /* DeepSeek-V3's own format has no thought */
    else if (contains(t, len, "<|im_sep|>"))
        *out = ENG_CHAT_PHI4;
    else if (contains(t, len, "<|im_start|>"))
        *out = contains(t, len, "assistant\\n<think>\\n") ? ENG_CHAT_QWEN3_THINKING
               : contains(t, len, "<think>")              ? ENG_CHAT_QWEN3
                                                          : ENG_CHAT_CHATML;
    else if (contains(t, len, "<|start_header_id|>"))
        *out = contains(t, len, "Cutting Knowledge Date") ? ENG_CHAT_LLAMA31 : ENG_CHAT_LLAMA3;
    else if (contains(t, len, "<start_of_turn>"))
        *out = ENG_CHAT_GEMMA;
    else if (contains(t, len, "[INST]"))
        *out = contains(t, len, "<<SYS>>") ? ENG_CHAT_LLAMA2 : ENG_CHAT_MISTRAL;
    else if (contains(t, len, "<|user|>") && contains(t, len, "<|end|>"))
        *out = ENG_CHAT_PHI3;
    else if (contains(t, len, "<|user|>") &&
             (contains(t, len, "</s>") || contains(t, len, "eos_token")))
        *out = ENG_CHAT_ZEPHYR;
    else
        return false;
    return true;
}

eng_chat_family eng_chat_detect(const char *jinja_template, size_t len, bool *is_fallback)
{
    eng_chat_family f = ENG_CHAT_CHATML;
    bool found = detect(jinja_template, len, &f);
    if (is_fallback)
        *is_fallback = !found;
    return found ? f : ENG_CHAT_CHATML;
}

/* Shared by detect_from_gguf and choose: *source says why. */
static int detect_gguf(const eng_gguf *g, eng_chat_family *out, eng_chat_source *source,
                       sw_error *err)
{
    const char *t = NULL;
    size_t len = 0;
    if (g) {
        int64_t kv = eng_gguf_find_key(g, ENG_CHAT_TEMPLATE_KEY);
        if (kv >= 0) {
            if (eng_gguf_kv_type(g, kv) != ENG_GGUF_STRING)
                return sw_error_set(err, SW_EFORMAT, "key '%s' has type %s, expected a string",
                                    ENG_CHAT_TEMPLATE_KEY,
                                    eng_gguf_type_name(eng_gguf_kv_type(g, kv)));
            int rc = eng_gguf_get_str(g, ENG_CHAT_TEMPLATE_KEY, &t, &len, err);
            if (rc < 0)
                return rc;
        }
    }
    if (!t || len == 0) {
        *out = ENG_CHAT_CHATML;
        *source = ENG_CHAT_FALLBACK_MISSING;
    } else if (detect(t, len, out)) {
        *source = ENG_CHAT_FROM_TEMPLATE;
    } else {
        *out = ENG_CHAT_CHATML;
        *source = ENG_CHAT_FALLBACK_UNKNOWN;
    }
    return SW_OK;
}

int eng_chat_detect_from_gguf(const eng_gguf *g, eng_chat_family *out, bool *is_fallback,
                              sw_error *err)
{
    if (!g || !out)
        return sw_error_set(err, SW_EINVAL, "eng_chat_detect_from_gguf: NULL argument");
    eng_chat_family f;
    eng_chat_source src;
    int rc = detect_gguf(g, &f, &src, err);
    if (rc < 0)
        return rc;
    *out = f;
    if (is_fallback)
        *is_fallback = src != ENG_CHAT_FROM_TEMPLATE;
    return SW_OK;
}

int eng_chat_choose(const eng_gguf *g, const char *override_name, eng_chat_family *out,
                    eng_chat_source *source, sw_error *err)
{
    if (!out)
        return sw_error_set(err, SW_EINVAL, "eng_chat_choose: NULL output");
    eng_chat_family f;
    eng_chat_source src;
    if (override_name && override_name[0] && strcmp(override_name, "auto") != 0) {
        if (eng_chat_family_from_name(override_name, &f) < 0)
            return sw_error_set(err, SW_EINVAL,
                                "unknown chat template family '%.64s' (expected auto, chatml, "
                                "llama2, llama3, llama3.1, mistral, zephyr, phi3, gemma, phi4, "
                                "qwen3, qwen3-thinking, deepseek-r1 or harmony)",
                                override_name);
        src = ENG_CHAT_FROM_OVERRIDE;
    } else {
        int rc = detect_gguf(g, &f, &src, err);
        if (rc < 0)
            return rc;
    }
    *out = f;
    if (source)
        *source = src;
    return SW_OK;
}

/* ---- validation --------------------------------------------------------- */

static bool parse_role(const char *s, chat_role *out)
{
    static const struct { const char *name; chat_role role; } roles[] = {
        {"system", ROLE_SYSTEM}, {"user", ROLE_USER},
        {"assistant", ROLE_ASSISTANT}, {"tool", ROLE_TOOL},
    };
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        if (strcmp(s, roles[i].name) == 0) {
            *out = roles[i].role;
            return true;
        }
    }
    return false;
}

/* Families whose format has only user/assistant turns (system folded into
 * the first user turn), and whose templates reject anything else. */
static bool family_alternates(eng_chat_family f)
{
    return f == ENG_CHAT_LLAMA2 || f == ENG_CHAT_MISTRAL || f == ENG_CHAT_GEMMA;
}

static int validate(eng_chat_family f, const eng_chat_message *msgs, size_t n,
                    bool add_generation_prompt, sw_error *err)
{
    if (!family_valid(f))
        return sw_error_set(err, SW_EINVAL, "unknown chat template family %d", (int)f);
    if (!msgs || n == 0)
        return sw_error_set(err, SW_EINVAL, "no messages to render");
    for (size_t i = 0; i < n; i++) {
        chat_role role = ROLE_USER;
        if (!msgs[i].role)
            return sw_error_set(err, SW_EINVAL, "message %zu has no role", i);
        if (!parse_role(msgs[i].role, &role)) {
            /* The role comes from a client: quote at most 32 bytes, printable
             * ASCII only, so the message stays valid UTF-8 for a JSON reply. */
            char shown[33];
            size_t k = 0;
            for (const char *p = msgs[i].role; *p && k < 32; p++)
                shown[k++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
            shown[k] = '\0';
            return sw_error_set(err, SW_EINVAL,
                                "message %zu has unknown role '%s' (expected system, developer, "
                                "user, assistant or tool)", i, shown);
        }
        if (!msgs[i].content)
            return sw_error_set(err, SW_EINVAL, "message %zu (%s) has no content", i,
                                msgs[i].role);
    }
    if (!family_alternates(f))
        return SW_OK;

    const char *name = eng_chat_family_name(f);
    size_t start = 0;
    chat_role role = ROLE_USER;
    parse_role(msgs[0].role, &role);
    if (role == ROLE_SYSTEM) {
        start = 1;
        if (n == 1)
            return sw_error_set(err, SW_EINVAL,
                                "%s folds the system message into the first user message, "
                                "but no user message follows it", name);
    }
    chat_role last = ROLE_USER;
    for (size_t i = start; i < n; i++) {
        parse_role(msgs[i].role, &role);
        if (role == ROLE_SYSTEM)
            return sw_error_set(err, SW_EINVAL,
                                "message %zu: %s allows a system message only as the first "
                                "message", i, name);
        bool want_user = (i - start) % 2 == 0;
        bool is_user = role == ROLE_USER || role == ROLE_TOOL;
        if (want_user != is_user)
            return sw_error_set(err, SW_EINVAL,
                                "message %zu (%s): %s needs user and assistant messages to "
                                "alternate, starting with user, after the optional system "
                                "message", i, msgs[i].role, name);
        last = role;
    }
    if (add_generation_prompt && last == ROLE_ASSISTANT)
        return sw_error_set(err, SW_EINVAL,
                            "%s cannot add a generation prompt after an assistant message "
                            "(the last message must be from the user)", name);
    return SW_OK;
}

/* ---- the builder -------------------------------------------------------
 * Renderers run twice: first with text == NULL, which only measures (bytes
 * and segments), then into buffers of exactly that size. So an oversized
 * conversation is refused before anything is allocated, and the prompt is
 * one allocation instead of a growing one. */

void eng_chat__append(chat_builder *b, const char *s, size_t len, bool is_template)
{
    if (b->too_long || len == 0)
        return;
    if (len > ENG_CHAT_MAX_BYTES - b->len) {
        b->too_long = true;
        return;
    }
    if (b->n_segs > 0 && b->last_is_template == is_template) {
        if (b->segs)
            b->segs[b->n_segs - 1].len += len;
    } else {
        if (b->segs)
            b->segs[b->n_segs] = (eng_chat_segment){b->len, len, is_template};
        b->n_segs++;
        b->last_is_template = is_template;
    }
    if (b->text)
        memcpy(b->text + b->len, s, len);
    b->len += len;
}

static void tmpl(chat_builder *b, const char *s)
{
    eng_chat__append(b, s, strlen(s), true);
}

static bool is_trim_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static void content(chat_builder *b, const char *s, bool trim)
{
    size_t len = strlen(s);
    if (trim) {
        while (len > 0 && is_trim_space(*s)) {
            s++;
            len--;
        }
        while (len > 0 && is_trim_space(s[len - 1]))
            len--;
    }
    eng_chat__append(b, s, len, false);
}

/* The first "</think>" that lies wholly in s[0..len), or NULL. */
static const char *think_close(const char *s, size_t len)
{
    return memmem(s, len, "</think>", 8);
}

/* The thought of an assistant turn is looked for in its first scope[i]
 * bytes (scope NULL: all of them): its content as the client sent it, not
 * the tool calls written after it (a "</think>" in a call's arguments is
 * not the end of a thought, as the templates split message.content
 * only). */
static size_t thought_scope(const size_t *scope, const eng_chat_message *m, size_t i)
{
    return scope ? scope[i] : strlen(m[i].content);
}

/* An assistant turn of DeepSeek-R1 in the history: its thought is left
 * out, as its templates do - the text after the last "</think>" in its
 * first len bytes, as it is (content.split('</think>')[-1]: the newlines
 * that follow the thought stay, unlike Qwen3's, which drops them). */
static void content_answer(chat_builder *b, const char *s, size_t len)
{
    const char *p = s, *q;
    while ((q = think_close(p, len - (size_t)(p - s))) != NULL)
        p = q + 8;
    content(b, p, false);
}

/* ---- the renderers -------------------------------------------------------
 * Each writes one family's published format; the expected strings in
 * tests/unit/test_chat_template.c were written by hand from those formats.
 * Messages have been validated, so roles parse and the ordering rules hold. */

static chat_role role_of(const eng_chat_message *m)
{
    chat_role r = ROLE_USER;
    parse_role(m->role, &r);
    return r;
}

/* A tool result in Qwen's templates (Qwen2.5, Qwen3, QwQ; the Hermes tool
 * format): inside a user turn as "\n<tool_response>\n{content}\n
 * </tool_response>", the results that follow one another sharing that turn. */
static void chatml_tool_result(chat_builder *b, const eng_chat_message *m, size_t n, size_t i)
{
    if (i == 0 || role_of(&m[i - 1]) != ROLE_TOOL)
        tmpl(b, "<|im_start|>user");
    tmpl(b, "\n<tool_response>\n");
    content(b, m[i].content, false);
    tmpl(b, "\n</tool_response>");
    if (i + 1 == n || role_of(&m[i + 1]) != ROLE_TOOL)
        tmpl(b, "<|im_end|>\n");
}

/* ChatML (OpenAI's ChatML, as used by Qwen's templates):
 *   <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 * and tool results as Qwen's templates write them (chatml_tool_result). */
static void render_chatml(chat_builder *b, const eng_chat_message *m, size_t n, bool gen)
{
    for (size_t i = 0; i < n; i++) {
        if (role_of(&m[i]) == ROLE_TOOL) {
            chatml_tool_result(b, m, n, i);
            continue;
        }
        tmpl(b, "<|im_start|>");
        tmpl(b, m[i].role);
        tmpl(b, "\n");
        content(b, m[i].content, false);
        tmpl(b, "<|im_end|>\n");
    }
    if (gen)
        tmpl(b, "<|im_start|>assistant\n");
}

/* Qwen3 (Qwen/Qwen3-* templates): ChatML; an assistant turn of the
 * history without its thought; with enable_thinking false the generation
 * prompt holds an empty thought so that the model answers at once. The
 * thinking-only models (Qwen3-*-Thinking-2507, QwQ) have no switch: their
 * generation prompt opens the thought (open). Tool results as ChatML's
 * (chatml_tool_result). */
static void content_span(chat_builder *b, const char *s, size_t len)
{
    eng_chat__append(b, s, len, false);
}

/* An assistant turn of Qwen3 after the last user message (a tool loop in
 * progress) keeps its thought, as Qwen3's template does: the
 * reasoning_content given, else the text before "</think>" in the content
 * (after "<think>"), newlines around it dropped; written when there is one
 * or the turn is the last message; the thought is looked for in the first
 * scope bytes of the content (thought_scope). */
static void qwen3_assistant(chat_builder *b, const eng_chat_message *m, size_t scope,
                            const char *reasoning, bool keep_thought, bool last)
{
    const char *c = m->content, *answer = c, *thought = "", *q;
    size_t thought_len = 0;
    if (reasoning) {
        thought = reasoning;
        thought_len = strlen(thought);
    } else if ((q = think_close(c, scope)) != NULL) {
        const char *open = NULL, *p = c, *o;
        while ((o = strstr(p, "<think>")) != NULL && o < q)
            open = o, p = o + 7;
        thought = open ? open + 7 : c;
        thought_len = (size_t)(q - thought);
        for (p = q; (q = think_close(p, scope - (size_t)(p - c))) != NULL;)
            p = q + 8;
        answer = p;
    }
    while (thought_len > 0 && *thought == '\n')
        thought++, thought_len--;
    while (thought_len > 0 && thought[thought_len - 1] == '\n')
        thought_len--;
    bool block = keep_thought && (thought_len > 0 || last);
    if (answer != c || block)
        while (*answer == '\n')
            answer++;
    if (block) {
        tmpl(b, "<think>\n");
        content_span(b, thought, thought_len);
        tmpl(b, "\n</think>\n\n");
    }
    content(b, answer, false);
}

static void render_qwen3(chat_builder *b, const eng_chat_message *m, size_t n, bool gen,
                         bool thinking_off, bool open, const char *const *reasoning,
                         const size_t *scope)
{
    size_t last_query = n - 1; /* no user message: no turn keeps its thought */
    for (size_t i = n; i-- > 0;)
        if (role_of(&m[i]) == ROLE_USER) {
            last_query = i;
            break;
        }
    for (size_t i = 0; i < n; i++) {
        if (role_of(&m[i]) == ROLE_TOOL) {
            chatml_tool_result(b, m, n, i);
            continue;
        }
        tmpl(b, "<|im_start|>");
        tmpl(b, m[i].role);
        tmpl(b, "\n");
        if (role_of(&m[i]) == ROLE_ASSISTANT)
            qwen3_assistant(b, &m[i], thought_scope(scope, m, i), reasoning ? reasoning[i] : NULL,
                            i > last_query, i == n - 1);
        else
            content(b, m[i].content, false);
        tmpl(b, "<|im_end|>\n");
    }
    if (gen)
        tmpl(b, open           ? "<|im_start|>assistant\n<think>\n"
                : thinking_off ? "<|im_start|>assistant\n<think>\n\n</think>\n\n"
                               : "<|im_start|>assistant\n");
}

/* DeepSeek-R1 and its distills (deepseek-ai/DeepSeek-R1-Distill-* templates):
 * BOS, the system messages joined by a blank line, then
 *   <｜User｜>{content}<｜Assistant｜>{answer}<｜end▁of▁sentence｜> ...
 * and <｜Assistant｜><think>\n to generate (the current templates open the
 * thought; the model was trained to begin with it, so older templates,
 * which leave it to the model, get it too). No trimming; an assistant turn
 * without its thought. Tool results are written as user turns (the generic
 * tool syntax). */
#define DS_BAR "\xef\xbd\x9c" /* U+FF5C, the full-width bar of its markers */
#define DS_SPACE "\xe2\x96\x81" /* U+2581 */
static void render_deepseek_r1(chat_builder *b, const eng_chat_message *m, size_t n, bool gen,
                               const size_t *scope)
{
    tmpl(b, "<" DS_BAR "begin" DS_SPACE "of" DS_SPACE "sentence" DS_BAR ">");
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        if (role_of(&m[i]) != ROLE_SYSTEM)
            continue;
        if (!first)
            tmpl(b, "\n\n");
        content(b, m[i].content, false);
        first = false;
    }
    for (size_t i = 0; i < n; i++) {
        chat_role r = role_of(&m[i]);
        if (r == ROLE_SYSTEM)
            continue;
        if (r == ROLE_ASSISTANT) {
            tmpl(b, "<" DS_BAR "Assistant" DS_BAR ">");
            content_answer(b, m[i].content, thought_scope(scope, m, i));
            tmpl(b, "<" DS_BAR "end" DS_SPACE "of" DS_SPACE "sentence" DS_BAR ">");
        } else {
            tmpl(b, "<" DS_BAR "User" DS_BAR ">");
            content(b, m[i].content, false);
        }
    }
    if (gen)
        tmpl(b, "<" DS_BAR "Assistant" DS_BAR "><think>\n");
}

/* Llama 2 chat (Meta's llama generation.py chat_completion, and the Hugging
 * Face Llama 2 template): every exchange is BOS "[INST] {user} [/INST]
 * {answer} " EOS, the system text inside the first [INST] as
 * "<<SYS>>\n{system}\n<</SYS>>\n\n", contents stripped. */
static void render_llama2(chat_builder *b, const eng_chat_message *m, size_t n)
{
    const char *system = NULL;
    size_t i = 0;
    if (role_of(&m[0]) == ROLE_SYSTEM) {
        system = m[0].content;
        i = 1;
    }
    for (; i < n; i++) {
        if (role_of(&m[i]) == ROLE_ASSISTANT) {
            tmpl(b, " ");
            content(b, m[i].content, true);
            tmpl(b, " </s>");
            continue;
        }
        tmpl(b, "<s>[INST] ");
        if (system) {
            tmpl(b, "<<SYS>>\n");
            content(b, system, true);
            tmpl(b, "\n<</SYS>>\n\n");
            system = NULL;
        }
        content(b, m[i].content, true);
        tmpl(b, " [/INST]");
    }
}

/* Llama 3 (Meta's Llama 3 model card / Hugging Face template):
 *   <|begin_of_text|> then per message
 *   <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>
 *   and <|start_header_id|>assistant<|end_header_id|>\n\n to generate.
 * Tool results use Llama 3.1's "ipython" role. */
static void render_llama3(chat_builder *b, const eng_chat_message *m, size_t n, bool gen)
{
    tmpl(b, "<|begin_of_text|>");
    for (size_t i = 0; i < n; i++) {
        tmpl(b, "<|start_header_id|>");
        tmpl(b, role_of(&m[i]) == ROLE_TOOL ? "ipython" : m[i].role);
        tmpl(b, "<|end_header_id|>\n\n");
        content(b, m[i].content, true);
        tmpl(b, "<|eot_id|>");
    }
    if (gen)
        tmpl(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Llama 3.1, 3.2 and 3.3 (their Hugging Face templates): Llama 3 with a
 * system turn always first, holding "Environment: ipython" when tools are
 * offered, "Cutting Knowledge Date: December 2023", "Today Date: D" (the
 * template's date_string, e.g. "26 Jul 2024": date, "YYYY-MM-DD", written
 * so; without one the template's own default) and a blank line, then the
 * first message's text when it is a system message (trimmed). */
static void render_llama31(chat_builder *b, const eng_chat_message *m, size_t n, bool gen,
                           bool tools, const char *date)
{
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    char today[12] = "26 Jul 2024";
    bool iso = date && strlen(date) == 10 && date[4] == '-' && date[7] == '-';
    for (int k = 0; iso && k < 10; k++)
        iso = k == 4 || k == 7 || (date[k] >= '0' && date[k] <= '9');
    int month = iso ? (date[5] - '0') * 10 + (date[6] - '0') : 0;
    if (iso && month >= 1 && month <= 12) { /* "YYYY-MM-DD" -> "DD Mon YYYY" */
        memcpy(today, date + 8, 2);
        memcpy(today + 3, months[month - 1], 3);
        memcpy(today + 7, date, 4);
    }
    tmpl(b, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n");
    if (tools)
        tmpl(b, "Environment: ipython\n");
    tmpl(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    tmpl(b, today);
    tmpl(b, "\n\n");
    size_t i = 0;
    if (n > 0 && role_of(&m[0]) == ROLE_SYSTEM) {
        content(b, m[0].content, true);
        i = 1;
    }
    tmpl(b, "<|eot_id|>");
    for (; i < n; i++) {
        tmpl(b, "<|start_header_id|>");
        tmpl(b, role_of(&m[i]) == ROLE_TOOL ? "ipython" : m[i].role);
        tmpl(b, "<|end_header_id|>\n\n");
        content(b, m[i].content, true);
        tmpl(b, "<|eot_id|>");
    }
    if (gen)
        tmpl(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Mistral instruct (the Mistral-7B-Instruct model card:
 * "<s>[INST] Instruction [/INST] Model answer</s>[INST] Follow-up
 * instruction [/INST]"), with the system text prepended to the first user
 * message and a blank line, as Mistral's later templates do. No trimming. */
static void render_mistral(chat_builder *b, const eng_chat_message *m, size_t n)
{
    const char *system = NULL;
    size_t i = 0;
    if (role_of(&m[0]) == ROLE_SYSTEM) {
        system = m[0].content;
        i = 1;
    }
    tmpl(b, "<s>");
    for (; i < n; i++) {
        if (role_of(&m[i]) == ROLE_ASSISTANT) {
            tmpl(b, " ");
            content(b, m[i].content, false);
            tmpl(b, "</s>");
            continue;
        }
        tmpl(b, "[INST] ");
        if (system) {
            content(b, system, false);
            tmpl(b, "\n\n");
            system = NULL;
        }
        content(b, m[i].content, false);
        tmpl(b, " [/INST]");
    }
}

/* Phi-4 (microsoft/phi-4's template): ChatML's markers, the role followed
 * by <|im_sep|> instead of a newline and nothing after <|im_end|>:
 *   <|im_start|>{role}<|im_sep|>{content}<|im_end|> ...
 *   <|im_start|>assistant<|im_sep|>
 * Its template has no tool role (it drops such messages); as for the other
 * families without one, tool results are written as user turns. */
static void render_phi4(chat_builder *b, const eng_chat_message *m, size_t n, bool gen)
{
    for (size_t i = 0; i < n; i++) {
        tmpl(b, "<|im_start|>");
        tmpl(b, role_of(&m[i]) == ROLE_TOOL ? "user" : m[i].role);
        tmpl(b, "<|im_sep|>");
        content(b, m[i].content, false);
        tmpl(b, "<|im_end|>");
    }
    if (gen)
        tmpl(b, "<|im_start|>assistant<|im_sep|>");
}

/* Zephyr (HuggingFaceH4/zephyr-7b-beta model card and template) and Phi-3
 * (microsoft/Phi-3-mini-4k-instruct model card and template) share a shape:
 *   <|{role}|>\n{content}{end}\n ... <|assistant|>\n
 * with end "</s>" (Zephyr's eos_token) or "<|end|>" (Phi-3). Neither has a
 * tool role: tool results are written as user turns. */
static void render_tagged(chat_builder *b, const eng_chat_message *m, size_t n, bool gen,
                          const char *end)
{
    for (size_t i = 0; i < n; i++) {
        tmpl(b, "<|");
        tmpl(b, role_of(&m[i]) == ROLE_TOOL ? "user" : m[i].role);
        tmpl(b, "|>\n");
        content(b, m[i].content, false);
        tmpl(b, end);
        tmpl(b, "\n");
    }
    if (gen)
        tmpl(b, "<|assistant|>\n");
}

/* Gemma (google/gemma-7b-it and Gemma 2/3 model cards and templates):
 *   <bos><start_of_turn>user\n{content}<end_of_turn>\n
 *   <start_of_turn>model\n{content}<end_of_turn>\n ... <start_of_turn>model\n
 * Contents trimmed; a system message becomes "{system}\n\n" at the start of
 * the first user turn (Gemma 3's template), not trimmed. */
static void render_gemma(chat_builder *b, const eng_chat_message *m, size_t n, bool gen)
{
    const char *system = NULL;
    size_t i = 0;
    if (role_of(&m[0]) == ROLE_SYSTEM) {
        system = m[0].content;
        i = 1;
    }
    tmpl(b, "<bos>");
    for (; i < n; i++) {
        bool model = role_of(&m[i]) == ROLE_ASSISTANT;
        tmpl(b, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (system) {
            content(b, system, false);
            tmpl(b, "\n\n");
            system = NULL;
        }
        content(b, m[i].content, true);
        tmpl(b, "<end_of_turn>\n");
    }
    if (gen)
        tmpl(b, "<start_of_turn>model\n");
}

static void render(eng_chat_family f, chat_builder *b, const eng_chat_message *msgs,
                   const eng_chat_message_tools *ext, size_t n, const eng_chat_options *o,
                   const size_t *scope)
{
    bool gen = o->add_generation_prompt;
    switch (f) {
    case ENG_CHAT_CHATML: render_chatml(b, msgs, n, gen); break;
    case ENG_CHAT_QWEN3:
        render_qwen3(b, msgs, n, gen, o->thinking_off, false, o->reasoning, scope);
        break;
    case ENG_CHAT_QWEN3_THINKING:
        render_qwen3(b, msgs, n, gen, false, true, o->reasoning, scope);
        break;
    case ENG_CHAT_DEEPSEEK_R1: render_deepseek_r1(b, msgs, n, gen, scope); break;
    case ENG_CHAT_HARMONY: eng_chat__render_harmony(b, msgs, ext, n, o); break;
    case ENG_CHAT_LLAMA2: render_llama2(b, msgs, n); break;
    case ENG_CHAT_LLAMA3: render_llama3(b, msgs, n, gen); break;
    case ENG_CHAT_LLAMA31:
        render_llama31(b, msgs, n, gen, o->tools_text && o->tools_text[0], o->date);
        break;
    case ENG_CHAT_MISTRAL: render_mistral(b, msgs, n); break;
    case ENG_CHAT_ZEPHYR: render_tagged(b, msgs, n, gen, "</s>"); break;
    case ENG_CHAT_PHI3: render_tagged(b, msgs, n, gen, "<|end|>"); break;
    case ENG_CHAT_GEMMA: render_gemma(b, msgs, n, gen); break;
    case ENG_CHAT_PHI4: render_phi4(b, msgs, n, gen); break;
    }
}

/* Renders with options: ext only for families that render the tool parts
 * themselves (harmony). */
/* scope: where each assistant turn's thought is looked for (thought_scope;
 * NULL: the whole content). */
static int render_segments(eng_chat_family f, const eng_chat_message *msgs,
                           const eng_chat_message_tools *ext, size_t n, const eng_chat_options *o,
                           const size_t *scope, char **out, size_t *out_len,
                           eng_chat_segment **segments_out, size_t *n_segments, sw_error *err)
{
    if (!out)
        return sw_error_set(err, SW_EINVAL, "eng_chat_render: NULL output");
    int rc = validate(f, msgs, n, o->add_generation_prompt, err);
    if (rc < 0)
        return rc;

    chat_builder measure = {0};
    render(f, &measure, msgs, ext, n, o, scope);
    if (measure.failed)
        return sw_error_set(err, SW_ENOMEM, "out of memory rendering the chat prompt");
    if (measure.too_long)
        return sw_error_set(err, SW_ERANGE, "rendered chat prompt would exceed %zu bytes",
                            ENG_CHAT_MAX_BYTES);

    chat_builder b = {0};
    b.text = sw_malloc(measure.len + 1);
    b.segs = sw_calloc(measure.n_segs ? measure.n_segs : 1, sizeof *b.segs);
    if (!b.text || !b.segs) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory rendering the chat prompt");
        goto fail;
    }
    render(f, &b, msgs, ext, n, o, scope);
    if (b.failed) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory rendering the chat prompt");
        goto fail;
    }
    if (b.len != measure.len || b.n_segs != measure.n_segs) {
        rc = sw_error_set(err, SW_EINTERNAL, "chat prompt changed size between passes");
        goto fail;
    }
    b.text[b.len] = '\0';

    *out = b.text;
    if (out_len)
        *out_len = b.len;
    if (segments_out)
        *segments_out = b.segs;
    else
        sw_free(b.segs);
    if (n_segments)
        *n_segments = b.n_segs;
    return SW_OK;

fail:
    sw_free(b.text);
    sw_free(b.segs);
    return rc;
}

int eng_chat_render_segments(eng_chat_family f, const eng_chat_message *msgs, size_t n,
                             bool add_generation_prompt, char **out, size_t *out_len,
                             eng_chat_segment **segments_out, size_t *n_segments,
                             sw_error *err)
{
    eng_chat_options o = {.add_generation_prompt = add_generation_prompt};
    return render_segments(f, msgs, NULL, n, &o, NULL, out, out_len, segments_out, n_segments,
                           err);
}

int eng_chat_render(eng_chat_family f, const eng_chat_message *msgs, size_t n,
                    bool add_generation_prompt, char **out, size_t *out_len, sw_error *err)
{
    return eng_chat_render_segments(f, msgs, n, add_generation_prompt, out, out_len, NULL,
                                    NULL, err);
}

/* ---- tools ------------------------------------------------------------------
 * The tool parts become ordinary message text first (a system section, the
 * calls appended to the assistant text), then the family's renderer runs
 * unchanged, so every family's rules (trimming, folding, alternation) apply
 * to tool prompts too. */

eng_chat_tool_syntax eng_chat_tool_syntax_of(eng_chat_family f)
{
    return f == ENG_CHAT_LLAMA3 || f == ENG_CHAT_LLAMA31 ? ENG_CHAT_TOOLS_LLAMA3_JSON
           : f == ENG_CHAT_HARMONY ? ENG_CHAT_TOOLS_HARMONY
                                   : ENG_CHAT_TOOLS_HERMES;
}

/* A growable string with a hard cap (ENG_CHAT_MAX_BYTES). */
typedef struct chat_text {
    char *p;
    size_t len, cap;
    bool failed;
} chat_text;

static void text_add(chat_text *t, const char *s)
{
    size_t n = strlen(s);
    if (t->failed)
        return;
    if (n > ENG_CHAT_MAX_BYTES - t->len) {
        t->failed = true;
        return;
    }
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *p = sw_realloc(t->p, cap);
        if (!p) {
            t->failed = true;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
}

/* The system text with the tools section. */
static char *tools_system(eng_chat_family f, const char *system, const char *tools_text)
{
    chat_text t = {0};
    text_add(&t, "");
    if (eng_chat_tool_syntax_of(f) == ENG_CHAT_TOOLS_LLAMA3_JSON) {
        if (system && system[0]) {
            text_add(&t, system);
            text_add(&t, "\n\n");
        }
        text_add(&t, "You have access to the following functions. To call a function, please "
                     "respond with JSON for a function call. Respond in the format "
                     "{\"name\": function name, \"parameters\": dictionary of argument name "
                     "and its value}. Do not use variables.\n\n");
        /* one definition per line, each followed by a blank line */
        for (const char *p = tools_text; *p;) {
            const char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            if (n > 0) {
                char *line = sw_strndup(p, n);
                if (!line)
                    t.failed = true;
                else
                    text_add(&t, line);
                sw_free(line);
                text_add(&t, "\n\n");
            }
            p += n + (nl != NULL);
        }
    } else {
        if (system && system[0]) {
            text_add(&t, system);
            text_add(&t, "\n\n");
        }
        text_add(&t, "# Tools\n\nYou may call one or more functions to assist with the user "
                     "query.\n\nYou are provided with function signatures within "
                     "<tools></tools> XML tags:\n<tools>\n");
        text_add(&t, tools_text);
        if (t.len > 0 && t.p && t.p[t.len - 1] != '\n')
            text_add(&t, "\n");
        text_add(&t, "</tools>\n\nFor each function call, return a json object with function "
                     "name and arguments within <tool_call></tool_call> XML tags:\n"
                     "<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                     "<args-json-object>}\n</tool_call>");
    }
    if (t.failed) {
        sw_free(t.p);
        return NULL;
    }
    return t.p;
}

/* The assistant text with its calls. */
static char *tools_assistant(eng_chat_family f, const char *content,
                             const eng_chat_message_tools *x)
{
    chat_text t = {0};
    bool llama3 = eng_chat_tool_syntax_of(f) == ENG_CHAT_TOOLS_LLAMA3_JSON;
    text_add(&t, content ? content : "");
    for (size_t k = 0; k < x->n_calls; k++) {
        if (t.len > 0)
            text_add(&t, "\n");
        text_add(&t, llama3 ? "{\"name\": \"" : "<tool_call>\n{\"name\": \"");
        text_add(&t, x->calls[k].name);
        text_add(&t, llama3 ? "\", \"parameters\": " : "\", \"arguments\": ");
        text_add(&t, x->calls[k].arguments);
        text_add(&t, llama3 ? "}" : "}\n</tool_call>");
    }
    if (t.failed) {
        sw_free(t.p);
        return NULL;
    }
    return t.p;
}

int eng_chat_render_tools(eng_chat_family f, const eng_chat_message *msgs,
                          const eng_chat_message_tools *ext, size_t n, const char *tools_text,
                          bool add_generation_prompt, char **out, size_t *out_len,
                          eng_chat_segment **segments_out, size_t *n_segments, sw_error *err)
{
    eng_chat_options o = {.tools_text = tools_text, .add_generation_prompt = add_generation_prompt};
    return eng_chat_render_with(f, msgs, ext, n, &o, out, out_len, segments_out, n_segments, err);
}

int eng_chat_render_with(eng_chat_family f, const eng_chat_message *msgs,
                         const eng_chat_message_tools *ext, size_t n, const eng_chat_options *o,
                         char **out, size_t *out_len, eng_chat_segment **segments_out,
                         size_t *n_segments, sw_error *err)
{
    if (!o)
        return sw_error_set(err, SW_EINVAL, "eng_chat_render_with: NULL options");
    const char *tools_text = o->tools_text;
    bool with_tools = tools_text && tools_text[0];
    /* harmony writes tools, calls and results in messages of their own */
    bool own_tools = f == ENG_CHAT_HARMONY;
    for (size_t i = 0; own_tools && ext && msgs && i < n; i++)
        for (size_t k = 0; k < ext[i].n_calls; k++)
            if (!ext[i].calls || !ext[i].calls[k].name || !ext[i].calls[k].arguments ||
                !msgs[i].role || strcmp(msgs[i].role, "assistant") != 0)
                return sw_error_set(err, SW_EINVAL, "message %zu: tool call %zu has no name or "
                                    "arguments, or is not an assistant's", i, k);
    if (own_tools || (!with_tools && !ext))
        return render_segments(f, msgs, own_tools ? ext : NULL, n, o, NULL, out, out_len,
                               segments_out, n_segments, err);
    if (!msgs || n == 0)
        return sw_error_set(err, SW_EINVAL, "no messages to render");
    if (n > SIZE_MAX / sizeof(eng_chat_message) - 1)
        return sw_error_set(err, SW_ERANGE, "too many messages");
    /* at most one message added (the system message of the tools section) */
    eng_chat_message *m = sw_calloc(n + 1, sizeof *m);
    char **owned = sw_calloc(n + 1, sizeof *owned);
    const char **thoughts = sw_calloc(n + 1, sizeof *thoughts); /* o->reasoning, as m */
    size_t *scope = sw_calloc(n + 1, sizeof *scope);            /* thought_scope, as m */
    size_t n_m = 0;
    int rc = SW_OK;
    if (!m || !owned || !thoughts || !scope) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory rendering the chat prompt");
        goto done;
    }
    for (size_t i = 0; ext && i < n; i++) {
        if (ext[i].n_calls == 0)
            continue;
        if (!msgs[i].role || strcmp(msgs[i].role, "assistant") != 0) {
            rc = sw_error_set(err, SW_EINVAL, "message %zu: only assistant messages carry tool "
                              "calls", i);
            goto done;
        }
        for (size_t k = 0; k < ext[i].n_calls; k++)
            if (!ext[i].calls || !ext[i].calls[k].name || !ext[i].calls[k].arguments) {
                rc = sw_error_set(err, SW_EINVAL, "message %zu: tool call %zu has no name or "
                                  "arguments", i, k);
                goto done;
            }
    }
    size_t first = 0;
    if (with_tools) {
        bool has_system = msgs[0].role && strcmp(msgs[0].role, "system") == 0;
        owned[n_m] = tools_system(f, has_system ? msgs[0].content : NULL, tools_text);
        if (!owned[n_m]) {
            rc = sw_error_set(err, SW_ENOMEM, "out of memory rendering the tools");
            goto done;
        }
        m[n_m] = (eng_chat_message){"system", owned[n_m]};
        scope[n_m] = strlen(owned[n_m]);
        n_m++;
        first = has_system ? 1 : 0;
    }
    for (size_t i = first; i < n; i++) {
        m[n_m] = msgs[i];
        scope[n_m] = msgs[i].content ? strlen(msgs[i].content) : 0; /* before the calls */
        thoughts[n_m] = o->reasoning ? o->reasoning[i] : NULL;
        if (ext && ext[i].n_calls > 0) {
            owned[n_m] = tools_assistant(f, msgs[i].content, &ext[i]);
            if (!owned[n_m]) {
                rc = sw_error_set(err, SW_ENOMEM, "out of memory rendering the tool calls");
                goto done;
            }
            m[n_m].content = owned[n_m];
        }
        n_m++;
    }
    eng_chat_options shifted = *o;
    shifted.reasoning = o->reasoning ? thoughts : NULL;
    rc = render_segments(f, m, NULL, n_m, &shifted, scope, out, out_len, segments_out, n_segments,
                         err);
done:
    for (size_t i = 0; owned && i < n + 1; i++)
        sw_free(owned[i]);
    sw_free(owned);
    sw_free(thoughts);
    sw_free(scope);
    sw_free(m);
    return rc;
}

/* ---- tokenizing a rendered prompt ----------------------------------------
 * The tokenizer does the work (eng_tokenize_spans): special-token text is
 * matched only in the template's own segments, never in client content, and
 * plain text across a segment boundary is one stretch, as in the whole
 * text. */

int eng_chat_tokenize(const eng_tokenizer *tok, const char *text, size_t len,
                      const eng_chat_segment *segments, size_t n_segments, bool add_bos,
                      int32_t **ids_out, size_t *n_out, sw_error *err)
{
    if (!tok || !ids_out || !n_out || (!text && len > 0) || (!segments && n_segments > 0))
        return sw_error_set(err, SW_EINVAL, "eng_chat_tokenize: NULL argument");
    eng_text_span *spans = sw_calloc(n_segments ? n_segments : 1, sizeof *spans);
    if (!spans)
        return sw_error_set(err, SW_ENOMEM, "eng_chat_tokenize: out of memory");
    for (size_t i = 0; i < n_segments; i++)
        spans[i] = (eng_text_span){segments[i].offset, segments[i].len, segments[i].is_template};
    int rc = eng_tokenize_spans(tok, text, len, spans, n_segments, add_bos, ids_out, n_out, err);
    sw_free(spans);
    return rc;
}

/* ---- stop strings and BOS ------------------------------------------------ */

size_t eng_chat_stop_strings(eng_chat_family f, const char **out, size_t cap)
{
    static const char *const chatml[] = {"<|im_end|>"};
    static const char *const eos[] = {"</s>"};
    static const char *const llama3[] = {"<|eot_id|>", "<|eom_id|>"};
    static const char *const phi3[] = {"<|end|>"};
    static const char *const gemma[] = {"<end_of_turn>"};
    static const char *const deepseek[] = {
        "<" DS_BAR "end" DS_SPACE "of" DS_SPACE "sentence" DS_BAR ">"};
    static const char *const harmony[] = {"<|return|>", "<|call|>"};
    const char *const *list = NULL;
    size_t count = 0;
    switch (f) {
    case ENG_CHAT_CHATML:
    case ENG_CHAT_QWEN3:
    case ENG_CHAT_QWEN3_THINKING:
    case ENG_CHAT_PHI4: list = chatml; count = 1; break;
    case ENG_CHAT_DEEPSEEK_R1: list = deepseek; count = 1; break;
    case ENG_CHAT_HARMONY: list = harmony; count = 2; break;
    case ENG_CHAT_LLAMA2:
    case ENG_CHAT_MISTRAL:
    case ENG_CHAT_ZEPHYR: list = eos; count = 1; break;
    case ENG_CHAT_LLAMA3:
    case ENG_CHAT_LLAMA31: list = llama3; count = 2; break;
    case ENG_CHAT_PHI3: list = phi3; count = 1; break;
    case ENG_CHAT_GEMMA: list = gemma; count = 1; break;
    }
    for (size_t i = 0; out && i < count && i < cap; i++)
        out[i] = list[i];
    return count;
}

const char *eng_chat_bos_text(eng_chat_family f)
{
    switch (f) {
    case ENG_CHAT_LLAMA2:
    case ENG_CHAT_MISTRAL: return "<s>";
    case ENG_CHAT_LLAMA3:
    case ENG_CHAT_LLAMA31: return "<|begin_of_text|>";
    case ENG_CHAT_GEMMA: return "<bos>";
    case ENG_CHAT_DEEPSEEK_R1:
        return "<" DS_BAR "begin" DS_SPACE "of" DS_SPACE "sentence" DS_BAR ">";
    case ENG_CHAT_CHATML:
    case ENG_CHAT_QWEN3:
    case ENG_CHAT_QWEN3_THINKING:
    case ENG_CHAT_HARMONY:
    case ENG_CHAT_ZEPHYR:
    case ENG_CHAT_PHI3:
    case ENG_CHAT_PHI4: return NULL;
    }
    return NULL;
}

bool eng_chat_tokenize_add_bos(eng_chat_family f, bool vocab_add_bos)
{
    return vocab_add_bos && eng_chat_bos_text(f) == NULL;
}
