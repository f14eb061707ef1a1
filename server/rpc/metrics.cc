#include "rpc/metrics.h"

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace posenc::server {
namespace {

prometheus::MetricFamily OneGauge(const std::string& name, const std::string& help, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric m;
  m.gauge.value = value;
  family.metric.push_back(m);
  return family;
}

// Reads the engine's live state at scrape time.
class EngineCollector : public prometheus::Collectable {
 public:
  EngineCollector(const Engine* engine, int64_t memory_limit_bytes)
      : engine_(engine), memory_limit_bytes_(memory_limit_bytes) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out = {
        OneGauge("posenc_inflight_requests", "Requests computing now (the HPA's scaling signal)",
                 engine_->inflight()),
        // Near the limit, the next large call waits and then gets
        // RESOURCE_EXHAUSTED (DEADLINE_EXCEEDED if its own deadline is
        // shorter): what to alert on before callers see it.
        OneGauge("posenc_inflight_bytes",
                 "Memory held now under --max_inflight_bytes: calls in flight, and what the "
                 "server keeps between calls (GPU staging, idle scratch)",
                 static_cast<double>(engine_->inflight_bytes())),
        OneGauge("posenc_inflight_bytes_limit",
                 "The budget of --max_inflight_bytes (by default sized under the cgroup's memory "
                 "limit)",
                 static_cast<double>(engine_->options().max_inflight_bytes))};
    if (memory_limit_bytes_ > 0) {
      out.push_back(OneGauge("posenc_memory_limit_bytes",
                             "The memory the server may use: its cgroup's (container's) "
                             "limit, else the machine's memory",
                             static_cast<double>(memory_limit_bytes_)));
    }
    const Backend* cuda = engine_->cuda();
    if (cuda != nullptr && cuda->health().ok()) {
      const DeviceInfo d = cuda->device();
      prometheus::MetricFamily mem;
      mem.name = "posenc_gpu_memory_total_bytes";
      mem.help = "Memory of the GPU the CUDA backend uses";
      mem.type = prometheus::MetricType::Gauge;
      prometheus::ClientMetric g;
      g.label.push_back({"device", d.name});
      g.gauge.value = static_cast<double>(d.memory_bytes);
      mem.metric.push_back(g);
      out.push_back(mem);
    }
    return out;
  }

 private:
  const Engine* engine_;
  const int64_t memory_limit_bytes_;
};

}  // namespace

struct Metrics::Families {
  prometheus::Family<prometheus::Counter>* requests;
  prometheus::Family<prometheus::Histogram>* latency;
  prometheus::Family<prometheus::Counter>* bytes;
  prometheus::Family<prometheus::Counter>* backend;
  std::shared_ptr<EngineCollector> engine;
};

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen,
                                                        const Engine* engine,
                                                        int64_t memory_limit_bytes) {
  std::unique_ptr<Metrics> m(new Metrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", listen, ": ", e.what()));
  }
  auto f = std::make_unique<Families>();
  f->requests = &prometheus::BuildCounter()
                     .Name("posenc_requests_total")
                     .Help("Finished calls by method and gRPC status code")
                     .Register(*m->registry_);
  f->latency = &prometheus::BuildHistogram()
                    .Name("posenc_request_duration_seconds")
                    .Help("Server-side call latency by method")
                    .Register(*m->registry_);
  f->bytes = &prometheus::BuildCounter()
                  .Name("posenc_bytes_total")
                  .Help(
                      "Message bytes by method and direction (in, out); KServe tensors passed in "
                      "shared memory count as if they were in the message")
                  .Register(*m->registry_);
  f->backend = &prometheus::BuildCounter()
                    .Name("posenc_backend_requests_total")
                    .Help("Computed requests by the backend that ran them")
                    .Register(*m->registry_);
  f->engine = std::make_shared<EngineCollector>(engine, memory_limit_bytes);
  m->families_ = std::move(f);
  m->exposer_->RegisterCollectable(m->registry_);
  m->exposer_->RegisterCollectable(m->families_->engine);
  const auto ports = m->exposer_->GetListeningPorts();
  m->port_ = ports.empty() ? 0 : ports.front();
  return m;
}

Metrics::~Metrics() = default;

void Metrics::RecordCall(const std::string& method, const std::string& code, double seconds,
                         double bytes_in, double bytes_out, const std::string& backend) {
  // Buckets from 50 us (decode-sized RoPE) to 10 s (huge tables).
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 10};
  families_->requests->Add({{"method", method}, {"code", code}}).Increment();
  families_->latency->Add({{"method", method}}, kBuckets).Observe(seconds);
  families_->bytes->Add({{"method", method}, {"direction", "in"}}).Increment(bytes_in);
  families_->bytes->Add({{"method", method}, {"direction", "out"}}).Increment(bytes_out);
  if (!backend.empty()) families_->backend->Add({{"backend", backend}}).Increment();
}

}  // namespace posenc::server
