#include "rpc/large_fields.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace posenc::server {
namespace {

// A cursor over a list of slices that releases each slice once passed.
class SliceReader {
 public:
  explicit SliceReader(std::vector<grpc::Slice>* slices) : slices_(slices) { Settle(); }

  bool done() const { return index_ >= slices_->size(); }
  uint64_t remaining() const { return remaining_; }

  bool ReadByte(uint8_t* b) {
    if (done()) return false;
    *b = (*slices_)[index_].begin()[offset_];
    Advance(1);
    return true;
  }

  bool ReadVarint(uint64_t* v, std::string* raw) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      if (raw != nullptr) raw->push_back(static_cast<char>(b));
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }

  // Steps over the next n bytes. REQUIRES: n <= remaining().
  void Skip(uint64_t n) {
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, (*slices_)[index_].size() - offset_);
      Advance(take);
      n -= take;
    }
  }

  // Appends the next n bytes to `out`. REQUIRES: n <= remaining().
  void Copy(uint64_t n, std::string* out) {
    while (n > 0) {
      const grpc::Slice& s = (*slices_)[index_];
      const uint64_t take = std::min<uint64_t>(n, s.size() - offset_);
      out->append(reinterpret_cast<const char*>(s.begin() + offset_), take);
      Advance(take);
      n -= take;
    }
  }

 private:
  void Advance(uint64_t n) {
    offset_ += n;
    remaining_ -= n;
    Settle();
  }
  // Steps over exhausted (and empty) slices, releasing them.
  void Settle() {
    while (index_ < slices_->size() && offset_ >= (*slices_)[index_].size()) {
      (*slices_)[index_] = grpc::Slice();
      ++index_;
      offset_ = 0;
    }
    if (remaining_ == kUnknown) {
      remaining_ = 0;
      for (size_t i = index_; i < slices_->size(); ++i) remaining_ += (*slices_)[i].size();
      remaining_ -= offset_;
    }
  }

  static constexpr uint64_t kUnknown = ~uint64_t{0};
  std::vector<grpc::Slice>* slices_;
  size_t index_ = 0;
  uint64_t offset_ = 0;
  uint64_t remaining_ = kUnknown;
};

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("the request is not a valid message: ", why));
}

}  // namespace

absl::Status SplitLargeFields(std::vector<grpc::Slice>* slices, absl::Span<const LargeField> large,
                              std::string* rest) {
  SliceReader in(slices);
  while (!in.done()) {
    std::string raw_tag;
    uint64_t tag;
    if (!in.ReadVarint(&tag, &raw_tag)) return Malformed("truncated field tag");
    const uint64_t number = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (number == 0 || number > (uint64_t{1} << 29) - 1) {
      return Malformed(absl::StrCat("field number ", number, " is out of range"));
    }
    switch (wire_type) {
      case 0: {  // varint
        rest->append(raw_tag);
        uint64_t v;
        if (!in.ReadVarint(&v, rest)) return Malformed("truncated varint");
        break;
      }
      case 1:    // fixed 64-bit
      case 5: {  // fixed 32-bit
        const uint64_t n = wire_type == 1 ? 8 : 4;
        if (in.remaining() < n) return Malformed("truncated fixed-width field");
        rest->append(raw_tag);
        in.Copy(n, rest);
        break;
      }
      case 2: {  // length-delimited
        uint64_t length;
        std::string raw_length;
        if (!in.ReadVarint(&length, &raw_length)) return Malformed("truncated length");
        if (length > in.remaining()) {
          return Malformed(absl::StrCat("field ", number, " claims ", length, " bytes but only ",
                                        in.remaining(), " remain"));
        }
        const LargeField* target = nullptr;
        for (const LargeField& f : large) {
          if (static_cast<uint64_t>(f.number) == number) target = &f;
        }
        if (target != nullptr) {
          target->data->clear();
          target->data->shrink_to_fit();
          target->data->reserve(length);
          in.Copy(length, target->data);
        } else {
          rest->append(raw_tag);
          rest->append(raw_length);
          in.Copy(length, rest);
        }
        break;
      }
      default:  // groups (3, 4) are not used by posenc.v1; 6 and 7 do not exist
        return Malformed(absl::StrCat("field ", number, " has wire type ", wire_type,
                                      ", which posenc.v1 messages never use"));
    }
  }
  return absl::OkStatus();
}

