/* fuzz_chat_template.c - libFuzzer harness for chat-template rendering.
 *
 * Input: one byte of options (bit 0: add_generation_prompt, bit 1: the
 * first record is a tools text, bits 2..3: the vocabulary the prompt is
 * tokenized with: built-in, qwen2, llama-bpe or llama-spm when ../shared
 * has them, bits 4..7: the family whose prompt is tokenized), then
 * records cut at 0x1E, one message each: a role byte (system, user,
 * assistant, tool, or a role no family knows) and the content; in an
 * assistant message, 0x1F cuts the content from its tool calls (name 0x1F
 * arguments, repeated).
 *
 * Every family renders the messages three ways (eng_chat_render, _segments
 * and _tools without tools), then with the tools and calls, and one
 * family's prompt is tokenized as the worker does. Invariants: the three
 * ways agree (code, text, length); an error is typed, says why, and
 * leaves the outputs untouched; segments tile the text in order,
 * non-empty, alternating; the client-content segments are exactly the
 * contents (each trimmed as its family trims it), so no client byte is
 * ever template text and no template byte is ever content; with tools,
 * each content is still inside the content segments; token ids lie in the
 * vocabulary, and the prompt has no more control tokens than the template
 * text spells (plus the BOS the tokenizer adds): a client cannot forge a
 * turn marker.
 */
#include "chat/chat_template.h"

#include "fuzzlib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_MESSAGES 32
#define FZ_MAX_CALLS 4

static const char *const fz_roles[5] = {"system", "user", "assistant", "tool", "moderator"};

static const eng_tokenizer *fz_vocab_get(int which)
{
    static const char *const files[4] = {NULL, "ggml-vocab-qwen2.gguf", "ggml-vocab-llama-bpe.gguf",
                                         "ggml-vocab-llama-spm.gguf"};
    static const eng_tokenizer *toks[4];
    static bool tried[4];
    if (!tried[which]) {
        tried[which] = true;
        toks[which] = which == 0 ? fz_builtin_tokenizer() : fz_shared_tokenizer(files[which]);
    }
    if (!toks[which])
        return which == 0 ? NULL : fz_vocab_get(0);
    return toks[which];
}

