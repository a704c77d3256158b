"""The `rectool` command line: the group, its commands (one module each in `commands/`), main.

Each command is a thin skin over one library call (see `commands/conventions.py` for what every
command does with its output, errors and exit status).
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

# numpy's OpenBLAS starts a thread for each core as numpy is imported, and they spin a while:
# numpy's import took 0.18-0.20 s here, 0.09-0.14 s with one thread. No command does linear
# algebra; a value the user set is kept.
if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click

from . import __version__

# The choices the options offer, defined once in `rectool.choices` (import-free), re-exported.
from .choices import CHECK_MODES, ENCODINGS, LAYOUTS  # noqa: F401
from .commands.conventions import RectoolCommand, RectoolGroup, watch_sigterm

# Each command's module, imported when the command runs (or --help lists them): a command
# does not pay for importing the other eleven. The usual order; `rectool --help` sorts them.
COMMANDS = {
    "list": "list",
    "pack": "pack",
    "repack": "repack",
    "verify": "verify",
    "reindex": "reindex",
    "info": "info",
    "unpack": "unpack",
    "reader": "reader",
    "index": "index",
    "dali-index": "dali_index",
    "bench": "bench",
    "report": "report",
}

# Old names that still run their command for one release, hidden from --help: {old: new}.
RENAMED = {"index-cache": "index"}


class LazyGroup(RectoolGroup):
    """The group whose commands are imported from `commands/` on first use."""

    def list_commands(self, ctx: click.Context | None) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        if cmd_name in RENAMED:
            command = self.get_command(ctx, RENAMED[cmd_name])
            return None if command is None else renamed(cmd_name, command)
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module = importlib.import_module(f"{__package__}.commands.{COMMANDS[cmd_name]}")
            self.add_command(getattr(module, f"{COMMANDS[cmd_name]}_command"))
        return self.commands.get(cmd_name)

    def load_all(self) -> dict[str, click.Command]:
        """Every command by name, each imported now (for tests and docs that walk them all)."""
        commands = {name: self.get_command(None, name) for name in self.list_commands(None)}
        return {name: command for name, command in commands.items() if command is not None}


def renamed(old: str, command: click.Command) -> click.Command:
    """Return a hidden command `old` that says on stderr it is renamed, then runs `command`."""

    def run(**params: object) -> object:
        click.echo(
            f"`rectool {old}` is renamed `rectool {command.name}`; the old name goes in the "
            "next release.",
            err=True,
        )
        return click.get_current_context().invoke(command.callback, **params)  # type: ignore[arg-type]

    return RectoolCommand(
        old,
        params=command.params,
        callback=run,
        help=f"Renamed `rectool {command.name}` (this name goes in the next release).",
        hidden=True,
    )


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rectool")
def cli() -> None:
    """Pack identity-per-folder image trees into MXNet RecordIO shards and read them back.

    \b
    Example:
        rectool list faces/ faces.lst
        rectool pack faces.lst faces/ out/faces
        rectool verify out/faces.manifest.json
    """


def main() -> None:
    """Run the command line (the `rectool` console script)."""
    watch_sigterm()  # SIGTERM cleans up and reports as Ctrl-C does
    try:
        cli(prog_name="rectool")
    finally:
        # The process ends next: what it made is not garbage the exit should look for. Frozen,
        # the last collections of interpreter teardown skip it (a repack's exit, after its
        # manifest: 29-34 ms of teardown, 8.5 ms frozen). atexit handlers still run.
        gc.freeze()
