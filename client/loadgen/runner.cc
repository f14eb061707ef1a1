#include "runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace posenc::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

// Results of one call, however it was made.
struct Outcome {
  grpc::StatusCode code = grpc::StatusCode::OK;
  bool check_failed = false;
};

bool Matches(const Op& op, const std::string& got, const std::string& got_key) {
  return got == op.expected && (op.expected_key.empty() || got_key == op.expected_key);
}

// One response's outcome: its status (or, in a stream, its error_code) and,
// when checking, whether it equals the reference.
template <typename Response>
Outcome Judge(const Op& op, const grpc::Status& s, const Response& resp, bool check);

template <>
Outcome Judge(const Op& op, const grpc::Status& s, const v1::RopeResponse& resp, bool check) {
  Outcome o;
  o.code = s.ok() ? static_cast<grpc::StatusCode>(resp.error_code()) : s.error_code();
  if (o.code == grpc::StatusCode::OK && check) {
    o.check_failed = !Matches(op, resp.query_data(), resp.key_data());
  }
  return o;
}
template <>
Outcome Judge(const Op& op, const grpc::Status& s, const v1::AbsoluteEncodingResponse& resp,
              bool check) {
  Outcome o;
  o.code = s.error_code();
  if (s.ok() && check) o.check_failed = !Matches(op, resp.y_data(), "");
  return o;
}
template <>
Outcome Judge(const Op& op, const grpc::Status& s, const v1::AttentionBiasResponse& resp,
              bool check) {
  Outcome o;
  o.code = s.error_code();
  if (s.ok() && check) o.check_failed = !Matches(op, resp.bias_data(), "");
  return o;
}

std::string CodeName(grpc::StatusCode c) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
}

// Measured calls, shared by every caller.
class Recorder {
 public:
  Recorder(Clock::time_point measure_from, bool check)
      : measure_from_(measure_from), check_(check) {}

  void Add(const Op& op, Clock::time_point start, Clock::time_point end, const Outcome& o) {
    if (start < measure_from_) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (o.code == grpc::StatusCode::OK) {
      latencies_us_.push_back(std::chrono::duration<double, std::micro>(end - start).count());
      bytes_ += op.request_bytes + op.response_bytes;
      ++ok_;
      if (o.check_failed) ++check_failures_;
    } else {
      ++errors_[CodeName(o.code)];
    }
    ++measured_;
  }
  void AddClientError(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++errors_[what];
  }
  int64_t measured() const {
    std::lock_guard<std::mutex> lock(mu_);
    return measured_;
  }
  void Fill(RunResult& r, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    r.ok = ok_;
    r.errors = errors_;
    r.check_failures = check_failures_;
    r.seconds = seconds;
    r.requests_per_s = seconds > 0 ? ok_ / seconds : 0;
    r.gigabytes_per_s = seconds > 0 ? bytes_ / seconds / 1e9 : 0;
    std::sort(latencies_us_.begin(), latencies_us_.end());
    auto pct = [&](double p) {
      if (latencies_us_.empty()) return 0.0;
      const size_t i =
          std::min(latencies_us_.size() - 1, static_cast<size_t>(p * latencies_us_.size()));
      return latencies_us_[i];
    };
    r.p50_us = pct(0.5);
    r.p90_us = pct(0.9);
    r.p99_us = pct(0.99);
    r.p999_us = pct(0.999);
    double sum = 0;
    for (double v : latencies_us_) sum += v;
    r.mean_us = latencies_us_.empty() ? 0 : sum / latencies_us_.size();
  }
  // Latency percentile so far (for the progress line).
  double P50() {
    std::lock_guard<std::mutex> lock(mu_);
    if (latencies_us_.empty()) return 0;
    std::vector<double> copy(latencies_us_.end() - std::min<size_t>(latencies_us_.size(), 1000),
                             latencies_us_.end());
    std::nth_element(copy.begin(), copy.begin() + copy.size() / 2, copy.end());
    return copy[copy.size() / 2];
  }

