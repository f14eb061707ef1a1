// Tokens, sequences and positions shared by RoPE and absolute encodings.
//
// Every operation sees its input as num_tokens tokens grouped into sequences:
// padded layouts ([batch, seq, ...]) have `batch` sequences of equal length,
// packed layouts ([tokens, ...] with cu_seqlens) have sequences of any length.
// Positions come from per-token position_ids, per-sequence offsets, or
// default to the index inside the sequence.
#ifndef POSENC_POSITIONS_H_
#define POSENC_POSITIONS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/limits.h"
#include "posenc/tensor.h"

namespace posenc {

struct TokenLayout {
  int64_t num_tokens = 0;
  int64_t num_sequences = 0;
  // Padded layouts ([batch, seq, ...]): token t belongs to sequence
  // t / padded_seq_len. `padded` tells them from packed ones also where
  // seq is 0 (position_ids are then [batch, 0], not [0]).
  bool padded = false;
  int64_t padded_seq_len = 0;
  // [num_sequences + 1] start token of each sequence; last entry == num_tokens.
  std::vector<int64_t> cu_seqlens;
};

// A padded layout of `batch` sequences of `seq_len` tokens.
// REQUIRES: batch <= kMaxSequences, batch * seq_len <= kMaxTokens.
TokenLayout PaddedLayout(int64_t batch, int64_t seq_len);

// A packed layout from a cu_seqlens tensor ([batch + 1], INT32 or INT64,
// batch <= kMaxSequences, starting at 0, non-decreasing, ending at
// num_tokens). An absent tensor means one sequence holding every token.
[[nodiscard]] absl::StatusOr<TokenLayout> PackedLayout(const TensorView& cu_seqlens,
                                                       int64_t num_tokens);

struct PositionInputs {
  // Padded: [batch, seq] or [1, seq] (shared by the batch), with a trailing
  // [num_axes] when num_axes > 1. Packed: [tokens] or [tokens, num_axes].
  TensorView position_ids;
  // [num_sequences]: position = offset + index in sequence, on every axis.
  TensorView offsets;
};

struct ResolvedPositions {
  int num_axes = 1;
  std::vector<int64_t> values;          // [num_tokens, num_axes]
  std::vector<int32_t> token_sequence;  // [num_tokens]
  // [num_sequences] largest position on any axis + 1, at least 0: the "L" of
  // length-dependent RoPE scalings (dynamic NTK, LongRoPE).
  std::vector<int64_t> sequence_length;
  int64_t max_abs_position = 0;
};

// Validates position_ids / offsets against the layout (dtype, bytes, shape)
// without allocating anything in proportion to the request.
[[nodiscard]] absl::Status CheckPositionInputs(const TokenLayout& layout,
                                               const PositionInputs& inputs, int num_axes);

// Bytes ResolvePositions allocates for this many tokens, sequences and axes.
int64_t ResolvedPositionsBytes(int64_t num_tokens, int64_t num_sequences, int num_axes);

// Checks the inputs (CheckPositionInputs) and every position against
// +-kMaxAbsPosition, and materialises them.
[[nodiscard]] absl::StatusOr<ResolvedPositions> ResolvePositions(const TokenLayout& layout,
                                                                 const PositionInputs& inputs,
                                                                 int num_axes);

}  // namespace posenc

#endif  // POSENC_POSITIONS_H_
