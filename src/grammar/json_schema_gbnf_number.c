/* json_schema_gbnf_number.c - a schema's numbers as GBNF
 * (json_schema_gbnf-impl.h): unbounded ones as constrain.c's step_number
 * reads them, bounded ones digit by digit.
 */
#include "grammar/json_schema_gbnf-impl.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* As constrain.c's step_number and constrain_number.c's bounded numbers
 * read them: an optional '-', a magnitude without leading zeros, no
 * exponent; with bounds, per sign, whole magnitudes in int_lo..int_hi and
 * integer parts in frac_lo..frac_hi that a fraction may follow (one with
 * a nonzero digit owed at exactly frac_lo when frac_nonzero). */

/* Magnitudes this long at most are written digit by digit (deeper ranges
 * would pass the GBNF parsers' nesting). */
#define JG_MAX_RANGE_DIGITS 40

/* The len-digit strings from a to b (a <= b, both len digits), as one
 * element: the digits they share, then at the first that differs the low
 * edge, the middle whole and the high edge. */
static void put_digit_range(jg_writer *w, const char *a, const char *b, int len)
{
    char buf[64];
    if (len == 0) {
        eng__gb_str(&w->o, "\"\"");
        return;
    }
    if (len == 1 || a[0] == b[0]) {
        if (a[0] == b[0])
            snprintf(buf, sizeof buf, "\"%c\"", a[0]);
        else
            snprintf(buf, sizeof buf, "[%c-%c]", a[0], b[0]);
        eng__gb_str(&w->o, buf);
        if (len > 1) {
            eng__gb_str(&w->o, " ");
            put_digit_range(w, a + 1, b + 1, len - 1);
        }
        return;
    }
    char nines[JG_MAX_RANGE_DIGITS + 1], zeros[JG_MAX_RANGE_DIGITS + 1];
    memset(nines, '9', (size_t)len - 1);
    memset(zeros, '0', (size_t)len - 1);
    nines[len - 1] = zeros[len - 1] = 0;
    bool low_whole = !strcmp(a + 1, zeros), high_whole = !strcmp(b + 1, nines);
    int from = a[0] + !low_whole, to = b[0] - !high_whole;
    bool any = false;
    eng__gb_str(&w->o, "(");
    if (!low_whole) {
        snprintf(buf, sizeof buf, "\"%c\" ", a[0]);
        eng__gb_str(&w->o, buf);
        put_digit_range(w, a + 1, nines, len - 1);
        any = true;
    }
    if (from <= to) {
        snprintf(buf, sizeof buf, "%s[%c-%c] [0-9]{%d}", any ? " | " : "", from, to, len - 1);
        eng__gb_str(&w->o, buf);
        any = true;
    }
    if (!high_whole) {
        snprintf(buf, sizeof buf, "%s\"%c\" ", any ? " | " : "", b[0]);
        eng__gb_str(&w->o, buf);
        put_digit_range(w, zeros, b + 1, len - 1);
    }
    eng__gb_str(&w->o, ")");
}

/* Decimal magnitudes in lo..hi (hi NULL: none above), at most max_len
 * digits, without leading zeros (0 itself only when lo is "0"), as
 * alternatives each starting with " | " unless first (*any). */
static void put_magnitudes(jg_writer *w, const char *lo, const char *hi, int max_len,
                           const char *prefix, const char *suffix, bool *any, int32_t node)
{
    int ll = (int)strlen(lo), lh = hi ? (int)strlen(hi) : max_len;
    if (lh > max_len)
        lh = max_len, hi = NULL;
    if (lh > JG_MAX_RANGE_DIGITS) {
        if (hi || ll > JG_MAX_RANGE_DIGITS) {
            eng__jg_fail(w, SW_EUNSUPPORTED, "a number bound over 40 digits", node);
            return;
        }
    }
    char a[JG_MAX_RANGE_DIGITS + 1], b[JG_MAX_RANGE_DIGITS + 1];
    for (int len = ll; len <= lh && !w->rc; len++) {
        if (!hi && len > ll) {
            /* every longer length whole, at once */
            char buf[96];
            snprintf(buf, sizeof buf, "%s%s[1-9] [0-9]{%d,%d}%s", *any ? " | " : "", prefix,
                     len - 1, lh - 1, suffix);
            eng__gb_str(&w->o, buf);
            *any = true;
            break;
        }
        if (len == ll) {
            memcpy(a, lo, (size_t)len + 1);
        } else {
            memset(a, '0', (size_t)len);
            a[0] = '1';
            a[len] = 0;
        }
        if (hi && len == lh) {
            memcpy(b, hi, (size_t)len + 1);
        } else {
            memset(b, '9', (size_t)len);
            b[len] = 0;
        }
        if (strcmp(a, b) > 0)
            continue;
        eng__gb_str(&w->o, *any ? " | " : "");
        eng__gb_str(&w->o, prefix);
        put_digit_range(w, a, b, len);
        eng__gb_str(&w->o, suffix);
        *any = true;
    }
}

