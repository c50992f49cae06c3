/* test_cpu_ops.c - the element-wise CPU kernels the forward pass calls
 * between matrix products (cpu_swiglu_f32), at every instruction-set level
 * this machine has.
 *
 * Expected values are computed here in double from the definition
 * (silu(g) = g / (1 + e^-g)); the scalar level must give exactly the f32
 * formula with libm's expf, a vectorised level either that or a value
 * within 4 ulp of the double one, and every element's result must depend only on its own
 * inputs: the same bits whether it is computed alone, at any offset, or
 * inside a long row (a decode step must not depend on how the rows were
 * split between threads). test_quant.c covers the dot products and the
 * other float helpers.
 */
#include "quant_testutil.h"
#include "testutil.h"

#include "device/cpu/cpu_kernels.h"

#include <math.h>
#include <string.h>

enum { OPS_N = 300 };

static uint64_t ops_rng_state = 0x9e3779b97f4a7c15ull;

static void ops_inputs(float *gate, float *up)
{
    for (int i = 0; i < OPS_N; i++) {
        gate[i] = qtu_randf(&ops_rng_state) * 12.0f;
        up[i] = qtu_randf(&ops_rng_state) * 3.0f;
    }
    /* the edges of the exponent: silu(g) -> g for large g, -> -0 for very
     * negative g (e^-g overflows in the plain formula: the result is
     * still 0, not NaN) */
    static const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 20.0f, -20.0f, 88.0f, -88.0f,
                                  89.0f, -89.0f, 104.0f, -104.0f, 150.0f, -150.0f, 1e20f, -1e20f,
                                  0.5f, -0.5f, 1e-8f, -1e-8f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        gate[3 + 7 * i] = edges[i];
        up[3 + 7 * i] = i % 2 ? 1.0f : -2.5f;
    }
}

static double ops_swiglu_exact(float g, float up)
{
    return (double)g / (1.0 + exp(-(double)g)) * (double)up;
}

static void test_swiglu_levels(void **state)
{
    (void)state;
    float gate[OPS_N], up[OPS_N], out[OPS_N + 1];
    ops_inputs(gate, up);
    static const int64_t lens[] = {0, 1, 5, 15, 16, 17, 31, 32, 33, 100, 299, 300};
    int n_isa = qtu_n_isa();
    for (int isa = 0; isa < n_isa; isa++) {
        assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t n = lens[li];
            memcpy(out, gate, sizeof gate);
            out[OPS_N] = 12345.0f;
            cpu_swiglu_f32(out, up, n);
            for (int64_t i = 0; i < n; i++) {
                /* the plain f32 formula (the scalar level's, which the
                 * AVX2 level inherits): e^-g overflows below -88, giving
                 * -0 where the exact value is a tiny negative number */
                float plain = gate[i] / (1.0f + expf(-gate[i])) * up[i];
                if (memcmp(&out[i], &plain, sizeof plain) == 0)
                    continue;
                if (isa == CPU_ISA_SCALAR)
                    fail_msg("scalar swiglu(%g, %g) = %a, want %a", gate[i], up[i], out[i],
                             plain);
                double ref = ops_swiglu_exact(gate[i], up[i]);
                double tol = 4.0 * 0x1p-23 * fabs(ref) + 1e-37;
                if (!(fabs((double)out[i] - ref) <= tol))
                    fail_msg("%s swiglu(%g, %g) = %.9g, want %.9g", cpu_isa_name((cpu_isa)isa),
                             gate[i], up[i], out[i], ref);
            }
            /* nothing past n is written */
            for (int64_t i = n; i < OPS_N; i++)
                assert_true(memcmp(&out[i], &gate[i], sizeof(float)) == 0);
            assert_true(out[OPS_N] == 12345.0f);
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
}

/* Each element alone, and the row cut at every offset into two calls,
 * gives the bits of the whole-row call. */
static void test_swiglu_elementwise(void **state)
{
    (void)state;
    float gate[OPS_N], up[OPS_N], whole[OPS_N], part[OPS_N];
    ops_inputs(gate, up);
    int n_isa = qtu_n_isa();
    for (int isa = 0; isa < n_isa; isa++) {
        assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
        memcpy(whole, gate, sizeof gate);
        cpu_swiglu_f32(whole, up, OPS_N);
        for (int i = 0; i < OPS_N; i++) {
            float one = gate[i];
            cpu_swiglu_f32(&one, &up[i], 1);
            assert_true(memcmp(&one, &whole[i], sizeof one) == 0);
        }
        for (int cut = 1; cut < OPS_N; cut += 13) {
            memcpy(part, gate, sizeof gate);
            cpu_swiglu_f32(part, up, cut);
            cpu_swiglu_f32(part + cut, up + cut, OPS_N - cut);
            assert_memory_equal(part, whole, sizeof whole);
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
}

/* NaN in, NaN out (no level turns it into a number). */
static void test_swiglu_nan(void **state)
{
    (void)state;
    int n_isa = qtu_n_isa();
    for (int isa = 0; isa < n_isa; isa++) {
        assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
        float g[3] = {NAN, 1.0f, 2.0f}, u[3] = {1.0f, NAN, 0.0f};
        cpu_swiglu_f32(g, u, 3);
        assert_true(isnan(g[0]) && isnan(g[1]));
        assert_true(g[2] == 0.0f);
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swiglu_levels),
        cmocka_unit_test(test_swiglu_elementwise),
        cmocka_unit_test(test_swiglu_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
