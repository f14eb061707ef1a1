// Shared-memory tensors in KServe requests: parameters read into slices of
// registered regions (or refused by name), and raw_input_contents paired
// with the inputs not in shared memory, as Triton pairs them.
#include "kserve/shared_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kserve/tensors.h"

namespace posenc::server::kserve {
namespace {

using inference::ModelInferRequest;

// A registry with region "r": 64 bytes 0, 1, 2, ... of a /dev/shm object.
class KServeSharedMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = absl::StrCat("/posenc-kserve-test-", ::getpid());
    const int fd = ::open(("/dev/shm" + key_).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    for (int i = 0; i < 64; ++i) bytes_ += static_cast<char>(i);
    ASSERT_EQ(::pwrite(fd, bytes_.data(), 64, 0), 64);
    ::close(fd);
    SharedMemoryOptions o;
    o.enabled = true;
    registry_ = std::make_unique<SharedMemoryRegistry>(o, &budget_);
    ASSERT_TRUE(registry_->Register("r", key_, 0, 64).ok());
  }
  void TearDown() override { ::unlink(("/dev/shm" + key_).c_str()); }

  static void Name(Parameters* p, const char* region, int64_t size, int64_t offset = -1) {
    (*p)[kShmRegion].set_string_param(region);
    if (size >= 0) (*p)[kShmByteSize].set_int64_param(size);
    if (offset >= 0) (*p)[kShmOffset].set_uint64_param(offset);
  }

  std::string key_;
  std::string bytes_;
  AdmissionControl budget_{AdmissionOptions{}};
  std::unique_ptr<SharedMemoryRegistry> registry_;
};

TEST_F(KServeSharedMemory, ParametersNameASliceOrAreRefusedByName) {
  Parameters none;
  auto ref = ShmRefOf("input 0", none, registry_.get(), false);
  ASSERT_TRUE(ref.ok());
  EXPECT_FALSE(ref->has_value());

  Parameters p;
  Name(&p, "r", 16, 8);
  ref = ShmRefOf("input 0", p, registry_.get(), false);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ((*ref)->offset, 8);
  EXPECT_EQ((*ref)->byte_size, 16);

  struct Case {
    Parameters p;
    absl::StatusCode code;
    const char* word;
  };
  auto named = [](const char* region, int64_t size, int64_t offset = -1) {
    Parameters p;
    Name(&p, region, size, offset);
    return p;
  };
  std::vector<Case> cases = {
      {named("r", -1), absl::StatusCode::kInvalidArgument, "shared_memory_byte_size"},
      {named("r", 60, 8), absl::StatusCode::kInvalidArgument, "within"},
      {named("nobody", 4), absl::StatusCode::kNotFound, "nobody"},
  };
  Parameters size_only;  // a size without a region
  size_only[kShmByteSize].set_int64_param(4);
  cases.push_back({size_only, absl::StatusCode::kInvalidArgument, "shared_memory_region"});
  Parameters bad_offset = named("r", 4);
  bad_offset[kShmOffset].set_string_param("minus one");
  cases.push_back({bad_offset, absl::StatusCode::kInvalidArgument, "shared_memory_offset"});
  Parameters huge = named("r", 4);
  huge[kShmByteSize].set_uint64_param(UINT64_MAX);
  cases.push_back({huge, absl::StatusCode::kInvalidArgument, "shared_memory_byte_size"});
  Parameters not_a_string = named("r", 4);
  not_a_string[kShmRegion].set_int64_param(1);
  cases.push_back({not_a_string, absl::StatusCode::kInvalidArgument, "shared_memory_region"});
  for (const Case& c : cases) {
    absl::StatusOr<std::optional<ShmRef>> r = ShmRefOf("input 3", c.p, registry_.get(), false);
    ASSERT_FALSE(r.ok()) << c.word;
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_NE(r.status().message().find(c.word), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("input 3"), std::string::npos) << r.status();
  }
  // Outputs take no other parameter; inputs ignore others.
  Name(&p, "r", 4);
  p["binary_data"].set_bool_param(true);
  EXPECT_TRUE(ShmRefOf("input 0", p, registry_.get(), false).ok());
  EXPECT_EQ(ShmRefOf("output 0", p, registry_.get(), true).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Off (or no registry): FAILED_PRECONDITION saying how to enable.
  SharedMemoryRegistry off{SharedMemoryOptions{}, &budget_};
  const SharedMemoryRegistry* const registries[] = {&off, nullptr};
  for (const SharedMemoryRegistry* r : registries) {
    absl::Status s = ShmRefOf("input 0", p, r, false).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("--enable_system_shared_memory"), std::string::npos) << s;
  }
}

TEST_F(KServeSharedMemory, RawContentsPairWithTheInputsNotInSharedMemory) {
  ModelInferRequest req;
  auto add = [&](const char* name, int64_t n) {
    auto* in = req.add_inputs();
    in->set_name(name);
    in->set_datatype("FP32");
    in->add_shape(n);
    return in;
  };
  add("a", 2);
  Name(add("b", 4)->mutable_parameters(), "r", 16, 32);
  add("c", 1);
  req.add_raw_input_contents(std::string(8, 'a'));
  req.add_raw_input_contents(std::string(4, 'c'));
  int64_t bytes = 0;
  absl::StatusOr<ShmInputs> shm = ShmInputsOf(req, registry_.get(), &bytes);
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_EQ(bytes, 16);
  ModelInferRequest copy = req;
  absl::StatusOr<std::vector<Input>> in = TakeInputs(&copy, &*shm);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ((*in)[0].data, std::string(8, 'a'));
  EXPECT_TRUE((*in)[1].data.empty()) << "left in place";
  EXPECT_EQ(std::string((*in)[1].bytes(), 16), bytes_.substr(32, 16));
  EXPECT_EQ((*in)[2].data, std::string(4, 'c'));

  // One raw entry per input, as without shared memory, is refused.
  copy = req;
  copy.add_raw_input_contents(std::string(16, 'b'));
  in = TakeInputs(&copy, &*shm);
  EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(in.status().message().find("raw_input_contents"), std::string::npos);
  // A size that does not match the shape, before anything is read.
  copy = req;
  copy.mutable_inputs(1)->set_shape(0, 3);
  in = TakeInputs(&copy, &*shm);
  EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(in.status().message().find("\"b\""), std::string::npos) << in.status();
  // Typed contents and a region at once.
  copy = req;
  copy.mutable_inputs(1)->mutable_contents()->add_fp32_contents(1);
  EXPECT_EQ(TakeInputs(&copy, &*shm).status().code(), absl::StatusCode::kInvalidArgument);
  // Truncated after registration: the input stays in place untouched, and
  // reading it is FAILED_PRECONDITION, no signal (a page left whole past
  // the object's end reads as zeros, as bytes the caller rewrote would).
  ASSERT_EQ(::truncate(("/dev/shm" + key_).c_str(), 0), 0);
  copy = req;
  in = TakeInputs(&copy, &*shm);
  ASSERT_TRUE(in.ok()) << in.status();
  const absl::Status s = (*in)[1].MakePrivate("input 1");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
}

}  // namespace
}  // namespace posenc::server::kserve
