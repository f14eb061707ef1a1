// What posenc-loadgen sends: named operations with fixed shapes, built once
// (random data, never zeros) and reused for every call, with the expected
// answer computed locally by the kernel library when outputs are checked.
#ifndef POSENC_LOADGEN_WORKLOAD_H_
#define POSENC_LOADGEN_WORKLOAD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::loadgen {

enum class OpKind { kRope, kAbsolute, kBias };

struct Op {
  std::string name;
  OpKind kind = OpKind::kRope;
  v1::RopeRequest rope;
  v1::AbsoluteEncodingRequest absolute;
  v1::AttentionBiasRequest bias;
  // Expected response tensors (query and key; y; bias) when checking.
  std::string expected, expected_key;
  int64_t request_bytes = 0;   // tensor bytes sent
  int64_t response_bytes = 0;  // tensor bytes received
};

// rope_decode:  batch 32 x 1 token x (32 q + 8 k heads) x 128, bf16 (decode step)
// rope_prefill: 4096 tokens x (32 q + 8 k heads) x 128, bf16
// rope_1mib:    query [1, 128, 32, 128] bf16 = 1 MiB
// sinusoidal:   x [1, 1024, 1024] f32 += PE
// bias:         ALiBi + causal added to f32 logits [1, 16, 256, 256]
std::vector<std::string> OpNames();
[[nodiscard]] absl::StatusOr<Op> MakeOp(const std::string& name, bool with_expected);

// "rope_decode" or a weighted mix "rope_decode:8,sinusoidal:1".
struct Mix {
  std::vector<Op> ops;
  std::vector<double> weights;
  std::string spec;
  bool AllRope() const;
};
[[nodiscard]] absl::StatusOr<Mix> ParseMix(const std::string& spec, bool with_expected);

}  // namespace posenc::loadgen

#endif  // POSENC_LOADGEN_WORKLOAD_H_
