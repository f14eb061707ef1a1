#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "posenc/status_macros.h"

namespace posenc::cli {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);
constexpr size_t kMagicAndVersionBytes = 8;

// Untrusted bytes as they may appear in an error message: bounded, and with
// anything unprintable escaped so a hostile file cannot garble the terminal.
std::string Shown(absl::string_view s) {
  constexpr size_t kMaxShown = 32;
  std::string out = absl::CHexEscape(s.substr(0, kMaxShown));
  if (s.size() > kMaxShown) out += "...";
  return out;
}

// A shape the way NumPy prints it, so messages match what the user saved.
std::string TupleString(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), shape.size() == 1 ? ",)" : ")");
}

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// ---------------------------------------------------------------------------
// The header dict: a Python literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// read by a scanner that accepts the subset NumPy writes (either quote, any
// whitespace, keys in any order, trailing commas) and nothing else. It never
// recurses or backtracks, and allocates no more than the header's size.

struct Header {
  bool has_descr = false;
  bool has_fortran_order = false;
  bool has_shape = false;
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

class HeaderScanner {
 public:
  explicit HeaderScanner(absl::string_view text) : text_(text) {}

  absl::StatusOr<Header> Dict();

 private:
  static bool IsSpace(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  }
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  static bool IsWordChar(char c) {
    return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }

  void SkipSpace() {
    while (pos_ < text_.size() && IsSpace(text_[pos_])) ++pos_;
  }
  // Skips whitespace, then consumes `c` if it is next.
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  // The error for anything but `expected` at the current position.
  absl::Status Expected(absl::string_view expected) const {
    const absl::string_view rest = text_.substr(pos_);
    return Invalid("header", absl::StrCat("expected ", expected, " at byte ", pos_, ", got ",
                                          rest.empty() ? "the end of the header"
                                                       : absl::StrCat("'", Shown(rest), "'")));
  }

  absl::Status Entry(Header* h);
  absl::StatusOr<std::string> String(absl::string_view what);
  absl::StatusOr<bool> Bool(absl::string_view what);
  absl::StatusOr<std::vector<int64_t>> Shape();
  absl::StatusOr<int64_t> Dimension(size_t index);

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<Header> HeaderScanner::Dict() {
  Header h;
  if (!Consume('{')) return Expected("'{' opening the header dict");
  while (!Consume('}')) {
    POSENC_RETURN_IF_ERROR(Entry(&h));
    if (Consume(',')) continue;
    if (Consume('}')) break;
    return Expected("',' or '}' after a header entry");
  }
  SkipSpace();
  if (pos_ != text_.size()) return Expected("only whitespace after the header dict");
  if (!h.has_descr) return Invalid("header", "the dict has no 'descr' key");
  if (!h.has_fortran_order) return Invalid("header", "the dict has no 'fortran_order' key");
  if (!h.has_shape) return Invalid("header", "the dict has no 'shape' key");
  return h;
}

absl::Status HeaderScanner::Entry(Header* h) {
  POSENC_ASSIGN_OR_RETURN(const std::string key, String("a quoted key"));
  bool* seen = key == "descr"           ? &h->has_descr
               : key == "fortran_order" ? &h->has_fortran_order
               : key == "shape"         ? &h->has_shape
                                        : nullptr;
  if (seen == nullptr) {
    return Invalid("header", absl::StrCat("unknown key '", Shown(key),
                                          "'; expected 'descr', 'fortran_order' and 'shape'"));
  }
  // Python keeps the last of duplicate keys; which one the writer meant is
  // anyone's guess, so a duplicate is an error.
  if (*seen) return Invalid("header", absl::StrCat("duplicate key '", key, "'"));
  *seen = true;
  if (!Consume(':')) return Expected(absl::StrCat("':' after key '", key, "'"));
  if (key == "descr") {
    POSENC_ASSIGN_OR_RETURN(h->descr, String("descr as a quoted dtype such as '<f4'"));
  } else if (key == "fortran_order") {
    POSENC_ASSIGN_OR_RETURN(h->fortran_order, Bool("fortran_order as True or False"));
  } else {
    POSENC_ASSIGN_OR_RETURN(h->shape, Shape());
  }
  return absl::OkStatus();
}

// A '...' or "..." string of printable ASCII without escapes: all NumPy
// writes for these keys and values.
absl::StatusOr<std::string> HeaderScanner::String(absl::string_view what) {
  SkipSpace();
  if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return Expected(what);
  const size_t end = text_.find(text_[pos_], pos_ + 1);
  if (end == absl::string_view::npos) {
    return Invalid("header", absl::StrCat("unterminated string starting at byte ", pos_));
  }
  const absl::string_view s = text_.substr(pos_ + 1, end - pos_ - 1);
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\' || c < 0x20 || c > 0x7e) {
      return Invalid("header",
                     absl::StrCat("string at byte ", pos_, " holds '", Shown(s.substr(i, 1)),
                                  "'; only printable ASCII without escapes is accepted"));
    }
  }
  pos_ = end + 1;
  return std::string(s);
}

