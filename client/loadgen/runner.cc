#include "runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace posenc::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

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
Outcome Judge(const Op& op, const grpc::Status& s, const v1::RopeResponse& resp, bool check) {
  Outcome o;
  o.code = s.ok() ? static_cast<grpc::StatusCode>(resp.error_code()) : s.error_code();
  if (o.code == grpc::StatusCode::OK && check) {
    o.check_failed = !Matches(op, resp.query_data(), resp.key_data());
  }
  return o;
}
Outcome Judge(const Op& op, const grpc::Status& s, const v1::AbsoluteEncodingResponse& resp,
              bool check) {
  return Outcome{s.error_code(), s.ok() && check && !Matches(op, resp.y_data(), "")};
}
Outcome Judge(const Op& op, const grpc::Status& s, const v1::EncodingTableResponse& resp,
              bool check) {
  return Outcome{s.error_code(), s.ok() && check && !Matches(op, resp.table_data(), "")};
}
Outcome Judge(const Op& op, const grpc::Status& s, const v1::AttentionBiasResponse& resp,
              bool check) {
  return Outcome{s.error_code(), s.ok() && check && !Matches(op, resp.bias_data(), "")};
}

std::string CodeName(grpc::StatusCode c) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
}

// Nearest rank: the smallest value with at least p of the values at or
// below it (p90 of 10 is the 9th, not the largest).
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(p * static_cast<double>(sorted.size()) - 1e-9);
  const size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return sorted[std::min(sorted.size() - 1, i)];
}

// Calls by the measurement window they completed in (arrivals of the open
// loop by the window they were scheduled in), shared by every caller.
// Latencies are kept only for the windows a result can still be made of.
class Recorder {
 public:
  Recorder(Clock::time_point measure_from, Clock::duration window, int max_windows)
      : measure_from_(measure_from), window_(window), buckets_(max_windows) {}

  void Add(const Op& op, Clock::time_point start, Clock::time_point end, const Outcome& o) {
    std::lock_guard<std::mutex> lock(mu_);
    if (o.code != grpc::StatusCode::OK) {
      ++errors_[CodeName(o.code)];
      return;
    }
    // A wrong answer is not throughput: it is counted apart (and fails the
    // run), not among the calls whose rate and latency are reported.
    if (o.check_failed) {
      ++check_failures_;
      return;
    }
    Bucket* b = Find(end);
    if (b == nullptr) return;
    b->latencies_us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    b->bytes += op.request_bytes + op.response_bytes;
    ++b->ok;
  }
  void AddArrival(Clock::time_point scheduled, bool dropped) {
    std::lock_guard<std::mutex> lock(mu_);
    if (Bucket* b = Find(scheduled); b != nullptr) {
      ++b->scheduled;
      if (dropped) ++b->dropped;
    }
  }
  // Window `w` is over: its throughput and median.
  Window Close(int w) {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = w + 1;
    Bucket& b = buckets_[w];
    std::sort(b.latencies_us.begin(), b.latencies_us.end());
    if (w >= kStableWindows) std::vector<double>().swap(buckets_[w - kStableWindows].latencies_us);
    return Window{b.ok / std::chrono::duration<double>(window_).count(),
                  Percentile(b.latencies_us, 0.5)};
  }
  // The result over windows [first, last).
  void Fill(int first, int last, RunResult& r) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<double> all;
    double bytes = 0;
    int64_t scheduled = 0;
    for (int w = first; w < last; ++w) {
      const Bucket& b = buckets_[w];
      all.insert(all.end(), b.latencies_us.begin(), b.latencies_us.end());
      bytes += b.bytes;
      r.ok += b.ok;
      scheduled += b.scheduled;
      r.dropped += b.dropped;
    }
    std::sort(all.begin(), all.end());
    r.seconds = (last - first) * std::chrono::duration<double>(window_).count();
    r.requests_per_s = r.ok / r.seconds;
    r.gigabytes_per_s = bytes / r.seconds / 1e9;
    r.asked_per_s = scheduled / r.seconds;
    r.p50_us = Percentile(all, 0.5);
    r.p90_us = Percentile(all, 0.9);
    r.p95_us = Percentile(all, 0.95);
    r.p99_us = Percentile(all, 0.99);
    r.p999_us = Percentile(all, 0.999);
    r.max_us = all.empty() ? 0 : all.back();
    double sum = 0;
    for (double v : all) sum += v;
    r.mean_us = all.empty() ? 0 : sum / all.size();
    r.errors = errors_;
    r.check_failures = check_failures_;
  }

 private:
  struct Bucket {
    std::vector<double> latencies_us;
    int64_t ok = 0, scheduled = 0, dropped = 0;
    double bytes = 0;
  };
  // The open window holding time `t`; null in the warm-up, after the last
  // window, or in one already closed.
  Bucket* Find(Clock::time_point t) {
    if (t < measure_from_) return nullptr;
    const int64_t w = (t - measure_from_) / window_;
    if (w < closed_ || w >= static_cast<int64_t>(buckets_.size())) return nullptr;
    return &buckets_[w];
  }

  const Clock::time_point measure_from_;
  const Clock::duration window_;
  std::mutex mu_;
  std::vector<Bucket> buckets_;
  int64_t closed_ = 0;  // windows before this one are closed
  std::map<std::string, int64_t> errors_;
  int64_t check_failures_ = 0;
};

