#include "rpc/messages.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace posenc::server {
namespace {

absl::Status NotA(const google::protobuf::Message& message, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", message.GetDescriptor()->full_name(), " message",
                   why.empty() ? "" : " (", why, why.empty() ? "" : ")"));
}

}  // namespace

absl::Status ParseMessage(grpc::ByteBuffer* in, google::protobuf::Message* message,
                          absl::Span<const LargeField> large) {
  if (large.empty()) {
    grpc::ProtoBufferReader reader(in);
    const bool parsed = reader.status().ok() && message->ParseFromZeroCopyStream(&reader);
    in->Clear();
    return parsed ? absl::OkStatus() : NotA(*message, "");
  }
  std::vector<grpc::Slice> slices;
  const grpc::Status dumped = in->Dump(&slices);
  in->Clear();
  if (!dumped.ok()) return absl::InternalError("could not read the request's bytes");
  // The large fields go to strings of their own until the rest has parsed:
  // parsing would clear them.
  std::vector<std::string> contents(large.size());
  std::vector<LargeField> split;
  for (size_t i = 0; i < large.size(); ++i) split.push_back({large[i].number, &contents[i]});
  std::string rest;
  absl::Status s = SplitLargeFields(&slices, split, &rest);
  if (!s.ok()) return NotA(*message, s.message());
  if (!message->ParseFromString(rest)) return NotA(*message, "its fields do not parse");
  for (size_t i = 0; i < large.size(); ++i) *large[i].data = std::move(contents[i]);
  return absl::OkStatus();
}

absl::Status ParseAdmitted(MethodCall& call, grpc::ByteBuffer* in,
                           google::protobuf::Message* message, absl::Span<const LargeField> large) {
  const int64_t bytes = static_cast<int64_t>(in->Length());
  POSENC_RETURN_IF_ERROR(ParseMessage(in, message, large));
  if (call.admission != nullptr) call.admission->Shrink(bytes);
  return absl::OkStatus();
}

absl::Status SerializeMessage(google::protobuf::Message& message, grpc::ByteBuffer* out,
                              absl::Span<const LargeField> large) {
  std::vector<std::string> contents(large.size());
  std::vector<LargeField> moved;
  for (size_t i = 0; i < large.size(); ++i) {
    contents[i] = std::move(*large[i].data);
    large[i].data->clear();
    moved.push_back({large[i].number, &contents[i]});
  }
  std::string head;
  if (!message.SerializeToString(&head)) {
    return absl::InternalError("could not serialise the answer");
  }
  *out = BufferWithLargeFields(head, moved);
  return absl::OkStatus();
}

}  // namespace posenc::server