absl::StatusOr<bool> HeaderScanner::Bool(absl::string_view what) {
  SkipSpace();
  const absl::string_view rest = text_.substr(pos_);
  for (const bool value : {true, false}) {
    const absl::string_view word = value ? "True" : "False";
    if (rest.substr(0, word.size()) == word &&
        (rest.size() == word.size() || !IsWordChar(rest[word.size()]))) {
      pos_ += word.size();
      return value;
    }
  }
  return Expected(what);
}

// A tuple of dimensions: (), (5,), (2, 3), (2, 3,). "(5)" is the integer 5
// in Python, not a tuple, so NumPy would refuse it and so do we.
absl::StatusOr<std::vector<int64_t>> HeaderScanner::Shape() {
  if (!Consume('(')) return Expected("shape as a tuple such as (2, 3)");
  std::vector<int64_t> shape;
  bool trailing_comma = false;
  while (!Consume(')')) {
    if (shape.size() == static_cast<size_t>(kMaxNpyDims)) {
      return Invalid("shape", absl::StrCat("more than ", kMaxNpyDims, " dimensions"));
    }
    POSENC_ASSIGN_OR_RETURN(const int64_t d, Dimension(shape.size()));
    shape.push_back(d);
    trailing_comma = Consume(',');
    if (!trailing_comma) {
      if (Consume(')')) break;
      return Expected("',' or ')' in shape");
    }
  }
  if (shape.size() == 1 && !trailing_comma) {
    return Invalid("shape", absl::StrCat("(", shape[0], ") is an integer, not a tuple; write (",
                                         shape[0], ",)"));
  }
  return shape;
}

// A non-negative decimal integer that fits in int64. Python 2's NumPy wrote
// sizes as longs ("3L"), which NumPy still reads, so the suffix is accepted.
absl::StatusOr<int64_t> HeaderScanner::Dimension(size_t index) {
  SkipSpace();
  const size_t start = pos_;
  const bool negative = pos_ < text_.size() && text_[pos_] == '-';
  if (negative) ++pos_;
  const size_t digits_start = pos_;
  while (pos_ < text_.size() && IsDigit(text_[pos_])) ++pos_;
  const absl::string_view digits = text_.substr(digits_start, pos_ - digits_start);
  if (digits.empty()) {
    pos_ = start;
    return Expected(absl::StrCat("shape[", index, "] as a non-negative integer"));
  }
  const std::string field = absl::StrCat("shape[", index, "]");
  int64_t value = 0;
  for (const char c : digits) {
    if (__builtin_mul_overflow(value, 10, &value) ||
        __builtin_add_overflow(value, c - '0', &value)) {
      return Invalid(field, absl::StrCat(negative ? "-" : "", Shown(digits),
                                         " does not fit in a 64-bit integer"));
    }
  }
  if (negative && value != 0) return Invalid(field, absl::StrCat("must be >= 0, got -", value));
  if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
  return value;
}

