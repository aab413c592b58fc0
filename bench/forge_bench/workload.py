"""Bench workloads: a YAML description (length mixes, shared prefixes, record count, seed) and the
deterministic list of token-id requests it generates.

    workload: prefix-heavy
    seed: 7
    records: 384
    input:                  # tokens each request adds after its shared prefix (or its whole prompt)
      - {min: 16, max: 96, weight: 3}
      - {min: 160, max: 320, weight: 1}
    output:                 # max_new_tokens
      - {min: 16, max: 48, weight: 1}
      - {min: 96, max: 128, weight: 1}
    shared_prefix:          # optional
      share: 0.9            # fraction of requests that start with one of the prefixes
      prefixes: 8           # distinct prefixes (picked uniformly)
      length: 512           # tokens per prefix

Prompts are token ids drawn uniformly from [3, vocab_size) (ids 0-2 are pad/bos/eos in the models
forge ships), so a workload runs on any model of that vocabulary without a tokenizer in the way. The
same file, seed and vocabulary give the same requests on every machine (Python's Random is stable
across versions for these calls)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from forge.config.yamlsafe import YamlRefused, load_yaml
from forge.errors import ConfigError, Problem, display_path

FIRST_ID = 3                     # lowest token id a prompt uses (0 pad, 1 bos, 2 eos)
MAX_RECORDS = 1_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class LengthRange(_Strict):
    min: int = Field(ge=1, description="shortest length in this part of the mix (tokens)")
    max: int = Field(ge=1, description="longest length (inclusive)")
    weight: float = Field(1.0, gt=0, description="relative share of requests drawn from this range")

    @model_validator(mode="after")
    def _ordered(self) -> "LengthRange":
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class SharedPrefix(_Strict):
    share: float = Field(ge=0, le=1, description="fraction of requests that start with a shared "
                                                 "prefix")
    prefixes: int = Field(ge=1, le=100_000, description="distinct prefixes")
    length: int = Field(ge=1, description="tokens per prefix")


class WorkloadSpec(_Strict):
    workload: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    seed: int = Field(0, ge=0)
    records: int = Field(ge=1, le=MAX_RECORDS)
    input: list[LengthRange] = Field(min_length=1)
    output: list[LengthRange] = Field(min_length=1)
    shared_prefix: Optional[SharedPrefix] = None

    def longest_prompt(self) -> int:
        own = max(r.max for r in self.input)
        return own + (
            self.shared_prefix.length if self.shared_prefix and self.shared_prefix.share > 0 else 0
        )

    def longest_output(self) -> int:
        return max(r.max for r in self.output)


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    prefix: Optional[int] = None         # which shared prefix it starts with, if any


def load_workload(path: Path) -> WorkloadSpec:
    """Read and validate a workload file; every problem as `file::$.path: message`."""
    shown = display_path(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([Problem(shown, "$", f"cannot read: {e.strerror or e}")]) from None
    try:
        data = load_yaml(text)
    except YamlRefused as e:
        raise ConfigError([Problem(shown, "$", str(e))]) from None
    except Exception as e:  # yaml's own syntax errors: one line with the position
        raise ConfigError([Problem(shown, "$", " ".join(str(e).split()))]) from None
    if not isinstance(data, dict):
        raise ConfigError([Problem(shown, "$", "a workload is a mapping (workload:, records:, "
                                               "input:, output:)")])
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            problems.append(Problem(shown, "$" + loc, msg))
        raise ConfigError(problems) from None


def _pick(rng: random.Random, mix: list[LengthRange]) -> int:
    r = rng.choices(mix, weights=[m.weight for m in mix])[0]
    return rng.randint(r.min, r.max)


def _ids(rng: random.Random, n: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_ID, vocab_size) for _ in range(n))


def generate(
    spec: WorkloadSpec, vocab_size: int, records: Optional[int] = None
) -> list[BenchRequest]:
    """The workload's requests, in arrival order (prefix groups interleaved at random)."""
    if vocab_size <= FIRST_ID:
        raise ValueError(f"vocab_size {vocab_size} leaves no ordinary token ids")
    rng = random.Random(spec.seed)
    sp = spec.shared_prefix
    prefixes = [_ids(rng, sp.length, vocab_size) for _ in range(sp.prefixes)] if sp else []
    out = []
    for i in range(records if records is not None else spec.records):
        which = rng.randrange(len(prefixes)) if prefixes and rng.random() < sp.share else None
        own = _ids(rng, _pick(rng, spec.input), vocab_size)
        prompt = (prefixes[which] + own) if which is not None else own
        out.append(
            BenchRequest(
                index=i, prompt=prompt, max_new_tokens=_pick(rng, spec.output), prefix=which
            )
        )
    return out


def summary(requests: list[BenchRequest]) -> dict:
    """What the generated work is, in numbers (for the report)."""
    n = len(requests)
    prompt = sum(len(r.prompt) for r in requests)
    out = sum(r.max_new_tokens for r in requests)
    shared = sum(1 for r in requests if r.prefix is not None)
    return {
        "requests": n,
        "prompt_tokens": prompt,
        "max_new_tokens": out,
        "mean_prompt": prompt / n if n else 0.0,
        "mean_max_new": out / n if n else 0.0,
        "with_shared_prefix": shared,
        "distinct_prefixes": len({r.prefix for r in requests} - {None}),
    }
