"""What the client decides without a server: the channel's retry policy,
option parsing, dtype handling and its checks of the server's answers."""

from __future__ import annotations

import json

import grpc
import ml_dtypes
import numpy as np
import pytest

import posenc
from posenc import _ops
from posenc import _tensors as T


def retry_policy(**config):
    cfg = json.loads(posenc.ChannelConfig(**config).service_config())
    return cfg, cfg["methodConfig"][0]["retryPolicy"]


def test_retry_policy_matches_the_cpp_client():
    cfg, policy = retry_policy()
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert (policy["maxAttempts"], policy["initialBackoff"], policy["maxBackoff"]) == (
        4, "0.100s", "2.000s")
    assert cfg["loadBalancingConfig"] == [{"round_robin": {}}]
    assert cfg["healthCheckConfig"] == {"serviceName": "posenc.v1.PositionalEncoding"}
    _, policy = retry_policy(retry_resource_exhausted=True, max_attempts=9)
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]
    assert policy["maxAttempts"] == 5  # gRPC's ceiling, clamped as in C++
    opts = dict(posenc.ChannelConfig(channel_options=(("grpc.max_receive_message_length", 7),))
                .options())
    assert opts["grpc.enable_retries"] == 1 and opts["grpc.max_receive_message_length"] == 7
    assert opts["grpc.max_reconnect_backoff_ms"] == 5000  # not gRPC's 120 s
    assert dict(posenc.ChannelConfig(max_reconnect_backoff=0.0002).options())[
        "grpc.max_reconnect_backoff_ms"] == 1  # at least a millisecond: 0 would be no cap
    cfg, _ = retry_policy(health_check_service="", load_balancing="pick_first")
    assert "healthCheckConfig" not in cfg and cfg["loadBalancingConfig"] == [{"pick_first": {}}]


@pytest.mark.parametrize("bad", [dict(timeout=0), dict(initial_backoff=3, max_backoff=2),
                                 dict(load_balancing="random"),
                                 dict(min_time_between_resolutions=-1),
                                 dict(max_reconnect_backoff=0),
                                 dict(max_reconnect_backoff=float("nan")),
                                 dict(max_message_bytes=2**31)])
def test_bad_channel_settings_are_refused(bad):
    with pytest.raises(posenc.PosencError) as e:
        posenc.Client("127.0.0.1:1", **bad)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert next(iter(bad)).split("_")[0] in e.value.message


def test_request_building():
    q = np.arange(2 * 3 * 1 * 4, dtype=">f4").reshape(2, 3, 1, 4)  # big-endian in
    r, _, ko = _ops.rope_request(q, layout="BHSD", style=2, position_ids=[[0, 1, 2]],
                                 scaling={"type": "YaRN", "factor": 4,
                                          "original_max_position": 4096,
                                          "short_factor": [1, 2], "longrope_mode": "long"})
    assert ko is None and not r.HasField("key")
    assert (r.layout, r.style) == (posenc.v1.ROPE_LAYOUT_BHSD, posenc.v1.ROPE_STYLE_GPTJ)
    assert np.array_equal(np.frombuffer(r.query_data, "<f4").reshape(q.shape), q)
    assert r.position_ids.dtype == posenc.v1.DATA_TYPE_INT64
    assert r.scaling.type == posenc.v1.SCALING_TYPE_YARN and r.scaling.factor == 4
    assert list(r.scaling.short_factor) == [1.0, 2.0]
    assert r.scaling.longrope_mode == posenc.v1.LONGROPE_MODE_LONG
    assert not r.HasField("base")  # unset: the server's default
    with pytest.raises(posenc.PosencError, match="style: 7 is not one of neox, gptj"):
        _ops.rope_request(q.astype(np.float32), style=7)
    with pytest.raises(posenc.PosencError, match="scaling.factor"):
        _ops.rope_request(q.astype(np.float32), scaling={"factor": "x"})
    with pytest.raises(posenc.PosencError, match="stream_rope: each item needs a 'query'"):
        _ops.stream_item({"key": q})


def test_the_servers_answer_is_checked():
    desc = posenc.v1.TensorDesc(dtype=posenc.v1.DATA_TYPE_BFLOAT16, shape=[2, 3])
    good = T.from_desc(desc, bytes(12), "query")
    assert good.dtype == ml_dtypes.bfloat16 and good.flags.writeable
    for data, d in ((bytes(11), desc),
                    (bytes(12), posenc.v1.TensorDesc(dtype=99, shape=[2, 3])),
                    (bytes(0), posenc.v1.TensorDesc(dtype=1, shape=[-1, 0]))):
        with pytest.raises(posenc.PosencError) as e:
            T.from_desc(d, data, "query")
        assert e.value.code == grpc.StatusCode.INTERNAL and "malformed" in e.value.message


def test_stream_error_codes_map_back():
    e = posenc.PosencError.from_status(3, "rotary_dim ...")
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT and e.message == "rotary_dim ..."
    assert posenc.PosencError.from_status(99, "x").code == grpc.StatusCode.UNKNOWN


def test_positions_are_never_truncated():
    assert T.positions([0, 1, 2], "position_ids").dtype == np.int64
    assert T.positions([], "position_ids").dtype == np.int64
    with pytest.raises(posenc.PosencError, match="position_ids: dtype float64"):
        T.positions([0.5, 1.5], "position_ids")
