// DecodedBytesBound against what parsing really allocates (glibc's count
// of bytes in use, mallinfo2), for the requests that made it necessary and
// for ordinary ones: never below, and for tensors sent as bytes not much
// above the wire size (or every call would be charged for nothing).
#include "rpc/decoded_size.h"

#include <malloc.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "kserve/grpc_service.pb.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::server {
namespace {

using inference::ModelInferRequest;

// Bytes glibc has handed out and not had back.
int64_t InUse() { return static_cast<int64_t>(mallinfo2().uordblks); }

// Parses `wire` as a new `T` on the heap and returns what that allocated
// (the message kept alive meanwhile), or -1 if it does not parse.
template <typename T>
int64_t ParsedBytes(const std::string& wire) {
  const int64_t before = InUse();
  auto m = std::make_unique<T>();
  if (!m->ParseFromString(wire)) return -1;
  return InUse() - before;
}

template <typename T>
void ExpectBoundHolds(const std::string& what, const T& message, double at_most_times = 0) {
  const std::string wire = message.SerializeAsString();
  const int64_t bound = DecodedBytesBound(*T::descriptor(), wire);
  std::printf("%-44s wire %9zu  bound %10lld", what.c_str(), wire.size(),
              static_cast<long long>(bound));
  ASSERT_GE(bound, 0) << what;
  // The ByteBuffer walk (slices) agrees with the contiguous one.
  grpc::Slice slice(wire);
  EXPECT_EQ(DecodedBytesBound(*T::descriptor(), grpc::ByteBuffer(&slice, 1)), bound) << what;
#ifndef POSENC_UNDER_SANITIZER  // the sanitizer's allocator is not glibc's
  const int64_t parsed = ParsedBytes<T>(wire);
  std::printf("  allocated %10lld", static_cast<long long>(parsed));
  EXPECT_GE(bound, parsed) << what;
#endif
  std::printf("\n");
  if (at_most_times > 0) {
    EXPECT_LE(bound, at_most_times * static_cast<double>(wire.size()) + 4096) << what;
  }
}

ModelInferRequest Rope() {
  ModelInferRequest r;
  r.set_model_name("rope");
  return r;
}

TEST(DecodedBytesBound, HoldsForManyEmptyInputs) {
  ModelInferRequest r = Rope();
  for (int i = 0; i < 200000; ++i) r.add_inputs();
  ExpectBoundHolds("200 000 empty inputs", r);
}

TEST(DecodedBytesBound, HoldsForManyNamedInputs) {
  ModelInferRequest r = Rope();
  for (int i = 0; i < 100000; ++i) {
    auto* in = r.add_inputs();
    in->set_name("input-" + std::to_string(i) + std::string(i % 40, 'x'));
    in->set_datatype("FP32");
    in->add_shape(0);
  }
  ExpectBoundHolds("100 000 named inputs", r);
}

TEST(DecodedBytesBound, HoldsForPackedZerosAndTypedContents) {
  ModelInferRequest r = Rope();
  auto* in = r.add_inputs();
  in->set_name("position_ids");
  in->set_datatype("INT64");
  for (int i = 0; i < 1000000; ++i) in->mutable_contents()->add_int64_contents(0);
  for (int i = 0; i < 100000; ++i) in->mutable_contents()->add_bool_contents(true);
  ExpectBoundHolds("1 000 000 int64 zeros", r);
  ModelInferRequest f = Rope();
  auto* q = f.add_inputs();
  q->set_name("query");
  q->set_datatype("FP32");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int i = 0; i < 1 << 20; ++i) q->mutable_contents()->add_fp32_contents(normal(rng));
  ExpectBoundHolds("1 Mi fp32 contents", f, 3.5);
}

TEST(DecodedBytesBound, HoldsForParametersAndUnknownFields) {
  ModelInferRequest r = Rope();
  for (int i = 0; i < 20000; ++i) {
    (*r.mutable_parameters())["p" + std::to_string(i)].set_int64_param(i);
  }
  ExpectBoundHolds("20 000 parameters", r);
  // Fields this type does not declare: varints, strings and groups.
  std::string unknown = Rope().SerializeAsString();
  for (int i = 0; i < 100000; ++i) unknown += std::string("\xf8\x07\x01", 3);  // field 127, varint
  for (int i = 0; i < 10000; ++i)
    unknown += std::string(
        "\xfa\x07\x03"
        "abc",
        6);               // a string
  unknown += "\xfb\x07";  // field 127, a group of 50 000 varint fields
  for (int i = 0; i < 50000; ++i) unknown += std::string("\x08\x01", 2);
  unknown += "\xfc\x07";
  const int64_t bound = DecodedBytesBound(*ModelInferRequest::descriptor(), unknown);
  ASSERT_GE(bound, 0);
#ifndef POSENC_UNDER_SANITIZER
  const int64_t parsed = ParsedBytes<ModelInferRequest>(unknown);
  std::printf("unknown fields: wire %zu bound %lld allocated %lld\n", unknown.size(),
              static_cast<long long>(bound), static_cast<long long>(parsed));
  EXPECT_GE(bound, parsed);
#endif
}

