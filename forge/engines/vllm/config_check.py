"""`python -m forge.engines.vllm.config_check`: vLLM's own configuration objects built from forge's
engine arguments, in a process of its own, so `forge validate` stays light (it imports no engine
library: tests/cli/ test_light_imports.py) and a vLLM import that hangs or crashes is bounded by the
parent's timeout.

stdin: [{"where": file, "arguments": mapping.engine_arguments(...)}, ...]; stdout, last line: JSON,
per request [[path, message], ...]. Used by forge/engines/vllm/backend.py::vllm_engine_check and
scripts/check_vllm_wheel.py."""
from __future__ import annotations

import json
import sys


def main() -> int:
    requests = json.loads(sys.stdin.read())
    from forge.engines.vllm.factory import engine_args, import_vllm
    from forge.engines.vllm.rules import engine_config_problems

    import_vllm()
    answers = [
        [
            [p.path, p.message]
            for p in engine_config_problems(r["where"], r["arguments"], engine_args)
        ]
        for r in requests
    ]
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
