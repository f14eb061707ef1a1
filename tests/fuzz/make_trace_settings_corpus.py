#!/usr/bin/env python3
"""Writes the seed corpus of the kserve_trace_settings_fuzz harness to
tests/fuzz/kserve_trace_settings_fuzz/: TraceSettingRequest messages in
protobuf wire format (settings = 1, a map of name to SettingValue {repeated
string value = 1}; model_name = 2), one of each kind of setting the server
takes or refuses. Standard library only.
"""
import os

from make_log_settings_corpus import field

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "kserve_trace_settings_fuzz")


def request(settings, model_name=""):
    body = b"".join(
        field(1, 2, field(1, 2, k.encode()) + field(2, 2, b"".join(field(1, 2, v.encode())
                                                                  for v in values)))
        for k, values in settings)
    return body + (field(2, 2, model_name.encode()) if model_name else b"")


SEEDS = {
    "read": ([], ""),
    "on": ([("trace_level", ["TIMESTAMPS"]), ("trace_rate", ["10"]), ("trace_count", ["5"])], ""),
    "off": ([("trace_level", ["OFF"])], ""),
    "defaults": ([("trace_level", []), ("trace_rate", []), ("trace_count", [])], ""),
    "said_again": ([("log_frequency", ["0"]), ("trace_file", [""]), ("trace_mode", ["triton"])], ""),
    "tensors": ([("trace_level", ["TIMESTAMPS", "TENSORS"])], ""),
    "off_and_on": ([("trace_level", ["OFF", "TIMESTAMPS"])], ""),
    "rate_zero": ([("trace_rate", ["0"])], ""),
    "rate_two_values": ([("trace_rate", ["1", "2"])], ""),
    "count_huge": ([("trace_count", ["99999999999999999999"])], ""),
    "file": ([("trace_file", ["/tmp/trace.json"])], ""),
    "otel": ([("trace_mode", ["opentelemetry"]), ("opentelemetry_url", ["x"])], ""),
    "model": ([("trace_rate", ["1"])], "rope"),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (settings, model) in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(request(settings, model))


if __name__ == "__main__":
    main()
