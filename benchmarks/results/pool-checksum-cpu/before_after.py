"""Before/after (issue 31, the verified read made cheaper): SGLang's `file` (unchecked), the verified `file` backend
as it was at cbbd1ea (before) and the checkout's (after), in one process, the reads alternating repeat by repeat (the
order reversed every other repeat), as pool_checksum_bench.measure does; and the digest alone, both forms.

The "before" modules are taken from git into a directory of their own:

    mkdir -p /tmp/vc/old
    git show cbbd1ea:sessiongate/sglang_ext/internals/page_digest.py > /tmp/vc/old/old_page_digest.py
    git show cbbd1ea:sessiongate/sglang_ext/internals/checked_file_store.py \
        | sed 's/from sessiongate.sglang_ext.internals.page_digest import/from old_page_digest import/' \
        > /tmp/vc/old/old_checked_file_store.py
    PYTHONPATH=. python benchmarks/results/pool-checksum-cpu/before_after.py 64,128,1024 512 7
"""
import sys, os, statistics, tempfile, time, contextlib, dataclasses
sys.path.insert(0, "/tmp/vc/old")
from sessiongate.sglang_ext.cpu_compat import activate
activate(patch_sglang=False)
import torch
from sessiongate.sglang_ext.internals.storage_config import file_store, single_rank_storage_config
from old_checked_file_store import CheckedFileStore as Before
import old_page_digest
from sessiongate.sglang_ext.internals import page_digest

def per_page(run, n):
    s = time.perf_counter(); run(); return (time.perf_counter() - s) / n * 1e6

def measure(page_bytes, pages, repeats):
    values = [torch.randn(page_bytes // 4) for _ in range(pages)]
    target = torch.empty(page_bytes // 4)
    keys = [f"page-{i}" for i in range(pages)]
    reads = {n: [] for n in ("file-unchecked", "before", "after")}
    with contextlib.ExitStack() as st:
        d = lambda: st.enter_context(tempfile.TemporaryDirectory(prefix="pool-ba-"))
        stores = {"file-unchecked": file_store(d(), verified=False),
                  "before": Before(single_rank_storage_config("bench", {"file_storage_path": d()})),
                  "after": file_store(d(), verified=True)}
        for s in stores.values():
            for k, v in zip(keys, values): assert s.set(k, v)
        for r in range(repeats):
            order = list(stores.items()) if r % 2 == 0 else list(reversed(stores.items()))
            for n, s in order:
                def read(s=s):
                    for k in keys:
                        assert s.exists(k); assert s.get(k, target) is not None
                reads[n].append(per_page(read, pages))
    # digest alone, both forms, on a page just copied into the host page
    view = target.numpy().data.cast("B")
    alone = {"before": [], "after": []}
    for r in range(repeats):
        for n, mod in (("before", old_page_digest), ("after", page_digest)):
            spent = 0.0
            for i, v in enumerate(values):
                target.numpy()[:] = v.numpy()
                s = time.perf_counter(); mod.pack_trailer(f"page-{i}", [view]); spent += time.perf_counter() - s
            alone[n].append(spent / pages * 1e6)
    return reads, alone

page_kib = [int(x) for x in sys.argv[1].split(",")]; pages = int(sys.argv[2]); repeats = int(sys.argv[3])
print("load", os.getloadavg())
for kib in page_kib:
    reads, alone = measure(kib * 1024, pages, repeats)
    u = statistics.median(reads["file-unchecked"]); ub = min(reads["file-unchecked"])
    for n, v in reads.items():
        m = statistics.median(v)
        print(f"| {kib} KiB | {n} | {m:.1f} / {min(v):.1f} | {(m/u-1)*100:+.1f}% / {(min(v)/ub-1)*100:+.1f}% | range {min(v):.1f}-{max(v):.1f}")
    for n, v in alone.items():
        m = statistics.median(v)
        print(f"| {kib} KiB | digest alone {n} | {m:.2f} / {min(v):.2f} | {m/u*100:.1f}% / {min(v)/ub*100:.1f}% of unchecked")
print("load", os.getloadavg())
