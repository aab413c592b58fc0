# Experiment (docs/benchmarks.md, "The seventh session on the H200"): capture, at an engine's load, the CUDA graphs of
# batch shapes met before, so a job's window does not pay for them. transformers captures a graph the first time a
# padded shape (query tokens, KV tokens read, longest key) comes up, 0.07-0.46 s each on the 8B H200 tier, and its
# own warmup() captures only the largest prefill shape; a fresh engine's first 256-record job spent 21 % (direct) and
# 36 % (forge) of its window capturing. This wraps ModelRunner.warmup: after transformers' own, one fake prefill
# request per shape (one query token, past = longest key - 1) is prepared with the shape's padded sizes and run
# through compute_batch, which captures the graph under the shape's key, as transformers' warmup does for its one
# shape. Oracle input: the shapes come from capture logs of earlier runs (exp/timeline's <pid>.graphs.jsonl), so this
# measures what a forge that remembers a tier's shapes would gain; it is not that feature. (Since the tenth session
# that feature exists: transformers.graph_shape_cache, forge/engines/hf/graph_shapes.py; run.sh's cached-* stages.)
#   PRECAPTURE=FILE_OR_DIR   capture logs (*.graphs.jsonl), shapes taken in order of first appearance, deduplicated
#   PRECAPTURE_IN=TEXT       only in processes whose command line contains TEXT (e.g. forge.host: forge's card workers)
#   PRECAPTURE_S=SECONDS     stop capturing after this long (default 120)
# Also loads the recorder (../timeline), so the captures left in each window can be counted.
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_path = os.path.join(_HERE, "..", "timeline", "sitecustomize.py")
exec(compile(open(_path).read(), _path, "exec"), {"__name__": "sitecustomize", "__file__": _path})


def shapes_from(path):
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".graphs.jsonl"))
    seen, out = set(), []
    for f in files:
        with open(f) as src:
            for line in src:
                key = json.loads(line).get("key") if line.strip() else None
                if key and len(key) == 3 and tuple(key) not in seen:
                    seen.add(tuple(key))
                    out.append(tuple(key))
    return out


def capture_shape(runner, model, key, force_key_only=False):
    """Prepare one fake prefill request at the padded sizes of key = (q, kv, longest key) and run it through
    compute_batch (a capture when the runner uses CUDA graphs and the key is new). Returns the key the batch got."""
    from transformers.generation.continuous_batching.requests import RequestStatus, create_warmup_future_states

    q, kv, longest = key
    states = create_warmup_future_states(1, RequestStatus.PREFILLING, 1, max(longest - 1, 0), runner.cache)
    if not states:
        return None
    io = runner.inputs_and_outputs
    try:
        io.prepare_batch_tensors(states, runner.logit_processor, False, q, kv, use_padding=True)
        batch = io.get_model_kwargs(use_padding=True)
        got = io._get_graph_key()
        if not force_key_only:
            import torch

            with torch.no_grad():                # as transformers' own warmup runs
                runner.compute_batch(model, batch)
            if io.compute_stream is not None:
                io.compute_stream.synchronize()
        return got
    finally:
        for fs in states:
            runner.cache.free_blocks(fs.state.request_id)


_SRC = os.environ.get("PRECAPTURE")
_IN = os.environ.get("PRECAPTURE_IN", "")
if _SRC:
    with open("/proc/self/cmdline", "rb") as _f:
        _mine = _IN in _f.read().replace(b"\0", b" ").decode(errors="replace")
    if _mine:
        from transformers.generation.continuous_batching import model_runner as _mr2

        _warm = _mr2.ModelRunner.warmup

        def _warmup_and_precapture(self, model):
            _warm(self, model)
            if not (self.pad_inputs and self.use_cuda_graph_varlen) or not hasattr(self.inputs_and_outputs, "graphs"):
                print("precapture: skipped (no CUDA graphs on the varlen path, or async IO)", file=sys.stderr)
                return
            limit = float(os.environ.get("PRECAPTURE_S", "120"))
            shapes, t0, done = shapes_from(_SRC), time.perf_counter(), 0
            for key in shapes:
                if time.perf_counter() - t0 > limit:
                    break
                if self.inputs_and_outputs.graphs.get_graph(key) is None and capture_shape(self, model, key) is not None:
                    done += 1
            self.cache.reset()
            print(f"precapture: {done} of {len(shapes)} shapes in {time.perf_counter() - t0:.1f} s "
                  f"(pid {os.getpid()})", file=sys.stderr)

        _mr2.ModelRunner.warmup = _warmup_and_precapture
