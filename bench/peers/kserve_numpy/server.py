"""Serves RopeModel with kserve's own ModelServer (v2 gRPC + REST).

  python server.py --grpc_port=P --http_port=Q [--log_level=warning]
                   [--predict_in_threads] [--enable_latency_logging=false] ...
                   (kserve's own flags pass through)

Models: "rope" (RopeModel, or ThreadedRopeModel with --predict_in_threads)
and "rope_echo" (EchoModel: the same interface answering its inputs, for
kserve's own cost per call).

kserve's gRPC server is used as it is (servicer, interceptors, thread pool,
message limits), with one addition: the Triton ModelConfig and
ModelStatistics calls perf_analyzer needs (triton_extensions.py), served on
the same grpc.aio server. --log_level (ours; default warning) sets kserve's
loggers, whose INFO level writes a line per gRPC call.
"""
import argparse
import logging
import os
import sys
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kserve  # noqa: E402
import kserve.model_server  # noqa: E402
from grpc import aio  # noqa: E402
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc, server as grpc_server  # noqa: E402
from kserve.protocol.grpc.interceptors import (  # noqa: E402
    ExceptionToStatusInterceptor, LoggingInterceptor)
from kserve.protocol.grpc.servicer import InferenceServicer  # noqa: E402

import triton_extensions  # noqa: E402
from rope_model import EchoModel, RopeModel, ThreadedRopeModel  # noqa: E402

OPTIONAL = {"key", "position_ids", "offsets"}


class PeerGRPCServer(grpc_server.GRPCServer):
    """kserve's GRPCServer.start, plus the Triton extensions' handler."""

    async def start(self, max_workers):
        self._server = aio.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            interceptors=(LoggingInterceptor(), ExceptionToStatusInterceptor()),
            options=[
                ("grpc.max_send_message_length", self._kwargs.get("grpc_max_send_message_length")),
                ("grpc.max_receive_message_length",
                 self._kwargs.get("grpc_max_receive_message_length")),
            ],
        )
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(self._data_plane, self._model_repository_extension), self._server)
        models = self._data_plane.model_registry.get_models()
        self._server.add_generic_rpc_handlers((triton_extensions.handler(models, OPTIONAL),))
        self._server.add_insecure_port(f"127.0.0.1:{self._port}")
        await self._server.start()
        await self._server.wait_for_termination()


if __name__ == "__main__":
    ours = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    ours.add_argument("--log_level", default="warning")
    ours.add_argument("--predict_in_threads", action="store_true",
                      help="rope's predict on kserve's thread pool, not the event loop")
    args, _ = ours.parse_known_args()
    kserve.model_server.GRPCServer = PeerGRPCServer
    server = kserve.ModelServer()
    for name in ("kserve", "kserve.trace", "uvicorn", "uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).setLevel(args.log_level.upper())
    rope = ThreadedRopeModel() if args.predict_in_threads else RopeModel()
    server.start([rope, EchoModel()])
