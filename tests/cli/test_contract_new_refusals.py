"""`forge contract new` on hostile or broken checkpoints and paths (issue 48): each case is one line
naming the file and the field at fault (`config.json::$.num_hidden_layers: ...`), exit 1, no
traceback, nothing written. Real CLI in this process (tests/forge_cli.invoke), real files in the
test's tmp dir."""
import json
import os
import threading

import pytest

from forge.config.yamlsafe import load_yaml
from forge.errors import ForgeError
from tests.cli._checkpoints import (
    TINY,
    tiny_config,
    tiny_copy,
    write_config_text,
    write_safetensors,
)
from tests.forge_cli import invoke
from tests.reliability._rel import assert_no_traceback

CPU = ("--card", "cpu", "--memory-gib", "0.25", "--max-input-len", "256", "--max-output-len", "64")


def _new(ckpt, out, *extra):
    return invoke("contract", "new", ckpt, *CPU, "--out", out, *extra)


def _refused(r, *expected):
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert_no_traceback(r.stderr)
    assert "internal error" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for text in expected:
        assert text in r.stderr, (text, r.stderr)
    return r.stderr


def _with_header(tmp_path, header, data_bytes=0):
    ckpt = tiny_copy(tmp_path)
    write_safetensors(ckpt / "model.safetensors", header, data_bytes)
    return ckpt


@pytest.mark.parametrize("header, data_bytes, expected", [
    ([1, 2], 0, "model.safetensors::$: the header is a list, not a JSON object of tensors"),
    ({"w": "F32"}, 0, "model.safetensors::$.w: a string, not a tensor entry"),
    ({"w": {"dtype": "F32", "shape": ["a", "b"], "data_offsets": [0, 4]}}, 4,
     "model.safetensors::$.w.shape[0]: a string is not a whole non-negative number"),
    ({"w": {"dtype": "F32", "shape": [1e308], "data_offsets": [0, 4]}}, 4,
     "model.safetensors::$.w.shape[0]: 1e+308 is not a whole non-negative number"),
    ({"w": {"dtype": "F32", "shape": [10**200], "data_offsets": [0, 4]}}, 4,
     "model.safetensors::$.w.shape: shape [201-digit] F32 is a 201-digit number of bytes but its "
     "data_offsets "
     "hold 4 bytes"),
    ({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 4]}}, 4,
     "model.safetensors::$.w.shape[0]: -4 is not a whole non-negative number"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8,
     "model.safetensors::$.w.data_offsets: not [begin, end] within the file's 8 bytes of data"),
    ({"model.layers.0.w": {"dtype": "X9", "shape": [10**6], "data_offsets": [0, 8]}}, 8,
     "model.safetensors::$['model.layers.0.w'].shape: shape [1000000] has more elements than bits"),
])
def test_a_broken_safetensors_header_is_one_line_naming_the_field(
    tmp_path, header, data_bytes, expected
):
    ckpt = _with_header(tmp_path, header, data_bytes)
    _refused(_new(ckpt, tmp_path / "c.yaml"), expected)
    assert not (tmp_path / "c.yaml").exists()


