#!/usr/bin/env python3
"""Writes the seed corpus of the npy_fuzz harness to tests/fuzz/npy_fuzz/.

Valid files as NumPy writes them (and header variants it reads) plus one of
each malformed class the parser must refuse. No NumPy needed: the format is
written byte by byte, so the corpus is the same wherever it is regenerated.
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "npy_fuzz")


def npy(header, data=b"", major=1, pad=True):
    """A .npy file: magic, version, little-endian header length, header, data."""
    len_fmt = "<H" if major == 1 else "<I"
    prefix = 6 + 2 + struct.calcsize(len_fmt)
    h = header.encode("latin1")
    if pad:  # NumPy pads with spaces and a newline to a 64-byte boundary.
        h += b" " * ((64 - (prefix + len(h) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY" + bytes([major, 0]) + struct.pack(len_fmt, len(h)) + h + data


def d(descr, shape, fortran="False"):
    return "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


CORPUS = {
    # Accepted.
    "f4_2x3.npy": npy(d("<f4", "(2, 3)"), f32(0, 1, -1, 0.5, 1e-3, 3.5)),
    "f2_5.npy": npy(d("<f2", "(5,)"), struct.pack("<5e", 0, 1, -2, 65504, 6e-8)),
    "i4_scalar.npy": npy(d("<i4", "()"), struct.pack("<i", -7)),
    "i8_2x0x3.npy": npy(d("<i8", "(2, 0, 3)")),
    "f8_3.npy": npy(d("<f8", "(3,)"), struct.pack("<3d", 0.1, -1e-40, float("nan"))),
    "v2_f4.npy": npy(d("<f4", "(1, 2)"), f32(1, 2), major=2),
    "v3_double_quotes.npy": npy(
        '{"shape": (2,), "fortran_order": False, "descr": "<f4"}', f32(1, 2), major=3),
    "py2_long_dims.npy": npy(d("<f4", "(1L, 2L)"), f32(3, 4)),
    "unpadded.npy": npy("{'descr':'<i4','fortran_order':False,'shape':(1,)}",
                        struct.pack("<i", 1), pad=False),
    # Refused.
    "big_endian.npy": npy(d(">f4", "(1,)"), struct.pack(">f", 1)),
    "fortran_order.npy": npy(d("<f4", "(2, 2)", fortran="True"), f32(1, 2, 3, 4)),
    "negative_dim.npy": npy(d("<f4", "(2, -3)")),
    "shape_overflow.npy": npy(d("<f4", "(%d, %d)" % (2**62, 2**62))),
    # Found by the fuzzer: a zero dimension must not hide an overflowing product.
    "zero_dim_overflow.npy": npy(d("<f8", "(%d, 0, %d)" % (2**62, 2**62))),
    "dim_too_big.npy": npy(d("<f4", "(99999999999999999999,)")),
    "size_mismatch.npy": npy(d("<f4", "(2, 3)"), f32(1, 2, 3, 4, 5)),
    "missing_shape.npy": npy("{'descr': '<f4', 'fortran_order': False, }", f32(1)),
    "not_a_tuple.npy": npy(d("<f4", "(5)"), f32(1, 2, 3, 4, 5)),
    "f8_out_of_range.npy": npy(d("<f8", "(1,)"), struct.pack("<d", 1e300)),
    "header_past_end.npy": npy(d("<f4", "(1,)"), f32(1))[:8] + b"\xff\x7f" + b"{'descr'",
    "header_over_limit.npy": npy(d("<f4", "(1,)") + " " * 12000, f32(1), major=2),
    "truncated.npy": npy(d("<f4", "(2, 3)"), f32(0, 1, -1, 0.5, 1e-3, 3.5))[:-3],
    "garbage.bin": b"PK\x03\x04 this is a zip, not an npy",
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in sorted(CORPUS.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(CORPUS), OUT))


if __name__ == "__main__":
    main()
