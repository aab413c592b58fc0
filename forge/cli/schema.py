"""`forge schema`: the JSON Schemas of node descriptions and engine contracts, for editors and
CI."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from forge.errors import UsageError


def register(cli: click.Group) -> None:
    @cli.command("schema")
    @click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="write node.schema.json and contract.schema.json into DIR (created if missing)",
    )
    @click.option(
        "--check",
        "check_dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=None,
        help="exit 1 if the schemas in DIR differ from the models (e.g. docs/schemas)",
    )
    def schema_cmd(out_dir: Optional[Path], check_dir: Optional[Path]) -> int:
        """Export the JSON Schemas (with the sections installed plugins register).

        Without options both schemas print as one JSON object {"node": ..., "contract": ...}.
        The committed copies live in docs/schemas/: `forge schema --out docs/schemas`."""
        from forge.config import schema as schemas

        if out_dir is not None and check_dir is not None:
            raise UsageError("--out and --check exclude each other")
        current = schemas.json_schemas()
        if check_dir is not None:
            stale = []
            for kind, sch in current.items():
                path = check_dir / schemas.file_name(kind)
                if not path.is_file() or path.read_text(encoding="utf-8") != schemas.dump(sch):
                    stale.append(str(path))
            for path in stale:
                click.echo(f"{path}: differs from the models; run `forge schema --out {check_dir}`")
            return 1 if stale else 0
        if out_dir is None:
            click.echo(json.dumps(current, indent=2, ensure_ascii=False))
            return 0
        out_dir.mkdir(parents=True, exist_ok=True)
        for kind, sch in current.items():
            path = out_dir / schemas.file_name(kind)
            path.write_text(schemas.dump(sch), encoding="utf-8")
            click.echo(f"wrote {path}")
        return 0
