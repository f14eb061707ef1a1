import sys,collections,statistics as st
rows=collections.defaultdict(list)
for l in open(sys.argv[1]):
    p=l.split()
    cfg=p[0]; name=' '.join(p[1:6]); gbs=float(p[-5]); rmw=float(p[-3]); ratio=float(p[-1])
    rows[(name,cfg)].append((rmw,ratio,gbs))
for (name,cfg),v in sorted(rows.items()):
    busy=[r for m,r,g in v if m<75]; quiet=[r for m,r,g in v if m>=85]
    f=lambda x: f"{st.median(x):.3f} (n={len(x)})" if x else "-"
    print(f"{name:35s} {cfg:10s} all {st.median([r for m,r,g in v]):.3f}  busy {f(busy)}  quiet {f(quiet)}  GB/s {st.median([g for m,r,g in v]):.1f}")
