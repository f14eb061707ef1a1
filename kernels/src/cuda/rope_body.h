// The RoPE kernel as a function of its launch coordinates, compiled for the
// GPU (rope_kernels.cu wraps it in a __global__) and for the host (tests
// call it for every block and thread of the grid on host memory).
//
// Shape (after FlashInfer's and vLLM's fastest kernels, written for posenc):
// several tokens per block; each thread owns a slice of up to 16 bytes of a
// token's rotary dims, computes that slice's cos/sin once into registers (no
// shared memory, no barrier) and rotates the slice in every head of its head
// group, query heads then key heads. Decode steps (few tokens) split the
// heads over blockIdx.y so one token spreads over many SMs. Integer
// divisions happen once per thread, not per head.
#ifndef POSENC_KERNELS_CUDA_ROPE_BODY_H_
#define POSENC_KERNELS_CUDA_ROPE_BODY_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernel_params.h"
#include "math/rope_math.h"
#include "packet.h"

namespace posenc::cuda {

// Chooses the slice width and the grid for p (filling its geometry fields).
// `sm_count` sizes the head split of small launches. Host only.
inline LaunchShape PlanRopeLaunch(RopeParams* p, int sm_count) {
  LaunchShape shape;
  const int half = p->rotary_dim / 2;
  if (p->num_tokens == 0 || half == 0) {
    shape.grid.x = 0;
    return shape;
  }
  const int es = p->dtype == DType::kFloat32 ? 4 : 2;
  // The widest slice (at most 16 bytes of one access) whose accesses stay
  // aligned in every head: it must divide the half (or rotary dims) and the
  // head size, and be no wider than the tensors' addresses allow
  // (AddressAlignment). Head dims like 120 and rotary dims like 24 keep 8
  // bytes.
  // When none does (GPT-J pairs in an odd head size: every other head
  // starts at an odd element), slices are single pairs moved element by
  // element.
  const int alignment = AddressAlignment({p->query, p->key});
  int pairs = 1;
  bool aligned = false;
  for (int cand = 8; cand >= 1; cand /= 2) {
    const int elems = p->style == RopeStyle::kNeox ? cand : 2 * cand;
    if (elems * es <= 16 && elems * es <= alignment && half % cand == 0 &&
        p->head_dim % elems == 0) {
      pairs = cand;
      aligned = true;
      break;
    }
  }
  p->pairs_per_slice = pairs;
  const int elems = p->style == RopeStyle::kNeox ? pairs : 2 * pairs;
  p->vector = aligned && elems > 1 && (elems * es) % 4 == 0;
  const int slices = half / pairs;
  p->threads_per_token = std::min(slices, kThreadsPerBlock);
  p->tokens_per_block = std::max(1, kThreadsPerBlock / p->threads_per_token);
  const int64_t token_blocks = (p->num_tokens + p->tokens_per_block - 1) / p->tokens_per_block;
  const int heads = p->query_heads + (p->key != nullptr ? p->key_heads : 0);
  int groups = 1;
  const int64_t want = static_cast<int64_t>(kBlocksPerSm) * std::max(sm_count, 1);
  if (token_blocks < want) {
    groups = static_cast<int>(std::min<int64_t>(heads, (want + token_blocks - 1) / token_blocks));
  }
  p->heads_per_group = (heads + groups - 1) / std::max(groups, 1);
  shape.grid.x = static_cast<unsigned>(token_blocks);
  shape.grid.y = static_cast<unsigned>((heads + p->heads_per_group - 1) / p->heads_per_group);
  shape.block.x = static_cast<unsigned>(p->threads_per_token * p->tokens_per_block);
  return shape;
}

template <typename T, RopeStyle kStyle, int kPairs, bool kVector>
POSENC_HOST_DEVICE void RopeBody(const RopeParams& p, Coord block, Coord thread) {
  constexpr int kElems = kStyle == RopeStyle::kNeox ? kPairs : 2 * kPairs;
  const int64_t t = static_cast<int64_t>(block.x) * p.tokens_per_block +
                    thread.x / static_cast<unsigned>(p.threads_per_token);
  if (t >= p.num_tokens) return;
  const int heads = p.query_heads + (p.key != nullptr ? p.key_heads : 0);
  const int h_begin = static_cast<int>(block.y) * p.heads_per_group;
  const int h_end = h_begin + p.heads_per_group < heads ? h_begin + p.heads_per_group : heads;
  const int half = p.rotary_dim / 2;
  const int slices = half / kPairs;

  // Per token, once: its frequency set, positions and where its heads are.
  const int set = p.token_freq_set != nullptr ? p.token_freq_set[t] : 0;
  const double* f = p.inv_freq + static_cast<int64_t>(set) * half;
  const double scale = p.attention_scale[set];
  const int64_t* pos = p.positions + t * p.num_axes;
  const internal::HeadSpan q_span =
      internal::HeadsOfToken(p.layout, t, p.seq_len, p.query_heads, p.head_dim);
  const internal::HeadSpan k_span =
      internal::HeadsOfToken(p.layout, t, p.seq_len, p.key_heads, p.head_dim);

  for (int slice = static_cast<int>(thread.x % static_cast<unsigned>(p.threads_per_token));
       slice < slices; slice += p.threads_per_token) {
    const int k0 = slice * kPairs;
    // The angle is formed again for a flagged pair rather than kept: eight
    // doubles per thread would cost the occupancy that hides memory latency.
    auto angle = [&](int j) {
      const int k = k0 + j;
      return static_cast<double>(pos[p.num_axes == 1 ? 0 : p.slot_axis[k]]) * f[k];
    };
    internal::SlotRotation rot[kPairs];
    POSENC_UNROLL
    for (int j = 0; j < kPairs; ++j) rot[j] = internal::RotationOf(angle(j), scale, p.inverse);
    // Slice start, in elements from the head's start; NEOX's second halves
    // sit `half` further on.
    const int64_t first = kStyle == RopeStyle::kNeox ? k0 : 2 * k0;
    auto head_at = [&](int h) -> T* {
      return h < p.query_heads
                 ? static_cast<T*>(p.query) + q_span.first + h * q_span.stride
                 : static_cast<T*>(p.key) + k_span.first + (h - p.query_heads) * k_span.stride;
    };
    // GPT-J heads go two at a time, both loaded before either is stored: the
    // compiler cannot move a load above a store through a pointer that may
    // alias, so this is what keeps two 16-byte loads in flight, as NEOX's
    // two halves do for one head. (Two NEOX heads measured slower on an H100:
    // twice the registers halved the occupancy.)
    constexpr int kHeadsPerStep = kStyle == RopeStyle::kNeox ? 1 : 2;
    auto rotate_heads = [&](auto heads_tag, int h) {
      constexpr int kHeads = decltype(heads_tag)::value;
      T* at[kHeads];
      POSENC_UNROLL
      for (int i = 0; i < kHeads; ++i) at[i] = head_at(h + i);
      if constexpr (kStyle == RopeStyle::kNeox) {
        T xs[kHeads][kElems], ys[kHeads][kElems];
        POSENC_UNROLL
        for (int i = 0; i < kHeads; ++i) {
          LoadPacket<kVector>(at[i] + first, xs[i]);
          LoadPacket<kVector>(at[i] + first + half, ys[i]);
        }
        POSENC_UNROLL
        for (int i = 0; i < kHeads; ++i) {
          POSENC_UNROLL
          for (int j = 0; j < kPairs; ++j) {
            internal::RotatePair(
                &xs[i][j], &ys[i][j], rot[j], [&] { return angle(j); }, scale, p.inverse);
          }
          StorePacket<kVector>(xs[i], at[i] + first);
          StorePacket<kVector>(ys[i], at[i] + first + half);
        }
      } else {
        T v[kHeads][kElems];
        POSENC_UNROLL
        for (int i = 0; i < kHeads; ++i) LoadPacket<kVector>(at[i] + first, v[i]);
        POSENC_UNROLL
        for (int i = 0; i < kHeads; ++i) {
          POSENC_UNROLL
          for (int j = 0; j < kPairs; ++j) {
            internal::RotatePair(
                &v[i][2 * j], &v[i][2 * j + 1], rot[j], [&] { return angle(j); }, scale, p.inverse);
          }
          StorePacket<kVector>(v[i], at[i] + first);
        }
      }
    };
    int h = h_begin;
    for (; h + kHeadsPerStep <= h_end; h += kHeadsPerStep) {
      rotate_heads(std::integral_constant<int, kHeadsPerStep>(), h);
    }
    if (h < h_end) rotate_heads(std::integral_constant<int, 1>(), h);
  }
}

// Calls visitor.template Run<T, kStyle, kPairs, kVector>() for p's variant;
// false (and nothing run) for a value outside the enums or the widths
// PlanRopeLaunch chooses.
template <typename Visitor>
bool VisitRope(const RopeParams& p, Visitor& visitor) {
  auto by_pairs = [&](auto type_tag, auto style_tag) -> bool {
    using T = typename decltype(type_tag)::type;
    constexpr RopeStyle kStyle = decltype(style_tag)::value;
    constexpr int kMaxElems = 16 / sizeof(T);
    switch (p.pairs_per_slice) {
      case 1:
        if (p.vector) {
          if constexpr (kStyle == RopeStyle::kGptj) {
            visitor.template Run<T, kStyle, 1, true>();
            return true;
          }
          return false;
        }
        visitor.template Run<T, kStyle, 1, false>();
        return true;
      case 2:
        if (!p.vector) return false;
        visitor.template Run<T, kStyle, 2, true>();
        return true;
      case 4:
        if constexpr ((kStyle == RopeStyle::kNeox ? 4 : 8) <= kMaxElems) {
          if (!p.vector) return false;
          visitor.template Run<T, kStyle, 4, true>();
          return true;
        }
        return false;
      case 8:
        if constexpr (kStyle == RopeStyle::kNeox && 8 <= kMaxElems) {
          if (!p.vector) return false;
          visitor.template Run<T, kStyle, 8, true>();
          return true;
        }
        return false;
      default:
        return false;
    }
  };
  auto by_style = [&](auto type_tag) -> bool {
    switch (p.style) {
      case RopeStyle::kNeox:
        return by_pairs(type_tag, std::integral_constant<RopeStyle, RopeStyle::kNeox>());
      case RopeStyle::kGptj:
        return by_pairs(type_tag, std::integral_constant<RopeStyle, RopeStyle::kGptj>());
    }
    return false;
  };
  switch (p.dtype) {
    case DType::kFloat32:
      return by_style(TypeTag<float>());
    case DType::kFloat16:
      return by_style(TypeTag<Half>());
    case DType::kBFloat16:
      return by_style(TypeTag<BFloat16>());
    default:
      return false;
  }
}

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_ROPE_BODY_H_
