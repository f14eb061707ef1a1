// posenc-cli: call any posenc operation from the command line.
//
//   posenc-cli [--target=HOST:PORT] COMMAND [flags]
//   COMMAND: info | tables | reload | rope | absolute | table | bias
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "heatmap.h"
#include "npy.h"
#include "posenc/backend.h"
#include "posenc/client.h"
#include "posenc/status_macros.h"
#include "posenc/wire/enums.h"
#include "posenc/wire/hf_config.h"

ABSL_FLAG(std::string, target, "localhost:50051", "Server address, or dns:///name:port.");
ABSL_FLAG(double, timeout_s, 30, "Call deadline in seconds.");
ABSL_FLAG(std::string, tls_ca, "", "PEM file of CA certificates; enables TLS.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate for mutual TLS (with --tls_key; enables TLS, checking the "
          "server against --tls_ca or else the system's roots).");
ABSL_FLAG(std::string, tls_key, "", "PEM client key for mutual TLS (with --tls_cert).");
ABSL_FLAG(std::string, backend, "", "auto, cpu or cuda (gpu); default: the server's.");
ABSL_FLAG(std::string, dtype, "float32", "float32 (fp32), float16 (fp16) or bfloat16 (bf16).");
ABSL_FLAG(std::string, shape, "",
          "rope: B,S,H,D (BSHD/BHSD order) or T,H,D; absolute: B,S,D or T,D.");
ABSL_FLAG(int64_t, key_heads, 0, "rope: also rotate a random key with this many heads.");
ABSL_FLAG(std::string, layout, "bshd", "rope: bshd, bhsd or thd.");
ABSL_FLAG(std::string, style, "neox", "rope: neox or gptj.");
ABSL_FLAG(int64_t, rotary_dim, 0, "rope: rotary dims (0 = head_dim).");
ABSL_FLAG(double, base, 10000, "RoPE theta / sinusoidal base.");
ABSL_FLAG(bool, inverse, false, "rope: rotate by -angle.");
ABSL_FLAG(std::string, scaling, "none",
          "rope: none, linear, dynamic_ntk (dynamic), yarn, llama3, longrope, explicit.");
ABSL_FLAG(double, factor, 0, "rope scaling factor (0 = the type's default).");
ABSL_FLAG(int64_t, original_max_position, 0, "rope scaling original context (0 = default).");
ABSL_FLAG(std::string, hf_config, "",
          "rope: a model's HF config.json; base, rotary_dim, scaling (and style / sections "
          "where the family implies them) as transformers resolves them. --base, --rotary_dim "
          "and --style off their defaults must agree; scaling flags are refused.");
ABSL_FLAG(int64_t, offset, 0, "rope/absolute: position of each sequence's first token.");
ABSL_FLAG(std::string, encoding, "sinusoidal", "absolute/table: sinusoidal or learned.");
ABSL_FLAG(std::string, table_name, "", "absolute/table: learned table name (see `tables`).");
ABSL_FLAG(std::string, sinusoidal_layout, "interleaved", "interleaved or concatenated.");
ABSL_FLAG(double, x_scale, 1, "absolute: x multiplier.");
ABSL_FLAG(int64_t, dim, 0, "table: d.");
ABSL_FLAG(int64_t, count, 0, "table: positions 0..count-1.");
ABSL_FLAG(int64_t, heads, 8, "bias: heads.");
ABSL_FLAG(int64_t, q_len, 16, "bias: query length.");
ABSL_FLAG(int64_t, k_len, 16, "bias: key length.");
ABSL_FLAG(std::string, form, "causal",
          "bias: causal (ALiBi: -m(i-j)), symmetric (-m|i-j|) or none (masks only).");
ABSL_FLAG(bool, causal, false, "bias: causal mask.");
ABSL_FLAG(int64_t, window, 0, "bias: sliding window (0 = off).");
ABSL_FLAG(std::string, k_lens, "",
          "bias: per-sequence key ends, e.g. 16,9 (right padding: keys j >= k_lens[b] masked); "
          "one value per sequence sets the batch.");
