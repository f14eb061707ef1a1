#include "workload.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"
#include "posenc/wire/requests.h"
#include "posenc/wire/tensors.h"

namespace posenc::loadgen {
namespace {

// ------------------------------------------------------------ presets ----

OpSpec Rope(const std::string& name, DType dtype, std::vector<int64_t> shape, int64_t key_heads) {
  OpSpec s;
  s.name = name;
  s.kind = OpKind::kRope;
  s.dtype = dtype;
  s.shape = std::move(shape);
  s.key_heads = key_heads;
  return s;
}

// The LLaMA 3 decode/prefill shapes the benchmarks were stated in: 32 query
// and 8 key heads of 128, positions well into the context.
OpSpec Llama3Rope(const std::string& name, std::vector<int64_t> shape, int64_t key_heads) {
  OpSpec s = Rope(name, DType::kBFloat16, std::move(shape), key_heads);
  s.positions = PositionSource::kOffsets;
  s.position_start = 1000;
  s.rope.base = 500000;
  s.rope.scaling.type = ScalingType::kLlama3;
  return s;
}

// --------------------------------------------------- parsing flag text ----

absl::Status Expected(absl::string_view name, absl::string_view what, absl::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, " must be ", what, "; got '", absl::CHexEscape(text), "'"));
}

// Integers fit any product the kernels' limits allow; larger ones are typos.
constexpr int64_t kMaxInteger = int64_t{1} << 40;

absl::StatusOr<int64_t> Integer(absl::string_view name, absl::string_view text, int64_t lo) {
  int64_t v;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v) || v < lo || v > kMaxInteger) {
    return Expected(name, absl::StrCat("an integer in [", lo, ", 2^40]"), text);
  }
  return v;
}

absl::StatusOr<double> Real(absl::string_view name, absl::string_view text) {
  double v;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(text), &v) || !std::isfinite(v)) {
    return Expected(name, "a finite number", text);
  }
  return v;
}

absl::StatusOr<bool> Boolean(absl::string_view name, absl::string_view text) {
  bool v;
  if (!absl::SimpleAtob(absl::StripAsciiWhitespace(text), &v)) {
    return Expected(name, "true or false", text);
  }
  return v;
}

absl::StatusOr<std::vector<int64_t>> Integers(absl::string_view name, absl::string_view text,
                                              int64_t lo) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    absl::StatusOr<int64_t> v = Integer(name, part, lo);
    if (!v.ok()) {
      return Expected(name, absl::StrCat("a comma list of integers in [", lo, ", 2^40]"), text);
    }
    out.push_back(*v);
  }
  return out;
}

absl::StatusOr<std::vector<double>> Reals(absl::string_view name, absl::string_view text) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    absl::StatusOr<double> v = Real(name, part);
    if (!v.ok()) return Expected(name, "a comma list of finite numbers", text);
    out.push_back(*v);
  }
  return out;
}

template <typename Enum>
absl::StatusOr<Enum> EnumOf(absl::string_view name, absl::string_view text) {
  return wire::Parse<Enum>(absl::StrCat("--", name), absl::StripAsciiWhitespace(text));
}

absl::StatusOr<PositionSource> Positions(absl::string_view name, absl::string_view text) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (v == "index") return PositionSource::kIndex;
  if (v == "offsets") return PositionSource::kOffsets;
  if (v == "ids") return PositionSource::kIds;
  return Expected(name, "one of index, offsets, ids (any case)", text);
}

absl::StatusOr<AbsoluteOptions::Kind> Encoding(absl::string_view name, absl::string_view text) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (v == "sinusoidal") return AbsoluteOptions::Kind::kSinusoidal;
  if (v == "learned") return AbsoluteOptions::Kind::kLearned;
  return Expected(name, "one of sinusoidal, learned (any case)", text);
}

// ------------------------------------------------------------ overrides ----

using Setter = std::function<absl::Status(absl::string_view name, absl::string_view text, OpSpec&)>;

