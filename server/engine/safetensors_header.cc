#include "engine/safetensors_header.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace posenc::server::safetensors {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kMetadataKey = "__metadata__";

// Names and values from a hostile header end up in logs and ListTables
// replies; this many characters identify them without letting one file
// produce megabyte-long messages.
constexpr size_t kMaxQuotedChars = 96;
// NumPy allows 64 dims and PyTorch fewer; more is not a tensor anyone wrote,
// and the cap keeps a hostile shape list from costing 4x its text in memory.
constexpr size_t kMaxRank = 64;
// Shapes in messages print at most this many dims.
constexpr size_t kMaxShownDims = 8;

// Every dtype of safetensors 0.8, with its element size in bits. A name not
// here makes the file malformed, as it does for the reference reader (without
// the size the tensor's byte range cannot be checked).
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 8, std::nullopt},        {"F4", 4, std::nullopt},
    {"F6_E2M3", 6, std::nullopt},     {"F6_E3M2", 6, std::nullopt},
    {"U8", 8, std::nullopt},          {"I8", 8, std::nullopt},
    {"F8_E5M2", 8, std::nullopt},     {"F8_E4M3", 8, std::nullopt},
    {"F8_E8M0", 8, std::nullopt},     {"F8_E4M3FNUZ", 8, std::nullopt},
    {"F8_E5M2FNUZ", 8, std::nullopt}, {"I16", 16, std::nullopt},
    {"U16", 16, std::nullopt},        {"F16", 16, DType::kFloat16},
    {"BF16", 16, DType::kBFloat16},   {"I32", 32, std::nullopt},
    {"U32", 32, std::nullopt},        {"F32", 32, DType::kFloat32},
    {"C64", 64, std::nullopt},        {"F64", 64, std::nullopt},
    {"I64", 64, std::nullopt},        {"U64", 64, std::nullopt},
};

const DTypeInfo* FindDType(absl::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed safetensors: ", why));
}

absl::Status BadTensor(absl::string_view name, absl::string_view why) {
  return Malformed(absl::StrCat("tensor ", Quoted(name), ": ", why));
}

// One header entry as read, before it is checked against the data section.
struct RawTensor {
  std::string name;
  std::optional<std::string> dtype;
  std::optional<std::vector<uint64_t>> shape;
  std::optional<std::vector<uint64_t>> offsets;
};

// Element bytes of `shape` in `dtype`, or an error if the size overflows
// 64 bits or ends mid-byte (sub-byte dtypes). A zero dim makes the tensor
// empty whatever the others are, so [2^64-1, 0] is 0 bytes, not an overflow.
absl::StatusOr<uint64_t> ByteCount(const RawTensor& t, const DTypeInfo& dtype) {
  const std::vector<uint64_t>& shape = *t.shape;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t bits = dtype.bits;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(bits, d, &bits)) {
      return BadTensor(t.name, absl::StrCat("shape ", ShapeText(shape), " of ", dtype.name,
                                            " needs more than 2^64 bits"));
    }
  }
  if (bits % 8 != 0) {
    return BadTensor(t.name, absl::StrCat("shape ", ShapeText(shape), " of ", dtype.name, " is ",
                                          bits, " bits, not a whole number of bytes"));
  }
  return bits / 8;
}

absl::StatusOr<TensorSpec> CheckTensor(RawTensor& t, uint64_t data_size) {
  if (!t.dtype || !t.shape || !t.offsets) {
    return BadTensor(t.name, absl::StrCat("lacks ", !t.dtype   ? "dtype"
                                                    : !t.shape ? "shape"
                                                               : "data_offsets"));
  }
  const DTypeInfo* dtype = FindDType(*t.dtype);
  if (dtype == nullptr) {
    return BadTensor(t.name,
                     absl::StrCat("dtype ", Quoted(*t.dtype), " is not a safetensors dtype"));
  }
  if (t.offsets->size() != 2) {
    return BadTensor(t.name, absl::StrCat("data_offsets has ", t.offsets->size(),
                                          " entries; expected [begin, end]"));
  }
  const uint64_t begin = (*t.offsets)[0], end = (*t.offsets)[1];
  if (begin > end || end > data_size) {
    return BadTensor(
        t.name, absl::StrCat("data_offsets [", begin, ", ", end,
                             "] are not a range within the data section of ", data_size, " bytes"));
  }
  absl::StatusOr<uint64_t> bytes = ByteCount(t, *dtype);
  if (!bytes.ok()) return bytes.status();
  if (end - begin != *bytes) {
    return BadTensor(t.name, absl::StrCat("data_offsets [", begin, ", ", end, "] hold ",
                                          end - begin, " bytes but shape ", ShapeText(*t.shape),
                                          " of ", dtype->name, " needs ", *bytes));
  }
  return TensorSpec{std::move(t.name), dtype, std::move(*t.shape), begin, end};
}

