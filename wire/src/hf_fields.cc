#include "hf_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "posenc/wire/hf_config.h"

namespace posenc::wire::hf {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

// 2^53: every integer up to it is exact in a double.
constexpr double kMaxExactInteger = 9007199254740992.0;
// A list longer than any head's rotary_dim/2 is refused before it is copied.
constexpr int kMaxListLength = 1 << 16;

const char* KindName(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return "a number";
    case Value::kStringValue:
      return "a string";
    case Value::kBoolValue:
      return "a bool";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "a list";
    default:
      return "nothing";
  }
}

absl::Status WrongKind(absl::string_view path, absl::string_view want, const Value& v) {
  return absl::InvalidArgumentError(absl::StrCat(path, " must be ", want, ", got ", KindName(v)));
}

absl::StatusOr<int64_t> WholeNumber(absl::string_view path, const Value& v) {
  if (v.kind_case() != Value::kNumberValue) return WrongKind(path, "an integer", v);
  const double d = v.number_value();
  if (!(d >= 0 && d <= kMaxExactInteger) || std::floor(d) != d) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " must be a whole number in [0, 2^53], got ", d));
  }
  return static_cast<int64_t>(d);
}

// The deepest nesting of objects and arrays, scanning outside strings; stops
// counting once past `limit`, so the scan is linear and never recurses.
int NestingDepth(absl::string_view json, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : json) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

absl::Status ParseConfig(absl::string_view json, Struct* out) {
  if (json.size() > kMaxHfConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat("hf_config must be at most ", kMaxHfConfigBytes,
                                                   " bytes of JSON, got ", json.size()));
  }
  // protobuf's parser recurses per level; a deep "[[[[..." is refused here
  // before it reaches it (real configs nest 3 or 4 levels).
  if (const int depth = NestingDepth(json, kMaxHfConfigDepth); depth > kMaxHfConfigDepth) {
    return absl::InvalidArgumentError(absl::StrCat("hf_config must nest objects and lists at most ",
                                                   kMaxHfConfigDepth, " deep, got more"));
  }
  // Debian's protobuf (3.21) speaks StringPiece and util::Status here.
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), out);
  if (!parsed.ok()) {
    const auto message = parsed.message();
    return absl::InvalidArgumentError(
        absl::StrCat("hf_config must be a JSON object (a model's config.json or its RoPE fields): ",
                     absl::string_view(message.data(), std::min<size_t>(message.size(), 200))));
  }
  return absl::OkStatus();
}

std::string Fields::Path(absl::string_view key) const {
  return absl::StrCat(primary_path_, ".", key);
}

const Value* Fields::Find(absl::string_view key, std::string* path) const {
  for (auto [s, prefix] : {std::pair{primary_, &primary_path_}, {fallback_, &fallback_path_}}) {
    if (s == nullptr) continue;
    auto it = s->fields().find(std::string(key));
    if (it == s->fields().end() || it->second.kind_case() == Value::kNullValue ||
        it->second.kind_case() == Value::KIND_NOT_SET) {
      continue;
    }
    *path = absl::StrCat(*prefix, ".", key);
    return &it->second;
  }
  return nullptr;
}

absl::StatusOr<std::optional<double>> Fields::Number(absl::string_view key) const {
  std::string path;
  const Value* v = Find(key, &path);
  if (v == nullptr) return std::nullopt;
  if (v->kind_case() != Value::kNumberValue) return WrongKind(path, "a number", *v);
  return v->number_value();
}

absl::StatusOr<std::optional<int64_t>> Fields::Integer(absl::string_view key) const {
  std::string path;
  const Value* v = Find(key, &path);
  if (v == nullptr) return std::nullopt;
  absl::StatusOr<int64_t> n = WholeNumber(path, *v);
  if (!n.ok()) return n.status();
  return *n;
}

absl::StatusOr<std::optional<std::string>> Fields::String(absl::string_view key) const {
  std::string path;
  const Value* v = Find(key, &path);
  if (v == nullptr) return std::nullopt;
  if (v->kind_case() != Value::kStringValue) return WrongKind(path, "a string", *v);
  return v->string_value();
}

absl::StatusOr<std::optional<bool>> Fields::Bool(absl::string_view key) const {
  std::string path;
  const Value* v = Find(key, &path);
  if (v == nullptr) return std::nullopt;
  if (v->kind_case() != Value::kBoolValue) return WrongKind(path, "true or false", *v);
  return v->bool_value();
}

absl::StatusOr<std::optional<std::vector<double>>> Fields::Numbers(absl::string_view key) const {
  std::string path;
  const Value* v = Find(key, &path);
  if (v == nullptr) return std::nullopt;
  if (v->kind_case() != Value::kListValue) return WrongKind(path, "a list of numbers", *v);
  const auto& items = v->list_value().values();
  if (items.size() > kMaxListLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " must have at most ", kMaxListLength, " values, got ", items.size()));
  }
  std::vector<double> out;
  out.reserve(items.size());
  for (int i = 0; i < items.size(); ++i) {
    if (items[i].kind_case() != Value::kNumberValue) {
      return WrongKind(absl::StrCat(path, "[", i, "]"), "a number", items[i]);
    }
    out.push_back(items[i].number_value());
  }
  return out;
}

absl::StatusOr<std::optional<std::vector<int64_t>>> Fields::Integers(absl::string_view key) const {
  std::string path;
  const Value* v = Find(key, &path);
  if (v == nullptr) return std::nullopt;
  if (v->kind_case() != Value::kListValue) return WrongKind(path, "a list of integers", *v);
  const auto& items = v->list_value().values();
  if (items.size() > kMaxListLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " must have at most ", kMaxListLength, " values, got ", items.size()));
  }
  std::vector<int64_t> out;
  out.reserve(items.size());
  for (int i = 0; i < items.size(); ++i) {
    absl::StatusOr<int64_t> n = WholeNumber(absl::StrCat(path, "[", i, "]"), items[i]);
    if (!n.ok()) return n.status();
    out.push_back(*n);
  }
  return out;
}

absl::StatusOr<const Struct*> Fields::Object(absl::string_view key, std::string* found) const {
  std::string path;
  const Value* v = Find(key, &path);
  if (v == nullptr) return nullptr;
  if (v->kind_case() != Value::kStructValue) return WrongKind(path, "an object", *v);
  if (found != nullptr) *found = path;
  return &v->struct_value();
}

bool Fields::IsNull(absl::string_view key) const {
  auto it = primary_->fields().find(std::string(key));
  return it != primary_->fields().end() && it->second.kind_case() == Value::kNullValue;
}

}  // namespace posenc::wire::hf
