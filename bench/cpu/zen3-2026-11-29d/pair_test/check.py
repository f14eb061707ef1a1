#!/usr/bin/env python3
"""The AVX2 NEOX loop's 16-bit pair test (PairTestBF16x16, rope_avx2.inc),
before and after 2026-11-29d, as thresholds on the smaller truncated result
|h| of a pair whose larger |input| has bfloat16 bits m.

Before: bound = max(m - ((S << 7) - 0x7f), m > 0 ? 0x80 + 0x7f : 0),
0x7fff where m > 0x7eff, compared signed with |h| + 0x7f (NaN wraps below).
After: bound = max(m -sat (S << 7), m > 0 ? 0x80 : 0), 0xffff where
m >= min(bits of 2^(126 - k), bits of 2^127), compared unsigned with |h|.

Checks, for every k (scale's exponent, rounded up) from -127 to 10 (the
largest attention scale, 1000, has k = 10) and every m: the new threshold
is never below the old (so the new test passes no pair the old one failed,
and the old one is the sound one, proven by the conformance suites), and
below 2^(126 - k) the two are equal (no pair goes to the slow list that did
not before). Run: python3 check.py
"""
import sys


def s16(x):
    x &= 0xffff
    return x - 0x10000 if x & 0x8000 else x


def old_threshold(k, m):
    """Least finite-or-inf |h| (at most 0x7f80) the old test passes."""
    s = 11 - k
    less, least = (s << 7) - 0x7f, (0x80 + 0x7f if s >= 1 else 0x7fff)
    bound = max(s16(m - less), least if m > 0 else 0)
    if m > 0x7eff:
        bound = 0x7fff
    return max(0, bound - 0x7f)  # bound <= |h| + 0x7f, no wrap for |h| <= 0x7f80


def new_threshold(k, m):
    s = 11 - k
    less, least = s << 7, (0x80 if s >= 1 else 0xffff)
    bound = max(max(m - less, 0), least if m > 0 else 0)
    if m >= min((253 - k) << 7, 0x7f00):
        bound = 0xffff
    return bound


def main():
    for k in range(-127, 11):
        huge = min((253 - k) << 7, 0x7f00)
        for m in range(0x8000):
            old, new = old_threshold(k, m), new_threshold(k, m)
            if new < old:
                print(f"k {k} m {m:#x}: new threshold {new:#x} below the old {old:#x}")
                return 1
            if m < huge and new != old:
                print(f"k {k} m {m:#x}: thresholds differ below 2^(126 - k): {old:#x} {new:#x}")
                return 1
    print("ok: for k in [-127, 10] and every m, the new threshold is at least the old,"
          " and equal to it below 2^(126 - k)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
