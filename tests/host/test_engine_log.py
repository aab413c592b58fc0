"""A card worker's console keeps forge's lines and one line per class of engine warning that matters
(forge/host/engine_log.py): the filter as pure logic over log records; the file itself is checked on
a real vLLM run (tests/vllm_backend/test_forge_run.py)."""
from __future__ import annotations

import io
import logging
from pathlib import Path

from forge.host.engine_log import OncePerClass, log_path


def record(name: str, level: int, msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_one_line_per_class_noise_and_forges_own_lines_left_out():
    console = io.StringIO()
    h = OncePerClass(console, "cpu0", Path("/h/logs/n/cpu0.log"))
    h.handle(record("vllm.worker", logging.WARNING, "KV cache of %d blocks is small", 10))
    # same class
    h.handle(record("vllm.worker", logging.WARNING, "KV cache of %d blocks is small", 20))
    # noise
    h.handle(record("vllm.cpu_worker", logging.WARNING, "libtcmalloc is not found in LD_PRELOAD."))
    h.handle(record("py.warnings", logging.WARNING, "x.py:1: DeprecationWarning: old"))  # noise
    h.handle(record("vllm.core", logging.ERROR, "Triton kernel failed"))  # errors always
    h.handle(record("forge.host", logging.WARNING, "card cpu0: said by forge's own handler"))
    h.handle(record("torch", logging.INFO, "an INFO line"))  # below WARNING
    assert console.getvalue().splitlines() == [
        "forge: card cpu0: vllm warning: KV cache of 10 blocks is small (its log: "
        "/h/logs/n/cpu0.log)",
        "forge: card cpu0: vllm error: Triton kernel failed (its log: /h/logs/n/cpu0.log)",
    ]


def test_the_file_is_under_forge_home_per_node_and_card(monkeypatch, tmp_path):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path))
    assert log_path("local-vllm", "cpu0.r1") == tmp_path / "logs" / "local-vllm" / "cpu0.r1.log"
    assert log_path("a/b", "..") == tmp_path / "logs" / "a_b" / "...log"
