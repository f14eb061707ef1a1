"""Failures as PosencError with the gRPC code and the server's message naming
the field; inputs the client refuses itself; deadlines."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

import posenc


@pytest.fixture(scope="module")
def client(server):
    with posenc.Client(server.target, timeout=10) as c:
        yield c


def expect_error(code, *fragments):
    class Check:
        def __enter__(self):
            return self

        def __exit__(self, kind, error, tb):
            assert kind is posenc.PosencError, f"expected PosencError {code.name}, got {kind}"
            assert error.code == code, str(error)
            for f in fragments:
                assert f in error.message, f"{f!r} not in {error.message!r}"
            assert str(error).startswith(code.name + ": ")
            self.error = error
            return True

    return Check()


def test_invalid_argument_names_the_field(client):
    q = np.zeros((1, 4, 2, 16), np.float32)
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "rotary_dim", "18"):
        client.apply_rope(q, rotary_dim=18)
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "scaling.factor", "yarn"):
        client.apply_rope(q, scaling={"type": "yarn"})
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "position_ids"):
        client.apply_rope(q, position_ids=np.zeros((1, 5), np.int64))  # seq is 4
    with expect_error(grpc.StatusCode.NOT_FOUND, "no-such/table"):
        client.learned_table("no-such/table")


def test_the_client_refuses_what_it_cannot_send(client):
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "query", "float64"):
        client.apply_rope(np.zeros((1, 4, 2, 16)))  # float64: no silent cast
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "position_ids", "float32"):
        client.apply_rope(np.zeros((1, 4, 2, 16), np.float32),
                          position_ids=np.zeros((1, 4), np.float32))
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "layout", "bshd"):
        client.apply_rope(np.zeros((1, 4, 2, 16), np.float32), layout="nchw")
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "scaling.fctor"):
        client.apply_rope(np.zeros((1, 4, 2, 16), np.float32), scaling={"fctor": 2})
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "dtype", "int32"):
        client.sinusoidal_table(8, count=2, dtype=np.int32)
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "health_check_service"):
        posenc.Client("127.0.0.1:1", health_check_service='x"}')


def test_deadline_exceeded(client):
    q = np.zeros((4, 512, 8, 128), np.float32)  # 8 MiB: cannot make 1 us
    start = time.monotonic()
    with expect_error(grpc.StatusCode.DEADLINE_EXCEEDED):
        client.apply_rope(q, timeout=1e-6)
    assert time.monotonic() - start < 5
    # The client's default applies when a call names none.
    with posenc.Client(client.config.target, timeout=1e-6) as hasty:
        with expect_error(grpc.StatusCode.DEADLINE_EXCEEDED):
            hasty.apply_rope(q)
    assert client.apply_rope(q[:1, :8], timeout=5).query.shape == (1, 8, 8, 128)


def test_a_stream_item_the_client_refuses_ends_the_stream_with_its_error(client):
    items = [{"query": np.ones((1, 2, 1, 8), np.float32)}, {"query": np.ones((1, 2, 1, 8))},
             {"query": np.ones((1, 2, 1, 8), np.float32)}]
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "query", "float64"):
        list(client.stream_rope(items))
    with expect_error(grpc.StatusCode.INVALID_ARGUMENT, "stream_rope", "bogus"):
        list(client.stream_rope([{"query": items[0]["query"], "bogus": 1}]))