// ---------------------------------------------------------------------------
// Everything around the header.

struct Descr {
  DType dtype = DType::kFloat32;  // what NpyArray holds
  size_t itemsize = 4;            // bytes per element in the file
  bool from_float64 = false;      // <f8, narrowed to float32 on reading
};

absl::StatusOr<Descr> ParseDescr(absl::string_view d) {
  if (d == "<f4") return Descr{DType::kFloat32, 4, false};
  if (d == "<f8") return Descr{DType::kFloat32, 8, true};
  if (d == "<f2") return Descr{DType::kFloat16, 2, false};
  if (d == "<i4") return Descr{DType::kInt32, 4, false};
  if (d == "<i8") return Descr{DType::kInt64, 8, false};
  if (!d.empty() && d[0] == '>') {
    return Invalid("descr", absl::StrCat("'", Shown(d),
                                         "' is big-endian; only little-endian data is supported "
                                         "(save arr.astype(arr.dtype.newbyteorder('<')))"));
  }
  return Invalid("descr", absl::StrCat("'", Shown(d),
                                       "' is not supported; expected '<f4', '<f8', '<f2', "
                                       "'<i4' or '<i8'"));
}

// product(shape) * itemsize, refusing negative sizes and products that do
// not fit in int64. As in NumPy, a zero dimension empties the array, but the
// other dimensions must still multiply without overflow, so that no code
// multiplying this shape later can overflow either.
absl::StatusOr<uint64_t> DataBytes(const std::vector<int64_t>& shape, size_t itemsize) {
  int64_t bytes = static_cast<int64_t>(itemsize);
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return Invalid(absl::StrCat("shape[", i, "]"), absl::StrCat("must be >= 0, got ", shape[i]));
    }
    if (shape[i] == 0) {
      empty = true;
    } else if (__builtin_mul_overflow(bytes, shape[i], &bytes)) {
      return Invalid("shape", absl::StrCat(TupleString(shape), " of ", itemsize,
                                           "-byte elements needs more than 2^63-1 bytes"));
    }
  }
  return empty ? 0 : static_cast<uint64_t>(bytes);
}

// Where the header lies, from the magic string, version and header length.
struct Preamble {
  size_t header_offset = 0;
  size_t header_len = 0;
};

absl::StatusOr<Preamble> ParsePreamble(absl::string_view bytes) {
  if (bytes.substr(0, kMagic.size()) != kMagic) {
    return Invalid("magic", absl::StrCat("not a .npy file: expected \\x93NUMPY, got '",
                                         Shown(bytes.substr(0, kMagic.size())), "'"));
  }
  if (bytes.size() < kMagicAndVersionBytes) {
    return Invalid("version", absl::StrCat("file truncated after ", bytes.size(), " bytes"));
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  const int minor = static_cast<uint8_t>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return Invalid("version",
                   absl::StrCat(major, ".", minor, " is not supported; expected 1.0, 2.0 or 3.0"));
  }
  // 1.0 has a 2-byte header length; 2.0 and 3.0 (UTF-8 header) a 4-byte one.
  const size_t len_bytes = major == 1 ? 2 : 4;
  Preamble p;
  p.header_offset = kMagicAndVersionBytes + len_bytes;
  if (bytes.size() < p.header_offset) {
    return Invalid("header length",
                   absl::StrCat("file truncated after ", bytes.size(), " bytes; version ", major,
                                ".0 needs ", p.header_offset, " before the header"));
  }
  for (size_t i = len_bytes; i-- > 0;) {
    p.header_len = (p.header_len << 8) | static_cast<uint8_t>(bytes[kMagicAndVersionBytes + i]);
  }
  const size_t available = bytes.size() - p.header_offset;
  if (p.header_len > available) {
    return Invalid("header length", absl::StrCat(p.header_len, " runs past the end of the file (",
                                                 available, " bytes follow the preamble)"));
  }
  if (p.header_len > kMaxNpyHeaderBytes) {
    return Invalid("header length", absl::StrCat(p.header_len, " exceeds the limit of ",
                                                 kMaxNpyHeaderBytes, " bytes"));
  }
  return p;
}

