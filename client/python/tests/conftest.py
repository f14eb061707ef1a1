"""The real posenc-server binary in its own process for the suite, as the C++
process tests run it (tests/support/server_process.h): loopback, port 0, the bound
port read back from --port_file. POSENC_SERVER names the binary (the ctest
entry passes its own build's); the default is the repository's build/."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import socket
import struct
import subprocess
import tempfile
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


def server_binary() -> str:
    binary = os.environ.get("POSENC_SERVER") or str(ROOT / "build" / "server" / "posenc-server")
    if not os.access(binary, os.X_OK):
        pytest.exit(f"no posenc-server at {binary}; build it or set POSENC_SERVER", 2)
    return binary


def write_safetensors(path: pathlib.Path, tensors: dict[str, np.ndarray]) -> None:
    """A .safetensors file: an 8-byte little-endian header length, the JSON
    header, then the tensors' bytes."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        data = np.ascontiguousarray(a, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def unused_port() -> int:
    """A port nobody listens on now, below the kernel's ephemeral range: a
    server restarted on it finds it free, where one from the range could
    have been handed meanwhile to any outgoing connection (as
    tests/support/replicas.h's UnusedPort)."""
    try:
        low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no unused port below the ephemeral range")


class ServerProcess:
    def __init__(self, *flags: str, port: int = 0):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="posenc_py_"))
        self.log = self.dir / "log"
        port_file = self.dir / "port"
        args = [server_binary(), f"--listen=127.0.0.1:{port}", f"--port_file={port_file}",
                "--threads=1", "--drain_seconds=2", "--log_level=warn", "--metrics_listen=",
                *flags]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = port_file.read_text().strip() if port_file.exists() else ""
            if text:
                self.port = int(text)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"posenc-server did not start: {self.log.read_text()}")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def table() -> np.ndarray:
    """A learned position table [64, 32] the server loads from --table_dir."""
    return np.random.default_rng(7).standard_normal((64, 32)).astype(np.float32)


@pytest.fixture(scope="session")
def server(table):
    tables = pathlib.Path(tempfile.mkdtemp(prefix="posenc_py_tables_"))
    write_safetensors(tables / "gpt2.safetensors", {"wpe": table})
    s = ServerProcess(f"--table_dir={tables}")
    yield s
    s.stop()


@pytest.fixture
def rng(request):
    """A seeded generator; the seed is printed so a failure can be replayed
    (POSENC_TEST_SEED fixes it)."""
    seed = int(os.environ.get("POSENC_TEST_SEED", random.randrange(2**31)))
    print(f"\n{request.node.name}: seed {seed}")
    return np.random.default_rng(seed)