struct OverrideRule {
  const char* name;
  std::vector<OpKind> kinds;
  Setter set;
};

const std::vector<OpKind> kAll = {OpKind::kRope, OpKind::kAbsolute, OpKind::kTable, OpKind::kBias};
const std::vector<OpKind> kRopeOnly = {OpKind::kRope};
const std::vector<OpKind> kEncodings = {OpKind::kAbsolute, OpKind::kTable};
const std::vector<OpKind> kPositioned = {OpKind::kRope, OpKind::kAbsolute, OpKind::kTable};
const std::vector<OpKind> kBiasOnly = {OpKind::kBias};

// Assigns the parsed value of `parse` to the field `field` picks out.
template <typename T, typename Parse, typename Field>
Setter Assign(Parse parse, Field field) {
  return [parse, field](absl::string_view name, absl::string_view text, OpSpec& s) -> absl::Status {
    absl::StatusOr<T> v = parse(name, text);
    if (!v.ok()) return v.status();
    field(s) = *std::move(v);
    return absl::OkStatus();
  };
}
auto IntegerFrom(int64_t lo) {
  return [lo](absl::string_view n, absl::string_view t) { return Integer(n, t, lo); };
}
auto IntegersFrom(int64_t lo) {
  return [lo](absl::string_view n, absl::string_view t) { return Integers(n, t, lo); };
}

