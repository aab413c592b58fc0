"""Cross-checks of a contract against a TensorRT-LLM engine directory (config.json + rank*.engine).

Reads only files: TensorRT-LLM, torch and a GPU are not needed. Key names follow the layout that
`trtllm-build` (0.11 and later) writes: top keys version / pretrained_config / build_config, with
build_config.plugin_config inside."""
from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from forge.config.files import FileRefused, read_json
from forge.config.models import Contract
from forge.errors import Problem

TOP_KEYS = ("version", "pretrained_config", "build_config")
WEIGHT_QUANT = {"fp8": {"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_BLOCK_SCALES"},
                "int4": {"W4A16", "W4A16_AWQ", "W4A16_GPTQ", "W4A8_AWQ"}}
KV_QUANT = {"fp8": "FP8", "int8": "INT8"}
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_RANK_FILE = re.compile(r"^rank([0-9]+)\.engine$")
_MISSING = object()


def _get(cfg: dict, dotted: str):
    cur = cfg
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


class _Checker:
    def __init__(self, contract: Contract, file: str, cfg: dict, engine_dir: Path):
        self.c, self.file, self.cfg, self.dir = contract, file, cfg, engine_dir
        self.problems: list[Problem] = []

    def error(self, path: str, message: str) -> None:
        self.problems.append(Problem(self.file, path, message))

    def need(self, dotted: str, path: str = "$.artifact.engine_dir"):
        value = _get(self.cfg, dotted)
        if value is _MISSING:
            self.error(path, f"engine config.json has no {dotted}: its value cannot be checked")
        return value

    def need_int(self, dotted: str, path: str):
        value = self.need(dotted, path)
        if value is _MISSING:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            self.error(path, f"engine config.json {dotted} must be an integer, got {value!r}")
            return None
        return value

    def sizing(self) -> None:
        lim, kv = self.c.limits, self.c.kv_cache
        for key in ("max_batch_size", "max_num_tokens", "max_input_len"):
            built = self.need_int(f"build_config.{key}", f"$.limits.{key}")
            if built is not None and getattr(lim, key) > built:
                self.error(f"$.limits.{key}", f"the engine was built with {key} {built} "
                           f"(build_config.{key}); the contract asks for {getattr(lim, key)}")
        seq = self.need_int("build_config.max_seq_len", "$.limits.max_output_len")
        want = lim.max_input_len + lim.max_output_len
        if seq is not None and seq < want:
            self.error("$.limits.max_output_len", f"the engine's max_seq_len is {seq}, below "
                                                  "max_input_len + "
                       f"max_output_len = {want}: TensorRT-LLM would cut outputs short silently")
        tpb = self.need_int(
            "build_config.plugin_config.tokens_per_block", "$.kv_cache.tokens_per_block"
        )
        if tpb is not None and tpb != kv.tokens_per_block:
            self.error("$.kv_cache.tokens_per_block", "the engine was built with tokens_per_block "
                                                      f"{tpb} "
                       f"(fixed at build time); the contract says {kv.tokens_per_block}")

    def features(self) -> None:
        kv_type = _get(self.cfg, "build_config.kv_cache_type")
        if kv_type is not _MISSING and kv_type not in (None, "PAGED"):
            self.error("$.artifact.engine_dir", f"build_config.kv_cache_type is {kv_type!r}; forge "
                                                "sizes a "
                       "paged KV cache and needs 'PAGED'")
        if self.need("build_config.plugin_config.paged_kv_cache") is False:
            self.error("$.artifact.engine_dir", "plugin_config.paged_kv_cache is false; forge "
                                                "needs a paged KV cache")
        paged_ctx = _get(self.cfg, "build_config.plugin_config.use_paged_context_fmha")
        if self.c.kv_cache.block_reuse and paged_ctx is not True:
            self.error("$.kv_cache.block_reuse", "block reuse needs an engine built with "
                                                 "use_paged_context_fmha "
                       "enabled (plugin_config.use_paged_context_fmha is "
                       f"{paged_ctx if paged_ctx is not _MISSING else 'absent'})")
        if (
            _get(self.cfg, "build_config.plugin_config.use_fp8_context_fmha") is True
            and self.c.precision.kv_cache != "fp8"
        ):
            self.error("$.precision.kv_cache", "the engine uses FP8 context FMHA "
                                               "(use_fp8_context_fmha), which "
                       f"needs an FP8 KV cache; the contract says {self.c.precision.kv_cache}")

    def quantization(self) -> None:
        prec = self.c.precision
        algo = self.need("pretrained_config.quantization.quant_algo", "$.precision.weights")
        kv_algo = _get(self.cfg, "pretrained_config.quantization.kv_cache_quant_algo")
        kv_algo = None if kv_algo is _MISSING else kv_algo
        dtype = _get(self.cfg, "pretrained_config.dtype")
        if algo is not _MISSING:
            if prec.weights in WEIGHT_QUANT:
                if algo not in WEIGHT_QUANT[prec.weights]:
                    self.error("$.precision.weights", f"the engine's quant_algo is {algo!r}; "
                                                      f"{prec.weights} weights "
                               f"need one of {sorted(WEIGHT_QUANT[prec.weights])}")
            elif algo is not None:
                self.error("$.precision.weights", f"the engine is quantized ({algo!r}); the "
                                                  f"contract says {prec.weights}")
            elif dtype != DTYPE_NAMES[prec.weights]:
                self.error("$.precision.weights", f"the engine's dtype is {dtype!r}; "
                                                  f"{prec.weights} weights need "
                           f"{DTYPE_NAMES[prec.weights]!r}")
        if prec.kv_cache in KV_QUANT:
            if kv_algo != KV_QUANT[prec.kv_cache]:
                self.error("$.precision.kv_cache", "the engine's kv_cache_quant_algo is "
                                                   f"{kv_algo!r}; a "
                           f"{prec.kv_cache} KV cache needs {KV_QUANT[prec.kv_cache]!r}")
        elif kv_algo is not None:
            self.error("$.precision.kv_cache", f"the engine quantizes its KV cache ({kv_algo!r}); "
                                               "the contract "
                       f"says {prec.kv_cache}")
        elif dtype != DTYPE_NAMES[prec.kv_cache]:
            self.error("$.precision.kv_cache", "an unquantized KV cache has the engine's dtype "
                                               f"{dtype!r}; the "
                       f"contract says {prec.kv_cache}")

    def geometry(self) -> None:
        m = self.c.model
        pc = self.cfg.get("pretrained_config", {})
        arch = self.need("pretrained_config.architecture", "$.model.architecture")
        if arch is not _MISSING and arch != m.architecture:
            self.error("$.model.architecture", f"the engine is a {arch}; the contract says "
                                               f"{m.architecture}")
        heads = pc.get("num_attention_heads")
        kv_heads = pc.get("num_key_value_heads", heads)
        head = pc.get("head_size")
        if (
            head is None
            and isinstance(pc.get("hidden_size"), int)
            and isinstance(heads, int)
            and heads
        ):
            head = pc["hidden_size"] // heads
        for field, have, key in (("num_layers", pc.get("num_hidden_layers"), "num_hidden_layers"),
                                 ("num_kv_heads", kv_heads, "num_key_value_heads"),
                                 ("head_dim", head, "head_size"),
                                 ("vocab_size", pc.get("vocab_size"), "vocab_size")):
            if have is None:
                self.error(f"$.model.{field}", f"engine config.json has no pretrained_config.{key}")
            elif have != getattr(m, field):
                self.error(f"$.model.{field}", f"the engine has {key} {have}; the contract says "
                                               f"{getattr(m, field)}")

    def ranks(self) -> None:
        mp = self.need("pretrained_config.mapping")
        if not isinstance(mp, dict):
            return
        sizes = [mp.get(k, 1) for k in ("tp_size", "pp_size", "cp_size")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1024 for v in sizes):
            self.error("$.artifact.engine_dir", "mapping tp_size/pp_size/cp_size must be positive "
                                                f"integers, got {sizes}")
            return
        tp, pp, cp = sizes
        world = mp.get("world_size", tp * pp * cp)
        if world != tp * pp * cp:
            self.error("$.artifact.engine_dir", f"mapping.world_size {world} is not tp_size x "
                                                "pp_size x cp_size "
                       f"= {tp * pp * cp}")
        if world != 1:
            self.error("$.artifact.engine_dir", f"the engine spans {world} GPUs (tp {tp}, pp "
                                                f"{pp}); forge runs one "
                       "engine per card, so it must be built with world_size 1")
        found = sorted(
            int(m.group(1)) for p in self.dir.iterdir() if (m := _RANK_FILE.match(p.name))
        )
        expected = list(range(world)) if isinstance(world, int) and 0 < world <= 1024 else []
        if found != expected:
            missing = sorted(set(expected) - set(found))
            extra = sorted(set(found) - set(expected))
            detail = "; ".join(filter(None, [
                f"missing {', '.join(f'rank{r}.engine' for r in missing)}" if missing else "",
                f"unexpected {', '.join(f'rank{r}.engine' for r in extra)}" if extra else ""]))
            self.error("$.artifact.engine_dir", "rank files do not match mapping.world_size "
                                                f"{world}: {detail}")

    def version(self) -> None:
        built = self.cfg.get("version")
        if not isinstance(built, str):
            self.error("$.artifact.engine_dir", "engine config.json version must be a string, got "
                                                f"{built!r}")
            return
        try:
            installed = importlib.metadata.version("tensorrt_llm")
        except importlib.metadata.PackageNotFoundError:
            return  # validation does not need TensorRT-LLM; the backend checks again at load time
        if installed != built:
            self.error("$.artifact.engine_dir", f"the engine was built with TensorRT-LLM {built}; "
                                                f"{installed} is "
                       "installed, and TensorRT refuses engines from another version")


