# Experiment (docs/benchmarks.md, "Where a step's time goes"): time transformers' generation loop from inside, in
# every process (the bench's direct engine and forge's card worker alike). Put this directory on PYTHONPATH and set
# STEPLOG to a directory; each process appends one JSON line per manager every 16 steps and at every idle wait:
# steps, seconds inside step bodies (schedule + forward + sample + update), seconds in the forward alone, seconds
# and count of idle waits (no request to run), and q tokens. The last line per (pid, manager) is its total.
import json
import os
import time

_DIR = os.environ.get("STEPLOG")
if _DIR:
    from transformers.generation.continuous_batching import continuous_api as _api

    _M = _api.ContinuousBatchingManager
    _body, _step = _M._generation_loop_body, _M._generation_step
    _acc: dict = {}

    def _dump(mgr, a):
        with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(dict(a, pid=os.getpid(), mgr=id(mgr), t=time.time())) + "\n")

    def _timed_step(self):
        t0 = time.perf_counter()
        try:
            return _step(self)
        finally:
            _acc.setdefault(id(self), dict(steps=0, step_s=0.0, fwd_s=0.0, idle_s=0.0, idle_n=0, q=0))["fwd_s"] += \
                time.perf_counter() - t0

    def _timed_body(self, bp, bootstrapping):
        a = _acc.setdefault(id(self), dict(steps=0, step_s=0.0, fwd_s=0.0, idle_s=0.0, idle_n=0, q=0))
        before, t0 = self.current_batch, time.perf_counter()
        r = _body(self, bp, bootstrapping)
        dt = time.perf_counter() - t0
        if self.current_batch > before:
            a["steps"] += 1
            a["step_s"] += dt
            a["q"] += int(getattr(bp.inputs_and_outputs, "num_q_tokens", 0) or 0)
            if a["steps"] % 16 == 0:
                _dump(self, a)
        else:
            a["idle_s"] += dt
            a["idle_n"] += 1
            if a["idle_n"] % 16 == 1:
                _dump(self, a)
        return r

    _M._generation_loop_body, _M._generation_step = _timed_body, _timed_step
