"""`rectool reader`: the standalone reader, training or recordio module."""

from __future__ import annotations

import os

import click

from .conventions import (
    RectoolCommand,
    emit_json,
    library_errors,
    write_stream,
)
from .options import (
    json_option,
    output_option,
    overwrite_option,
)


@click.command(cls=RectoolCommand, name="reader")
@output_option(
    "Where to write the module (- for stdout).",
    click.Path(dir_okay=False, allow_dash=True),
    default="-",
    show_default=True,
)
@click.option(
    "--training",
    "training_module",
    is_flag=True,
    help="Write the training module instead: Loader, BatchDecoder, RankSampler, prefetch.",
)
@click.option(
    "--recordio",
    "recordio_module",
    is_flag=True,
    help="Write the recordio module instead: mxnet.recordio's API without MXNet.",
)
@overwrite_option("Replace an existing file at --output.")
@json_option("Print what was written as JSON on stdout (needs --output FILE).")
@library_errors
def reader_command(
    output: str, training_module: bool, recordio_module: bool, overwrite: bool, as_json: bool
) -> None:
    """Write the standalone reader module for training code (standard library + numpy).

    It is rectool's own reader (rectool/reader.py) copied verbatim under a header naming the
    rectool and format versions: open_dataset(), RecordDataset, decode_image(). It never
    writes a file. OpenCV is imported only to decode images. With --training,
    rectool/training.py instead: Loader and BatchDecoder (decoded batches through shared
    memory, size=, int64 labels, skip or replace bad samples), RankSampler, epoch_order(),
    prefetch(); it imports the reader emitted beside it as rectool_reader, so name that one
    rectool_reader.py. The training guide in rectool's documentation shows them in use. With
    --recordio, rectool/recordio.py: MXNet 1.9.1's mxnet.recordio API (MXIndexedRecordIO,
    unpack, pack_img, ...) and imdecode(), for code that imports MXNet only for recordio.

    \b
    Example:
        rectool reader -o train/rectool_reader.py
        rectool reader --training -o train/rectool_training.py
        rectool reader --recordio -o train/recordio.py
        python -c "import rectool_reader as r; print(len(r.open_dataset('out/faces')))"
    """
    from ..emit import emit_reader, reader_source

    if training_module and recordio_module:
        raise click.UsageError("--training and --recordio choose different modules: give one")
    if output == "-":
        if as_json:
            raise click.UsageError("--json needs --output FILE (with -o -, stdout is the module)")
        write_stream(reader_source(training_module, recordio_module), nl=False, data=True)
        return
    path = emit_reader(output, training_module, overwrite, recordio_module)
    what = "recordio" if recordio_module else "training" if training_module else "reader"
    if as_json:
        emit_json({what: os.fspath(path)})
        return
    click.echo(f"Wrote the {what} module {path}.", err=True)
