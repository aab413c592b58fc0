"""`forge bench sweep CONTRACT`: find the contract's best tier on a workload, confirm it, write it.

The candidates and the strategy are in bench/forge_bench/candidates.py. Every candidate is written
as a contract and a one-card node (bench/forge_bench/tierfile.py), loaded through the one validation
pipeline, and measured in its own child process (`forge bench run` on that node) under a time limit:
a slow candidate (a torch.compile warm-up) or a hung one is cut, not waited for, and the card's
memory goes with the process. Before each candidate the sweep checks the total deadline (keeping
back the time the confirm step needs), so it always ends with a report: what ran, what was skipped
and why, what was cut. The confirm step runs the shipped tier and the best interleaved in one child
process (`forge bench compare`), and the winner of the confirm is written as a ready contract."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from forge.config.load import LoadedDescription, load_paths
from forge.errors import ConfigError, UsageError
from forge_bench.candidates import (
    Candidate,
    apply,
    best_of,
    dimensions,
    folder_name,
    key_of,
    single_changes,
    winners,
)
from forge_bench.child import ChildProcess, last_line
from forge_bench.tierfile import load_tier, write_tier
from forge_bench.winner import pick_winner, write_winner

MIN_CANDIDATE_S = 5.0


def confirm_reserve(base: Candidate, best: Candidate, repeat: int, scale: float) -> float:
    """Seconds to keep for the confirm: it loads each of the two tiers once per repeat and runs its
    window, so each tier costs its sweep run's load (wall - window) plus the window scaled to the
    confirm's records; 10 % over, plus 5 s. (Charging the shipped tier's whole wall twice per repeat
    kept ~60 s too many on the H200.)"""
    total = 0.0
    for cand in (base, best):
        wall = cand.wall_s or 0.0
        window = min(wall, float((cand.result or {}).get("window_s") or 0.0))
        total += (wall - window) + window * max(1.0, scale)
    return repeat * total * 1.1 + 5


def typical_wall(candidates: Sequence[Candidate]) -> float:
    """The median wall of the candidates run so far: a new one is not started with less time left
    than this. (The shipped tier's own wall, used before, includes the machine's cold start: a
    quarter more on the H200.)"""
    walls = sorted(c.wall_s for c in candidates if c.status == "ran" and c.wall_s)
    return walls[len(walls) // 2] if walls else 0.0


class Stopped(Exception):
    """The sweep process was asked to stop (SIGTERM): end the running candidate, write the
    report."""


@dataclass
class SweepOptions:
    workload: Path
    mode: str = "forge"
    records: Optional[int] = None
    warmup: int = 8
    confirm_records: Optional[int] = None
    confirm_repeat: int = 2
    min_gain: float = 0.03
    combine: int = 4
    candidate_limit_s: float = 300.0
    deadline_s: Optional[float] = None
    overrides: dict = field(default_factory=dict)
    skip: tuple = ()
    tries: list = field(default_factory=list)
    peaks: dict = field(default_factory=dict)
    # A bench.json of `forge bench run` of this contract on the same workload, records and warm-up:
    # its result in `mode` is the shipped tier's, not measured again (`forge bench quick` has just
    # measured it in its forge mode).
    base_run: Optional[Path] = None


def contract_name(arg: str) -> str:
    """CONTRACT is a contract name, or a contract file (its `contract:` name is used)."""
    p = Path(arg)
    if not p.is_file():
        return arg
    got = load_paths([p])
    if got.errors:
        raise ConfigError(got.errors)
    if len(got.contracts) != 1:
        raise UsageError(f"{arg}: expected one engine contract, found {len(got.contracts)}")
    return next(iter(got.contracts))


def plan_of(loaded: LoadedDescription, name: str):
    plan = next((p for p in loaded.plans if p.contract.contract == name), None)
    if plan is None:
        runs = ", ".join(sorted({p.contract.contract for p in loaded.plans}))
        raise UsageError(f"node {loaded.node.node} has no card running contract {name!r} (its "
                         f"cards run: {runs})")
    return plan


class Sweep:
    def __init__(
        self,
        loaded: LoadedDescription,
        name: str,
        opts: SweepOptions,
        out: Path,
        progress: Callable[[str], None] = lambda line: None,
        on_change: Callable[[], None] = lambda: None,
    ):
        from forge.config.registry import from_plugins

        self.loaded, self.name, self.opts, self.out = loaded, name, opts, out
        self.plan = plan_of(loaded, name)
        self.sections = from_plugins().sections
        self.progress, self.on_change = progress, on_change
        self.t0 = time.monotonic()
        self.deadline = self.t0 + opts.deadline_s if opts.deadline_s else None
        self.dims = dimensions(self.plan, mode=opts.mode, overrides=opts.overrides, skip=opts.skip)
        self.candidates: list[Candidate] = [Candidate("base", {}, "base")]
        self.candidates += single_changes(self.plan, self.dims, opts.tries, self.sections)
        self.confirm: dict = {"status": "pending"}
        self.combine_note = ""
        self.child_env: Optional[dict] = None
        self._reserve = 0.0

    # ------------------------------------------------------------------ the three stages
    def run(self) -> None:
        try:
            base = self.candidates[0]
            if not (self.opts.base_run and self._reuse(base, self.opts.base_run)):
                self._measure(base)
            for cand in list(self.candidates):
                if cand.status == "pending":
                    self._measure(cand)
            self._combine()
            self._confirm()
        except Stopped:
            for c in self.candidates:
                if c.status in ("pending", "running"):
                    c.status, c.reason = (
                        "cut",
                        "the sweep was stopped (SIGTERM) before this finished",
                    )
            if self.confirm["status"] in ("pending", "running"):
                self.confirm = {"status": "cut", "reason": "the sweep was stopped (SIGTERM)"}
            self.on_change()
            raise

    def _combine(self) -> None:
        base = self.candidates[0]
        if base.tokens_per_s is None:
            self.combine_note = ("no combination: the shipped tier did not complete, so no change "
                                 "can be called a gain")
            return
        wins = winners(self.candidates, base.tokens_per_s, self.opts.min_gain)
        self.combine_note = ("single changes faster than the shipped tier by more than "
                             f"{self.opts.min_gain:.0%}: "
                             + (", ".join(w.key for w in wins) or "none"))
        if len(wins) < 2 or self.opts.combine <= 0:
            return
        current = wins[0]
        for w in wins[1:1 + self.opts.combine]:
            changes = {**current.changes, **w.changes}
            cand = next((c for c in self.candidates if c.changes == changes), None)
            if cand is None:
                cand = Candidate(key_of(changes), changes, "combine")
                self.candidates.append(cand)
                self._measure(cand)
            if cand.tokens_per_s is not None and cand.tokens_per_s > current.tokens_per_s:
                current = cand

    def _confirm(self) -> None:
        base, best = self.candidates[0], best_of(self.candidates)
        if not self.opts.confirm_repeat:
            self.confirm = {"status": "skipped", "reason": "no confirm asked for (--confirm-repeat "
                                                           "0; `forge bench "
                            "quick` runs none)"}
        elif base.tokens_per_s is None:
            self.confirm = {"status": "skipped", "reason": "the shipped tier did not complete the "
                                                           "workload"}
        elif best is base:
            self.confirm = {"status": "skipped", "reason": "the shipped tier was the fastest: "
                                                           "nothing to confirm"}
        else:
            self._run_confirm(base, best)
        self.on_change()

    def _run_confirm(self, base: Candidate, best: Candidate) -> None:
        left = self._left()
        limit = (
            left if left is not None else 2 * self.opts.confirm_repeat * self.opts.candidate_limit_s
        )
        if limit < MIN_CANDIDATE_S:
            self.confirm = {"status": "cut", "reason": "no time left before the deadline "
                                                       f"({max(limit, 0):.0f} s)",
                            "best": best.key}
            return
        out = self.out / "confirm"
        argv = [sys.executable, "-m", "forge", "bench", "compare", str(self.opts.workload),
                "--node", str(Path(base.folder) / "node.yaml"), "--label", "shipped",
                "--node", str(Path(best.folder) / "node.yaml"), "--label", "best",
                "--modes", self.opts.mode, "--repeat", str(self.opts.confirm_repeat),
                "--warmup", str(self.opts.warmup), "--out", str(out)]
        records = self.opts.confirm_records or self.opts.records
        if records:
            argv += ["--records", str(records)]
        argv += self._peak_args()
        self.confirm = {"status": "running", "best": best.key, "records": records,
                        "repeat": self.opts.confirm_repeat, "limit_s": round(limit, 1)}
        self.progress(f"confirm: shipped vs {best.key}, {self.opts.confirm_repeat} interleaved "
                      "repeat(s), limit "
                      f"{limit:.0f} s")
        self.on_change()
        rc, wall, cut = self._child(argv, limit, out / "log.txt")
        self.confirm["wall_s"] = round(wall, 1)
        try:
            summary = json.loads((out / "compare.json").read_text(encoding="utf-8"))["summary"]
        except (OSError, ValueError, KeyError):
            summary = None
        ratio = (
            (summary or {}).get("tiers", {}).get("best", {}).get(f"{self.opts.mode}_over_shipped")
        )
        if ratio is None:
            self.confirm.update(status="cut" if cut else "failed",
                                reason=(f"cut after {wall:.0f} s (limit {limit:.0f} s)" if cut else
                                        f"exit code {rc}: {last_line(out / 'log.txt')}"))
            return
        self.confirm.update(
            status="ran",
            summary=summary,
            ratio_mean=ratio["mean"],
            ratio_best=ratio["best"],
            note="cut before every repeat finished" if cut else "",
        )

    # ------------------------------------------------------------------ one candidate
    def _prepare(self, index: int, cand: Candidate) -> Optional[Path]:
        contract, card, why = apply(self.plan, cand.changes, self.sections)
        if why is None:
            folder = self.out / "candidates" / folder_name(index, cand)
            cand.folder = str(folder)
            write_tier(self.loaded, contract, card, folder, ["forge bench sweep candidate: "
                                                             f"{cand.key}"])
            loaded, why = load_tier(folder / "node.yaml")
        if why is not None:
            cand.status, cand.reason = "skipped", f"breaks a contract rule: {why}"
            self.progress(f"{cand.key}: skipped ({cand.reason})")
            return None
        return folder / "node.yaml"

    def _measure(self, cand: Candidate) -> None:
        index = next(i for i, c in enumerate(self.candidates) if c is cand)
        node = self._prepare(index, cand)
        self.on_change()
        if node is None:
            return
        limit = self._limit(cand)
        if limit is None:
            kept = (
                f", {self._reserve:.0f} s of it kept for the confirm"
                if best_of(self.candidates) not in (None, self.candidates[0])
                else ""
            )
            cand.status, cand.reason = (
                "cut",
                f"not started: the deadline is near ({self._left():.0f} s left{kept})",
            )
            self.progress(f"{cand.key}: {cand.reason}")
            self.on_change()
            return
        run_dir = Path(cand.folder) / "run"
        argv = [
            sys.executable,
            "-m",
            "forge",
            "bench",
            "run",
            str(self.opts.workload),
            "--node",
            str(node),
            "--modes",
            self.opts.mode,
            "--direct",
            "depth",
            "--warmup",
            str(self.opts.warmup),
            "--out",
            str(run_dir),
        ]
        if self.opts.records:
            argv += ["--records", str(self.opts.records)]
        cand.status = "running"
        self.progress(f"{cand.key}: running (limit {limit:.0f} s)")
        self.on_change()
        rc, wall, cut = self._child(argv, limit, Path(cand.folder) / "log.txt")
        cand.wall_s = round(wall, 2)
        result, env = self._read_result(run_dir)
        if env is not None and self.child_env is None:
            self.child_env = env
        if cut:
            tail = last_line(Path(cand.folder) / "log.txt")
            cand.status, cand.reason = "cut", (f"exceeded its {limit:.0f} s limit (load, warm-up "
                                               "and window)"
                                               + (f"; last output: {tail}" if tail else ""))
        elif result is None:
            cand.status, cand.reason = (
                "failed",
                f"exit code {rc}: {last_line(Path(cand.folder) / 'log.txt')}",
            )
        elif result["completed"] != result["requests"]:
            cand.status, cand.result = "failed", result
            cand.reason = (f"completed {result['completed']} of {result['requests']}: "
                           f"{'; '.join(result['notes'])}")
        else:
            cand.status, cand.result = "ran", result
        tps = f"{cand.tokens_per_s:,.0f} tok/s" if cand.tokens_per_s is not None else cand.reason
        self.progress(f"{cand.key}: {cand.status}, {tps} ({wall:.1f} s)")
        self.on_change()

    def _reuse(self, base: Candidate, bench_json: Path) -> bool:
        """The shipped tier's result from an earlier run of the same work, if it has a complete one
        in this mode."""
        try:
            data = json.loads(bench_json.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        result = next(
            (r for r in data.get("results") or [] if r.get("mode") == self.opts.mode), None
        )
        if (
            not result
            or result.get("completed") != result.get("requests")
            or self._prepare(0, base) is None
        ):
            return False
        base.status, base.result = "ran", result
        base.reason = (f"measured by the {self.opts.mode} mode of {bench_json} (the same workload, "
                       "records, warm-up)")
        if self.child_env is None:
            self.child_env = data.get("env")
        self.progress(f"base: {base.tokens_per_s:,.0f} tok/s, {base.reason}")
        self.on_change()
        return True

    @staticmethod
    def _read_result(run_dir: Path) -> tuple[Optional[dict], Optional[dict]]:
        try:
            data = json.loads((run_dir / "bench.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None, None
        results = data.get("results") or []
        return (results[0] if results else None), data.get("env")

    # ------------------------------------------------------------------ time and child processes
    def _left(self) -> Optional[float]:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def _limit(self, cand: Candidate) -> Optional[float]:
        """This candidate's time limit, or None when it should not start: less time is left than the
        shipped tier took (it would most likely be cut). The confirm's time is kept back once some
        candidate beats the shipped tier (before that there is nothing to confirm)."""
        left = self._left()
        if left is None:
            return self.opts.candidate_limit_s
        base = self.candidates[0]
        best = best_of(self.candidates)
        self._reserve = 0.0
        if best is not None and best is not base and self.opts.confirm_repeat:
            scale = (self.opts.confirm_records or self.opts.records or 1) / (self.opts.records or 1)
            self._reserve = confirm_reserve(base, best, self.opts.confirm_repeat, scale)
            left -= self._reserve
        if left < max(MIN_CANDIDATE_S, typical_wall(self.candidates)):
            return None
        return min(self.opts.candidate_limit_s, left)

    @staticmethod
    def _child(argv: list[str], limit: float, log: Path) -> tuple[Optional[int], float, bool]:
        return ChildProcess(argv, log).wait(limit)

    def _peak_args(self) -> list[str]:
        out = []
        for key, flag in (("peak_tflops", "--peak-tflops"), ("hbm_tbps", "--hbm-tbps")):
            if self.opts.peaks.get(key) is not None:
                out += [flag, str(self.opts.peaks[key])]
        return out

    # ------------------------------------------------------------------ the winner
    def winner(self) -> tuple[Optional[Candidate], str]:
        return pick_winner(self.candidates, self.confirm)

    def write_best(
        self, path: Path, node_path: Optional[Path], new_name: Optional[str], comments: list[str]
    ) -> list[Path]:
        cand, why = self.winner()
        return write_winner(self.loaded, cand, why, path, node_path, new_name, comments)
