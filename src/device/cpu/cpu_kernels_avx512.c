/* cpu_kernels_avx512.c - placeholder: the avx512 level inherits the scalar kernels
 * until its SIMD versions land. */
#include "device/cpu/cpu_kernels_impl.h"

void cpu__kernels_avx512_init(cpu__kernel_table *table)
{
    (void)table;
}
