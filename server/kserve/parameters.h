// The options of the KServe v2 models, read from a ModelInferRequest's
// `parameters` (InferParameter map) into the kernel library's option types.
// Enum names go through wire::Parse, so "gptj", "BHSD", "dynamic_ntk" mean
// what they mean to posenc.v1 clients and posenc-cli. Every name a model
// does not know is INVALID_ARGUMENT (a misspelt "rotary_dm" must not rotate
// silently with the default), as is a value of the wrong kind.
#ifndef POSENC_SERVER_KSERVE_PARAMETERS_H_
#define POSENC_SERVER_KSERVE_PARAMETERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kserve/grpc_service.pb.h"
#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/backend.h"
#include "posenc/rope.h"
#include "posenc/wire/hf_config.h"

namespace posenc::server::kserve {

using Parameters = google::protobuf::Map<std::string, inference::InferParameter>;

// Bounds on what a request's parameters may hold, checked before anything
// is parsed or copied out of them. A model reads under thirty parameters,
// and every other one is refused (Finish), so more than kMaxParameters is
// refused at once. The longest string a model reads is an hf_config (at
// most wire::kMaxHfConfigBytes) or a list of kMaxHeads slopes, each a
// double to 17 digits: 2 MiB holds either.
inline constexpr int kMaxParameters = 64;
inline constexpr size_t kMaxParameterBytes = size_t{2} << 20;
// INVALID_ARGUMENT when `parameters` has more than kMaxParameters entries.
[[nodiscard]] absl::Status CheckParameterCount(const Parameters& parameters);

// Reads named parameters of one request, remembering which were read, so
// that Finish can refuse the rest. Errors name the parameter, what it must
// be and what came.
class ParameterReader {
 public:
  explicit ParameterReader(const Parameters& parameters) : parameters_(parameters) {}

  // Each leaves *out alone when the parameter is absent. Numbers may come
  // as int64, uint64, double or string parameters ("1e6": tritonclient
  // before 2.41 sends no doubles); integers must be whole.
  [[nodiscard]] absl::Status Double(absl::string_view name, double* out);
  [[nodiscard]] absl::Status Double(absl::string_view name, std::optional<double>* out);
  [[nodiscard]] absl::Status Int(absl::string_view name, int64_t* out);
  [[nodiscard]] absl::Status Int(absl::string_view name, std::optional<int64_t>* out);
  [[nodiscard]] absl::Status Bool(absl::string_view name, bool* out);
  // Strings of at most kMaxParameterBytes.
  [[nodiscard]] absl::Status String(absl::string_view name, std::string* out);
  // A list of at most `max_items` numbers as a string "0.5,1,2"
  // (InferParameter has no lists); more is refused before any is parsed.
  [[nodiscard]] absl::Status Doubles(absl::string_view name, size_t max_items,
                                     std::vector<double>* out);
  // A list of at most `max_items` integers as a string "16,24,24".
  [[nodiscard]] absl::Status Ints(absl::string_view name, size_t max_items,
                                  std::vector<int64_t>* out);
  // An enum by name, through wire::Parse.
  template <typename Enum>
  [[nodiscard]] absl::Status Enum(absl::string_view name, Enum* out);

  // INVALID_ARGUMENT naming the first parameter never read (Triton's
  // reserved scheduling parameters, which mean nothing here, are ignored).
  [[nodiscard]] absl::Status Finish(absl::string_view model) const;
  // Whether `name` was asked for.
  bool WasRead(absl::string_view name) const;

  // Whether the request carries the parameter (read or not).
  bool Has(absl::string_view name) const { return parameters_.contains(std::string(name)); }

 private:
  const inference::InferParameter* Find(absl::string_view name);
  // A string parameter's text, in the request (empty when absent).
  [[nodiscard]] absl::Status Text(absl::string_view name, absl::string_view* out);
  // Text split at commas, at most `max_items` items (empty when absent).
  [[nodiscard]] absl::Status Items(absl::string_view name, size_t max_items,
                                   std::vector<absl::string_view>* items);
  const Parameters& parameters_;
  std::vector<std::string> read_;
};

// What each model reads (the names are listed in docs/kserve.md "Triton / KServe v2
// clients"). `backend` is the "backend" parameter (default: the server's).
// The rope model's "hf_config" (a model's HF config.json as a string) is
// resolved by wire::ResolveHfRope and merged as for posenc.v1's hf_config
// (wire::MergeHfRope); `query_head_dim` (> 0: the query's last dimension)
// must then be the config's head_dim.
// The rope parameters that make up its scaling: all of them are the
// config's business beside an hf_config.
inline constexpr absl::string_view kRopeScalingParameters[] = {
    "scaling",     "factor",          "original_max_position", "beta_fast",
    "beta_slow",   "mscale",          "mscale_all_dim",        "attention_factor",
    "truncate",    "low_freq_factor", "high_freq_factor",      "short_factor",
    "long_factor", "longrope_mode"};
// Which RoPE options `p` gives itself, for wire::MergeHfRope: the one rule of
// what may stand beside an hf_config, shared by requests and model files.
wire::ExplicitRopeFields ExplicitRopeFieldsOf(const ParameterReader& p);

[[nodiscard]] absl::Status ReadRopeOptions(ParameterReader& p, RopeOptions* o,
                                           BackendChoice* backend, int64_t query_head_dim = 0);
[[nodiscard]] absl::Status ReadAbsoluteOptions(ParameterReader& p, bool learned, AbsoluteOptions* o,
                                               BackendChoice* backend);
// Everything but the k_lens / k_starts tensors, which are inputs.
[[nodiscard]] absl::Status ReadBiasOptions(ParameterReader& p, BiasOptions* o,
                                           BackendChoice* backend);

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_PARAMETERS_H_
