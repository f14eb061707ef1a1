#!/usr/bin/env python3
"""Issue 26's "done when", read from posenc-bench-cpu outputs.

    bench/cpu/issue26_check.py RUN.txt [RUN.txt ...]

Each file is one `posenc-bench-cpu --reps=21` run (the issue asks for three
on the AVX-512 EPYC). For every row it prints the ratio to the in-place
read-modify-write of each run against the row's target (RoPE 0.85,
sinusoidal add 0.8, bias 0.75), and for every RoPE case BHSD's time over
BSHD's (at most 1.15). A row passes when every run meets it. Exit status 0
when all rows pass, 1 otherwise.
"""
import re
import sys

TARGETS = (("rope", 0.85), ("sinusoidal", 0.8), ("alibi", 0.75))


def rows(path):
    """{row name: (GB/s, ratio to read-modify-write)} of one run."""
    out = {}
    for line in open(path):
        m = re.match(r"^((?:rope|sinusoidal|alibi)\S*(?: \S+)*?)\s+([\d.]+)\s+([\d.]+)"
                     r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
        if m:
            out[m.group(1)] = (float(m.group(3)), float(m.group(7)))
    return out


def main(paths):
    runs = [rows(p) for p in paths]
    if not runs or not all(runs):
        print("no bench rows read from", paths)
        return 1
    ok = True
    print(f"{'row':52s} target  " + "  ".join(f"run{i + 1}" for i in range(len(runs))))
    for name in runs[0]:
        target = next(t for prefix, t in TARGETS if name.startswith(prefix))
        ratios = [r[name][1] for r in runs if name in r]
        good = len(ratios) == len(runs) and min(ratios) >= target
        ok &= good
        print(f"{name:52s} {target:5.2f}   " + "  ".join(f"{x:4.2f}" for x in ratios) +
              ("" if good else "   <- short"))
    for name in runs[0]:
        if not name.startswith("rope") or " bhsd " not in name:
            continue
        bshd = name.replace(" bhsd ", " bshd ")
        # Same bytes, so time(BHSD) / time(BSHD) = GB/s(BSHD) / GB/s(BHSD).
        slow = [r[bshd][0] / r[name][0] for r in runs if name in r and bshd in r]
        good = bool(slow) and max(slow) <= 1.15
        ok &= good
        print(f"{name + ' time / bshd':52s} <=1.15  " + "  ".join(f"{x:4.2f}" for x in slow) +
              ("" if good else "   <- short"))
    print("issue 26 targets:", "all met" if ok else "not met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
