import sys,glob,collections,statistics as st,re
rows=collections.defaultdict(list)
for f in glob.glob(sys.argv[1]+'/run*.txt'):
    for l in open(f):
        if re.match(r'^(rope|sinusoidal|alibi)',l) and 'tokens x' not in l:
            p=l.split()
            try: rmw=float(p[-3]); r=float(p[-1]); g=float(p[-5])
            except: continue
            name=' '.join(p[:-6])
            rows[name].append((rmw,r,g))
def q(x,f):
    x=sorted(x); return x[min(len(x)-1,int(f*len(x)))]
for name,v in rows.items():
    busy=[r for m,r,g in v if m<75]; quiet=[r for m,r,g in v if m>=85]; qg=[g for m,r,g in v if m>=85]
    fmt=lambda x: f"med {st.median(x):.2f} p10-p90 {q(x,.1):.2f}-{q(x,.9):.2f} n={len(x)}" if x else "-"
    print(f"{name[:48]:48s} busy {fmt(busy)} | quiet {fmt(quiet)} GB/s {st.median(qg) if qg else 0:.0f}")
