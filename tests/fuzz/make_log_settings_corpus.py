#!/usr/bin/env python3
"""Writes the seed corpus of the kserve_log_settings_fuzz harness to
tests/fuzz/kserve_log_settings_fuzz/: LogSettingsRequest messages in protobuf
wire format (settings = 1, a map of name to SettingValue {bool_param = 1,
uint32_param = 2, string_param = 3}), one of each kind of setting the server
takes or refuses. Standard library only.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "kserve_log_settings_fuzz")


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, wire_type, payload):
    key = varint(number << 3 | wire_type)
    if wire_type == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def value(v):
    if v is None:
        return b""  # no parameter_choice set
    if isinstance(v, bool):
        return field(1, 0, int(v))
    if isinstance(v, int):
        return field(2, 0, v)
    return field(3, 2, v.encode())


def request(settings):
    return b"".join(field(1, 2, field(1, 2, k.encode()) + field(2, 2, value(v)))
                    for k, v in settings)


SEEDS = {
    "read": [],
    "verbose_on": [("log_info", True), ("log_verbose_level", 1)],
    "verbose_off": [("log_verbose_level", 0)],
    "quiet": [("log_info", False), ("log_warning", False), ("log_error", False)],
    "warnings_only": [("log_info", False)],
    "no_threshold": [("log_warning", False)],
    "level_and_format": [("log_level", "debug"), ("log_format", "json")],
    "level_beside_flags": [("log_level", "warn"), ("log_error", True)],
    "file_empty": [("log_file", "")],
    "file_set": [("log_file", "/tmp/posenc.log")],
    "wrong_type": [("log_info", "true"), ("log_verbose_level", True)],
    "no_value": [("log_format", None)],
    "unknown": [("log_rotation", True), ("log_info", True)],
    "big_verbose": [("log_verbose_level", 4294967295)],
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, settings in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(request(settings))


if __name__ == "__main__":
    main()
