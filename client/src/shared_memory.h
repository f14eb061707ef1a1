// The client's shared-memory regions (internal to the client library).
//
// When the server shares this node and its /dev/shm (a `unix:` target, or
// the shared_memory_domain GetServerInfo advertises equal to ours), tensor
// bytes go through a region this client owns instead of the socket: the
// client copies a tensor in, the server works on it in place there, the
// client copies the result out. Regions are created on first need, reused
// across calls, and replaced by one twice as large (at least) when a call
// needs more; each is registered with the server once and unlinked from
// /dev/shm at once (the server's mapping and ours keep it alive), so a
// crashed client leaves no file behind. A call holds a region (a Lease) for
// its whole duration, so concurrent calls use different regions.
//
// Anything that stops a region from working (the server without shared
// memory, in another /dev/shm, restarted and without our registration)
// turns shared memory off for the client, which then uses the socket. A
// region refused for want of room (the server's memory budget or region
// caps, a full /dev/shm: RESOURCE_EXHAUSTED) or for a moment's trouble
// (the server starting or unreachable, a registration out of time) is not
// that: the client uses the socket for a while (100 ms, doubling to 5 s
// while refusals go on) and then asks again, so that a busy moment does not
// cost it shared memory for good.
//
// A region goes back to the pool only after a call the server finished
// with (it answered, or refused the call before any work). After a call
// that ended on this side (its deadline, a cancellation, a lost
// connection) the server may still be computing into the region, so it is
// unregistered instead and never serves another call.
//
// Unregistering never blocks a call: it is sent asynchronously (counted in
// the client's PendingCalls, which ~Client waits for), except by the pool's
// destructor.
#ifndef POSENC_CLIENT_SRC_SHARED_MEMORY_H_
#define POSENC_CLIENT_SRC_SHARED_MEMORY_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pending_calls.h"
#include "posenc/v1/posenc.grpc.pb.h"

namespace posenc::client_internal {

// This process's shared-memory domain, computed as the server computes its
// own ("<boot id>/<device>:<inode>" of /dev/shm); "" when unknown.
std::string LocalSharedMemoryDomain();

class SharedMemoryPool;

// One mapped, registered region.
class ClientRegion {
 public:
  ~ClientRegion();
  const std::string& name() const { return name_; }
  char* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  friend class SharedMemoryPool;
  ClientRegion(std::string name, char* data, int64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  std::string name_;
  char* data_;
  int64_t size_;
};

// A region held for one call; returns it to the pool when destroyed.
class Lease {
 public:
  Lease(SharedMemoryPool* pool, std::unique_ptr<ClientRegion> region)
      : pool_(pool), region_(std::move(region)) {}
  Lease(Lease&& other) noexcept
      : pool_(other.pool_), region_(std::move(other.region_)), discard_(other.discard_) {}
  Lease& operator=(Lease&& other) noexcept {
    if (this != &other) {
      Release();
      pool_ = other.pool_;
      region_ = std::move(other.region_);
      discard_ = other.discard_;
    }
    return *this;
  }
  ~Lease() { Release(); }
  ClientRegion& region() { return *region_; }
  // The region is useless (the server lost it): drop it instead of pooling.
  void Discard() { discard_ = true; }

 private:
  void Release();
  SharedMemoryPool* pool_;
  std::unique_ptr<ClientRegion> region_;
  bool discard_ = false;
};

class SharedMemoryPool {
 public:
  // `stub` outlives the pool. `enabled` false: Take always declines.
  // `pending` counts the unregistrations in flight.
  SharedMemoryPool(v1::PositionalEncoding::Stub* stub, bool enabled, bool unix_target,
                   std::shared_ptr<PendingCalls> pending)
      : stub_(stub), enabled_(enabled), unix_target_(unix_target), pending_(std::move(pending)) {}
  // Unregisters every region (best effort, bounded) and unmaps it.
  ~SharedMemoryPool();

  // A region of at least `bytes`, or nullopt when shared memory is not used
  // (off, the server elsewhere, or it failed before).
  std::optional<Lease> Take(int64_t bytes);
  // Shared memory stops being used (the server refused a region).
  void Disable(const absl::Status& why);
  bool disabled() const;
  // Why the last Take declined: RESOURCE_EXHAUSTED while regions are
  // refused for want of room, else FAILED_PRECONDITION saying why shared
  // memory is not used.
  absl::Status WhyNot() const;

 private:
  friend class Lease;
  void Return(std::unique_ptr<ClientRegion> region);
  // Whether this server can share memory with us (asked until it answers).
  bool Usable();
  std::unique_ptr<ClientRegion> Create(int64_t bytes);
  // Sends the unregistration and returns (best effort).
  void Unregister(const std::string& name);
  // Waits for it, at most 2 s (the destructor's).
  void UnregisterNow(const std::string& name);
  // No region for a while (see the file comment).
  void Defer(const absl::Status& why);

  v1::PositionalEncoding::Stub* const stub_;
  const bool enabled_;
  const bool unix_target_;
  const std::shared_ptr<PendingCalls> pending_;
  mutable std::mutex mu_;
  std::optional<bool> usable_;                      // decided on first use
  absl::Status why_not_;                            // the last reason Take declined
  std::chrono::steady_clock::time_point retry_at_;  // Defer: no region before
  std::chrono::milliseconds backoff_{100};
  // GetServerInfo got no answer: not asked again before ask_at_.
  std::chrono::steady_clock::time_point ask_at_;
  std::chrono::milliseconds ask_backoff_{100};
  std::vector<std::unique_ptr<ClientRegion>> idle_;
  int64_t largest_ = 0;  // the largest region created
};

}  // namespace posenc::client_internal

#endif  // POSENC_CLIENT_SRC_SHARED_MEMORY_H_
