"""The `rectool` command line: parse options, call the library, render the result.

Each command is a thin skin over one library call. Library errors (`RectoolError`) become
`Error: ...` with exit status 1; usage errors exit 2, as click does.
"""

from __future__ import annotations

import functools

import click

from . import __version__
from .errors import RectoolError, UsageError


def library_errors(func):
    """Turn the library's own exceptions into click's: exit 1 (`Error: ...`) or 2 for usage."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from exc
        except RectoolError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rectool")
def cli():
    """Pack identity-per-folder image trees into MXNet RecordIO shards and read them back.

    \b
    Example:
        rectool list faces/ faces.lst
        rectool pack faces.lst faces/ out/faces
        rectool verify out/faces.manifest.json
    """


def main():
    """Run the command line (the `rectool` console script)."""
    cli(prog_name="rectool")
