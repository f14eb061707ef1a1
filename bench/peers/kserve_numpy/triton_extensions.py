"""The two Triton extensions perf_analyzer calls before it measures, for kserve.

kserve 0.21's gRPC server serves the KServe v2 core (ServerLive .. ModelInfer)
but not Triton's ModelConfig and ModelStatistics, and perf_analyzer (service
kind "triton", the only one that speaks v2) stops at once without them. A user
benchmarking a KServe model with perf_analyzer has to add them; this does it
with the least: ModelConfig answered from the model's v2 metadata, and
ModelStatistics answered with one entry per model whose counters stay 0 (so
perf_analyzer's server-side columns read 0 for the peer; its client-side
figures, the ones compared, are unaffected).

The messages are declared here at run time, in a private descriptor pool:
kserve's own inference.* messages already sit in the default pool, and the
wire format needs only the field numbers and types of Triton's
grpc_service.proto / model_config.proto (as in posenc's proto/kserve/).
"""
import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
DATATYPES = {"BOOL": 1, "UINT8": 2, "INT8": 6, "INT16": 7, "INT32": 8, "INT64": 9,
             "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14}


def _messages():
    fd = descriptor_pb2.FileDescriptorProto(name="peer_triton_ext.proto", package="peer_ext",
                                            syntax="proto3")

    def msg(name, *fields):
        m = fd.message_type.add(name=name)
        for number, fname, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = ".peer_ext." + type_name

    one, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("ModelConfigRequest", (1, "name", F.TYPE_STRING, one, ""),
        (2, "version", F.TYPE_STRING, one, ""))
    msg("ModelInput", (1, "name", F.TYPE_STRING, one, ""), (2, "data_type", F.TYPE_INT32, one, ""),
        (4, "dims", F.TYPE_INT64, rep, ""), (8, "optional", F.TYPE_BOOL, one, ""))
    msg("ModelOutput", (1, "name", F.TYPE_STRING, one, ""), (2, "data_type", F.TYPE_INT32, one, ""),
        (3, "dims", F.TYPE_INT64, rep, ""))
    msg("ModelConfig", (1, "name", F.TYPE_STRING, one, ""), (2, "platform", F.TYPE_STRING, one, ""),
        (4, "max_batch_size", F.TYPE_INT32, one, ""),
        (5, "input", F.TYPE_MESSAGE, rep, "ModelInput"),
        (6, "output", F.TYPE_MESSAGE, rep, "ModelOutput"),
        (17, "backend", F.TYPE_STRING, one, ""))
    msg("ModelConfigResponse", (1, "config", F.TYPE_MESSAGE, one, "ModelConfig"))
    msg("ModelStatisticsRequest", (1, "name", F.TYPE_STRING, one, ""),
        (2, "version", F.TYPE_STRING, one, ""))
    msg("ModelStatistics", (1, "name", F.TYPE_STRING, one, ""),
        (2, "version", F.TYPE_STRING, one, ""))
    msg("ModelStatisticsResponse", (1, "model_stats", F.TYPE_MESSAGE, rep, "ModelStatistics"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName("peer_ext." + m.name))
            for m in fd.message_type}


M = _messages()


def handler(models, optional_inputs):
    """A generic RPC handler for inference.GRPCInferenceService's ModelConfig
    and ModelStatistics; models maps a name to its kserve.Model."""

    async def model_config(request, context):
        model = models.get(request.name)
        if model is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no model {request.name[:64]!r}")
        c = M["ModelConfig"](name=model.name, platform="kserve-python", backend="python",
                             max_batch_size=0)
        for t in model.get_input_types():
            c.input.add(name=t["name"], data_type=DATATYPES[t["datatype"]], dims=t["shape"],
                        optional=t["name"] in optional_inputs)
        for t in model.get_output_types():
            c.output.add(name=t["name"], data_type=DATATYPES[t["datatype"]], dims=t["shape"])
        return M["ModelConfigResponse"](config=c)

    async def model_statistics(request, context):
        names = [request.name] if request.name else sorted(models)
        if any(n not in models for n in names):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no model {request.name[:64]!r}")
        return M["ModelStatisticsResponse"](
            model_stats=[M["ModelStatistics"](name=n, version="1") for n in names])

    def rpc(fn, req):
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=M[req].FromString,
            response_serializer=lambda m: m.SerializeToString())

    return grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelConfig": rpc(model_config, "ModelConfigRequest"),
        "ModelStatistics": rpc(model_statistics, "ModelStatisticsRequest"),
    })
