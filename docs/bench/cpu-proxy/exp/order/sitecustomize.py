# Experiment (same section): with ORDERLOG=FILE every request the transformers engine is handed is appended to FILE
# (time, id, max_new_tokens, prompt length, first ids): the order forge feeds the engine. Thread transport.
import os, time, json
if os.environ.get("ORDERLOG"):
    import forge.engines.hf.engine as e
    _orig = e.TransformersEngine.submit
    def submit(self, requests):
        with open(os.environ["ORDERLOG"], "a") as f:
            t = time.perf_counter()
            for r in requests:
                f.write(json.dumps([t, r.request_id, r.max_new_tokens, len(r.prompt_ids), list(r.prompt_ids[:4])]) + "\n")
        return _orig(self, requests)
    e.TransformersEngine.submit = submit
