"""Every command and every option of `forge` explains itself in --help (plugins' commands included,
when loaded): a newcomer reads `forge X --help`, not the source."""
import click

from forge.cli import _register_all, cli


def _walk(cmd: click.Command, path: str):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _walk(sub, f"{path} {name}")


def test_every_command_and_option_has_help_text():
    _register_all()
    missing = []
    for path, cmd in _walk(cli, "forge"):
        if not (cmd.help or "").strip():
            missing.append(f"{path}: the command has no help text")
        for p in cmd.params:
            if isinstance(p, click.Option) and not (p.help or "").strip() and not p.hidden:
                missing.append(f"{path} {'/'.join(p.opts)}: no help text")
    assert not missing, "\n".join(missing)
    assert len(list(_walk(cli, "forge"))) > 12          # the walk saw the real command tree
