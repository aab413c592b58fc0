# Experiment (docs/benchmarks.md, "The seventh session on the H200"): the CUDA graph shapes a schedule would meet,
# counted on a CPU. Every batch transformers prepares is keyed the way its CUDA-graph path keys it (query tokens
# padded to Q_PAD, KV tokens read to KV_PAD, the longest key to a power of two, at least 1024; transformers 5.24's
# presets 64 and 16,384 are the defaults), and the first time a process meets a key is logged as
# SHAPES/<pid>.graphs.jsonl — the format of exp/timeline's capture log with "s": 0 — so
# docs/bench/h200/graph_captures.py counts the "captures" inside each bench window. The schedule does not depend on
# the model's speed, so with a CPU tier of a GPU tier's scheduling geometry (cpu-llama-micro-g8b.yaml) the counts
# are the GPU run's, but for the shapes the GPU's load-time warm-ups capture before any window. SHAPES_RAW=1 also
# logs every batch's unpadded sizes (<pid>.steps.jsonl), to count shapes under other paddings afterwards,
# with its request count ("n") and the requests it admitted ([id, prompt tokens, max_new_tokens]) for
# docs/bench/cpu-proxy/step_occupancy.py.
import json
import os
import time

_DIR = os.environ.get("SHAPES")
if _DIR:
    from transformers.generation.continuous_batching import input_outputs as _io
    from transformers.generation.continuous_batching.utils import pad_to_interval, pad_to_pow2

    _QP, _KP = int(os.environ.get("Q_PAD", "64")), int(os.environ.get("KV_PAD", "16384"))
    _prepare = _io.ContinuousBatchingIOs.prepare_batch_tensors
    _seen = set()
    _RAW = bool(os.environ.get("SHAPES_RAW"))
    _step = [0]
    _met = set()

    def _keyed_prepare(self, requests_in_batch, logits_processors, use_decode_fast_path, num_q_tokens, max_kv_read,
                       use_padding):
        out = _prepare(self, requests_in_batch, logits_processors, use_decode_fast_path, num_q_tokens, max_kv_read,
                       use_padding)
        _step[0] += 1
        cache = self.cache
        lenk = max(self.max_length_k.values()) if self.max_length_k else 0
        key = (pad_to_interval(num_q_tokens, _QP, cache.max_batch_tokens),
               pad_to_interval(max_kv_read, _KP, cache.max_tokens_read),
               pad_to_pow2(lenk, cache.max_tokens_read, 1024))
        if _RAW:      # every batch's unpadded sizes, to count shapes under other paddings afterwards
            with open(os.path.join(_DIR, f"{os.getpid()}.steps.jsonl"), "a") as f:
                f.write(json.dumps({"t": round(time.time(), 3), "raw": [num_q_tokens, max_kv_read, lenk],
                                    "n": len(requests_in_batch),
                                    "new": [[r.state.request_id, len(r.state.initial_tokens), r.state.max_new_tokens]
                                            for r in requests_in_batch if r.state.request_id not in _met]}) + "\n")
        if _RAW:
            _met.update(r.state.request_id for r in requests_in_batch)
        if key not in _seen:
            _seen.add(key)
            with open(os.path.join(_DIR, f"{os.getpid()}.graphs.jsonl"), "a") as f:
                f.write(json.dumps({"t": round(time.time(), 3), "step": _step[0], "key": list(key), "s": 0}) + "\n")
        return out

    _io.ContinuousBatchingIOs.prepare_batch_tensors = _keyed_prepare
