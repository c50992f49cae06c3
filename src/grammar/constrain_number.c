/* constrain_number.c - the automaton's numbers with bounds or multiples
 * (constrain.c runs the other nodes; constrain-state.h).
 */
#include "grammar/constrain.h"

#include "common/alloc.h"
#include "grammar/constrain-impl.h"
#include "grammar/constrain-state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- numbers with bounds or multiples ----
 * A bounded number node (ranged, multiple_of or max_frac set) keeps in its
 * frame: pend = the sign (0, 1 after '-'), a = the digits so far, lo / hi
 * = how those digits compare with the same-length prefix of int_lo /
 * int_hi (C_EQ, C_LT, C_GT), c = the same for frac_lo (bits 0-1) and
 * frac_hi (bits 2-3), b = the value so far modulo multiple_of, or, in the
 * fraction, 1 while a nonzero digit is still owed. A digit is accepted only
 * when some completion stays in bounds, so no accepted prefix is a dead
 * end. */
enum { C_EQ = 0, C_LT = 1, C_GT = 2 };

bool eng__cs_num_bounded(const cs_node *n)
{
    return n->ranged || n->multiple_of > 0 || n->max_frac > 0;
}

static uint8_t cmp_digit(uint8_t state, int32_t k, const char *bound, uint8_t d)
{
    if (!bound || state != C_EQ || k > (int32_t)strlen(bound))
        return state;
    return d < (uint8_t)bound[k - 1] ? C_LT : d > (uint8_t)bound[k - 1] ? C_GT : C_EQ;
}

/* The fewest digits to append to k digits (comparing st_lo / st_hi with
 * lo / hi) so the magnitude ends in lo..hi (and a multiple of mult, from
 * the remainder rem), or -1 when none can. */
static int32_t range_more(int32_t k, int32_t max_digits, const char *lo, uint8_t st_lo,
                          const char *hi, uint8_t st_hi, int32_t mult, int32_t rem)
{
    int32_t ll = lo ? (int32_t)strlen(lo) : 1, lh = hi ? (int32_t)strlen(hi) : INT32_MAX;
    int64_t pow10 = 1; /* used with mult only, which keeps to 15 digits */
    for (int32_t e = 0; k + e <= max_digits;
         e++, pow10 = pow10 <= INT64_MAX / 10 ? pow10 * 10 : pow10) {
        int32_t len = k + e;
        if (len < ll)
            continue;
        if (len > lh)
            break;
        if (lo && len == ll && st_lo == C_LT)
            continue;
        if (len == lh && st_hi == C_GT)
            continue;
        if (mult > 0) {
            int64_t t = rem;
            for (int32_t i = 0; i < e; i++)
                t = t * 10 % mult;
            if ((mult - t) % mult >= pow10)
                continue;
        }
        return e;
    }
    return -1;
}

/* Bounds and a multiple together (integers only, every bound within the
 * 15 digits, so int64 holds them): the magnitude so far is kept whole in
 * b (low 32 bits) and c (high), and each length of completion is checked
 * for a multiple inside its interval. */
static int64_t num_value(const cs_frame *f)
{
    return (int64_t)(uint32_t)f->b | (int64_t)f->c << 32;
}

static int32_t ranged_multiple_more(const cs_node *n, const cs_frame *f)
{
    int s = f->pend;
    const char *lo = n->int_lo[s], *hi = n->int_hi[s];
    int32_t ll = (int32_t)strlen(lo), lh = hi ? (int32_t)strlen(hi) : INT32_MAX;
    int64_t lv = strtoll(lo, NULL, 10), hv = hi ? strtoll(hi, NULL, 10) : INT64_MAX;
    int64_t p = num_value(f), m = n->multiple_of, pow10 = 1;
    for (int32_t e = 0; f->a + e <= ENG_CS_MAX_INT_DIGITS; e++, pow10 *= 10) {
        int32_t len = f->a + e;
        if (len < ll)
            continue;
        if (len > lh)
            break;
        int64_t a = p * pow10, b = a + pow10 - 1;
        if (len == ll && a < lv)
            a = lv;
        if (len == lh && b > hv)
            b = hv;
        if (a <= b && (a + m - 1) / m * m <= b)
            return e;
    }
    return -1;
}

