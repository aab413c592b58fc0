"""The `forge` command. Thin: each command module parses flags, builds objects, runs.

Errors meant for the user (ForgeError) print as one line and exit with their code; anything else
prints one line too, and the traceback only with FORGE_DEBUG=1."""
from __future__ import annotations

import importlib
import os
import sys

import click

from forge.errors import ForgeError, UsageError

# One module per command (group); each exposes `register(cli)`.
COMMAND_MODULES = (
    "forge.cli.validate",
    "forge.cli.contract",
    "forge.cli.schema",
    "forge.cli.provision",
    "forge.cli.run",
    "forge.cli.status",
    "forge.cli.report",
    "forge.cli.serve",
    "forge.cli.top",
)
# Commands that come with a package of their own, registered through the forge_register_commands
# hook: when one is missing, what to install (one line, exit code 2) rather than click's bare "No
# such command".
PACKAGED_APART = {
    "bench": "`forge bench` comes with the forge-bench package, not installed here (or left out by "
             "FORGE_LOAD_PLUGINS):"
             " in a forge checkout, pip install -e '.[bench]' -e ./bench",
}


class _ForgeGroup(click.Group):
    def get_command(self, ctx: click.Context, cmd_name: str):
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in PACKAGED_APART:
            raise UsageError(PACKAGED_APART[cmd_name])
        return command


@click.group(
    cls=_ForgeGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="forge-llm", prog_name="forge")
def cli() -> None:
    """forge — engines as inputs to provisioning; plain Python functions over millions of
    records."""


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(cli)
    from forge.plugins import load_plugins

    load_plugins().hook.forge_register_commands(cli=cli)


def _exit_now(code: int) -> None:
    """Exit at once after a Ctrl-C. Everything worth keeping was closed on the way here (finally
    blocks: ledger, output); what may remain are threads of an engine that was still loading, which
    would otherwise keep the process alive however often the user presses Ctrl-C."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say anyway
            pass
    os._exit(code)


def _refuse_a_bad_environment() -> None:
    from forge import constants

    if constants.ENVIRONMENT_PROBLEMS:
        raise UsageError("; ".join(constants.ENVIRONMENT_PROBLEMS))


def main(argv: list[str] | None = None) -> None:
    debug = os.environ.get("FORGE_DEBUG") == "1"
    from forge.cli.streams import guard_std_streams

    guard_std_streams()  # a reader that goes away (`| head -1`) never changes what the run does
    try:
        _refuse_a_bad_environment()
        _register_all()
        rv = cli.main(args=argv, prog_name="forge", standalone_mode=False)
        sys.exit(rv if isinstance(rv, int) else 0)
    except click.exceptions.Abort:          # click's form of a Ctrl-C
        click.echo("forge: interrupted", err=True)
        _exit_now(130)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if isinstance(e, click.UsageError) else e.exit_code)
    except ForgeError as e:
        if debug:
            raise
        click.echo(f"forge: {e}" if "\n" not in str(e) else str(e), err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("forge: interrupted", err=True)
        _exit_now(130)
    except Exception as e:  # the last line of defence: one line, not a traceback
        if debug:
            raise
        click.echo(f"forge: internal error: {type(e).__name__}: {e} (set FORGE_DEBUG=1 for the "
                   "traceback)", err=True)
        sys.exit(1)