// Reads the header with nlohmann's SAX interface rather than into a DOM:
// the format nests three levels deep, so a streaming reader keeps only the
// checked entries (each tensor is checked as its object closes, so memory
// stays a small multiple of the header), rejects anything else at the first
// offending token, and never throws. (nlohmann's DOM
// parser with a filtering callback rescans the parent object at every
// object end, which is quadratic in the number of tensors.)
class HeaderReader final : public nlohmann::json_sax<Json> {
 public:
  explicit HeaderReader(uint64_t data_size) : data_size_(data_size) {}

  // Parses `text`; the checked entries are then in specs().
  absl::Status Read(absl::string_view text) {
    const bool ok = Json::sax_parse(text.data(), text.data() + text.size(), this,
                                    nlohmann::json::input_format_t::json, /*strict=*/true);
    if (!error_.ok()) return error_;
    if (!ok || where_ != Where::kDone) return Malformed("header JSON ends early");
    return absl::OkStatus();
  }
  std::vector<TensorSpec>& specs() { return specs_; }

  bool null() override { return Scalar("null"); }
  bool boolean(bool v) override { return Scalar(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return Scalar(absl::StrCat(v)); }
  bool number_unsigned(number_unsigned_t v) override;
  bool number_float(number_float_t, const string_t& text) override {
    return Scalar(absl::string_view(text).substr(0, kMaxQuotedChars));  // the literal as written
  }
  bool string(string_t& v) override;
  bool binary(binary_t&) override { return Scalar("binary data"); }
  bool start_object(std::size_t) override;
  bool key(string_t& k) override;
  bool end_object() override;
  bool start_array(std::size_t) override;
  bool end_array() override;
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception&) override {
    return Fail(Malformed(absl::StrCat("header is not valid JSON near byte ", position,
                                       " (last token ", Quoted(last_token), ")")));
  }

 private:
  // Where the next value goes.
  enum class Where { kTop, kRoot, kTensor, kMetadata, kShape, kOffsets, kDone };

  bool Fail(absl::Status s) {
    if (error_.ok()) error_ = std::move(s);
    return false;
  }
  // `what` arrived where `where_` expects something else.
  bool Unexpected(absl::string_view what);
  // Values of tensor fields other than dtype, shape and data_offsets are
  // ignored, as the reference reader ignores them.
  bool SkipScalar();
  bool SkipContainerStart();
  bool SkipContainerEnd();
  bool Scalar(absl::string_view text) { return SkipScalar() || Unexpected(text); }
  std::vector<uint64_t>* CurrentArray();
  absl::string_view ArrayField() const {
    return where_ == Where::kShape ? "shape" : "data_offsets";
  }

  Where where_ = Where::kTop;
  bool ignore_next_ = false;  // the next value belongs to an ignored field
  int64_t skip_depth_ = 0;    // > 0 inside an ignored object or list
  std::string key_;           // the current root key (tensor name) or tensor field
  std::set<std::string, std::less<>> names_;
  const uint64_t data_size_;
  RawTensor current_;  // the tensor entry being read
  std::vector<TensorSpec> specs_;
  absl::Status error_;
};