def test_a_header_longer_than_its_file_is_refused(tmp_path):
    ckpt = tiny_copy(tmp_path)
    (ckpt / "model.safetensors").write_bytes((10**6).to_bytes(8, "little") + b"{}")
    _refused(_new(ckpt, tmp_path / "c.yaml"), "model.safetensors::$: declares a header of "
                                              "1,000,000 bytes in a file "
             "of 10 bytes")


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"vocab_size": "9" * 5000},
            "config.json::$.vocab_size: a 5,000-digit number is outside 1..67,108,864",
        ),
        (
            {"architectures": [""]},
            "config.json::$.architectures[0]: empty is not a model class name",
        ),
        (
            {"architectures": ["Llama\nx: 1"]},
            "config.json::$.architectures[0]: 'Llama\\nx: 1' is not a model class name",
        ),
        ({"architectures": []}, "config.json::$.architectures: missing or empty"),
        (
            {"num_hidden_layers": True},
            "config.json::$.num_hidden_layers: true is not a whole number",
        ),
        ({"num_hidden_layers": 4.0}, "config.json::$.num_hidden_layers: 4 is not a whole number"),
        (
            {"num_key_value_heads": -4},
            "config.json::$.num_key_value_heads: -4 is outside 1..16,384",
        ),
        (
            {"num_key_value_heads": 3},
            "config.json::$.num_key_value_heads: 3 does not divide num_attention_heads 8",
        ),
        (
            {"max_position_embeddings": "2048"},
            "config.json::$.max_position_embeddings: a string (4 characters) is not a whole number",
        ),
        (
            {"tie_word_embeddings": "yes"},
            "config.json::$.tie_word_embeddings: a string (3 characters) is not true or false",
        ),
        (
            {
                "text_config": {
                    "num_hidden_layers": None,
                    "num_attention_heads": 8,
                    "head_dim": 32,
                    "vocab_size": 2048,
                }
            },
            "config.json::$.text_config.num_hidden_layers: missing; a contract needs it",
        ),
    ],
)
def test_a_broken_config_is_one_line_naming_the_field(tmp_path, change, expected):
    ckpt = tiny_copy(tmp_path)
    text = json.dumps(tiny_config(**change))
    # a JSON number of 5,000 digits (json.dumps will not write it)
    if change.get("vocab_size") == "9" * 5000:
        text = text.replace(f'"{change["vocab_size"]}"', change["vocab_size"])
    write_config_text(ckpt, text)
    _refused(_new(ckpt, tmp_path / "c.yaml"), expected)
    assert not (tmp_path / "c.yaml").exists()


def test_config_json_that_is_not_an_object_or_not_json_is_refused(tmp_path):
    ckpt = tiny_copy(tmp_path)
    write_config_text(ckpt, "[1, 2]")
    _refused(
        _new(ckpt, tmp_path / "c.yaml"), "config.json: expected a JSON object at the top level"
    )
    write_config_text(ckpt, "{\"vocab_size\": 1,}")
    _refused(_new(ckpt, tmp_path / "c.yaml"), "config.json: not valid JSON")


@pytest.mark.timeout(60)
def test_a_fifo_for_weights_is_refused_without_blocking(tmp_path):
    ckpt = tiny_copy(tmp_path)
    (ckpt / "model.safetensors").unlink()
    os.mkfifo(ckpt / "model.safetensors")
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(r=_new(ckpt, tmp_path / "c.yaml")), daemon=True
    )
    worker.start()
    worker.join(30)
    if worker.is_alive():                        # unblock the hung open so the test process can end
        fd = os.open(ckpt / "model.safetensors", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("forge contract new blocked on a FIFO named model.safetensors")
    _refused(result["r"], "model.safetensors::$: not a regular file (a FIFO, a device or a folder)")


@pytest.mark.timeout(60)
def test_a_fifo_for_config_json_is_refused_without_blocking(tmp_path):
    ckpt = tiny_copy(tmp_path)
    (ckpt / "config.json").unlink()
    os.mkfifo(ckpt / "config.json")
    _refused(_new(ckpt, tmp_path / "c.yaml"), "config.json: not a regular file")


def test_a_folder_named_like_weights_is_refused(tmp_path):
    ckpt = tiny_copy(tmp_path)
    (ckpt / "extra.safetensors").mkdir()
    _refused(_new(ckpt, tmp_path / "c.yaml"), "extra.safetensors::$: not a regular file")


def test_out_through_a_dangling_folder_link_names_the_link(tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "missing-folder")
    err = _refused(_new(TINY, tmp_path / "gone" / "c.yaml"),
                   f"{tmp_path / 'gone' / 'c.yaml'}: its folder {tmp_path / 'gone'} is a symbolic "
                   "link to "
                   f"{tmp_path / 'missing-folder'}, which does not exist")
    assert "create that folder or choose another --out" in err
    assert not (tmp_path / "missing-folder").exists()


def test_a_dangling_out_link_is_named_as_given_not_its_target(tmp_path):
    (tmp_path / "c.yaml").symlink_to(tmp_path / "target.yaml")
    err = _refused(_new(TINY, tmp_path / "c.yaml"), f"{tmp_path / 'c.yaml'}: is a symbolic link; "
                                                    "--out never writes")
    assert "target.yaml" not in err
    assert not (tmp_path / "target.yaml").exists()


def test_the_staging_link_refusal_names_the_link_not_its_target(tmp_path):
    from forge.records.writer import OutputWriter

    (tmp_path / "elsewhere.jsonl").write_text("")
    (tmp_path / "out.jsonl.staging").symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(ForgeError) as e:
        OutputWriter(tmp_path / "out.jsonl.staging", follow_links=False)
    assert str(e.value).startswith(f"{tmp_path / 'out.jsonl.staging'}: is a symbolic link")
    assert "elsewhere" not in str(e.value)


def test_out_and_node_out_naming_one_file_is_refused(tmp_path):
    _refused(_new(TINY, tmp_path / "c.yaml", "--node-out", tmp_path / "c.yaml"),
             "--node-out names the same file as --out", "the node would overwrite the contract "
                                                        "just written")
    assert not (tmp_path / "c.yaml").exists()
    (tmp_path / "sub").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "sub")
    _refused(_new(TINY, tmp_path / "sub" / "c.yaml", "--node-out", tmp_path / "alias" / "c.yaml"),
             "--node-out names the same file as --out")
    assert not (tmp_path / "sub" / "c.yaml").exists()


