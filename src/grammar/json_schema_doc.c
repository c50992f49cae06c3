/* json_schema_doc.c - a schema document: its dialect, its identifiers
 * ($id, $anchor) and $ref resolution, for the compiler and the validator.
 */
#include "grammar/json_schema.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "grammar/constrain-impl.h"
#include "grammar/formats.h"
#include "grammar/json_schema-impl.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the schema document: dialect, identifiers, references ----------------
 * Both the compiler and the validator resolve $ref against an index built
 * once per document: every schema object reached through a keyword that
 * holds schemas gets its base URI (from the $id / id above it), and every
 * $id and $anchor is recorded as an absolute URI. A $ref is resolved
 * against the base of the schema that holds it; a URI outside the document
 * is a remote reference, refused (nothing is fetched), except the
 * well-known metaschema URIs of draft 7 and 2020-12, which name built-in
 * documents (json_schema_meta.c). */


static sc_dialect dialect_of(const json_t *root)
{
    const char *s = json_string_value(json_object_get(root, "$schema"));
    if (!s)
        return SC_2020;
    if (strstr(s, "draft-04") || strstr(s, "draft-03"))
        return SC_DRAFT4;
    if (strstr(s, "draft-06") || strstr(s, "draft-07"))
        return SC_DRAFT7;
    return SC_2020;
}

static void uri_strip_fragment(char *u)
{
    char *h = strchr(u, '#');
    if (h)
        *h = '\0';
}

static bool uri_has_scheme(const char *r)
{
    const char *p = r;
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
        return false;
    while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
           *p == '+' || *p == '-' || *p == '.')
        p++;
    return *p == ':';
}

