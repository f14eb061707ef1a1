#include "rpc/large_fields.h"

#include <random>
#include <string>

#include "grpcpp/support/proto_buffer_reader.h"
#include "gtest/gtest.h"
#include "kserve/grpc_service.pb.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::server {
namespace {

grpc::ByteBuffer BufferOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

TEST(TensorBytesOf, CountsBytesFieldsAndNamedSlicesWithoutParsing) {
  v1::RopeRequest r;
  r.set_query_data(std::string(1000, 'q'));
  r.set_key_data(std::string(24, 'k'));
  r.set_request_id("abc");
  r.set_rotary_dim(64);
  EXPECT_EQ(TensorBytesOf(BufferOf(r.SerializeAsString()), {2, 4}, {20, 21}), 1024u);
  r.clear_query_data();
  r.mutable_query_shm()->set_region("r");
  r.mutable_query_shm()->set_offset(64);
  r.mutable_query_shm()->set_byte_size(uint64_t{80} << 20);
  EXPECT_EQ(TensorBytesOf(BufferOf(r.SerializeAsString()), {2, 4}, {20, 21}),
            (uint64_t{80} << 20) + 24);
  // Fields not asked about do not count.
  EXPECT_EQ(TensorBytesOf(BufferOf(r.SerializeAsString()), {}, {}), 0u);
  // A slice's size near 2^64 and a data field after it: unknown, not a
  // wrapped small sum (which would have made the call look light).
  // (A message's fields may come in any order: the slice, then the data.)
  v1::RopeRequest slice, data;
  slice.mutable_query_shm()->set_byte_size(~uint64_t{0} - 4);
  data.set_key_data(std::string(64, 'k'));
  EXPECT_EQ(TensorBytesOf(BufferOf(slice.SerializeAsString() + data.SerializeAsString()), {2, 4},
                          {20, 21}),
            ~uint64_t{0});
}

TEST(TensorBytesOf, MalformedBytesAreUnknownNeverACrash) {
  EXPECT_EQ(TensorBytesOf(BufferOf("\xff\xff\xff"), {2}, {20}), ~uint64_t{0});
  EXPECT_EQ(TensorBytesOf(BufferOf(std::string("\x12\x7f", 2)), {2}, {20}), ~uint64_t{0});
  // A slice (field 20) of 2 bytes whose inner length varint runs past its
  // end: once read as a length of 133 and skipped beyond the buffer (found
  // by request_fuzz under ASan).
  EXPECT_EQ(TensorBytesOf(BufferOf(std::string("\xa2\x01\x02\x0a\x85\x01xy", 8)), {2}, {20}),
            ~uint64_t{0});
  // Random bytes and every prefix of a real message: no crash, and any
  // answer other than unknown is at most the message's size plus slices.
  v1::RopeRequest r;
  r.set_query_data(std::string(300, 'q'));
  r.mutable_key_shm()->set_byte_size(7);
  const std::string whole = r.SerializeAsString();
  for (size_t n = 0; n <= whole.size(); ++n) {
    const uint64_t got = TensorBytesOf(BufferOf(whole.substr(0, n)), {2, 4}, {20, 21});
    EXPECT_TRUE(got == ~uint64_t{0} || got <= 307) << n;
  }
  const unsigned seed = std::random_device()();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    std::string junk(rng() % 64, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    (void)TensorBytesOf(BufferOf(junk), {2, 4}, {20, 21});
  }
}

TEST(BufferWithLargeFields, RepeatedEntriesKeepTheirPlacesEmptyOnesToo) {
  // A KServe answer: outputs in the answer and in shared memory (empty).
  inference::ModelInferResponse resp;
  resp.set_model_name("rope");
  for (const char* name : {"query_out", "key_out", "x", "y"}) resp.add_outputs()->set_name(name);
  const std::vector<std::string> raw = {std::string(1000, 'q'), "", "xyz", ""};
  std::vector<std::string> moved = raw;
  std::vector<LargeField> large;
  for (std::string& c : moved) large.push_back({6, &c, /*repeated=*/true});
  grpc::ByteBuffer buffer = BufferWithLargeFields(resp.SerializeAsString(), large);
  for (const std::string& c : moved) EXPECT_TRUE(c.empty()) << "handed over, not copied";
  inference::ModelInferResponse back;
  grpc::ProtoBufferReader reader(&buffer);
  ASSERT_TRUE(back.ParseFromZeroCopyStream(&reader));
  ASSERT_EQ(back.raw_output_contents_size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back.raw_output_contents(i), raw[i]) << i;
  EXPECT_EQ(back.outputs_size(), 4);
  // A singular field left empty is not sent at all.
  v1::RopeResponse rope;
  std::string empty;
  grpc::ByteBuffer none = BufferWithLargeFields(rope.SerializeAsString(), {{2, &empty}});
  EXPECT_EQ(none.Length(), rope.SerializeAsString().size());
}

}  // namespace
}  // namespace posenc::server