// What the bytes before the data say about the data, checked against the
// number of bytes that follow.
struct Layout {
  Descr descr;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
};

absl::StatusOr<Layout> ParseLayout(absl::string_view bytes) {
  POSENC_ASSIGN_OR_RETURN(const Preamble p, ParsePreamble(bytes));
  POSENC_ASSIGN_OR_RETURN(Header h,
                          HeaderScanner(bytes.substr(p.header_offset, p.header_len)).Dict());
  POSENC_ASSIGN_OR_RETURN(const Descr descr, ParseDescr(h.descr));
  if (h.fortran_order) {
    return Invalid("fortran_order",
                   "True is not supported; save np.ascontiguousarray(arr) for C order");
  }
  Layout l{descr, std::move(h.shape), p.header_offset + p.header_len};
  POSENC_ASSIGN_OR_RETURN(const uint64_t want, DataBytes(l.shape, l.descr.itemsize));
  const uint64_t have = bytes.size() - l.data_offset;
  if (have != want) {
    return Invalid("data",
                   absl::StrCat("shape ", TupleString(l.shape), " of '", h.descr, "' needs ", want,
                                " bytes, the file has ", have, " after the header"));
  }
  return l;
}

// Narrows <f8 data to float32, rounding to nearest (as IEEE 754 defines the
// conversion; C++ leaves it to the platform, hence the assertion). A finite
// value beyond float32's range would silently become an infinity, so it is an
// error instead; NaN and infinities stay what they are.
absl::StatusOr<std::string> Float64ToFloat32(absl::string_view data) {
  static_assert(std::numeric_limits<float>::is_iec559 && std::numeric_limits<double>::is_iec559);
  const size_t n = data.size() / 8;
  std::string out(n * 4, '\0');
  for (size_t i = 0; i < n; ++i) {
    double d;
    std::memcpy(&d, data.data() + 8 * i, 8);
    const float f = static_cast<float>(d);
    if (std::isinf(f) && std::isfinite(d)) {
      return Invalid("data", absl::StrCat("<f8 element ", i, " = ", d,
                                          " is outside float32's range and would become inf"));
    }
    std::memcpy(out.data() + 4 * i, &f, 4);
  }
  return out;
}

// `data` is the bytes after the header, already checked against `layout`.
absl::StatusOr<NpyArray> MakeArray(Layout layout, std::string data) {
  NpyArray a;
  a.dtype = layout.descr.dtype;
  a.shape = std::move(layout.shape);
  if (layout.descr.from_float64) {
    POSENC_ASSIGN_OR_RETURN(a.data, Float64ToFloat32(data));
  } else {
    a.data = std::move(data);
  }
  return a;
}

// ---------------------------------------------------------------------------
// Files.

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status RequireRegularFile(const std::string& path, mode_t mode) {
  if (S_ISREG(mode)) return absl::OkStatus();
  const char* kind = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "not a regular file";
  return absl::FailedPreconditionError(
      absl::StrCat(path, " is ", kind, "; a .npy input must be a regular file"));
}

