/* Tokenizes test texts with the reference engine (llama.cpp) from a
 * vocabulary-only GGUF, in the format of llama.cpp's tokenizer test vectors
 * (../shared/vocab/README.md), so a pre-tokenizer that no vocabulary in
 * ../shared uses can be checked against ids nobody here computed.
 *
 *   tokenize_llamacpp VOCAB.gguf TEXTS.inp [PRE] > IDS.out
 * TEXTS.inp holds texts separated by lines reading __ggml_vocab_test__;
 * each gets one line of ids (no BOS, special-token parsing off, as the
 * vectors were made). PRE overrides the file's tokenizer.ggml.pre (a
 * llama.cpp key override: the vocabulary's pieces and merges with another
 * pre-tokenizer).
 *
 * Built and run by bench/record-pretok.sh against the llama.cpp that
 * bench/llamacpp-build.sh builds; never part of spillway itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "llamacpp_common.h"

int main(int argc, char **argv)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s VOCAB.gguf TEXTS.inp [PRE]\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model_kv_override overrides[2];
    memset(overrides, 0, sizeof overrides);
    if (argc == 4) {
        snprintf(overrides[0].key, sizeof overrides[0].key, "tokenizer.ggml.pre");
        overrides[0].tag = LLAMA_KV_OVERRIDE_TYPE_STR;
        snprintf(overrides[0].val_str, sizeof overrides[0].val_str, "%s", argv[3]);
        mp.kv_overrides = overrides;
    }
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "%s: llama.cpp cannot load it\n", argv[1]);
        return 2;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    FILE *f = fopen(argv[2], "rb");
    if (!f)
        return 2;
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    static llama_token ids[1 << 16];
    for (char *at = text; at < text + len;) {
        char *end = strstr(at, sep);
        if (!end)
            break;
        int n = llama_tokenize(vocab, at, (int32_t)(end - at), ids, 1 << 16, false, false);
        if (n < 0)
            return 2;
        for (int i = 0; i < n; i++)
            printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        at = end + strlen(sep);
    }
    llama_model_free(model);
    return 0;
}
