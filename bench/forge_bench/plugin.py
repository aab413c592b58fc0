"""forge-bench's one forge plugin (entry point `bench` in group `forge`, bench/pyproject.toml): the
`forge bench` command and the two test engines, `instant` and `faults`. Without forge-bench
installed neither exists in forge.

Light to import: forge loads every plugin before it parses a command, so the command's module is
imported only when forge asks for commands, and the engines' modules only when it asks for
backends."""
from __future__ import annotations

from forge.hookspecs import hookimpl


@hookimpl
def forge_register_commands(cli):
    from forge_bench.cli import register

    register(cli)


@hookimpl
def forge_register_backend(register):
    from forge_bench.engines import faults, instant

    register(instant.backend())
    register(faults.backend())