 private:
  const Clock::time_point measure_from_;
  const bool check_;
  mutable std::mutex mu_;
  std::vector<double> latencies_us_;
  std::map<std::string, int64_t> errors_;
  int64_t ok_ = 0, check_failures_ = 0, measured_ = 0;
  double bytes_ = 0;
};

void SetDeadline(grpc::ClientContext& ctx, double timeout_s) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
}

Outcome CallSync(v1::PositionalEncoding::Stub& stub, const Op& op, const RunConfig& c) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, c.timeout_s);
  switch (op.kind) {
    case OpKind::kRope: {
      v1::RopeResponse resp;
      return Judge(op, stub.ApplyRope(&ctx, op.rope, &resp), resp, c.check);
    }
    case OpKind::kAbsolute: {
      v1::AbsoluteEncodingResponse resp;
      return Judge(op, stub.AddAbsoluteEncoding(&ctx, op.absolute, &resp), resp, c.check);
    }
    case OpKind::kBias: {
      v1::AttentionBiasResponse resp;
      return Judge(op, stub.AttentionBias(&ctx, op.bias, &resp), resp, c.check);
    }
  }
  return Outcome{grpc::StatusCode::INTERNAL};
}

// Calls in flight of the open loop; one object per call.
struct AsyncCall {
  grpc::ClientContext ctx;
  const Op* op = nullptr;
  Clock::time_point scheduled;
  v1::RopeResponse rope;
  v1::AbsoluteEncodingResponse absolute;
  v1::AttentionBiasResponse bias;
};

class Picker {
 public:
  Picker(const Mix& mix, uint32_t seed)
      : mix_(mix), rng_(seed), pick_(mix.weights.begin(), mix.weights.end()) {}
  const Op& Next() { return mix_.ops[pick_(rng_)]; }

 private:
  const Mix& mix_;
  std::mt19937 rng_;
  std::discrete_distribution<size_t> pick_;
};

}  // namespace