static bool trim_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* The content as family f writes it for message i of n (trimmed or not),
 * and before it (*tlen > 0) the thought Qwen3 keeps for an assistant turn
 * after the last user message (its template's rule, chat_template.c). */
static void expected_content(eng_chat_family f, const eng_chat_message *m, size_t n, size_t i,
                             const char **s, size_t *len, const char **t, size_t *tlen)
{
    bool system = !strcmp(m[i].role, "system");
    bool trim = f == ENG_CHAT_LLAMA2 || f == ENG_CHAT_LLAMA3 || f == ENG_CHAT_LLAMA31 ||
                (f == ENG_CHAT_GEMMA && !system);
    *s = m[i].content;
    *len = strlen(m[i].content);
    *t = "";
    *tlen = 0;
    bool qwen3 = f == ENG_CHAT_QWEN3 || f == ENG_CHAT_QWEN3_THINKING;
    if ((qwen3 || f == ENG_CHAT_DEEPSEEK_R1) && !strcmp(m[i].role, "assistant")) {
        /* the thought of an earlier turn is left out */
        const char *c = *s, *p = c, *q, *first = strstr(c, "</think>");
        while ((q = strstr(p, "</think>")) != NULL)
            p = q + 8;
        size_t last_user = n - 1;
        for (size_t k = n; k-- > 0;)
            if (!strcmp(m[k].role, "user")) {
                last_user = k;
                break;
            }
        bool keep = qwen3 && i > last_user;
        if (keep && first) {
            const char *open = NULL, *o, *x = c;
            while ((o = strstr(x, "<think>")) != NULL && o < first)
                open = o, x = o + 7;
            *t = open ? open + 7 : c;
            *tlen = (size_t)(first - *t);
            while (*tlen > 0 && **t == '\n')
                (*t)++, (*tlen)--;
            while (*tlen > 0 && (*t)[*tlen - 1] == '\n')
                (*tlen)--;
        }
        bool block = keep && (*tlen > 0 || i == n - 1);
        /* DeepSeek-R1 keeps the newlines after the thought, Qwen3 drops them */
        if (qwen3 && (p != c || block))
            while (*p == '\n')
                p++;
        *len -= (size_t)(p - c);
        *s = p;
    }
    if (!trim)
        return;
    while (*len > 0 && trim_space(**s))
        (*s)++, (*len)--;
    while (*len > 0 && trim_space((*s)[*len - 1]))
        (*len)--;
}

/* Segments tile text[0..len) in order, non-empty, alternating. */
static void check_segments(const char *text, size_t len, const eng_chat_segment *seg, size_t n)
{
    size_t at = 0;
    FZ_CHECK(text && strlen(text) == len);
    FZ_CHECK(len == 0 || (seg && n > 0));
    for (size_t i = 0; i < n; i++) {
        FZ_CHECK(seg[i].offset == at && seg[i].len > 0 && seg[i].len <= len - at);
        FZ_CHECK(i == 0 || seg[i].is_template != seg[i - 1].is_template);
        at += seg[i].len;
    }
    FZ_CHECK(at == len);
}

/* The client-content bytes of a rendered prompt, in order (sw_free). */
static char *content_bytes(const char *text, const eng_chat_segment *seg, size_t n, size_t *len)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += seg[i].is_template ? 0 : seg[i].len;
    char *out = sw_malloc(total + 1);
    if (!out)
        return NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        if (!seg[i].is_template) {
            memcpy(out + *len, text + seg[i].offset, seg[i].len);
            *len += seg[i].len;
        }
    }
    out[*len] = 0;
    return out;
}

static size_t count_occurrences(const char *hay, size_t hay_len, const char *needle, size_t n)
{
    size_t count = 0;
    for (const char *p = hay; n > 0 && (p = memmem(p, hay_len - (size_t)(p - hay), needle, n));
         p++)
        count++;
    return count;
}

/* The prompt as the worker tokenizes it: ids in the vocabulary, and no
 * control token that the template text does not spell. */
static void check_tokens(const eng_tokenizer *tok, eng_chat_family f, const char *text,
                         size_t len, const eng_chat_segment *seg, size_t n_seg)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    sw_error err;
    bool add_bos = eng_chat_tokenize_add_bos(f, eng_tokenizer_add_bos(tok));
    int rc = eng_chat_tokenize(tok, text, len, seg, n_seg, add_bos, &ids, &n_ids, &err);
    if (rc != SW_OK) {
        FZ_CHECK(rc < 0 && err.message[0] && !ids);
        return;
    }
    const int32_t n_vocab = eng_tokenizer_n_vocab(tok);
    for (size_t i = 0; i < n_ids; i++)
        FZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab);
    /* each control token of the prompt, once, against the template text */
    for (size_t i = 0; i < n_ids; i++) {
        const int32_t id = ids[i];
        bool first = eng_token_get_type(tok, id) == ENG_TOKEN_CONTROL;
        for (size_t k = 0; first && k < i; k++)
            first = ids[k] != id;
        if (!first)
            continue;
        size_t piece_len = 0, in_ids = 0, spelled = 0;
        const char *piece = eng_token_piece(tok, id, &piece_len);
        for (size_t k = i; k < n_ids; k++)
            in_ids += ids[k] == id;
        if (add_bos && id == eng_tokenizer_bos(tok) && ids[0] == id)
            in_ids--;
        for (size_t g = 0; g < n_seg; g++)
            if (seg[g].is_template)
                spelled += count_occurrences(text + seg[g].offset, seg[g].len, piece, piece_len);
        FZ_CHECK(in_ids <= spelled);
    }
    sw_free(ids);
}

