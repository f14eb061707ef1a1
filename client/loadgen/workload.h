// What posenc-loadgen sends. An OpSpec describes one operation in the kernel
// library's own terms (options, shape, dtype, positions); it starts from a
// named preset or an operation kind and flags override any part of it
// (OverrideOp, parsing enums through wire::Parse). BuildOp then validates it
// by planning it locally, draws its random data (never zeros) and writes the
// request with wire's Set*Options / SetTensor, so no option is built by
// hand here. With checking, the expected answer comes from the CPU kernels.
#ifndef POSENC_LOADGEN_WORKLOAD_H_
#define POSENC_LOADGEN_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/backend.h"
#include "posenc/rope.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::loadgen {

enum class OpKind { kRope, kAbsolute, kTable, kBias };

// How a request carries positions: none (each token's index in its
// sequence), per-sequence offsets, or explicit per-token position ids
// (a table request: its positions list).
enum class PositionSource { kIndex, kOffsets, kIds };

struct OpSpec {
  std::string name;
  OpKind kind = OpKind::kRope;
  DType dtype = DType::kFloat32;
  // rope: the query; absolute: x; bias: the logits [batch, heads, q_len,
  // k_len] (or, without logits, the bias to build); table: unused.
  std::vector<int64_t> shape;
  int64_t key_heads = 0;  // rope: a key with this many heads (0: none)
  PositionSource positions = PositionSource::kIndex;
  // First position of each sequence (offsets, ids); sequence b starts at
  // position_start + 37 b so that sequences differ.
  int64_t position_start = 0;
  RopeOptions rope;
  AbsoluteOptions absolute;  // absolute and table
  int64_t table_dim = 0, table_count = 0;
  BiasOptions bias;
  bool send_logits = true;  // bias: add to sent logits, or build the bias alone
  BackendChoice backend = BackendChoice::kDefault;
};

// Presets (rope_decode, rope_prefill, rope_1mib, sinusoidal, bias) and the
// bare kinds (rope, absolute, table) with plain defaults.
std::vector<std::string> OpNames();
[[nodiscard]] absl::StatusOr<OpSpec> PresetOp(absl::string_view name);

// The flags that override part of an OpSpec, without their "--".
std::vector<std::string> OverrideNames();
// Sets the part `name` names from `text` when it applies to spec's kind
// (*applied says whether it did). Errors are INVALID_ARGUMENT naming --name,
// saying what was expected and quoting the text.
[[nodiscard]] absl::Status OverrideOp(absl::string_view name, absl::string_view text, OpSpec* spec,
                                      bool* applied);

struct Op {
  std::string name;
  OpKind kind = OpKind::kRope;
  v1::RopeRequest rope;
  v1::AbsoluteEncodingRequest absolute;
  v1::EncodingTableRequest table;
  v1::AttentionBiasRequest bias;
  // Expected response tensors (query and key; y; table; bias) when checking.
  std::string expected, expected_key;
  int64_t request_bytes = 0;   // tensor bytes sent
  int64_t response_bytes = 0;  // tensor bytes received
};

// The largest tensor loadgen builds (a gRPC message cannot carry more).
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 30;

[[nodiscard]] absl::StatusOr<Op> BuildOp(const OpSpec& spec, bool with_expected);

// A weighted mix of operations: "rope_decode" or "rope_decode:8,sinusoidal:1".
struct Mix {
  std::vector<Op> ops;
  std::vector<double> weights;
  std::string spec;
  bool AllRope() const;
};
// Operations in one mix at most, and the tensor bytes all of them may hold
// together (requests and expected answers): the mix is built in memory.
inline constexpr int kMaxMixOps = 16;
inline constexpr int64_t kMaxMixBytes = int64_t{4} << 30;

struct Override {
  std::string name, text;
};
// Parses the mix, applies every override to each operation it applies to
// (one that applies to none is an error naming the flag) and builds them.
[[nodiscard]] absl::StatusOr<Mix> ParseMix(const std::string& spec,
                                           const std::vector<Override>& overrides,
                                           bool with_expected);

}  // namespace posenc::loadgen

#endif  // POSENC_LOADGEN_WORKLOAD_H_
