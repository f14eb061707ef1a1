// Requests of a given size for the memory tests of the real binary
// (memory_bound_test, cgroup_memory_test).
#ifndef POSENC_TESTS_SUPPORT_LARGE_REQUESTS_H_
#define POSENC_TESTS_SUPPORT_LARGE_REQUESTS_H_

#include <cstdint>
#include <string>

#include "posenc/v1/posenc.pb.h"

namespace posenc::testing {

// An fp32 RoPE request of `mib` MiB: query [1, tokens, 8, 128].
inline v1::RopeRequest RopeRequestOfMiB(int64_t mib) {
  const int64_t tokens = mib * (int64_t{1} << 20) / (8 * 128 * 4);
  v1::RopeRequest req;
  req.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {int64_t{1}, tokens, int64_t{8}, int64_t{128}}) {
    req.mutable_query()->add_shape(d);
  }
  req.set_query_data(std::string(tokens * 8 * 128 * 4, '\x01'));
  return req;
}

}  // namespace posenc::testing

#endif  // POSENC_TESTS_SUPPORT_LARGE_REQUESTS_H_
