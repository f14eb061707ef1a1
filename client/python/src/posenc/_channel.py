"""Channel settings shared by Client and AsyncClient, matching the C++
client's (client/src/client.cc): gRPC's own retry policy for UNAVAILABLE (and
RESOURCE_EXHAUSTED when asked), round-robin over every address of a name,
client-side health checking, and a deadline on every call."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import grpc

from posenc.errors import invalid

SERVICE = "posenc.v1.PositionalEncoding"


@dataclass(frozen=True)
class ChannelConfig:
    target: str = "localhost:50051"
    # Seconds for a call that names no timeout of its own.
    timeout: float = 30.0
    # Attempts in all for a retried status (gRPC allows 2..5; clamped).
    max_attempts: int = 4
    # RESOURCE_EXHAUSTED comes from an overloaded replica before it reads the
    # request, so the call never ran: retried like UNAVAILABLE when set (with
    # round_robin the next attempt goes to the next replica). Off by default:
    # a caller with its own queue may rather shed the work.
    retry_resource_exhausted: bool = False
    load_balancing: str = "round_robin"  # or "pick_first"
    # Calls go only to replicas whose grpc.health.v1 status for this name is
    # SERVING, so a draining replica stops getting calls at once. "" = off.
    health_check_service: str = SERVICE
    min_time_between_resolutions: float = 30.0
    # Seconds at most between attempts to reconnect to an address that is
    # down (a replica restarting). gRPC's own cap is 120 s: a server back
    # after a minute could wait a minute more for the next attempt.
    max_reconnect_backoff: float = 5.0
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    max_message_bytes: int = 1 << 30
    # TLS: PEM bytes; off unless root_certificates (or use_tls) is given.
    use_tls: bool = False
    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    tls_server_name: str = ""
    # Further gRPC channel arguments, appended (later ones win), e.g.
    # (("grpc.min_reconnect_backoff_ms", 100),).
    channel_options: tuple = ()
    # Tensors through shared memory when the server shares this node and its
    # /dev/shm (posenc._shm): "auto" uses it when it can and the socket
    # otherwise, "off" never, "require" fails a call that cannot use it.
    # Results are bit for bit the socket's.
    shared_memory: str = "auto"

    def validate(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._/-]*", self.health_check_service):
            raise invalid("health_check_service must be a gRPC service name (letters, digits, "
                          f"'.', '_', '-', '/') or empty; got {self.health_check_service!r}")
        if self.load_balancing not in ("round_robin", "pick_first"):
            raise invalid(f"load_balancing must be round_robin or pick_first; got "
                          f"{self.load_balancing!r}")
        if not 0 <= self.min_time_between_resolutions <= 86400:
            raise invalid("min_time_between_resolutions must lie in [0, 86400] seconds; got "
                          f"{self.min_time_between_resolutions}")
        if not 0 < self.max_reconnect_backoff <= 86400:
            raise invalid("max_reconnect_backoff must lie in (0, 86400] seconds; got "
                          f"{self.max_reconnect_backoff}")
        if not self.timeout > 0:
            raise invalid(f"timeout must be > 0 seconds; got {self.timeout}")
        if not 0 < self.initial_backoff <= self.max_backoff:
            raise invalid("backoff must satisfy 0 < initial_backoff <= max_backoff; got "
                          f"{self.initial_backoff}, {self.max_backoff}")
        if self.shared_memory not in ("auto", "off", "require"):
            raise invalid(f"shared_memory must be auto, off or require; got {self.shared_memory!r}")
        if not 0 < self.max_message_bytes <= 2**31 - 1:
            raise invalid(f"max_message_bytes must lie in [1, 2^31 - 1]; got {self.max_message_bytes}")

    def service_config(self) -> str:
        codes = ["UNAVAILABLE"] + (["RESOURCE_EXHAUSTED"] if self.retry_resource_exhausted else [])
        config = {
            "loadBalancingConfig": [{self.load_balancing: {}}],
            "methodConfig": [{
                "name": [{"service": SERVICE}],
                "retryPolicy": {
                    "maxAttempts": min(max(int(self.max_attempts), 2), 5),
                    "initialBackoff": f"{self.initial_backoff:.3f}s",
                    "maxBackoff": f"{self.max_backoff:.3f}s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": codes,
                },
            }],
        }
        if self.health_check_service:
            config["healthCheckConfig"] = {"serviceName": self.health_check_service}
        return json.dumps(config)

    def options(self) -> list[tuple[str, object]]:
        opts = [
            ("grpc.service_config", self.service_config()),
            ("grpc.enable_retries", 1),
            # Retries buffer the request; allow it for tensor-sized messages.
            ("grpc.per_rpc_retry_buffer_size", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", 30000),
            ("grpc.dns_min_time_between_resolutions_ms",
             int(self.min_time_between_resolutions * 1000)),
            ("grpc.max_reconnect_backoff_ms", max(1, int(self.max_reconnect_backoff * 1000))),
        ]
        if self.tls_server_name:
            opts.append(("grpc.ssl_target_name_override", self.tls_server_name))
        return opts + [tuple(o) for o in self.channel_options]

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.use_tls or self.root_certificates):
            return None
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key,
                                            self.certificate_chain)
