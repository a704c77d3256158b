"""The `rectool` command line: the group, its commands (one module each in `commands/`), main.

Each command is a thin skin over one library call (see `commands/conventions.py` for what every
command does with its output, errors and exit status).
"""

from __future__ import annotations

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
from .commands.bench import bench_command
from .commands.conventions import RectoolGroup, watch_sigterm
from .commands.dali_index import dali_index_command
from .commands.index_cache import index_cache_command
from .commands.info import info_command
from .commands.list import list_command
from .commands.pack import pack_command
from .commands.reader import reader_command
from .commands.reindex import reindex_command
from .commands.repack import repack_command
from .commands.report import report_command
from .commands.unpack import unpack_command
from .commands.verify import verify_command


@click.group(cls=RectoolGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    watch_sigterm()  # SIGTERM cleans up and reports as Ctrl-C does
    cli(prog_name="rectool")


# The usual order (`rectool --help` lists them sorted).
for _command in (
    list_command, pack_command, repack_command, verify_command, reindex_command, info_command,
    unpack_command, reader_command, index_cache_command, dali_index_command, bench_command,
    report_command,
):  # fmt: skip
    cli.add_command(_command)
