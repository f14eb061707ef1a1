// Small helpers for the one error currency of posenc: absl::Status.
// Abseil 20220623 (Debian 12) has no public RETURN_IF_ERROR, so we keep ours.
#ifndef POSENC_STATUS_MACROS_H_
#define POSENC_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define POSENC_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status posenc_status_ = (expr);          \
    if (!posenc_status_.ok()) return posenc_status_; \
  } while (0)

#define POSENC_CONCAT_INNER_(a, b) a##b
#define POSENC_CONCAT_(a, b) POSENC_CONCAT_INNER_(a, b)

// POSENC_ASSIGN_OR_RETURN(auto x, Foo()); declares x from a StatusOr or returns
// the error.
#define POSENC_ASSIGN_OR_RETURN(lhs, expr) \
  POSENC_ASSIGN_OR_RETURN_IMPL_(POSENC_CONCAT_(posenc_statusor_, __LINE__), lhs, expr)
#define POSENC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

#endif  // POSENC_STATUS_MACROS_H_
