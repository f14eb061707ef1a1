#include "device_memory.h"

#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "call_outcome.h"

namespace posenc::client_internal {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  return s.ok() ? absl::OkStatus()
                : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void UnregisterName(v1::PositionalEncoding::Stub* stub, const std::string& name) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::UnregisterSharedMemoryRequest req;
  req.set_name(name);
  v1::SharedMemoryStatus resp;
  (void)stub->UnregisterSharedMemory(&ctx, req, &resp);  // best effort
}

}  // namespace

DeviceRegions::~DeviceRegions() {
  for (const auto& [base, a] : allocations_) UnregisterName(stub_, a.name);
}

absl::Status DeviceRegions::Register(const DeviceAllocation& a, grpc::ClientContext* ctx) {
  if (a.base == nullptr || a.bytes == 0) {
    return absl::InvalidArgumentError("DeviceAllocation needs its base and a size above 0");
  }
  if (a.ipc_handle.size() != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceAllocation.ipc_handle must be cudaIpcGetMemHandle's 64 bytes, got ",
                     a.ipc_handle.size()));
  }
  const auto base = reinterpret_cast<uintptr_t>(a.base);
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = allocations_.lower_bound(base);
    if ((next != allocations_.end() && next->first - base < a.bytes) ||
        (next != allocations_.begin() &&
         base - std::prev(next)->first < std::prev(next)->second.bytes)) {
      return absl::AlreadyExistsError(
          "this device memory overlaps an allocation already registered");
    }
    // A nonce beside the pid: names must not collide with another
    // process's (another pid namespace) or an earlier client's at this address.
    static const uint64_t nonce = std::random_device{}() * uint64_t{0x9e3779b97f4a7c15};
    name = absl::StrCat("posenc-cpp-dev-", ::getpid(), "-", absl::Hex(nonce), "-",
                        reinterpret_cast<uintptr_t>(this), "-", next_++);
    allocations_[base] = Allocation{a.bytes, name, /*pending=*/true};
  }
  v1::RegisterSharedMemoryRequest req;
  req.set_name(name);
  req.set_cuda_handle(a.ipc_handle);
  req.set_cuda_device(a.device);
  req.set_byte_size(a.bytes);
  v1::SharedMemoryStatus resp;
  const absl::Status s = FromGrpc(stub_->RegisterSharedMemory(ctx, req, &resp));
  if (!s.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      allocations_.erase(base);
    }
    // The outcome is unknown (a deadline, a dropped connection): the server
    // may have registered it, and would keep the allocation open.
    if (OutcomeUnknown(s.code())) UnregisterName(stub_, name);
    return s;
  }
  std::lock_guard<std::mutex> lock(mu_);
  allocations_[base].pending = false;
  return absl::OkStatus();
}

absl::Status DeviceRegions::Unregister(const void* base, grpc::ClientContext* ctx) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(base));
    if (it == allocations_.end() || it->second.pending) {
      return absl::NotFoundError("no device memory is registered at this base");
    }
    name = it->second.name;
    allocations_.erase(it);
  }
  v1::UnregisterSharedMemoryRequest req;
  req.set_name(name);
  v1::SharedMemoryStatus resp;
  return FromGrpc(stub_->UnregisterSharedMemory(ctx, req, &resp));
}

absl::StatusOr<std::optional<std::vector<v1::SharedMemorySlice>>> DeviceRegions::Find(
    std::initializer_list<std::pair<const char*, const MutableTensor*>> tensors) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (allocations_.empty()) return std::nullopt;
  std::vector<v1::SharedMemorySlice> slices;
  const char* in_host = nullptr;
  for (const auto& [field, t] : tensors) {
    if (!t->present()) continue;
    const auto at = reinterpret_cast<uintptr_t>(t->data);
    auto it = allocations_.upper_bound(at);
    bool inside = false;
    if (it != allocations_.begin()) {
      --it;
      const bool starts_in = at - it->first < it->second.bytes;
      if (starts_in && it->second.pending) {
        // Not host memory either: the host must not read it.
        return absl::UnavailableError(absl::StrCat(
            field, " lies in device memory whose registration is still in flight; call again"));
      }
      inside = starts_in && t->nbytes <= it->second.bytes - (at - it->first);
      if (starts_in && !inside) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, " starts in registered device memory but runs past the end of its allocation"));
      }
    }
    if (!inside) {
      if (in_host == nullptr) in_host = field;
      continue;
    }
    v1::SharedMemorySlice s;
    s.set_region(it->second.name);
    s.set_offset(at - it->first);
    s.set_byte_size(t->nbytes);
    slices.push_back(std::move(s));
  }
  if (slices.empty()) return std::nullopt;
  if (in_host != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(in_host,
                     " is in host memory while other tensors of the call are in registered device "
                     "memory; a call's tensors must all be in one or the other"));
  }
  return slices;
}

}  // namespace posenc::client_internal