/* s + 1, as a decimal string (into out, cap bytes). */
static void dec_inc(const char *s, char *out, size_t cap)
{
    size_t n = strlen(s);
    if (n + 2 > cap) {
        out[0] = 0;
        return;
    }
    memcpy(out + 1, s, n + 1);
    out[0] = '0';
    size_t i = n;
    while (out[i] == '9')
        out[i--] = '0';
    out[i]++;
    if (out[0] == '0')
        memmove(out, out + 1, n + 1);
}

void eng__jg_write_number(jg_writer *w, int32_t node, const cs_node *n)
{
    if (n->multiple_of > 0) {
        eng__jg_fail(w, SW_EUNSUPPORTED, "a number with a multiple", node);
        return;
    }
    int32_t max_frac = n->max_frac > 0 ? n->max_frac : ENG_CS_MAX_FRAC_DIGITS;
    char frac[64], owed[512];
    snprintf(frac, sizeof frac, " \".\" [0-9]{1,%d}", (int)max_frac);
    /* a fraction with a nonzero digit: its zeros, the first nonzero, the
     * rest within max_frac */
    size_t at = (size_t)snprintf(owed, sizeof owed, " \".\" (");
    for (int32_t k = 0; k < max_frac && k <= 30 && at < sizeof owed - 64; k++) {
        at += (size_t)snprintf(owed + at, sizeof owed - at, "%s", k ? " | " : "");
        if (k)
            at += (size_t)snprintf(owed + at, sizeof owed - at, "\"%.*s\" ", (int)k,
                                   "000000000000000000000000000000");
        at += (size_t)snprintf(owed + at, sizeof owed - at, "[1-9]");
        if (max_frac - 1 - k > 0)
            at += (size_t)snprintf(owed + at, sizeof owed - at, " [0-9]{0,%d}",
                                   (int)(max_frac - 1 - k));
    }
    snprintf(owed + at, sizeof owed - at, ")");
    if (max_frac > 30) {
        eng__jg_fail(w, SW_EUNSUPPORTED, "a number with over 30 fraction digits", node);
        return;
    }
    eng__jg_rule_head(w, node, NULL, 0);
    if (!n->ranged) {
        char b[96];
        snprintf(b, sizeof b, "\"-\"? (\"0\" | [1-9] [0-9]{0,%d})", ENG_CS_MAX_INT_DIGITS - 1);
        eng__gb_str(&w->o, b);
        if (n->kind == CS_NUMBER) {
            eng__gb_str(&w->o, " (");
            eng__gb_str(&w->o, frac + 1);
            eng__gb_str(&w->o, ")?");
        }
        eng__gb_str(&w->o, "\n");
        return;
    }
    int32_t int_len = n->int_digits > 0 ? n->int_digits : ENG_CS_MAX_INT_DIGITS;
    bool any = false;
    for (int s = 0; s < 2 && !w->rc; s++) {
        const char *sign = s ? "\"-\" " : "";
        if (n->int_ok[s] && n->int_lo[s])
            put_magnitudes(w, n->int_lo[s], n->int_hi[s], int_len, sign, "", &any, node);
        if (n->kind != CS_NUMBER || !n->frac_ok[s] || !n->frac_lo[s])
            continue;
        if (!n->frac_nonzero[s]) {
            put_magnitudes(w, n->frac_lo[s], n->frac_hi[s], ENG_CS_MAX_INT_DIGITS, sign, frac,
                           &any, node);
            continue;
        }
        /* exactly frac_lo owes a nonzero digit; above it, any fraction */
        put_magnitudes(w, n->frac_lo[s], n->frac_lo[s], ENG_CS_MAX_INT_DIGITS, sign, owed, &any,
                       node);
        char next[JG_MAX_RANGE_DIGITS + 2];
        dec_inc(n->frac_lo[s], next, sizeof next);
        if (next[0] && (!n->frac_hi[s] || strlen(next) < strlen(n->frac_hi[s]) ||
                        (strlen(next) == strlen(n->frac_hi[s]) && strcmp(next, n->frac_hi[s]) <= 0)))
            put_magnitudes(w, next, n->frac_hi[s], ENG_CS_MAX_INT_DIGITS, sign, frac, &any, node);
    }
    if (!any && !w->rc)
        eng__jg_fail(w, SW_EUNSUPPORTED, "a number with no value in its bounds", node);
    eng__gb_str(&w->o, "\n");
}

