/* cpu_kernels_avx2.c - placeholder: the avx2 level inherits the scalar kernels
 * until its SIMD versions land. */
#include "device/cpu/cpu_kernels_impl.h"

void cpu__kernels_avx2_init(cpu__kernel_table *table)
{
    (void)table;
}
