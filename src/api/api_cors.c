/* api_cors.c - the CORS answers the worker and the router share (api.h). */
#include "api/api.h"

#include <string.h>

const char *api_cors_allow(const char *list, const char *origin)
{
    if (!list || !list[0] || !origin || !origin[0])
        return NULL;
    if (!strcmp(list, "*"))
        return "*";
    size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ' || *p == '\t')
            p++;
        size_t len = strcspn(p, ", \t");
        if (len == n && !memcmp(p, origin, n))
            return origin;
        p += len;
    }
    return NULL;
}

const char *api_cors_request_headers(const char *asked)
{
    /* a plain list of header names, as a browser sends it: echoed */
    if (asked && asked[0] && strlen(asked) < 512 &&
        strspn(asked, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_, ") ==
            strlen(asked))
        return asked;
    return API_CORS_HEADERS;
}

bool api_cors_list_valid(const char *list)
{
    if (!strcmp(list, "*") || !list[0])
        return true;
    /* origins: scheme://host[:port], no path, no wildcard inside */
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ' || *p == '\t')
            p++;
        size_t len = strcspn(p, ", \t");
        if (len == 0)
            break;
        const char *sep = memmem(p, len, "://", 3);
        if (!sep || sep == p || sep + 3 == p + len || memchr(sep + 3, '/', (size_t)(p + len - sep - 3)) ||
            memchr(p, '*', len))
            return false;
        p += len;
    }
    return true;
}
