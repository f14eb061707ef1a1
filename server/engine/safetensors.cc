#include "engine/safetensors.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/no_throw.h"
#include "engine/safetensors_header.h"
#include "nlohmann/json.hpp"
#include "posenc/dtype.h"
#include "posenc/status_macros.h"

namespace posenc::server {
namespace {

using safetensors::Quoted;
using safetensors::ReadHeader;
using safetensors::ShapeText;
using safetensors::TensorSpec;

// skipped() lines travel in every ListTables reply: a checkpoint with many
// non-table tensors lists this many and counts the rest.
constexpr size_t kMaxSkippedPerFile = 16;

// Why a well-formed tensor cannot be a table, or nullopt if it can.
std::optional<std::string> WhyNotTable(const TensorSpec& s, const SafetensorsLimits& limits) {
  if (!s.dtype->table) return absl::StrCat("dtype ", s.dtype->name, " is not F32, F16 or BF16");
  if (s.shape.size() != 2) {
    return absl::StrCat("shape ", ShapeText(s.shape), " is not [max_positions, dim]");
  }
  if (s.shape[0] == 0 || s.shape[1] == 0) {
    return absl::StrCat("shape ", ShapeText(s.shape), " is empty");
  }
  if (s.shape[0] > limits.max_table_rows) {
    return absl::StrCat(s.shape[0], " rows are over the limit of ", limits.max_table_rows);
  }
  if (s.shape[1] > limits.max_table_dim) {
    return absl::StrCat("dim ", s.shape[1], " is over the limit of ", limits.max_table_dim);
  }
  return std::nullopt;
}

// The skipped tensors of one file, listed up to kMaxSkippedPerFile.
class SkipList {
 public:
  SkipList(absl::string_view stem, std::vector<std::string>* out) : stem_(stem), out_(out) {}
  // Adds the count of the unlisted ones, if any.
  void Finish() {
    if (unlisted_ > 0) {
      out_->push_back(absl::StrCat(Quoted(stem_), ": ", unlisted_, " more tensors skipped"));
    }
  }
  void Add(absl::string_view tensor, absl::string_view why) {
    if (out_->size() >= kMaxSkippedPerFile) {
      ++unlisted_;
      return;
    }
    out_->push_back(absl::StrCat(Quoted(absl::StrCat(stem_, "/", tensor)), ": ", why));
  }

 private:
  absl::string_view stem_;
  std::vector<std::string>* out_;
  size_t unlisted_ = 0;
};

// Converts to float32. A NaN or infinity would silently poison every request
// that reads the table, and no trained embedding holds one, so such tensors
// are skipped (nullptr, with `why` set).
std::shared_ptr<LearnedTable> Materialize(const TensorSpec& s, absl::string_view data,
                                          absl::string_view stem, std::string* why) {
  auto table = std::make_shared<LearnedTable>();
  table->name = absl::StrCat(stem, "/", s.name);
  table->rows = static_cast<int64_t>(s.shape[0]);
  table->dim = static_cast<int64_t>(s.shape[1]);
  table->source_dtype = *s.dtype->table;
  table->values.resize(s.shape[0] * s.shape[1]);
  const char* src = data.data() + s.begin;
  for (size_t i = 0; i < table->values.size(); ++i) {
    const float v = LoadElement(table->source_dtype, src, static_cast<int64_t>(i));
    if (!std::isfinite(v)) {
      *why = absl::StrCat("value [", i / s.shape[1], ", ", i % s.shape[1], "] is ", v);
      return nullptr;
    }
    table->values[i] = v;
  }
  return table;
}

absl::StatusOr<SafetensorsContents> Parse(absl::string_view bytes, absl::string_view stem,
                                          const SafetensorsLimits& limits) {
  absl::string_view data;
  absl::StatusOr<std::vector<TensorSpec>> specs = ReadHeader(bytes, limits, &data);
  if (!specs.ok()) return specs.status();

  SafetensorsContents out;
  SkipList skip(stem, &out.skipped);
  std::vector<const TensorSpec*> usable;
  uint64_t table_bytes = 0;  // cannot overflow: each table is < 2^47 * 4 bytes and file-backed
  for (const TensorSpec& s : *specs) {
    if (std::optional<std::string> why = WhyNotTable(s, limits)) {
      skip.Add(s.name, *why);
      continue;
    }
    usable.push_back(&s);
    table_bytes += s.shape[0] * s.shape[1] * sizeof(float);
  }
  if (table_bytes > limits.max_table_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("tables need ", table_bytes,
                                                     " bytes as float32, over the limit of ",
                                                     limits.max_table_bytes));
  }
  for (const TensorSpec* s : usable) {
    std::string why;
    std::shared_ptr<LearnedTable> table = Materialize(*s, data, stem, &why);
    if (table == nullptr) {
      skip.Add(s->name, why);
      continue;
    }
    out.tables.push_back(std::move(table));
  }
  skip.Finish();
  return out;
}

}  // namespace

absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes,
                                                     absl::string_view stem,
                                                     const SafetensorsLimits& limits) {
  // The reader reports errors without exceptions; the catch-all is the
  // backstop for allocation failure and anything unforeseen.
  SafetensorsContents out;
  POSENC_RETURN_IF_ERROR(NoThrow([&]() -> absl::Status {
    POSENC_ASSIGN_OR_RETURN(out, Parse(bytes, stem, limits));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes,
                                                     absl::string_view stem) {
  return ParseSafetensors(bytes, stem, SafetensorsLimits{});
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
