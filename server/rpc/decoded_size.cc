#include "rpc/decoded_size.h"

#include <algorithm>
#include <unordered_map>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace posenc::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// glibc's chunk header and rounding, per allocation.
constexpr int64_t kAllocation = 32;
// A string field: the std::string object (on the heap: ArenaStringPtr) and
// its buffer, each an allocation.
constexpr int64_t kStringBytes = 32 + 2 * kAllocation;
// A repeated field's pointer to an element, with the array's growth.
constexpr int64_t kPointerSlot = 16;
// A repeated scalar's bytes: the field (its array doubles as it grows) and
// the tensor a front builds from it while the field still holds them.
constexpr int64_t kScalarFactor = 3;
// A map entry's node and bucket, beyond the entry's own key and value.
constexpr int64_t kMapNode = 64 + kAllocation;
// An unknown field's UnknownField record in its set's vector (which grows).
constexpr int64_t kUnknownField = 48;
// An unknown group holds a record per field inside it: per byte of it, at
// most this much (a field is at least two bytes: tag and value).
constexpr int64_t kUnknownGroupPerByte = 24;
constexpr int kMaxDepth = 100;  // protobuf's own recursion limit
constexpr int64_t kNotKnown = -2;

int64_t Sum(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }
int64_t Product(int64_t a, int64_t b) { return b != 0 && a > INT64_MAX / b ? INT64_MAX : a * b; }

// The message object itself: the type's size (its prototype's, which holds
// no more than its fields) and its allocation.
int64_t ObjectBytes(const Descriptor* d) {
  thread_local std::unordered_map<const Descriptor*, int64_t> sizes;
  auto [it, inserted] = sizes.try_emplace(d, 0);
  if (inserted) {
    // A map entry is no object of its own once parsed (its key and value
    // live in the map's node, kMapNode), and its prototype's SpaceUsedLong
    // dereferences the value it does not have.
    const google::protobuf::Message* prototype =
        d->options().map_entry()
            ? nullptr
            : google::protobuf::MessageFactory::generated_factory()->GetPrototype(d);
    it->second = (d->options().map_entry() ? 64
                  : prototype != nullptr   ? static_cast<int64_t>(prototype->SpaceUsedLong())
                                           : 1024) +
                 kAllocation;
  }
  return it->second;
}

// A scalar field's width in memory.
int64_t Width(const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      return 1;
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_ENUM:
      return 4;
    default:
      return 8;
  }
}

bool IsScalar(const FieldDescriptor* f) {
  return f->type() != FieldDescriptor::TYPE_MESSAGE && f->type() != FieldDescriptor::TYPE_GROUP &&
         f->type() != FieldDescriptor::TYPE_STRING && f->type() != FieldDescriptor::TYPE_BYTES;
}

class Walker {
 public:
  explicit Walker(CodedInputStream* in) : in_(in) {}