RunResult Run(v1::PositionalEncoding::Stub& stub, const Mix& mix, const RunConfig& c) {
  RunResult result;
  result.config = c;
  std::vector<std::string> names;
  for (size_t i = 0; i < mix.ops.size(); ++i) {
    names.push_back(absl::StrCat(mix.ops[i].name, ":", mix.weights[i]));
  }
  result.ops = absl::StrJoin(names, ",");
  const Clock::time_point start = Clock::now();
  const Clock::time_point measure_from =
      start + std::chrono::microseconds(static_cast<int64_t>(c.warmup_s * 1e6));
  // With a request count, a long safety limit instead of the duration.
  const double limit_s = c.requests > 0 ? 600.0 : c.warmup_s + c.duration_s;
  const Clock::time_point end =
      start + std::chrono::microseconds(static_cast<int64_t>(limit_s * 1e6));
  Recorder rec(measure_from, c.check);
  std::atomic<bool> done{false};
  auto finished = [&] {
    return Clock::now() >= end || (c.requests > 0 && rec.measured() >= c.requests);
  };

  std::thread progress;
  if (c.progress) {
    progress = std::thread([&] {
      while (!done) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        const double t = std::chrono::duration<double>(Clock::now() - start).count();
        std::fprintf(stderr, "\r  %s %5.1fs  %8lld measured  p50 %8.0f us   ", c.target.c_str(), t,
                     static_cast<long long>(rec.measured()), rec.P50());
      }
      std::fprintf(stderr, "\n");
    });
  }

  if (!c.open_loop) {
    std::vector<std::thread> callers;
    for (int w = 0; w < c.concurrency; ++w) {
      callers.emplace_back([&, w] {
        Picker picker(mix, 1234 + w);
        std::unique_ptr<grpc::ClientContext> sctx;
        std::unique_ptr<grpc::ClientReaderWriter<v1::RopeRequest, v1::RopeResponse>> stream;
        if (c.stream) {
          sctx = std::make_unique<grpc::ClientContext>();
          stream = stub.StreamRope(sctx.get());
        }
        while (!finished()) {
          const Op& op = picker.Next();
          const Clock::time_point t0 = Clock::now();
          Outcome o;
          if (c.stream) {
            v1::RopeResponse resp;
            if (!stream->Write(op.rope) || !stream->Read(&resp)) {
              grpc::Status s = stream->Finish();
              rec.Add(op, t0, Clock::now(),
                      Outcome{s.ok() ? grpc::StatusCode::UNKNOWN : s.error_code()});
              return;
            }
            o = Judge(op, grpc::Status::OK, resp, c.check);
          } else {
            o = CallSync(stub, op, c);
          }
          rec.Add(op, t0, Clock::now(), o);
        }
        if (stream) {
          stream->WritesDone();
          (void)stream->Finish();
        }
      });
    }
    for (auto& t : callers) t.join();
  } else {
    // Arrivals on a schedule; latency counts from the scheduled time, so a
    // slow server cannot hide queueing (no coordinated omission).
    constexpr int kMaxOutstanding = 4096;
    std::atomic<int> outstanding{0};
    std::mt19937 rng(99);
    std::exponential_distribution<double> gap(c.rate);
    Picker picker(mix, 4321);
    double t = 0;
    while (!finished()) {
      t += c.poisson ? gap(rng) : 1.0 / c.rate;
      const Clock::time_point when =
          start + std::chrono::microseconds(static_cast<int64_t>(t * 1e6));
      std::this_thread::sleep_until(when);
      if (finished()) break;
      if (outstanding >= kMaxOutstanding) {
        rec.AddClientError("CLIENT_OVERLOADED");
        continue;
      }
      auto* call = new AsyncCall;
      call->op = &picker.Next();
      call->scheduled = when;
      SetDeadline(call->ctx, c.timeout_s);
      ++outstanding;
      auto finish = [&, call](grpc::Status s, const auto& resp) {
        rec.Add(*call->op, call->scheduled, Clock::now(), Judge(*call->op, s, resp, c.check));
        --outstanding;
        delete call;
      };
      switch (call->op->kind) {
        case OpKind::kRope:
          stub.async()->ApplyRope(&call->ctx, &call->op->rope, &call->rope,
                                  [call, finish](grpc::Status s) { finish(s, call->rope); });
          break;
        case OpKind::kAbsolute:
          stub.async()->AddAbsoluteEncoding(
              &call->ctx, &call->op->absolute, &call->absolute,
              [call, finish](grpc::Status s) { finish(s, call->absolute); });
          break;
        case OpKind::kBias:
          stub.async()->AttentionBias(&call->ctx, &call->op->bias, &call->bias,
                                      [call, finish](grpc::Status s) { finish(s, call->bias); });
          break;
      }
    }
    while (outstanding > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double seconds =
      std::chrono::duration<double>(std::min(Clock::now(), end) - measure_from).count();
  done = true;
  if (progress.joinable()) progress.join();
  rec.Fill(result, std::max(seconds, 1e-9));
  return result;
}

std::string ToJson(const RunResult& r) {
  std::vector<std::string> errors;
  for (const auto& [code, n] : r.errors) errors.push_back(absl::StrCat("\"", code, "\": ", n));
  const RunConfig& c = r.config;
  return absl::StrCat(
      "{\"target\": \"", c.target, "\", \"ops\": \"", r.ops, "\", \"api\": \"",
      c.stream ? "stream" : "unary", "\", \"mode\": \"", c.open_loop ? "open" : "closed",
      "\", \"concurrency\": ", c.concurrency, ", \"rate\": ", c.open_loop ? c.rate : 0,
      ", \"arrival\": \"", c.poisson ? "poisson" : "constant", "\", \"ok\": ", r.ok,
      ", \"check_failures\": ", r.check_failures, ", \"seconds\": ", r.seconds,
      ", \"requests_per_s\": ", r.requests_per_s, ", \"gigabytes_per_s\": ", r.gigabytes_per_s,
      ", \"latency_us\": {\"p50\": ", r.p50_us, ", \"p90\": ", r.p90_us, ", \"p99\": ", r.p99_us,
      ", \"p999\": ", r.p999_us, ", \"mean\": ", r.mean_us, "}, \"errors\": {",
      absl::StrJoin(errors, ", "), "}}");
}

}  // namespace posenc::loadgen
