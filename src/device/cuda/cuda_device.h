/* cuda_device.h - the cuda:N device's own functions beyond device.h:
 * copies back to the host, the GPU count, and what the CUDA files share.
 * Memory and kernels only; the forward pass that runs on it is the
 * engine's (engine/forward_cuda.h).
 */
#ifndef SPILLWAY_DEVICE_CUDA_CUDA_DEVICE_H
#define SPILLWAY_DEVICE_CUDA_CUDA_DEVICE_H

#include "common/error.h"

#include <stddef.h>

struct dev_device;

#ifdef SPILLWAY_CUDA

/* Copies device memory back to the host (tests, and the engine's own
 * downloads). */
int cuda_download(struct dev_device *dev, void *dst, const void *src, size_t bytes,
                  sw_error *err);
/* GPUs the runtime sees (0 without a driver or GPU). */
int cuda_visible_devices(void);

/* For the CUDA code (here and engine/forward_cuda.c). A cudaError_t
 * value as a status:
 * cudaErrorMemoryAllocation is SW_EDEVOOM (and cleared), anything else
 * SW_EDEVICE with the runtime's message. */
int cuda_status(int cuda_error, const char *spec, const char *what, sw_error *err);
/* Makes the handle's GPU current for the calling thread. */
int cuda_select(const struct dev_device *dev, sw_error *err);

#else /* !SPILLWAY_CUDA */

static inline int cuda_visible_devices(void) { return 0; }

#endif

#endif
