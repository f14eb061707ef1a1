#include "engine/utf8.h"

namespace posenc::server {

size_t Utf8SequenceAt(absl::string_view s, size_t i) {
  const auto byte = [&](size_t j) { return static_cast<unsigned char>(s[j]); };
  const unsigned char b = byte(i);
  if (b < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (b >= 0xc2 && b <= 0xdf) {
    n = 2;
  } else if (b >= 0xe0 && b <= 0xef) {
    n = 3;
    if (b == 0xe0) lo = 0xa0;  // overlong
    if (b == 0xed) hi = 0x9f;  // surrogates
  } else if (b >= 0xf0 && b <= 0xf4) {
    n = 4;
    if (b == 0xf0) lo = 0x90;  // overlong
    if (b == 0xf4) hi = 0x8f;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t j = 2; j < n; ++j) {
    if ((byte(i + j) & 0xc0) != 0x80) return 0;
  }
  return n;
}

std::string ValidUtf8(absl::string_view s) { return Utf8Prefix(s, s.size() * 3); }

std::string Utf8Prefix(absl::string_view s, size_t max_bytes) {
  static constexpr absl::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceAt(s, i);
    const absl::string_view piece = n == 0 ? kReplacement : s.substr(i, n);
    if (out.size() + piece.size() > max_bytes) break;
    out.append(piece.data(), piece.size());
    i += n == 0 ? 1 : n;
  }
  return out;
}

}  // namespace posenc::server
