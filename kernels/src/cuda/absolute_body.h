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

// Consecutive tokens a thread takes when the grid stays large enough: a
// sinusoidal row's anchor sin/cos (SinCosOfPosition, most of an element's
// instructions) is then formed once for up to kAbsoluteTokensPerThread
// tokens that share an anchor, as the CPU forms it once per 16. An H200
// ran the bf16 sinusoidal add at 0.40x of a copy with one token a thread,
// its issue slots 73% busy (0.48x with four). kAbsoluteThreadsWanted: the
// threads a launch keeps at least (an H100 or H200 holds about 270 000
// resident threads).
inline constexpr int kAbsoluteTokensPerThread = 4;
inline constexpr int64_t kAbsoluteThreadsWanted = int64_t{1} << 18;

// Chooses the width and the grid (filling p's geometry fields). Host only.
inline LaunchShape PlanAbsoluteLaunch(AbsoluteParams* p) {
  LaunchShape shape;
  if (p->num_tokens == 0 || p->dim == 0) {
    shape.grid.x = 0;
    return shape;
  }
  // The learned table's rows are read at the width too (its own device
  // buffer, aligned as every allocation is).
  p->width = WidestWidth(p->dtype, p->dim, AddressAlignment({p->x}));
  p->vector = VectorWidth(p->dtype, p->width);
  const int width = p->width;
  const int64_t chunks = p->dim / width;
  p->threads_per_row = static_cast<int>(std::min<int64_t>(chunks, kThreadsPerBlock));
  p->rows_per_block = std::max(1, kThreadsPerBlock / p->threads_per_row);
  const int64_t groups = (p->num_tokens + kAbsoluteTokensPerThread - 1) / kAbsoluteTokensPerThread;
  // 16-bit rows only: on the H200 (2026-11-28, posenc-bench-gpu against
  // d5a82dc's in the same call) bf16 [16384, 4096] went from 0.41 to 0.48 of
  // a copy, while float32, already near memory speed, fell from 0.89 to 0.78.
  p->tokens_per_thread = p->table == nullptr && p->dtype != DType::kFloat32 &&
                                 groups * p->threads_per_row >= kAbsoluteThreadsWanted
                             ? kAbsoluteTokensPerThread
                             : 1;
  const int64_t tokens_per_block = static_cast<int64_t>(p->rows_per_block) * p->tokens_per_thread;
  shape.grid.x = static_cast<unsigned>((p->num_tokens + tokens_per_block - 1) / tokens_per_block);
  shape.block.x = static_cast<unsigned>(p->threads_per_row * p->rows_per_block);
  return shape;
}

template <typename T, int kWidth, bool kVector>
POSENC_HOST_DEVICE void AbsoluteBody(const AbsoluteParams& p, Coord block, Coord thread) {
  const int64_t t_begin = (static_cast<int64_t>(block.x) * p.rows_per_block +
                           thread.x / static_cast<unsigned>(p.threads_per_row)) *
                          p.tokens_per_thread;
  if (t_begin >= p.num_tokens) return;
  const int64_t t_end =
      t_begin + p.tokens_per_thread < p.num_tokens ? t_begin + p.tokens_per_thread : p.num_tokens;
  const SinusoidalTables& st = p.sinusoidal;
  for (int64_t e0 =
           static_cast<int64_t>(thread.x % static_cast<unsigned>(p.threads_per_row)) * kWidth;
       e0 < p.dim; e0 += static_cast<int64_t>(p.threads_per_row) * kWidth) {
    // sin/cos at the anchor of the last token, slot j for channel j's
    // frequency (an interleaved pair's in its even channel's slot); anchors
    // are multiples of 16, so 1 matches none.
    float anchor_sin[kWidth], anchor_cos[kWidth];
    int64_t cached_anchor = 1;
    for (int64_t t = t_begin; t < t_end; ++t) {
      T* y = static_cast<T*>(p.x) + t * p.dim;
      const int64_t pos = p.positions[t];
      const int64_t anchor = internal::PhaseAnchor(pos);
      const bool fresh = anchor != cached_anchor;
      cached_anchor = anchor;
      T v[kWidth];
      if (p.has_input) LoadPacket<kVector>(y + e0, v);
      // Element j gets PE value pe; `precise()` gives it in double.
      auto apply = [&](int j, float pe, auto precise) {
        if (p.has_input) {
          internal::AddEncoding(
              &v[j], pe, p.x_scale,
              p.table != nullptr ? internal::PeRange::kAny : internal::PeRange::kSinusoidal,
              precise);
        } else {
          v[j] = internal::EncodingOnly<T>(pe, precise);
        }
      };
      // sin/cos of pos for frequency i, its anchor's half kept in slot j.
      auto sin_cos = [&](int j, int64_t i, float* s, float* c) {
        if (fresh) {
          internal::SinCosOfPosition(anchor, st.phase_step[i], &anchor_sin[j], &anchor_cos[j]);
        }
        internal::SinusoidalFromAnchor(pos, anchor, anchor_sin[j], anchor_cos[j], st.offset_sin,
                                       st.offset_cos, st.frequencies, i, s, c);
      };
      if (p.table != nullptr) {
        POSENC_UNROLL
        for (int j = 0; j < kWidth; ++j) {
          const float pe = p.table[pos * p.dim + e0 + j];
          apply(j, pe, [pe] { return static_cast<double>(pe); });
        }
      } else if (p.interleaved && kWidth % 2 == 0) {
        // Interleaved rows hold a frequency's sin and cos side by side, and
        // e0 is even: one evaluation serves both channels.
        POSENC_UNROLL
        for (int j = 0; j < kWidth; j += 2) {
          const int64_t i = (e0 + j) / 2;
          float s, c;
          sin_cos(j, i, &s, &c);
          const double omega = st.omega[i];
          apply(j, s, [&] { return internal::SinusoidalPrecise(pos, omega, true); });
          apply(j + 1, c, [&] { return internal::SinusoidalPrecise(pos, omega, false); });
        }
      } else {
        POSENC_UNROLL
        for (int j = 0; j < kWidth; ++j) {
          const internal::SinusoidalChannel ch = internal::ChannelOf(p.interleaved, p.dim, e0 + j);
          if (ch.is_zero) {
            apply(j, 0.0f, [] { return 0.0; });
            continue;
          }
          float s, c;
          sin_cos(j, ch.frequency, &s, &c);
          apply(j, ch.is_sin ? s : c, [&] {
            return internal::SinusoidalPrecise(pos, st.omega[ch.frequency], ch.is_sin);
          });
        }
      }
      StorePacket<kVector>(v, y + e0);
    }
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
