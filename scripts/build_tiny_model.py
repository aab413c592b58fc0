#!/usr/bin/env python
"""Build forge's embedded default model (forge/embedded/tiny-llama/) from the public-domain corpus.

Deterministic: fixed seeds, a fixed number of steps, single-process CPU training. Takes a few minutes
on two cores. Needs the `engine` extra (torch, transformers, tokenizers, safetensors), nothing from
the network. See docs/embedded-model.md.

    python scripts/build_tiny_model.py [--out forge/embedded/tiny-llama] [--steps 600]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "scripts" / "corpus" / "alice29.txt"

# The fixed geometry everyone relies on (helper brief, "The embedded default").
GEOMETRY = dict(
    vocab_size=2048, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
    head_dim=32, intermediate_size=512, tie_word_embeddings=True, max_position_embeddings=2048,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
SPECIALS = ["<pad>", "<s>", "</s>"]     # ids 0, 1, 2: they are added first, in this order
SEQ_LEN = 128
BATCH = 16


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each folded onto one line (the book's hard line breaks are layout)."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        para = " ".join(block.split())
        if para:
            out.append(para)
    return out


def train_tokenizer(paras: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=GEOMETRY["vocab_size"], special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(paras, trainer=trainer)
    # Like Llama's tokenizers: a prompt starts with <s> when special tokens are added (the default).
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                      special_tokens=[("<s>", 1)])
    for i, name in enumerate(SPECIALS):
        assert tok.token_to_id(name) == i, f"{name} must be id {i}"
    assert tok.get_vocab_size() == GEOMETRY["vocab_size"], tok.get_vocab_size()
    return tok


def save_tokenizer(tok, out: Path):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                 model_max_length=GEOMETRY["max_position_embeddings"])
    hf.save_pretrained(str(out))
    # transformers 5 names its fast-tokenizer class TokenizersBackend; the older name loads in 4.x and 5.x alike.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    # Older loaders look for the special tokens here rather than in tokenizer_config.json.
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, indent=2) + "\n")
    return hf


def token_stream(tok, paras: list[str]) -> list[int]:
    """Every paragraph as <s> text </s>, so the model learns where a paragraph ends (real EOS behaviour)."""
    ids: list[int] = []
    for para in paras:
        ids.extend(tok.encode(para).ids)        # the post-processor already put <s> in front
        ids.append(GEOMETRY["eos_token_id"])
    return ids


def train(ids: list[int], steps: int, seed: int, threads: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    config = LlamaConfig(**GEOMETRY, rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False,
                         mlp_bias=False, hidden_act="silu", initializer_range=0.02)
    model = LlamaForCausalLM(config)
    model.train()
    data = torch.tensor(ids, dtype=torch.long)
    rng = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(steps // 20, 1)

    def lr_at(step: int) -> float:        # linear warm-up, cosine decay to 10%
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    t0 = time.time()
    for step in range(steps):
        starts = torch.randint(0, len(data) - SEQ_LEN - 1, (BATCH,), generator=rng)
        batch = torch.stack([data[s:s + SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}/{steps}  loss {loss.item():.3f}  {time.time() - t0:6.1f}s", flush=True)
    return model


def save_model(model, out: Path):
    import torch
    from transformers import GenerationConfig

    model.eval()
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=False,
                                               max_new_tokens=128)
    model.save_pretrained(str(out), safe_serialization=True)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"     # transformers 5 writes "dtype"; older readers look for torch_dtype
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return model


def sample(out: Path, prompts: list[str]):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True, dtype=torch.float32)
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        gen = model.generate(ids, max_new_tokens=48, do_sample=False)
        print(f"--- {p!r}\n{tok.decode(gen[0][ids.shape[1]:], skip_special_tokens=False)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "forge" / "embedded" / "tiny-llama")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    random.seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    paras = paragraphs(CORPUS.read_text(encoding="utf-8"))
    tok = train_tokenizer(paras)
    save_tokenizer(tok, args.out)
    ids = token_stream(tok, paras)
    print(f"corpus: {len(paras)} paragraphs, {len(ids)} tokens; training {args.steps} steps of {BATCH}x{SEQ_LEN}")
    model = train(ids, args.steps, args.seed, args.threads)
    save_model(model, args.out)
    n_params = sum(p.numel() for p in model.parameters())
    size = (args.out / "model.safetensors").stat().st_size
    print(f"saved {args.out}: {n_params} parameters, model.safetensors {size} bytes")
    sample(args.out, ["Alice was beginning to", "`Off with her head!' the Queen", "The Mock Turtle said"])


if __name__ == "__main__":
    main()
