// Moving N consecutive elements as one access: a single 4-, 8- or 16-byte
// load or store on the GPU when the caller guarantees alignment, element by
// element otherwise (and always under host emulation, where memcpy keeps the
// access well defined). Host emulation counts the accesses the GPU would make
// at a misaligned address (a cudaErrorMisalignedAddress there, which loses
// the CUDA context), so a launch plan that promises alignment it does not have
// fails on a CPU-only machine too.
#ifndef POSENC_KERNELS_CUDA_PACKET_H_
#define POSENC_KERNELS_CUDA_PACKET_H_

#include <cstdint>
#include <cstring>

#include "posenc/host_device.h"

namespace posenc::cuda {

template <typename T, int N>
struct alignas(N * sizeof(T) >= 16 ? 16 : N * sizeof(T)) Packet {
  T v[N];
};

namespace packet_internal {

// Whether the GPU moves the packet as one access (which must be aligned).
template <bool kAligned, typename T, int N>
inline constexpr bool kOneAccess = kAligned && (N * sizeof(T)) % 4 == 0 && N * sizeof(T) <= 16;

#ifndef __CUDA_ARCH__
// Host emulation only: one-access packets at an address the GPU would fault
// on. Tests reset and read it around an emulated launch.
inline thread_local int64_t misaligned_packets = 0;

template <bool kAligned, typename T, int N>
void CountMisaligned(const T* at) {
  if constexpr (kOneAccess<kAligned, T, N>) {
    if (reinterpret_cast<uintptr_t>(at) % alignof(Packet<T, N>) != 0) ++misaligned_packets;
  }
}
#endif

}  // namespace packet_internal

// REQUIRES (kAligned): src is aligned to N * sizeof(T) (at most 16).
template <bool kAligned, typename T, int N>
POSENC_HOST_DEVICE void LoadPacket(const T* src, T (&dst)[N]) {
#ifdef __CUDA_ARCH__
  if constexpr (packet_internal::kOneAccess<kAligned, T, N>) {
    *reinterpret_cast<Packet<T, N>*>(dst) = *reinterpret_cast<const Packet<T, N>*>(src);
    return;
  }
#else
  packet_internal::CountMisaligned<kAligned, T, N>(src);
#endif
  for (int i = 0; i < N; ++i) std::memcpy(&dst[i], src + i, sizeof(T));
}

template <bool kAligned, typename T, int N>
POSENC_HOST_DEVICE void StorePacket(const T (&src)[N], T* dst) {
#ifdef __CUDA_ARCH__
  if constexpr (packet_internal::kOneAccess<kAligned, T, N>) {
    *reinterpret_cast<Packet<T, N>*>(dst) = *reinterpret_cast<const Packet<T, N>*>(src);
    return;
  }
#else
  packet_internal::CountMisaligned<kAligned, T, N>(dst);
#endif
  for (int i = 0; i < N; ++i) std::memcpy(dst + i, &src[i], sizeof(T));
}

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_PACKET_H_