const std::vector<OverrideRule>& Rules() {
  static const auto* rules = new std::vector<OverrideRule>{
      {"shape",
       {OpKind::kRope, OpKind::kAbsolute, OpKind::kBias},
       Assign<std::vector<int64_t>>(IntegersFrom(0),
                                    [](OpSpec& s) -> std::vector<int64_t>& { return s.shape; })},
      {"dtype", kAll, Assign<DType>(EnumOf<DType>, [](OpSpec& s) -> DType& { return s.dtype; })},
      {"backend", kAll,
       Assign<BackendChoice>(EnumOf<BackendChoice>,
                             [](OpSpec& s) -> BackendChoice& { return s.backend; })},
      {"positions", kPositioned,
       Assign<PositionSource>(Positions, [](OpSpec& s) -> PositionSource& { return s.positions; })},
      {"position_start", kPositioned,
       Assign<int64_t>(IntegerFrom(-kMaxInteger),
                       [](OpSpec& s) -> int64_t& { return s.position_start; })},
      {"base", kPositioned,
       [](absl::string_view n, absl::string_view t, OpSpec& s) -> absl::Status {
         POSENC_ASSIGN_OR_RETURN(const double v, Real(n, t));
         s.rope.base = s.absolute.base = v;
         return absl::OkStatus();
       }},
      // RoPE
      {"key_heads", kRopeOnly,
       Assign<int64_t>(IntegerFrom(0), [](OpSpec& s) -> int64_t& { return s.key_heads; })},
      {"layout", kRopeOnly,
       Assign<RopeLayout>(EnumOf<RopeLayout>,
                          [](OpSpec& s) -> RopeLayout& { return s.rope.layout; })},
      {"style", kRopeOnly,
       Assign<RopeStyle>(EnumOf<RopeStyle>, [](OpSpec& s) -> RopeStyle& { return s.rope.style; })},
      {"rotary_dim", kRopeOnly,
       Assign<int64_t>(IntegerFrom(0), [](OpSpec& s) -> int64_t& { return s.rope.rotary_dim; })},
      {"inverse", kRopeOnly,
       Assign<bool>(Boolean, [](OpSpec& s) -> bool& { return s.rope.inverse; })},
      {"scaling", kRopeOnly,
       Assign<ScalingType>(EnumOf<ScalingType>,
                           [](OpSpec& s) -> ScalingType& { return s.rope.scaling.type; })},
      {"factor", kRopeOnly,
       Assign<double>(Real,
                      [](OpSpec& s) -> std::optional<double>& { return s.rope.scaling.factor; })},
      {"original_max_position", kRopeOnly,
       Assign<int64_t>(IntegerFrom(0),
                       [](OpSpec& s) -> std::optional<int64_t>& {
                         return s.rope.scaling.original_max_position;
                       })},
      {"beta_fast", kRopeOnly,
       Assign<double>(
           Real, [](OpSpec& s) -> std::optional<double>& { return s.rope.scaling.beta_fast; })},
      {"beta_slow", kRopeOnly,
       Assign<double>(
           Real, [](OpSpec& s) -> std::optional<double>& { return s.rope.scaling.beta_slow; })},
      {"mscale", kRopeOnly,
       Assign<double>(Real,
                      [](OpSpec& s) -> std::optional<double>& { return s.rope.scaling.mscale; })},
      {"mscale_all_dim", kRopeOnly,
       Assign<double>(
           Real,
           [](OpSpec& s) -> std::optional<double>& { return s.rope.scaling.mscale_all_dim; })},
      {"attention_factor", kRopeOnly,
       Assign<double>(
           Real,
           [](OpSpec& s) -> std::optional<double>& { return s.rope.scaling.attention_factor; })},
      {"truncate", kRopeOnly,
       Assign<bool>(Boolean, [](OpSpec& s) -> bool& { return s.rope.scaling.truncate; })},
      {"low_freq_factor", kRopeOnly,
       Assign<double>(
           Real,
           [](OpSpec& s) -> std::optional<double>& { return s.rope.scaling.low_freq_factor; })},
      {"high_freq_factor", kRopeOnly,
       Assign<double>(
           Real,
           [](OpSpec& s) -> std::optional<double>& { return s.rope.scaling.high_freq_factor; })},
      {"short_factor", kRopeOnly,
       Assign<std::vector<double>>(
           Reals, [](OpSpec& s) -> std::vector<double>& { return s.rope.scaling.short_factor; })},
      {"long_factor", kRopeOnly,
       Assign<std::vector<double>>(
           Reals, [](OpSpec& s) -> std::vector<double>& { return s.rope.scaling.long_factor; })},
      {"longrope_mode", kRopeOnly,
       Assign<LongRopeMode>(
           EnumOf<LongRopeMode>,
           [](OpSpec& s) -> LongRopeMode& { return s.rope.scaling.longrope_mode; })},
      {"inv_freq", kRopeOnly,
       Assign<std::vector<double>>(
           Reals, [](OpSpec& s) -> std::vector<double>& { return s.rope.scaling.inv_freq; })},
      {"axis_mode", kRopeOnly,
       Assign<AxisMode>(EnumOf<AxisMode>, [](OpSpec& s) -> AxisMode& { return s.rope.axis_mode; })},
      {"axis_dims", kRopeOnly,
       Assign<std::vector<int64_t>>(
           IntegersFrom(0), [](OpSpec& s) -> std::vector<int64_t>& { return s.rope.axis_dims; })},
      {"sections", kRopeOnly,
       Assign<std::vector<int64_t>>(
           IntegersFrom(0), [](OpSpec& s) -> std::vector<int64_t>& { return s.rope.sections; })},
      // Absolute encodings and tables
      {"encoding", kEncodings,
       Assign<AbsoluteOptions::Kind>(
           Encoding, [](OpSpec& s) -> AbsoluteOptions::Kind& { return s.absolute.kind; })},
      {"table_name", kEncodings,
       [](absl::string_view, absl::string_view t, OpSpec& s) -> absl::Status {
         s.absolute.table_name = std::string(t);
         return absl::OkStatus();
       }},
      {"sinusoidal_layout", kEncodings,
       Assign<SinusoidalLayout>(
           EnumOf<SinusoidalLayout>,
           [](OpSpec& s) -> SinusoidalLayout& { return s.absolute.sinusoidal_layout; })},
      {"x_scale",
       {OpKind::kAbsolute},
       Assign<double>(Real, [](OpSpec& s) -> double& { return s.absolute.x_scale; })},
      {"dim",
       {OpKind::kTable},
       Assign<int64_t>(IntegerFrom(0), [](OpSpec& s) -> int64_t& { return s.table_dim; })},
      {"count",
       {OpKind::kTable},
       Assign<int64_t>(IntegerFrom(0), [](OpSpec& s) -> int64_t& { return s.table_count; })},
      // Attention bias
      {"form", kBiasOnly,
       Assign<BiasForm>(EnumOf<BiasForm>, [](OpSpec& s) -> BiasForm& { return s.bias.form; })},
      {"slopes", kBiasOnly,
       Assign<std::vector<double>>(
           Reals, [](OpSpec& s) -> std::vector<double>& { return s.bias.slopes; })},
      {"causal", kBiasOnly,
       Assign<bool>(Boolean, [](OpSpec& s) -> bool& { return s.bias.causal; })},
      {"window", kBiasOnly,
       Assign<int64_t>(IntegerFrom(0), [](OpSpec& s) -> int64_t& { return s.bias.window; })},
      {"q_offset", kBiasOnly,
       Assign<int64_t>(IntegerFrom(-kMaxInteger),
                       [](OpSpec& s) -> std::optional<int64_t>& { return s.bias.q_offset; })},
      {"logits", kBiasOnly,
       Assign<bool>(Boolean, [](OpSpec& s) -> bool& { return s.send_logits; })},
  };
  return *rules;
}

