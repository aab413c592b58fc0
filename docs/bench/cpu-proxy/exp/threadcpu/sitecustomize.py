# Experiment: CPU time of every thread of every process, by thread name. Put this directory on PYTHONPATH and set
# THREADLOG to a directory; each process appends one JSON line a second to THREADLOG/<pid>.jsonl:
# {"pid", "t" (wall clock), "argv0", "threads": {name: cpu seconds so far (user + system, from /proc)}}.
# Threads that have ended keep their last figure. Linux only. Summary: docs/bench/threadcpu_summary.py DIR.
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("THREADLOG")
if _DIR and os.path.isdir("/proc/self/task"):
    _TICK = os.sysconf("SC_CLK_TCK")
    _seen: dict = {}

    def _cpu_of(tid: int):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICK
        except OSError:
            return None

    def _sample() -> None:
        path = os.path.join(_DIR, f"{os.getpid()}.jsonl")
        while True:
            time.sleep(1.0)
            names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
            for tid in os.listdir("/proc/self/task"):
                cpu = _cpu_of(int(tid))
                if cpu is not None:
                    key = f"{names.get(int(tid), 'native')}:{tid}"
                    _seen[key] = cpu
            with open(path, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "t": time.time(), "argv0": " ".join(sys.argv[:3]),
                                    "threads": _seen}) + "\n")

    threading.Thread(target=_sample, name="threadcpu", daemon=True).start()