ABSL_FLAG(std::string, k_starts, "",
          "bias: per-sequence first real key, e.g. 0,7 (left padding: keys j < k_starts[b] "
          "masked); one value per sequence sets the batch.");
ABSL_FLAG(int64_t, png_head, 0, "bias: which head the PNG shows.");
ABSL_FLAG(std::string, input, "", "rope/absolute: .npy input (default: random).");
ABSL_FLAG(std::string, output, "", "Write the result as .npy here.");
ABSL_FLAG(std::string, png, "",
          "table/bias: write a PNG heatmap here (titled, axes numbered, colour bar; arrays "
          "past 1024 a side are block-averaged).");

#ifndef POSENC_VERSION
#define POSENC_VERSION "dev"
#endif

namespace posenc::cli {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A flag naming an enum value: any case, errors name the flag and the
// accepted values (wire::Parse).
template <typename Enum>
absl::StatusOr<Enum> EnumFlag(const char* name, const absl::Flag<std::string>& flag) {
  return wire::Parse<Enum>(absl::StrCat("--", name), absl::GetFlag(flag));
}

// An error from the server, as opposed to one of ours (flags, files): main()
// reports the two differently (exit 1 with the server's code, or exit 2).
constexpr absl::string_view kRemote = "posenc-cli/remote";
absl::Status Remote(absl::Status s) {
  if (!s.ok()) s.SetPayload(kRemote, absl::Cord("1"));
  return s;
}
template <typename T>
absl::StatusOr<T> Remote(absl::StatusOr<T> r) {
  if (!r.ok()) return Remote(r.status());
  return r;
}

// --shape, or nothing when --input brings its own shape.
absl::StatusOr<std::vector<int64_t>> ParseShape() {
  std::vector<int64_t> shape;
  if (!absl::GetFlag(FLAGS_input).empty()) return shape;
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_shape), ',', absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(d, &v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--shape: dimension ", shape.size(),
                                                     " must be a non-negative integer, got '",
                                                     absl::CHexEscape(d), "'"));
    }
    shape.push_back(v);
  }
  if (shape.empty()) return absl::InvalidArgumentError("--shape is required");
  return shape;
}

// The largest tensor the CLI builds: a protobuf message cannot exceed 2 GiB,
// so a bigger one could never be sent, and refusing it up front beats
// std::bad_alloc aborting the tool.
constexpr int64_t kMaxTensorBytes = int64_t{2} << 30;

// Elements in `shape`, checked before anything is allocated from it: no
// negative sizes, no overflow, at most kMaxTensorBytes of `dtype`. Zero
// dimensions count as 1 in the bound, so that [1e12, 0, 8, 64] cannot make
// the per-sequence offsets (shape[0] of them) huge either.
absl::StatusOr<int64_t> CheckedNumElements(absl::string_view what,
                                           const std::vector<int64_t>& shape, DType dtype) {
  const int64_t max_elements = kMaxTensorBytes / static_cast<int64_t>(SizeOf(dtype));
  int64_t n = 1;
  int64_t bound = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dimension ", i, " must be >= 0, got ", shape[i]));
    }
    if (__builtin_mul_overflow(bound, std::max<int64_t>(shape[i], 1), &bound) ||
        bound > max_elements) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shape ", ShapeString(shape), " of ",
                                                     DTypeName(dtype), " exceeds the ",
                                                     kMaxTensorBytes, "-byte tensor limit"));
    }
    n *= shape[i];  // n <= bound: cannot overflow
  }
  return n;
}

