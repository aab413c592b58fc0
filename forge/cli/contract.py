"""`forge contract new CHECKPOINT_DIR --card KIND --memory-gib N --out FILE`: a contract sized from a model's
config.json and a card's memory (forge/config/contract_new.py), checked by the same load pipeline as
`forge validate` before it is written."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from forge.errors import ForgeError, UsageError


def register(cli: click.Group) -> None:
    @cli.group("contract")
    def contract_group() -> None:
        """Engine contracts: start one from a model."""

    @contract_group.command("new")
    @click.argument("checkpoint", type=click.Path(path_type=Path), metavar="CHECKPOINT_DIR")
    @click.option("--card", type=click.Choice(["cpu", "gpu"]), required=True, help="the kind of card it runs on")
    @click.option("--memory-gib", type=click.FloatRange(min=0, min_open=True), required=True,
                  help="the card's memory (a CPU card: the memory its engine may use)")
    @click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
                  help="the contract file to write (refused if it exists)")
    @click.option("--budget", type=click.IntRange(min=1), default=None,
                  help="limits.max_num_tokens, tokens per engine step (default: 512 on a cpu card, 8192 on a gpu, "
                       "at least max_input_len)")
    @click.option("--slots", type=click.IntRange(min=1), default=None,
                  help="limits.max_batch_size (default: the full-length sequences the KV pool holds, at most 256)")
    @click.option("--max-input-len", type=click.IntRange(min=1), default=None,
                  help="longest prompt in tokens (default 1024, within the model's max_position_embeddings)")
    @click.option("--max-output-len", type=click.IntRange(min=1), default=None,
                  help="longest output in tokens (default 256)")
    @click.option("--tokens-per-block", type=click.IntRange(min=1), default=None, help="KV block size (default 32)")
    @click.option("--weights", type=click.Choice(["fp32", "bf16", "fp16"]), default=None,
                  help="weights and KV dtype (default: fp32 on a cpu card, bf16 on a gpu)")
    @click.option("--kv-fraction", type=click.FloatRange(min=0, max=1, min_open=True), default=None,
                  help="share of the memory left after weights and working memory that the KV pool takes (default 0.9)")
    @click.option("--compute-capability", default=None, metavar="X.Y", help="a gpu card's, e.g. 9.0")
    @click.option("--name", default=None, help="the contract's name (default: the checkpoint folder's, plus the card kind)")
    @click.option("--node-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="also write a one-card node description running it (for `forge provision --dry-run`)")
    def new_cmd(checkpoint: Path, card: str, memory_gib: float, out: Path, budget, slots, max_input_len,
                max_output_len, tokens_per_block, weights, kv_fraction, compute_capability, name,
                node_out: Optional[Path]) -> int:
        """Write a transformers contract for the model in CHECKPOINT_DIR on one card: the geometry from its
        config.json, the weights from its safetensors headers, the KV pool sized from the card's memory, every field
        explicit with a comment on how it was reached."""
        from forge.config.contract_new import Request, draft, node_yaml
        from forge.config.load import load_paths
        from forge.errors import display_path

        if card == "cpu" and compute_capability is not None:
            raise UsageError("--compute-capability is for a gpu card")
        for path, flag in ((out, "--out"), (node_out, "--node-out")):
            if path is not None and (path.exists() or path.is_symlink()):
                raise ForgeError(f"{display_path(path)}: exists; {flag} never writes over a file: choose another path")
        req = Request(checkpoint=checkpoint, card=card, memory_gib=memory_gib, out=out, budget=budget, slots=slots,
                      max_input_len=max_input_len, max_output_len=max_output_len, tokens_per_block=tokens_per_block,
                      weights=weights, kv_fraction=kv_fraction, compute_capability=compute_capability, name=name)
        drafted = draft(req)
        written = [out]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(drafted.yaml)
        if node_out is not None:
            node_out.parent.mkdir(parents=True, exist_ok=True)
            node_out.write_text(node_yaml(drafted.contract, req, out, node_out))
            written.append(node_out)
        loaded = load_paths(written)            # what `forge validate` says about it
        for p in loaded.problems:
            click.echo(p.render(), err=True)
        plan = drafted.plan
        from forge.config.units import fmt_bytes

        lim = drafted.contract.limits
        click.echo(f"forge: wrote {', '.join(display_path(p) for p in written)}: {drafted.contract.contract}, "
                   f"{plan.num_blocks:,} KV blocks ({fmt_bytes(plan.kv_pool_bytes)}), {lim.max_batch_size} slots, "
                   f"budget {lim.max_num_tokens}, prompts up to {lim.max_input_len} and outputs up to "
                   f"{lim.max_output_len} tokens" + ("" if loaded.ok else "; INVALID as written (above)"), err=True)
        return 0 if loaded.ok else 1
