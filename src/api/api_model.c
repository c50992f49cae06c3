/* api_model.c - the id a model is served as (api.h). */
#include "api/api.h"

#include "common/alloc.h"
#include "common/version.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

bool api_model_id_valid(const char *p, size_t n)
{
    json_t *j = json_stringn(p, n);
    bool ok = j != NULL;
    json_decref(j);
    for (size_t i = 0; ok && i < n; i++)
        ok = (unsigned char)p[i] >= 0x20 && p[i] != 0x7f;
    return ok;
}

void api_model_id(const eng_gguf *gg, const char *path, char *out, size_t cap)
{
    const char *name = NULL;
    size_t name_len = 0;
    if (!gg || eng_gguf_get_str(gg, "general.name", &name, &name_len, NULL) || name_len == 0 ||
        name_len >= cap || !api_model_id_valid(name, name_len)) {
        const char *base = strrchr(path, '/');
        name = base ? base + 1 : path;
        name_len = strlen(name);
        if (name_len >= cap || !api_model_id_valid(name, name_len)) {
            name = "model";
            name_len = strlen(name);
        }
    }
    if (name_len >= cap)
        name_len = cap ? cap - 1 : 0;
    memcpy(out, name, name_len);
    if (cap)
        out[name_len] = '\0';
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

void api_system_fingerprint(const char *path, char *out, size_t cap)
{
    enum { SPAN = 1 << 20 };
    snprintf(out, cap, "spillway-%s", SPILLWAY_VERSION);
    FILE *f = path ? fopen(path, "rb") : NULL;
    unsigned char *buf = sw_malloc(SPAN);
    long size = -1;
    if (f && buf && fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (size >= 0) {
        uint64_t h = 0xcbf29ce484222325ull;
        uint64_t size64 = (uint64_t)size;
        h = fnv1a(h, (const unsigned char *)&size64, sizeof size64);
        size_t n = 0;
        if (fseek(f, 0, SEEK_SET) == 0 && (n = fread(buf, 1, SPAN, f)) > 0)
            h = fnv1a(h, buf, n);
        if (size > SPAN && fseek(f, size - SPAN, SEEK_SET) == 0 &&
            (n = fread(buf, 1, SPAN, f)) > 0)
            h = fnv1a(h, buf, n);
        snprintf(out, cap, "spillway-%s-%012llx", SPILLWAY_VERSION,
                 (unsigned long long)(h >> 16));
    }
    sw_free(buf);
    if (f)
        fclose(f);
}