// The input tensor: --input .npy (converted to --dtype) or uniform random.
absl::StatusOr<std::string> InputData(DType dtype, std::vector<int64_t>* shape) {
  std::string bytes;
  const std::string path = absl::GetFlag(FLAGS_input);
  if (!path.empty()) {
    POSENC_ASSIGN_OR_RETURN(NpyArray a, ReadNpy(path));
    if (a.dtype != DType::kFloat32 && a.dtype != DType::kFloat16) {
      return absl::InvalidArgumentError(
          absl::StrCat("--input must hold float32, float16 or float64, got ", DTypeName(a.dtype)));
    }
    *shape = a.shape;
    POSENC_ASSIGN_OR_RETURN(const int64_t n,
                            CheckedNumElements(absl::StrCat("--input ", path), a.shape, dtype));
    bytes.resize(n * SizeOf(dtype));
    for (int64_t i = 0; i < n; ++i) {
      StoreElement(dtype, bytes.data(), i, LoadElement(a.dtype, a.data.data(), i));
    }
    return bytes;
  }
  POSENC_ASSIGN_OR_RETURN(const int64_t n, CheckedNumElements("random input", *shape, dtype));
  bytes.resize(n * SizeOf(dtype));
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < n; ++i) StoreElement(dtype, bytes.data(), i, u(rng));
  return bytes;
}

// Elements [first, first + count) of `data` (all of it by default) as doubles.
std::vector<double> AsDoubles(DType dtype, const std::string& data, size_t first = 0,
                              size_t count = SIZE_MAX) {
  std::vector<double> v(std::min(count, data.size() / SizeOf(dtype) - first));
  for (size_t i = 0; i < v.size(); ++i) v[i] = LoadElement(dtype, data.data(), first + i);
  return v;
}

absl::Status Output(DType dtype, const std::vector<int64_t>& shape, const std::string& data) {
  const std::string out = absl::GetFlag(FLAGS_output);
  if (!out.empty()) {
    POSENC_RETURN_IF_ERROR(WriteNpy(out, dtype, shape, data));
    std::printf("wrote %s %s\n", out.c_str(), ShapeString(shape).c_str());
  }
  return absl::OkStatus();
}

void PrintJson(const google::protobuf::Message& m) {
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(m, &json, o);
  std::cout << json;
}

absl::StatusOr<AbsoluteOptions> EncodingFlags() {
  AbsoluteOptions o;
  const std::string encoding = absl::AsciiStrToLower(absl::GetFlag(FLAGS_encoding));
  if (encoding == "learned") {
    o.kind = AbsoluteOptions::Kind::kLearned;
    o.table_name = absl::GetFlag(FLAGS_table_name);
  } else if (encoding != "sinusoidal") {
    return absl::InvalidArgumentError(
        absl::StrCat("--encoding must be one of sinusoidal, learned (any case); got '",
                     absl::GetFlag(FLAGS_encoding), "'"));
  }
  o.base = absl::GetFlag(FLAGS_base);
  POSENC_ASSIGN_OR_RETURN(o.sinusoidal_layout,
                          EnumFlag<SinusoidalLayout>("sinusoidal_layout", FLAGS_sinusoidal_layout));
  o.x_scale = absl::GetFlag(FLAGS_x_scale);
  return o;
}

// Per-sequence offsets (--offset) as an INT64 tensor over `batch` sequences.
TensorView Offsets(int64_t batch, std::vector<int64_t>* storage) {
  storage->assign(batch, absl::GetFlag(FLAGS_offset));
  return TensorView{DType::kInt64, {batch}, storage->data(), storage->size() * 8};
}

