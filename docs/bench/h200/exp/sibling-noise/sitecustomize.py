# Experiment (docs/benchmarks.md, "The sixth session on the H200"): does Python work in another thread of the
# engine's process slow transformers' generation loop the way forge's card worker is slowed? In forge's worker the
# link, admission and driver threads run Python right after each completion (results out, refills in); the direct
# mode's process runs almost none. This adds that kind of work to the direct mode only: in a direct run's own process
# (`forge bench run --direct-process child`), each finished result taken from the manager is followed by NOISE_MS
# milliseconds of this thread's CPU in pure Python, in slices of 0.1 ms with the GIL offered back between slices
# (many short holds, as the worker's threads make). Runs alternate by NOISE_PATTERN (e.g. PNNPPN: P plain, N noisy),
# counted in NOISE_DIR, where each run leaves a file "<n>-<pid>-<P|N>". Also loads the step timer and the per-thread
# CPU log (../steptime-threads: STEPLOG, THREADLOG).
import os
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_path = os.path.join(_HERE, "..", "steptime-threads", "sitecustomize.py")
exec(compile(open(_path).read(), _path, "exec"), {"__name__": "sitecustomize", "__file__": _path})


def _is_direct_child() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return b"forge.bench.direct_child" in f.read()
    except OSError:
        return False


_DIR, _PATTERN = os.environ.get("NOISE_DIR"), os.environ.get("NOISE_PATTERN", "")
_MS = float(os.environ.get("NOISE_MS", "0") or 0)
if _DIR and _PATTERN and _MS > 0 and _is_direct_child():
    os.makedirs(_DIR, exist_ok=True)
    _n = len(os.listdir(_DIR))
    _mode = _PATTERN[_n % len(_PATTERN)]
    open(os.path.join(_DIR, f"{_n}-{os.getpid()}-{_mode}"), "w").close()
    if _mode == "N":
        from transformers.generation.continuous_batching import continuous_api as _api

        _get = _api.ContinuousBatchingManager.get_result

        def _noisy_get_result(self, *args, **kwargs):
            out = _get(self, *args, **kwargs)
            if out is not None and out.is_finished():
                end = time.thread_time() + _MS / 1000.0      # this thread's CPU, not wall time
                while time.thread_time() < end:
                    s = time.thread_time() + 0.0001
                    while time.thread_time() < s:
                        pass
                    time.sleep(0)              # offer the GIL back, as a thread between short tasks does
            return out

        _api.ContinuousBatchingManager.get_result = _noisy_get_result
