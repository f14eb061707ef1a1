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

std::string ValidUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceAt(s, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

std::string Utf8Prefix(absl::string_view s, size_t max_bytes) {
  if (s.size() > max_bytes) {
    size_t cut = max_bytes;
    // Back over the continuation bytes of a character the cut would split.
    while (cut > 0 && cut > max_bytes - 3 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) {
      --cut;
    }
    s = s.substr(0, cut);
  }
  return ValidUtf8(s);
}

}  // namespace posenc::server