typedef struct fz_chat {
    eng_chat_message msgs[FZ_MAX_MESSAGES];
    eng_chat_message_tools ext[FZ_MAX_MESSAGES];
    eng_chat_tool_call calls[FZ_MAX_MESSAGES][FZ_MAX_CALLS];
    char *strings[FZ_MAX_MESSAGES * (2 * FZ_MAX_CALLS + 1) + 1];
    size_t n_strings, n;
    char *tools_text;
    bool any_calls;
} fz_chat;

static char *keep(fz_chat *c, const uint8_t *p, size_t n)
{
    char *s = fz_strndup(p, n);
    if (s)
        c->strings[c->n_strings++] = s;
    return s;
}

/* Cuts the input into messages; false when out of memory. */
static bool parse_input(fz_chat *c, const uint8_t *data, size_t size, bool tools)
{
    const uint8_t *field;
    size_t len, pos = 0;
    if (tools && fz_next_field(data, size, &pos, 0x1E, &field, &len))
        if (!(c->tools_text = keep(c, field, len)))
            return false;
    while (c->n < FZ_MAX_MESSAGES && fz_next_field(data, size, &pos, 0x1E, &field, &len)) {
        size_t i = c->n++;
        c->msgs[i].role = fz_roles[len ? field[0] % 5 : 1];
        const uint8_t *body = len ? field + 1 : field;
        size_t body_len = len ? len - 1 : 0, at = 0;
        const uint8_t *part;
        size_t part_len;
        fz_next_field(body, body_len, &at, 0x1F, &part, &part_len);
        if (!(c->msgs[i].content = keep(c, part, part_len)))
            return false;
        if (strcmp(c->msgs[i].role, "assistant") != 0)
            continue;
        while (c->ext[i].n_calls < FZ_MAX_CALLS &&
               fz_next_field(body, body_len, &at, 0x1F, &part, &part_len)) {
            eng_chat_tool_call *call = &c->calls[i][c->ext[i].n_calls++];
            if (!(call->name = keep(c, part, part_len)))
                return false;
            if (!fz_next_field(body, body_len, &at, 0x1F, &part, &part_len))
                part_len = 0, part = body;
            if (!(call->arguments = keep(c, part, part_len)))
                return false;
            c->ext[i].calls = c->calls[i];
            c->any_calls = true;
        }
    }
    return true;
}

static void render_family(const fz_chat *c, eng_chat_family f, bool gen,
                          const eng_tokenizer *v)
{
    char *t1 = (char *)1, *t2 = (char *)1, *t3 = (char *)1;
    size_t l1 = 7, l2 = 7, l3 = 7, n2 = 7, n3 = 7, clen = 0;
    eng_chat_segment *s2 = (eng_chat_segment *)1, *s3 = (eng_chat_segment *)1;
    sw_error e1, e2, e3;
    int r1 = eng_chat_render(f, c->msgs, c->n, gen, &t1, &l1, &e1);
    int r2 = eng_chat_render_segments(f, c->msgs, c->n, gen, &t2, &l2, &s2, &n2, &e2);
    int r3 = eng_chat_render_tools(f, c->msgs, NULL, c->n, NULL, gen, &t3, &l3, &s3, &n3, &e3);
    FZ_CHECK(r1 == r2 && r2 == r3);
    if (r1 != SW_OK) {
        FZ_CHECK(r1 < 0 && e1.code == r1 && e1.message[0] && e2.message[0] && e3.message[0]);
        FZ_CHECK(t1 == (char *)1 && t2 == (char *)1 && t3 == (char *)1);
        FZ_CHECK(l1 == 7 && l2 == 7 && n2 == 7 && s2 == (eng_chat_segment *)1);
        return;
    }
    FZ_CHECK(l1 == l2 && l2 == l3 && !memcmp(t1, t2, l1) && !memcmp(t2, t3, l1));
    FZ_CHECK(n2 == n3 && (n2 == 0 || !memcmp(s2, s3, n2 * sizeof *s2)));
    check_segments(t2, l2, s2, n2);
    /* the content segments are the contents, nothing more, nothing less */
    char *content = content_bytes(t2, s2, n2, &clen);
    if (content) {
        size_t at = 0;
        /* DeepSeek-R1 writes the system messages first */
        bool systems_first = f == ENG_CHAT_DEEPSEEK_R1;
        for (int pass = systems_first ? 0 : 1; pass < 2; pass++) {
            for (size_t i = 0; i < c->n; i++) {
                if (systems_first && (pass == 0) != !strcmp(c->msgs[i].role, "system"))
                    continue;
                const char *s, *t;
                size_t n, tn;
                expected_content(f, c->msgs, c->n, i, &s, &n, &t, &tn);
                FZ_CHECK(tn <= clen - at && !memcmp(content + at, t, tn));
                at += tn;
                FZ_CHECK(n <= clen - at && !memcmp(content + at, s, n));
                at += n;
            }
        }
        FZ_CHECK(at == clen);
    }
    sw_free(content);
    if (v)
        check_tokens(v, f, t2, l2, s2, n2);
    sw_free(t1);
    sw_free(t2);
    sw_free(t3);
    sw_free(s2);
    sw_free(s3);
}