@pytest.mark.parametrize("flags, expected", [
    (("--tokens-per-block", "24"), "24 is not a power of two"),
    (("--budget", str(2**31)), "--budget"),
    (("--memory-gib", "1e308"), "--memory-gib"),
])
def test_flags_out_of_range_are_usage_errors(tmp_path, flags, expected):
    r = invoke(
        "contract",
        "new",
        TINY,
        "--card",
        "cpu",
        "--memory-gib",
        "1",
        "--out",
        tmp_path / "c.yaml",
        *flags,
    )
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert_no_traceback(r.stderr)


def test_a_gpu_capability_and_a_name_are_checked_up_front(tmp_path):
    r = invoke(
        "contract",
        "new",
        TINY,
        "--card",
        "gpu",
        "--memory-gib",
        "80",
        "--compute-capability",
        "nine",
        "--out",
        tmp_path / "c.yaml",
    )
    assert r.returncode == 2 and "'nine' is not a compute capability MAJOR.MINOR" in r.stderr, (
        r.stderr
    )
    _refused(
        _new(TINY, tmp_path / "c.yaml", "--name", "a\nb"), "--name 'a\\nb': a contract name is"
    )
    _refused(_new(TINY, tmp_path / "c.yaml", "--attn-implementation", "fast"),
             "--attn-implementation fast: transformers.attn_implementation is one of sdpa, eager")


def test_every_string_is_written_as_yaml_that_reads_back_as_itself(tmp_path):
    """A checkpoint folder whose name holds a newline, ': ' and ' #' lands in the contract as
    exactly that path."""
    folder = tmp_path / "odd"
    folder.mkdir()
    ckpt = tiny_copy(folder, 'we: ird # "x"\nname')
    out = tmp_path / "c.yaml"
    r = invoke("contract", "new", ckpt, *CPU, "--out", out)
    assert r.returncode == 0, r.stderr
    doc = load_yaml(out.read_text())
    assert doc["artifact"]["checkpoint"] == os.path.relpath(ckpt, tmp_path)
    assert (
        doc["contract"] == "we-ird-x-name-cpu"
        and doc["model"]["architecture"] == "LlamaForCausalLM"
    )
    v = invoke("validate", out)
    assert v.returncode == 0, v.stdout + v.stderr