  // The message's fields up to the end of the input or the current limit;
  // -1 if they are not well formed.
  int64_t Message(const Descriptor* d, int depth) {
    int64_t total = ObjectBytes(d);
    for (;;) {
      const uint32_t tag = in_->ReadTag();
      if (tag == 0) return in_->ConsumedEntireMessage() ? total : -1;
      const WireFormatLite::WireType wire = WireFormatLite::GetTagWireType(tag);
      if (wire == WireFormatLite::WIRETYPE_END_GROUP) return -1;  // none is open here
      const FieldDescriptor* f = d->FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag));
      int64_t add = f != nullptr ? Known(f, wire, depth) : kNotKnown;
      if (add == kNotKnown) add = Unknown(tag);
      if (add < 0) return -1;
      total = Sum(total, add);
    }
  }

 private:
  // A field of the type as its declaration says it is sent; kNotKnown
  // where it is sent otherwise (the parse keeps it as an unknown field).
  int64_t Known(const FieldDescriptor* f, WireFormatLite::WireType wire, int depth) {
    const bool delimited = wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (f->type() == FieldDescriptor::TYPE_MESSAGE && delimited) {
      if (depth >= kMaxDepth) return -1;
      return Delimited([&](int) {
        const int64_t inner = Message(f->message_type(), depth + 1);
        if (inner < 0) return inner;
        return Sum(inner, (f->is_repeated() ? kPointerSlot : 0) + (f->is_map() ? kMapNode : 0));
      });
    }
    if ((f->type() == FieldDescriptor::TYPE_STRING || f->type() == FieldDescriptor::TYPE_BYTES) &&
        delimited) {
      int length = 0;
      if (!ReadLength(&length) || !in_->Skip(length)) return -1;
      return int64_t{length} + kStringBytes + (f->is_repeated() ? kPointerSlot : 0);
    }
    if (!IsScalar(f)) return kNotKnown;
    const WireFormatLite::WireType scalar_wire =
        WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(f->type()));
    if (f->is_repeated() && delimited) {  // packed
      return Delimited([&](int length) -> int64_t {
        int64_t count = 0;
        if (scalar_wire == WireFormatLite::WIRETYPE_VARINT) {
          for (uint64_t v; in_->BytesUntilLimit() > 0; ++count) {
            if (!in_->ReadVarint64(&v)) return -1;
          }
        } else {
          const int64_t size = scalar_wire == WireFormatLite::WIRETYPE_FIXED32 ? 4 : 8;
          if (length % size != 0 || !in_->Skip(static_cast<int>(length))) return -1;
          count = length / size;
        }
        return Product(Product(count, Width(f)), kScalarFactor);
      });
    }
    if (wire != scalar_wire) return kNotKnown;
    uint64_t v = 0;
    const bool read = wire == WireFormatLite::WIRETYPE_VARINT    ? in_->ReadVarint64(&v)
                      : wire == WireFormatLite::WIRETYPE_FIXED32 ? in_->Skip(4)
                                                                 : in_->Skip(8);
    if (!read) return -1;
    return f->is_repeated() ? Width(f) * kScalarFactor : 0;
  }

  // A field the type does not declare (or sent otherwise than declared).
  int64_t Unknown(uint32_t tag) {
    const int start = in_->CurrentPosition();
    if (!WireFormatLite::SkipField(in_, tag)) return -1;
    const int64_t consumed = in_->CurrentPosition() - start;
    switch (WireFormatLite::GetTagWireType(tag)) {
      case WireFormatLite::WIRETYPE_START_GROUP:
        return Sum(Product(consumed, kUnknownGroupPerByte), kUnknownField);
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
        return consumed + kStringBytes + kUnknownField;
      default:
        return kUnknownField;
    }
  }

  // Reads a length, runs `body(length)` within it and checks it used it all.
  template <typename Body>
  int64_t Delimited(Body body) {
    int length = 0;
    if (!ReadLength(&length)) return -1;
    const CodedInputStream::Limit limit = in_->PushLimit(length);
    const int64_t bytes = body(length);
    const bool whole = in_->BytesUntilLimit() == 0;
    in_->PopLimit(limit);
    return bytes >= 0 && whole ? bytes : -1;
  }

  // A length-delimited field's length, as the parse takes it: a varint
  // below 2^31 (ReadVarint32 would keep the low 32 bits of a longer one).
  bool ReadLength(int* length) {
    uint64_t v = 0;
    if (!in_->ReadVarint64(&v) || v > static_cast<uint64_t>(INT32_MAX)) return false;
    *length = static_cast<int>(v);
    return true;
  }

  CodedInputStream* in_;
};

int64_t Walk(const Descriptor& type, CodedInputStream* in) {
  in->SetRecursionLimit(kMaxDepth + 1);
  return Walker(in).Message(&type, 0);
}

}  // namespace

int64_t DecodedBytesBound(const Descriptor& type, const grpc::ByteBuffer& wire) {
  grpc::ByteBuffer copy(wire);  // shares the slices; the reader advances its own view
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok()) return -1;
  CodedInputStream in(&reader);
  return Walk(type, &in);
}

int64_t DecodedBytesBound(const Descriptor& type, absl::string_view wire) {
  google::protobuf::io::ArrayInputStream stream(wire.data(), static_cast<int>(wire.size()));
  CodedInputStream in(&stream);
  return Walk(type, &in);
}

int64_t BytesWhileParsing(int64_t wire_bytes, int64_t decoded_bound) {
  return Sum(wire_bytes, std::max(wire_bytes, decoded_bound));
}

}  // namespace posenc::server
