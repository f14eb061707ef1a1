#include "safetensors.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "posenc/dtype.h"

namespace posenc::server {
namespace {

// A header above this size is not a table file (HF caps headers at 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed safetensors: ", why));
}

}  // namespace

absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes,
                                                     absl::string_view stem) {
  if (bytes.size() < 8)
    return Malformed(absl::StrCat("file of ", bytes.size(), " bytes has no header"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8) {
    return Malformed(
        absl::StrCat("header length ", header_len, " exceeds the file (", bytes.size(), " bytes)"));
  }
  const absl::string_view data = bytes.substr(8 + header_len);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len).begin(),
                                                bytes.substr(8, header_len).end(), nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return Malformed("header is not a JSON object");

  SafetensorsContents out;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    auto skip = [&](absl::string_view why) {
      out.skipped.push_back(absl::StrCat(stem, "/", name, ": ", why));
    };
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2) {
      return Malformed(absl::StrCat("tensor '", name, "' lacks dtype, shape or data_offsets"));
    }
    std::vector<int64_t> shape;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned())
        return Malformed(absl::StrCat("tensor '", name, "' has a bad shape"));
      shape.push_back(d.get<int64_t>());
    }
    const auto& off = info["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Malformed(absl::StrCat("tensor '", name, "' has bad data_offsets"));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data.size()) {
      return Malformed(absl::StrCat("tensor '", name, "' data_offsets [", begin, ", ", end,
                                    ") exceed the data (", data.size(), " bytes)"));
    }
    const std::string dtype = info["dtype"].get<std::string>();
    DType dt;
    if (dtype == "F32") {
      dt = DType::kFloat32;
    } else if (dtype == "F16") {
      dt = DType::kFloat16;
    } else if (dtype == "BF16") {
      dt = DType::kBFloat16;
    } else {
      skip(absl::StrCat("dtype ", dtype, " is not F32, F16 or BF16"));
      continue;
    }
    if (shape.size() != 2) {
      skip(absl::StrCat("shape ", ShapeString(shape), " is not [max_positions, dim]"));
      continue;
    }
    if (shape[0] > 0 && shape[1] > (int64_t{1} << 40) / shape[0]) {
      return Malformed(absl::StrCat("tensor '", name, "' is too large"));
    }
    const uint64_t expected = static_cast<uint64_t>(shape[0] * shape[1]) * SizeOf(dt);
    if (end - begin != expected) {
      return Malformed(absl::StrCat("tensor '", name, "' has ", end - begin, " bytes but shape ",
                                    ShapeString(shape), " of ", dtype, " needs ", expected));
    }
    auto table = std::make_shared<LearnedTable>();
    table->name = absl::StrCat(stem, "/", name);
    table->rows = shape[0];
    table->dim = shape[1];
    table->source_dtype = dt;
    table->values.resize(shape[0] * shape[1]);
    const char* src = data.data() + begin;
    for (size_t i = 0; i < table->values.size(); ++i) table->values[i] = LoadElement(dt, src, i);
    out.tables.push_back(std::move(table));
  }
  return out;
}

std::string SerializeSafetensors(
    const std::vector<std::pair<std::string, const LearnedTable*>>& tables) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tables) {
    const uint64_t begin = data.size();
    data.append(reinterpret_cast<const char*>(t->values.data()), t->values.size() * 4);
    header[name] = {{"dtype", "F32"},
                    {"shape", {t->rows, t->dim}},
                    {"data_offsets", {begin, static_cast<uint64_t>(data.size())}}};
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // the format pads to 8 bytes
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h + data;
}

}  // namespace posenc::server
