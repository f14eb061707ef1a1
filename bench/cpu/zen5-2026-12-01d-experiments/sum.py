import sys, collections, statistics as st
d = collections.defaultdict(list); g = collections.defaultdict(list)
for line in open(sys.argv[1]):
    v, dt, style, layout, gbs, r = line.split()
    d[(dt, style, layout, v)].append(float(r)); g[(dt, style, layout, v)].append(float(gbs))
for k in sorted(d):
    x = sorted(d[k]); print(*k, "n=%d med=%.3f min=%.2f max=%.2f GB/s med=%.1f" % (len(x), st.median(x), x[0], x[-1], st.median(g[k])))
