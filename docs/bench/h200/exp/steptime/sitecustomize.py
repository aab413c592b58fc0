# Experiment (docs/benchmarks.md, "Where a step's time goes"): time transformers' generation loop from inside, in
# every process (the bench's direct engine and forge's card worker alike). Put this directory on PYTHONPATH and set
# STEPLOG to a directory; each process appends one JSON line per manager every 16 steps, at the first idle wait after
# steps (so a run's last steps are written) and at every 16th idle wait:
# totals (steps, seconds inside step bodies (schedule + forward + sample + update), seconds in the forward alone,
# seconds and count of idle waits, q tokens) and the steps since the last line, each [wall-clock start, body s,
# forward s, q tokens]. The last line per (pid, manager) holds the totals; docs/bench/steplog_summary.py cuts the
# steps to each run's window when given the run's bench.json (its started_at and window_s).
import json
import os
import time

_DIR = os.environ.get("STEPLOG")
if _DIR:
    from transformers.generation.continuous_batching import continuous_api as _api

    _M = _api.ContinuousBatchingManager
    _body, _step = _M._generation_loop_body, _M._generation_step
    _acc: dict = {}

    def _state(mgr) -> dict:
        return _acc.setdefault(id(mgr), dict(steps=0, step_s=0.0, fwd_s=0.0, idle_s=0.0, idle_n=0, q=0, recent=[]))

    def _dump(mgr, a):
        with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(dict(a, pid=os.getpid(), mgr=id(mgr), t=time.time())) + "\n")
        a["recent"] = []

    def _timed_step(self):
        t0 = time.perf_counter()
        try:
            return _step(self)
        finally:
            _state(self)["fwd_s"] += time.perf_counter() - t0

    def _timed_body(self, bp, bootstrapping):
        a = _state(self)
        before, fwd0, wall, t0 = self.current_batch, a["fwd_s"], time.time(), time.perf_counter()
        r = _body(self, bp, bootstrapping)
        dt = time.perf_counter() - t0
        if self.current_batch > before:
            q = int(getattr(bp.inputs_and_outputs, "num_q_tokens", 0) or 0)
            a["steps"] += 1
            a["step_s"] += dt
            a["q"] += q
            a["recent"].append([round(wall, 4), round(dt, 5), round(a["fwd_s"] - fwd0, 5), q])
            if a["steps"] % 16 == 0:
                _dump(self, a)
        else:
            a["idle_s"] += dt
            a["idle_n"] += 1
            if a["recent"] or a["idle_n"] % 16 == 1:     # steps not yet written: the run's last ones
                _dump(self, a)
        return r

    _M._generation_loop_body, _M._generation_step = _timed_body, _timed_step
