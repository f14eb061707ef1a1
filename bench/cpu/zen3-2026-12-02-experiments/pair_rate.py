import numpy as np
rng=np.random.default_rng(1); N=4_000_000
def bf(x):  # round float32 to bf16 (RNE) as float32
    b=x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b=(b+0x7fff+((b>>16)&1))>>16
    return (b.astype(np.uint32)<<16).view(np.float32)
u=bf(rng.uniform(-1,1,N).astype(np.float32)); v=bf(rng.uniform(-1,1,N).astype(np.float32))
th=rng.uniform(0,2*np.pi,N); c=np.cos(th).astype(np.float32); n=np.sin(th).astype(np.float32)
a=(u*c).astype(np.float32)-(v*n).astype(np.float32); b=(v*c).astype(np.float32)+(u*n).astype(np.float32)
B=np.float32(2**-12)
m=np.minimum(abs(a),abs(b))
scal = m < B*(abs(u)+abs(v))
M=np.maximum(abs(u),abs(v))
sup = m < 2*B*M          # 16-bit superset bound (truncated results)
ra=np.minimum(abs(bf(a)),abs(bf(b)))
sup_r = ra <= 2*B*M      # rounded results, strict
print("pairs failing: scalar %.5f  superset(max) %.5f  superset rounded <= %.5f"%(scal.mean(),sup.mean(),sup_r.mean()))
for steps in (16,32):
    f=lambda x: 1-(1-x.mean())**steps
    print(steps,"pair step with a failure: scalar 1 in %.0f, superset 1 in %.0f"%(1/f(scal),1/f(sup_r)))
ub=u.view(np.uint32)>>16; vb=v.view(np.uint32)>>16
Mor=((ub|vb)&0x7fff).astype(np.uint32)
Mor_f=(Mor<<16).view(np.float32)
sup_or = ra < 2*B*Mor_f*(1+2**-7)
print("OR bound rate %.5f"%sup_or.mean(), "32-step 1 in %.0f"%(1/(1-(1-sup_or.mean())**32)))
