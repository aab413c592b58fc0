"""`forge contract new` as a user sizes a card (issue 50 item 4): from config.json alone before the
download, the safetensors headers compared with the geometry, every refusal with its cause and the
flag that lifts it, defaults that follow the flags given (never a contract its own validator
refuses), and a node left for the user to state its host and GPU name, refused by `forge validate`
for exactly those placeholders. Real CLI in this process (tests/forge_cli.invoke), files in the
test's tmp dir."""
import json
import math
import os
import re

import pytest

from forge.config.yamlsafe import load_yaml
from tests.cli._checkpoints import (
    LLAMA_8B,
    LLAMA_8B_PARAMETERS,
    TINY,
    TINY_PARAMETERS,
    config_only,
    tiny_config,
    tiny_copy,
)
from tests.forge_cli import fill_in, invoke
from tests.reliability._rel import assert_no_traceback

GPU = ("--card", "gpu", "--memory-gib", "80", "--compute-capability", "9.0")


def _ok(r):
    assert r.returncode == 0, r.stderr
    assert_no_traceback(r.stderr)
    return r.stderr


def _one_line_refusal(r):
    assert r.returncode == 1, r.stderr
    assert_no_traceback(r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


def _errors(v):
    return [line for line in (v.stdout + v.stderr).splitlines() if "::$" in line]


def test_config_json_alone_sizes_an_8b_model_on_an_h100(tmp_path):
    model = config_only(tmp_path, LLAMA_8B)
    err = _ok(invoke("contract", "new", model, *GPU, "--out", tmp_path / "c.yaml"))
    text = (tmp_path / "c.yaml").read_text()
    assert (
        f"{LLAMA_8B_PARAMETERS:,} parameters (config.json's geometry: 32 layers x 218,112,000"
        in text
    )
    assert "weights_gib: 14.958 " in text                   # 8,030,261,248 x 2 bytes, rounded up
    assert "Sized from config.json alone" in text
    assert f"no *.safetensors in {model}: {LLAMA_8B_PARAMETERS:,} parameters counted from config.json's" in err
    # what validation says of it: only that the download is still to come
    v = invoke("validate", tmp_path / "c.yaml")
    errors = _errors(v)
    assert v.returncode == 1 and len(errors) == 2, errors
    assert "no weight files" in errors[0] and "no tokenizer files" in errors[1]


def test_headers_present_are_used_and_compared_with_the_geometry(tmp_path):
    _ok(
        invoke(
            "contract",
            "new",
            TINY,
            "--card",
            "cpu",
            "--memory-gib",
            "1",
            "--out",
            tmp_path / "same.yaml",
        )
    )
    assert (f"{TINY_PARAMETERS:,} parameters (model.safetensors header; config.json's geometry "
            "gives "
            f"{TINY_PARAMETERS:,}, the same)") in (tmp_path / "same.yaml").read_text()


def test_counts_that_differ_are_said_and_the_headers_win(tmp_path):
    ckpt = tiny_copy(tmp_path)
    (ckpt / "config.json").write_text(json.dumps(tiny_config(intermediate_size=1024)))
    err = _ok(
        invoke(
            "contract",
            "new",
            ckpt,
            "--card",
            "cpu",
            "--memory-gib",
            "1",
            "--out",
            tmp_path / "c.yaml",
        )
    )
    geometry = TINY_PARAMETERS + 4 * 3 * 256 * 512
    assert f"the model.safetensors header holds {TINY_PARAMETERS:,} parameters" in err
    assert (
        f"geometry gives {geometry:,} (+" in err
        and "--parameters N states the count instead" in err
    )
    assert f"{TINY_PARAMETERS:,} parameters (model.safetensors header; config.json's geometry gives {geometry:,}, +" \
        in (tmp_path / "c.yaml").read_text()


def test_a_mixture_of_experts_config_alone_is_refused_and_parameters_lifts_it(tmp_path):
    model = config_only(tmp_path, {**LLAMA_8B, "num_local_experts": 8})
    err = _one_line_refusal(invoke("contract", "new", model, *GPU, "--out", tmp_path / "c.yaml"))
    assert "a mixture-of-experts config (num_local_experts)" in err and "--parameters N" in err
    h200 = ("--card", "gpu", "--memory-gib", "141", "--compute-capability", "9.0")
    _ok(
        invoke(
            "contract",
            "new",
            model,
            *h200,
            "--parameters",
            "46702792704",
            "--out",
            tmp_path / "c.yaml",
        )
    )
    doc = load_yaml((tmp_path / "c.yaml").read_text())
    assert doc["model"]["weights_gib"] == math.ceil(46702792704 * 2 / 2**30 * 1000) / 1000


def test_a_long_prompt_refusal_names_the_attention_mask_and_flash_attention_lifts_it(tmp_path):
    """The issue's case: an 8B model, 128K-token prompts, an 80 GiB card. The sdpa mask
    (max_num_tokens x (pool + max_num_tokens) x 2 bytes, 53.18 GiB at the largest pool that fits) is
    why; flash attention builds none."""
    model = config_only(tmp_path, LLAMA_8B)
    # + the default 256 output = max_position_embeddings 131,072
    long = ("--max-input-len", "130816")
    err = _one_line_refusal(
        invoke("contract", "new", model, *GPU, *long, "--out", tmp_path / "c.yaml")
    )
    assert "the sdpa attention mask 53.18 GiB) holds 87,424 KV tokens" in err
    assert "needs 131,072 KV tokens" in err and "The attention mask is why" in err
    assert (
        "--attn-implementation flash_attention_2 (the contract's "
        "transformers.attn_implementation; needs the "
        "flash-attn package) gives a pool of 479,520 KV tokens, 3 full-length sequence(s)"
    ) in err
    assert not (tmp_path / "c.yaml").exists()
    err = _ok(
        invoke(
            "contract",
            "new",
            model,
            *GPU,
            *long,
            "--attn-implementation",
            "flash_attention_2",
            "--out",
            tmp_path / "c.yaml",
        )
    )
    doc = load_yaml((tmp_path / "c.yaml").read_text())
    assert doc["kv_cache"]["max_tokens"] == 479520 and doc["limits"]["max_batch_size"] == 3
    assert doc["transformers"]["attn_implementation"] == "flash_attention_2"
    assert "note: 3 slots only" in err  # a small contract is never written without a word


def test_the_issue_flags_give_a_contract_its_validator_accepts(tmp_path):
    """--budget 512 below the default prompt length: the default prompt follows the budget."""
    out, node = tmp_path / "c.yaml", tmp_path / "node.yaml"
    _ok(
        invoke(
            "contract",
            "new",
            TINY,
            "--card",
            "cpu",
            "--memory-gib",
            "2",
            "--budget",
            "512",
            "--slots",
            "32",
            "--out",
            out,
            "--node-out",
            node,
        )
    )
    doc = load_yaml(out.read_text())
    assert doc["limits"] == {
        "max_batch_size": 32,
        "max_num_tokens": 512,
        "max_input_len": 512,
        "max_output_len": 256,
    }
    assert "default 1024, cut to --budget 512" in out.read_text()
    fill_in(node, memory_gib=8, cpu_cores=2)
    v = invoke("validate", out, node)
    assert v.returncode == 0 and "valid (0 error(s), 0 warning(s))" in v.stderr, v.stdout + v.stderr


@pytest.mark.parametrize(
    "flags, limits",
    [
        (
            ("--slots", "600"),
            {"max_batch_size": 600, "max_num_tokens": 1024, "max_input_len": 1024},
        ),
        (("--budget", "100"), {"max_num_tokens": 100, "max_input_len": 100}),
        (
            ("--max-input-len", "2000"),
            {"max_input_len": 2000, "max_output_len": 48, "max_num_tokens": 2000},
        ),
        (("--max-output-len", "2000"), {"max_input_len": 48, "max_output_len": 2000}),
    ],
)
def test_defaults_follow_the_flags_and_the_contract_validates(tmp_path, flags, limits):
    out = tmp_path / "c.yaml"
    _ok(invoke("contract", "new", TINY, "--card", "cpu", "--memory-gib", "4", *flags, "--out", out))
    got = load_yaml(out.read_text())["limits"]
    assert {k: got[k] for k in limits} == limits
    v = invoke("validate", out)
    assert v.returncode == 0, v.stdout + v.stderr


@pytest.mark.parametrize("flags, expected", [
    (("--max-input-len", "1024", "--budget", "512"), "--max-input-len 1024 is above --budget 512: "
                                                     "a prompt is "
     "prefilled in one engine step"),
    (("--max-input-len", "2000", "--max-output-len", "100"), "--max-input-len 2000 + "
                                                             "--max-output-len 100 exceed "),
    (("--max-input-len", "2048",), "--max-input-len 2048 leaves no room for output within "),
])
def test_contradicting_flags_are_refused_with_the_flag_to_change(tmp_path, flags, expected):
    err = _one_line_refusal(
        invoke(
            "contract",
            "new",
            TINY,
            "--card",
            "cpu",
            "--memory-gib",
            "4",
            *flags,
            "--out",
            tmp_path / "c.yaml",
        )
    )
    assert expected in err
    if "max_position" in err:
        assert "config.json::$.max_position_embeddings 2048" in err


def test_a_card_too_small_says_why_and_what_lifts_it(tmp_path):
    err = _one_line_refusal(invoke("contract", "new", TINY, "--card", "cpu", "--memory-gib", "0.02",
                                   "--out", tmp_path / "c.yaml"))
    assert re.search(r"weights 11.26 MiB - the sdpa attention mask [\d.]+ MiB\) holds [\d,]+ KV "
                     r"tokens", err)
    assert "Flash attention, which has no mask, needs a GPU" in err
    for lift in (
        "shorter --max-input-len / --max-output-len",
        "more --memory-gib",
        "--weights bf16",
        "--kv-fraction above 0.9",
    ):
        assert lift in err
    err = _one_line_refusal(
        invoke(
            "contract",
            "new",
            TINY,
            "--card",
            "cpu",
            "--memory-gib",
            "0.005",
            "--out",
            tmp_path / "c.yaml",
        )
    )
    assert "the weights alone (11.26 MiB, fp32) do not fit the card's 5.12 MiB" in err


def test_a_small_contract_says_why_it_is_small(tmp_path):
    err = _ok(
        invoke(
            "contract",
            "new",
            TINY,
            "--card",
            "cpu",
            "--memory-gib",
            "0.03",
            "--out",
            tmp_path / "c.yaml",
        )
    )
    assert re.search(r"note: 1 slot only: after the weights \(11.26 MiB\) and the working memory "
                     r"\([\d.]+ MiB\), "
                     r"0.9 of the card's 30.72 MiB holds a pool of [\d,]+ KV tokens, 1 full-length "
                     r"sequence of "
                     r"1,280 tokens", err), err


@pytest.mark.parametrize("card", ["cpu", "gpu"])
def test_the_node_is_refused_only_for_what_the_user_must_state(tmp_path, card):
    out, node = tmp_path / "c.yaml", tmp_path / "node.yaml"
    flags = GPU if card == "gpu" else ("--card", "cpu", "--memory-gib", "1")
    err = _ok(invoke("contract", "new", TINY, *flags, "--out", out, "--node-out", node))
    text = node.read_text()
    assert (
        f"cpu_cores: {os.cpu_count()}" not in text
        and "FILL IN: the CPU cores of the machine" in text
    )
    assert "node.yaml: fill in host.memory_gib, host.cpu_cores" in err
    v = invoke("validate", out, node)
    errors = _errors(v)
    holes = ["$.host.memory_gib", "$.host.cpu_cores"] + (
        ["$.cards[0].model"] if card == "gpu" else []
    )
    assert [e.split("::")[1].split(":")[0] for e in errors] == holes, errors
    assert all(
        "not filled in yet: `forge contract new` left a placeholder here for you to state" in e
        for e in errors
    )
    values = {"memory_gib": 64, "cpu_cores": 8}
    if card == "gpu":
        assert "model must equal the card's name as NVML reports it" in text
        assert "nvidia-smi --query-gpu=name --format=csv,noheader" in errors[2]
        values["model"] = '"NVIDIA H100 80GB HBM3"'
    fill_in(node, **values)
    v = invoke("validate", out, node)
    assert v.returncode == 0 and "valid (0 error(s), 0 warning(s))" in v.stderr, v.stdout + v.stderr


def test_bin_weights_without_headers_are_counted_from_the_geometry_and_validate(tmp_path):
    ckpt = tiny_copy(tmp_path)
    # weights forge reads no header of
    (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    err = _ok(
        invoke(
            "contract",
            "new",
            ckpt,
            "--card",
            "cpu",
            "--memory-gib",
            "1",
            "--out",
            tmp_path / "c.yaml",
        )
    )
    assert (
        f"{TINY_PARAMETERS:,} parameters counted from config.json's geometry" in err
        and "refuses" not in err
    )
    assert "Sized from config.json alone" not in (tmp_path / "c.yaml").read_text()
    v = invoke("validate", tmp_path / "c.yaml")
    assert v.returncode == 0, v.stdout + v.stderr
