/* router_image.c - image content in a chat request (docs/engines.md,
 * Images through the router): OpenAI's {"type": "image_url", "image_url":
 * {"url": "data:image/png;base64,..."}} content parts.
 *
 * The router checks each image before any worker sees it: a data: URL
 * of a media type the projectors read (PNG, JPEG, GIF, BMP), base64
 * that decodes, bytes that are what the media type says, and at most
 * [server] max-image-bytes decoded. A http(s):// image is refused: the
 * router fetches nothing on a client's behalf. The request then goes
 * only to a worker that takes images (router_policy.c, RT_SKIP_IMAGES):
 * a llama-server with a projector. Its body is relayed whole (the
 * OpenAI endpoint), or its images go beside the rendered prompt
 * (router_llamaserver.c, a stream's native path), so a replay or a
 * resume on the next worker sends the same image bytes.
 *
 * The books count an image as [model] image-tokens KV tokens, when the
 * operator gives that figure; else the request's prompt is not counted
 * and it reserves a whole slot's context (llama-server's slots).
 */
#include "router/router-impl.h"
#include "router/router_image.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The media types a projector reads (llama.cpp's mtmd decodes with
 * stb_image), and the bytes each file starts with. */
static const struct {
    const char *type;
    const char *magic;
    size_t magic_len;
} image_types[] = {
    {"image/png", "\x89PNG\r\n\x1a\n", 8},
    {"image/jpeg", "\xff\xd8\xff", 3},
    {"image/jpg", "\xff\xd8\xff", 3},
    {"image/gif", "GIF8", 4},
    {"image/bmp", "BM", 2},
};

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Checks base64 text s[0..n) (padding at its end only, length a multiple
 * of four): its decoded size into *size and its first bytes into head
 * (up to head_cap). false when it is not base64. */
static bool b64_check(const char *s, size_t n, size_t *size, unsigned char *head,
                      size_t head_cap)
{
    if (n == 0 || n % 4)
        return false;
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    size_t out = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            bool padding = i + 4 == n && k >= 4 - (int)pad;
            v[k] = padding ? 0 : b64_value((unsigned char)s[i + (size_t)k]);
            if (v[k] < 0)
                return false;
        }
        unsigned char b[3] = {(unsigned char)(v[0] << 2 | v[1] >> 4),
                              (unsigned char)(v[1] << 4 | v[2] >> 2),
                              (unsigned char)(v[2] << 6 | v[3])};
        int nb = i + 4 == n ? 3 - (int)pad : 3;
        for (int k = 0; k < nb; k++, out++)
            if (out < head_cap)
                head[out] = b[k];
    }
    *size = out;
    return true;
}

/* One image part's url: 0, or -1 with the error (code, message). */
static int check_url(const rt_config *cfg, const char *url, size_t len, const char **code,
                     char *msg, size_t cap)
{
    if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8)) {
        *code = "image_url_not_supported";
        snprintf(msg, cap, "the router does not fetch images: send the image itself as a "
                           "data: URL (data:image/png;base64,...)");
        return -1;
    }
    *code = "invalid_image";
    if (strncmp(url, "data:", 5)) {
        snprintf(msg, cap, "an image url must be a data: URL (data:image/png;base64,...)");
        return -1;
    }
    const char *comma = memchr(url, ',', len);
    const char *meta = url + 5;
    size_t meta_len = comma ? (size_t)(comma - meta) : 0;
    static const char b64[] = ";base64";
    if (!comma || meta_len < sizeof b64 - 1 ||
        memcmp(meta + meta_len - (sizeof b64 - 1), b64, sizeof b64 - 1)) {
        snprintf(msg, cap, "an image data: URL must be base64 (data:MEDIA-TYPE;base64,DATA)");
        return -1;
    }
    size_t type_len = meta_len - (sizeof b64 - 1);
    int t = -1;
    for (size_t i = 0; i < sizeof image_types / sizeof image_types[0] && t < 0; i++)
        if (strlen(image_types[i].type) == type_len &&
            !strncasecmp(meta, image_types[i].type, type_len))
            t = (int)i;
    if (t < 0) {
        snprintf(msg, cap, "the image's media type '%.*s' is not one a projector reads "
                           "(image/png, image/jpeg, image/gif, image/bmp)",
                 (int)(type_len > 40 ? 40 : type_len), meta);
        return -1;
    }
    const char *data = comma + 1;
    size_t data_len = len - (size_t)(data - url);
    size_t size = 0;
    unsigned char head[8];
    /* its decoded size first: a limit on what base64 of that length
     * decodes to, before the walk */
    if (data_len / 4 * 3 > cfg->max_image_bytes + 3) {
        *code = "image_too_large";
        snprintf(msg, cap, "an image is larger than max-image-bytes (%zu bytes decoded)",
                 cfg->max_image_bytes);
        return -1;
    }
    if (!b64_check(data, data_len, &size, head, sizeof head)) {
        snprintf(msg, cap, "the image's data is not base64");
        return -1;
    }
    if (size > cfg->max_image_bytes) {
        *code = "image_too_large";
        snprintf(msg, cap, "an image is larger than max-image-bytes (%zu bytes decoded)",
                 cfg->max_image_bytes);
        return -1;
    }
    if (size < image_types[t].magic_len ||
        memcmp(head, image_types[t].magic, image_types[t].magic_len)) {
        snprintf(msg, cap, "the image's bytes are not %s", image_types[t].type);
        return -1;
    }
    return 0;
}

/* Whether part is an image part. */
static bool is_image(const json_t *part)
{
    const char *type = json_string_value(json_object_get(part, "type"));
    return type && !strcmp(type, "image_url");
}

int rt__images_check(const rt_config *cfg, json_t *body, int *n_images, const char **code,
                     char *msg, size_t cap, char *param, size_t param_cap)
{
    *n_images = 0;
    json_t *msgs = json_object_get(body, "messages");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *content = json_object_get(json_array_get(msgs, i), "content");
        for (size_t k = 0; json_is_array(content) && k < json_array_size(content); k++) {
            json_t *part = json_array_get(content, k);
            if (!is_image(part))
                continue;
            snprintf(param, param_cap, "messages[%zu].content[%zu].image_url", i, k);
            json_t *iu = json_object_get(part, "image_url");
            json_t *url = json_is_object(iu) ? json_object_get(iu, "url") : iu;
            if (!json_is_string(url)) {
                *code = "invalid_image";
                snprintf(msg, cap, "an image_url part needs \"image_url\": {\"url\": \"data:...\"}");
                return -1;
            }
            if (check_url(cfg, json_string_value(url), json_string_length(url), code, msg, cap))
                return -1;
            (*n_images)++;
        }
    }
    return 0;
}

bool rt__images_in(json_t *body)
{
    json_t *msgs = json_object_get(body, "messages");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *content = json_object_get(json_array_get(msgs, i), "content");
        for (size_t k = 0; json_is_array(content) && k < json_array_size(content); k++)
            if (is_image(json_array_get(content, k)))
                return true;
    }
    return false;
}

json_t *rt__images_stripped(json_t *body)
{
    json_t *copy = json_deep_copy(body);
    json_t *msgs = json_object_get(copy, "messages");
    for (size_t i = 0; copy && i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        json_t *content = json_object_get(m, "content");
        if (!json_is_array(content))
            continue;
        for (size_t k = json_array_size(content); k-- > 0;)
            if (is_image(json_array_get(content, k)))
                json_array_remove(content, k);
        if (!json_array_size(content))
            json_object_set_new(m, "content", json_string(""));
    }
    return copy;
}
