#include "npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace posenc::cli {

absl::Status WriteNpy(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                      const std::string& data) {
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
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.put(static_cast<char>(len & 0xff));
  out.put(static_cast<char>(len >> 8));
  out << header << body;
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a .npy file"));
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    offset = 10;
  } else {
    if (bytes.size() < 12) return absl::InvalidArgumentError(absl::StrCat(path, ": short header"));
    header_len = 0;
    for (int i = 3; i >= 0; --i)
      header_len = (header_len << 8) | static_cast<uint8_t>(bytes[8 + i]);
    offset = 12;
  }
  if (offset + header_len > bytes.size())
    return absl::InvalidArgumentError(absl::StrCat(path, ": short header"));
  const std::string header = bytes.substr(offset, header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'"))) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no descr"));
  }
  NpyArray a;
  const std::string descr = m[1];
  if (descr == "<f4")
    a.dtype = DType::kFloat32;
  else if (descr == "<f2")
    a.dtype = DType::kFloat16;
  else if (descr == "<i4")
    a.dtype = DType::kInt32;
  else if (descr == "<i8")
    a.dtype = DType::kInt64;
  else
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": dtype ", descr, " is not <f4, <f2, <i4 or <i8"));
  if (header.find("'fortran_order': True") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": Fortran order is not supported"));
  }
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no shape"));
  }
  int64_t n = 1;
  for (absl::string_view d : absl::StrSplit(std::string(m[1]), ',', absl::SkipWhitespace())) {
    int64_t v;
    if (!absl::SimpleAtoi(d, &v))
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad shape"));
    a.shape.push_back(v);
    n *= v;
  }
  a.data = bytes.substr(offset + header_len);
  if (a.data.size() != static_cast<size_t>(n) * SizeOf(a.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", a.data.size(), " data bytes for ", n, " elements"));
  }
  return a;
}

}  // namespace posenc::cli
