#include "kserve/statistics.h"

#include "absl/time/clock.h"

namespace posenc::server::kserve {

void ModelStatisticsTable::Record(const std::string& model, bool ok, int64_t total_ns,
                                  int64_t queue_ns, int64_t compute_ns) {
  const uint64_t now_ms = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  std::lock_guard<std::mutex> lock(mu_);
  Counts& c = models_[model];
  if (ok) {
    ++c.success;
    c.success_ns += static_cast<uint64_t>(total_ns);
    c.queue_ns += static_cast<uint64_t>(queue_ns);
    c.compute_ns += static_cast<uint64_t>(compute_ns);
  } else {
    ++c.fail;
    c.fail_ns += static_cast<uint64_t>(total_ns);
  }
  c.last_inference_ms = now_ms;
}

void ModelStatisticsTable::Fill(const std::string& model, const std::vector<std::string>& all,
                                inference::ModelStatisticsResponse* resp) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto add = [&](const std::string& name, const Counts& c) {
    inference::ModelStatistics* s = resp->add_model_stats();
    s->set_name(name);
    s->set_version("1");
    s->set_last_inference(c.last_inference_ms);
    // No batching across requests: one execution per inference.
    s->set_inference_count(c.success);
    s->set_execution_count(c.success);
    inference::InferStatistics* i = s->mutable_inference_stats();
    i->mutable_success()->set_count(c.success);
    i->mutable_success()->set_ns(c.success_ns);
    i->mutable_fail()->set_count(c.fail);
    i->mutable_fail()->set_ns(c.fail_ns);
    i->mutable_queue()->set_count(c.success);
    i->mutable_queue()->set_ns(c.queue_ns);
    i->mutable_compute_infer()->set_count(c.success);
    i->mutable_compute_infer()->set_ns(c.compute_ns);
    i->mutable_compute_input()->set_count(c.success);
    i->mutable_compute_output()->set_count(c.success);
  };
  if (!model.empty()) {
    auto it = models_.find(model);
    add(model, it == models_.end() ? Counts() : it->second);
    return;
  }
  for (const std::string& name : all) {
    auto it = models_.find(name);
    add(name, it == models_.end() ? Counts() : it->second);
  }
}

}  // namespace posenc::server::kserve
