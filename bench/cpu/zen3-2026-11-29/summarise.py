import glob,statistics,collections,sys
d0=sys.argv[1]
labs=sorted({f.split('/')[-1].rsplit('-',1)[0] for f in glob.glob(d0+'/*.txt')})
for lab in labs:
    d=collections.defaultdict(list)
    for f in glob.glob(f'{d0}/{lab}-*.txt'):
        for l in open(f):
            p=l.split()
            if len(p)>7 and p[0] in('rope','sinusoidal','alibi','absolute','bias'):
                d[' '.join(p[:-6])].append((float(p[-1]),float(p[-5])))
    print(lab, len(glob.glob(f'{d0}/{lab}-*.txt')),'runs')
    for k,v in d.items():
        xs=sorted(x for x,_ in v)
        print(f"  {k:48s} rmw {statistics.median(xs):.2f} (q1 {xs[len(xs)//4]:.2f} q3 {xs[3*len(xs)//4]:.2f})  GB/s {statistics.median(y for _,y in v):.1f}")
