#!/usr/bin/env python3
"""The 512-bit bfloat16 loops for AVX-512 CPUs without BF16 hold no BF16
instruction.

Those loops (Narrowing::kRounding, bf16_wide.h) are compiled with the same
target attribute as the ones that narrow by VCVTNE2PS2BF16, AVX-512 BF16
included: GCC emits BF16 instructions only where asked (an intrinsic, or a
__bf16 conversion), and the emulated build traps on the intrinsic, but
nothing else would catch one the compiler chose. So this reads the kernel
library's object code: every function instantiated for kRounding must be
free of BF16 instructions, and (that the reading works) those for
kInstruction must hold VCVTNE2PS2BF16.

  narrowing_code_test.py LIBRARY   # libposenc_kernels.a
"""
import re
import subprocess
import sys

BF16_INSTRUCTIONS = re.compile(r"\b(vcvtne2ps2bf16|vcvtneps2bf16|vdpbf16ps)\b")
FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def main() -> int:
    library = sys.argv[1]
    listing = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", library],
                             check=True, capture_output=True, text=True).stdout
    functions = {}  # demangled name -> BF16 instructions in it
    name = None
    for line in listing.splitlines():
        match = FUNCTION.match(line)
        if match:
            name = match.group(1)
            functions.setdefault(name, [])
        elif name is not None and BF16_INSTRUCTIONS.search(line):
            functions[name].append(line.strip())
    rounding = {n: i for n, i in functions.items() if "Narrowing)1" in n}
    instruction = {n: i for n, i in functions.items() if "Narrowing)0" in n}
    failures = []
    if not rounding or not instruction:
        failures.append(f"found {len(rounding)} kRounding and {len(instruction)} kInstruction "
                        "functions; expected both (was the library built with GCC for x86-64?)")
    for n, found in sorted(rounding.items()):
        if found:
            failures.append(f"{n} (kRounding) holds BF16 instructions: {found[:3]}")
    if instruction and not any(instruction.values()):
        failures.append("no kInstruction function holds VCVTNE2PS2BF16: the listing was not read")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(rounding)} kRounding functions free of BF16 instructions; "
          f"{sum(1 for i in instruction.values() if i)} of {len(instruction)} kInstruction ones "
          "narrow by VCVTNE2PS2BF16")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
