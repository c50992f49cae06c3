/* cuda_device.c - the cuda:N device: VRAM through the CUDA runtime.
 *
 * Allocations are plain cudaMalloc (no managed memory, no pool of our own),
 * so what the driver reports with cudaMemGetInfo is what every process on
 * the GPU holds, this one included. Two kinds of failure are kept apart:
 *   - cudaErrorMemoryAllocation is not sticky: the CUDA context stays
 *     usable, so it is SW_EDEVOOM with the bytes asked, used and total, and
 *     the caller can fall back (the router replays on another worker);
 *   - any other error (an illegal address, a lost device, an ECC error) may
 *     have poisoned the context for good: SW_EDEVICE, which the worker turns
 *     into "failed" and its distinct exit status so it is restarted.
 *
 * The runtime keeps "the current GPU" per host thread, and the worker
 * allocates and computes from a different thread than the one that opened
 * the device, so every entry point selects the handle's GPU first.
 */
#include "device/cuda/cuda_device.h"

#include "common/alloc.h"
#include "common/log.h"
#include "device/device-impl.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cuda_impl {
    int index;          /* N of cuda:N */
    char name[256];     /* the GPU's name, for logs */
} cuda_impl;

int cuda_status(int cuda_error, const char *spec, const char *what, sw_error *err)
{
    cudaError_t e = (cudaError_t)cuda_error;
    if (e == cudaSuccess)
        return SW_OK;
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* not sticky: clear it so later calls do not see it */
        return sw_error_set(err, SW_EDEVOOM, "%s out of memory: %s", spec, what);
    }
    return sw_error_set(err, SW_EDEVICE, "%s failed (%s): %s (%s)", spec, what,
                        cudaGetErrorString(e), cudaGetErrorName(e));
}

int cuda_select(const dev_device *dev, sw_error *err)
{
    const cuda_impl *impl = dev->impl;
    return cuda_status(cudaSetDevice(impl->index), dev->spec, "selecting the GPU", err);
}


static int cuda_open(dev_device *dev, const char *argument, const dev_options *opts,
                     sw_error *err)
{
    struct cudaDeviceProp prop;
    cuda_impl *impl;
    char *end = NULL;
    long parsed = argument ? strtol(argument, &end, 10) : -1;
    int count = 0, index;
    cudaError_t e;

    /* "cuda:1x" or "cuda:-1" would otherwise be read as some GPU. */
    if (!argument || !*argument || *end || parsed < 0 || parsed > 1024)
        return sw_error_set(err, SW_EINVAL, "%s: the GPU index must be a number (cuda:0, "
                            "cuda:1, ...)", dev->spec);
    index = (int)parsed;
    e = cudaGetDeviceCount(&count);

    /* Any failure to count (no device, no or an old driver, a container
     * without the device files: the error varies) means no GPU this
     * process can use: SW_ENOTFOUND, as cuda_visible_devices says 0, not
     * SW_EDEVICE, which would have a worker restarted over and over. */
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return sw_error_set(err, SW_ENOTFOUND, "%s: no CUDA GPU is visible (%s)", dev->spec,
                            e == cudaSuccess ? "none found" : cudaGetErrorString(e));
    }
    if (index >= count)
        return sw_error_set(err, SW_ENOTFOUND, "%s: no such GPU (%d visible: cuda:0..cuda:%d)",
                            dev->spec, count, count - 1);
    if ((e = cudaGetDeviceProperties(&prop, index)) != cudaSuccess)
        return cuda_status(e, dev->spec, "reading the GPU's properties", err);
    impl = sw_calloc(1, sizeof *impl);
    if (!impl)
        return sw_error_set(err, SW_ENOMEM, "out of host memory opening %s", dev->spec);
    impl->index = index;
    snprintf(impl->name, sizeof impl->name, "%s", prop.name);
    dev->impl = impl;
    SW_DEBUG("device", "%s: %s, compute capability %d.%d, %zu bytes", dev->spec, impl->name,
             prop.major, prop.minor, (size_t)prop.totalGlobalMem);
    return SW_OK;
}

static void cuda_close(dev_device *dev)
{
    sw_free(dev->impl);
    dev->impl = NULL;
}

static int cuda_alloc(dev_device *dev, size_t bytes, void **out, sw_error *err)
{
    char asked[DEV_BYTES_STR_MAX], used[DEV_BYTES_STR_MAX], total[DEV_BYTES_STR_MAX];
    size_t free_b = 0, total_b = 0;
    void *ptr = NULL;
    cudaError_t e;
    int rc;

    if ((rc = cuda_select(dev, err)))
        return rc;
    /* cudaMalloc(0) gives NULL; the interface promises a valid pointer. */
    e = cudaMalloc(&ptr, bytes ? bytes : 1);
    if (e == cudaSuccess) {
        *out = ptr;
        return SW_OK;
    }
    if (e != cudaErrorMemoryAllocation)
        return cuda_status(e, dev->spec, "cudaMalloc", err);
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    return sw_error_set(err, SW_EDEVOOM, "%s out of memory: asked %s, %s used of %s", dev->spec,
                        dev__bytes_str(bytes, asked, sizeof asked),
                        dev__bytes_str(total_b - free_b, used, sizeof used),
                        dev__bytes_str(total_b, total, sizeof total));
}

static void cuda_free(dev_device *dev, void *ptr, size_t bytes)
{
    if (cuda_select(dev, NULL) != SW_OK)
        return;
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess)
        SW_ERROR("device", "%s: cudaFree failed: %s", dev->spec, cudaGetErrorString(e));
}

static int cuda_memory_info(dev_device *dev, dev_memory *out, sw_error *err)
{
    size_t free_b = 0, total_b = 0;
    int rc;
    if ((rc = cuda_select(dev, err)) ||
        (rc = cuda_status(cudaMemGetInfo(&free_b, &total_b), dev->spec, "cudaMemGetInfo", err)))
        return rc;
    out->total_bytes = total_b;
    out->free_bytes = free_b;
    out->used_bytes = total_b - free_b;
    out->self_bytes = atomic_load(&dev->self_bytes);
    return SW_OK;
}

static int cuda_upload(dev_device *dev, void *dst, const void *src, size_t bytes, sw_error *err)
{
    int rc;
    if ((rc = cuda_select(dev, err)))
        return rc;
    return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), dev->spec,
                        "copying to the GPU", err);
}

int cuda_download(dev_device *dev, void *dst, const void *src, size_t bytes, sw_error *err)
{
    int rc;
    if (bytes == 0)
        return SW_OK;
    if ((rc = cuda_select(dev, err)))
        return rc;
    return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), dev->spec,
                        "copying from the GPU", err);
}

int cuda_visible_devices(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

const dev_backend dev__cuda_backend = {
    .kind = DEV_KIND_CUDA,
    .name = "cuda",
    .takes_argument = true,
    .simulated = false,
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .memory_info = cuda_memory_info,
    .upload = cuda_upload,
};
