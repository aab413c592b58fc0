"""--input as a folder, a glob, a compressed file or a pipe (forge/records/shards.py): order, global
indices, identity, refusals. Real files on disk; the end-to-end runs are in
tests/e2e/test_input_shards.py."""
import gzip
import json
import os
from pathlib import Path

import pytest

from forge.errors import ForgeError
from forge.records.reader import InputError, RecordSource
from forge.records.shards import PipeSource, ShardedSource, open_input


def _lines(ids) -> str:
    return "".join(json.dumps({"id": i}) + "\n" for i in ids)


@pytest.fixture
def shards(tmp_path) -> Path:
    d = tmp_path / "data"
    (d / "part=2").mkdir(parents=True)
    (d / "b.jsonl").write_text(_lines(range(3, 5)))
    with gzip.open(d / "a.jsonl.gz", "wt") as f:
        f.write(_lines(range(0, 3)))
    (d / "part=2" / "c.jsonl").write_text(_lines(range(5, 7)) + "{oops\n")
    (d / "_SUCCESS").write_text("")
    (d / ".hidden.jsonl").write_text(_lines([99]))
    (d / "notes.txt").write_text("not a shard\n")
    return d


def test_a_folder_is_read_in_path_order_with_one_global_index(shards):
    src = open_input(shards)
    assert isinstance(src, ShardedSource)
    assert [s.path.name for s in src.shards] == ["a.jsonl.gz", "b.jsonl", "c.jsonl"]
    assert src.count() == 8
    assert src.offsets() == [0, 3, 5]
    got = list(src.records())
    assert [i for i, _ in got] == list(range(8))
    assert [r["id"] for _, r in got[:7]] == list(range(7))
    bad = got[7][1]
    assert isinstance(bad, InputError) and bad.type == "InputInvalidJSON"
    assert "part=2/c.jsonl:3:" in bad.message  # the shard and its own line, not the global index


def test_skip_is_by_global_index_and_a_settled_shard_is_not_opened(shards):
    src = open_input(shards)
    src.count()
    done = {0, 1, 2, 4}
    assert [i for i, _ in src.records(skip=lambda i: i in done)] == [3, 5, 6, 7]
    (shards / "a.jsonl.gz").write_bytes(b"garbage")     # wholly settled: never decompressed again
    assert [i for i, _ in src.records(skip=lambda i: i in done)] == [3, 5, 6, 7]


def test_a_glob_picks_its_matches_in_order(shards, tmp_path):
    src = open_input(str(shards / "*.jsonl*"))
    assert [s.path.name for s in src.shards] == ["a.jsonl.gz", "b.jsonl"]
    assert src.count() == 5
    with pytest.raises(ForgeError, match="matches no file"):
        open_input(str(tmp_path / "nothing" / "*.jsonl"))


def test_the_shard_set_is_the_input_identity(shards):
    before = open_input(shards).fingerprint()
    assert before["input_shards"] == 3
    assert open_input(shards).fingerprint() == before
    (shards / "d.jsonl").write_text(_lines([7]))
    after = open_input(shards).fingerprint()
    assert after["input_shards"] == 4 and after != before
    (shards / "d.jsonl").unlink()
    # same bytes, another name: another shard set
    os.rename(shards / "b.jsonl", shards / "bb.jsonl")
    assert open_input(shards).fingerprint() != before


def test_one_plain_file_keeps_the_one_file_identity(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text(_lines(range(3)))
    src = open_input(p)
    assert type(src) is RecordSource
    assert set(src.fingerprint()) == {"input_size", "input_sha256_head_tail"}


def test_empty_folder_and_missing_zstandard_are_refused_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ForgeError, match="holds no shards"):
        open_input(tmp_path / "empty")
    z = tmp_path / "x.jsonl.zst"
    z.write_bytes(b"\x28\xb5\x2f\xfd")
    try:
        import zstandard  # noqa: F401
    except ImportError:
        with pytest.raises(
            ForgeError, match=r"x.jsonl.zst: reading .zst needs the zstandard module"
        ):
            open_input(z)
    else:
        pytest.skip("zstandard is installed here")


def test_a_corrupt_gzip_shard_is_named(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.jsonl.gz").write_bytes(gzip.compress(_lines(range(3)).encode())[:-12])
    src = open_input(d)
    with pytest.raises(ForgeError, match=r"a.jsonl.gz: cannot decompress \(gzip\)"):
        src.count()


def test_a_fifo_is_a_pipe(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:                                    # the writer end, as `<(zcat x.gz)` would be
        with open(fifo, "w") as f:
            f.write(_lines(range(4)))
        os._exit(0)
    src = open_input(fifo)
    assert isinstance(src, PipeSource) and src.count() is None
    assert [r["id"] for _, r in src.records()] == [0, 1, 2, 3]
    assert src.read == 4 and src.ended
    os.waitpid(pid, 0)


def test_an_output_among_the_shards_is_seen(shards, tmp_path):
    src = open_input(shards)
    assert src.would_read(shards / "out.jsonl")
    assert src.would_read(shards / "part=2" / "out.parquet")
    assert not src.would_read(shards / "out.txt")
    assert not src.would_read(tmp_path / "out.jsonl")
    g = open_input(str(shards / "*.jsonl"))
    assert g.would_read(shards / "out.jsonl") and not g.would_read(shards / "part=2" / "out.jsonl")


def test_forge_own_side_files_are_never_shards_and_are_listed(shards):
    """A report, a ledger (and its -wal), a Parquet run's staging file in the input folder: left
    out, each named with what it is. A user's file that only looks like one by name is read."""
    (shards / "results.report.json").write_text('{\n "format": "forge-run-report",\n "version": '
                                                '1\n}\n')
    (shards / "results.report.md").write_text("# forge run report\n")
    (shards / "out.parquet.staging.jsonl").write_text(_lines([50]))
    # the user's own data, named like a report
    (shards / "mine.report.json").write_text(_lines([60]))
    src = open_input(shards)
    names = [s.path.name for s in src.shards]
    assert "results.report.json" not in names and "out.parquet.staging.jsonl" not in names
    assert "mine.report.json" in names
    assert sorted((p.name, what) for p, what in src.skipped) == [
        ("out.parquet.staging.jsonl", "a Parquet run's staging file"),
        ("results.report.json", "forge's run report"),
    ]
    g = open_input(str(shards / "*"))
    assert {p.name for p, _ in g.skipped} == {
        "results.report.json",
        "results.report.md",
        "out.parquet.staging.jsonl",
    }
    assert not g.would_read(shards / "out.jsonl.ledger.sqlite")


def test_a_single_compressed_file_reads_only_itself(tmp_path):
    """Issue 50 item 5: an output beside a lone .jsonl.gz is not among its shards (it is for a
    folder)."""
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress(_lines(range(3)).encode()))
    src = open_input(gz)
    assert src.single and not src.would_read(tmp_path / "out.jsonl")
    assert src.would_read(gz)
    assert open_input(tmp_path).would_read(tmp_path / "out.jsonl")
