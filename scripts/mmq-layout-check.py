#!/usr/bin/env python3
"""Checks the data movement of kernels/mmq.cu on the host, without a GPU: the tensor-core
fragment layouts (PTX ISA mma.m16n8k32 / m16n8k16 .s8), quad_transpose, act_mma's layout, the
Q4_0 -8 correction through the activation sum and the Q6_K q - 32 byte trick, against integer
reference dots (exact). Needs numpy.  python3 scripts/mmq-layout-check.py
"""
import numpy as np
rng=np.random.default_rng(1)
def mma_k32(A,B):  # A[lane][4 regs] (bytes), B[lane][2 regs]; returns C[lane][4]
    # reconstruct A (16x32) and B (32x8) from fragments per PTX layout
    Am=np.zeros((16,32),np.int64); Bm=np.zeros((32,8),np.int64)
    for lane in range(32):
        g,c=lane>>2,lane&3
        for r,(row,k0) in enumerate([(g,4*c),(g+8,4*c),(g,16+4*c),(g+8,16+4*c)]):
            for i in range(4): Am[row,k0+i]=np.int8(np.uint8((A[lane][r]>>(8*i))&255))
        for r,k0 in enumerate([4*c,16+4*c]):
            for i in range(4): Bm[k0+i,g]=np.int8(np.uint8((B[lane][r]>>(8*i))&255))
    Cm=Am@Bm
    return [[Cm[g,2*c],Cm[g,2*c+1],Cm[g+8,2*c],Cm[g+8,2*c+1]] for lane in range(32) for g,c in [(lane>>2,lane&3)]]
def mma_k16(A,B):
    Am=np.zeros((16,16),np.int64); Bm=np.zeros((16,8),np.int64)
    for lane in range(32):
        g,c=lane>>2,lane&3
        for r,row in enumerate([g,g+8]):
            for i in range(4): Am[row,4*c+i]=np.int8(np.uint8((A[lane][r]>>(8*i))&255))
        for i in range(4): Bm[4*c+i,g]=np.int8(np.uint8((B[lane]>>(8*i))&255))
    Cm=Am@Bm
    return [[Cm[g,2*c],Cm[g,2*c+1],Cm[g+8,2*c],Cm[g+8,2*c+1]] for lane in range(32) for g,c in [(lane>>2,lane&3)]]
def quad_transpose(V):  # V[lane][4]
    V=[list(v) for v in V]
    for i in range(2):
        send=[V[l][i] if (l&3)&2 else V[l][i+2] for l in range(32)]
        for l in range(32):
            r=send[l^2]
            if (l&3)&2: V[l][i]=r
            else: V[l][i+2]=r
    for i in (0,2):
        send=[V[l][i] if (l&3)&1 else V[l][i+1] for l in range(32)]
        for l in range(32):
            r=send[l^1]
            if (l&3)&1: V[l][i]=r
            else: V[l][i+1]=r
    return V
def w32(b): return int(b[0])|(int(b[1])<<8)|(int(b[2])<<16)|(int(b[3])<<24)
# ---- Q4_0: 16 rows, 4 blocks (one chunk), 8 tokens
nb=4
q=rng.integers(0,16,(16,nb,32)); a=rng.integers(-127,128,(8,nb,32))
ref=np.einsum('rbk,tbk->rtb',q-8,a)  # per block integer dot
# weight bytes per row/block: byte m = q[m] | q[m+16]<<4
Wb=np.zeros((16,nb,16),np.int64); Wb[:]=q[:,:,:16]|(q[:,:,16:]<<4)
# lane loads block c of rows g, g+8
la=[[w32(Wb[l>>2,l&3,4*i:4*i+4]) for i in range(4)] for l in range(32)]
lb=[[w32(Wb[(l>>2)+8,l&3,4*i:4*i+4]) for i in range(4)] for l in range(32)]
la=quad_transpose(la); lb=quad_transpose(lb)
M=0x0F0F0F0F
for j in range(nb):
    A=[[la[l][j]&M, lb[l][j]&M, (la[l][j]>>4)&M, (lb[l][j]>>4)&M] for l in range(32)]
    # act_mma: lane (g,c): words c and 4+c of token g
    def aw(t,m): return w32(np.uint8(a[t,j,4*m:4*m+4].astype(np.int8).view(np.uint8)))
    B=[[aw(l>>2,l&3), aw(l>>2,4+(l&3))] for l in range(32)]
    C=mma_k32(A,B)
    asum=a[:,j,:].sum(1)
    for l in range(32):
        g,c=l>>2,l&3
        for i,(row,tok) in enumerate([(g,2*c),(g,2*c+1),(g+8,2*c),(g+8,2*c+1)]):
            assert C[l][i]-8*asum[tok]==ref[row,tok,j],(j,l,i)
print("q4_0 ok")
# ---- Q6_K: one chunk = 4 sub-blocks of 32 = 8 groups of 16
qq=rng.integers(0,64,(16,4,32)); sc=rng.integers(-128,128,(16,8)); a=rng.integers(-127,128,(8,4,32))
ref=np.zeros((16,8),np.int64)
for r in range(16):
    for s in range(4):
        for h in range(2):
            ref[r]+=sc[r,2*s+h]*((qq[r,s,16*h:16*h+16]-32)@a[:,s,16*h:16*h+16].T)
lo=qq&15; hi=qq>>4
Lb=lo[:,:,:16]|(lo[:,:,16:]<<4)
def hwords(r,s):
    hw=[0,0]
    for m in range(32): hw[m//16]|=int(hi[r,s,m])<<(8*(m%4)+2*((m%16)//4))
    return hw
la=[[w32(Lb[l>>2,l&3,4*i:4*i+4]) for i in range(4)] for l in range(32)]
lb=[[w32(Lb[(l>>2)+8,l&3,4*i:4*i+4]) for i in range(4)] for l in range(32)]
la=quad_transpose(la); lb=quad_transpose(lb)
def q6s8(lo_,hi_): return (((lo_|hi_|0x80808080)-0x20202020)^0x80808080)&0xFFFFFFFF
acc=np.zeros((32,4),np.int64)
for j in range(4):
    for half in range(2):
        gi=2*j+half
        A=[]
        for l in range(32):
            g,c=l>>2,l&3
            regs=[]
            for row,lw in [(g,la[l][j]),(g+8,lb[l][j])]:
                lo_=((lw>>4) if half else lw)&M
                hi_=((hwords(row,j)[half]>>(2*c))&0x03030303)<<4
                regs.append(q6s8(lo_,hi_))
            A.append(regs)
        def aw(t): return [w32(np.uint8(a[t,j,16*half+4*c:16*half+4*c+4].astype(np.int8).view(np.uint8))) for c in range(4)]
        B=[aw(l>>2)[l&3] for l in range(32)]
        C=mma_k16(A,B)
        for l in range(32):
            g,c=l>>2,l&3
            for i,row in enumerate([g,g,g+8,g+8]): acc[l][i]+=sc[row,gi]*C[l][i]
for l in range(32):
    g,c=l>>2,l&3
    for i,(row,tok) in enumerate([(g,2*c),(g,2*c+1),(g+8,2*c),(g+8,2*c+1)]):
        assert acc[l][i]==ref[row,tok],(l,i,acc[l][i],ref[row,tok])
print("q6_k ok")