// ------------------------------------------------------------- building ----

std::string RandomTensor(DType dtype, int64_t n, uint32_t seed) {
  std::string b(n * SizeOf(dtype), '\0');
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < n; ++i) StoreElement(dtype, b.data(), i, u(rng));
  return b;
}

// Elements of `shape`, checked before anything is allocated from it: at
// most kMaxTensorBytes of `dtype`, zero dimensions counting as 1 in the
// bound so that no other size derived from a dimension can be huge either.
absl::StatusOr<int64_t> Elements(const OpSpec& s, absl::string_view what,
                                 const std::vector<int64_t>& shape, DType dtype) {
  const int64_t max_elements = kMaxTensorBytes / static_cast<int64_t>(SizeOf(dtype));
  int64_t n = 1, bound = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bound, std::max<int64_t>(d, 1), &bound) ||
        bound > max_elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("op ", s.name, ": ", what, " ", ShapeString(shape), " of ", DTypeName(dtype),
                       " exceeds the ", kMaxTensorBytes, "-byte limit of one tensor (--shape)"));
    }
    n *= d;
  }
  return n;
}

absl::Status InOp(const OpSpec& s, const absl::Status& st) {
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("op ", s.name, ": ", st.message()));
}

// Positions for `batch` sequences of `seq` tokens (THD: one sequence of
// `seq` tokens) as the spec asks; *view is left absent for kIndex.
struct PositionTensors {
  std::vector<int64_t> values;
  TensorView offsets, ids;
};
absl::StatusOr<PositionTensors> MakePositions(const OpSpec& s, bool packed, int64_t batch,
                                              int64_t seq, int axes) {
  PositionTensors p;
  if (s.positions == PositionSource::kOffsets) {
    if (packed) {
      return absl::InvalidArgumentError(
          absl::StrCat("op ", s.name,
                       ": --positions=offsets needs padded sequences ([batch, seq, ...]); "
                       "use ids or index"));
    }
    for (int64_t b = 0; b < batch; ++b) p.values.push_back(s.position_start + 37 * b);
    p.offsets = TensorView{DType::kInt64, {batch}, p.values.data(), p.values.size() * 8};
  } else if (s.positions == PositionSource::kIds) {
    // batch * seq is bounded by the tensor it positions; axes by the limits.
    p.values.reserve(batch * seq * axes);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < seq; ++t) {
        for (int a = 0; a < axes; ++a) p.values.push_back(s.position_start + 37 * b + t);
      }
    }
    std::vector<int64_t> shape = packed ? std::vector<int64_t>{seq} : std::vector{batch, seq};
    if (axes > 1) shape.push_back(axes);
    p.ids = TensorView{DType::kInt64, shape, p.values.data(), p.values.size() * 8};
  }
  return p;
}