absl::Status Rope(Client& client, const CallOptions& call) {
  POSENC_ASSIGN_OR_RETURN(DType dtype, EnumFlag<DType>("dtype", FLAGS_dtype));
  RopeOptions o;
  POSENC_ASSIGN_OR_RETURN(o.layout, EnumFlag<RopeLayout>("layout", FLAGS_layout));
  POSENC_ASSIGN_OR_RETURN(o.style, EnumFlag<RopeStyle>("style", FLAGS_style));
  POSENC_ASSIGN_OR_RETURN(o.scaling.type, EnumFlag<ScalingType>("scaling", FLAGS_scaling));
  o.rotary_dim = absl::GetFlag(FLAGS_rotary_dim);
  o.base = absl::GetFlag(FLAGS_base);
  o.inverse = absl::GetFlag(FLAGS_inverse);
  if (absl::GetFlag(FLAGS_factor) > 0) o.scaling.factor = absl::GetFlag(FLAGS_factor);
  if (absl::GetFlag(FLAGS_original_max_position) > 0) {
    o.scaling.original_max_position = absl::GetFlag(FLAGS_original_max_position);
  }
  POSENC_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseShape());
  POSENC_ASSIGN_OR_RETURN(std::string q, InputData(dtype, &shape));
  if (const std::string path = absl::GetFlag(FLAGS_hf_config); !path.empty()) {
    // Resolved here, with the same code the server runs for hf_config.
    POSENC_ASSIGN_OR_RETURN(const std::string json, ReadFile(path));
    POSENC_ASSIGN_OR_RETURN(const wire::HfRope hf, wire::ResolveHfRope(json));
    // A flag off its default counts as given (this abseil keeps "specified
    // on the command line" private).
    auto given = [](const char* name) {
      const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
      return f != nullptr && f->CurrentValue() != f->DefaultValue();
    };
    wire::ExplicitRopeFields fields;
    fields.style = given("style");
    fields.rotary_dim = given("rotary_dim");
    fields.base = given("base");
    fields.scaling = given("scaling") || given("factor") || given("original_max_position");
    POSENC_RETURN_IF_ERROR(wire::MergeHfRope(hf, fields, shape.empty() ? 0 : shape.back(), &o));
  }
  const size_t rank = o.layout == RopeLayout::kTHD ? 3 : 4;
  if (shape.size() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: --layout=", wire::NameOf(o.layout), " needs a query of ",
                     rank == 3 ? "T,H,D" : "B,S,H,D (bshd) or B,H,S,D (bhsd)", " dimensions, got ",
                     ShapeString(shape)));
  }
  RopeTensors t;
  std::vector<int64_t> offsets;
  if (absl::GetFlag(FLAGS_offset) != 0) {
    if (o.layout == RopeLayout::kTHD) {
      return absl::InvalidArgumentError("--offset needs --layout=bshd or bhsd");
    }
    t.positions.offsets = Offsets(shape[0], &offsets);
  }
  t.query = MutableTensor{dtype, shape, q.data(), q.size()};
  std::string k;
  if (absl::GetFlag(FLAGS_key_heads) > 0) {
    std::vector<int64_t> kshape = shape;
    kshape[o.layout == RopeLayout::kBHSD ? 1 : kshape.size() - 2] = absl::GetFlag(FLAGS_key_heads);
    const std::string saved = absl::GetFlag(FLAGS_input);
    absl::SetFlag(&FLAGS_input, "");
    POSENC_ASSIGN_OR_RETURN(k, InputData(dtype, &kshape));
    absl::SetFlag(&FLAGS_input, saved);
    t.key = MutableTensor{dtype, kshape, k.data(), k.size()};
  }
  POSENC_RETURN_IF_ERROR(Remote(client.ApplyRope(o, t, call)));
  std::printf("rotated query %s%s\n", ShapeString(shape).c_str(),
              t.key.present() ? absl::StrCat(" and key ", ShapeString(t.key.shape)).c_str() : "");
  return Output(dtype, shape, q);
}

absl::Status Absolute(Client& client, const CallOptions& call) {
  POSENC_ASSIGN_OR_RETURN(DType dtype, EnumFlag<DType>("dtype", FLAGS_dtype));
  POSENC_ASSIGN_OR_RETURN(const AbsoluteOptions o, EncodingFlags());
  POSENC_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseShape());
  POSENC_ASSIGN_OR_RETURN(std::string x, InputData(dtype, &shape));
  AbsoluteTensors t;
  std::vector<int64_t> offsets;
  if (absl::GetFlag(FLAGS_offset) != 0) {
    if (shape.size() != 3) return absl::InvalidArgumentError("--offset needs x of B,S,D");
    t.positions.offsets = Offsets(shape[0], &offsets);
  }
  t.x = MutableTensor{dtype, shape, x.data(), x.size()};
  POSENC_RETURN_IF_ERROR(Remote(client.AddAbsoluteEncoding(o, t, call)));
  std::printf("encoded x %s\n", ShapeString(shape).c_str());
  return Output(dtype, shape, x);
}

