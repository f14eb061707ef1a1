// Marks functions compiled for both the host and the GPU: the one definition
// of each per-element formula that the CPU and CUDA kernels share.
#ifndef POSENC_HOST_DEVICE_H_
#define POSENC_HOST_DEVICE_H_

#ifdef __CUDACC__
#define POSENC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define POSENC_HOST_DEVICE inline __attribute__((always_inline))
#endif

// Unrolls the next loop, whose bound is a constant, fully on the GPU: an
// array indexed by its counter then lives in registers. Left rolled, the
// GPU compiler puts such an array in local memory and reaches it through a
// computed address (seen in the GPT-J RoPE kernel, 2026-11-27).
#ifdef __CUDA_ARCH__
#define POSENC_UNROLL _Pragma("unroll")
#else
#define POSENC_UNROLL
#endif

#endif  // POSENC_HOST_DEVICE_H_
