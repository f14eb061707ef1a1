// The absolute-encoding kernel (y = x * x_scale + PE, or PE alone for a
// table) as a function of its launch coordinates, for the GPU
// (absolute_kernels.cu) and for host emulation in tests. A thread owns up to
// 16 bytes of consecutive channels of one token's row; several rows share a
// block.
#ifndef POSENC_KERNELS_CUDA_ABSOLUTE_BODY_H_
#define POSENC_KERNELS_CUDA_ABSOLUTE_BODY_H_

#include <algorithm>
#include <cstdint>

#include "kernel_params.h"
#include "math/absolute_math.h"
#include "math/phase.h"
#include "packet.h"

namespace posenc::cuda {

// Chooses the width and the grid (filling p's geometry fields). Host only.
inline LaunchShape PlanAbsoluteLaunch(AbsoluteParams* p) {
  LaunchShape shape;
  if (p->num_tokens == 0 || p->dim == 0) {
    shape.grid.x = 0;
    return shape;
  }
  p->width = WidestWidth(p->dtype, p->dim);
  p->vector = VectorWidth(p->dtype, p->width);
  const int width = p->width;
  const int64_t chunks = p->dim / width;
  p->threads_per_row = static_cast<int>(std::min<int64_t>(chunks, kThreadsPerBlock));
  p->rows_per_block = std::max(1, kThreadsPerBlock / p->threads_per_row);
  shape.grid.x = static_cast<unsigned>((p->num_tokens + p->rows_per_block - 1) / p->rows_per_block);
  shape.block.x = static_cast<unsigned>(p->threads_per_row * p->rows_per_block);
  return shape;
}

template <typename T, int kWidth, bool kVector>
POSENC_HOST_DEVICE void AbsoluteBody(const AbsoluteParams& p, Coord block, Coord thread) {
  const int64_t t = static_cast<int64_t>(block.x) * p.rows_per_block +
                    thread.x / static_cast<unsigned>(p.threads_per_row);
  if (t >= p.num_tokens) return;
  T* y = static_cast<T*>(p.x) + t * p.dim;
  const int64_t pos = p.positions[t];
  for (int64_t e0 =
           static_cast<int64_t>(thread.x % static_cast<unsigned>(p.threads_per_row)) * kWidth;
       e0 < p.dim; e0 += static_cast<int64_t>(p.threads_per_row) * kWidth) {
    T v[kWidth];
    if (p.has_input) LoadPacket<kVector>(y + e0, v);
    for (int j = 0; j < kWidth; ++j) {
      const int64_t e = e0 + j;
      float pe;
      double precise_pe;
      bool have_precise = false;
      internal::SinusoidalChannel ch{0, false, false};
      if (p.table != nullptr) {
        pe = p.table[pos * p.dim + e];
        precise_pe = pe;
        have_precise = true;
      } else {
        ch = internal::ChannelOf(p.interleaved, p.dim, e);
        if (ch.is_zero) {
          pe = 0.0f;
          precise_pe = 0.0;
          have_precise = true;
        } else {
          const SinusoidalTables& st = p.sinusoidal;
          float s, c;
          internal::SinusoidalSinCos(pos, st.phase_step[ch.frequency], st.offset_sin, st.offset_cos,
                                     st.frequencies, ch.frequency, &s, &c);
          pe = ch.is_sin ? s : c;
        }
      }
      auto precise = [&]() -> double {
        if (have_precise) return precise_pe;
        return internal::SinusoidalPrecise(pos, p.sinusoidal.omega[ch.frequency], ch.is_sin);
      };
      if (p.has_input) {
        internal::AddEncoding(
            &v[j], pe, p.x_scale,
            p.table != nullptr ? internal::PeRange::kAny : internal::PeRange::kSinusoidal, precise);
      } else {
        v[j] = internal::EncodingOnly<T>(pe, precise);
      }
    }
    StorePacket<kVector>(v, y + e0);
  }
}

// Calls visitor.template Run<T, kWidth, kVector>() for p's variant; false
// for a value outside the enums or the widths PlanAbsoluteLaunch chooses.
template <typename Visitor>
bool VisitAbsolute(const AbsoluteParams& p, Visitor& visitor) {
  return VisitByWidth(p.dtype, p.width, p.vector, visitor);
}

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_ABSOLUTE_BODY_H_
