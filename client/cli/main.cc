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
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "heatmap.h"
#include "npy.h"
#include "posenc/client.h"
#include "posenc/status_macros.h"

ABSL_FLAG(std::string, target, "localhost:50051", "Server address, or dns:///name:port.");
ABSL_FLAG(double, timeout_s, 30, "Call deadline in seconds.");
ABSL_FLAG(std::string, tls_ca, "", "PEM file of CA certificates; enables TLS.");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS.");
ABSL_FLAG(std::string, tls_key, "", "PEM client key for mutual TLS.");
ABSL_FLAG(std::string, backend, "", "auto, cpu or cuda (default: the server's).");
ABSL_FLAG(std::string, dtype, "float32", "float32, float16 or bfloat16.");
ABSL_FLAG(std::string, shape, "",
          "rope: B,S,H,D (BSHD/BHSD order) or T,H,D; absolute: B,S,D or T,D.");
ABSL_FLAG(int64_t, key_heads, 0, "rope: also rotate a random key with this many heads.");
ABSL_FLAG(std::string, layout, "bshd", "rope: bshd, bhsd or thd.");
ABSL_FLAG(std::string, style, "neox", "rope: neox or gptj.");
ABSL_FLAG(int64_t, rotary_dim, 0, "rope: rotary dims (0 = head_dim).");
ABSL_FLAG(double, base, 10000, "RoPE theta / sinusoidal base.");
ABSL_FLAG(bool, inverse, false, "rope: rotate by -angle.");
ABSL_FLAG(std::string, scaling, "none", "rope: none, linear, dynamic, yarn, llama3.");
ABSL_FLAG(double, factor, 0, "rope scaling factor (0 = the type's default).");
ABSL_FLAG(int64_t, original_max_position, 0, "rope scaling original context (0 = default).");
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
ABSL_FLAG(std::string, form, "causal", "bias: none, causal or symmetric.");
ABSL_FLAG(bool, causal, false, "bias: causal mask.");
ABSL_FLAG(int64_t, window, 0, "bias: sliding window (0 = off).");
ABSL_FLAG(int64_t, png_head, 0, "bias: which head the PNG shows.");
ABSL_FLAG(std::string, input, "", "rope/absolute: .npy input (default: random).");
ABSL_FLAG(std::string, output, "", "Write the result as .npy here.");
ABSL_FLAG(std::string, png, "", "table/bias: write a PNG heatmap here.");

