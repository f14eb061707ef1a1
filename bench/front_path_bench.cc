// posenc-bench-fronts: the server's per-call work for the same RoPE request
// through each front, in process, without sockets or a load generator:
// posenc.v1 ApplyRope (its Method: split the tensor bytes out, parse,
// rotate in place, serialise without a copy) against KServe v2 ModelInfer
// (its Method: protobuf parse, rotate in place, serialise without a copy),
// each run by RunMethod as an admitted call runs it. Alternating, median of repeated runs; one
// thread, CPU backend. What bench/kserve_overhead.sh cannot separate on a shared machine: the
// fronts' own cost.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grpc/grpc.h"
#include "grpcpp/support/byte_buffer.h"
#include "kserve/grpc_service.pb.h"
#include "kserve/service.h"
#include "posenc/v1/posenc.pb.h"
#include "posenc/wire/requests.h"
#include "posenc/wire/tensors.h"
#include "v1/service.h"

namespace {

using Clock = std::chrono::steady_clock;

grpc::ByteBuffer BufferOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 200;
  grpc_init();
  posenc::server::EngineOptions options;
  options.enable_cuda = false;
  options.cpu_threads = 1;
  auto engine = posenc::server::Engine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  posenc::server::KServeService kserve(engine->get());
  const posenc::server::Method* fronts[2] = {nullptr, nullptr};
  const std::vector<posenc::server::Method> v1_methods =
      posenc::server::PositionalEncodingService(engine->get()).Methods();
  const std::vector<posenc::server::Method> v2_methods = kserve.Methods();
  for (const auto& m : v1_methods)
    if (m.name == "ApplyRope") fronts[0] = &m;
  for (const auto& m : v2_methods)
    if (m.name == "ModelInfer") fronts[1] = &m;
  if (fronts[0] == nullptr || fronts[1] == nullptr) std::abort();
  std::printf("%-22s %12s %12s %12s %8s\n", "query (fp32)", "bytes", "v1 us", "v2 us", "v2/v1");
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 128, 16, 128}, {32, 1, 32, 128}, {1, 512, 32, 128}, {4, 16, 8, 64}};
  std::mt19937 rng(7);
  for (const std::vector<int64_t>& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> q(n);
    for (float& x : q) x = std::normal_distribution<float>()(rng);
    const posenc::TensorView view{posenc::DType::kFloat32, shape, q.data(), q.size() * 4};

    posenc::v1::RopeRequest v1;
    posenc::wire::SetRopeOptions(posenc::RopeOptions(), &v1);
    posenc::wire::SetTensor(view, v1.mutable_query(), v1.mutable_query_data());
    const std::string v1_bytes = v1.SerializeAsString();

    inference::ModelInferRequest v2;
    v2.set_model_name("rope");
    auto* in = v2.add_inputs();
    in->set_name("query");
    in->set_datatype("FP32");
    for (int64_t d : shape) in->add_shape(d);
    v2.add_raw_input_contents(std::string(static_cast<const char*>(view.data), view.nbytes));
    const std::string v2_bytes = v2.SerializeAsString();

    std::vector<double> t1, t2;
    for (int i = 0; i < reps; ++i) {
      for (int front = 0; front < 2; ++front) {
        const std::string& bytes = front == 0 ? v1_bytes : v2_bytes;
        grpc::ByteBuffer request = BufferOf(bytes), answer;
        auto ticket = (*engine)->admission().Enter();
        if (!ticket.ok() || !ticket->TryGrow(2 * static_cast<int64_t>(bytes.size())).ok()) {
          std::abort();
        }
        const posenc::RunContext rc;
        posenc::server::CallFacts facts;
        const auto start = Clock::now();
        posenc::server::MethodCall call{rc, &*ticket, start, &facts};
        const absl::Status s = posenc::server::RunMethod(*fronts[front], &request, &answer, call);
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        if (!s.ok()) {
          std::fprintf(stderr, "front %d: %s\n", front, s.ToString().c_str());
          return 1;
        }
        (front == 0 ? t1 : t2).push_back(us);
      }
    }
    char name[64];
    std::snprintf(name, sizeof name, "%lld,%lld,%lld,%lld", static_cast<long long>(shape[0]),
                  static_cast<long long>(shape[1]), static_cast<long long>(shape[2]),
                  static_cast<long long>(shape[3]));
    const double m1 = Median(t1), m2 = Median(t2);
    std::printf("%-22s %12lld %12.1f %12.1f %8.3f\n", name, static_cast<long long>(n * 4), m1, m2,
                m2 / m1);
  }
  return 0;
}