TEST(DecodedBytesBound, TensorsAsBytesCostLittleMoreThanTheirWire) {
  ModelInferRequest r = Rope();
  auto* in = r.add_inputs();
  in->set_name("query");
  in->set_datatype("FP32");
  for (int64_t d : {1, 512, 8, 128}) in->add_shape(d);
  r.add_raw_input_contents(std::string(512 * 8 * 128 * 4, '\x01'));
  (*r.mutable_parameters())["rope_theta"].set_double_param(10000);
  ExpectBoundHolds("KServe 2 MiB raw query", r, 1.01);

  v1::RopeRequest v;
  v.mutable_query()->set_dtype(v1::DATA_TYPE_BFLOAT16);
  for (int64_t d : {2, 1024, 8, 128}) v.mutable_query()->add_shape(d);
  v.set_query_data(std::string(2 * 1024 * 8 * 128 * 2, '\x02'));
  v.mutable_key()->set_dtype(v1::DATA_TYPE_BFLOAT16);
  v.set_key_data(std::string(2 * 1024 * 2 * 128 * 2, '\x03'));
  ExpectBoundHolds("v1 4.5 MiB bf16 query and key", v, 1.01);
}

TEST(DecodedBytesBound, RefusesWhatDoesNotParse) {
  const std::string good = Rope().SerializeAsString() + std::string("\x2a\x02\x0a\x00", 4);
  ASSERT_GE(DecodedBytesBound(*ModelInferRequest::descriptor(), good), 0);
  for (const std::string& bad :
       {good.substr(0, good.size() - 1),                // a length past the end
        std::string("\x2a\x05\x0a\x09", 4),             // an inner length past the outer
        std::string("\x0c", 1),                         // an end-group with none open
        std::string("\x00", 1),                         // field 0
        std::string("\xfb\x07\x08\x01", 4),             // a group never ended
        std::string("\x2a\x80\x80\x80\x80\x10", 6)}) {  // a length of 2^32
    EXPECT_EQ(DecodedBytesBound(*ModelInferRequest::descriptor(), bad), -1)
        << testing::PrintToString(bad);
    EXPECT_FALSE(ModelInferRequest().ParseFromString(bad));
  }
  // Nesting past protobuf's recursion limit.
  std::string deep;
  for (int i = 0; i < 150; ++i) {
    // InferParameter has no message fields; ModelInferRequest's inputs'
    // contents do not nest either: nest unknown groups instead.
    deep = "\xfb\x07" + deep + "\xfc\x07";
  }
  const bool parses = ModelInferRequest().ParseFromString(deep);
  EXPECT_EQ(DecodedBytesBound(*ModelInferRequest::descriptor(), deep) >= 0, parses);
}

TEST(DecodedBytesBound, RandomRequestsThatParseHaveABoundAboveTheirAllocation) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  ModelInferRequest base = Rope();
  auto* in = base.add_inputs();
  in->set_name("query");
  in->set_datatype("FP32");
  in->add_shape(4);
  in->mutable_contents()->add_fp32_contents(1.5f);
  (*in->mutable_parameters())["shared_memory_region"].set_string_param("r");
  base.add_outputs()->set_name("query_out");
  base.add_raw_input_contents("abcd");
  const std::string wire = base.SerializeAsString();
  int parsed_count = 0;
  google::protobuf::SetLogHandler(nullptr);  // mutated names are invalid UTF-8, loudly
  for (int i = 0; i < 20000; ++i) {
    std::string m = wire;
    for (int flips = 1 + static_cast<int>(rng() % 4); flips > 0; --flips) {
      m[rng() % m.size()] = static_cast<char>(rng());
    }
    if (rng() % 4 == 0) m += m.substr(rng() % m.size());  // repeated tails
    const int64_t bound = DecodedBytesBound(*ModelInferRequest::descriptor(), m);
    ModelInferRequest parsed;
    if (!parsed.ParseFromString(m)) continue;
    ++parsed_count;
    ASSERT_GE(bound, 0) << testing::PrintToString(m);
#ifndef POSENC_UNDER_SANITIZER
    ASSERT_GE(bound, ParsedBytes<ModelInferRequest>(m)) << testing::PrintToString(m);
#endif
  }
  std::printf("%d of 20000 mutated requests parsed\n", parsed_count);
  EXPECT_GT(parsed_count, 1000);
}

}  // namespace
}  // namespace posenc::server
