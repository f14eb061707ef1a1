// posenc-bench-layout: what a tensor's bytes cost at the top level of a
// message versus nested in a sub-message, through gRPC's own serialisation
// path (SerializationTraits to and from a ByteBuffer), median of repeated runs
// (grpc/grpc#23231 reported ~28 ms more for a 77 MB nested field).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "layout.pb.h"

namespace {

double MedianMs(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename M>
double RoundTripMs(const M& m, int reps) {
  return MedianMs(reps, [&] {
    grpc::ByteBuffer buffer;
    bool own = false;
    if (!grpc::SerializationTraits<M>::Serialize(m, &buffer, &own).ok()) std::abort();
    M back;
    if (!grpc::SerializationTraits<M>::Deserialize(&buffer, &back).ok()) std::abort();
  });
}

}  // namespace

int main() {
  std::printf("%-10s %16s %16s %10s\n", "bytes", "top-level ms", "nested ms", "nested-top");
  for (size_t bytes : {size_t{1} << 20, size_t{16} << 20, size_t{77} << 20}) {
    std::string data(bytes, '\x5a');
    for (size_t i = 0; i < bytes; i += 4096) data[i] = static_cast<char>(i * 7);
    posenc::bench::TopLevel top;
    top.mutable_desc()->set_dtype(3);
    top.mutable_desc()->add_shape(static_cast<int64_t>(bytes / 2));
    top.set_data(data);
    posenc::bench::Nested nested;
    nested.mutable_tensor()->set_dtype(3);
    nested.mutable_tensor()->add_shape(static_cast<int64_t>(bytes / 2));
    nested.mutable_tensor()->set_data(data);
    const int reps = bytes > (32u << 20) ? 9 : 31;
    const double t = RoundTripMs(top, reps), n = RoundTripMs(nested, reps);
    std::printf("%-10zu %16.3f %16.3f %10.3f\n", bytes, t, n, n - t);
  }
  return 0;
}
