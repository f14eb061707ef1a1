// What a failed call leaves on the server (internal to the client library).
#ifndef POSENC_CLIENT_SRC_CALL_OUTCOME_H_
#define POSENC_CLIENT_SRC_CALL_OUTCOME_H_

#include "absl/status/status.h"

namespace posenc::client_internal {

// Whether a call that failed with `code` may still be running on the server
// or have taken effect there. The codes below the server sends having
// finished with the call (it refused it before any work, or did it); any
// other (a deadline, a cancellation, a lost connection, an unreadable
// answer) may come from this side or the connection while the server goes
// on: a region the call named may still be written, a registration may
// have been made.
inline bool OutcomeUnknown(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kUnimplemented:
      return false;
    default:
      return true;
  }
}

}  // namespace posenc::client_internal

#endif  // POSENC_CLIENT_SRC_CALL_OUTCOME_H_
