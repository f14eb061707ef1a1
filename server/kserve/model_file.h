// One model file of the KServe model repository (--model_dir): a small JSON
// object naming an operation and fixing some of its parameters, e.g.
// llama-3.1-8b-rope.json:
//
//   {"operation": "rope", "head_dim": 128,
//    "description": "Llama 3.1 8B (llama3 scaling)",
//    "parameters": {"base": 500000, "scaling": "llama3", "factor": 8, ...}}
//
// `parameters` takes exactly the request parameter names of the built-in
// model of that operation (kserve/parameters.h; docs/kserve.md "Triton / KServe v2
// clients"), with JSON values: numbers, strings, booleans, and arrays of
// numbers for the list parameters (short_factor, sections, slopes, ...).
// The model's name is the file's name without ".json". `inputs`, when
// given, lists the operation's inputs the model takes, each then required
// (perf_analyzer with --shared-memory=system refuses models with optional
// inputs): {"operation": "sinusoidal", "inputs": ["x"]}.
//
// Files come from a volume replicas share, so they are hostile input: the
// parser bounds the size, refuses unknown keys by name, wrong types,
// non-finite numbers and names outside [A-Za-z0-9._-] (at most 64, starting
// with a letter or digit), and checks the parameters with the same readers a
// request goes through, so a file that loads only fixes values a request
// could have given.
#ifndef POSENC_SERVER_KSERVE_MODEL_FILE_H_
#define POSENC_SERVER_KSERVE_MODEL_FILE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kserve/models.h"

namespace posenc::server::kserve {

// Files larger than this are refused unread: real ones are a few hundred
// bytes; LongRoPE's two factor lists of 64 numbers stay under 4 KiB.
inline constexpr int64_t kMaxModelFileBytes = 64 << 10;
inline constexpr size_t kMaxModelNameBytes = 64;

// INVALID_ARGUMENT unless `name` is a valid repository model name.
[[nodiscard]] absl::Status CheckModelName(absl::string_view name);

// The model `json` describes, named `name`. INVALID_ARGUMENT naming the
// key, what it must be and what came.
[[nodiscard]] absl::StatusOr<Model> ParseModelFile(absl::string_view name, absl::string_view json);

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_MODEL_FILE_H_
