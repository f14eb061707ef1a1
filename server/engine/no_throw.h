// The catch-all: work that may throw becomes a status, so that no exception
// reaches gRPC's threads, the executor's or a kernel pool's (std::terminate).
// Allocation failure is RESOURCE_EXHAUSTED (the server keeps serving and the
// caller may retry or send less); anything else is INTERNAL.
#ifndef POSENC_SERVER_ENGINE_NO_THROW_H_
#define POSENC_SERVER_ENGINE_NO_THROW_H_

#include <exception>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace posenc::server {

template <typename Fn>
absl::Status NoThrow(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "the server could not allocate memory for this call; retry later or send less");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected error: ", e.what()));
  } catch (...) {
    return absl::InternalError("unexpected error");
  }
}

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_NO_THROW_H_
