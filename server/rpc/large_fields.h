// Reading and writing the tensor-carrying messages of posenc.v1 without the
// copies protobuf would make of their large `bytes` fields.
//
// Parsing a 48 MiB bytes field with protobuf costs 3.4x its size at peak
// (the read buffers, plus a string that outgrows its first 50 MB
// reservation and is copied as it doubles); serialising an answer copies it
// again. Here a request's large fields are copied once, straight from the
// received slices into exactly-sized strings, each slice released as soon
// as it is consumed; an answer's large fields are handed to gRPC as slices
// that own the strings, without a copy. Everything else goes through
// protobuf as usual, and the wire format is exactly protobuf's (fields may
// come in any order; for a repeated singular field the last one wins).
#ifndef POSENC_SERVER_RPC_LARGE_FIELDS_H_
#define POSENC_SERVER_RPC_LARGE_FIELDS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "grpcpp/support/byte_buffer.h"

namespace posenc::server {

// A large bytes field: its number, and where its contents go (or come from).
struct LargeField {
  int number;
  std::string* data;
  // An element of a repeated field: sent even when empty (it holds its
  // place among the others); a singular one is not (proto3).
  bool repeated = false;
};

// Splits a serialised message into the contents of the fields numbered in
// `large` (length-delimited occurrences; the last wins) and everything else,
// re-encoded in `rest` for protobuf to parse. `slices` are consumed and
// released front to back. INVALID_ARGUMENT on malformed input (truncated
// varints or lengths, groups, field number 0).
[[nodiscard]] absl::Status SplitLargeFields(std::vector<grpc::Slice>* slices,
                                            absl::Span<const LargeField> large, std::string* rest);

// `head` (the message serialised without its large fields) followed by each
// large field (singular ones only when non-empty) as tag, length and a
// slice that takes ownership of the string's buffer (the string is left
// empty).
grpc::ByteBuffer BufferWithLargeFields(const std::string& head, absl::Span<const LargeField> large);

// The tensor bytes a serialised message carries or names, without parsing
// it: the lengths of its top-level bytes fields `data_fields`, plus the
// byte_size of its SharedMemorySlice fields `slice_fields` (the last
// occurrence of a field counts as protobuf's parse would not add them up,
// so this can only overstate). ~0 when the bytes do not parse. Copies none.
uint64_t TensorBytesOf(const grpc::ByteBuffer& message, absl::Span<const int> data_fields,
                       absl::Span<const int> slice_fields);

// `inner` (a serialised message) as field `number` of an enclosing message,
// without a copy of its bytes.
grpc::ByteBuffer NestedMessage(int number, const grpc::ByteBuffer& inner);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_LARGE_FIELDS_H_