// Fills `bytes` (sized to the file) and checks that the file ends there: a
// file that changes size meanwhile is an error rather than a torn read.
absl::Status ReadExactly(const std::string& path, int fd, std::string* bytes) {
  size_t got = 0;
  while (got < bytes->size()) {
    const ssize_t n = read(fd, bytes->data() + got, bytes->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
    if (n == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " shrank from ", bytes->size(), " to ", got, " bytes while read"));
    }
    got += static_cast<size_t>(n);
  }
  char extra;
  ssize_t n;
  do {
    n = read(fd, &extra, 1);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " grew beyond ", bytes->size(), " bytes while read"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever.
  // fstat then refuses anything but a regular file, on which the flag has no
  // effect.
  const ScopedFd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  POSENC_RETURN_IF_ERROR(RequireRegularFile(path, st.st_mode));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", size, " bytes; the limit is ", max_bytes));
  }
  std::string bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no memory to read ", path, " (", size, " bytes)"));
  }
  POSENC_RETURN_IF_ERROR(ReadExactly(path, fd.get(), &bytes));
  return bytes;
}

absl::Status WithPath(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

}  // namespace

absl::Status WriteNpy(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                      const std::string& data) {
  POSENC_ASSIGN_OR_RETURN(const uint64_t want, DataBytes(shape, SizeOf(dtype)));
  if (want != data.size()) {
    return Invalid("data", absl::StrCat("shape ", TupleString(shape), " of ", DTypeName(dtype),
                                        " needs ", want, " bytes, got ", data.size()));
  }
  std::string body = data;
  const char* descr = "<f4";
  switch (dtype) {
    case DType::kFloat16:
      descr = "<f2";
      break;
    case DType::kBFloat16: {
      body.resize(data.size() * 2);
      for (size_t i = 0; i < data.size() / 2; ++i) {
        uint16_t h;
        std::memcpy(&h, data.data() + 2 * i, 2);
        const float f = BFloat16ToFloat(h);
        std::memcpy(body.data() + 4 * i, &f, 4);
      }
      break;
    }
    case DType::kInt32:
      descr = "<i4";
      break;
    case DType::kInt64:
      descr = "<i8";
      break;
    default:
      break;
  }
  std::string dims;
  for (int64_t s : shape) absl::StrAppend(&dims, s, ", ");
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  if (header.size() > kMaxNpyHeaderBytes) {
    return Invalid("shape", absl::StrCat(shape.size(), " dimensions make a header over ",
                                         kMaxNpyHeaderBytes, " bytes"));
  }
  const uint16_t len = static_cast<uint16_t>(header.size());
  const std::string head =
      absl::StrCat(absl::string_view("\x93NUMPY\x01\x00", 8),
                   std::string{static_cast<char>(len & 0xff), static_cast<char>(len >> 8)}, header);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  // A full disk shows only when the buffered bytes are flushed, so the
  // close is checked too (an output under the buffer's size was once
  // reported written, and left empty).
  int write_errno = 0;
  if (std::fwrite(head.data(), 1, head.size(), f) != head.size() ||
      std::fwrite(body.data(), 1, body.size(), f) != body.size() || std::fflush(f) != 0) {
    write_errno = errno;
  }
  if (std::fclose(f) != 0 && write_errno == 0) write_errno = errno;
  if (write_errno != 0) {
    // Only a file of ours: the path may name a device (/dev/full) or a pipe.
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) std::remove(path.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(write_errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes) {
  POSENC_ASSIGN_OR_RETURN(Layout layout, ParseLayout(bytes));
  const size_t offset = layout.data_offset;
  return MakeArray(std::move(layout), std::string(bytes.substr(offset)));
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  POSENC_ASSIGN_OR_RETURN(std::string bytes, ReadRegularFile(path, kMaxNpyFileBytes));
  absl::StatusOr<Layout> layout = ParseLayout(bytes);
  if (!layout.ok()) return WithPath(path, layout.status());
  // Drop the header in place rather than copy the data: files reach 4 GiB.
  bytes.erase(0, layout->data_offset);
  absl::StatusOr<NpyArray> a = MakeArray(*std::move(layout), std::move(bytes));
  if (!a.ok()) return WithPath(path, a.status());
  return a;
}

}  // namespace posenc::cli