bool HeaderReader::Unexpected(absl::string_view what) {
  switch (where_) {
    case Where::kTop:
      return Fail(Malformed(absl::StrCat("header is ", what, ", not a JSON object")));
    case Where::kRoot:
      if (key_ == kMetadataKey) {
        return Fail(Malformed(absl::StrCat("__metadata__ is ", what, "; expected an object")));
      }
      return Fail(BadTensor(key_, absl::StrCat("entry is ", what, "; expected an object")));
    case Where::kTensor:
      return Fail(BadTensor(current_.name, absl::StrCat(key_, " is ", what,
                                                        key_ == "dtype" ? "; expected a string"
                                                                        : "; expected a list")));
    case Where::kMetadata:
      return Fail(Malformed(absl::StrCat("__metadata__ value for ", Quoted(key_), " is ", what,
                                         "; expected a string")));
    case Where::kShape:
    case Where::kOffsets:
      return Fail(
          BadTensor(current_.name, absl::StrCat(ArrayField(), "[", CurrentArray()->size(), "] is ",
                                                what, "; expected an integer in [0, 2^64-1]")));
    case Where::kDone:
      break;
  }
  return Fail(Malformed(absl::StrCat("unexpected ", what, " after the header object")));
}

std::vector<uint64_t>* HeaderReader::CurrentArray() {
  RawTensor& t = current_;
  return where_ == Where::kShape ? &*t.shape : &*t.offsets;
}

bool HeaderReader::SkipScalar() {
  if (skip_depth_ > 0) return true;
  if (!ignore_next_) return false;
  ignore_next_ = false;
  return true;
}

bool HeaderReader::SkipContainerStart() {
  if (skip_depth_ == 0 && !ignore_next_) return false;
  ignore_next_ = false;
  ++skip_depth_;
  return true;
}

bool HeaderReader::SkipContainerEnd() {
  if (skip_depth_ == 0) return false;
  --skip_depth_;
  return true;
}

bool HeaderReader::number_unsigned(number_unsigned_t v) {
  if (SkipScalar()) return true;
  if (where_ != Where::kShape && where_ != Where::kOffsets) return Unexpected(absl::StrCat(v));
  std::vector<uint64_t>* values = CurrentArray();
  if (where_ == Where::kOffsets && values->size() == 2) {
    return Fail(BadTensor(current_.name, "data_offsets has more than 2 entries"));
  }
  if (where_ == Where::kShape && values->size() == kMaxRank) {
    return Fail(BadTensor(current_.name, absl::StrCat("shape has more than ", kMaxRank, " dims")));
  }
  values->push_back(v);
  return true;
}

bool HeaderReader::string(string_t& v) {
  if (SkipScalar() || where_ == Where::kMetadata) return true;
  if (where_ == Where::kTensor && key_ == "dtype") {
    current_.dtype = std::move(v);
    return true;
  }
  return Unexpected(Quoted(v));
}

bool HeaderReader::start_object(std::size_t) {
  if (SkipContainerStart()) return true;
  if (where_ == Where::kTop) {
    where_ = Where::kRoot;
    return true;
  }
  if (where_ == Where::kRoot) {
    if (key_ == kMetadataKey) {
      where_ = Where::kMetadata;
    } else {
      current_ = RawTensor{key_, {}, {}, {}};
      where_ = Where::kTensor;
    }
    return true;
  }
  return Unexpected("an object");
}

bool HeaderReader::start_array(std::size_t) {
  if (SkipContainerStart()) return true;
  if (where_ == Where::kTensor && (key_ == "shape" || key_ == "data_offsets")) {
    RawTensor& t = current_;
    where_ = key_ == "shape" ? Where::kShape : Where::kOffsets;
    (where_ == Where::kShape ? t.shape : t.offsets).emplace();
    return true;
  }
  return Unexpected("a list");
}

bool HeaderReader::key(string_t& k) {
  if (skip_depth_ > 0 || where_ == Where::kMetadata) {
    key_ = std::move(k);
    return true;
  }
  if (where_ == Where::kRoot) {
    // A repeated name would leave which entry counts up to the reader.
    if (!names_.insert(k).second) {
      return Fail(k == kMetadataKey ? Malformed("__metadata__ appears twice")
                                    : BadTensor(k, "appears twice in the header"));
    }
  } else {  // kTensor
    const RawTensor& t = current_;
    const bool seen = (k == "dtype" && t.dtype) || (k == "shape" && t.shape) ||
                      (k == "data_offsets" && t.offsets);
    if (seen) return Fail(BadTensor(t.name, absl::StrCat("has two '", k, "' fields")));
    ignore_next_ = k != "dtype" && k != "shape" && k != "data_offsets";
  }
  key_ = std::move(k);
  return true;
}