static void render_family_tools(const fz_chat *c, eng_chat_family f, bool gen,
                                const eng_tokenizer *v)
{
    char *text = NULL;
    size_t len = 0, n_seg = 0, clen = 0;
    eng_chat_segment *seg = NULL;
    sw_error err;
    int rc = eng_chat_render_tools(f, c->msgs, c->ext, c->n, c->tools_text, gen, &text, &len,
                                   &seg, &n_seg, &err);
    if (rc != SW_OK) {
        FZ_CHECK(rc < 0 && err.code == rc && err.message[0] && !text && !seg);
        return;
    }
    check_segments(text, len, seg, n_seg);
    char *content = content_bytes(text, seg, n_seg, &clen);
    for (size_t i = 0; content && i < c->n; i++) {
        const char *s, *t;
        size_t n, tn;
        expected_content(f, c->msgs, c->n, i, &s, &n, &t, &tn);
        FZ_CHECK(tn == 0 || memmem(content, clen, t, tn));
        FZ_CHECK(n == 0 || memmem(content, clen, s, n));
        for (size_t k = 0; k < c->ext[i].n_calls; k++) {
            const char *name = c->ext[i].calls[k].name;
            FZ_CHECK(!name[0] || memmem(content, clen, name, strlen(name)));
        }
    }
    sw_free(content);
    if (v)
        check_tokens(v, f, text, len, seg, n_seg);
    sw_free(text);
    sw_free(seg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fz_chat c;
    if (size < 1)
        return 0;
    const bool gen = data[0] & 1, tools = data[0] & 2;
    const eng_tokenizer *v = fz_vocab_get((data[0] >> 2) & 3);
    memset(&c, 0, sizeof c);
    if (parse_input(&c, data + 1, size - 1, tools)) {
        /* every family renders; one, from the options, is tokenized too
         * (the costly part) */
        const int tokenized = (data[0] >> 4) % ENG_CHAT_N_FAMILIES;
        for (int f = 0; f < ENG_CHAT_N_FAMILIES; f++) {
            const eng_tokenizer *tok = f == tokenized ? v : NULL;
            render_family(&c, (eng_chat_family)f, gen, tok);
            if (c.tools_text || c.any_calls)
                render_family_tools(&c, (eng_chat_family)f, gen, tok);
        }
        /* a family outside the enum is an error, never a rendering */
        char *text = NULL;
        sw_error err;
        FZ_CHECK(eng_chat_render((eng_chat_family)ENG_CHAT_N_FAMILIES, c.msgs, c.n ? c.n : 1, gen,
                                 &text, NULL, &err) == SW_EINVAL && !text);
    }
    for (size_t i = 0; i < c.n_strings; i++)
        sw_free(c.strings[i]);
    return 0;
}
