// The attention-bias kernel as a function of its launch coordinates, for the
// GPU (bias_kernels.cu) and for host emulation in tests. A thread owns up to
// 16 bytes of consecutive keys of one row (batch, head, query); rows are
// spread over the grid, which strides over them if they outnumber it.
#ifndef POSENC_KERNELS_CUDA_BIAS_BODY_H_
#define POSENC_KERNELS_CUDA_BIAS_BODY_H_

#include <algorithm>
#include <cstdint>

#include "kernel_params.h"
#include "math/bias_math.h"
#include "packet.h"

namespace posenc::cuda {

inline constexpr int64_t kMaxGridX = int64_t{1} << 30;
// Packets of a row a thread aims to write, and the threads a launch keeps
// at least (an H100 or H200 holds about 270 000 resident threads).
inline constexpr int64_t kBiasPacketsPerThread = 4;
inline constexpr int64_t kBiasThreadsWanted = int64_t{1} << 18;

// Chooses the width and the grid (filling p's geometry fields). Host only.
inline LaunchShape PlanBiasLaunch(BiasParams* p) {
  LaunchShape shape;
  const int64_t rows = p->row_count;
  if (rows <= 0 || p->k_len == 0) {
    shape.grid.x = 0;
    return shape;
  }
  p->width = WidestWidth(p->dtype, p->k_len, AddressAlignment({p->out}));
  p->vector = VectorWidth(p->dtype, p->width);
  const int width = p->width;
  const int64_t chunks = p->k_len / width;
  // A thread plans its row once (its coordinates, masks and slope) and then
  // spends a few instructions per element: with one packet of a row per
  // thread, the plan was most of its work (an H200 ran ALiBi + causal on
  // [1, 32, 2048, 2048] bf16 logits at 0.41x of a copy, issue slots 77%
  // busy). So threads take up to kBiasPacketsPerThread packets of their row,
  // fewer threads to a row, while the grid keeps kBiasThreadsWanted threads.
  int64_t per_row = std::min<int64_t>(chunks, kThreadsPerBlock);
  while (per_row > 32 && per_row * kBiasPacketsPerThread > chunks &&
         rows * (per_row / 2) >= kBiasThreadsWanted) {
    per_row /= 2;
  }
  p->threads_per_row = static_cast<int>(per_row);
  p->rows_per_block = std::max(1, kThreadsPerBlock / p->threads_per_row);
  shape.grid.x = static_cast<unsigned>(
      std::min<int64_t>((rows + p->rows_per_block - 1) / p->rows_per_block, kMaxGridX));
  shape.block.x = static_cast<unsigned>(p->threads_per_row * p->rows_per_block);
  return shape;
}

template <typename T, int kWidth, bool kVector>
POSENC_HOST_DEVICE void BiasBody(const BiasParams& p, Coord block, Coord thread, Coord grid) {
  const internal::BiasShape shape{p.form, p.causal, p.window};
  for (int64_t row = static_cast<int64_t>(block.x) * p.rows_per_block +
                     thread.x / static_cast<unsigned>(p.threads_per_row);
       row < p.row_count; row += static_cast<int64_t>(grid.x) * p.rows_per_block) {
    const internal::BiasRow where = internal::BiasRowOf(p.row_begin + row, p.heads, p.q_len);
    // The row's masks and arithmetic once; then each element is one range
    // test and one formula, the CPU kernel's (math/bias_math.h).
    const internal::BiasRowPlan r =
        internal::PlanBiasRow(shape, p.slopes[where.h], p.q_offset + where.i,
                              internal::KeyRange{p.k_starts[where.b], p.k_lens[where.b]});
    T* y = static_cast<T*>(p.out) + row * p.k_len;
    for (int64_t j0 =
             static_cast<int64_t>(thread.x % static_cast<unsigned>(p.threads_per_row)) * kWidth;
         j0 < p.k_len; j0 += static_cast<int64_t>(p.threads_per_row) * kWidth) {
      T v[kWidth];
      if (p.add_to_logits) LoadPacket<kVector>(y + j0, v);
      for (int j = 0; j < kWidth; ++j) {
        v[j] = FromFloat<T>(internal::BiasElement(
            r, p.form, j0 + j, p.add_to_logits ? ToFloat(v[j]) : 0.0f, p.add_to_logits));
      }
      StorePacket<kVector>(v, y + j0);
    }
  }
}

// Calls visitor.template Run<T, kWidth, kVector>() for p's variant; false
// for a value outside the enums or the widths PlanBiasLaunch chooses.
template <typename Visitor>
bool VisitBias(const BiasParams& p, Visitor& visitor) {
  return KnownForm(p.form) && VisitByWidth(p.dtype, p.width, p.vector, visitor);
}

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_BIAS_BODY_H_
