/* Compares spillway's dequantization with the reference engine's: every
 * quantized tensor of a GGUF file, of a type both run, decoded by ggml's
 * type traits (llama.cpp's own to_float) and by eng_dequantize_row, value
 * for value. A layout slip (a nibble order, a scale convention such as
 * MXFP4's halved E8M0 with doubled levels) shows here before it is blurred
 * by a forward pass.
 *
 *   dequantize_llamacpp FILE.gguf...
 * prints per file and type "FILE TYPE TENSORS VALUES DIFFERENT MAXREL":
 * how many values are not bit for bit equal, and the largest |difference|
 * relative to the tensor's largest |value| (float rounding order: the
 * K-quants' d * sc * q - dmin * m may round apart by an ulp). Exit status
 * 1 when a value differs by more than 1e-6 of its tensor's largest, 2 on
 * an error.
 *
 * Built by bench/crosscheck.sh against the llama.cpp that
 * bench/llamacpp-build.sh builds and the room libraries of build/; never
 * part of spillway itself. */
#include "ggml.h"
#include "gguf.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct dq_stats {
    long tensors, values, different;
    double max_rel;
} dq_stats;

static int dq_file(const char *path)
{
    struct ggml_context *ctx = NULL;
    struct gguf_init_params ip = {.no_alloc = false, .ctx = &ctx};
    struct gguf_context *g = gguf_init_from_file(path, ip);
    if (!g) {
        fprintf(stderr, "dequantize_llamacpp: cannot read %s\n", path);
        return 2;
    }
    dq_stats st[ENG_TYPE_COUNT_];
    memset(st, 0, sizeof st);
    int rc = 0;
    for (struct ggml_tensor *t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        const eng_type_traits *tr = eng_type_traits_get((uint32_t)t->type);
        if (!tr || !tr->supported || tr->block_size == 1)
            continue; /* unquantized, or a type spillway does not run */
        const int64_t n = ggml_nelements(t);
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
        if (!a || !b) {
            free(a);
            free(b);
            rc = 2;
            break;
        }
        ggml_get_type_traits(t->type)->to_float(t->data, a, n);
        eng_dequantize_row((uint32_t)t->type, t->data, b, n);
        double amax = 0.0, dmax = 0.0;
        dq_stats *s = &st[t->type];
        for (int64_t i = 0; i < n; i++) {
            amax = fabs(a[i]) > amax ? fabs(a[i]) : amax;
            if (memcmp(&a[i], &b[i], sizeof a[i]) != 0) {
                s->different++;
                double d = fabs((double)a[i] - b[i]);
                dmax = d > dmax || isnan(d) ? d : dmax;
            }
        }
        double rel = amax > 0.0 ? dmax / amax : dmax;
        if (!(rel <= 1e-6)) {
            fprintf(stderr, "%s: %s (%s) differs by %g of its largest value\n", path, t->name,
                    tr->name, rel);
            rc = 1;
        }
        s->tensors++;
        s->values += n;
        s->max_rel = rel > s->max_rel ? rel : s->max_rel;
        free(a);
        free(b);
    }
    for (int ty = 0; ty < ENG_TYPE_COUNT_; ty++)
        if (st[ty].tensors)
            printf("%s %s %ld %ld %ld %.3g\n", path, eng_type_traits_get((uint32_t)ty)->name,
                   st[ty].tensors, st[ty].values, st[ty].different, st[ty].max_rel);
    gguf_free(g);
    ggml_free(ctx);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE.gguf...\n", argv[0]);
        return 2;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        int r = dq_file(argv[i]);
        rc = r > rc ? r : rc;
    }
    return rc;
}