/* Removes "./" and "x/../" segments from the path part of u (in place). */
static void uri_dot_segments(char *u)
{
    char *path = strstr(u, "://");
    path = path ? strchr(path + 3, '/') : strchr(u, ':');
    if (!path)
        return;
    char out[SC_URI_MAX];
    size_t o = 0;
    const char *p = path;
    while (*p && o + 2 < sizeof out) {
        if (strncmp(p, "/./", 3) == 0) {
            p += 2;
        } else if (strncmp(p, "/../", 4) == 0 || strcmp(p, "/..") == 0) {
            while (o > 0 && out[o - 1] != '/')
                o--;
            if (o > 0)
                o--;
            p += 3;
            if (!*p)
                out[o++] = '/';
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    memcpy(path, out, o + 1);
}

/* out = ref resolved against base (RFC 3986, the forms schemas use); false
 * when it does not fit in cap (a URI is never cut short: a cut one could
 * name another schema). */
static bool uri_resolve(const char *base, const char *ref, char *out, size_t cap)
{
    char b[SC_URI_MAX];
    int n;
    if (strlen(base) >= sizeof b)
        return false;
    snprintf(b, sizeof b, "%s", base);
    if (uri_has_scheme(ref)) {
        n = snprintf(out, cap, "%s", ref);
    } else if (ref[0] == '#') {
        uri_strip_fragment(b);
        n = snprintf(out, cap, "%s%s", b, ref);
    } else if (ref[0] == '\0') {
        uri_strip_fragment(b);
        n = snprintf(out, cap, "%s", b);
    } else if (ref[0] == '/' && ref[1] == '/') {
        char *c = strchr(b, ':');
        if (c)
            c[1] = '\0';
        n = snprintf(out, cap, "%s%s", b, ref);
    } else if (ref[0] == '/') {
        char *a = strstr(b, "://");
        char *slash = a ? strchr(a + 3, '/') : strchr(b, ':');
        if (slash)
            slash[a ? 0 : 1] = '\0';
        n = snprintf(out, cap, "%s%s", b, ref);
    } else {
        uri_strip_fragment(b);
        char *q = strchr(b, '?');
        if (q)
            *q = '\0';
        char *slash = strrchr(b, '/');
        char *colon = strchr(b, ':');
        if (slash && (!colon || slash > colon))
            slash[1] = '\0';
        else if (colon)
            colon[1] = '\0';
        n = snprintf(out, cap, "%s%s", b, ref);
    }
    if (n < 0 || (size_t)n >= cap)
        return false;
    uri_dot_segments(out);
    /* "x#" is "x" */
    size_t len = strlen(out);
    if (len > 0 && out[len - 1] == '#')
        out[len - 1] = '\0';
    return true;
}

void eng__sc_ptr_key(const json_t *s, char *key, size_t cap)
{
    snprintf(key, cap, "%p", (const void *)s);
}

const char *eng__sc_doc_base_of(const sc_doc *d, const json_t *s)
{
    char key[32];
    eng__sc_ptr_key(s, key, sizeof key);
    return json_string_value(json_object_get(d->bases, key));
}

/* Keywords whose value is a schema, an array of schemas, or an object of
 * schemas: the places a subschema (and so an $id) can be. */
static const char *const schema_keywords[] = {
    "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "items", "contentSchema",
};
static const char *const schema_array_keywords[] = {"allOf", "anyOf", "oneOf", "prefixItems",
                                                    "items"};
static const char *const schema_map_keywords[] = {"properties", "patternProperties", "$defs",
                                                  "definitions", "dependentSchemas",
                                                  "dependencies"};

static int doc_index(sc_doc *d, const json_t *s, const char *base, int depth, sw_error *err)
{
    if (!json_is_object(s))
        return SW_OK;
    if (++d->indexed > SC_MAX_INDEXED || depth > 200)
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "the schema is too large or nests too deeply to compile");
    char mine[SC_URI_MAX];
    snprintf(mine, sizeof mine, "%s", base);
    bool ref_only = d->dialect != SC_2020 && json_object_get(s, "$ref");
    const char *id = json_string_value(json_object_get(s, d->dialect == SC_DRAFT4 ? "id" : "$id"));
    if (id && !ref_only) {
        char abs[SC_URI_MAX];
        if (!uri_resolve(base, id, abs, sizeof abs))
            return sw_error_set(err, SW_EUNSUPPORTED,
                                "an $id whose URI is longer than %d bytes is not supported",
                                SC_URI_MAX - 1);
        if (id[0] == '#') {
            /* draft 6/7: "$id": "#name" is an anchor */
            if (json_object_set(d->ids, abs, (json_t *)s))
                return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
        } else {
            snprintf(mine, sizeof mine, "%s", abs);
            uri_strip_fragment(mine);
            if (json_object_set(d->ids, mine, (json_t *)s))
                return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
        }
    }
    const char *anchor = json_string_value(json_object_get(s, "$anchor"));
    if (!anchor)
        anchor = json_string_value(json_object_get(s, "$dynamicAnchor"));
    if (anchor) {
        char abs[SC_URI_MAX * 2];
        int n = snprintf(abs, sizeof abs, "%s#%s", mine, anchor);
        if (n < 0 || (size_t)n >= sizeof abs)
            return sw_error_set(err, SW_EUNSUPPORTED,
                                "an $anchor longer than %d bytes is not supported",
                                SC_URI_MAX - 1);
        if (!json_object_get(d->ids, abs) && json_object_set(d->ids, abs, (json_t *)s))
            return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
    }
    char key[32];
    eng__sc_ptr_key(s, key, sizeof key);
    if (json_object_set_new(d->bases, key, json_string(mine)))
        return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
    if (ref_only)
        return SW_OK;
    int rc;
    for (size_t i = 0; i < sizeof schema_keywords / sizeof *schema_keywords; i++) {
        const json_t *v = json_object_get(s, schema_keywords[i]);
        if (json_is_object(v) && (rc = doc_index(d, v, mine, depth + 1, err)))
            return rc;
    }
    for (size_t i = 0; i < sizeof schema_array_keywords / sizeof *schema_array_keywords; i++) {
        const json_t *v = json_object_get(s, schema_array_keywords[i]);
        for (size_t j = 0; json_is_array(v) && j < json_array_size(v); j++)
            if ((rc = doc_index(d, json_array_get(v, j), mine, depth + 1, err)))
                return rc;
    }
    for (size_t i = 0; i < sizeof schema_map_keywords / sizeof *schema_map_keywords; i++) {
        const json_t *v = json_object_get(s, schema_map_keywords[i]);
        const char *k;
        const json_t *sub;
        if (!json_is_object(v))
            continue;
        json_object_foreach((json_t *)v, k, sub) {
            if ((rc = doc_index(d, sub, mine, depth + 1, err)))
                return rc;
        }
    }
    return SW_OK;
}

void eng__sc_doc_free(sc_doc *d)
{
    json_decref(d->ids);
    json_decref(d->bases);
    json_decref(d->arena);
    memset(d, 0, sizeof *d);
}

int eng__sc_doc_init(sc_doc *d, const json_t *root, sw_error *err)
{
    memset(d, 0, sizeof *d);
    d->root = root;
    d->dialect = dialect_of(root);
    d->ids = json_object();
    d->bases = json_object();
    d->arena = json_array();
    if (!d->ids || !d->bases || !d->arena) {
        eng__sc_doc_free(d);
        return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
    }
    /* the root under the default base too, so "#/..." always resolves */
    if (json_object_set(d->ids, SC_DEFAULT_BASE, (json_t *)root)) {
        eng__sc_doc_free(d);
        return sw_error_set(err, SW_ENOMEM, "out of memory indexing the schema");
    }
    int rc = doc_index(d, root, SC_DEFAULT_BASE, 0, err);
    if (rc)
        eng__sc_doc_free(d);
    return rc;
}

/* Keeps a schema made while merging alive with the document (the reference
 * is taken over); returns it, or NULL (and frees it) out of memory. */
json_t *eng__sc_doc_keep(sc_doc *d, json_t *s)
{
    if (!s || json_array_append_new(d->arena, s))
        return NULL;
    return s;
}

/* Percent-decodes a URI fragment (in place). */
static void pct_decode(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (p[0] == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
            char h[3] = {p[1], p[2], 0};
            *o++ = (char)strtol(h, NULL, 16);
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
}

/* Follows a JSON pointer ("/a/0/b") from doc; NULL where it leads nowhere. */
static const json_t *json_pointer_get(const json_t *doc, const char *ptr)
{
    const json_t *cur = doc;
    const char *p = ptr;
    while (*p == '/' && cur) {
        p++;
        char seg[512];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof seg) {
            if (p[0] == '~' && p[1] == '0') {
                seg[n++] = '~';
                p += 2;
            } else if (p[0] == '~' && p[1] == '1') {
                seg[n++] = '/';
                p += 2;
            } else {
                seg[n++] = *p++;
            }
        }
        seg[n] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(seg, &end, 10);
            cur = (*end || !n) ? NULL : json_array_get(cur, i);
        } else {
            cur = NULL;
        }
    }
    return *p ? NULL : cur;
}