std::string Number(double v) { return absl::StrFormat("%g", v); }

// What `table` asked for, in words, for the heatmap's title.
std::string TableTitle(const AbsoluteOptions& o) {
  if (o.kind == AbsoluteOptions::Kind::kLearned) {
    return absl::StrCat("learned encoding table '", o.table_name, "'");
  }
  return absl::StrCat("sinusoidal encoding table, ", wire::NameOf(o.sinusoidal_layout), ", base ",
                      Number(o.base));
}

absl::Status Table(Client& client, const CallOptions& call) {
  POSENC_ASSIGN_OR_RETURN(DType dtype, EnumFlag<DType>("dtype", FLAGS_dtype));
  POSENC_ASSIGN_OR_RETURN(const AbsoluteOptions o, EncodingFlags());
  POSENC_ASSIGN_OR_RETURN(ServerTensor table, Remote(client.EncodingTable(
                                                  o, absl::GetFlag(FLAGS_dim),
                                                  absl::GetFlag(FLAGS_count), {}, dtype, call)));
  const std::vector<int64_t>& shape = table.shape;
  std::printf("table %s\n", ShapeString(shape).c_str());
  const std::vector<double> v = AsDoubles(table.dtype, table.data);
  if (absl::GetFlag(FLAGS_output).empty() && absl::GetFlag(FLAGS_png).empty() && v.size() <= 256) {
    for (int64_t r = 0; r < shape[0]; ++r) {
      for (int64_t c = 0; c < shape[1]; ++c) std::printf("%12.8f", v[r * shape[1] + c]);
      std::printf("\n");
    }
  }
  POSENC_RETURN_IF_ERROR(Output(dtype, shape, table.data));
  if (!absl::GetFlag(FLAGS_png).empty()) {
    if (shape.size() != 2) {
      return Remote(absl::InternalError(
          absl::StrCat("the server answered a table of shape ", ShapeString(shape), ", not 2-D")));
    }
    HeatmapLabels labels;
    labels.title = absl::StrCat(TableTitle(o), ", ", absl::AsciiStrToLower(DTypeName(table.dtype)),
                                " ", ShapeString(shape));
    labels.row_axis = "position";
    labels.col_axis = "dimension";
    POSENC_RETURN_IF_ERROR(
        WriteHeatmapPng(absl::GetFlag(FLAGS_png), v, shape[0], shape[1], labels));
    std::printf("wrote %s\n", absl::GetFlag(FLAGS_png).c_str());
  }
  return absl::OkStatus();
}

// What `bias` asked for, in words, for the heatmap's title.
std::string BiasTitle(const BiasOptions& o) {
  std::string t;
  switch (o.form) {
    case BiasForm::kCausal:
      t = "ALiBi bias -m(i-j)";
      break;
    case BiasForm::kSymmetric:
      t = "symmetric ALiBi bias -m|i-j|";
      break;
    case BiasForm::kNone:
      t = "attention mask (no ALiBi)";
      break;
  }
  if (o.causal) absl::StrAppend(&t, ", causal mask");
  if (o.window > 0) absl::StrAppend(&t, ", window ", o.window);
  return t;
}

// A comma-separated list of integers (--k_lens, --k_starts) as an INT64
// [batch] tensor over `storage`; absent when the flag is empty. The values
// are the server's to judge; the CLI only parses them.
absl::StatusOr<TensorView> PerSequenceFlag(const char* name, const absl::Flag<std::string>& flag,
                                           std::vector<int64_t>* storage) {
  storage->clear();
  const std::string text = absl::GetFlag(flag);
  if (text.empty()) return TensorView{};
  for (absl::string_view v : absl::StrSplit(text, ',')) {
    int64_t x;
    if (!absl::SimpleAtoi(v, &x)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": value ", storage->size(),
                                                     " must be an integer, got '",
                                                     absl::CHexEscape(v), "'"));
    }
    storage->push_back(x);
  }
  return TensorView{
      DType::kInt64, {static_cast<int64_t>(storage->size())}, storage->data(), storage->size() * 8};
}

