"""The conformance suite's nodes and records: every installed engine gets the same node descriptions
as the shipped ones (`local`: transformers, `local-vllm`: vLLM CPU, `local-mixed`: one card of
each), over a copy of the embedded tiny model whose tokenizer config gains a chat template (the only
change: its weights and tokenizer are the embedded fp32 model's), so that chat templates are
compared too."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.forge_cli import forge_env

REPO = Path(__file__).resolve().parents[2]
EMBEDDED = REPO / "forge" / "embedded"
FUNCTION = Path(__file__).resolve().parent / "fixtures" / "conform.py"
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about "
                                                                                    "the Queen."}]
AS_PROMPT = "<|system|>Be brief.\n<|user|>Tell me about the Queen.\n<|assistant|>"

ENGINES = ("local", "local-vllm", "local-mixed")
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None

MORE_GREEDY = [
    "The Cheshire Cat grinned",
    "It was the best of butter",
    "Off with their heads",
    "Curiouser and",
    "The White Rabbit put on his spectacles",
    "Why is a raven like",
    "She ate a little bit of the",
    "Twinkle, twinkle, little bat",
]
TEXTS = ["Alice was beginning to get very tired", "The Queen of Hearts", "Down the rabbit hole",
         "The Mock Turtle sighed deeply", "Product: a stainless steel chef's knife. Category:",
         "Product: waterproof hiking boots. Category:", "Once upon a time", "The Hatter said"]


def valid_records() -> list[dict]:
    """Requests every engine must answer: greedy text, stop strings, a chat template, a choice, a
    JSON schema."""
    rows = [{"kind": "greedy", "text": t} for t in TEXTS + MORE_GREEDY]
    rows += [{"kind": "stop", "text": t} for t in TEXTS[:3]]
    rows += [{"kind": "chat", "messages": MESSAGES, "as_prompt": AS_PROMPT}]
    rows += [{"kind": "choice", "text": t} for t in TEXTS[4:8] + TEXTS[:2]]
    rows += [{"kind": "json", "text": f"{t}. As JSON:"} for t in TEXTS[:4]]
    return rows


EMBED = {"kind": "embed", "text": TEXTS[2]}


def refused_records() -> list[dict]:
    """Requests no engine can answer (each one's row a RequestRejected error, the same on every
    engine) among valid ones, and `embed`."""
    return [{"kind": "greedy", "text": TEXTS[0]}, {"kind": "unsatisfiable", "text": "Anything:"},
            {"kind": "too_long", "text": "the rabbit hole went on ", "repeat": 200},
            EMBED, {"kind": "unsatisfiable", "text": "Say anything at all:"},
            {"kind": "greedy", "text": TEXTS[3]}]


def uncompilable_records() -> list[dict]:
    """A schema the grammar backend cannot compile, among valid requests: the module's last job on
    each node, as today it takes vLLM's engine down (issue 49)."""
    return [{"kind": "greedy", "text": TEXTS[0]}, {"kind": "uncompilable", "text": "Three digits:"},
            {"kind": "greedy", "text": TEXTS[1]}, {"kind": "uncompilable", "text": "Digits:"},
            {"kind": "greedy", "text": TEXTS[3]}]


def templated_nodes(folder: Path) -> dict[str, Path]:
    """The shipped node descriptions and contracts, over a copy of the embedded model with a chat
    template."""
    model = folder / "tiny-chat"
    shutil.copytree(EMBEDDED / "tiny-llama", model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    for contract in ("tiny-llama-cpu.yaml", "tiny-llama-vllm.yaml"):
        text = (EMBEDDED / contract).read_text()
        assert "checkpoint: tiny-llama " in text, contract
        (folder / contract).write_text(text.replace("checkpoint: tiny-llama ", "checkpoint: "
                                                                               "tiny-chat "))
    nodes = {}
    for name, source in (
        ("local", EMBEDDED / "local.yaml"),
        ("local-vllm", EMBEDDED / "local-vllm.yaml"),
        ("local-mixed", REPO / "node_descriptions" / "local-mixed.yaml"),
    ):
        nodes[name] = folder / f"{name}.yaml"
        nodes[name].write_text(source.read_text().replace("../forge/embedded/", ""))
    return nodes


class ProvisionedNode:
    """`forge provision DESCRIPTION` in a process of its own, shared by every job of a module on
    that engine."""

    def __init__(
        self, description: Path, folder: Path, *, timeout_s: float = 300, wait: bool = True
    ):
        self.folder, self.name, self.timeout_s = folder, description.name, timeout_s
        self.env = forge_env({"FORGE_HOME": str(folder / "home"), "PYTHONUNBUFFERED": "1"})
        self._ready = folder / "ready"
        self.log = folder / "provision.err"
        self.url, self.up_s = "", 0.0
        self._t0 = time.monotonic()
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "forge",
                    "provision",
                    str(description),
                    "--port",
                    "0",
                    "--ready-file",
                    str(self._ready),
                ],
                cwd=folder,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        while wait and not self.is_up():
            time.sleep(0.2)

    def is_up(self) -> bool:
        """Whether the node answers now (its ready file is written); fails the test if it ended or
        took too long."""
        if self.url:
            return True
        if not self._ready.exists():
            if self.proc.poll() is not None or time.monotonic() - self._t0 > self.timeout_s:
                self.stop()
                raise AssertionError(f"{self.name} did not come up: {self.log.read_text()[-3000:]}")
            return False
        self.url = self._ready.read_text().strip()
        self.up_s = time.monotonic() - self._t0
        return True

    def deploy(
        self, name: str, records: list[dict]
    ) -> tuple[subprocess.CompletedProcess, dict[int, dict]]:
        """One `forge deploy` job of the conformance function: its process, and the output rows by
        index (every index must come once: checked here, on every job)."""
        inp, out = self.folder / f"{name}.jsonl", self.folder / f"{name}.out.jsonl"
        inp.write_text("".join(json.dumps(r) + "\n" for r in records))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "forge",
                "deploy",
                str(FUNCTION),
                "--node",
                self.url,
                "--input",
                str(inp),
                "--output",
                str(out),
                "--progress",
                "off",
                "--no-report",
            ],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        rows: dict[int, dict] = {}
        for line in (out.read_text().splitlines() if out.exists() else []):
            row = json.loads(line)
            assert row["index"] not in rows, f"{name}: index {row['index']} twice"
            rows[row["index"]] = row
        return proc, rows

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def engine_available(name: str) -> bool:
    if name == "local":
        return True
    return VLLM_INSTALLED and (name != "local-mixed" or len(os.sched_getaffinity(0)) >= 2)
