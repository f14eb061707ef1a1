// Any bytes as a request of either front (the first byte picks the type:
// KServe's ModelInferRequest or posenc.v1's RopeRequest, AttentionBiasRequest
// and AbsoluteEncodingRequest), through DecodedBytesBound, the walk that
// sizes a request before it is parsed. A finding is a crash, a sanitizer
// report, a walk that does not end, or a message that parses although its
// bound said the bytes are not a message (admission would then not have
// charged what it holds).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "kserve/grpc_service.pb.h"
#include "posenc/v1/posenc.pb.h"
#include "rpc/decoded_size.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 is refused loudly
    return true;
  }();
  (void)quiet;
  if (size == 0) return 0;
  std::unique_ptr<google::protobuf::Message> message;
  switch (data[0] % 4) {
    case 0:
      message = std::make_unique<inference::ModelInferRequest>();
      break;
    case 1:
      message = std::make_unique<posenc::v1::RopeRequest>();
      break;
    case 2:
      message = std::make_unique<posenc::v1::AttentionBiasRequest>();
      break;
    default:
      message = std::make_unique<posenc::v1::AbsoluteEncodingRequest>();
      break;
  }
  const std::string wire(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int64_t bound = posenc::server::DecodedBytesBound(*message->GetDescriptor(), wire);
  if (message->ParseFromString(wire) && bound < 0) {
    std::fprintf(stderr, "decoded_size_fuzz: a %s parsed that the bound refused\n",
                 message->GetDescriptor()->full_name().c_str());
    std::abort();
  }
  return 0;
}
