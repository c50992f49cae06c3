/* Writes a byte-level BPE vocabulary whose tokens show where a
 * pre-tokenizer cuts: GPT-2's 256 byte symbols, then one token and one
 * merge for every ordered pair of a few ASCII characters (letters of both
 * cases, an apostrophe, s, t, digits, space, newline, slash, a full stop)
 * and for é and É (each two byte symbols). A merge never crosses a
 * pre-token boundary, so which pairs come out depends on where the cuts
 * are. The metadata other than the vocabulary is copied from a template
 * GGUF (llama-bpe's, which llama.cpp loads vocabulary-only); the
 * pre-tokenizer is named by PRE.
 *
 *   pair_vocab TEMPLATE.gguf PRE OUT.gguf
 * Built by bench/record-pretok.sh against the room libraries of build/;
 * its output is committed under tests/data for test_tokenizer_bpe. */
#include "common/alloc.h"
#include "gguf/gguf.h"

#include <stdio.h>
#include <string.h>

/* GPT-2's byte alphabet: printable bytes stand for themselves, the rest in
 * order for U+0100, U+0101, ...; the UTF-8 of byte b's symbol. */
static void byte_symbol(int b, char out[3])
{
    int cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) ||
                  (x >= 0xAE && x <= 0xFF)))
                k++;
        cp = 0x100 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

int main(int argc, char **argv)
{
    static const char chars[] = "abcAB'sT1 \n/.";
    enum { N_CHARS = sizeof chars - 1, N_PAIRS = N_CHARS * N_CHARS, N = 256 + 2 + N_PAIRS };
    static char text[N][16], merge[2 + N_PAIRS][32];
    const char *texts[N], *merges[2 + N_PAIRS];
    int32_t types[N];
    eng_gguf *g = NULL;
    sw_error err = {0};
    if (argc != 4) {
        fprintf(stderr, "usage: %s TEMPLATE.gguf PRE OUT.gguf\n", argv[0]);
        return 2;
    }
    for (int b = 0; b < 256; b++)
        byte_symbol(b, text[b]);
    /* é (C3 A9) and É (C3 89) as tokens of their two byte symbols */
    const int accented[2][2] = {{0xC3, 0xA9}, {0xC3, 0x89}};
    int n = 256, m = 0;
    for (int a = 0; a < 2; a++) {
        char x[3], y[3];
        byte_symbol(accented[a][0], x);
        byte_symbol(accented[a][1], y);
        snprintf(text[n++], sizeof text[0], "%s%s", x, y);
        snprintf(merge[m++], sizeof merge[0], "%s %s", x, y);
    }
    for (int i = 0; i < N_CHARS; i++)
        for (int j = 0; j < N_CHARS; j++) {
            char x[3], y[3];
            byte_symbol((unsigned char)chars[i], x);
            byte_symbol((unsigned char)chars[j], y);
            snprintf(text[n++], sizeof text[0], "%s%s", x, y);
            snprintf(merge[m++], sizeof merge[0], "%s %s", x, y);
        }
    for (int i = 0; i < n; i++) {
        texts[i] = text[i];
        types[i] = 1;
    }
    for (int i = 0; i < m; i++)
        merges[i] = merge[i];
    if (eng_gguf_open(argv[1], &g, &err) != SW_OK) {
        fprintf(stderr, "%s: %s\n", argv[1], err.message);
        return 1;
    }
    eng_gguf_writer *w = eng_gguf_writer_create();
    if (!w)
        return 1;
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const char *key = eng_gguf_kv_key(g, i);
        if (strncmp(key, "tokenizer.", 10) != 0 && eng_gguf_writer_copy_kv(w, g, i, key))
            return 1;
    }
    if (eng_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") ||
        eng_gguf_writer_set_str(w, "tokenizer.ggml.pre", argv[2]) ||
        eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", texts, (uint64_t)n) ||
        eng_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n) ||
        eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)m) ||
        eng_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false) ||
        eng_gguf_writer_write(w, argv[3], &err)) {
        fprintf(stderr, "%s: cannot write: %s\n", argv[3], err.message);
        return 1;
    }
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
    return 0;
}
