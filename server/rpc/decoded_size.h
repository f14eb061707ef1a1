// How much memory a request will hold once parsed, known before it is
// parsed. Admission charges a call for its message twice (the bytes read
// and the typed copy), which is right for tensors sent as bytes, but a
// message's wire form can be far smaller than its parsed form: an empty
// repeated submessage is two bytes on the wire and an object of a hundred
// bytes or more in memory, a packed varint one byte and eight. A 4 MiB
// KServe request of empty inputs parsed into over 500 MiB before anything
// looked at it. So the call is charged this bound instead, before parsing:
// a request that would not fit is refused (RESOURCE_EXHAUSTED), not found
// out afterwards.
//
// The bound walks the wire format with the message's descriptor, without
// building anything: per message object its size (the type's prototype)
// and an allocation, per string or bytes field its length and a heap
// string, per repeated element a pointer slot, per repeated scalar three
// times its width (the field's growth, and the tensor a front builds from
// typed contents while the field still holds them), per map entry a node,
// per unknown field an UnknownFieldSet entry (groups, and every field
// inside them, likewise). decoded_size_test holds it above what glibc
// actually allocates for hostile and ordinary requests of both fronts.
#ifndef POSENC_SERVER_RPC_DECODED_SIZE_H_
#define POSENC_SERVER_RPC_DECODED_SIZE_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/byte_buffer.h"

namespace posenc::server {

// An upper bound on the bytes a `type` message parsed from `wire` holds
// (the wire bytes themselves not included), saturating at INT64_MAX; -1
// where the bytes are not a well-formed message (the parse refuses them).
int64_t DecodedBytesBound(const google::protobuf::Descriptor& type, const grpc::ByteBuffer& wire);
int64_t DecodedBytesBound(const google::protobuf::Descriptor& type, absl::string_view wire);

// What a call holds while its request of `wire_bytes` is parsed: the bytes
// read, and the parsed message (at least as much again, as admission always
// counted: the fronts move tensors out of it into buffers of their own).
int64_t BytesWhileParsing(int64_t wire_bytes, int64_t decoded_bound);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_DECODED_SIZE_H_