void Measure(Op& op, int64_t request_bytes, int64_t response_bytes) {
  op.request_bytes = request_bytes;
  op.response_bytes = response_bytes;
}

absl::StatusOr<Op> BuildRope(const OpSpec& s, bool with_expected) {
  const RopeOptions& o = s.rope;
  const bool packed = o.layout == RopeLayout::kTHD;
  if (s.shape.size() != (packed ? 3u : 4u)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op ", s.name, ": --shape of a rope query in --layout=", wire::NameOf(o.layout), " is ",
        packed ? "T,H,D" : (o.layout == RopeLayout::kBHSD ? "B,H,S,D" : "B,S,H,D"), "; got ",
        ShapeString(s.shape)));
  }
  POSENC_RETURN_IF_ERROR(InOp(s, CheckAxisCount(o)));
  POSENC_ASSIGN_OR_RETURN(const int64_t nq, Elements(s, "query", s.shape, s.dtype));
  const size_t head_axis = packed || o.layout == RopeLayout::kBHSD ? 1 : 2;
  std::vector<int64_t> k_shape = s.shape;
  k_shape[head_axis] = s.key_heads;
  POSENC_ASSIGN_OR_RETURN(const int64_t nk, Elements(s, "key", k_shape, s.dtype));
  const int64_t batch = packed ? 1 : s.shape[0];
  const int64_t seq = packed ? s.shape[0] : s.shape[o.layout == RopeLayout::kBHSD ? 2 : 1];
  POSENC_ASSIGN_OR_RETURN(PositionTensors pos,
                          MakePositions(s, packed, batch, seq, NumPositionAxes(o)));
  std::string q = RandomTensor(s.dtype, nq, 1);
  std::string k = s.key_heads > 0 ? RandomTensor(s.dtype, nk, 2) : "";
  RopeTensors t;
  t.query = MutableTensor{s.dtype, s.shape, q.data(), q.size()};
  if (s.key_heads > 0) t.key = MutableTensor{s.dtype, k_shape, k.data(), k.size()};
  t.positions.offsets = pos.offsets;
  t.positions.position_ids = pos.ids;
  absl::StatusOr<RopePlan> plan = PlanRope(o, t);
  POSENC_RETURN_IF_ERROR(InOp(s, plan.status()));

  Op op;
  op.name = s.name;
  op.kind = OpKind::kRope;
  v1::RopeRequest& r = op.rope;
  wire::SetRopeOptions(o, &r);
  wire::SetTensor(t.query.view(), r.mutable_query(), r.mutable_query_data());
  if (t.key.present()) wire::SetTensor(t.key.view(), r.mutable_key(), r.mutable_key_data());
  if (pos.offsets.present()) wire::SetTensor(pos.offsets, r.mutable_offsets());
  if (pos.ids.present()) wire::SetTensor(pos.ids, r.mutable_position_ids());
  r.set_backend(wire::ToProto(s.backend));
  Measure(op, q.size() + k.size(), q.size() + k.size());
  if (with_expected) {
    POSENC_RETURN_IF_ERROR(CreateCpuBackend(0)->ApplyRope(*plan, q.data(), k.data(), {}));
    op.expected = std::move(q);
    op.expected_key = std::move(k);
  }
  return op;
}