void SetDeadline(grpc::ClientContext& ctx, double timeout_s) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
}

// One call; *end is when its answer came, before --check compares it (the
// comparison is the load generator's time, not the server's).
Outcome CallSync(v1::PositionalEncoding::Stub& stub, const Op& op, const RunConfig& c,
                 Clock::time_point* end) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, c.timeout_s);
  const auto judged = [&](const grpc::Status& s, const auto& resp) {
    *end = Clock::now();
    return Judge(op, s, resp, c.check);
  };
  switch (op.kind) {
    case OpKind::kRope: {
      v1::RopeResponse resp;
      return judged(stub.ApplyRope(&ctx, op.rope, &resp), resp);
    }
    case OpKind::kAbsolute: {
      v1::AbsoluteEncodingResponse resp;
      return judged(stub.AddAbsoluteEncoding(&ctx, op.absolute, &resp), resp);
    }
    case OpKind::kTable: {
      v1::EncodingTableResponse resp;
      return judged(stub.GetEncodingTable(&ctx, op.table, &resp), resp);
    }
    case OpKind::kBias: {
      v1::AttentionBiasResponse resp;
      return judged(stub.AttentionBias(&ctx, op.bias, &resp), resp);
    }
  }
  *end = Clock::now();
  return Outcome{grpc::StatusCode::INTERNAL};
}

// Calls in flight of the open loop; one object per call.
struct AsyncCall {
  grpc::ClientContext ctx;
  const Op* op = nullptr;
  Clock::time_point scheduled;
  v1::RopeResponse rope;
  v1::AbsoluteEncodingResponse absolute;
  v1::EncodingTableResponse table;
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

// The closed loop's open streams: the end of a run cancels those still
// waiting for an answer rather than wait out their deadline.
class OpenStreams {
 public:
  void Add(grpc::ClientContext* ctx) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) ctx->TryCancel();
    open_.insert(ctx);
  }
  void Remove(grpc::ClientContext* ctx) {
    std::lock_guard<std::mutex> lock(mu_);
    open_.erase(ctx);
  }
  void CancelAll() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    for (grpc::ClientContext* ctx : open_) ctx->TryCancel();
  }

 private:
  std::mutex mu_;
  std::set<grpc::ClientContext*> open_;
  bool cancelled_ = false;
};

