# Medians (and 10th-90th percentiles) of each row's ratio to the in-place
# read-modify-write over the runs alternate.sh wrote: summarise.py OUTDIR
import collections, glob, re, statistics, sys

rows = collections.defaultdict(lambda: collections.defaultdict(list))
for path in glob.glob(sys.argv[1] + "/*-*.txt"):
    label = path.rsplit("/", 1)[1].rsplit("-", 1)[0]
    for line in open(path):
        if not re.match(r"^(rope|sinusoidal|alibi)", line) or "tokens x" in line:
            continue
        p = line.split()
        try:
            gbs, rmw, ratio = float(p[-5]), float(p[-3]), float(p[-1])
        except ValueError:
            continue
        rows[" ".join(p[:-6])][label].append((ratio, gbs, rmw))


def pct(x, f):
    x = sorted(x)
    return x[min(len(x) - 1, int(f * len(x)))]


for name, by_label in rows.items():
    cells = []
    for label in sorted(by_label):
        r = [v[0] for v in by_label[label]]
        g = [v[1] for v in by_label[label]]
        m = [v[2] for v in by_label[label]]
        cells.append(f"{label}: {statistics.median(r):.2f} ({pct(r, .1):.2f}-{pct(r, .9):.2f}) "
                     f"{statistics.median(g):.1f} GB/s rmw {statistics.median(m):.1f} n={len(r)}")
    print(f"{name[:50]:50s} " + " | ".join(cells))
