/* formats.c - the patterns of JSON Schema's formats (see formats.h).
 *
 * Sources of the grammars: RFC 3339 (date, time, date-time; Appendix A
 * for duration), RFC 5321 section 4.1.2 (email's Mailbox), RFC 1123 2.1
 * with RFC 1034 3.1 (hostname), RFC 2673 / 4291 section 2.2 (ipv4 dotted
 * quads, ipv6 text forms), RFC 4122 (uuid), RFC 3986 (uri, uri-reference),
 * RFC 6901 (json-pointer) and the relative JSON pointer draft.
 *
 * Narrowings (values a validator accepts that these patterns do not; the
 * generated value is always valid):
 *  - date, date-time: years 0001-9999 (0000 is valid RFC 3339 but many
 *    date libraries refuse it);
 *  - time, date-time: a leap second only as 23:59:60 in UTC (Z, +00:00 or
 *    -00:00); RFC 3339 allows it at any offset where the UTC time is
 *    23:59:60, which needs arithmetic between the fields. Which days had
 *    leap seconds is not checked (a table, not a grammar);
 *  - email: no General-address-literal ([tag:text]); labels of the domain
 *    at most 63 characters (the ABNF has no limit, DNS does);
 *  - hostname (and email's domain): no trailing dot, and no label with
 *    "--" as its 3rd and 4th characters: those are reserved (RFC 5891
 *    4.2.3.1), and an "xn--" A-label is only valid when its Punycode
 *    decodes to a valid U-label, which a regular language cannot check;
 *  - iri, iri-reference, idn-email: their ASCII subsets (uri,
 *    uri-reference, email), which are valid IRIs and addresses.
 * Exact otherwise: leap years (divisible by 4, centuries by 400) come from
 * the year's digits, each month has its own last day.
 */
#include "grammar/formats.h"

#include "grammar/regex.h"

#include <pthread.h>
#include <string.h>

#define D "[0-9]"
#define YEAR "(?:[1-9]" D "{3}|0[1-9]" D "{2}|00[1-9]" D "|000[1-9])"
#define LEAP                                                                                   \
    "(?:" D D "(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
#define DATE                                                                                   \
    "(?:" YEAR "-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]" D "|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]" D \
    "|30)|02-(?:0[1-9]|1" D "|2[0-8]))|" LEAP "-02-29)"
#define FRAC "(?:\\.[0-9]+)?"
#define TIME                                                                                   \
    "(?:(?:[01]" D "|2[0-3]):[0-5]" D ":[0-5]" D FRAC "(?:[Zz]|[+-](?:[01]" D "|2[0-3]):[0-5]" D \
    ")|23:59:60" FRAC "(?:[Zz]|[+-]00:00))"

#define DUR_TIME "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
#define DUR_DATE                                                                               \
    "(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:" DUR_TIME ")?"
#define DURATION "P(?:" DUR_DATE "|" DUR_TIME "|[0-9]+W)"

#define OCTET "(?:25[0-5]|2[0-4]" D "|1" D D "|[1-9]?" D ")"
#define IPV4 "(?:" OCTET "\\.){3}" OCTET
#define H16 "[0-9A-Fa-f]{1,4}"
#define LS32 "(?:" H16 ":" H16 "|" IPV4 ")"
#define IPV6                                                                                   \
    "(?:(?:" H16 ":){6}" LS32 "|::(?:" H16 ":){5}" LS32 "|(?:" H16 ")?::(?:" H16 ":){4}" LS32     \
    "|(?:(?:" H16 ":)?" H16 ")?::(?:" H16 ":){3}" LS32 "|(?:(?:" H16 ":){0,2}" H16 ")?::(?:" H16  \
    ":){2}" LS32 "|(?:(?:" H16 ":){0,3}" H16 ")?::" H16 ":" LS32 "|(?:(?:" H16 ":){0,4}" H16      \
    ")?::" LS32 "|(?:(?:" H16 ":){0,5}" H16 ")?::" H16 "|(?:(?:" H16 ":){0,6}" H16 ")?::)"

/* 1 to 63 letters, digits and hyphens, a letter or digit at both ends,
 * and not "--" as the 3rd and 4th characters (RFC 5891 4.2.3.1 reserves
 * those labels, "xn--" A-labels among them: a narrowing, no A-labels). */
#define AN "[A-Za-z0-9]"
#define LDH "[A-Za-z0-9-]"
#define LABEL                                                                                  \
    AN "(?:" LDH "?" AN "|" LDH LDH AN "|" LDH "(?:" AN LDH "|-" AN ")" LDH "{0,58}" AN ")?"
#define HOSTNAME LABEL "(?:\\." LABEL ")*"