def check_engine_dir(contract: Contract, file: str) -> list[Problem]:
    """Every disagreement between a contract and its engine directory."""
    where = "$.artifact.engine_dir"
    engine_dir = contract.resolve(contract.artifact.engine_dir)
    if engine_dir is None or not engine_dir.is_dir():
        return [Problem(file, where, f"engine directory {engine_dir} does not exist")]
    try:
        cfg = read_json(engine_dir / "config.json")
    except FileRefused as e:
        return [Problem(file, where, f"{engine_dir / 'config.json'}: {e}")]
    if "builder_config" in cfg:
        return [Problem(file, where, "legacy engine layout (top key builder_config, before "
                                     "TensorRT-LLM 0.8): "
                        "rebuild it with trtllm-build")]
    if set(cfg) != set(TOP_KEYS):
        missing = [k for k in TOP_KEYS if k not in cfg]
        extra = sorted(set(cfg) - set(TOP_KEYS))
        return [Problem(file, where, "engine config.json must have exactly the top keys "
                                     f"{', '.join(TOP_KEYS)}"
                        + (f"; missing {', '.join(missing)}" if missing else "")
                        + (f"; unexpected {', '.join(extra)}" if extra else ""))]
    if not isinstance(cfg["pretrained_config"], dict) or not isinstance(cfg["build_config"], dict):
        return [Problem(file, where, "engine config.json: pretrained_config and build_config must "
                                     "be objects")]
    chk = _Checker(contract, file, cfg, engine_dir)
    for step in (chk.version, chk.sizing, chk.features, chk.quantization, chk.geometry, chk.ranks):
        step()
    return chk.problems
