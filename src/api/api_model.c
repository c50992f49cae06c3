/* api_model.c - the id a model is served as (api.h). */
#include "api/api.h"

#include <jansson.h>
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
