// Marks functions compiled for both the host and the GPU: the one definition
// of each per-element formula that the CPU and CUDA kernels share.
#ifndef POSENC_HOST_DEVICE_H_
#define POSENC_HOST_DEVICE_H_

#ifdef __CUDACC__
#define POSENC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define POSENC_HOST_DEVICE inline __attribute__((always_inline))
#endif

#endif  // POSENC_HOST_DEVICE_H_
