"""`forge validate PATH...`: refuse bad node descriptions and engine contracts before any GPU is
touched."""
from __future__ import annotations

from pathlib import Path

import click


def register(cli: click.Group) -> None:
    @cli.command("validate")
    @click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
    @click.option("--strict", is_flag=True, help="treat warnings (e.g. fewer full-length slots "
                                                 "than "
                  "max_batch_size) as errors")
    @click.option("--engine-check", is_flag=True, help="also give each installed engine library "
                                                       "the arguments forge "
                  "would pass it and build its own configuration objects, without a device (vLLM: "
                  "EngineArgs and "
                  "create_model_config, in a child process); imports the engine: seconds to a "
                  "minute")
    def validate_cmd(paths: tuple[Path, ...], strict: bool, engine_check: bool) -> int:
        """Check node descriptions and engine contracts (files or folders, told apart by their top
        key).

        Prints one line per problem, `file::$.json.path: message`. Exit 0 when everything is valid
        (warnings may print), 1 when anything is invalid, 2 for usage errors."""
        from forge.config.load import load_paths

        from forge.backends import engine_check_problems

        loaded = load_paths(list(paths), strict=strict)
        if engine_check:
            # what the installed engines' own configuration objects refuse (built without a device;
            # imports them in a child process), where forge's rules have not already refused that
            # field
            said = {(p.file, p.path) for p in loaded.errors}
            loaded.problems += [
                p for p in engine_check_problems(loaded) if (p.file, p.path) not in said
            ]
        for p in loaded.problems:
            click.echo(p.render())
        n_err, n_warn = len(loaded.errors), len(loaded.warnings)
        verdict = "valid" if loaded.ok else "INVALID"
        click.echo(f"forge: {loaded.files_checked} file(s), {len(loaded.nodes)} node(s), "
                   f"{len(loaded.contracts)} contract(s): {verdict} ({n_err} error(s), {n_warn} "
                   "warning(s))", err=True)
        return 0 if loaded.ok else 1
