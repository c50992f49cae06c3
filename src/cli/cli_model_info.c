/* cli_model_info.c - `spillway model info [--json] FILE`: what is in a GGUF.
 *
 * Prints the format version, every metadata key (long arrays previewed, via
 * eng_gguf_kv_format) and the tensor table with totals, so a user can see
 * what a file holds before loading it. A file the reader refuses exits 1 with
 * the reader's message, which names what is wrong.
 */
#include "cli/cli.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out, "usage: spillway model info [--json] FILE\n"
                 "  Prints the GGUF version, the metadata and the tensor table of FILE.\n"
                 "  --json  one JSON object instead of text\n");
}

/* Keys and tensor names come from the file: shown with control bytes (a
 * terminal escape, say) replaced by '?'. Returns buf. */
static const char *printable(const char *name, char *buf, size_t cap)
{
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) {
        unsigned char c = (unsigned char)name[i];
        buf[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    buf[i] = '\0';
    return buf;
}

/* A JSON string of a name from the file; bytes that are not UTF-8 (which
 * jansson refuses) become '?'. NULL only when out of memory. */
static json_t *json_name(const char *name)
{
    json_t *j = json_string(name);
    if (j)
        return j;
    size_t n = strlen(name);
    char *copy = sw_malloc(n + 1);
    if (!copy)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        copy[i] = (unsigned char)name[i] >= 0x80 ? '?' : name[i];
    j = json_string(copy);
    sw_free(copy);
    return j;
}

static const char *tensor_type_name(uint32_t type)
{
    const eng_type_traits *traits = eng_type_traits_get(type);
    return traits ? traits->name : "unknown";
}

static void dims_text(const eng_gguf_tensor *t, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (uint32_t d = 0; d < t->n_dims && len < cap; d++) {
        int n = snprintf(buf + len, cap - len, "%s%" PRId64, d ? " x " : "", t->ne[d]);
        if (n < 0)
            break;
        len += (size_t)n;
    }
}

static void print_text(const char *path, const eng_gguf *g)
{
    char value[512], dims[128], name[256];
    int64_t n_kv = eng_gguf_n_kv(g), n_tensors = eng_gguf_n_tensors(g);
    size_t key_width = 8, name_width = 8;
    int64_t params = 0;
    uint64_t bytes = 0;

    printf("file:        %s\n", path);
    printf("version:     GGUF v%" PRIu32 "\n", eng_gguf_version(g));
    printf("size:        %zu bytes (data section at offset %zu, alignment %zu)\n",
           eng_gguf_file_size(g), eng_gguf_data_offset(g), eng_gguf_alignment(g));

    for (int64_t i = 0; i < n_kv; i++) {
        size_t n = strlen(eng_gguf_kv_key(g, i));
        if (n > key_width && n <= 60)
            key_width = n;
    }
    printf("\nmetadata (%" PRId64 " keys):\n", n_kv);
    for (int64_t i = 0; i < n_kv; i++) {
        eng_gguf_kv_format(g, i, value, sizeof value);
        printf("  %-*s  %-6s  %s\n", (int)key_width,
               printable(eng_gguf_kv_key(g, i), name, sizeof name),
               eng_gguf_type_name(eng_gguf_kv_type(g, i)), value);
    }

    for (int64_t i = 0; i < n_tensors; i++) {
        size_t n = strlen(eng_gguf_tensor_at(g, i)->name);
        if (n > name_width && n <= 60)
            name_width = n;
    }
    printf("\ntensors (%" PRId64 "):\n", n_tensors);
    printf("  %-*s  %-6s  %-20s  %12s  %12s\n", (int)name_width, "name", "type", "dims",
           "offset", "bytes");
    for (int64_t i = 0; i < n_tensors; i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        dims_text(t, dims, sizeof dims);
        printf("  %-*s  %-6s  %-20s  %12" PRIu64 "  %12zu\n", (int)name_width,
               printable(t->name, name, sizeof name),
               tensor_type_name(t->type), dims, t->offset, t->size_bytes);
        params += t->n_elements; /* each < 2^63 and the sum bounded by the file */
        bytes += t->size_bytes;
    }
    printf("\ntotal: %" PRId64 " tensors, %" PRId64 " parameters, %" PRIu64 " bytes (%.2f MiB)\n",
           n_tensors, params, bytes, (double)bytes / (1024.0 * 1024.0));
}

static int print_json(const char *path, const eng_gguf *g)
{
    char value[512];
    int64_t params = 0;
    uint64_t bytes = 0;
    json_t *root = json_object(), *meta = json_array(), *tensors = json_array();
    int rc = 1;

    if (!root || !meta || !tensors)
        goto fail;
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        eng_gguf_kv_format(g, i, value, sizeof value);
        json_array_append_new(meta, json_pack("{s:o, s:s, s:s}", "key",
                                              json_name(eng_gguf_kv_key(g, i)),
                                              "type", eng_gguf_type_name(eng_gguf_kv_type(g, i)),
                                              "value", value));
    }
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        json_t *dims = json_array();
        for (uint32_t d = 0; d < t->n_dims; d++)
            json_array_append_new(dims, json_integer(t->ne[d]));
        json_array_append_new(tensors,
                              json_pack("{s:o, s:s, s:o, s:I, s:I}", "name",
                                        json_name(t->name), "type",
                                        tensor_type_name(t->type), "dims", dims, "offset",
                                        (json_int_t)t->offset, "bytes",
                                        (json_int_t)t->size_bytes));
        params += t->n_elements;
        bytes += t->size_bytes;
    }
    json_object_set_new(root, "file", json_string(path));
    json_object_set_new(root, "version", json_integer(eng_gguf_version(g)));
    json_object_set_new(root, "size", json_integer((json_int_t)eng_gguf_file_size(g)));
    json_object_set_new(root, "alignment", json_integer((json_int_t)eng_gguf_alignment(g)));
    json_object_set_new(root, "data_offset", json_integer((json_int_t)eng_gguf_data_offset(g)));
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "tensors", tensors);
    json_object_set_new(root, "parameters", json_integer(params));
    json_object_set_new(root, "bytes", json_integer((json_int_t)bytes));
    meta = tensors = NULL;
    char *text = json_dumps(root, JSON_INDENT(2));
    if (!text)
        goto fail;
    puts(text);
    free(text); /* jansson's allocator, not ours */
    rc = 0;
fail:
    json_decref(meta);
    json_decref(tensors);
    json_decref(root);
    if (rc != 0)
        fprintf(stderr, "spillway model info: out of memory\n");
    return rc;
}

int cli_model_info(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false;
    eng_gguf *g = NULL;
    sw_error err;
    int status;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "spillway model info: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "spillway model info: one FILE only\n");
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (eng_gguf_open(path, &g, &err) != SW_OK) {
        fprintf(stderr, "spillway model info: %s\n", err.message);
        return 1;
    }
    if (json) {
        status = print_json(path, g);
    } else {
        print_text(path, g);
        status = 0;
    }
    eng_gguf_close(g);
    return status;
}
