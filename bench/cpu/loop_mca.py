#!/usr/bin/env python3
"""A kernel loop's instructions, and its cycles on CPUs this machine lacks.

Finds the function whose demangled name matches PATTERN in OBJECT, takes the
innermost loop (a backward jump and its target) that holds an instruction
containing MARKER, prints how many instructions it has and, for each -mcpu
given, llvm-mca's block reciprocal throughput (cycles per iteration). Rough
where a loop's cold branches sit inside it (they are counted too); for a
fully unrolled step, cut the block out by hand (--print shows it).

  bench/cpu/loop_mca.py build/kernels/CMakeFiles/posenc_kernels.dir/src/cpu/rope_cpu.cc.o \
      'RotateBF16Wide<\\(posenc::internal::Narrowing\\)1, \\(posenc::RopeStyle\\)2, true, false, 64l>' \
      vmulps --mcpu icelake-server skylake-avx512

(bench/RESULTS.md, the ninth Zen 3 session, has the figures it gave.)
"""
import argparse
import re
import subprocess
import sys
import tempfile


def function_listing(obj: str, pattern: str) -> list:
    symbols = [s.split()[-1] for s in subprocess.run(
        ["nm", obj], check=True, capture_output=True, text=True).stdout.splitlines() if s.strip()]
    names = subprocess.run(["c++filt"], input="\n".join(symbols), check=True,
                           capture_output=True, text=True).stdout.splitlines()
    matches = [(s, n) for s, n in zip(symbols, names) if re.search(pattern, n)]
    if not matches:
        sys.exit(f"no function in {obj} matches {pattern}")
    symbol, name = matches[0]
    print(f"{name[:160]}", file=sys.stderr)
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "att",
                              "--disassemble=" + symbol, obj],
                             check=True, capture_output=True, text=True).stdout
    rows = []
    for line in listing.splitlines():
        m = re.match(r"\s+([0-9a-f]+):\s+(.*)$", line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2).strip()))
    return rows


def innermost_loop(rows: list, marker: str) -> list:
    addresses = [a for a, _ in rows]
    best = None
    for i, (address, text) in enumerate(rows):
        m = re.match(r"(j\w+)\s+([0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(2), 16)
        if target <= address and target in addresses:
            start = addresses.index(target)
            if any(marker in t for _, t in rows[start:i + 1]):
                if best is None or i - start < best[1] - best[0]:
                    best = (start, i)
    if best is None:
        sys.exit(f"no loop holds {marker}")
    loop = []
    for _, text in rows[best[0]:best[1] + 1]:
        text = re.sub(r"<[^>]*>", "", re.sub(r"#.*", "", text)).strip()
        m = re.match(r"(j\w+)\s+[0-9a-f]+", text)
        loop.append(m.group(1) + " .Lloop" if m else text)
    return loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("object")
    parser.add_argument("pattern", help="a regular expression over demangled names")
    parser.add_argument("marker", help="an instruction the loop holds, e.g. vmulps")
    parser.add_argument("--mcpu", nargs="*", default=[], help="llvm-mca CPUs")
    parser.add_argument("--print", action="store_true", help="print the loop")
    args = parser.parse_args()
    loop = innermost_loop(function_listing(args.object, args.pattern), args.marker)
    print(f"{len(loop)} instructions in the loop")
    if args.print:
        print("\n".join(loop))
    with tempfile.NamedTemporaryFile("w", suffix=".s") as f:
        f.write(".Lloop:\n" + "\n".join(loop) + "\n")
        f.flush()
        for cpu in args.mcpu:
            report = subprocess.run(["llvm-mca", f"-mcpu={cpu}", f.name], check=True,
                                    capture_output=True, text=True).stdout
            m = re.search(r"Block RThroughput:\s*([0-9.]+)", report)
            print(f"{cpu}: {m.group(1) if m else '?'} cycles per iteration")


if __name__ == "__main__":
    main()
