/* fuzz_reasoning.c - libFuzzer harness for the reply splitter
 * (chat/chat_reasoning.h): a thinking model's text into reasoning,
 * content and harmony calls.
 *
 * The input: one byte of options (bits 0-1: the syntax, none / <think> /
 * prompt-opened <think> / harmony; bits 2-7: the seed of the cut points),
 * then the reply text. Invariants: the text fed whole, in pieces cut at
 * pseudo-random points, and as a prefix to one splitter and the rest to a
 * second that was fed the same prefix first (a resumed stream) gives the
 * same reasoning, content and calls; the reasoning never starts with
 * white space; without a syntax the content is the text; nothing is
 * invented (the outputs are no longer than the input).
 */
#include "chat/chat_reasoning.h"
#include "common/alloc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FZ_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fz_out {
    eng_reasoning_delta d;
    eng_reasoning r;
} fz_out;

/* Feeds text[0..len) in pieces (cut: 0 whole, else a seed), then finishes. */
static void split(eng_reasoning_syntax syn, const char *text, size_t len, uint32_t cut,
                  fz_out *o)
{
    memset(o, 0, sizeof *o);
    eng_reasoning_init(&o->r, syn);
    uint32_t x = cut * 2654435761u + 1;
    for (size_t at = 0; at < len;) {
        size_t n = len - at;
        if (cut) {
            x = x * 1103515245u + 12345u;
            n = 1 + (x >> 16) % 7;
            if (n > len - at)
                n = len - at;
        }
        if (eng_reasoning_push(&o->r, text + at, n, &o->d) != SW_OK)
            return;
        at += n;
    }
    eng_reasoning_finish(&o->r, &o->d);
}

static bool same_text(const eng_reasoning_text *a, const eng_reasoning_text *b)
{
    return a->len == b->len && (a->len == 0 || !memcmp(a->p, b->p, a->len));
}

/* a's output against the delta d and the splitter r (its calls) */
static void same(const fz_out *a, const eng_reasoning_delta *d, const eng_reasoning *r)
{
    if (a->r.failed || r->failed)
        return; /* out of memory: no promise */
    FZ_CHECK(same_text(&a->d.reasoning, &d->reasoning));
    FZ_CHECK(same_text(&a->d.content, &d->content));
    FZ_CHECK(a->r.n_calls == r->n_calls);
    for (size_t i = 0; i < a->r.n_calls; i++) {
        FZ_CHECK(!strcmp(a->r.calls[i].name, r->calls[i].name));
        FZ_CHECK(same_text(&a->r.calls[i].arguments, &r->calls[i].arguments));
    }
}

static void release(fz_out *o)
{
    eng_reasoning_delta_free(&o->d);
    eng_reasoning_free(&o->r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    eng_reasoning_syntax syn = (eng_reasoning_syntax)(data[0] & 3);
    uint32_t seed = (uint32_t)(data[0] >> 2) + 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    fz_out whole, pieces;
    split(syn, text, len, 0, &whole);
    split(syn, text, len, seed, &pieces);
    same(&whole, &pieces.d, &pieces.r);
    if (!whole.r.failed) {
        FZ_CHECK(whole.d.reasoning.len + whole.d.content.len <= len);
        if (whole.d.reasoning.len)
            FZ_CHECK(whole.d.reasoning.p[0] != ' ' && whole.d.reasoning.p[0] != '\n' &&
                     whole.d.reasoning.p[0] != '\t' && whole.d.reasoning.p[0] != '\r');
        if (syn == ENG_REASONING_NONE)
            FZ_CHECK(whole.d.content.len == len &&
                     (len == 0 || !memcmp(whole.d.content.p, text, len)));
    }

    /* resumed at k: the first's output, then the second's after the same
     * prefix, add up to the whole */
    size_t k = len ? seed % (len + 1) : 0;
    fz_out first, second;
    memset(&first, 0, sizeof first);
    memset(&second, 0, sizeof second);
    eng_reasoning_init(&first.r, syn);
    eng_reasoning_init(&second.r, syn);
    eng_reasoning_delta scratch = {0};
    if (eng_reasoning_push(&first.r, text, k, &first.d) == SW_OK &&
        eng_reasoning_push(&second.r, text, k, &scratch) == SW_OK &&
        eng_reasoning_push(&second.r, text + k, len - k, &first.d) == SW_OK &&
        eng_reasoning_finish(&second.r, &first.d) == SW_OK && !first.r.failed)
        same(&whole, &first.d, &second.r); /* the calls are the second's */
    eng_reasoning_delta_free(&scratch);
    release(&first);
    release(&second);
    release(&whole);
    release(&pieces);
    return 0;
}
