#include "cpu/rope_through.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu/block_buffer.h"
#include "cpu_kernels.h"
#include "math/rope_math.h"
#include "posenc/dtype.h"
#include "posenc/host_copy.h"
#include "posenc/status_macros.h"

namespace posenc::internal {
namespace {

// Calls fn(tensor offset, block offset, elements) for each contiguous
// stretch of tokens [t0, t1) of a tensor of `heads` heads, and where it
// goes in a block of those tokens copied aside: one stretch, in order, in
// token-major layouts; in BHSD one a head and sequence, the block
// head-major (head h's tokens at h * (t1 - t0) * head_dim, RopeTokensCpu's
// block_tokens).
template <typename Fn>
void ForEachStretch(const RopePlan& p, int64_t heads, int64_t t0, int64_t t1, Fn fn) {
  const int64_t D = p.head_dim;
  if (p.layout != RopeLayout::kBHSD) {
    fn(t0 * heads * D, int64_t{0}, (t1 - t0) * heads * D);
    return;
  }
  for (int64_t run = t0; run < t1;) {
    const int64_t run_end = std::min(t1, (run / p.seq_len + 1) * p.seq_len);
    const HeadSpan span = HeadsOfToken(p.layout, run, p.seq_len, heads, D);
    for (int64_t h = 0; h < heads; ++h) {
      fn(span.first + h * span.stride, (h * (t1 - t0) + run - t0) * D, (run_end - run) * D);
    }
    run = run_end;
  }
}

// Where tokens [t0, t1) of a tensor lie in some memory: at their own
// offsets (a whole tensor's memory), or packed as a block of them
// (ForEachStretch's block offsets).
enum class Placed { kAtOwnOffsets, kAsBlock };

// Copies the stretches of tokens [t0, t1) of a tensor of `heads` heads and
// `elem` bytes an element from `from` to `to`, each placed as said;
// nothing when they are the same memory placed the same way.
void CopyTokens(const RopePlan& p, int64_t heads, size_t elem, const void* from, Placed from_as,
                void* to, Placed to_as, int64_t t0, int64_t t1) {
  if ((from == to && from_as == to_as) || heads == 0) return;
  const auto* src = static_cast<const char*>(from);
  auto* dst = static_cast<char*>(to);
  const auto e = static_cast<int64_t>(elem);
  ForEachStretch(p, heads, t0, t1, [&](int64_t at, int64_t block_at, int64_t n) {
    const int64_t src_at = from_as == Placed::kAsBlock ? block_at : at;
    const int64_t dst_at = to_as == Placed::kAsBlock ? block_at : at;
    CopyHostBytes(dst + dst_at * e, src + src_at * e, static_cast<size_t>(n * e));
  });
}

// Query and key bytes of one token.
int64_t TokenBytes(const RopePlan& plan) {
  return (plan.query_heads + (plan.has_key ? plan.key_heads : 0)) * plan.head_dim *
         static_cast<int64_t>(SizeOf(plan.dtype));
}

}  // namespace

int64_t RopeThroughBlockTokens(const RopePlan& plan) {
  return std::max<int64_t>(1, kThroughBlockBytes / std::max<int64_t>(1, TokenBytes(plan)));
}

bool RopeThroughNeedsWork(const RopePlan& plan) { return TokenBytes(plan) > kThroughBlockBytes; }

absl::Status RopeThroughTokensCpu(const RopePlan& plan, RowTable* rotations, const RopeThrough& t,
                                  int64_t begin, int64_t end) {
  const size_t elem = SizeOf(plan.dtype);
  const int64_t key_heads = plan.has_key ? plan.key_heads : 0;
  const int64_t block = RopeThroughBlockTokens(plan);
  constexpr Placed kOwn = Placed::kAtOwnOffsets, kBlock = Placed::kAsBlock;
  const auto check = [&]() -> absl::Status {
    return t.before_write ? t.before_write() : absl::OkStatus();
  };
  const int64_t q_row = plan.query_heads * plan.head_dim * static_cast<int64_t>(elem);
  const int64_t k_row = key_heads * plan.head_dim * static_cast<int64_t>(elem);
  if (RopeThroughNeedsWork(plan)) {
    // A token is larger than a block (which the thread's own buffer would
    // then have to hold, for the thread's life): rotated in the work
    // memory at its own offsets.
    for (int64_t b = begin; b < end; b += block) {
      const int64_t e = std::min(end, b + block);
      CopyTokens(plan, plan.query_heads, elem, t.query, kOwn, t.query_work, kOwn, b, e);
      CopyTokens(plan, key_heads, elem, t.key, kOwn, t.key_work, kOwn, b, e);
      if (!plan.empty()) RopeTokensCpu(plan, rotations, t.query_work, t.key_work, b, e);
      POSENC_RETURN_IF_ERROR(check());
      CopyTokens(plan, plan.query_heads, elem, t.query_work, kOwn, t.query_out, kOwn, b, e);
      CopyTokens(plan, key_heads, elem, t.key_work, kOwn, t.key_out, kOwn, b, e);
    }
    return absl::OkStatus();
  }
  // A block of each tensor is rotated in this thread's own block buffer
  // (kept across calls), which stays in cache: memory sees the inputs read
  // and the outputs written, as in one copy. Token-major, a block is one
  // stretch a tensor; in BHSD one a head (and sequence), gathered into the
  // buffer head after head. The work memory is not touched. At most
  // kThroughBlockBytes (and a page) a thread.
  const int64_t q_at = (block * q_row + 4095) / 4096 * 4096;
  char* q_block = ThisThreadsBlockBuffer().Reserve(q_at + block * k_row);
  char* k_block = q_block + q_at;
  for (int64_t b = begin; b < end; b += block) {
    const int64_t e = std::min(end, b + block);
    CopyTokens(plan, plan.query_heads, elem, t.query, kOwn, q_block, kBlock, b, e);
    CopyTokens(plan, key_heads, elem, t.key, kOwn, k_block, kBlock, b, e);
    if (!plan.empty()) {
      RopeTokensCpu(plan, rotations, q_block, key_heads > 0 ? k_block : nullptr, b, e, b, e - b);
    }
    POSENC_RETURN_IF_ERROR(check());
    CopyTokens(plan, plan.query_heads, elem, q_block, kBlock, t.query_out, kOwn, b, e);
    CopyTokens(plan, key_heads, elem, k_block, kBlock, t.key_out, kOwn, b, e);
  }
  return absl::OkStatus();
}

}  // namespace posenc::internal
