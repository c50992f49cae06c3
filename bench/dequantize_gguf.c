/* Writes a copy of a GGUF file with every tensor dequantized to F32 by
 * spillway's own dequantization (eng_dequantize_row), metadata unchanged
 * but general.file_type. bench/crosscheck.sh uses it for an exact
 * reference: a quantized model's weights in plain F32, run without any
 * rounding of activations, so that each engine's distance from exact
 * arithmetic can be told apart from their distance to each other.
 *
 *   dequantize_gguf IN.gguf OUT.gguf
 * Built by bench/crosscheck.sh against the room libraries of build/ (build/spillway-libs.txt). */
#include "common/alloc.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    eng_gguf *g = NULL;
    eng_gguf_writer *w = NULL;
    float *row = NULL;
    sw_error err = {0};
    int rc = 1;
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN.gguf OUT.gguf\n", argv[0]);
        return 2;
    }
    if (eng_gguf_open(argv[1], &g, &err) != SW_OK || !(w = eng_gguf_writer_create()))
        goto fail;
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const char *key = eng_gguf_kv_key(g, i);
        int r = strcmp(key, "general.file_type") == 0 ? eng_gguf_writer_set_u32(w, key, 0)
                                                      : eng_gguf_writer_copy_kv(w, g, i, NULL);
        if (r != SW_OK) {
            fprintf(stderr, "%s: cannot copy key %s\n", argv[1], key);
            goto fail;
        }
    }
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        const int64_t n_rows = t->n_elements / t->ne[0];
        const size_t row_bytes = t->size_bytes / (size_t)n_rows;
        row = sw_malloc(sizeof(float) * (size_t)t->n_elements);
        if (!row)
            goto fail;
        for (int64_t r = 0; r < n_rows; r++)
            eng_dequantize_row(t->type, (const char *)t->data + (size_t)r * row_bytes,
                               row + r * t->ne[0], t->ne[0]);
        if (eng_gguf_writer_add_tensor(w, t->name, ENG_TYPE_F32, t->n_dims, t->ne, row,
                                       sizeof(float) * (size_t)t->n_elements) != SW_OK) {
            fprintf(stderr, "%s: cannot add tensor %s\n", argv[1], t->name);
            goto fail;
        }
        sw_free(row);
        row = NULL;
    }
    if (eng_gguf_writer_write(w, argv[2], &err) == SW_OK)
        rc = 0;
fail:
    if (rc && err.message[0])
        fprintf(stderr, "%s\n", err.message);
    sw_free(row);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
    return rc;
}
