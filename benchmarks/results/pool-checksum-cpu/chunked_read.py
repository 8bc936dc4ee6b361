"""Reading a page in pieces and hashing each piece as it lands, against one readv and one hash of the page, on raw page
files in the OS page cache (no pool backend around them). argv: page KiB, pages, repeats, and "hot" to read every page
into one target (as pool_checksum_bench) instead of a distinct one each (as a host pool). Output: chunked-read.txt."""
import os, time, statistics, xxhash, numpy as np, tempfile, sys
d=tempfile.mkdtemp(prefix="vcmb-")
PAGE=int(sys.argv[1])*1024; N=int(sys.argv[2]) if len(sys.argv)>2 else 256
paths=[]
for i in range(N):
    p=os.path.join(d,f"p{i}.bin"); b=np.random.bytes(PAGE)
    with open(p,"wb") as f: f.write(b); f.write(b"\0"*20)
    paths.append(p)
HOT = len(sys.argv) > 4 and sys.argv[4] == "hot"
host=np.empty(PAGE if HOT else PAGE*N,dtype=np.uint8)
def slot(i): return host if HOT else host[i*PAGE:(i+1)*PAGE]
tr=bytearray(21)
def unchecked():
    for i,p in enumerate(paths):
        with open(p,"rb",buffering=0) as f:
            f.readinto(memoryview(slot(i)))
def readv_only():
    for i,p in enumerate(paths):
        fd=os.open(p,os.O_RDONLY)
        try: os.readv(fd,[memoryview(slot(i)),tr])
        finally: os.close(fd)
def readv_hash():
    for i,p in enumerate(paths):
        page=memoryview(slot(i))
        fd=os.open(p,os.O_RDONLY)
        try: os.readv(fd,[page,tr])
        finally: os.close(fd)
        h=xxhash.xxh3_64(b"key"); h.update(page); h.intdigest()
def chunked(C):
    def run():
        for i,p in enumerate(paths):
            page=memoryview(slot(i))
            h=xxhash.xxh3_64(b"key")
            fd=os.open(p,os.O_RDONLY)
            try:
                off=0
                while off<PAGE:
                    end=min(off+C,PAGE)
                    if end==PAGE:
                        n=os.readv(fd,[page[off:end],tr])
                    else:
                        n=os.readinto(fd,page[off:end]) if hasattr(os,"readinto") else os.readv(fd,[page[off:end]])
                    h.update(page[off:end]); off=end
            finally: os.close(fd)
            h.intdigest()
    return run
variants={"unchecked(FileIO)":unchecked,"readv only":readv_only,"readv+hash":readv_hash}
for C in (32<<10,64<<10,128<<10,256<<10):
    if C<PAGE: variants[f"chunked {C>>10}K"]=chunked(C)
res={k:[] for k in variants}
for r in range(int(sys.argv[3]) if len(sys.argv)>3 else 7):
    for k,f in variants.items():
        s=time.perf_counter(); f(); res[k].append((time.perf_counter()-s)/N*1e6)
base=statistics.median(res["unchecked(FileIO)"])
for k,v in res.items():
    m=statistics.median(v); print(f"{PAGE>>10}KiB {k:20s} median {m:7.1f} best {min(v):7.1f} ({(m/base-1)*100:+.1f}%)")
import shutil; shutil.rmtree(d)