absl::Status CheckableEncoding(const OpSpec& s, bool with_expected) {
  if (with_expected && s.absolute.kind == AbsoluteOptions::Kind::kLearned) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op ", s.name, ": --check cannot check a learned encoding (its table is on the server)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Op> BuildAbsolute(const OpSpec& s, bool with_expected) {
  POSENC_RETURN_IF_ERROR(CheckableEncoding(s, with_expected));
  if (s.shape.size() != 2 && s.shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("op ", s.name, ": --shape of x is B,S,D or T,D; got ", ShapeString(s.shape)));
  }
  POSENC_ASSIGN_OR_RETURN(const int64_t n, Elements(s, "x", s.shape, s.dtype));
  const bool packed = s.shape.size() == 2;
  POSENC_ASSIGN_OR_RETURN(PositionTensors pos, MakePositions(s, packed, packed ? 1 : s.shape[0],
                                                             packed ? s.shape[0] : s.shape[1], 1));
  std::string x = RandomTensor(s.dtype, n, 3);
  AbsoluteTensors t;
  t.x = MutableTensor{s.dtype, s.shape, x.data(), x.size()};
  t.positions.offsets = pos.offsets;
  t.positions.position_ids = pos.ids;
  // A learned table lives on the server: only the server can plan it.
  absl::StatusOr<AbsolutePlan> plan = AbsolutePlan{};
  if (s.absolute.kind == AbsoluteOptions::Kind::kSinusoidal) plan = PlanAbsolute(s.absolute, t);
  POSENC_RETURN_IF_ERROR(InOp(s, plan.status()));

  Op op;
  op.name = s.name;
  op.kind = OpKind::kAbsolute;
  v1::AbsoluteEncodingRequest& r = op.absolute;
  wire::SetAbsoluteOptions(s.absolute, &r);
  wire::SetTensor(t.x.view(), r.mutable_x(), r.mutable_x_data());
  if (pos.offsets.present()) wire::SetTensor(pos.offsets, r.mutable_offsets());
  if (pos.ids.present()) wire::SetTensor(pos.ids, r.mutable_position_ids());
  r.set_backend(wire::ToProto(s.backend));
  Measure(op, x.size(), x.size());
  if (with_expected) {
    POSENC_RETURN_IF_ERROR(CreateCpuBackend(0)->ApplyAbsolute(*plan, x.data(), {}));
    op.expected = std::move(x);
  }
  return op;
}

absl::StatusOr<Op> BuildTable(const OpSpec& s, bool with_expected) {
  POSENC_RETURN_IF_ERROR(CheckableEncoding(s, with_expected));
  const std::vector<int64_t> shape = {s.table_count, s.table_dim};
  POSENC_ASSIGN_OR_RETURN(const int64_t n, Elements(s, "table (--count, --dim)", shape, s.dtype));
  // Explicit positions (ids or offsets) send the list start, start+1, ...;
  // index sends the count alone.
  std::vector<int64_t> values;
  TensorView positions;
  if (s.positions != PositionSource::kIndex) {
    for (int64_t i = 0; i < s.table_count; ++i) values.push_back(s.position_start + i);
    positions = TensorView{DType::kInt64, {s.table_count}, values.data(), values.size() * 8};
  }
  const int64_t count = positions.present() ? 0 : s.table_count;
  absl::StatusOr<AbsolutePlan> plan = AbsolutePlan{};
  if (s.absolute.kind == AbsoluteOptions::Kind::kSinusoidal) {
    plan = PlanEncodingTable(s.absolute, s.table_dim, s.dtype, positions, count);
  }
  POSENC_RETURN_IF_ERROR(InOp(s, plan.status()));

  Op op;
  op.name = s.name;
  op.kind = OpKind::kTable;
  v1::EncodingTableRequest& r = op.table;
  wire::SetAbsoluteOptions(s.absolute, &r);
  r.set_dim(s.table_dim);
  r.set_count(count);
  if (positions.present()) wire::SetTensor(positions, r.mutable_positions());
  r.set_dtype(wire::ToProto(s.dtype));
  r.set_backend(wire::ToProto(s.backend));
  Measure(op, values.size() * 8, n * SizeOf(s.dtype));
  if (with_expected) {
    std::string out(n * SizeOf(s.dtype), '\0');
    POSENC_RETURN_IF_ERROR(CreateCpuBackend(0)->ApplyAbsolute(*plan, out.data(), {}));
    op.expected = std::move(out);
  }
  return op;
}

