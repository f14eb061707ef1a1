// Moving N consecutive elements as one access: a single 4-, 8- or 16-byte
// load or store on the GPU when the caller guarantees alignment, element by
// element otherwise (and always under host emulation, where memcpy keeps the
// access well defined).
#ifndef POSENC_KERNELS_CUDA_PACKET_H_
#define POSENC_KERNELS_CUDA_PACKET_H_

#include <cstring>

#include "posenc/host_device.h"

namespace posenc::cuda {

template <typename T, int N>
struct alignas(N * sizeof(T) >= 16 ? 16 : N * sizeof(T)) Packet {
  T v[N];
};

// REQUIRES (kAligned): src is aligned to N * sizeof(T) (at most 16).
template <bool kAligned, typename T, int N>
POSENC_HOST_DEVICE void LoadPacket(const T* src, T (&dst)[N]) {
#ifdef __CUDA_ARCH__
  if constexpr (kAligned && (N * sizeof(T)) % 4 == 0 && N * sizeof(T) <= 16) {
    *reinterpret_cast<Packet<T, N>*>(dst) = *reinterpret_cast<const Packet<T, N>*>(src);
    return;
  }
#endif
  for (int i = 0; i < N; ++i) std::memcpy(&dst[i], src + i, sizeof(T));
}

template <bool kAligned, typename T, int N>
POSENC_HOST_DEVICE void StorePacket(const T (&src)[N], T* dst) {
#ifdef __CUDA_ARCH__
  if constexpr (kAligned && (N * sizeof(T)) % 4 == 0 && N * sizeof(T) <= 16) {
    *reinterpret_cast<Packet<T, N>*>(dst) = *reinterpret_cast<const Packet<T, N>*>(src);
    return;
  }
#endif
  for (int i = 0; i < N; ++i) std::memcpy(dst + i, &src[i], sizeof(T));
}

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_PACKET_H_
