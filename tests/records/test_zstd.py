"""`.jsonl.zst` inputs (forge/records/zstd.py): a file cut short or with bytes after a frame is
refused in one line naming it, as a damaged `.gz` is; several frames read as one stream; a bomb is
read in bounded memory."""
import json
import subprocess
import sys

import pytest

from forge.errors import ForgeError
from forge.records.shards import open_input

zstandard = pytest.importorskip("zstandard")


def _jsonl(n: int) -> bytes:
    return "".join(
        json.dumps({"id": i, "text": f"record {i} " * (i % 7)}) + "\n" for i in range(n)
    ).encode()


@pytest.fixture
def frame() -> bytes:
    return zstandard.ZstdCompressor().compress(_jsonl(20_000))


def test_several_frames_read_as_one_input(tmp_path, frame):
    z = tmp_path / "in.jsonl.zst"
    z.write_bytes(frame + frame)
    src = open_input(z)
    assert src.count() == 40_000
    assert [r["id"] for _, r in src.records()][19_999:20_001] == [19_999, 0]


@pytest.mark.parametrize("cut", ["half", "header"])
def test_a_file_cut_short_is_refused_naming_it(tmp_path, frame, cut):
    """The issue's cases: 100,000 records cut in half read as 53,131; a small file cut read as no
    records."""
    z = tmp_path / "in.jsonl.zst"
    z.write_bytes(frame[: len(frame) // 2] if cut == "half" else
                  zstandard.ZstdCompressor().compress(_jsonl(2))[:10])
    with pytest.raises(ForgeError, match=r"in.jsonl.zst: cannot decompress \(zstandard\): the file "
                                         r"ends inside a "
                                         r"zstandard frame \(it was cut short\)"):
        open_input(z).count()


def test_bytes_after_a_frame_are_refused_naming_the_file(tmp_path, frame):
    z = tmp_path / "in.jsonl.zst"
    z.write_bytes(frame + b"garbage after the frame")
    with pytest.raises(ForgeError, match=r"in.jsonl.zst: cannot decompress \(zstandard\): not "
                                         r"zstandard data"):
        open_input(z).count()


@pytest.mark.slow
def test_a_bomb_is_read_in_bounded_memory(tmp_path):
    """512 MiB of newlines in ~16 KiB: counted in a fresh interpreter whose peak RSS stays far below
    the data."""
    z = tmp_path / "bomb.jsonl.zst"
    with open(z, "wb") as f, zstandard.ZstdCompressor(level=1).stream_writer(f) as w:
        block = b"\n" * (1 << 24)
        for _ in range(32):
            w.write(block)
    # VmHWM: the peak since exec (ru_maxrss would count pages shared with the pytest process before
    # the exec)
    code = ("import sys; from forge.records.shards import open_input; "
            "n = open_input(sys.argv[1]).count(); "
            "hwm = [x for x in open('/proc/self/status') if x.startswith('VmHWM:')][0].split()[1]; "
            "print(n, hwm)")
    out = subprocess.run(
        [sys.executable, "-c", code, str(z)], capture_output=True, text=True, timeout=120
    )
    n, peak_kib = map(int, out.stdout.split())
    assert n == 1 << 29 and peak_kib < 150 * 1024, (n, peak_kib)
