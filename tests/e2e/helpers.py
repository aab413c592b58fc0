import json
from pathlib import Path

from tests.forge_cli import REPO, forge  # noqa: F401 - the e2e tests' CLI, shared by the whole suite


def write_records(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_output(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
