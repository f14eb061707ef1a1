#!/usr/bin/env python3
"""Medians (and quartiles) of posenc-bench-cpu runs: ratio to the in-place
read-modify-write, kernel GB/s and the read-modify-write's own GB/s.

    summarise.py FOLDER   # FOLDER/LABEL-N.txt, one posenc-bench-cpu output each
"""
import collections
import glob
import re
import statistics
import sys

ROW = re.compile(r"^((?:rope|sinusoidal|alibi)\S*(?: \S+)*?)\s+([\d.]+)\s+([\d.]+)"
                 r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
folder = sys.argv[1]
files = glob.glob(folder + "/*-*.txt")
for label in sorted({f.split("/")[-1].rsplit("-", 1)[0] for f in files}):
    mine = [f for f in files if f.split("/")[-1].rsplit("-", 1)[0] == label]
    rows = collections.defaultdict(list)
    for f in mine:
        for line in open(f):
            m = ROW.match(line)
            if m:
                rows[m.group(1)].append((float(m.group(7)), float(m.group(3)), float(m.group(5))))
    print(label, len(mine), "runs")
    for name, v in rows.items():
        ratio = sorted(r for r, _, _ in v)
        q = len(ratio) // 4
        print(f"  {name:52s} rmw {statistics.median(ratio):.2f} (q1 {ratio[q]:.2f} q3 {ratio[-1 - q]:.2f})"
              f"  GB/s {statistics.median(g for _, g, _ in v):.1f}"
              f"  rmw GB/s {statistics.median(w for _, _, w in v):.1f}")
