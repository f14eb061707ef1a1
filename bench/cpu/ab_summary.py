"""Alternated before/after runs of posenc-bench-cpu, summarised per row.

  bench/cpu/ab_summary.py DIR/old DIR/new   # DIR/old1.txt ... and DIR/new1.txt ...

Each row's median ratio to the read-modify-write, median GB/s, how many
runs meet issue 26's target, and the read-modify-write's medians.
"""
import re,statistics,sys,glob
targets={'rope':0.85,'sinusoidal':0.80,'alibi':0.75}
def load(prefix):
    rows={}
    for f in sorted(glob.glob(prefix+'*.txt')):
        for l in open(f):
            if re.match(r'^(rope (BF|FL)|sinus|alibi)',l):
                p=l.split(); name=' '.join(p[:-6])
                rows.setdefault(name,[]).append((float(p[-5]),float(p[-3]),float(p[-1])))
    return rows
o=load(sys.argv[1]); n=load(sys.argv[2])
print(f"{'row':52s} {'ratio median old -> new':>24s} {'GB/s median':>16s} {'runs meeting':>14s}  rmw medians")
for k in o:
    t=targets[k.split()[0].split('+')[0]]
    ro=[x[2] for x in o[k]]; rn=[x[2] for x in n[k]]
    go=statistics.median(x[0] for x in o[k]); gn=statistics.median(x[0] for x in n[k])
    mo=statistics.median(x[1] for x in o[k]); mn=statistics.median(x[1] for x in n[k])
    print(f"{k:52s} {statistics.median(ro):10.2f} -> {statistics.median(rn):.2f}      {go:5.1f} -> {gn:5.1f}   {sum(r>=t for r in ro)}/{len(ro)} -> {sum(r>=t for r in rn)}/{len(rn)}   {mo:.1f} / {mn:.1f}")
