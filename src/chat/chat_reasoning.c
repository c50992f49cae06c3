/* chat_reasoning.c - the reply's thought split from its answer (see
 * chat_reasoning.h for the formats and the contract).
 *
 * Each push appends the new text to what was held and runs the state
 * machine over that: whatever is decided goes out, the undecided tail is
 * held again. Tails are short (a partial marker, a run of white space), so
 * the copying is small.
 */
#include "chat/chat_reasoning.h"

#include "common/alloc.h"
#include "common/error.h"

#include <string.h>

enum {
    /* <think> */
    ST_START = 0,   /* nothing decided yet */
    ST_THINK = 1,   /* inside the thought */
    ST_AFTER = 2,   /* after </think>: white space before the answer */
    ST_CONTENT = 3, /* the answer (or a reply without a thought) */
    /* harmony */
    ST_H_HEADER = 10, /* a message's header, up to <|message|> */
    ST_H_BODY = 11,   /* its body */
    ST_H_BETWEEN = 12 /* after <|end|>: until the next <|start|> */
};

enum { CH_CONTENT = 0, CH_REASONING = 1, CH_CALL = 2 };

static const char open_tag[] = "<think>", close_tag[] = "</think>";

/* Harmony's markers that end or start a message. */
static const char *const h_markers[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
#define H_MARKER_MAX 10 /* strlen("<|return|>") */
#define H_HEADER_MAX 512

int eng_reasoning_format_from_name(const char *name, eng_reasoning_format *out)
{
    static const char *const names[] = {"auto", "none", "deepseek"};
    for (int i = 0; name && i < 3; i++) {
        if (strcmp(name, names[i]) == 0) {
            *out = (eng_reasoning_format)i;
            return SW_OK;
        }
    }
    return SW_EINVAL;
}

const char *eng_reasoning_format_name(eng_reasoning_format f)
{
    switch (f) {
    case ENG_REASONING_FORMAT_AUTO: return "auto";
    case ENG_REASONING_FORMAT_NONE: return "none";
    case ENG_REASONING_FORMAT_DEEPSEEK: return "deepseek";
    }
    return "unknown";
}

eng_reasoning_syntax eng_chat_reasoning_syntax(eng_chat_family f)
{
    switch (f) {
    case ENG_CHAT_QWEN3: return ENG_REASONING_THINK;
    case ENG_CHAT_DEEPSEEK_R1:
    case ENG_CHAT_QWEN3_THINKING: return ENG_REASONING_THINK_OPEN;
    case ENG_CHAT_HARMONY: return ENG_REASONING_HARMONY;
    default: return ENG_REASONING_NONE;
    }
}

/* ---- buffers ---------------------------------------------------------------- */

static bool text_put(eng_reasoning_text *t, const char *s, size_t n)
{
    if (n == 0)
        return true;
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *p = sw_realloc(t->p, cap);
        if (!p)
            return false;
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
    return true;
}

void eng_reasoning_text_free(eng_reasoning_text *t)
{
    sw_free(t->p);
    memset(t, 0, sizeof *t);
}

void eng_reasoning_delta_clear(eng_reasoning_delta *d)
{
    d->reasoning.len = d->content.len = 0;
    if (d->reasoning.p)
        d->reasoning.p[0] = '\0';
    if (d->content.p)
        d->content.p[0] = '\0';
}

void eng_reasoning_delta_free(eng_reasoning_delta *d)
{
    eng_reasoning_text_free(&d->reasoning);
    eng_reasoning_text_free(&d->content);
}

void eng_reasoning_init(eng_reasoning *r, eng_reasoning_syntax syntax)
{
    memset(r, 0, sizeof *r);
    r->syntax = syntax;
    switch (syntax) {
    case ENG_REASONING_THINK:
    case ENG_REASONING_THINK_OPEN: r->state = ST_START; break;
    case ENG_REASONING_HARMONY: r->state = ST_H_HEADER; break; /* after "<|start|>assistant" */
    case ENG_REASONING_NONE: r->state = ST_CONTENT; break;
    }
}

void eng_reasoning_free(eng_reasoning *r)
{
    eng_reasoning_text_free(&r->held);
    for (size_t i = 0; i < r->n_calls; i++) {
        sw_free(r->calls[i].name);
        eng_reasoning_text_free(&r->calls[i].arguments);
    }
    memset(r, 0, sizeof *r);
}

bool eng_reasoning_in_thought(const eng_reasoning *r)
{
    if (r->syntax == ENG_REASONING_HARMONY)
        return r->state == ST_H_BODY && r->channel == CH_REASONING;
    return r->state == ST_THINK || (r->state == ST_START && r->syntax == ENG_REASONING_THINK_OPEN);
}

static bool is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* Reasoning bytes: leading white space of the whole thought dropped. */
static void put_reasoning(eng_reasoning *r, eng_reasoning_delta *out, const char *s, size_t n)
{
    if (!r->reasoning_started) {
        while (n > 0 && is_space(*s))
            s++, n--;
        if (n == 0)
            return;
        r->reasoning_started = true;
    }
    if (!text_put(&out->reasoning, s, n))
        r->failed = true;
}

static void put_content(eng_reasoning *r, eng_reasoning_delta *out, const char *s, size_t n)
{
    if (!text_put(&out->content, s, n))
        r->failed = true;
}

/* Length of the longest end of s[0..n) that is a proper prefix of one of
 * the markers (what must be held, as the next bytes may complete it). */
static size_t marker_tail(const char *s, size_t n, const char *const *markers, size_t n_markers)
{
    size_t best = 0;
    for (size_t m = 0; m < n_markers; m++) {
        size_t ml = strlen(markers[m]);
        for (size_t k = ml - 1; k > best; k--)
            if (k <= n && memcmp(s + n - k, markers[m], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* ---- <think> ------------------------------------------------------------- */

/* Runs the <think> states over b[0..n); returns how many bytes were used
 * (the rest is held). final: no more text will come. */
static size_t think_run(eng_reasoning *r, const char *b, size_t n, bool final,
                        eng_reasoning_delta *out)
{
    size_t at = 0;
    while (at < n && !r->failed) {
        const char *s = b + at;
        size_t len = n - at;
        if (r->state == ST_START) {
            size_t ws = 0;
            while (ws < len && is_space(s[ws]))
                ws++;
            size_t rest = len - ws, tl = sizeof open_tag - 1;
            if (rest >= tl && memcmp(s + ws, open_tag, tl) == 0) {
                r->state = ST_THINK;
                at += ws + tl;
                continue;
            }
            if (!final && (rest == 0 || memcmp(s + ws, open_tag, rest < tl ? rest : tl) == 0))
                return at; /* may still become "<think>" */
            if (r->syntax == ENG_REASONING_THINK_OPEN) {
                r->state = ST_THINK; /* the prompt opened it */
            } else {
                r->state = ST_CONTENT;
            }
            continue;
        }
        if (r->state == ST_THINK) {
            const char *close = memmem(s, len, close_tag, sizeof close_tag - 1);
            if (close) {
                size_t k = (size_t)(close - s), keep = k;
                while (keep > 0 && is_space(s[keep - 1]))
                    keep--;
                put_reasoning(r, out, s, keep);
                r->state = ST_AFTER;
                at += k + sizeof close_tag - 1;
                continue;
            }
            const char *const tags[] = {close_tag};
            size_t hold = final ? 0 : marker_tail(s, len, tags, 1);
            size_t upto = len - hold;
            /* trailing white space may be the thought's end: held too */
            size_t keep = upto;
            while (keep > 0 && is_space(s[keep - 1]))
                keep--;
            put_reasoning(r, out, s, keep);
            return final ? n : at + keep;
        }
        if (r->state == ST_AFTER) {
            size_t ws = 0;
            while (ws < len && is_space(s[ws]))
                ws++;
            at += ws;
            if (ws < len)
                r->state = ST_CONTENT;
            continue;
        }
        /* ST_CONTENT */
        put_content(r, out, s, len);
        return n;
    }
    return at;
}

/* ---- harmony ---------------------------------------------------------------- */

/* The channel of a finished header: "<|channel|>NAME", and a recipient
 * "to=functions.NAME" (in the role part or after the channel). */
static int harmony_header(eng_reasoning *r, const char *h, size_t n)
{
    const char *ch = memmem(h, n, "<|channel|>", 11);
    char channel[32] = "";
    if (ch) {
        const char *p = ch + 11;
        size_t k = 0;
        while (p < h + n && is_space(*p))
            p++;
        while (p < h + n && !is_space(*p) && *p != '<' && k + 1 < sizeof channel)
            channel[k++] = *p++;
        channel[k] = '\0';
    }
    const char *to = memmem(h, n, "to=functions.", 13);
    if (to && strcmp(channel, "analysis") != 0 && strcmp(channel, "final") != 0) {
        const char *p = to + 13, *e = p;
        while (e < h + n && !is_space(*e) && *e != '<')
            e++;
        if (r->n_calls >= ENG_REASONING_MAX_CALLS || e == p)
            return CH_CONTENT;
        eng_reasoning_call *c = &r->calls[r->n_calls];
        memset(c, 0, sizeof *c);
        if (!(c->name = sw_strndup(p, (size_t)(e - p)))) {
            r->failed = true;
            return CH_CONTENT;
        }
        r->n_calls++;
        return CH_CALL;
    }
    return strcmp(channel, "analysis") == 0 ? CH_REASONING : CH_CONTENT;
}

static void harmony_body(eng_reasoning *r, eng_reasoning_delta *out, const char *s, size_t n)
{
    if (r->channel == CH_REASONING)
        put_reasoning(r, out, s, n);
    else if (r->channel == CH_CALL && r->n_calls > 0)
        r->failed |= !text_put(&r->calls[r->n_calls - 1].arguments, s, n);
    else
        put_content(r, out, s, n);
}

static size_t harmony_run(eng_reasoning *r, const char *b, size_t n, bool final,
                          eng_reasoning_delta *out)
{
    const size_t n_markers = sizeof h_markers / sizeof h_markers[0];
    size_t at = 0;
    while (at < n && !r->failed) {
        const char *s = b + at;
        size_t len = n - at;
        if (r->state == ST_H_HEADER) {
            /* the header is held until <|message|> ends it */
            const char *msg = memmem(s, len, "<|message|>", 11);
            /* Not a header when <|message|> starts past H_HEADER_MAX: then
             * the rest is plain content. Without it yet, that is sure only
             * once it could no longer start in time (a marker's first bytes
             * may be the last ones here), so that the text fed in pieces
             * decides as the text fed whole does. */
            if ((msg && (size_t)(msg - s) > H_HEADER_MAX) || (!msg && len > H_HEADER_MAX + 10)) {
                r->state = ST_CONTENT;
                continue;
            }
            if (!msg)
                return final ? n : at; /* a header never finished shows nothing */
            size_t k = (size_t)(msg - s);
            r->channel = harmony_header(r, s, k);
            r->state = ST_H_BODY;
            at += k + 11;
            continue;
        }
        if (r->state == ST_CONTENT) {
            put_content(r, out, s, len);
            return n;
        }
        /* the first marker in s */
        size_t best = len, best_len = 0;
        int which = -1;
        for (size_t m = 0; m < n_markers; m++) {
            const char *p = memmem(s, len, h_markers[m], strlen(h_markers[m]));
            if (p && (size_t)(p - s) < best) {
                best = (size_t)(p - s);
                best_len = strlen(h_markers[m]);
                which = (int)m;
            }
        }
        if (which < 0) {
            size_t hold = final ? 0 : marker_tail(s, len, h_markers, n_markers);
            if (r->state == ST_H_BODY)
                harmony_body(r, out, s, len - hold);
            return n - hold;
        }
        if (r->state == ST_H_BODY)
            harmony_body(r, out, s, best);
        at += best + best_len;
        /* <|start|> opens the next message; the others end this one */
        r->state = strcmp(h_markers[which], "<|start|>") == 0 ? ST_H_HEADER : ST_H_BETWEEN;
    }
    return at;
}

/* ---- the entry points --------------------------------------------------------- */

static int run(eng_reasoning *r, const char *text, size_t len, bool final,
               eng_reasoning_delta *out)
{
    if (r->failed)
        return SW_ENOMEM;
    if (r->syntax == ENG_REASONING_NONE) {
        put_content(r, out, text, len);
        return r->failed ? SW_ENOMEM : SW_OK;
    }
    if (!text_put(&r->held, text, len)) {
        r->failed = true;
        return SW_ENOMEM;
    }
    size_t n = r->held.len;
    char *b = r->held.p;
    if (n == 0)
        return SW_OK;
    size_t used = r->syntax == ENG_REASONING_HARMONY ? harmony_run(r, b, n, final, out)
                                                     : think_run(r, b, n, final, out);
    if (final)
        used = n;
    memmove(b, b + used, n - used);
    r->held.len = n - used;
    b[r->held.len] = '\0';
    return r->failed ? SW_ENOMEM : SW_OK;
}

int eng_reasoning_push(eng_reasoning *r, const char *text, size_t len, eng_reasoning_delta *out)
{
    return run(r, text ? text : "", text ? len : 0, false, out);
}

int eng_reasoning_finish(eng_reasoning *r, eng_reasoning_delta *out)
{
    return run(r, "", 0, true, out);
}