// Closed loop: one caller, one call at a time, until `stop`. A stream that
// breaks is counted as an error and opened again (after a backoff, 1 ms
// doubling to 100 ms while they keep breaking at once, so a server that
// refuses streams is not hammered), so the point keeps its callers.
// `stream_deadline` ends a stream whose server stopped answering (a stream
// has no per-message deadline), so the run cannot hang.
void Caller(v1::PositionalEncoding::Stub& stub, const Mix& mix, const RunConfig& c, int index,
            const std::atomic<bool>& stop, Recorder& rec,
            std::chrono::system_clock::time_point stream_deadline, OpenStreams& streams) {
  Picker picker(mix, 1234 + index);
  std::unique_ptr<grpc::ClientContext> sctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RopeRequest, v1::RopeResponse>> stream;
  const auto close = [&] {
    stream.reset();
    if (sctx) streams.Remove(sctx.get());
    sctx.reset();
  };
  int broken = 0;  // streams in a row that broke before an answer
  while (!stop) {
    if (c.stream && stream == nullptr) {
      sctx = std::make_unique<grpc::ClientContext>();
      sctx->set_deadline(stream_deadline);
      streams.Add(sctx.get());
      stream = stub.StreamRope(sctx.get());
    }
    const Op& op = picker.Next();
    const Clock::time_point t0 = Clock::now();
    Clock::time_point end;
    Outcome o;
    if (c.stream) {
      v1::RopeResponse resp;
      if (!stream->Write(op.rope) || !stream->Read(&resp)) {
        grpc::Status s = stream->Finish();
        close();
        if (stop) break;  // cancelled at the end of the run: not the server's
        rec.Add(op, t0, Clock::now(), Outcome{s.ok() ? grpc::StatusCode::UNKNOWN : s.error_code()});
        // Past the stream's deadline every new stream fails at once.
        if (std::chrono::system_clock::now() >= stream_deadline) return;
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::min(100, 1 << std::min(broken, 7))));
        ++broken;
        continue;
      }
      broken = 0;
      end = Clock::now();
      o = Judge(op, grpc::Status::OK, resp, c.check);
    } else {
      o = CallSync(stub, op, c, &end);
    }
    rec.Add(op, t0, end, o);
  }
  if (stream) {
    stream->WritesDone();
    (void)stream->Finish();
  }
  close();
}

// Open loop: arrivals on a schedule until `stop`. Latency counts from the
// scheduled time, so a slow server cannot hide queueing (no coordinated
// omission); an arrival finding max_outstanding calls in flight is dropped.
class Sender {
 public:
  Sender(v1::PositionalEncoding::Stub& stub, const Mix& mix, const RunConfig& c, Recorder& rec,
         Clock::time_point start)
      : stub_(stub), mix_(mix), c_(c), rec_(rec), start_(start) {}