/* The integer part's most digits. */
static int32_t int_digits(const cs_node *n)
{
    return n->int_digits > 0 ? n->int_digits : ENG_CS_MAX_INT_DIGITS;
}

static int32_t int_more(const cs_node *n, const cs_frame *f)
{
    int s = f->pend;
    if (!n->ranged)
        return range_more(f->a, ENG_CS_MAX_INT_DIGITS, NULL, C_EQ, NULL, C_EQ, n->multiple_of,
                          f->b);
    if (!n->int_ok[s])
        return -1;
    if (n->multiple_of > 0)
        return ranged_multiple_more(n, f);
    return range_more(f->a, int_digits(n), n->int_lo[s], f->lo, n->int_hi[s], f->hi, 0, 0);
}

static int32_t frac_more(const cs_node *n, const cs_frame *f)
{
    int s = f->pend;
    if (n->kind != CS_NUMBER || n->multiple_of > 0)
        return -1;
    if (!n->ranged)
        return range_more(f->a, ENG_CS_MAX_INT_DIGITS, NULL, C_EQ, NULL, C_EQ, 0, 0);
    if (!n->frac_ok[s])
        return -1;
    return range_more(f->a, ENG_CS_MAX_INT_DIGITS, n->frac_lo[s], (uint8_t)(f->c & 3),
                      n->frac_hi[s], (uint8_t)(f->c >> 2 & 3), 0, 0);
}

/* The magnitude 0 may start a value of this sign: as a whole value, or as
 * the integer part of a fraction. */
static bool zero_ok(const cs_node *n, int s, bool *as_frac)
{
    *as_frac = n->kind == CS_NUMBER && n->multiple_of == 0 &&
               (!n->ranged || (n->frac_ok[s] && strcmp(n->frac_lo[s], "0") == 0));
    bool whole = !n->ranged || (n->int_ok[s] && strcmp(n->int_lo[s], "0") == 0);
    return whole || *as_frac;
}

static void num_digit(const cs_node *n, cs_frame *f, uint8_t d)
{
    int s = f->pend;
    int32_t k = f->a + 1;
    if (n->ranged && n->multiple_of > 0) {
        int64_t v = num_value(f) * 10 + (d - '0');
        f->b = (int32_t)(uint32_t)(v & 0xFFFFFFFF);
        f->c = (int32_t)(v >> 32);
    } else if (n->ranged) {
        f->lo = cmp_digit(f->lo, k, n->int_lo[s], d);
        f->hi = cmp_digit(f->hi, k, n->int_hi[s], d);
        uint8_t flo = cmp_digit((uint8_t)(f->c & 3), k, n->frac_lo[s], d);
        uint8_t fhi = cmp_digit((uint8_t)(f->c >> 2 & 3), k, n->frac_hi[s], d);
        f->c = flo | fhi << 2;
    } else if (n->multiple_of > 0) {
        f->b = (int32_t)(((int64_t)f->b * 10 + (d - '0')) % n->multiple_of);
    }
    f->a = k;
}

/* Entering the fraction after the integer part so far (zero: "0"). */
static bool num_enter_frac(const cs_node *n, cs_frame *f, bool zero)
{
    int s = f->pend;
    bool owed = false;
    if (zero) {
        bool as_frac;
        zero_ok(n, s, &as_frac);
        if (!as_frac)
            return false;
        owed = n->ranged && n->frac_nonzero[s];
    } else {
        if (frac_more(n, f) != 0)
            return false;
        /* exactly frac_lo: the fraction must be nonzero */
        owed = n->ranged && n->frac_nonzero[s] && f->a == (int32_t)strlen(n->frac_lo[s]) &&
               (f->c & 3) == C_EQ;
    }
    f->phase = N_FRAC0;
    f->a = 0;
    f->b = owed;
    return true;
}

