// Typed, hostile-input-safe reads of an HF config parsed into a
// google.protobuf.Struct: every error names the field as a JSON path and
// says what it must be and what came. Private to hf_config.cc.
#ifndef POSENC_WIRE_SRC_HF_FIELDS_H_
#define POSENC_WIRE_SRC_HF_FIELDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"

namespace posenc::wire::hf {

// Parses `json` (size and nesting capped before the parser sees it) into
// *out. The top level must be an object.
[[nodiscard]] absl::Status ParseConfig(absl::string_view json, google::protobuf::Struct* out);

// The fields of one JSON object, or of two: `primary` first, then
// `fallback` (a multimodal config's text_config, then its top level).
// Absent and null read the same: nullopt (HF treats a null as unset).
class Fields {
 public:
  Fields(const google::protobuf::Struct* primary, std::string primary_path,
         const google::protobuf::Struct* fallback = nullptr, std::string fallback_path = "")
      : primary_(primary),
        fallback_(fallback),
        primary_path_(std::move(primary_path)),
        fallback_path_(std::move(fallback_path)) {}

  [[nodiscard]] absl::StatusOr<std::optional<double>> Number(absl::string_view key) const;
  // A whole number in [0, 2^53] (JSON numbers are doubles).
  [[nodiscard]] absl::StatusOr<std::optional<int64_t>> Integer(absl::string_view key) const;
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> String(absl::string_view key) const;
  [[nodiscard]] absl::StatusOr<std::optional<bool>> Bool(absl::string_view key) const;
  [[nodiscard]] absl::StatusOr<std::optional<std::vector<double>>> Numbers(
      absl::string_view key) const;
  [[nodiscard]] absl::StatusOr<std::optional<std::vector<int64_t>>> Integers(
      absl::string_view key) const;
  // nullptr when absent or null; *path (if given) is where it was found.
  [[nodiscard]] absl::StatusOr<const google::protobuf::Struct*> Object(
      absl::string_view key, std::string* path = nullptr) const;
  // Present with the value null (HF's get(key, default) gives None, not the
  // default, for these).
  bool IsNull(absl::string_view key) const;
  // The path an error about `key` names.
  std::string Path(absl::string_view key) const;
  const google::protobuf::Struct* primary() const { return primary_; }

 private:
  // The value and the path it was found at; nullptr when absent or null.
  const google::protobuf::Value* Find(absl::string_view key, std::string* path) const;

  const google::protobuf::Struct* primary_;
  const google::protobuf::Struct* fallback_;
  std::string primary_path_, fallback_path_;
};

}  // namespace posenc::wire::hf

#endif  // POSENC_WIRE_SRC_HF_FIELDS_H_
