"""The sweep's winner and its file: which tier the confirm step backs, written as a contract `forge
validate` accepts (and, on request, the one-card node that runs it: replicas are a card field)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from forge.config.load import LoadedDescription, load_paths
from forge.errors import ForgeError
from forge_bench.candidates import Candidate, best_of
from forge_bench.tierfile import load_tier, write_contract, write_node


def pick_winner(candidates: list[Candidate], confirm: dict) -> tuple[Optional[Candidate], str]:
    """The tier to write and why: the best if the confirm found it faster (mean of the interleaved
    repeats), the shipped tier if it did not; the best, marked unconfirmed, when the confirm could
    not run."""
    base, best = candidates[0], best_of(candidates)
    if best is None:
        return None, "no candidate completed the workload"
    if best is base:
        return base, "the shipped tier was the fastest candidate"
    if confirm.get("status") == "ran":
        if confirm["ratio_mean"] > 1.0:
            return best, f"confirmed: {confirm['ratio_mean']:.3f} x the shipped tier (mean of {confirm['repeat']} repeats)"
        return base, (f"not confirmed: the best candidate ran {confirm['ratio_mean']:.3f} x the "
                      "shipped tier in the "
                      f"interleaved repeats; the shipped tier stays")
    return (
        best,
        f"NOT confirmed ({confirm.get('status')}: {confirm.get('reason', '')}); sweep figure only",
    )


def write_winner(
    loaded: LoadedDescription,
    cand: Optional[Candidate],
    why: str,
    path: Path,
    node_path: Optional[Path],
    new_name: Optional[str],
    comments: list[str],
) -> list[Path]:
    if cand is None:
        raise ForgeError(f"--write-best: nothing to write ({why})")
    got = load_tier(Path(cand.folder) / "node.yaml")[0]
    contract, card = got.plans[0].contract, got.plans[0].card
    if new_name:
        contract = contract.model_copy(update={"contract": new_name})
        card = card.model_copy(update={"engine": new_name})
    lines = comments + [f"winner: {cand.key} ({why})"]
    if card.replicas > 1:
        lines.append(f"replicas are a card field: this tier ran as {card.replicas} replicas on "
                     f"{card.model} "
                     f"(cards[].replicas: {card.replicas}); --write-best-node writes that node")
    written = [write_contract(contract, path, lines)]
    if node_path is not None:
        written.append(write_node(loaded, card, path, node_path, lines))
    check = load_paths(written)
    if not check.ok:
        raise ForgeError(
            "the written tier does not validate (a bug): "
            + "; ".join(p.render() for p in check.errors)
        )
    return written
