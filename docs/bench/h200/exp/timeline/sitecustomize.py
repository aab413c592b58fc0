# Experiment (docs/benchmarks.md, "The sixth session on the H200"): the timeline of what entered transformers'
# scheduler, step by step, in every process (the direct mode's and forge's card worker alike). Put this directory on
# PYTHONPATH and set TIMELINE to a directory; each process appends to TIMELINE/<pid>.jsonl one line per request the
# generation loop took from its input queue: {"step": the manager's step count when it was taken (the request is in
# the next step's schedule), "id", "max_new", "prompt"}. docs/bench/h200/replay_timeline.py feeds a fresh engine the
# same requests at the same steps, so forge's schedule can be timed without forge. Also loads the step timer and
# the per-thread CPU log (../steptime-threads: STEPLOG, THREADLOG).
import json
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_path = os.path.join(_HERE, "..", "steptime-threads", "sitecustomize.py")
exec(compile(open(_path).read(), _path, "exec"), {"__name__": "sitecustomize", "__file__": _path})

_DIR = os.environ.get("TIMELINE")
if _DIR:
    from transformers.generation.continuous_batching import continuous_api as _api

    _M = _api.ContinuousBatchingManager
    _body, _drain = _M._generation_loop_body, _api.drain_queue
    _step = [0]

    def _noting_body(self, bp, bootstrapping):
        _step[0] = self.current_batch
        return _body(self, bp, bootstrapping)

    def _noting_drain(q):
        got = _drain(q)
        states = [s for s in got if isinstance(s, _api.RequestState)]
        if states:
            cmd = os.path.join(_DIR, f"{os.getpid()}.cmd")
            if not os.path.exists(cmd):      # which process this log is (the bench's direct child, a card worker)
                with open("/proc/self/cmdline", "rb") as src, open(cmd, "wb") as dst:
                    dst.write(src.read().replace(b"\0", b" ") + b"\n")
            with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a") as f:
                for s in states:
                    f.write(json.dumps({"step": _step[0], "id": s.request_id, "max_new": s.max_new_tokens,
                                        "prompt": list(s.initial_tokens)}) + "\n")
        return got

    _M._generation_loop_body, _api.drain_queue = _noting_body, _noting_drain

    # CUDA graph captures (tiers with use_cuda_graph): each new padded batch shape is captured the first time it comes
    # up, a warm-up forward and a captured one inside the step. TIMELINE/<pid>.graphs.jsonl, one line per capture:
    # {"t": wall clock at its end, "step", "key": the shape, "s": seconds it took}; docs/bench/h200/graph_captures.py
    # counts them inside each bench run's window.
    import time as _time
    from transformers.generation.continuous_batching import model_runner as _mr

    _capture = _mr.ModelRunner._capture_graph

    def _timed_capture(self, *args, **kwargs):
        t0 = _time.perf_counter()
        try:
            return _capture(self, *args, **kwargs)
        finally:
            s = _time.perf_counter() - t0
            try:
                key = list(self.inputs_and_outputs._get_graph_key())
            except Exception:  # noqa: BLE001 - an experiment's log never breaks the run
                key = None
            with open(os.path.join(_DIR, f"{os.getpid()}.graphs.jsonl"), "a") as f:
                f.write(json.dumps({"t": round(_time.time(), 3), "step": _step[0], "key": key,
                                    "s": round(s, 4)}) + "\n")

    _mr.ModelRunner._capture_graph = _timed_capture
