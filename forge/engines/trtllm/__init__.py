"""TensorRT-LLM as a forge engine, everything of it in one place: backend.py (the plugin: its
Backend object and the Engine over the LLM API or the Executor, imported only in the card worker),
section.py (the `trtllm:` contract section), mapping.py + arguments.py (contract -> engine
arguments, pure), release.py (what a release offers, as data) and install.py (asking the installed
package), quant.py (the checkpoint's declared KV quantization), rules.py (what `forge validate` asks
of any contract for TensorRT-LLM) and engine_dir.py (a contract against an engine directory's
files). Nothing here imports tensorrt_llm, torch or transformers at module level."""
