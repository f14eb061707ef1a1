// UTF-8 as proto3 `string` fields need it. Names, ids and error messages that
// a server repeats may hold a caller's bytes, cut at a byte count; a strict
// client (Python, Go, Java protobuf) cannot decode an answer whose string is
// not valid UTF-8 and loses the call or the whole stream. So strings are cut
// at character boundaries and made valid where they are made.
#ifndef POSENC_SERVER_ENGINE_UTF8_H_
#define POSENC_SERVER_ENGINE_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace posenc::server {

// The length of the well-formed UTF-8 sequence at s[i] (1 to 4), or 0 if
// there is none (a stray continuation byte, an overlong form, a surrogate, a
// code point past U+10FFFF, or a sequence cut short).
size_t Utf8SequenceAt(absl::string_view s, size_t i);

// `s` with each byte that starts no well-formed sequence replaced by U+FFFD.
std::string ValidUtf8(absl::string_view s);

// `s` made valid, cut to at most `max_bytes` without splitting a character.
std::string Utf8Prefix(absl::string_view s, size_t max_bytes);

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_UTF8_H_
