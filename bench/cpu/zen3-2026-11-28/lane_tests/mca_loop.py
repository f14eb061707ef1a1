import subprocess,sys
binary,filt=sys.argv[1],sys.argv[2]
subprocess.run([binary,"--filter="+filt,"--profile=/tmp/p.txt"],capture_output=True)
prof={}
for l in open("/tmp/p.txt"):
    o,c=l.split(); prof[int(o,16)]=int(c)
top=max(prof.values())
hot=[o for o,c in prof.items() if c==top]
lo=min(hot); hi=max(hot)
out=subprocess.run(["objdump","-d","--no-show-raw-insn","--start-address=%d"%lo,"--stop-address=%d"%(hi+1),binary],capture_output=True,text=True).stdout
lines=[]
for l in out.splitlines():
    p=l.split("\t")
    if len(p)>=2 and ":" in p[0]:
        ins="\t".join(p[1:]).strip().split("<")[0].strip()
        if ins.startswith("j"): continue
        lines.append(ins)
open("/tmp/loop.s","w").write("\n".join(lines)+"\n")
r=subprocess.run(["llvm-mca","-mcpu=znver3","-iterations=300","/tmp/loop.s"],capture_output=True,text=True).stdout
cyc=[l for l in r.splitlines() if l.startswith("Total Cycles") or l.startswith("Instructions:")]
print(filt, len(lines)+1, "instructions/iter;", int(cyc[1].split()[-1])/300, "cycles/iter (mca znver3)")