/* A well-known metaschema URI: the built-in document (json_schema_meta.c)
 * is parsed into the document's arena and indexed under that URI the
 * first time a reference names it (*out NULL: not one of them). The
 * document is changed through a const pointer here, as a cache: the index
 * only grows, and what was resolved before stays where it was. */
static int doc_load_builtin(sc_doc *d, const char *uri, const json_t **out, sw_error *err)
{
    *out = NULL;
    const char *text = eng__sc_builtin_metaschema(uri);
    if (!text)
        return SW_OK;
    json_error_t jerr;
    json_t *meta = sw_json_loads(text, 0, &jerr);
    if (!meta || !eng__sc_doc_keep(d, meta) || json_object_set(d->ids, uri, meta))
        return sw_error_set(err, SW_ENOMEM, "out of memory loading the built-in metaschema");
    int rc = doc_index(d, meta, uri, 0, err);
    if (rc)
        return rc;
    *out = meta;
    return SW_OK;
}

/* The schema a $ref names, seen from base; *target_base receives the base
 * URI the target's own references resolve against (storage of d). */
int eng__sc_doc_resolve(const sc_doc *d, const char *base, const char *ref, const json_t **out,
                        sw_error *err)
{
    char abs[SC_URI_MAX], docuri[SC_URI_MAX], frag[SC_URI_MAX];
    if (!uri_resolve(base ? base : SC_DEFAULT_BASE, ref, abs, sizeof abs))
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "a $ref whose URI is longer than %d bytes is not supported",
                            SC_URI_MAX - 1);
    snprintf(docuri, sizeof docuri, "%s", abs);
    char *h = strchr(docuri, '#');
    frag[0] = '\0';
    if (h) {
        snprintf(frag, sizeof frag, "%s", h + 1);
        *h = '\0';
    }
    const json_t *doc = json_object_get(d->ids, docuri);
    if (!doc) {
        int rc = doc_load_builtin((sc_doc *)d, docuri, &doc, err);
        if (rc)
            return rc;
    }
    if (!doc)
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "a remote $ref (%.200s) is not supported: only references into the "
                            "schema itself are resolved",
                            abs);
    pct_decode(frag);
    if (frag[0] == '\0') {
        *out = doc;
    } else if (frag[0] == '/') {
        *out = json_pointer_get(doc, frag);
    } else {
        char a[SC_URI_MAX * 2];
        snprintf(a, sizeof a, "%s#%s", docuri, frag);
        *out = json_object_get(d->ids, a);
    }
    if (!*out || !(json_is_object(*out) || json_is_boolean(*out)))
        return sw_error_set(err, SW_EINVAL, "the $ref %.200s names no schema in the document",
                            ref);
    return SW_OK;
}
