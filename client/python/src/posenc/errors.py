"""The one exception the client raises: a gRPC status code and its message.

The server's messages name the field, what it expects and what came
("query.shape[3] must be even ..."); the client keeps them verbatim. Inputs
the client itself refuses before sending (an unsupported dtype, a wrong
option name) raise the same class with INVALID_ARGUMENT, so callers handle
one type whichever side found the problem.
"""

from __future__ import annotations

import grpc


class PosencError(Exception):
    """A failed call: `code` (grpc.StatusCode) and `message` (the server's text)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "PosencError":
        # grpc.RpcError raised by a call is also a grpc.Call with code() and
        # details(); the asyncio AioRpcError likewise.
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")

    @classmethod
    def from_status(cls, code_value: int, message: str) -> "PosencError":
        """From a numeric code, as StreamRope reports a failed message."""
        for code in grpc.StatusCode:
            if code.value[0] == code_value:
                return cls(code, message)
        return cls(grpc.StatusCode.UNKNOWN, f"(code {code_value}) {message}")


def invalid(message: str) -> PosencError:
    return PosencError(grpc.StatusCode.INVALID_ARGUMENT, message)