absl::Status Bias(Client& client, const CallOptions& call) {
  BiasOptions o;
  std::vector<int64_t> k_lens, k_starts;
  POSENC_ASSIGN_OR_RETURN(o.k_lens, PerSequenceFlag("k_lens", FLAGS_k_lens, &k_lens));
  POSENC_ASSIGN_OR_RETURN(o.k_starts, PerSequenceFlag("k_starts", FLAGS_k_starts, &k_starts));
  POSENC_ASSIGN_OR_RETURN(o.dtype, EnumFlag<DType>("dtype", FLAGS_dtype));
  POSENC_ASSIGN_OR_RETURN(o.form, EnumFlag<BiasForm>("form", FLAGS_form));
  o.num_heads = absl::GetFlag(FLAGS_heads);
  o.q_len = absl::GetFlag(FLAGS_q_len);
  o.k_len = absl::GetFlag(FLAGS_k_len);
  o.causal = absl::GetFlag(FLAGS_causal);
  o.window = absl::GetFlag(FLAGS_window);
  const DType dtype = o.dtype;
  const std::string png = absl::GetFlag(FLAGS_png);
  const int64_t head = absl::GetFlag(FLAGS_png_head);
  // Checked before the call: a bad flag should not cost a round trip.
  if (!png.empty() && (head < 0 || head >= o.num_heads)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--png_head must be in [0, --heads) = [0, ", o.num_heads, "), got ", head));
  }
  POSENC_ASSIGN_OR_RETURN(ServerTensor bias, Remote(client.AttentionBias(o, call)));
  const std::vector<int64_t>& shape = bias.shape;
  std::printf("bias %s slopes:", ShapeString(shape).c_str());
  for (double s : bias.slopes) std::printf(" %.6g", s);
  std::printf("\n");
  POSENC_RETURN_IF_ERROR(Output(dtype, shape, bias.data));
  if (!png.empty()) {
    if (shape.size() != 4 || shape[1] <= head) {
      return Remote(absl::InternalError(absl::StrCat("the server answered a bias of shape ",
                                                     ShapeString(shape), ", no head ", head)));
    }
    // Only the head drawn is converted: 8 bytes an entry adds up.
    const int64_t plane = shape[2] * shape[3];
    const std::vector<double> v = AsDoubles(bias.dtype, bias.data, head * plane, plane);
    HeatmapLabels labels;
    labels.title = absl::StrCat(BiasTitle(o), ", head ", head, " of ", shape[1]);
    if (static_cast<size_t>(head) < bias.slopes.size() && o.form != BiasForm::kNone) {
      absl::StrAppend(&labels.title, " (slope ", Number(bias.slopes[head]), ")");
    }
    absl::StrAppend(&labels.title, ", ", absl::AsciiStrToLower(DTypeName(bias.dtype)), " ",
                    ShapeString(shape));
    labels.row_axis = "query position";
    labels.col_axis = "key position";
    labels.neg_inf_meaning = "masked";
    POSENC_RETURN_IF_ERROR(WriteHeatmapPng(png, v, shape[2], shape[3], labels));
    std::printf("wrote %s (head %ld)\n", png.c_str(), static_cast<long>(head));
  }
  return absl::OkStatus();
}