  void Run(const std::atomic<bool>& stop) {
    std::mt19937 rng(99);
    std::exponential_distribution<double> gap(c_.rate);
    Picker picker(mix_, 4321);
    double t = 0;
    while (!stop) {
      t += c_.poisson ? gap(rng) : 1.0 / c_.rate;
      const Clock::time_point when = start_ + Seconds(t);
      next_.store(when.time_since_epoch().count());
      // In slices, so that a slow rate (one call a minute) cannot hold the
      // end of the run.
      while (!stop && Clock::now() < when) {
        std::this_thread::sleep_until(std::min(when, Clock::now() + std::chrono::milliseconds(20)));
      }
      if (stop) break;
      const bool drop = outstanding_ >= c_.max_outstanding;
      rec_.AddArrival(when, drop);
      if (!drop) Send(picker.Next(), when);
    }
  }
  int64_t outstanding() const { return outstanding_; }
  // How far behind its schedule the sender is now, in ms (0 when on time).
  double LagMs() const {
    const Clock::time_point next{Clock::duration(next_.load())};
    return std::max(0.0, std::chrono::duration<double, std::milli>(Clock::now() - next).count());
  }
  void WaitForCalls() const {
    while (outstanding_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

 private:
  void Send(const Op& op, Clock::time_point when) {
    auto* call = new AsyncCall;
    call->op = &op;
    call->scheduled = when;
    SetDeadline(call->ctx, c_.timeout_s);
    ++outstanding_;
    auto finish = [this, call](grpc::Status s, const auto& resp) {
      // The answer's time first: --check's comparison is not the server's.
      const Clock::time_point end = Clock::now();
      rec_.Add(*call->op, call->scheduled, end, Judge(*call->op, s, resp, c_.check));
      delete call;
      --outstanding_;
    };
    auto* async = stub_.async();
    switch (op.kind) {
      case OpKind::kRope:
        async->ApplyRope(&call->ctx, &op.rope, &call->rope,
                         [call, finish](grpc::Status s) { finish(s, call->rope); });
        break;
      case OpKind::kAbsolute:
        async->AddAbsoluteEncoding(&call->ctx, &op.absolute, &call->absolute,
                                   [call, finish](grpc::Status s) { finish(s, call->absolute); });
        break;
      case OpKind::kTable:
        async->GetEncodingTable(&call->ctx, &op.table, &call->table,
                                [call, finish](grpc::Status s) { finish(s, call->table); });
        break;
      case OpKind::kBias:
        async->AttentionBias(&call->ctx, &op.bias, &call->bias,
                             [call, finish](grpc::Status s) { finish(s, call->bias); });
        break;
    }
  }

  v1::PositionalEncoding::Stub& stub_;
  const Mix& mix_;
  const RunConfig& c_;
  Recorder& rec_;
  const Clock::time_point start_;
  std::atomic<int64_t> outstanding_{0};
  std::atomic<Clock::rep> next_{0};
};

}  // namespace

int64_t RunResult::failed() const {
  int64_t n = 0;
  for (const auto& [code, count] : errors) n += count;
  return n;
}

RunResult Run(v1::PositionalEncoding::Stub& stub, const Mix& mix, const RunConfig& c) {
  RunResult result;
  result.config = c;
  std::vector<std::string> names;
  for (size_t i = 0; i < mix.ops.size(); ++i) {
    names.push_back(absl::StrCat(mix.ops[i].name, ":", mix.weights[i]));
  }
  result.ops = absl::StrJoin(names, ",");
  const int max_trials = std::max(c.max_trials, kStableWindows);
  const Clock::duration window = Seconds(c.measurement_interval_ms / 1000);
  const Clock::time_point start = Clock::now();
  const Clock::time_point measure_from = start + Seconds(c.warmup_s);
  Recorder rec(measure_from, window, max_trials);
  std::atomic<bool> stop{false};

  std::vector<std::thread> threads;
  OpenStreams streams;
  std::unique_ptr<Sender> sender;
  if (c.open_loop) {
    sender = std::make_unique<Sender>(stub, mix, c, rec, start);
    threads.emplace_back([&] { sender->Run(stop); });
  } else {
    // Streams outlive calls: each ends by this at the latest, the whole run
    // at most (warm-up and every window) and one call's timeout after it.
    const auto stream_deadline =
        std::chrono::system_clock::now() +
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            Seconds(c.warmup_s) + window * max_trials + Seconds(c.timeout_s) + window);
    for (int w = 0; w < c.concurrency; ++w) {
      threads.emplace_back([&, w, stream_deadline] {
        Caller(stub, mix, c, w, stop, rec, stream_deadline, streams);
      });
    }
  }

  // Windows until the last ones agree or the trials run out. Each closes a
  // moment after its end, so that calls finishing on the edge are in.
  const Clock::duration grace =
      std::min<Clock::duration>(window / 20, std::chrono::milliseconds(5));
  int trials = 0;
  while (trials < max_trials && !result.stable) {
    std::this_thread::sleep_until(measure_from + window * (trials + 1) + grace);
    result.windows.push_back(rec.Close(trials));
    ++trials;
    result.stable = IsStable(result.windows, c.stability_percentage);
    if (c.progress) {
      const Window& w = result.windows.back();
      std::fprintf(stderr, "  %s window %d: %.1f req/s, p50 %.0f us%s\n", c.target.c_str(), trials,
                   w.requests_per_s, w.p50_us, result.stable ? " (stable)" : "");
    }
  }
  if (sender) {
    result.backlog = sender->outstanding();
    result.sender_lag_ms = sender->LagMs();
  }
  stop = true;
  streams.CancelAll();
  for (auto& t : threads) t.join();
  if (sender) sender->WaitForCalls();
  rec.Fill(std::max(0, trials - kStableWindows), trials, result);
  if (c.open_loop) {
    result.sustained =
        result.dropped == 0 && result.sender_lag_ms <= c.measurement_interval_ms &&
        result.requests_per_s >= result.asked_per_s * (1 - c.rate_tolerance_percentage / 100);
  }
  return result;
}

}  // namespace posenc::loadgen
