#!/usr/bin/env python3
"""Medians (least-most) of GB/s by configuration for an alternated-runs file.

Each line: configuration, dtype, style, layout, GB/s, ratio to the in-place
read-modify-write (posenc-bench-cpu --only=rope --reps=7, one line a row).
Usage: python3 summary.py FILE
"""
import collections
import statistics
import sys

runs = collections.defaultdict(list)
configs = []
for line in open(sys.argv[1]):
    config, dtype, style, layout, gbs, _ = line.split()
    if config not in configs:
        configs.append(config)
    runs[(dtype, style, layout, config)].append(float(gbs))
for dtype in ("FLOAT32", "BFLOAT16"):
    for style in ("neox", "gptj"):
        for layout in ("bshd", "bhsd"):
            cells = []
            for c in configs:
                v = runs[(dtype, style, layout, c)]
                cells.append(f"{c} {statistics.median(v):5.1f} ({min(v):.0f}-{max(v):.0f})")
            print(f"{dtype:8s} {style} {layout}  " + "  ".join(cells))