#define ATEXT "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
#define LOCAL "(?:" ATEXT "+(?:\\." ATEXT "+)*|\"(?:[ !#-\\[\\]-~]|\\\\[ -~])*\")"
#define EMAIL LOCAL "@(?:" HOSTNAME "|\\[" IPV4 "\\]|\\[[Ii][Pp][Vv]6:" IPV6 "\\])"

#define PCT "%[0-9A-Fa-f]{2}"
#define PCHAR "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|" PCT ")"
#define SCHEME "[A-Za-z][A-Za-z0-9+.-]*"
#define USERINFO "(?:[A-Za-z0-9._~!$&'()*+,;=:-]|" PCT ")*"
#define REGNAME "(?:[A-Za-z0-9._~!$&'()*+,;=-]|" PCT ")*"
#define IPVFUTURE "[Vv][0-9A-Fa-f]+\\.[A-Za-z0-9._~!$&'()*+,;=:-]+"
#define HOST "(?:\\[(?:" IPV6 "|" IPVFUTURE ")\\]|" IPV4 "|" REGNAME ")"
#define AUTHORITY "(?:" USERINFO "@)?" HOST "(?::[0-9]*)?"
#define SEGS "(?:/" PCHAR "*)*"
#define SEGNZ PCHAR "+"
#define SEGNZNC "(?:[A-Za-z0-9._~!$&'()*+,;=@-]|" PCT ")+"
#define QUERY "(?:" PCHAR "|[/?])*"
#define TAIL "(?:\\?" QUERY ")?(?:#" QUERY ")?"
#define HIER "(?://" AUTHORITY SEGS "|/(?:" SEGNZ SEGS ")?|" SEGNZ SEGS "|)"
#define URI SCHEME ":" HIER TAIL
#define RELREF "(?://" AUTHORITY SEGS "|/(?:" SEGNZ SEGS ")?|" SEGNZNC SEGS "|)" TAIL

#define JSON_POINTER "(?:/(?:[^~/]|~[01])*)*"

typedef struct format_def {
    const char *name;
    const char *pattern;
    int32_t max_chars;
} format_def;

static const format_def formats[] = {
    {"date", "^" DATE "$", INT32_MAX},
    {"time", "^" TIME "$", INT32_MAX},
    {"date-time", "^" DATE "[Tt]" TIME "$", INT32_MAX},
    {"duration", "^" DURATION "$", INT32_MAX},
    {"email", "^" EMAIL "$", INT32_MAX},
    {"idn-email", "^" EMAIL "$", INT32_MAX},
    {"hostname", "^" HOSTNAME "$", 253},
    {"ipv4", "^" IPV4 "$", INT32_MAX},
    {"ipv6", "^" IPV6 "$", INT32_MAX},
    {"uuid", "^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$",
     INT32_MAX},
    {"uri", "^" URI "$", INT32_MAX},
    {"iri", "^" URI "$", INT32_MAX},
    {"uri-reference", "^(?:" URI "|" RELREF ")$", INT32_MAX},
    {"iri-reference", "^(?:" URI "|" RELREF ")$", INT32_MAX},
    {"json-pointer", "^" JSON_POINTER "$", INT32_MAX},
    {"relative-json-pointer", "^(?:0|[1-9][0-9]*)(?:#|" JSON_POINTER ")$", INT32_MAX},
};

const char *eng_format_pattern(const char *name, int32_t *max_chars)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        if (strcmp(formats[i].name, name) == 0) {
            if (max_chars)
                *max_chars = formats[i].max_chars;
            return formats[i].pattern;
        }
    }
    if (max_chars)
        *max_chars = INT32_MAX;
    return NULL;
}

/* One slot per format, filled under the lock on first use. */
static const eng_regex *compiled[sizeof formats / sizeof formats[0]];
static pthread_mutex_t compiled_lock = PTHREAD_MUTEX_INITIALIZER;

int eng_format_regex(const char *name, const eng_regex **out, int32_t *max_chars,
                     sw_error *err)
{
    *out = NULL;
    if (max_chars)
        *max_chars = INT32_MAX;
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        if (strcmp(formats[i].name, name) != 0)
            continue;
        if (max_chars)
            *max_chars = formats[i].max_chars;
        int rc = SW_OK;
        pthread_mutex_lock(&compiled_lock);
        if (!compiled[i]) {
            eng_regex *re = NULL;
            rc = eng_regex_compile(formats[i].pattern, strlen(formats[i].pattern), &re, err);
            compiled[i] = re;
        }
        *out = compiled[i];
        pthread_mutex_unlock(&compiled_lock);
        return rc;
    }
    return SW_OK;
}