absl::StatusOr<Op> BuildBias(const OpSpec& s, bool with_expected) {
  if (s.shape.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("op ", s.name, ": --shape of a bias is batch,heads,q_len,k_len; got ",
                     ShapeString(s.shape)));
  }
  POSENC_ASSIGN_OR_RETURN(const int64_t n, Elements(s, "bias", s.shape, s.dtype));
  BiasOptions o = s.bias;
  std::string logits;
  TensorView logits_view;
  if (s.send_logits) {
    logits = RandomTensor(s.dtype, n, 4);
    logits_view = TensorView{s.dtype, s.shape, logits.data(), logits.size()};
  } else {
    o.batch = s.shape[0];
    o.num_heads = s.shape[1];
    o.q_len = s.shape[2];
    o.k_len = s.shape[3];
    o.dtype = s.dtype;
  }
  absl::StatusOr<BiasPlan> plan = PlanAttentionBias(o, logits_view);
  POSENC_RETURN_IF_ERROR(InOp(s, plan.status()));

  Op op;
  op.name = s.name;
  op.kind = OpKind::kBias;
  v1::AttentionBiasRequest& r = op.bias;
  wire::SetBiasOptions(o, &r);
  if (s.send_logits) wire::SetTensor(logits_view, r.mutable_logits(), r.mutable_logits_data());
  r.set_backend(wire::ToProto(s.backend));
  Measure(op, logits.size(), n * SizeOf(s.dtype));
  if (with_expected) {
    std::string out = s.send_logits ? std::move(logits) : std::string(n * SizeOf(s.dtype), '\0');
    POSENC_RETURN_IF_ERROR(CreateCpuBackend(0)->ApplyAttentionBias(*plan, out.data(), {}));
    op.expected = std::move(out);
  }
  return op;
}

const char* KindName(OpKind k) {
  switch (k) {
    case OpKind::kRope:
      return "rope";
    case OpKind::kAbsolute:
      return "absolute";
    case OpKind::kTable:
      return "table";
    case OpKind::kBias:
      return "bias";
  }
  return "?";
}

}  // namespace

std::vector<std::string> OpNames() {
  return {"rope_decode", "rope_prefill", "rope_1mib", "sinusoidal",
          "bias",        "rope",         "absolute",  "table"};
}

absl::StatusOr<OpSpec> PresetOp(absl::string_view name) {
  // rope_decode:  batch 32 x 1 token x (32 q + 8 k heads) x 128, bf16 (decode step)
  // rope_prefill: 4096 tokens x (32 q + 8 k heads) x 128, bf16
  // rope_1mib:    query [1, 128, 32, 128] bf16 = 1 MiB
  if (name == "rope_decode") return Llama3Rope("rope_decode", {32, 1, 32, 128}, 8);
  if (name == "rope_prefill") return Llama3Rope("rope_prefill", {1, 4096, 32, 128}, 8);
  if (name == "rope_1mib") return Llama3Rope("rope_1mib", {1, 128, 32, 128}, 0);
  if (name == "rope") return Rope("rope", DType::kFloat32, {1, 512, 8, 128}, 0);
  OpSpec s;
  s.name = std::string(name);
  if (name == "sinusoidal" || name == "absolute") {
    // sinusoidal: x [1, 1024, 1024] f32 += PE; absolute: a BERT-base sequence
    s.kind = OpKind::kAbsolute;
    s.shape = name == "sinusoidal" ? std::vector<int64_t>{1, 1024, 1024}
                                   : std::vector<int64_t>{1, 512, 768};
    return s;
  }
  if (name == "table") {
    s.kind = OpKind::kTable;
    s.table_dim = 768;
    s.table_count = 512;
    return s;
  }
  if (name == "bias") {
    // ALiBi + causal added to f32 logits [1, 16, 256, 256]
    s.kind = OpKind::kBias;
    s.shape = {1, 16, 256, 256};
    s.bias.causal = true;
    return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("--op: unknown operation '",
                                                 absl::CHexEscape(name), "'; one of ",
                                                 absl::StrJoin(OpNames(), ", ")));
}

