// posenc.v1 messages in, posenc.v1 messages out: each tensor method read
// through wire/ into kernel types, run on the Engine, and answered. Request
// tensors are never copied: the engine works inside the request's buffers,
// which then move into the response (sent without a copy).
#ifndef POSENC_SERVER_V1_OPERATIONS_H_
#define POSENC_SERVER_V1_OPERATIONS_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "posenc/v1/posenc.pb.h"

namespace posenc::server {

// Tensor bytes a request carries (what admission counts).
int64_t RequestBytes(const v1::RopeRequest& r);
int64_t RequestBytes(const v1::AbsoluteEncodingRequest& r);
int64_t RequestBytes(const v1::EncodingTableRequest& r);
int64_t RequestBytes(const v1::AttentionBiasRequest& r);

// The operations on an admitted call (`admission` already holds the
// request). `req` is left without its tensors. `before_compute`, when
// given, is CallEnv::before_compute: called once the call can no longer be
// refused without having changed a tensor it computes on in place.
using BeforeCompute = std::function<absl::Status()>;
[[nodiscard]] absl::Status ApplyRope(Engine& engine, v1::RopeRequest* req, v1::RopeResponse* resp,
                                     const RunContext& ctx, Engine::Admission& admission,
                                     const BeforeCompute& before_compute);
[[nodiscard]] absl::Status AddAbsoluteEncoding(Engine& engine, v1::AbsoluteEncodingRequest* req,
                                               v1::AbsoluteEncodingResponse* resp,
                                               const RunContext& ctx, Engine::Admission& admission,
                                               const BeforeCompute& before_compute);
[[nodiscard]] absl::Status GetEncodingTable(Engine& engine, v1::EncodingTableRequest* req,
                                            v1::EncodingTableResponse* resp, const RunContext& ctx,
                                            Engine::Admission& admission,
                                            const BeforeCompute& before_compute);
[[nodiscard]] absl::Status AttentionBias(Engine& engine, v1::AttentionBiasRequest* req,
                                         v1::AttentionBiasResponse* resp, const RunContext& ctx,
                                         Engine::Admission& admission,
                                         const BeforeCompute& before_compute);

// Admit, then run (for callers holding a whole request: tests, tools).
[[nodiscard]] absl::Status ApplyRope(Engine& engine, v1::RopeRequest* req, v1::RopeResponse* resp,
                                     const RunContext& ctx);

// The control plane's answers.
v1::ListTablesResponse ListTables(const Engine& engine);
// `transport_bytes`: the transport's memory cap (0: none), which the engine
// does not know.
v1::ServerInfo GetServerInfo(const Engine& engine, int64_t transport_bytes = 0);

}  // namespace posenc::server

#endif  // POSENC_SERVER_V1_OPERATIONS_H_
