"""`forge contract new CHECKPOINT_DIR --card KIND --memory-gib N --out FILE`: a contract sized from
a model's config.json and a card's memory (forge/config/contract_new.py), checked by the same load
pipeline as `forge validate` before it is written."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from forge.errors import UsageError

MAX_MEMORY_GIB = 1 << 20  # a card of a PiB: far above any, far below what breaks the arithmetic
# what engines hold a count of tokens or sequences in (int32)
COUNT = click.IntRange(min=1, max=2**31 - 1)


def _power_of_two(ctx, param, value):
    if value is not None and value & (value - 1):
        raise click.BadParameter(f"{value} is not a power of two (transformers' KV blocks are, "
                                 "e.g. 16 or 32)")
    return value


def _capability(ctx, param, value):
    import re

    if value is not None and not re.fullmatch(r"[0-9]{1,2}\.[0-9]", value):
        raise click.BadParameter(f"{value!r} is not a compute capability MAJOR.MINOR such as 9.0 "
                                 "(nvidia-smi "
                                 "--query-gpu=compute_cap --format=csv)")
    return value


def register(cli: click.Group) -> None:
    @cli.group("contract")
    def contract_group() -> None:
        """Engine contracts: start one from a model."""

    @contract_group.command("new")
    @click.argument("checkpoint", type=click.Path(path_type=Path), metavar="CHECKPOINT_DIR")
    @click.option(
        "--card",
        type=click.Choice(["cpu", "gpu"]),
        required=True,
        help="the kind of card it runs on",
    )
    @click.option(
        "--memory-gib",
        type=click.FloatRange(min=0, min_open=True, max=MAX_MEMORY_GIB),
        required=True,
        help="the card's memory (a CPU card: the memory its engine may use)",
    )
    @click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
                  help="the contract file to write (refused if it exists)")
    @click.option("--budget", type=COUNT, default=None,
                  help="limits.max_num_tokens, tokens per engine step (default: 512 on a cpu card, "
                       "8192 on a gpu, "
                       "at least max_input_len and --slots)")
    @click.option("--slots", type=COUNT, default=None,
                  help="limits.max_batch_size (default: the full-length sequences the KV pool "
                       "holds, at most 256 "
                       "and the budget)")
    @click.option("--max-input-len", type=COUNT, default=None,
                  help="longest prompt in tokens (default 1024, at most --budget, within the "
                       "model's "
                       "max_position_embeddings)")
    @click.option("--max-output-len", type=COUNT, default=None,
                  help="longest output in tokens (default 256, within max_position_embeddings)")
    @click.option("--tokens-per-block", type=COUNT, default=None, callback=_power_of_two,
                  help="KV block size, a power of two (default 32)")
    @click.option("--weights", type=click.Choice(["fp32", "bf16", "fp16"]), default=None,
                  help="weights and KV dtype (default: fp32 on a cpu card, bf16 on a gpu)")
    @click.option("--kv-fraction", type=click.FloatRange(min=0, max=1, min_open=True), default=None,
                  help="share of the memory left after weights and working memory that the KV pool "
                       "takes (default 0.9)")
    @click.option("--compute-capability", default=None, metavar="X.Y", callback=_capability,
                  help="a gpu card's, e.g. 9.0")
    @click.option("--attn-implementation", default=None, metavar="NAME",
                  help="transformers.attn_implementation: sdpa (default), eager, flash_attention_2 "
                       "or "
                       "flash_attention_3 (GPU only; no attention mask, so a larger KV pool)")
    @click.option("--parameters", type=click.IntRange(min=1, max=10**15), default=None, metavar="N",
                  help="the model's parameter count, when neither the safetensors headers nor "
                       "config.json's "
                       "geometry give it (default: the headers', else the geometry's)")
    @click.option("--name", default=None, help="the contract's name (default: the checkpoint "
                                               "folder's, plus the card kind)")
    @click.option("--node-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="also write a one-card node description running it, with the host left for "
                       "you to fill in")
    def new_cmd(
        checkpoint: Path,
        card: str,
        memory_gib: float,
        out: Path,
        budget,
        slots,
        max_input_len,
        max_output_len,
        tokens_per_block,
        weights,
        kv_fraction,
        compute_capability,
        attn_implementation,
        parameters,
        name,
        node_out: Optional[Path],
    ) -> int:
        """Write a transformers contract for the model in CHECKPOINT_DIR on one card: the geometry
        from its config.json, the parameters from its safetensors headers (or, before the weights
        are downloaded, from the geometry), the KV pool sized from the card's memory, every field
        explicit with a comment on how it was reached. It is checked the way `forge validate` checks
        it before anything is written."""
        from forge.config.contract_new import Request, draft
        from forge.config.contract_write import check_targets, write_checked
        from forge.config.contract_yaml import render_contract, render_node
        from forge.config.units import fmt_bytes
        from forge.errors import display_path

        if card == "cpu" and compute_capability is not None:
            raise UsageError("--compute-capability is for a gpu card")
        check_targets(out, node_out)
        req = Request(
            checkpoint=checkpoint,
            card=card,
            memory_gib=memory_gib,
            out=out,
            budget=budget,
            slots=slots,
            max_input_len=max_input_len,
            max_output_len=max_output_len,
            tokens_per_block=tokens_per_block,
            weights=weights,
            kv_fraction=kv_fraction,
            compute_capability=compute_capability,
            name=name,
            parameters=parameters,
            attn_implementation=attn_implementation,
        )
        drafted = draft(req)

        def node_text(contract_file: Path, node_file: Path, checked: bool) -> str:
            stated = (
                dict(host_memory=memory_gib, host_cores=1, gpu_model="checked") if checked else {}
            )
            return render_node(drafted.contract, req, contract_file, node_file, **stated)

        written = write_checked(
            render_contract(drafted, req, checkpoint / "config.json"),
            node_text,
            out,
            node_out,
            weights_present=drafted.weights_present,
        )
        for line in written.warnings + drafted.console:
            click.echo(f"forge: {line}", err=True)
        plan, lim = drafted.plan, drafted.contract.limits
        click.echo(f"forge: wrote {', '.join(display_path(p) for p in written.files)}: "
                   f"{drafted.contract.contract}, "
                   f"{plan.num_blocks:,} KV blocks ({fmt_bytes(plan.kv_pool_bytes)}), "
                   f"{lim.max_batch_size} "
                   f"slot{'s' if lim.max_batch_size > 1 else ''} "
                   f"({drafted.notes['max_batch_size']}), budget {lim.max_num_tokens}, prompts up "
                   "to "
                   f"{lim.max_input_len} and outputs up to {lim.max_output_len} tokens", err=True)
        for line in written.pending:
            click.echo(f"forge: until the download: {line}", err=True)
        if node_out is not None:
            fill = "host.memory_gib, host.cpu_cores" + (
                ", cards[0].model (the GPU's NVML name)" if card == "gpu" else ""
            )
            click.echo(f"forge: {display_path(node_out)}: fill in {fill} (each FILL IN: the "
                       "machine that runs it); "
                       "`forge validate` and `forge provision` refuse it until then", err=True)
        return 0
