/* test_cpu_ops.c - the element-wise CPU kernels the forward pass calls
 * between matrix products (cpu_swiglu_f32, cpu_geglu_f32), at every
 * instruction-set level this machine has.
 *
 * Expected values are computed here in double from the definition
 * (silu(g) = g / (1 + e^-g); gelu(g) = 0.5 g (1 + tanh z), z = sqrt(2/pi)
 * (g + 0.044715 g^3)); the scalar level must give exactly the f32 formula
 * with libm's expf or tanhf, a vectorised level either that or a value
 * within a few ulp of the double one (for GELU, a few more for each unit
 * of |2z|: the rounding of z itself moves e^-2z that much), and every
 * element's result must depend only on its own
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

typedef struct glu_op {
    const char *name;
    void (*run)(float *gate, const float *up, int64_t n);
    float (*plain)(float g, float up); /* the scalar level's f32 formula */
    double (*exact)(float g, float up);
    double (*ulps)(float g);           /* tolerance of a vector level */
} glu_op;

static float swiglu_plain(float g, float up) { return g / (1.0f + expf(-g)) * up; }
static double swiglu_exact(float g, float up) { return (double)g / (1.0 + exp(-(double)g)) * (double)up; }
static double swiglu_ulps(float g) { (void)g; return 4.0; }

static float geglu_plain(float g, float up)
{
    const float sqrt_2_over_pi = 0.79788456080286535588f;
    return 0.5f * g * (1.0f + tanhf(sqrt_2_over_pi * g * (1.0f + 0.044715f * g * g))) * up;
}
static double geglu_z2(float g)
{
    double d = g;
    return 2.0 * 0.79788456080286535588 * d * (1.0 + 0.044715 * d * d);
}
static double geglu_exact(float g, float up) { return (double)g / (1.0 + exp(-geglu_z2(g))) * (double)up; }
static double geglu_ulps(float g)
{
    double z2 = fabs(geglu_z2(g));
    return 8.0 + 4.0 * (isfinite(z2) ? z2 : 0.0);
}

static const glu_op glu_ops[] = {
    {"swiglu", cpu_swiglu_f32, swiglu_plain, swiglu_exact, swiglu_ulps},
    {"geglu", cpu_geglu_f32, geglu_plain, geglu_exact, geglu_ulps},
};
enum { N_GLU_OPS = sizeof glu_ops / sizeof glu_ops[0] };

static void test_glu_levels(void **state)
{
    (void)state;
    float gate[OPS_N], up[OPS_N], out[OPS_N + 1];
    ops_inputs(gate, up);
    static const int64_t lens[] = {0, 1, 5, 15, 16, 17, 31, 32, 33, 100, 299, 300};
    int n_isa = qtu_n_isa();
    for (int o = 0; o < N_GLU_OPS; o++) {
        const glu_op *op = &glu_ops[o];
        for (int isa = 0; isa < n_isa; isa++) {
            assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                const int64_t n = lens[li];
                memcpy(out, gate, sizeof gate);
                out[OPS_N] = 12345.0f;
                op->run(out, up, n);
                for (int64_t i = 0; i < n; i++) {
                    /* the plain f32 formula (the scalar level's, which the
                     * AVX2 level inherits): for SwiGLU e^-g overflows below
                     * -88, giving -0 where the exact value is a tiny
                     * negative number */
                    float plain = op->plain(gate[i], up[i]);
                    if (memcmp(&out[i], &plain, sizeof plain) == 0)
                        continue;
                    if (isa == CPU_ISA_SCALAR)
                        fail_msg("scalar %s(%g, %g) = %a, want %a", op->name, gate[i], up[i],
                                 out[i], plain);
                    double ref = op->exact(gate[i], up[i]);
                    double tol = op->ulps(gate[i]) * 0x1p-23 * fabs(ref) + 1e-37;
                    if (!(fabs((double)out[i] - ref) <= tol))
                        fail_msg("%s %s(%g, %g) = %.9g, want %.9g", cpu_isa_name((cpu_isa)isa),
                                 op->name, gate[i], up[i], out[i], ref);
                }
                /* nothing past n is written */
                for (int64_t i = n; i < OPS_N; i++)
                    assert_true(memcmp(&out[i], &gate[i], sizeof(float)) == 0);
                assert_true(out[OPS_N] == 12345.0f);
            }
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
}

/* Each element alone, and the row cut at every offset into two calls,
 * gives the bits of the whole-row call. */
static void test_glu_elementwise(void **state)
{
    (void)state;
    float gate[OPS_N], up[OPS_N], whole[OPS_N], part[OPS_N];
    ops_inputs(gate, up);
    int n_isa = qtu_n_isa();
    for (int o = 0; o < N_GLU_OPS; o++) {
        const glu_op *op = &glu_ops[o];
        for (int isa = 0; isa < n_isa; isa++) {
            assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
            memcpy(whole, gate, sizeof gate);
            op->run(whole, up, OPS_N);
            for (int i = 0; i < OPS_N; i++) {
                float one = gate[i];
                op->run(&one, &up[i], 1);
                assert_true(memcmp(&one, &whole[i], sizeof one) == 0);
            }
            for (int cut = 1; cut < OPS_N; cut += 13) {
                memcpy(part, gate, sizeof gate);
                op->run(part, up, cut);
                op->run(part + cut, up + cut, OPS_N - cut);
                assert_memory_equal(part, whole, sizeof whole);
            }
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
}

/* NaN in, NaN out (no level turns it into a number). */
static void test_glu_nan(void **state)
{
    (void)state;
    int n_isa = qtu_n_isa();
    for (int o = 0; o < N_GLU_OPS; o++) {
        for (int isa = 0; isa < n_isa; isa++) {
            assert_int_equal(cpu_kernels_force_isa((cpu_isa)isa), isa);
            float g[3] = {NAN, 1.0f, 2.0f}, u[3] = {1.0f, NAN, 0.0f};
            glu_ops[o].run(g, u, 3);
            assert_true(isnan(g[0]) && isnan(g[1]));
            assert_true(g[2] == 0.0f);
        }
    }
    cpu_kernels_force_isa(CPU_ISA_AMX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_glu_levels),
        cmocka_unit_test(test_glu_elementwise),
        cmocka_unit_test(test_glu_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