absl::Status Run(const std::string& command) {
  ClientOptions o;
  o.target = absl::GetFlag(FLAGS_target);
  // Any TLS flag means TLS: a client certificate without --tls_ca checks
  // the server against the system's roots, never falls back to plaintext.
  const std::string ca = absl::GetFlag(FLAGS_tls_ca), cert = absl::GetFlag(FLAGS_tls_cert),
                    key = absl::GetFlag(FLAGS_tls_key);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together (mutual TLS needs both), got only one");
  }
  if (!ca.empty() || !cert.empty()) {
    o.use_tls = true;
    if (!ca.empty()) {
      POSENC_ASSIGN_OR_RETURN(o.root_certs_pem, ReadFile(ca));
    }
    if (!cert.empty()) {
      POSENC_ASSIGN_OR_RETURN(o.client_cert_pem, ReadFile(cert));
      POSENC_ASSIGN_OR_RETURN(o.client_key_pem, ReadFile(key));
    }
  }
  POSENC_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(o));
  CallOptions call;
  call.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  if (!absl::GetFlag(FLAGS_backend).empty()) {
    POSENC_ASSIGN_OR_RETURN(call.backend, EnumFlag<BackendChoice>("backend", FLAGS_backend));
  }
  if (command == "info") {
    POSENC_ASSIGN_OR_RETURN(v1::ServerInfo info, Remote(client->GetServerInfo(call)));
    PrintJson(info);
    return absl::OkStatus();
  }
  if (command == "tables" || command == "reload") {
    auto r = command == "tables" ? client->ListTables(call) : client->ReloadTables(call);
    if (!r.ok()) return Remote(r.status());
    PrintJson(*r);
    return absl::OkStatus();
  }
  if (command == "rope") return Rope(*client, call);
  if (command == "absolute") return Absolute(*client, call);
  if (command == "table") return Table(*client, call);
  if (command == "bias") return Bias(*client, call);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown command '", command, "'; one of info, tables, reload, rope, absolute, table, bias"));
}

}  // namespace
}  // namespace posenc::cli

namespace {

constexpr char kUsage[] =
    // Abseil's --help puts "posenc-cli: " in front.
    "call a posenc server from the command line.\n"
    "\n"
    "Usage: posenc-cli [--target=HOST:PORT] COMMAND [flags]\n"
    "\n"
    "Commands:\n"
    "  info      the server's version, build, backends and limits\n"
    "  tables    the learned tables the server holds\n"
    "  reload    make the server re-read its table directory\n"
    "  rope      rotate a query (and a key with --key_heads): --shape or --input\n"
    "  absolute  add a sinusoidal or learned encoding to x: --shape or --input\n"
    "  table     fetch an encoding table: --dim, --count; --png draws it\n"
    "  bias      build an ALiBi bias or mask: --heads, --q_len, --k_len; --png draws one "
    "head\n"
    "\n"
    "Examples:\n"
    "  posenc-cli table --dim=4 --count=4 --base=100\n"
    "  posenc-cli table --dim=1024 --count=128 --png=table.png\n"
    "  posenc-cli rope --shape=1,16,8,128 --dtype=bfloat16 --output=q.npy\n"
    "  posenc-cli bias --heads=8 --q_len=64 --k_len=64 --causal --window=16 --png=bias.png\n"
    "  posenc-cli bias --heads=4 --q_len=8 --k_len=8 --causal --k_starts=3,0  # left padding\n"
    "\n"
    "Errors: exit 2 for a bad flag or file (nothing sent), 1 when the server refuses.";

std::string VersionString() {
  return absl::StrCat("posenc-cli ", POSENC_VERSION, "\n",
#ifdef NDEBUG
                      "Release build (NDEBUG: assertions off)",
#else
                      "Debug build (assertions on)",
#endif
                      ", CUDA ", posenc::BuiltWithCuda() ? "compiled in" : "not compiled in",
                      ", compiler ", __VERSION__, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig usage;
  // --help lists this file's flags (Abseil's default matches the binary's
  // name against file names, which finds none for posenc-cli).
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "client/cli/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return VersionString(); };
  absl::SetFlagsUsageConfig(usage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "posenc-cli: %s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  absl::Status s = posenc::cli::Run(args[1]);
  if (s.ok()) return 0;
  if (s.GetPayload(posenc::cli::kRemote).has_value()) {
    std::fprintf(stderr, "posenc-cli: the server answered %s: %s\n",
                 absl::StatusCodeToString(s.code()).c_str(), std::string(s.message()).c_str());
    return 1;
  }
  // Ours: a flag, a file, a shape (no gRPC code; nothing was sent).
  std::fprintf(stderr, "posenc-cli: %s\n", std::string(s.message()).c_str());
  return 2;
}