bool HeaderReader::end_object() {
  if (SkipContainerEnd()) return true;
  if (where_ == Where::kTensor) {
    absl::StatusOr<TensorSpec> spec = CheckTensor(current_, data_size_);
    if (!spec.ok()) return Fail(spec.status());
    specs_.push_back(std::move(*spec));
  }
  where_ = where_ == Where::kRoot ? Where::kDone : Where::kRoot;
  return true;
}

bool HeaderReader::end_array() {
  if (SkipContainerEnd()) return true;
  where_ = Where::kTensor;
  return true;
}

absl::StatusOr<uint64_t> HeaderLength(absl::string_view bytes, const SafetensorsLimits& limits) {
  if (bytes.size() < 8) {
    return Malformed(
        absl::StrCat("file of ", bytes.size(), " bytes is shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  if (n > limits.max_header_bytes) {
    return Malformed(absl::StrCat("header length ", n, " is over the limit of ",
                                  limits.max_header_bytes, " bytes"));
  }
  if (n > bytes.size() - 8) {
    return Malformed(absl::StrCat("header length ", n, " runs past the end of the file (",
                                  bytes.size() - 8, " bytes follow the length)"));
  }
  return n;
}

// The reference rule: sorted by offset, the tensors tile the data section
// exactly, so no byte belongs to two tensors and none is unaccounted for.
absl::Status CheckLayout(std::vector<TensorSpec>& specs, uint64_t data_size) {
  std::sort(specs.begin(), specs.end(), [](const TensorSpec& a, const TensorSpec& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  const TensorSpec* previous = nullptr;
  for (const TensorSpec& s : specs) {
    if (s.begin < covered) {
      return BadTensor(s.name, absl::StrCat("data_offsets [", s.begin, ", ", s.end,
                                            "] overlap tensor ", Quoted(previous->name), " [",
                                            previous->begin, ", ", previous->end, "]"));
    }
    if (s.begin > covered) {
      return BadTensor(
          s.name, absl::StrCat("data_offsets [", s.begin, ", ", s.end, "] leave bytes [", covered,
                               ", ", s.begin, ") of the data section unused"));
    }
    covered = s.end;
    previous = &s;
  }
  if (covered != data_size) {
    return Malformed(absl::StrCat("tensors cover ", covered,
                                  " bytes of the data section but it has ", data_size,
                                  " (trailing bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Quoted(absl::string_view text) {
  const bool cut = text.size() > kMaxQuotedChars;
  return absl::StrCat("'", absl::CHexEscape(text.substr(0, kMaxQuotedChars)), cut ? "'..." : "'");
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  const size_t shown = std::min(shape.size(), kMaxShownDims);
  const std::vector<uint64_t> head(shape.begin(), shape.begin() + shown);
  return absl::StrCat("[", absl::StrJoin(head, ", "), shape.size() > shown ? ", ...]" : "]");
}

absl::StatusOr<std::vector<TensorSpec>> ReadHeader(absl::string_view bytes,
                                                   const SafetensorsLimits& limits,
                                                   absl::string_view* data) {
  absl::StatusOr<uint64_t> header_len = HeaderLength(bytes, limits);
  if (!header_len.ok()) return header_len.status();
  const absl::string_view header = bytes.substr(8, *header_len);
  *data = bytes.substr(8 + *header_len);
  // nlohmann treats NUL as the end of input, which would hide what follows it.
  if (const size_t nul = header.find('\0'); nul != absl::string_view::npos) {
    return Malformed(absl::StrCat("header has a NUL byte at offset ", nul));
  }
  HeaderReader reader(data->size());
  if (absl::Status s = reader.Read(header); !s.ok()) return s;
  std::vector<TensorSpec>& specs = reader.specs();
  if (absl::Status s = CheckLayout(specs, data->size()); !s.ok()) return s;
  return std::move(specs);
}

}  // namespace posenc::server::safetensors