int eng__cs_step_bounded(const cs_node *n, cs_frame *f, uint8_t ch)
{
    bool digit = ch >= '0' && ch <= '9';
    int32_t max_frac = n->max_frac > 0 ? n->max_frac : ENG_CS_MAX_FRAC_DIGITS;
    switch (f->phase) {
    case N_START:
    case N_NEG:
        if (ch == '-' && f->phase == N_START) {
            if (n->ranged && !n->int_ok[1] && !n->frac_ok[1])
                return R_REJECT;
            f->phase = N_NEG;
            f->pend = 1;
            return R_ACCEPT;
        }
        if (!digit)
            return R_REJECT;
        if (ch == '0') {
            bool as_frac;
            if (!zero_ok(n, f->pend, &as_frac))
                return R_REJECT;
            f->phase = N_ZERO;
            return R_ACCEPT;
        }
        num_digit(n, f, ch);
        if (int_more(n, f) < 0 && frac_more(n, f) < 0)
            return R_REJECT;
        f->phase = N_INT;
        return R_ACCEPT;
    case N_ZERO: {
        if (ch == '.' && num_enter_frac(n, f, true))
            return R_ACCEPT;
        bool whole = !n->ranged || (n->int_ok[f->pend] && strcmp(n->int_lo[f->pend], "0") == 0);
        return whole ? R_END : R_REJECT;
    }
    case N_INT:
        if (digit && f->a < (n->ranged ? int_digits(n) : ENG_CS_MAX_INT_DIGITS)) {
            cs_frame next = *f;
            num_digit(n, &next, ch);
            if (int_more(n, &next) >= 0 || frac_more(n, &next) >= 0) {
                *f = next;
                return R_ACCEPT;
            }
        }
        if (ch == '.' && num_enter_frac(n, f, false))
            return R_ACCEPT;
        return int_more(n, f) == 0 ? R_END : R_REJECT;
    case N_FRAC0:
    default: /* N_FRAC */
        if (digit && f->a < max_frac) {
            /* the last place left must pay an owed nonzero digit */
            if (f->b && ch == '0' && f->a + 1 >= max_frac)
                return R_REJECT;
            if (ch != '0')
                f->b = 0;
            f->phase = N_FRAC;
            f->a++;
            return R_ACCEPT;
        }
        if (f->phase == N_FRAC0 || f->b)
            return R_REJECT;
        return R_END;
    }
}

bool eng__cs_num_can_end(const cs_node *n, const cs_frame *f)
{
    if (!eng__cs_num_bounded(n))
        return f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC;
    switch (f->phase) {
    case N_ZERO: return !n->ranged || (n->int_ok[f->pend] && strcmp(n->int_lo[f->pend], "0") == 0);
    case N_INT: return int_more(n, f) == 0;
    case N_FRAC: return f->b == 0;
    default: return false;
    }
}

int64_t eng__cs_num_min(const cs_node *n, const cs_frame *f)
{
    if (!eng__cs_num_bounded(n))
        return f->phase == N_START || f->phase == N_NEG || f->phase == N_FRAC0 ? 1 : 0;
    switch (f->phase) {
    case N_START: return n->min_bytes;
    case N_NEG: {
        /* as in json_schema.c's node minimum, for the negative side */
        int64_t best = CS_INF;
        if (!n->ranged || n->int_ok[1])
            best = n->ranged ? (int64_t)strlen(n->int_lo[1]) : 1;
        if (n->ranged && n->frac_ok[1] && (int64_t)strlen(n->frac_lo[1]) + 2 < best)
            best = (int64_t)strlen(n->frac_lo[1]) + 2;
        return best;
    }
    case N_ZERO: return eng__cs_num_can_end(n, f) ? 0 : 2;
    case N_INT: {
        int32_t i = int_more(n, f), r = frac_more(n, f);
        int64_t best = i >= 0 ? i : CS_INF;
        if (r >= 0 && r + 2 < best)
            best = r + 2;
        return best;
    }
    case N_FRAC0: return 1;
    default: return f->b ? 1 : 0;
    }
}
