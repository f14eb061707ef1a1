// The trace a caller's call belongs to, from its W3C Trace Context header
// (`traceparent: 00-<trace-id>-<parent-id>-<flags>`, www.w3.org/TR/trace-context),
// so that the server's log lines about the call can be joined to the
// caller's distributed trace. The server records no spans of its own: the
// trace id is carried into the lines, nothing more.
#ifndef POSENC_SERVER_RPC_TRACE_CONTEXT_H_
#define POSENC_SERVER_RPC_TRACE_CONTEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace posenc::server {

// The trace id (32 lowercase hex digits) of a `traceparent` value, or ""
// when the value is not one the specification lets a receiver use: a
// version other than two lowercase hex digits or "ff"; for version 00
// anything but exactly 55 characters, for a later version fewer, or more
// without a '-' after the four fields (later versions may append fields);
// a trace id or parent id of the wrong length, with a digit that is not
// lowercase hex, or all zeros; flags that are not two lowercase hex digits.
std::string TraceIdOf(absl::string_view traceparent);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_TRACE_CONTEXT_H_
