import gc, os, sys, time, atexit
if 'serve' in sys.argv or os.environ.get('GCPROBE_ALL'):
    _start = [0.0]
    _stats = {0: [], 1: [], 2: []}
    def _cb(phase, info):
        if phase == 'start':
            _start[0] = time.perf_counter()
        else:
            _stats[info['generation']].append((time.perf_counter() - _start[0]) * 1000)
            pass
    def _dump():
        with open(f"/work/scratch/gcprobe/gc-{os.getpid()}.txt", 'w') as f:
            for g, v in _stats.items():
                if v:
                    s = sorted(v)
                    f.write(f"gen{g} n={len(s)} total_ms={sum(s):.0f} p50={s[len(s)//2]:.2f} p99={s[int(len(s)*0.99)]:.2f} max={s[-1]:.1f}\n")
            f.write(f"thresholds={gc.get_threshold()} frozen={gc.get_freeze_count()}\n")
    gc.callbacks.append(_cb)
    atexit.register(_dump)
    import threading
    def _every():
        while True:
            time.sleep(5)
            _dump()
    threading.Thread(target=_every, daemon=True).start()
if 'serve' in sys.argv and os.environ.get('GCPROBE_TUNE'):
    import threading
    def _tune():
        time.sleep(float(os.environ.get('GCPROBE_FREEZE_AFTER', '6')))
        gc.collect()
        gc.freeze()
        t = os.environ.get('GCPROBE_THRESHOLD')
        if t:
            gc.set_threshold(*map(int, t.split(',')))
        with open(f"/work/scratch/gcprobe/frozen-{os.getpid()}.txt", 'w') as f:
            f.write(f"frozen={gc.get_freeze_count()} thresholds={gc.get_threshold()}\n")
    threading.Thread(target=_tune, daemon=True).start()
if 'serve' in sys.argv and os.environ.get('GCPROBE_TYPES'):
    import threading, collections
    def _types():
        time.sleep(float(os.environ.get('GCPROBE_TYPES')))
        objs = gc.get_objects()
        c = collections.Counter(type(o).__qualname__ for o in objs)
        with open(f"/work/scratch/gcprobe/types-{os.getpid()}.txt", 'w') as f:
            f.write(f"tracked={len(objs)} frozen={gc.get_freeze_count()}\n")
            for t, n in c.most_common(25):
                f.write(f"{n:8d} {t}\n")
    threading.Thread(target=_types, daemon=True).start()