grpc::ByteBuffer BufferWithLargeFields(const std::string& head,
                                       absl::Span<const LargeField> large) {
  std::vector<grpc::Slice> slices;
  slices.emplace_back(head);
  for (const LargeField& f : large) {
    if (f.data->empty() && !f.repeated) continue;  // proto3: an empty bytes field is not sent
    std::string prefix;
    AppendVarint((static_cast<uint64_t>(f.number) << 3) | 2, &prefix);
    AppendVarint(f.data->size(), &prefix);
    slices.emplace_back(prefix);
    if (f.data->empty()) continue;
    auto* owned = new std::string(std::move(*f.data));
    f.data->clear();
    slices.emplace_back(
        owned->data(), owned->size(), [](void* s) { delete static_cast<std::string*>(s); }, owned);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

namespace {

// The byte_size (field 3, a varint) of a serialised SharedMemorySlice of
// `length` bytes at the reader's position, which it steps over.
bool SliceByteSize(SliceReader& in, uint64_t length, uint64_t* byte_size) {
  *byte_size = 0;
  const uint64_t end = in.remaining() - length;
  // A varint may run past the slice's last byte: every read is checked
  // against `end` before anything is computed from the bytes left.
  const auto within = [&] { return in.remaining() >= end; };
  while (in.remaining() > end) {
    uint64_t tag, v;
    if (!in.ReadVarint(&tag, nullptr) || !within()) return false;
    if ((tag & 7) == 0) {
      if (!in.ReadVarint(&v, nullptr) || !within()) return false;
      if (tag >> 3 == 3) *byte_size = v;
    } else if ((tag & 7) == 2) {
      if (!in.ReadVarint(&v, nullptr) || !within() || v > in.remaining() - end) return false;
      in.Skip(v);
    } else {
      return false;
    }
  }
  return in.remaining() == end;
}

}  // namespace

uint64_t TensorBytesOf(const grpc::ByteBuffer& message, absl::Span<const int> data_fields,
                       absl::Span<const int> slice_fields) {
  constexpr uint64_t kUnknown = ~uint64_t{0};
  std::vector<grpc::Slice> slices;
  if (!message.Dump(&slices).ok()) return kUnknown;
  SliceReader in(&slices);  // releases this copy's references, not the buffer's
  uint64_t total = 0;
  const auto in_list = [](absl::Span<const int> list, uint64_t n) {
    for (int f : list) {
      if (static_cast<uint64_t>(f) == n) return true;
    }
    return false;
  };
  while (!in.done()) {
    uint64_t tag, v = 0;
    if (!in.ReadVarint(&tag, nullptr)) return kUnknown;
    switch (tag & 7) {
      case 0:
        if (!in.ReadVarint(&v, nullptr)) return kUnknown;
        break;
      case 1:
      case 5: {
        const uint64_t n = (tag & 7) == 1 ? 8 : 4;
        if (n > in.remaining()) return kUnknown;
        in.Skip(n);
        break;
      }
      case 2: {
        if (!in.ReadVarint(&v, nullptr) || v > in.remaining()) return kUnknown;
        if (in_list(slice_fields, tag >> 3)) {
          uint64_t bytes;
          if (!SliceByteSize(in, v, &bytes) || __builtin_add_overflow(total, bytes, &total)) {
            return kUnknown;
          }
          break;
        }
        // v is within the message, but total may already hold a slice's
        // size near 2^64: wrapped, a huge request would look light.
        if (in_list(data_fields, tag >> 3) && __builtin_add_overflow(total, v, &total)) {
          return kUnknown;
        }
        in.Skip(v);
        break;
      }
      default:
        return kUnknown;  // malformed: the parse will say so
    }
  }
  return total;
}

grpc::ByteBuffer NestedMessage(int number, const grpc::ByteBuffer& inner) {
  std::string prefix;
  AppendVarint((static_cast<uint64_t>(number) << 3) | 2, &prefix);
  AppendVarint(inner.Length(), &prefix);
  std::vector<grpc::Slice> slices;
  slices.emplace_back(prefix);
  std::vector<grpc::Slice> body;
  (void)inner.Dump(&body);  // shares the slices; copies no byte
  for (grpc::Slice& s : body) slices.push_back(std::move(s));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace posenc::server