std::vector<std::string> OverrideNames() {
  std::vector<std::string> names;
  for (const OverrideRule& r : Rules()) names.push_back(r.name);
  return names;
}

absl::Status OverrideOp(absl::string_view name, absl::string_view text, OpSpec* spec,
                        bool* applied) {
  *applied = false;
  for (const OverrideRule& r : Rules()) {
    if (name != r.name) continue;
    if (std::find(r.kinds.begin(), r.kinds.end(), spec->kind) == r.kinds.end()) {
      return absl::OkStatus();
    }
    *applied = true;
    return r.set(name, text, *spec);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown override --", name));
}

absl::StatusOr<Op> BuildOp(const OpSpec& spec, bool with_expected) {
  switch (spec.kind) {
    case OpKind::kRope:
      return BuildRope(spec, with_expected);
    case OpKind::kAbsolute:
      return BuildAbsolute(spec, with_expected);
    case OpKind::kTable:
      return BuildTable(spec, with_expected);
    case OpKind::kBias:
      return BuildBias(spec, with_expected);
  }
  return absl::InternalError("unknown op kind");
}

bool Mix::AllRope() const {
  for (const Op& op : ops) {
    if (op.kind != OpKind::kRope) return false;
  }
  return true;
}

absl::StatusOr<Mix> ParseMix(const std::string& spec, const std::vector<Override>& overrides,
                             bool with_expected) {
  std::vector<OpSpec> specs;
  Mix mix;
  mix.spec = spec;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> nw = absl::StrSplit(part, ':');
    double weight = 1;
    if (nw.size() > 2 || (nw.size() == 2 && (!absl::SimpleAtod(nw[1], &weight) ||
                                             !std::isfinite(weight) || weight <= 0))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--op: each entry is NAME or NAME:WEIGHT with a weight > 0; got '",
                       absl::CHexEscape(part), "'"));
    }
    if (specs.size() == kMaxMixOps) {
      return absl::InvalidArgumentError(
          absl::StrCat("--op: at most ", kMaxMixOps, " operations in a mix"));
    }
    POSENC_ASSIGN_OR_RETURN(OpSpec s, PresetOp(absl::StripAsciiWhitespace(nw[0])));
    specs.push_back(std::move(s));
    mix.weights.push_back(weight);
  }
  if (specs.empty()) return absl::InvalidArgumentError("--op names no operation");
  for (const Override& o : overrides) {
    bool any = false;
    std::vector<std::string> kinds;
    for (OpSpec& s : specs) {
      bool applied;
      POSENC_RETURN_IF_ERROR(OverrideOp(o.name, o.text, &s, &applied));
      any = any || applied;
      kinds.push_back(KindName(s.kind));
    }
    if (!any) {
      return absl::InvalidArgumentError(absl::StrCat("--", o.name, " does not apply to --op=", spec,
                                                     " (", absl::StrJoin(kinds, ", "), ")"));
    }
  }
  int64_t bytes = 0;
  for (const OpSpec& s : specs) {
    POSENC_ASSIGN_OR_RETURN(Op op, BuildOp(s, with_expected));
    bytes += op.request_bytes + (with_expected ? op.response_bytes : 0);
    if (bytes > kMaxMixBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("--op: the mix's tensors (requests and, with --check, answers) pass ",
                       kMaxMixBytes, " bytes; use fewer or smaller operations (--shape)"));
    }
    mix.ops.push_back(std::move(op));
  }
  return mix;
}

}  // namespace posenc::loadgen