namespace posenc::cli {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

absl::StatusOr<DType> ParseDType(std::string s) {
  s = absl::AsciiStrToLower(s);
  if (s == "float32" || s == "f32" || s == "fp32") return DType::kFloat32;
  if (s == "float16" || s == "f16" || s == "fp16") return DType::kFloat16;
  if (s == "bfloat16" || s == "bf16") return DType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype must be float32, float16 or bfloat16, got ", s));
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

v1::Backend BackendFlag() {
  const std::string b = absl::AsciiStrToLower(absl::GetFlag(FLAGS_backend));
  if (b == "cpu") return v1::BACKEND_CPU;
  if (b == "cuda") return v1::BACKEND_CUDA;
  if (b == "auto") return v1::BACKEND_AUTO;
  return v1::BACKEND_UNSPECIFIED;
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

std::vector<double> AsDoubles(DType dtype, const std::string& data) {
  std::vector<double> v(data.size() / SizeOf(dtype));
  for (size_t i = 0; i < v.size(); ++i) v[i] = LoadElement(dtype, data.data(), i);
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

template <typename Setter>
void SetEncoding(Setter* req) {
  if (absl::GetFlag(FLAGS_encoding) == "learned") {
    req->mutable_learned()->set_table_name(absl::GetFlag(FLAGS_table_name));
  } else {
    auto* s = req->mutable_sinusoidal();
    s->set_base(absl::GetFlag(FLAGS_base));
    s->set_layout(absl::GetFlag(FLAGS_sinusoidal_layout) == "concatenated"
                      ? v1::SINUSOIDAL_LAYOUT_CONCATENATED
                      : v1::SINUSOIDAL_LAYOUT_INTERLEAVED);
  }
}

absl::Status Rope(Client& client, const CallOptions& call) {
  POSENC_ASSIGN_OR_RETURN(DType dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  POSENC_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseShape());
  POSENC_ASSIGN_OR_RETURN(std::string q, InputData(dtype, &shape));
  // The offsets and the key's shape below index the leading dimensions.
  if (shape.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope: the query needs B,S,H,D, B,H,S,D or T,H,D dimensions, got ", ShapeString(shape)));
  }
  v1::RopeRequest req;
  const std::string layout = absl::GetFlag(FLAGS_layout);
  req.set_layout(layout == "thd"    ? v1::ROPE_LAYOUT_THD
                 : layout == "bhsd" ? v1::ROPE_LAYOUT_BHSD
                                    : v1::ROPE_LAYOUT_BSHD);
  req.set_style(absl::GetFlag(FLAGS_style) == "gptj" ? v1::ROPE_STYLE_GPTJ : v1::ROPE_STYLE_NEOX);
  req.set_rotary_dim(absl::GetFlag(FLAGS_rotary_dim));
  req.set_base(absl::GetFlag(FLAGS_base));
  req.set_inverse(absl::GetFlag(FLAGS_inverse));
  req.set_backend(BackendFlag());
  const std::string scaling = absl::GetFlag(FLAGS_scaling);
  v1::RopeScaling* s = req.mutable_scaling();
  if (scaling == "linear")
    s->set_type(v1::SCALING_TYPE_LINEAR);
  else if (scaling == "dynamic")
    s->set_type(v1::SCALING_TYPE_DYNAMIC_NTK);
  else if (scaling == "yarn")
    s->set_type(v1::SCALING_TYPE_YARN);
  else if (scaling == "llama3")
    s->set_type(v1::SCALING_TYPE_LLAMA3);
  else if (scaling != "none")
    return absl::InvalidArgumentError("--scaling: none, linear, dynamic, yarn or llama3");
  if (absl::GetFlag(FLAGS_factor) > 0) s->set_factor(absl::GetFlag(FLAGS_factor));
  if (absl::GetFlag(FLAGS_original_max_position) > 0) {
    s->set_original_max_position(absl::GetFlag(FLAGS_original_max_position));
  }
  if (absl::GetFlag(FLAGS_offset) != 0 && layout != "thd") {
    std::vector<int64_t> off(shape[0], absl::GetFlag(FLAGS_offset));
    SetTensor(TensorView{DType::kInt64, {shape[0]}, off.data(), off.size() * 8},
              req.mutable_offsets());
  }
  MutableTensor query{dtype, shape, q.data(), q.size()};
  MutableTensor key;
  std::string k;
  if (absl::GetFlag(FLAGS_key_heads) > 0) {
    std::vector<int64_t> kshape = shape;
    kshape[layout == "bhsd" ? 1 : kshape.size() - 2] = absl::GetFlag(FLAGS_key_heads);
    const std::string saved = absl::GetFlag(FLAGS_input);
    absl::SetFlag(&FLAGS_input, "");
    POSENC_ASSIGN_OR_RETURN(k, InputData(dtype, &kshape));
    absl::SetFlag(&FLAGS_input, saved);
    key = MutableTensor{dtype, kshape, k.data(), k.size()};
  }
  POSENC_RETURN_IF_ERROR(client.ApplyRope(req, query, key, call));
  std::printf("rotated query %s%s\n", ShapeString(shape).c_str(),
              key.present() ? absl::StrCat(" and key ", ShapeString(key.shape)).c_str() : "");
  return Output(dtype, shape, q);
}

absl::Status Absolute(Client& client, const CallOptions& call) {
  POSENC_ASSIGN_OR_RETURN(DType dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  POSENC_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseShape());
  POSENC_ASSIGN_OR_RETURN(std::string x, InputData(dtype, &shape));
  v1::AbsoluteEncodingRequest req;
  SetEncoding(&req);
  req.set_x_scale(absl::GetFlag(FLAGS_x_scale));
  req.set_backend(BackendFlag());
  if (absl::GetFlag(FLAGS_offset) != 0 && shape.size() == 3) {
    std::vector<int64_t> off(shape[0], absl::GetFlag(FLAGS_offset));
    SetTensor(TensorView{DType::kInt64, {shape[0]}, off.data(), off.size() * 8},
              req.mutable_offsets());
  }
  POSENC_RETURN_IF_ERROR(
      client.AddAbsoluteEncoding(req, MutableTensor{dtype, shape, x.data(), x.size()}, call));
  std::printf("encoded x %s\n", ShapeString(shape).c_str());
  return Output(dtype, shape, x);
}

absl::Status Table(Client& client, const CallOptions& call) {
  POSENC_ASSIGN_OR_RETURN(DType dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  v1::EncodingTableRequest req;
  SetEncoding(&req);
  req.set_dim(absl::GetFlag(FLAGS_dim));
  req.set_count(absl::GetFlag(FLAGS_count));
  req.set_dtype(static_cast<v1::DataType>(static_cast<int>(dtype)));
  req.set_backend(BackendFlag());
  POSENC_ASSIGN_OR_RETURN(v1::EncodingTableResponse resp, client.GetEncodingTable(req, call));
  const std::vector<int64_t> shape(resp.table().shape().begin(), resp.table().shape().end());
  std::printf("table %s\n", ShapeString(shape).c_str());
  const std::vector<double> v = AsDoubles(dtype, resp.table_data());
  if (absl::GetFlag(FLAGS_output).empty() && absl::GetFlag(FLAGS_png).empty() && v.size() <= 256) {
    for (int64_t r = 0; r < shape[0]; ++r) {
      for (int64_t c = 0; c < shape[1]; ++c) std::printf("%12.8f", v[r * shape[1] + c]);
      std::printf("\n");
    }
  }
  POSENC_RETURN_IF_ERROR(Output(dtype, shape, resp.table_data()));
  if (!absl::GetFlag(FLAGS_png).empty()) {
    POSENC_RETURN_IF_ERROR(WriteHeatmapPng(absl::GetFlag(FLAGS_png), v, shape[0], shape[1]));
    std::printf("wrote %s\n", absl::GetFlag(FLAGS_png).c_str());
  }
  return absl::OkStatus();
}

absl::Status Bias(Client& client, const CallOptions& call) {
  POSENC_ASSIGN_OR_RETURN(DType dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  v1::AttentionBiasRequest req;
  const std::string form = absl::GetFlag(FLAGS_form);
  req.set_form(form == "none"        ? v1::BIAS_FORM_NONE
               : form == "symmetric" ? v1::BIAS_FORM_SYMMETRIC
                                     : v1::BIAS_FORM_CAUSAL);
  req.set_num_heads(absl::GetFlag(FLAGS_heads));
  req.set_q_len(absl::GetFlag(FLAGS_q_len));
  req.set_k_len(absl::GetFlag(FLAGS_k_len));
  req.set_causal(absl::GetFlag(FLAGS_causal));
  req.set_window(absl::GetFlag(FLAGS_window));
  req.set_dtype(static_cast<v1::DataType>(static_cast<int>(dtype)));
  req.set_backend(BackendFlag());
  POSENC_ASSIGN_OR_RETURN(v1::AttentionBiasResponse resp, client.AttentionBias(req, call));
  const std::vector<int64_t> shape(resp.bias().shape().begin(), resp.bias().shape().end());
  std::printf("bias %s slopes:", ShapeString(shape).c_str());
  for (double s : resp.slopes()) std::printf(" %.6g", s);
  std::printf("\n");
  POSENC_RETURN_IF_ERROR(Output(dtype, shape, resp.bias_data()));
  if (!absl::GetFlag(FLAGS_png).empty()) {
    const int64_t h = absl::GetFlag(FLAGS_png_head);
    if (h < 0 || h >= shape[1]) return absl::InvalidArgumentError("--png_head out of range");
    const std::vector<double> all = AsDoubles(dtype, resp.bias_data());
    const int64_t plane = shape[2] * shape[3];
    std::vector<double> v(all.begin() + h * plane, all.begin() + (h + 1) * plane);
    POSENC_RETURN_IF_ERROR(WriteHeatmapPng(absl::GetFlag(FLAGS_png), v, shape[2], shape[3]));
    std::printf("wrote %s (head %ld)\n", absl::GetFlag(FLAGS_png).c_str(), static_cast<long>(h));
  }
  return absl::OkStatus();
}

absl::Status Run(const std::string& command) {
  ClientOptions o;
  o.target = absl::GetFlag(FLAGS_target);
  if (!absl::GetFlag(FLAGS_tls_ca).empty()) {
    o.use_tls = true;
    POSENC_ASSIGN_OR_RETURN(o.root_certs_pem, ReadFile(absl::GetFlag(FLAGS_tls_ca)));
    if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
      POSENC_ASSIGN_OR_RETURN(o.client_cert_pem, ReadFile(absl::GetFlag(FLAGS_tls_cert)));
      POSENC_ASSIGN_OR_RETURN(o.client_key_pem, ReadFile(absl::GetFlag(FLAGS_tls_key)));
    }
  }
  POSENC_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(o));
  CallOptions call;
  call.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  if (command == "info") {
    POSENC_ASSIGN_OR_RETURN(v1::ServerInfo info, client->GetServerInfo(call));
    PrintJson(info);
    return absl::OkStatus();
  }
  if (command == "tables" || command == "reload") {
    auto r = command == "tables" ? client->ListTables(call) : client->ReloadTables(call);
    if (!r.ok()) return r.status();
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

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "posenc-cli [--target=HOST:PORT] COMMAND [flags]\n"
      "  info | tables | reload | rope | absolute | table | bias\n"
      "Examples:\n"
      "  posenc-cli table --dim=4 --count=4 --base=100\n"
      "  posenc-cli rope --shape=1,16,8,128 --dtype=bfloat16 --output=q.npy\n"
      "  posenc-cli bias --heads=8 --q_len=64 --k_len=64 --causal --window=16 --png=bias.png");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  absl::Status s = posenc::cli::Run(args[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "posenc-cli: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
