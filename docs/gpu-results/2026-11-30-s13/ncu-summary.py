import csv,collections,sys,io
for m in sys.argv[1:]:
    lines=open(m).read().splitlines()
    start=[i for i,l in enumerate(lines) if l.startswith('"ID"')][0]
    rows=list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    hdr=rows[0]; units=rows[1]; data=[r for r in rows[2:] if len(r)==len(hdr)]
    ix={h:i for i,h in enumerate(hdr)}
    U={h:u for h,u in zip(hdr,units)}
    print(m, {k:U[k] for k in ['gpu__time_duration.sum','dram__bytes_read.sum','lts__t_bytes.sum']})
    def f(r,k):
        v=r[ix[k]].replace(',','')
        try: return float(v)
        except: return 0.0
    agg=collections.OrderedDict()
    for r in data:
        name=r[ix['Kernel Name']]
        a=agg.setdefault(name,[0]*9)
        a[0]+=1; a[1]+=f(r,'gpu__time_duration.sum'); a[2]+=f(r,'dram__bytes_read.sum'); a[3]+=f(r,'dram__throughput.avg.pct_of_peak_sustained_elapsed'); a[4]+=f(r,'l1tex__throughput.avg.pct_of_peak_sustained_active'); a[5]+=f(r,'sm__warps_active.avg.pct_of_peak_sustained_active'); a[6]=f(r,'launch__registers_per_thread'); a[7]+=f(r,'launch__grid_size'); a[8]+=f(r,'lts__t_bytes.sum')
    tot=sum(a[1] for a in agg.values())
    print(f"{'kernel':34s} {'n':>4s} {'t/launch':>9s} {'share':>6s} {'dramMB':>7s} {'GB/s':>7s} {'dram%':>6s} {'l1%':>5s} {'occ%':>5s} {'regs':>4s} {'grid':>6s} {'L2MB':>6s}")
    for k,a in sorted(agg.items(), key=lambda x:-x[1][1]):
        n=a[0]; t=a[1]/n
        print(f"{k[:34]:34s} {n:4d} {t:9.2f} {a[1]/tot*100:6.1f} {a[2]/n/1e6:7.2f} {a[2]/a[1] if a[1] else 0:7.1f} {a[3]/n:6.1f} {a[4]/n:5.1f} {a[5]/n:5.1f} {a[6]:4.0f} {a[7]/n:6.0f} {a[8]/n/1e6:6.2f}")
    print('total time units', tot)
