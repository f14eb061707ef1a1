#include "workload.h"

#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "posenc/backend.h"
#include "posenc/client.h"
#include "posenc/status_macros.h"

namespace posenc::loadgen {
namespace {

std::string RandomTensor(DType dtype, int64_t n, uint32_t seed) {
  std::string b(n * SizeOf(dtype), '\0');
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < n; ++i) StoreElement(dtype, b.data(), i, u(rng));
  return b;
}

int64_t Product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A RoPE op over BSHD query/key with per-sequence offsets.
absl::StatusOr<Op> RopeOp(const std::string& name, std::vector<int64_t> q_shape, int64_t key_heads,
                          bool with_expected) {
  Op op;
  op.name = name;
  op.kind = OpKind::kRope;
  const DType dtype = DType::kBFloat16;
  std::string q = RandomTensor(dtype, Product(q_shape), 1);
  std::vector<int64_t> k_shape = q_shape;
  k_shape[2] = key_heads;
  std::string k = key_heads > 0 ? RandomTensor(dtype, Product(k_shape), 2) : "";
  std::vector<int64_t> offsets(q_shape[0]);
  for (size_t b = 0; b < offsets.size(); ++b) offsets[b] = 1000 + 37 * b;
  v1::RopeRequest& r = op.rope;
  r.set_base(500000);
  r.mutable_scaling()->set_type(v1::SCALING_TYPE_LLAMA3);
  SetTensor(TensorView{dtype, q_shape, q.data(), q.size()}, r.mutable_query(),
            r.mutable_query_data());
  if (key_heads > 0) {
    SetTensor(TensorView{dtype, k_shape, k.data(), k.size()}, r.mutable_key(),
              r.mutable_key_data());
  }
  SetTensor(TensorView{DType::kInt64, {q_shape[0]}, offsets.data(), offsets.size() * 8},
            r.mutable_offsets());
  op.request_bytes = op.response_bytes = q.size() + k.size();
  if (with_expected) {
    RopeOptions o;
    o.base = 500000;
    o.scaling.type = ScalingType::kLlama3;
    RopeTensors t;
    t.query = MutableTensor{dtype, q_shape, q.data(), q.size()};
    if (key_heads > 0) t.key = MutableTensor{dtype, k_shape, k.data(), k.size()};
    t.positions.offsets =
        TensorView{DType::kInt64, {q_shape[0]}, offsets.data(), offsets.size() * 8};
    POSENC_ASSIGN_OR_RETURN(RopePlan plan, PlanRope(o, t));
    POSENC_RETURN_IF_ERROR(CreateCpuBackend(0)->ApplyRope(plan, q.data(), k.data(), {}));
    op.expected = std::move(q);
    op.expected_key = std::move(k);
  }
  return op;
}

}  // namespace

std::vector<std::string> OpNames() {
  return {"rope_decode", "rope_prefill", "rope_1mib", "sinusoidal", "bias"};
}

absl::StatusOr<Op> MakeOp(const std::string& name, bool with_expected) {
  if (name == "rope_decode") return RopeOp(name, {32, 1, 32, 128}, 8, with_expected);
  if (name == "rope_prefill") return RopeOp(name, {1, 4096, 32, 128}, 8, with_expected);
  if (name == "rope_1mib") return RopeOp(name, {1, 128, 32, 128}, 0, with_expected);
  if (name == "sinusoidal") {
    Op op;
    op.name = name;
    op.kind = OpKind::kAbsolute;
    const std::vector<int64_t> shape = {1, 1024, 1024};
    std::string x = RandomTensor(DType::kFloat32, Product(shape), 3);
    op.absolute.mutable_sinusoidal()->set_base(10000);
    SetTensor(TensorView{DType::kFloat32, shape, x.data(), x.size()}, op.absolute.mutable_x(),
              op.absolute.mutable_x_data());
    op.request_bytes = op.response_bytes = x.size();
    if (with_expected) {
      AbsoluteTensors t;
      t.x = MutableTensor{DType::kFloat32, shape, x.data(), x.size()};
      POSENC_ASSIGN_OR_RETURN(AbsolutePlan plan, PlanAbsolute(AbsoluteOptions{}, t));
      POSENC_RETURN_IF_ERROR(CreateCpuBackend(0)->ApplyAbsolute(plan, x.data(), {}));
      op.expected = std::move(x);
    }
    return op;
  }
  if (name == "bias") {
    Op op;
    op.name = name;
    op.kind = OpKind::kBias;
    const std::vector<int64_t> shape = {1, 16, 256, 256};
    std::string logits = RandomTensor(DType::kFloat32, Product(shape), 4);
    op.bias.set_causal(true);
    SetTensor(TensorView{DType::kFloat32, shape, logits.data(), logits.size()},
              op.bias.mutable_logits(), op.bias.mutable_logits_data());
    op.request_bytes = op.response_bytes = logits.size();
    if (with_expected) {
      BiasOptions o;
      o.causal = true;
      POSENC_ASSIGN_OR_RETURN(
          BiasPlan plan,
          PlanAttentionBias(o, TensorView{DType::kFloat32, shape, logits.data(), logits.size()}));
      POSENC_RETURN_IF_ERROR(CreateCpuBackend(0)->ApplyAttentionBias(plan, logits.data(), {}));
      op.expected = std::move(logits);
    }
    return op;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown op '", name, "'; one of ", absl::StrJoin(OpNames(), ", ")));
}

bool Mix::AllRope() const {
  for (const Op& op : ops) {
    if (op.kind != OpKind::kRope) return false;
  }
  return true;
}

absl::StatusOr<Mix> ParseMix(const std::string& spec, bool with_expected) {
  Mix mix;
  mix.spec = spec;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::vector<std::string> nw = absl::StrSplit(part, ':');
    double weight = 1;
    if (nw.size() == 2 && !absl::SimpleAtod(nw[1], &weight)) {
      return absl::InvalidArgumentError(absl::StrCat("bad weight in '", part, "'"));
    }
    POSENC_ASSIGN_OR_RETURN(Op op, MakeOp(nw[0], with_expected));
    mix.ops.push_back(std::move(op));
    mix.weights.push_back(weight);
  }
  if (mix.ops.empty()) return absl::InvalidArgumentError("--op names no operation");
  return mix;
}

}  // namespace posenc::loadgen
