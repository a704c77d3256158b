"""The `rectool` command line: parse options, call the library, render the result.

Each command is a thin skin over one library call. Library errors (`RectoolError`) become
`Error: ...` with exit status 1; usage errors exit 2, as click does.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path

import click

from . import __version__
from .build.listing import DEFAULT_EXTENSIONS, SKIP_REASONS, display_path, list_images
from .doors.output import discard_stream
from .errors import InputError, RectoolError, UsageError

# Commands import their library modules when they run: `rectool list` need not pay for OpenCV,
# tqdm and the packing pipeline at start-up. The choices below are the library's own constants
# (images.CHECK_MODES, images.ENCODINGS, packing.LAYOUTS); tests/test_cli.py keeps them equal.
CHECK_MODES = ("structure", "decode", "none")
ENCODINGS = (".jpg", ".png")
LAYOUTS = ("images", "insightface")


# The output convention, one place for every command (new ones get it by being defined with
# `@cli.command` and using `@json_option` and `@library_errors`):
# - human summaries, progress bars and messages go to stderr; data goes to stdout;
# - with --json, stdout holds exactly one JSON document, written by `emit_json`: the command's
#   result, or `{"error": ..., "exit": N, "seconds": ...}` for every failure (library errors exit
#   1, usage errors 2, click's own parse errors included, Ctrl-C 130). A result whose command
#   exits non-zero (pack's 3, verify's 1) carries that `exit` too; every document has `seconds`;
# - paths in a document are built from the paths given on the command line, as given: relative
#   ones stay relative to the current directory, absolute ones stay absolute.
# `list ... -` and `reader -o -` write their data to stdout: `list`'s JSON then goes to stderr.

JSON_FLAG = "--json"


def _wants_json(args):
    """Return True when --json is on a command line (before any `--`)."""
    args = list(args)
    if "--" in args:
        args = args[: args.index("--")]
    return JSON_FLAG in args


def _seconds(ctx):
    start = ctx.meta.get("rectool.start") if ctx is not None else None
    return round(time.perf_counter() - start, 3) if start is not None else 0.0


def emit_json(document, exit_code=0, err=False):
    """Print `document` as the command's one JSON document (with `seconds`, and `exit` when
    non-zero), then exit with `exit_code` when it is not 0."""
    ctx = click.get_current_context(silent=True)
    document = dict(document)
    document.setdefault("seconds", _seconds(ctx))
    if exit_code:
        document["exit"] = exit_code
    write_stream(json.dumps(document, ensure_ascii=False, indent=2), err=err)
    if exit_code:
        sys.exit(exit_code)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process was so that it cleans up as for Ctrl-C; exit 143."""


def _on_sigterm(signum, frame):
    raise Terminated()


def interrupted_status(exc):
    """Return the exit status of an interruption: 143 for SIGTERM, 130 for Ctrl-C."""
    return 143 if isinstance(exc, Terminated) else 130


def write_stream(text, nl=True, err=False):
    """Write a command's data or JSON document to stdout (`err`: to stderr) and flush it: the
    one place commands write their output, so a closed pipe or a full disk (`> /dev/full`)
    ends every command the same way, never with a traceback. A closed pipe exits 1 quietly, as
    other command-line tools do; any other failure prints one `Error:` line on stderr, exit 1."""
    stream = sys.stderr if err else sys.stdout
    try:
        click.echo(text, nl=nl, err=err)
        stream.flush()
    except OSError as exc:
        _output_failed(stream, exc)


def _output_failed(stream, exc):
    # What is left in the stream's buffer would fail again when Python flushes it at exit:
    # point the descriptor at /dev/null first (what the Python docs advise for SIGPIPE).
    try:
        discard_stream(stream.fileno())
    except (OSError, ValueError):  # not a real file (click's test runner)
        pass
    if exc.errno != errno.EPIPE and stream is sys.stdout:
        message = f"Error: cannot write standard output: {exc.strerror or exc}"
        try:
            click.echo(message, err=True)
        except OSError:
            pass
    sys.exit(1)


class UnusableInput(click.ClickException):
    """An input that cannot be used at all (`InputError`): `Error: ...`, exit 2."""

    exit_code = 2


class CommandFailed(click.ClickException):
    """An exit with a status and a message printed as is (no `Error: ` prefix)."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None):
        click.echo(self.message, err=True)


class JsonFailure(click.ClickException):
    """A failure under --json: `{"error": ..., "exit": N, "seconds": ...}` on stdout."""

    def __init__(self, message, exit_code, seconds, err=False):
        super().__init__(message)
        self.exit_code = exit_code
        self.seconds = seconds
        self.err = err

    def show(self, file=None):
        document = {"error": self.message, "exit": self.exit_code, "seconds": self.seconds}
        write_stream(json.dumps(document, ensure_ascii=False, indent=2), err=self.err)


class RectoolCommand(click.Command):
    """A command that keeps the output convention above, whatever happens in it."""

    # A command whose stdout may carry data: its JSON goes to stderr when the command line
    # (its arguments, as given) says it does.
    json_on_stderr = None  # callable(args) -> bool

    def _json_on_stderr(self, args):
        return bool(self.json_on_stderr and self.json_on_stderr(args))

    def make_context(self, info_name, args, parent=None, **extra):
        given = list(args)
        as_json = _wants_json(given)
        start = time.perf_counter()
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.Exit:
            raise
        except click.ClickException as exc:
            if not as_json or isinstance(exc, JsonFailure):
                raise
            err = self._json_on_stderr(given)
            raise JsonFailure(exc.format_message(), exc.exit_code, 0.0, err) from exc
        ctx.meta["rectool.start"] = start
        ctx.meta["rectool.args"] = given
        return ctx

    def invoke(self, ctx):
        as_json = bool(ctx.params.get("as_json"))
        err = as_json and self._json_on_stderr(ctx.meta.get("rectool.args", []))
        try:
            return super().invoke(ctx)
        except JsonFailure:
            raise
        except click.ClickException as exc:
            if not as_json:
                raise
            raise JsonFailure(exc.format_message(), exc.exit_code, _seconds(ctx), err) from exc
        except KeyboardInterrupt as exc:
            status = interrupted_status(exc)
            word = "terminated" if status == 143 else "interrupted"
            if not as_json:
                click.echo(f"{word.capitalize()}.", err=True)
                sys.exit(status)
            raise JsonFailure(word, status, _seconds(ctx), err) from None


class RectoolGroup(click.Group):
    """The `rectool` group: its commands are `RectoolCommand`s."""

    command_class = RectoolCommand


def library_errors(func):
    """Turn the library's own exceptions into click's: exit 1 (`Error: ...`) or 2 for usage."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from exc
        except InputError as exc:  # unusable input: exit 2, without click's usage text
            raise UnusableInput(str(exc)) from exc
        except RectoolError as exc:
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:
            # The library names its files in its own errors; this is the net for the rest
            # (a read-only output folder, a full disk): a message, never a traceback.
            where = f"{exc.filename}: " if exc.filename else ""
            raise click.ClickException(f"{where}{exc.strerror or exc}") from exc

    return wrapper


# Options several commands share, defined once (as pip-tools does).


def workers_option(help):
    """--workers/-j N, default all cores; `help` says what the workers do."""
    return click.option(
        "--workers",
        "-j",
        type=Count(1),
        default=os.cpu_count() or 1,
        show_default="all cores",
        help=help,
    )


def quiet_option(help="No progress bar and no summary."):
    """--quiet/-q."""
    return click.option("--quiet", "-q", is_flag=True, help=help)


def overwrite_option(help="Replace an existing output file."):
    """--overwrite: without it no existing output is replaced (a pack's files never are)."""
    return click.option("--overwrite", is_flag=True, help=help)


def json_option(help="Print the summary as JSON on stdout."):
    """--json, passed to the command as `as_json`."""
    return click.option("--json", "as_json", is_flag=True, help=help)


class PixelCount(click.ParamType):
    """A pixel count written as `50M`, `1.5G`, `250k` or a plain number (>= 1)."""

    name = "pixels"
    _SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            import re

            match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmg]?)\s*", str(value), re.IGNORECASE)
            if match is None:
                self.fail(f"{value!r} is not a pixel count (e.g. 50M, 120000000)", param, ctx)
            digits, suffix = match.groups()
            number = int(float(digits) * self._SUFFIXES[suffix.lower()])
        if not 1 <= number <= 10**15:
            self.fail(f"{value!r}: give 1 to 10**15 pixels", param, ctx)
        return number


def max_pixels_option(help="Refuse images whose header declares more pixels, before decoding."):
    """--max-pixels N: the decode guard's budget (`reader.admit_image`), 50M by default."""
    from .reader import DEFAULT_MAX_PIXELS

    return click.option(
        "--max-pixels",
        type=PixelCount(),
        default=f"{DEFAULT_MAX_PIXELS // 10**6}M",
        show_default=True,
        help=help + " E.g. 50M, 1.5G, 120000000.",
    )


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


# Every numeric option is range-checked by its type, so nan, inf, negative and huge values are
# usage errors naming the option (exit 2), never a traceback further down.
# Counts fit the int64 that numpy and the index files hold them in.
INT64_MAX = 2**63 - 1
# Seeds: what `numpy.random.default_rng` and `random.Random` both take, as 64 bits.
SEED = click.IntRange(0, 2**64 - 1)
# Time limits: at most a day.
MAX_SECONDS = 86400.0


class Count(click.IntRange):
    """An integer option from `min` to `max` (int64 at most, a bound help does not show)."""

    def __init__(self, min, max=INT64_MAX):
        super().__init__(min, max)

    def _describe_range(self):
        if self.max == INT64_MAX:
            return f"x>={self.min}"
        return super()._describe_range()


class Finite(click.FloatRange):
    """A `click.FloatRange` that also refuses nan (which compares false to every bound)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if number != number or number in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class ByteSize(click.ParamType):
    """A byte count written as `512MB`, `2GiB` or a plain number."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from .build.shards import parse_size

        try:
            size = parse_size(value)
        except ValueError:  # (also nan)
            self.fail(f"{value!r} is not a size (examples: 512MB, 2GiB, 1000000)", param, ctx)
        except OverflowError:  # inf, 1e400
            size = None
        if size is None or size > INT64_MAX:
            self.fail(f"{value!r} is too large: at most {INT64_MAX} bytes", param, ctx)
        return size


def progress_bar(quiet, unit):
    """Return (callback, close) drawing a tqdm bar on stderr, or no-ops when quiet/not a tty."""
    if quiet or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(unit=unit, unit_scale=True, file=sys.stderr, dynamic_ncols=True)
    state = {"done": 0}

    def update(done, total, refused):
        if bar.total != total:
            bar.total = total
        bar.update(done - state["done"])
        state["done"] = done
        if refused:
            bar.set_postfix(refused=refused, refresh=False)

    return update, bar.close


@cli.command("pack")
@click.argument("list_file", metavar="LIST", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("root", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("prefix", metavar="OUT_PREFIX")
@click.option(
    "--pack-label",
    is_flag=True,
    help="Store every list label as a float32 vector (flag > 0), as im2rec.",
)
@click.option(
    "--check",
    type=click.Choice(CHECK_MODES),
    default="structure",
    show_default=True,
    help="Pass-through check of each image. structure: walk the JPEG markers to the scan and "
    "the end marker, every PNG chunk and CRC (other formats are decoded). decode: also decode "
    "every image, refusing JPEGs whose data libjpeg-turbo reports corrupt (slower). none: only "
    "refuse missing and empty files.",
)
@click.option("--no-check", is_flag=True, help="Same as --check none.")
@click.option(
    "--resize",
    type=Count(1),
    help="Re-encode with the shorter side resized to N pixels.",
)
@click.option("--center-crop", is_flag=True, help="Re-encode, cropping the centre square first.")
@click.option(
    "--quality",
    type=click.IntRange(0, 100),
    help="Re-encode: JPEG quality 1-100 (default 95) or PNG compression 0-9 (default 3).",
)
@click.option(
    "--encoding", type=click.Choice(ENCODINGS), help="Re-encode as JPEG or PNG (default .jpg)."
)
@click.option(
    "--color",
    type=click.Choice(["-1", "0", "1"]),
    help="Re-encode: 1 colour, 0 grayscale, -1 unchanged (default 1).",
)
@click.option(
    "--shard-size",
    type=ByteSize(),
    help="Roll over to a new shard before a shard's .rec passes this size (e.g. 512MB, 2GiB).",
)
@click.option("--shard-records", type=Count(1), help="Roll over to a new shard every N records.")
@click.option(
    "--layout",
    type=click.Choice(LAYOUTS),
    default="images",
    show_default=True,
    help="images: keys as in the list. insightface: the face-dataset layout "
    "(header record 0, identity ranges, property file).",
)
@workers_option("Worker threads reading, checking and encoding images.")
@max_pixels_option(
    "Refuse images whose header declares more pixels, before checking or re-encoding them "
    "(not with --check none)."
)
@click.option(
    "--max-failures",
    type=Count(0),
    default=0,
    show_default=True,
    help="Refused images accepted before the exit status turns to 3.",
)
@click.option(
    "--labels",
    "label_map",
    type=click.Path(dir_okay=False),
    help="Label map (label<TAB>identity) for the manifest; "
    "default: the one `rectool list` wrote beside LIST.",
)
@click.option(
    "--allow-outside-root",
    is_flag=True,
    help="Pack list paths that leave ROOT (absolute, climbing out with .., or through a "
    "symbolic link); by default they are refused as outside-root.",
)
@click.option(
    "--sha256",
    is_flag=True,
    help="Give each file's SHA-256 in the manifest as well as its xxh3-128 (a content address "
    "for a published dataset; costs about 1 s a GB more).",
)
@click.option("--resume", is_flag=True, help="Continue an interrupted pack where it stopped.")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an existing pack at OUT_PREFIX, once the new one is complete.",
)
@click.option(
    "--only-shard",
    type=Count(0),
    metavar="K",
    help="Pack only shard K of the plan (needs --shard-records): one job-array task per shard.",
)
@click.option(
    "--finalize",
    is_flag=True,
    help="After --only-shard runs: check every shard and write the failures file and manifest.",
)
@click.option(
    "--plan", "show_plan", is_flag=True, help="Print the shard plan (count, list lines) and exit."
)
@click.option(
    "--executor",
    type=click.Choice(["local", "dask"]),
    default="local",
    show_default=True,
    help="dask: one task per shard on a Dask cluster (needs Dask: in a checkout of rectool, "
    "pip install -e '.[dask]').",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    help="Dask scheduler address (tcp://host:8786); default: a local cluster.",
)
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Pack an empty list as an empty dataset (by default an empty list is a usage error).",
)
@quiet_option("No progress bar and no summary.")
@json_option("Print the summary as JSON on stdout.")
@library_errors
def pack_command(
    list_file, root, prefix, pack_label, check, no_check, resize, center_crop, quality, encoding,
    color, shard_size, shard_records, layout, workers, max_pixels, max_failures, label_map,
    allow_outside_root, sha256, resume, overwrite, only_shard, finalize, show_plan, executor,
    scheduler, allow_empty, quiet, as_json,
):  # fmt: skip
    """Pack the images of LIST (or - for stdin) under ROOT into OUT_PREFIX.rec/.idx shards.

    Images are passed through byte for byte, each checked as --check says (by default their
    structure: JPEG markers, PNG chunks and CRCs), unless a re-encoding option (--resize,
    --center-crop, --quality, --encoding, --color) is given. Broken images are never
    written: each is recorded in OUT_PREFIX.failures.jsonl. Shards are written as .partial
    files and renamed when complete; OUT_PREFIX.manifest.json is written last.

    One run at a time writes an OUT_PREFIX (a second is refused, naming the first's pid).
    Images that are not regular files, or whose paths leave ROOT, are refused.

    Exit status: 0 packed (refusals within --max-failures), 1 error, 2 usage error,
    3 packed but more images refused than --max-failures allows (with --only-shard: by that
    shard), 130 interrupted (Ctrl-C: what was packed is kept; --resume continues it).

    \b
    Example:
        rectool pack faces.lst faces/ out/faces --shard-size 2GiB
        rectool pack faces.lst faces/ out/faces112 --resize 112 --quality 95
        rectool list faces/ - --labels faces.tsv | rectool pack - faces/ out/f --labels faces.tsv
    """
    from .build.distributed import pack_on_dask
    from .build.images import transform_from_options
    from .build.packing import PackOptions, finalize_pack, pack_images

    if no_check and check != "structure":
        raise click.BadParameter(f"--no-check contradicts --check {check}", param_hint="--no-check")
    options = PackOptions(
        transform=transform_from_options(resize, center_crop, quality, encoding, color),
        check="none" if no_check else check,
        pack_label=pack_label,
        shard_bytes=shard_size,
        shard_records=shard_records,
        layout=layout,
        workers=workers,
        max_failures=max_failures,
        allow_outside_root=allow_outside_root,
        max_pixels=max_pixels,
        sha256=sha256,
    )
    by_shard = only_shard is not None or finalize or show_plan
    if executor == "dask" or by_shard:
        if not shard_records or shard_size:
            raise click.BadParameter(
                "packing shard by shard needs a plan: give --shard-records N (not --shard-size)",
                param_hint="--shard-records",
            )
        if sum([only_shard is not None, finalize, show_plan, executor == "dask"]) > 1:
            raise click.UsageError(
                "use one of --only-shard, --finalize, --plan, --executor dask at a time"
            )
    if scheduler and executor != "dask":
        raise click.BadParameter("--scheduler needs --executor dask", param_hint="--scheduler")
    if show_plan:
        plan = shard_plan(list_file, options)
        if as_json:
            emit_json(plan)
        elif not quiet:
            write_stream(f"{len(plan['shards'])} shards of {plan['items']:,} list lines:")
            for number, (first, last) in enumerate(plan["shards"]):
                write_stream(f"  shard {number}: lines {first + 1}-{last}")
        return
    update, close = progress_bar(quiet or as_json, "img")
    update, seen = _remember_progress(update)
    replaces = overwrite and only_shard is None and not finalize and _has_output(prefix)
    try:
        if only_shard is not None:
            result = pack_images(
                list_file, root, prefix, options, resume=resume, overwrite=overwrite,
                progress=update, only_shard=only_shard,
            )  # fmt: skip
        elif finalize:
            result = finalize_pack(list_file, root, prefix, options, label_map=label_map)
        elif executor == "dask":
            result = pack_on_dask(
                list_file, root, prefix, options, scheduler=scheduler, resume=resume,
                overwrite=overwrite, label_map=label_map, progress=update,
            )  # fmt: skip
        else:
            result = pack_images(
                list_file, root, prefix, options, resume=resume, overwrite=overwrite,
                label_map=label_map, progress=update, allow_empty=allow_empty,
            )  # fmt: skip
    except KeyboardInterrupt as exc:
        close()
        message = _interrupted_message(prefix, seen, replaces, finalize, only_shard)
        status = interrupted_status(exc)
        if status == 143:
            message = "Terminated (SIGTERM)" + message[len("Interrupted") :]
        raise CommandFailed(message, status) from None
    finally:
        close()
    exit_code = 0 if result.accepted else 3
    if as_json:
        document = result.to_json()
        if exit_code:
            document["error"] = _refused_too_many(result)
        emit_json(document, exit_code)
        return
    if not quiet:
        render = render_shard_result if only_shard is not None else render_pack_summary
        click.echo(render(result), err=True)
    sys.exit(exit_code)


def _refused_too_many(result):
    return f"more than --max-failures {result.max_failures} refused ({result.failures:,})"


def _remember_progress(update):
    """Return (callback, seen): `update` wrapped so that `seen` holds the last (done, total)."""
    seen = {"done": 0, "total": None}

    def remember(done, total, refused):
        seen["done"], seen["total"] = done, total
        if update is not None:
            update(done, total, refused)

    return remember, seen


def _has_output(prefix):
    from .build.manifest import output_files

    return bool(output_files(prefix))


def _interrupted_message(prefix, seen, overwrite, finalize, only_shard):
    """Say what an interrupted pack kept and how to continue it."""
    from .build.manifest import journal_path

    if os.path.exists(journal_path(prefix)):
        return (
            f"Interrupted: the new pack at {prefix} was complete and is being moved into place; "
            "run the command again (or `rectool verify` on it) to finish that."
        )
    if overwrite:  # the run packed beside the old files (see `_replaces`)
        return (
            f"Interrupted: the pack at {prefix} is unchanged; the new one was not finished "
            "(run the command again to start it over)."
        )
    if finalize:
        return f"Interrupted: no manifest was written for {prefix}; run --finalize again."
    where = prefix if only_shard is None else f"shard {only_shard} of {prefix}"
    total = f" of {seen['total']:,}" if seen["total"] is not None else ""
    return (
        f"Interrupted after {seen['done']:,}{total} list items: what was packed is kept "
        f"({where}: finished shards and .partial files).\n"
        "Run the same command with --resume to continue it."
    )


def shard_plan(list_file, options):
    """Return the shard plan of a list as JSON-ready data (list lines are 1-based)."""
    from .build.packing import plan_list

    plan = plan_list(list_file, options)
    return {
        "items": sum(len(r) for r in plan),
        "shard_records": options.shard_records,
        "shards": [[r.start, r.stop] for r in plan],
    }


def render_shard_result(shard):
    """Return the human summary of packing one shard."""
    lines = [
        f"Packed shard {shard.shard} of {shard.shards}: {shard.info.records:,} images in "
        f"{shard.rec_path}, {shard.failures:,} refused ({shard.failures_path}). "
        "Run --finalize once every shard is packed."
    ]
    if not shard.accepted:
        lines.append(
            f"More than --max-failures {shard.max_failures} refused in this shard: exit status 3."
        )
    return "\n".join(lines)


def render_pack_summary(result, shown=10):
    """Return the human summary of a pack."""
    from .build.packing import COMPLETE, FINALIZED, RESUMED

    shards = result.manifest["shards"]
    totals = result.manifest["totals"]
    verb = {COMPLETE: "Already packed", FINALIZED: "Finalized"}.get(result.outcome, "Packed")
    lines = [
        f"{verb} {result.images:,} images into {len(shards)} shard"
        f"{'s' if len(shards) != 1 else ''} ({totals['rec_bytes'] / 1e6:,.1f} MB); "
        f"manifest {result.manifest_path}"
    ]
    if result.outcome == RESUMED:
        lines.append(f"Resumed after {result.resumed_from:,} list items done earlier.")
    elif result.outcome == COMPLETE:
        lines.append("Nothing to do: the pack was already complete, made the same way.")
    elif result.outcome == FINALIZED:
        noun = "shard" if len(shards) == 1 else "shards"
        lines.append(f"Checked {len(shards)} {noun} packed one by one and wrote the manifest.")
    if result.failures:
        noun = "image" if result.failures == 1 else "images"
        lines.append(f"Refused {result.failures:,} {noun} (all listed in {result.failures_path}):")
        lines += [f"  line {r.line}: {r.path}: {r.reason}" for r in result.refused[:shown]]
        if result.failures > shown:
            lines.append(f"  ... and {result.failures - shown:,} more")
        if not result.accepted:
            lines.append(f"More than --max-failures {result.max_failures} refused: exit status 3.")
    return "\n".join(lines)


def parse_extensions(ctx, param, value):
    """Return `--exts` values (comma-separated and/or repeated) as one tuple."""
    if not value:
        return DEFAULT_EXTENSIONS
    exts = tuple(e.strip() for text in value for e in text.split(","))
    if not all(e.strip(".") for e in exts):
        raise click.BadParameter(f"empty extension in {','.join(value)!r}")
    return exts


@cli.command("list")
@click.argument("root", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option(
    "--recursive/--no-recursive",
    default=True,
    show_default=True,
    help="Also list images in subfolders of an identity folder, with its label. "
    "--no-recursive skips (and counts) such subfolders.",
)
@click.option(
    "--exts",
    multiple=True,
    callback=parse_extensions,
    metavar="EXT[,EXT...]",
    help="Image extensions, case-insensitive, comma-separated or repeated.  "
    f"[default: {','.join(e.lstrip('.') for e in DEFAULT_EXTENSIONS)}]",
)
@click.option("--shuffle", is_flag=True, help="Shuffle the images (default: in order).")
@click.option(
    "--seed",
    type=Count(0),
    help="Seed of --shuffle (default: a random one, shown in the summary).",
)
@click.option(
    "--chunks",
    type=Count(1),
    default=1,
    show_default=True,
    help="Cut the images into N lists PREFIX_0.lst ... of nearly equal length.",
)
@click.option(
    "--train-ratio",
    type=Finite(0, 1),
    help="Fraction written to PREFIX_train.lst (default: what val and test leave).",
)
@click.option(
    "--val-ratio",
    type=Finite(0, 1),
    help="Fraction written to PREFIX_val.lst (default: what train and test leave).",
)
@click.option("--test-ratio", type=Finite(0, 1), help="Fraction written to PREFIX_test.lst.")
@click.option(
    "--split-by",
    type=click.Choice(["image", "identity"]),
    default="image",
    show_default=True,
    help="image: cut runs of images, as im2rec. identity: whole identities, so nobody is "
    "in two splits (the ratios then count identities).",
)
@click.option(
    "--min-per-id",
    type=Count(1),
    default=1,
    show_default=True,
    help="Skip identities with fewer images.",
)
@click.option(
    "--max-per-id",
    type=Count(1),
    help="Keep at most N images per identity (the first in path order).",
)
@click.option(
    "--threads",
    "-j",
    type=click.IntRange(1, 256),
    default=None,
    help="Folders read at once. Default: one at a time while folders list fast (a local or "
    "cached disk), 4 per CPU (at most 32) once they prove slow (a network file system).",
)
@click.option(
    "--labels",
    "labels",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the label map here. Default: PREFIX.labels.tsv beside OUT; "
    "with OUT - it is written only if this is given.",
)
@overwrite_option("Replace existing lists and label map (all or none are written).")
@click.option(
    "--allow-outside-root",
    is_flag=True,
    help="Follow symbolic links that lead out of ROOT (each folder is still listed once); "
    "by default they are skipped as outside-root.",
)
@quiet_option("No progress bar and no summary.")
@json_option("Print the summary as JSON: on stdout, or on stderr when OUT is -.")
@library_errors
def list_command(
    root, out, recursive, exts, shuffle, seed, chunks, train_ratio, val_ratio, test_ratio,
    split_by, min_per_id, max_per_id, threads, labels, allow_outside_root, overwrite, quiet,
    as_json,
):  # fmt: skip
    """List the images under ROOT, one identity per folder, into OUT (.lst, or - for stdout).

    Each first-level folder of ROOT is an identity. Labels 0, 1, ... go to identities in
    sorted folder-name order, so the same tree always gets the same labels. Lines are
    im2rec's `index<TAB>label<TAB>identity/file`, UTF-8, by identity then path unless
    --shuffle; indices run 0..N-1 in that order before any split, so they are unique across
    PREFIX_train/_val/_test.lst and PREFIX_0.lst ... chunks. The label map,
    `label<TAB>identity` per line, goes to PREFIX.labels.tsv beside OUT (see --labels).

    Passed over, counted by reason and summarised on stderr: files without an image
    extension, hidden files and folders (.name), files directly in ROOT, empty identity
    folders, unreadable folders, names a .lst line cannot hold (tab, newline, CR, not UTF-8,
    leading or trailing whitespace), broken links and special files, symlink loops and
    repeats, links that lead out of ROOT.

    Symbolic links are followed, to files and to folders, while they stay inside ROOT (see
    --allow-outside-root). Every folder is listed once: a linked folder that leads back to
    one of its own ancestors, or to a folder already listed, is skipped and counted, so a
    scan always ends.

    \b
    Example:
        rectool list faces/ faces.lst
        rectool list faces/ faces.lst --shuffle --seed 1 --val-ratio 0.05 --split-by identity
    """
    to_stdout = str(out) == "-"
    update, close = progress_bar(quiet or as_json, "folder")
    try:
        listing = list_images(
            root,
            click.open_file("-", "wb") if to_stdout else out,
            labels=labels,
            overwrite=overwrite,
            exts=exts,
            recursive=recursive,
            threads=threads,
            progress=update and (lambda folders, images: update(folders, None, 0)),
            allow_outside_root=allow_outside_root,
            shuffle=shuffle,
            seed=seed,
            chunks=chunks,
            train_ratio=train_ratio,
            val_ratio=val_ratio,
            test_ratio=test_ratio,
            split_by=split_by,
            min_per_id=min_per_id,
            max_per_id=max_per_id,
        )
    finally:
        close()
    seconds = _seconds(click.get_current_context())
    if as_json:
        # With OUT -, stdout carries the list: the summary goes to stderr.
        emit_json({**listing.summary(), "seconds": seconds}, err=to_stdout)
    elif not quiet:
        click.echo(render_list_summary(listing, seconds), err=True)


def _list_json_on_stderr(args):
    return "-" in args  # OUT - (no option of `list` takes - as its value)


list_command.json_on_stderr = _list_json_on_stderr


def render_list_summary(listing, seconds, shown=3):
    """Return the human summary of a listing: what was listed and written, what passed over."""

    def count(n, noun):
        return f"{n:,} {noun}{'' if n == 1 else 's'}"

    lines = [
        f"Listed {count(listing.image_count, 'image')} of "
        f"{count(len(listing.identities), 'identity').replace('ys', 'ies')} "
        f"({count(listing.folders, 'folder')} read in {seconds:.2f} s)."
    ]
    for suffix, path in listing.written.items():
        where = "stdout" if path == "-" else path
        lines.append(f"Wrote {where}: {count(len(listing.lists[suffix]), 'image')}.")
    if listing.label_map:
        lines.append(f"Wrote the label map {listing.label_map}.")
    if listing.seed is not None:
        lines.append(f"Shuffled with --seed {listing.seed}.")
    skipped = [(reason, paths) for reason, paths in listing.skipped.items() if paths]
    if skipped:
        lines.append("Passed over:")
    for reason, paths in skipped:
        examples = ", ".join(display_path(p) for p in paths[:shown])
        more = ", ..." if len(paths) > shown else ""
        lines.append(f"  {SKIP_REASONS[reason]}: {len(paths):,} ({examples}{more})")
    return "\n".join(lines)


# The largest side any image format rectool decodes can have (PNG's 2**31 - 1).
MAX_IMAGE_SIDE = 2**31 - 1


class ImageSize(click.ParamType):
    """An image size written as HEIGHTxWIDTH (`112x112`), or one number for a square."""

    name = "HxW"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = str(value).lower().split("x")
        if len(parts) == 1:
            parts = parts * 2
        if len(parts) != 2 or not all(
            p.strip().isdigit() and 0 < int(p) <= MAX_IMAGE_SIDE for p in parts
        ):
            self.fail(f"{value!r} is not HEIGHTxWIDTH (example: 112x112)", param, ctx)
        return int(parts[0]), int(parts[1])


def phase_progress(quiet):
    """Return (callback(phase, done, total), close): one tqdm bar per phase on stderr."""
    if quiet or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bars = {}

    def update(phase, done, total):
        bar = bars.get(phase)
        if bar is None:
            unit = "B" if phase == "bytes" else "img"
            bar = bars[phase] = tqdm(
                desc=phase, unit=unit, unit_scale=True, file=sys.stderr, position=len(bars)
            )
        bar.total = total
        bar.update(done - bar.n)

    def close():
        for bar in bars.values():
            bar.close()

    return update, close


@cli.command("verify")
@click.argument("targets", metavar="TARGET...", nargs=-1, required=True)
@click.option("--decode", is_flag=True, help="Also decode every image, on all cores.")
@click.option(
    "--size",
    type=ImageSize(),
    help="With --decode: every image must be HEIGHTxWIDTH pixels (e.g. 112x112).",
)
@click.option(
    "--channels", type=click.IntRange(1, 4), help="With --decode: every image's channel count."
)
@workers_option("Threads decoding images (--decode).")
@max_pixels_option(
    "With --decode: images whose header declares more pixels are problems (image-too-large), "
    "not decoded."
)
@click.option(
    "--max-problems",
    type=Count(0),
    default=20,
    show_default=True,
    help="Problems listed one by one in the summary; the rest are counted.",
)
@quiet_option("Print nothing; only the exit status tells.")
@json_option("Print the report as JSON on stdout.")
def verify_command(
    targets, decode, size, channels, workers, max_pixels, max_problems, quiet, as_json
):
    """Check that each TARGET (manifest, prefix, .rec files or train.rec folder) is sound.

    Checks the framing of every .rec from first byte to last (magic, lengths, continuation
    flags, zero padding, trailing bytes); the .idx against it (every offset a record start,
    every record indexed, unique keys); every image header (flag, labels integral and below
    the class count when it is known); the manifest's sizes, counts and digests (xxh3-128,
    SHA-256 when the pack has them) when there is one; each record's checksum (xxh3-64, or
    CRC-32 in packs of manifest version 1) when the shard has a .rec.crc (rectool packs write
    one); the insightface layout when record 0 announces it. --decode also decodes every
    image. Each problem is named with its file, record key and byte offset.

    Exit status: 0 sound, 1 problems found, 2 unreadable input or usage error.

    \b
    Example:
        rectool verify out/faces.manifest.json
        rectool verify faces_emore/train.rec --decode --size 112x112 --channels 3
        rectool verify out/faces --json > report.json
    """
    from .inspect.verify import DecodeOptions, verify_dataset

    if (size or channels) and not decode:
        raise click.BadParameter("needs --decode", param_hint="--size/--channels")
    options = DecodeOptions(size, channels, max_pixels) if decode else None
    update, close = phase_progress(quiet or as_json)
    try:
        report = verify_dataset(targets, decode=options, workers=workers, progress=update)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from exc
    except RectoolError as exc:
        # The input cannot be read at all: that is not a verdict on the data, so not 1.
        error = click.ClickException(str(exc))
        error.exit_code = 2
        raise error from exc
    finally:
        close()
    for prefix in report.finished:
        if not (quiet or as_json):
            click.echo(
                f"Finished replacing {prefix}: an interrupted run had committed the new pack "
                "but not moved all of it into place.",
                err=True,
            )
    exit_code = 0 if report.sound else 1
    if as_json:
        emit_json(report.to_json(), exit_code)
    elif not quiet:
        write_stream(render_verify_report(report, max_problems))  # the answer: stdout
    sys.exit(exit_code)


def render_verify_report(report, shown):
    """Return the human summary of a verification: one line of totals, then the problems."""
    from .format.digest import DIGEST_NAMES

    shards = len(report.shards)
    line = (
        f"Verified {', '.join(report.targets)}: {report.records:,} records "
        f"({report.images:,} images) in {shards} shard{'' if shards == 1 else 's'}, "
        f"{report.rec_bytes / 1e6:,.1f} MB, layout {', '.join(report.layouts)}"
    )
    if report.checksums:
        line += f"; {report.checksums} checksums compared ({', '.join(report.file_digests)})"
    if report.record_checksums:
        named = " or ".join(DIGEST_NAMES[a] for a in report.record_digests)
        line += f"; {report.record_checksums:,} records compared with their {named}"
    if report.decoded:
        line += f"; {report.decoded:,} images decoded"
    lines = [f"{line} ({report.seconds:.2f} s)."]
    if report.sound:
        lines.append("Sound: no problems found.")
        return "\n".join(lines)
    counts = ", ".join(f"{kind} {n:,}" for kind, n in sorted(report.counts.items()))
    noun = "problem" if report.problem_count == 1 else "problems"
    lines.append(f"Found {report.problem_count:,} {noun} ({counts}):")
    listed = report.problems[:shown]
    lines += [f"  {problem}" for problem in listed]
    if report.problem_count > len(listed):
        lines.append(f"  ... and {report.problem_count - len(listed):,} more")
    return "\n".join(lines)


@cli.command("reindex")
@click.argument("rec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--output",
    "-o",
    "idx",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the .idx (default: beside REC, same name).",
)
@click.option(
    "--keys",
    type=click.Choice(["header", "position"]),
    default="header",
    show_default=True,
    help="header: each record's header id (what rectool, im2rec and insightface write); "
    "position: 0, 1, 2, ... in file order.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing .idx.")
@quiet_option("No summary; only the exit status tells.")
@json_option("Print the result as JSON on stdout.")
@library_errors
def reindex_command(rec, idx, keys, overwrite, quiet, as_json):
    """Rebuild the .idx of REC by walking its records from first byte to last.

    Where REC is damaged the walk skips to the next record start (an aligned magic followed
    by continuation flag 0 or 1) and reports each skipped byte range; the .idx then lists
    every record that could be read. It is written to a temporary file and renamed. With a
    .rec.crc beside REC, records whose bytes differ from their checksum are listed as damaged.

    Exit status: 0 REC was sound, 1 damage was skipped or a record is damaged (the .idx is
    still written) or an error, 2 usage error.

    \b
    Example:
        rectool reindex faces_emore/train.rec --overwrite
        rectool reindex broken.rec -o recovered.idx
    """
    from .inspect.reindex import reindex

    result = reindex(rec, idx, keys=keys, overwrite=overwrite)
    exit_code = 0 if result.sound else 1
    if as_json:
        emit_json(result.to_json(), exit_code)
    elif not quiet:
        wrote, *findings = render_reindex_result(result).split("\n")
        click.echo(wrote, err=True)  # the work done: stderr
        if findings:
            write_stream("\n".join(findings))  # its findings, the answer: stdout
    sys.exit(exit_code)


def render_reindex_result(result, shown=20):
    """Return the human summary of a reindex."""
    source = "record headers" if result.keys_from == "header" else "record positions"
    lines = [f"Wrote {result.idx_path}: {result.records:,} records, keys from {source}."]
    if result.skipped:
        total = sum(d.end - d.start for d in result.skipped)
        n = len(result.skipped)
        lines.append(f"Skipped {n:,} damaged byte range{'' if n == 1 else 's'} ({total:,} bytes):")
        for d in result.skipped[:shown]:
            lines.append(
                f"  bytes {d.start}..{d.end} ({d.end - d.start:,} bytes): {d.kind}: {d.reason}"
            )
        if n > shown:
            lines.append(f"  ... and {n - shown:,} more")
    if result.unkeyed:
        n = len(result.unkeyed)
        lines.append(f"Left out {n:,} record{'' if n == 1 else 's'} without a key:")
        lines += [f"  byte offset {offset}: {reason}" for offset, reason in result.unkeyed[:shown]]
    if result.duplicates:
        n = len(result.duplicates)
        examples = ", ".join(f"{k} ({c} times)" for k, c in sorted(result.duplicates.items())[:5])
        lines.append(
            f"{n:,} {'key appears' if n == 1 else 'keys appear'} more than once: {examples}; "
            "readers keep the last (try --keys position)."
        )
    if result.checksum_problem:
        lines.append(f"Records not checked one by one: {result.checksum_problem}")
    if result.damaged:
        n = len(result.damaged)
        lines.append(f"{n:,} damaged record{'' if n == 1 else 's'} (per {result.checksums}):")
        for offset, key, reason in result.damaged[:shown]:
            where = "" if key is None else f"key {key}, "
            lines.append(f"  {where}byte offset {offset}: {reason}")
        if n > shown:
            lines.append(f"  ... and {n - shown:,} more")
    return "\n".join(lines)


@cli.command("info")
@click.argument("target")
@click.option(
    "--sample",
    type=Count(0),
    default=200,
    show_default=True,
    help="Images decoded, spread over the dataset, for their dimensions.",
)
@max_pixels_option(
    "Sampled images whose header declares more pixels are counted as too large, not decoded."
)
@json_option("Print the description as JSON on stdout.")
@library_errors
def info_command(target, sample, max_pixels, as_json):
    """Describe TARGET (manifest, prefix, .rec or train.rec folder).

    Records, images, identities and images per identity (min / median / max and a small
    histogram), image payload sizes, encodings, dimensions of a sample, and the layout:
    images, or insightface (record 0 with flag 2 announces the identities); "label vectors"
    when images carry several labels each.

    \b
    Example:
        rectool info out/faces
        rectool info faces_emore/train.rec --json
    """
    from .inspect.info import dataset_info

    info = dataset_info(target, sample=sample, max_pixels=max_pixels)
    if as_json:
        emit_json(info.to_json())
    else:
        write_stream(render_info(info))  # the answer: stdout
    exit_for_damage(info)


def exit_for_damage(info):
    """Exit 1 (problems found) with one line on stderr when records could not be read."""
    damage = info.get("damage")
    if damage:
        n = damage["records"]
        click.echo(
            f"Error: {n:,} damaged record{'' if n == 1 else 's'} left out; {damage['advice']}",
            err=True,
        )
        sys.exit(1)


def render_info(info, width=40):
    """Return the human description of a dataset."""
    shards = info["shards"]
    lines = [
        f"{info['target']}: layout {info['layout']}"
        f"{', label vectors' if info.get('label_vectors') else ''}, "
        f"{shards} shard{'' if shards == 1 else 's'}, "
        f"{info['records']:,} records, {info['images']:,} images, "
        f"{info['rec_bytes'] / 1e6:,.1f} MB"
    ]
    per = info.get("images_per_identity")
    if info.get("identities") is None:
        lines.append("Identities: labels are not integral class ids")
    else:
        classes = info.get("classes")
        of = f" (of {classes} classes)" if classes is not None else ""
        lines.append(f"Identities: {info['identities']:,}{of}")
    if per:
        lines.append(
            f"Images per identity: min {per['min']:,}, median {per['median']:g}, max {per['max']:,}"
        )
        most = max(row["identities"] for row in per["histogram"])
        for row in per["histogram"]:
            bar = "#" * max(1, round(width * row["identities"] / most))
            lines.append(f"  {row['images']:>9} images: {row['identities']:>9,} {bar}")
    sizes = info["image_bytes"]
    if sizes:
        lines.append(
            f"Image bytes: min {sizes['min']:,}, median {sizes['median']:,.0f}, "
            f"mean {sizes['mean']:,.1f}, max {sizes['max']:,}"
        )
    if info["encodings"]:
        lines.append("Encodings: " + ", ".join(f"{k} {n:,}" for k, n in info["encodings"].items()))
    dims = info["dimensions"]
    if dims["sampled"] and dims["distinct"] <= len(dims["most_common"]):
        counts = ", ".join(f"{k} {n:,}" for k, n in dims["counts"].items())
        lines.append(f"Dimensions (HxWxC, sample of {dims['sampled']:,}): {counts}")
    elif dims["sampled"]:
        lines.append(
            f"Dimensions (sample of {dims['sampled']:,}): {dims['distinct']:,} different sizes"
            + (f", {dims['undecodable']:,} undecodable" if dims["undecodable"] else "")
            + (f", {dims['too_large']:,} over --max-pixels" if dims.get("too_large") else "")
        )
        for name in ("height", "width"):
            side = dims[name]
            lines.append(
                f"  {name}: min {side['min']:,}, median {side['median']:g}, max {side['max']:,}"
            )
        common = ", ".join(f"{row['size']} {row['images']:,}" for row in dims["most_common"])
        lines.append(f"  most common (HxWxC): {common}")
    damage = info.get("damage")
    if damage:
        n = damage["records"]
        lines.append(
            f"Damage: {n:,} record{' cannot' if n == 1 else 's cannot'} be read, left out of "
            f"the figures above; {damage['advice']}"
        )
        for d in damage["first"]:
            key = "" if d["key"] is None else f"key {d['key']}, "
            lines.append(f"  {d['file']}, {key}byte offset {d['offset']}: {d['reason']}")
        if n > len(damage["first"]):
            lines.append(f"  and {n - len(damage['first']):,} more")
    return "\n".join(lines)


@cli.command("unpack")
@click.argument("target")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted unpack: keep files that already hold their record's bytes.",
)
@quiet_option("No progress bar and no summary.")
@json_option("Print the summary as JSON on stdout.")
@library_errors
def unpack_command(target, out_dir, resume, quiet, as_json):
    """Write the images of TARGET back as an identity-per-folder tree under OUT_DIR.

    Each image becomes OUT_DIR/IDENTITY/KEY.EXT: IDENTITY is the folder name the manifest's
    label map gives the label (else the label), KEY the record's key, EXT from the image's
    signature (.bin when unknown). Bytes are written as stored, so a pass-through pack
    unpacks to identical files. Each file is written whole under a hidden name, then linked to
    its own; existing files are never overwritten (--resume keeps those that already hold
    their record's bytes). When a record differs from its checksum in the shard's .rec.crc,
    nothing is written and the error names it.

    \b
    Example:
        rectool unpack out/faces.manifest.json faces-again/
    """
    from .inspect.unpack import unpack_dataset

    update, close = progress_bar(quiet or as_json, "img")
    update, seen = _remember_progress(update)
    try:
        result = unpack_dataset(
            target, out_dir, progress=lambda done, total: update(done, total, 0), resume=resume
        )
    except KeyboardInterrupt as exc:
        close()
        status = interrupted_status(exc)
        word = "Terminated (SIGTERM)" if status == 143 else "Interrupted"
        total = f" of {seen['total']:,}" if seen["total"] is not None else ""
        raise CommandFailed(
            f"{word} after about {seen['done']:,}{total} images: the files written under "
            f"{out_dir} are whole.\nRun the same command with --resume to continue it.",
            status,
        ) from None
    finally:
        close()
    if as_json:
        emit_json(result.to_json())
    elif not quiet:
        kept = f", {result.kept:,} of them already there" if result.kept else ""
        click.echo(
            f"Unpacked {result.images:,} images{kept} of {result.identities:,} identities "
            f"({result.bytes / 1e6:,.1f} MB) into {result.out_dir}.",
            err=True,
        )


@cli.command("reader")
@click.option(
    "--output",
    "-o",
    default="-",
    show_default=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Where to write the module (- for stdout).",
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
def reader_command(output, training_module, recordio_module, overwrite, as_json):
    """Write the standalone reader module for training code (standard library + numpy).

    It is rectool's own reader (rectool/reader.py) copied verbatim under a header naming the
    rectool and format versions: open_dataset(), RecordDataset, decode_image(). It never
    writes a file. OpenCV is imported only to decode images. With --training,
    rectool/training.py instead: Loader and BatchDecoder (decoded batches through shared
    memory, size=, int64 labels, skip or replace bad samples), RankSampler, epoch_order(),
    prefetch(). The training guide in rectool's documentation shows them in use. With
    --recordio, rectool/recordio.py: MXNet 1.9.1's mxnet.recordio API (MXIndexedRecordIO,
    unpack, pack_img, ...) and imdecode(), for code that imports MXNet only for recordio.

    \b
    Example:
        rectool reader -o train/rectool_reader.py
        rectool reader --training -o train/rectool_training.py
        rectool reader --recordio -o train/recordio.py
        python -c "import rectool_reader as r; print(len(r.open_dataset('out/faces')))"
    """
    from .emit import emit_reader, reader_source

    if training_module and recordio_module:
        raise click.UsageError("--training and --recordio choose different modules: give one")
    if output == "-":
        if as_json:
            raise click.UsageError("--json needs --output FILE (with -o -, stdout is the module)")
        write_stream(reader_source(training_module, recordio_module), nl=False)
        return
    path = emit_reader(output, training_module, overwrite, recordio_module)
    what = "recordio" if recordio_module else "training" if training_module else "reader"
    if as_json:
        emit_json({what: os.fspath(path)})
        return
    click.echo(f"Wrote the {what} module {path}.", err=True)


@cli.command("index-cache")
@click.argument("target")
@json_option("Print the caches written as JSON on stdout.")
@library_errors
def index_cache_command(target, as_json):
    """Write the .idx sidecar cache (IDX.rtc) of every shard of TARGET.

    The reader never writes: it reads the cache when one matches its .idx (size, mtime,
    CRC-32) and otherwise parses the .idx text. `pack` writes the cache of large shards
    itself; use this for packs made by others (insightface's train.idx, im2rec's).

    \b
    Example:
        rectool index-cache faces_emore/
    """
    from .format.indexcache import write_index_caches

    paths = [os.fspath(p) for p in write_index_caches(target)]
    if as_json:
        emit_json({"caches": paths})
        return
    for path in paths:
        click.echo(f"Wrote {path}.", err=True)


@cli.command("dali-index")
@click.argument("target")
@click.argument("output", type=click.Path(dir_okay=False))
@overwrite_option("Replace an existing file at OUTPUT (never a file of a pack).")
@json_option("Print the index and the .rec paths as JSON on stdout.")
@library_errors
def dali_index_command(target, output, overwrite, as_json):
    """Write the one .idx that DALI's fn.readers.mxnet needs for TARGET's shards.

    DALI reads its .rec files as one stream, so OUTPUT holds offsets counted from the start
    of the first file. The .rec paths to pass to DALI, in order, are printed on stdout. The
    insightface layout is refused (DALI reads every record as a sample).

    \b
    Example:
        rectool dali-index out/faces.manifest.json out/faces.dali.idx
    """
    from .inspect.dali import write_dali_index

    recs = [os.fspath(rec) for rec in write_dali_index(target, output, overwrite)]
    if as_json:
        emit_json({"idx": output, "recs": recs})
        return
    for rec in recs:
        write_stream(rec)  # data: the paths to pass to DALI


@cli.command("bench")
@click.argument("target")
@click.option(
    "--samples",
    type=Count(1),
    default=5000,
    show_default=True,
    help="Samples read in each phase (at most).",
)
@click.option(
    "--seconds",
    type=Finite(0.1, MAX_SECONDS),
    default=10.0,
    show_default=True,
    help="Time limit of each phase.",
)
@workers_option("Processes decoding in parallel in the last phase.")
@click.option(
    "--decode",
    type=click.Choice(["rgb", "bgr", "gray"]),
    default="rgb",
    show_default=True,
    help="Decoded format, as the reader's open_dataset(decode=...).",
)
@max_pixels_option("Refuse images whose header declares more pixels, as open_dataset does.")
@json_option("Print the report as JSON.")
@library_errors
def bench_command(target, samples, seconds, workers, decode, max_pixels, as_json):
    """Measure how fast TARGET reads, the way training will read it.

    TARGET is a manifest, a prefix, a .rec file or an insightface folder. Reports the time
    to open, raw records/s and MB/s in file order and random order (storage), and decoded
    images/s in one process and in --workers processes (CPU): compare the last figure with
    the images/s your training step consumes to see which side is the bottleneck.

    \b
    Example:
        rectool bench out/faces.manifest.json --workers 8
    """
    from .inspect.bench import bench_dataset

    def announce(name):
        if not as_json and sys.stderr.isatty():
            click.echo(f"measuring: {name} ...", err=True)

    report = bench_dataset(
        target, samples, seconds, workers, decode, progress=announce, max_pixels=max_pixels
    )
    if as_json:
        emit_json(report.to_json())
        return
    write_stream(render_bench_report(report))  # the answer: stdout


def render_bench_report(report):
    """Return the human table of a `BenchReport`."""
    lines = [
        f"{report.source}: {report.samples:,} samples ({report.layout} layout), "
        f"opened in {report.open_seconds * 1000:.1f} ms",
        f"  {'phase':<32} {'samples':>8} {'samples/s':>11} {'MB/s':>9}",
    ]
    for p in report.phases:
        lines.append(
            f"  {p.name:<32} {p.samples:>8,} {p.per_second:>11,.0f} {p.mb_per_second:>9,.1f}"
        )
    if report.phases:
        last = report.phases[-1]
        lines.append(
            f"Decoding gives {last.per_second:,.0f} images/s with {last.workers} process"
            f"{'es' if last.workers != 1 else ''}: a training step that consumes fewer is the "
            "bottleneck; one that consumes more needs more loader workers or GPU decoding."
        )
    return "\n".join(lines)


@cli.command("report")
@click.argument("target")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The HTML page to write (one self-contained file).",
)
@click.option(
    "--sheet",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also (or only) write the contact sheet as an image (.jpg or .png).",
)
@click.option(
    "--seed", type=SEED, default=0, show_default=True, help="Seed of the identities sampled."
)
@click.option(
    "--identities",
    type=Count(0),
    default=12,
    show_default=True,
    help="Identities sampled for the contact sheet.",
)
@click.option(
    "--per-identity",
    type=Count(1),
    default=8,
    show_default=True,
    help="Thumbnails shown per identity.",
)
@click.option(
    "--thumb",
    type=click.IntRange(16, 512),
    default=96,
    show_default=True,
    help="Thumbnail size in pixels (longest side).",
)
@click.option(
    "--sample",
    type=Count(0),
    default=200,
    show_default=True,
    help="Images decoded, spread over the dataset, for the dimensions chart.",
)
@click.option(
    "--max-bytes",
    type=ByteSize(),
    default="5MB",
    show_default=True,
    help="Page size limit: thumbnails beyond it are left out (and counted).",
)
@click.option(
    "--images-root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The folder the pack read, to show thumbnails of refused images.",
)
@click.option("--verify", is_flag=True, help="Verify the dataset too and show the result.")
@click.option("--decode", is_flag=True, help="With --verify: decode every image too.")
@overwrite_option("Replace an existing page or sheet (never a file of a pack).")
@max_pixels_option(
    "Images whose header declares more pixels get no thumbnail (and are not decoded)."
)
@json_option("Print what was written as JSON on stdout.")
@library_errors
def report_command(
    target, output, sheet, seed, identities, per_identity, thumb, sample, max_bytes,
    images_root, verify, decode, overwrite, max_pixels, as_json,
):  # fmt: skip
    """Write a report of TARGET (manifest, prefix, .rec or train.rec folder) as one HTML page.

    The page holds a summary (records, images, identities, bytes, shards, layout, encodings,
    the pack's options), charts of images per identity, image sizes and bytes, a contact sheet
    of a seeded sample of identities and the smallest and largest ones, the pack's refusals,
    and images stored byte for byte under several identities. It needs no network: thumbnails
    are inline JPEG, charts inline SVG. The same seed and data give the same page.

    \b
    Example:
        rectool report out/faces.manifest.json -o report.html --images-root faces/
        rectool report faces_emore/train.rec -o report.html --verify
        rectool report out/faces --sheet sheet.jpg
    """
    from .report.data import ReportOptions, write_report

    if output is None and sheet is None:
        raise click.UsageError("give --output/-o PAGE.html, --sheet IMAGE, or both")
    if decode and not verify:
        raise click.BadParameter("needs --verify", param_hint="--decode")
    settings = ReportOptions(
        seed=seed,
        identities=identities,
        per_identity=per_identity,
        thumb=thumb,
        sample=sample,
        max_bytes=max_bytes,
        verify=verify,
        decode=decode,
        images_root=None if images_root is None else os.fspath(images_root),
        max_pixels=max_pixels,
    )
    update, close = progress_bar(as_json, "thumb")
    progress = update and (lambda done, total: update(done, total, 0))
    try:
        result = write_report(target, output, sheet, settings, overwrite, progress)
    finally:
        close()
    report = result.report
    info = report.info
    if as_json:
        emit_json(
            {
                "html": None if result.html is None else os.fspath(result.html),
                "html_bytes": result.html_bytes if result.html else None,
                "sheet": None if result.sheet is None else os.fspath(result.sheet),
                "images": info["images"],
                "identities": info.get("identities"),
                "refusals": report.refusals.total,
                "images_under_several_identities": report.duplicates.across,
                "damage": info.get("damage"),
            }
        )
        exit_for_damage(info)
        return
    if result.html:
        click.echo(
            f"Wrote {result.html} ({result.html_bytes / 1e6:,.2f} MB): {info['images']:,} images, "
            f"{info.get('identities') or 0:,} identities, {report.refusals.total:,} refusals, "
            f"{report.duplicates.across:,} images under several identities.",
            err=True,
        )
    if result.sheet:
        click.echo(f"Wrote the contact sheet {result.sheet}.", err=True)
    exit_for_damage(info)


# -- repack ---------------------------------------------------------------------------------------


def transform_options(func):
    """--resize, --center-crop, --quality, --encoding, --color: re-encode as `rectool pack` does
    (the same options and help; `transform_from_options` turns them into a `Transform`)."""
    for option in reversed(
        [
            click.option(
                "--resize",
                type=Count(1),
                help="Re-encode with the shorter side resized to N pixels.",
            ),
            click.option(
                "--center-crop", is_flag=True, help="Re-encode, cropping the centre square first."
            ),
            click.option(
                "--quality",
                type=click.IntRange(0, 100),
                help="Re-encode: JPEG quality 1-100 (default 95) or PNG compression 0-9 "
                "(default 3).",
            ),
            click.option(
                "--encoding",
                type=click.Choice(ENCODINGS),
                help="Re-encode as JPEG or PNG (default .jpg).",
            ),
            click.option(
                "--color",
                type=click.Choice(["-1", "0", "1"]),
                help="Re-encode: 1 colour, 0 grayscale, -1 unchanged (default 1).",
            ),
        ]
    ):
        func = option(func)
    return func


@cli.command("repack")
@click.argument("paths", metavar="SOURCE... OUT_PREFIX", nargs=-1, required=True)
@click.option(
    "--labels-by",
    type=click.Choice(["offset", "name"]),
    default="offset",
    show_default=True,
    help="Merging: offset puts each source's labels after the previous source's; name gives "
    "identities of the same name one label (labels in name order, as `rectool list`).",
)
@click.option(
    "--keep-ids",
    type=click.Path(exists=True, dir_okay=False),
    help="Keep only these identities: a file of names or labels, one a line.",
)
@click.option(
    "--drop-ids",
    type=click.Path(exists=True, dir_okay=False),
    help="Drop these identities: a file of names or labels, one a line.",
)
@click.option("--min-per-id", type=Count(1), help="Drop identities with fewer images.")
@click.option("--max-per-id", type=Count(1), help="Keep at most N images of each identity.")
@click.option(
    "--pick",
    type=click.Choice(["first", "random"]),
    default="first",
    show_default=True,
    help="Which images --max-per-id keeps: the first in source order, or a seeded choice.",
)
@click.option(
    "--sample",
    type=Finite(0, 1, min_open=True),
    metavar="FRACTION",
    help="Keep a seeded fraction of the identities (or images, see --sample-by).",
)
@click.option(
    "--sample-by",
    type=click.Choice(["identities", "images"]),
    default="identities",
    show_default=True,
    help="What --sample draws.",
)
@click.option(
    "--seed",
    type=SEED,
    default=0,
    show_default=True,
    help="Seed of --order shuffle, --sample and --pick random.",
)
@click.option(
    "--keep-labels",
    is_flag=True,
    help="Keep the (merged) source labels instead of relabelling 0..C-1.",
)
@click.option(
    "--order",
    type=click.Choice(["identity", "source", "shuffle"]),
    default="identity",
    show_default=True,
    help="identity: grouped by label; source: as the sources hold them; shuffle: a seeded "
    "global shuffle (for readers that stream in file order, such as DALI's).",
)
@click.option(
    "--layout",
    type=click.Choice(LAYOUTS),
    default="images",
    show_default=True,
    help="images: only image records (what DALI and ImageRecordIter read). insightface: the "
    "face-dataset layout (header record 0, identity ranges, property file).",
)
@click.option(
    "--shard-size",
    type=ByteSize(),
    help="Roll over to a new shard before a shard's .rec passes this size (e.g. 512MB, 2GiB).",
)
@click.option("--shard-records", type=Count(1), help="Roll over to a new shard every N records.")
@click.option(
    "--dedupe",
    is_flag=True,
    help="Keep one copy of byte-identical images within an identity; report those shared "
    "across identities.",
)
@click.option(
    "--drop-overlap",
    metavar="TARGET",
    multiple=True,
    help="Remove images byte-identical to any image of TARGET: a dataset, or an insightface "
    "verification set such as lfw.bin (read without running the pickle). Repeatable.",
)
@transform_options
@workers_option("Worker threads re-encoding images.")
@max_pixels_option("Re-encoding: refuse images whose header declares more pixels, before decoding.")
@click.option(
    "--max-failures",
    type=Count(0),
    default=0,
    show_default=True,
    help="Images that fail to re-encode accepted before the exit status turns to 3.",
)
@click.option(
    "--sha256",
    is_flag=True,
    help="Give each file's SHA-256 in the manifest as well as its xxh3-128 (a content address "
    "for a published dataset; costs about 1 s a GB more).",
)
@click.option("--resume", is_flag=True, help="Continue an interrupted repack where it stopped.")
@click.option("--overwrite", is_flag=True, help="Replace an existing pack at OUT_PREFIX.")
@quiet_option("No progress bar and no summary.")
@json_option("Print the summary as JSON on stdout.")
@library_errors
def repack_command(paths, resize, center_crop, quality, encoding, color, resume, overwrite,
                   quiet, as_json, **options):  # fmt: skip
    """Repack the records of each SOURCE into a new pack at OUT_PREFIX, without the tree.

    A SOURCE is anything the reader opens: a manifest or pack prefix, an im2rec .rec (with
    its .idx), an insightface folder (train.rec, train.idx, property). Several are merged.
    Identities are filtered, then relabelled 0..C-1, then written in --order. Records are
    copied as bytes (only the label and key in the header change) unless a re-encoding option
    is given. Removed duplicates and overlap are listed in OUT_PREFIX.failures.jsonl; counts
    per identity in OUT_PREFIX.report.json; the label mapping in OUT_PREFIX.relabel.tsv.

    Exit status: 0 repacked, 1 error, 2 usage error, 3 repacked but more images failed to
    re-encode than --max-failures allows.

    \b
    Example:
        rectool repack faces_emore/ out/train --order shuffle --seed 1
        rectool repack a.manifest.json b.manifest.json out/ab --labels-by name
        rectool repack out/ab out/clean --dedupe --drop-overlap faces_emore/lfw.bin --min-per-id 2
    """
    from .build.images import transform_from_options
    from .repack.pipeline import RepackOptions, repack

    if len(paths) < 2:
        raise click.UsageError("give at least one SOURCE and the OUT_PREFIX")
    *sources, prefix = paths
    if options["keep_ids"] and options["drop_ids"]:
        raise click.BadParameter("give --keep-ids or --drop-ids, not both", param_hint="--keep-ids")
    repack_options = RepackOptions(
        labels_by=options["labels_by"],
        keep_ids=options["keep_ids"],
        drop_ids=options["drop_ids"],
        min_per_id=options["min_per_id"],
        max_per_id=options["max_per_id"],
        pick=options["pick"],
        sample=options["sample"],
        sample_by=options["sample_by"],
        seed=options["seed"],
        keep_labels=options["keep_labels"],
        order=options["order"],
        layout=options["layout"],
        shard_bytes=options["shard_size"],
        shard_records=options["shard_records"],
        dedupe=options["dedupe"],
        drop_overlap=tuple(options["drop_overlap"]),
        transform=transform_from_options(resize, center_crop, quality, encoding, color),
        workers=options["workers"],
        max_failures=options["max_failures"],
        max_pixels=options["max_pixels"],
        sha256=options["sha256"],
    )
    update, close = progress_bar(quiet or as_json, "rec")
    try:
        result = repack(
            sources, prefix, repack_options, resume=resume, overwrite=overwrite, progress=update
        )
    finally:
        close()
    if as_json:
        document = repack_summary(result)
        if not result.accepted:
            allowed = result.manifest["options"]["max_failures"]
            document["error"] = (
                f"more than --max-failures {allowed} refused ({result.report['refused']:,})"
            )
        emit_json(document, 0 if result.accepted else 3)
        return
    if not quiet:
        click.echo(render_repack_summary(result), err=True)
    if not result.accepted:
        sys.exit(3)


def repack_summary(result):
    """Return the JSON summary of a repack."""
    totals = result.manifest["totals"]
    return {
        "manifest": result.manifest_path,
        "shards": [
            os.path.join(os.path.dirname(result.manifest_path), s["rec"])
            for s in result.manifest["shards"]
        ],
        "images": result.images,
        "classes": result.classes,
        "records": totals["records"],
        "rec_bytes": totals["rec_bytes"],
        "steps": result.report["steps"],
        "removed": result.report["removed"],
        "refused": result.report["refused"],
        "shared_across_identities": result.report["shared_across_identities"]["groups"],
        "failures_file": result.failures_path,
        "report": result.report_path,
        "accepted": result.accepted,
        "resumed_from": result.resumed_from,
    }


def render_repack_summary(result):
    """Return the human summary of a repack."""
    report, shards = result.report, result.manifest["shards"]
    lines = [
        f"Repacked {result.images:,} images of {result.classes:,} identities into "
        f"{len(shards)} shard{'s' if len(shards) != 1 else ''} "
        f"({result.manifest['totals']['rec_bytes'] / 1e6:,.1f} MB); manifest {result.manifest_path}"
    ]
    if result.resumed_from:
        lines.append(f"Resumed after {result.resumed_from:,} records written earlier.")
    steps = {k: v for k, v in report["steps"].items() if k not in ("images", "identities")}
    dropped = [f"{name} {count:,}" for name, count in steps.items() if name != "source_images"]
    if dropped:
        lines.append(
            f"From {steps['source_images']:,} source images, removed: {', '.join(dropped)}."
        )
    removed = report["removed"]
    if removed["duplicate"] or removed["overlap"]:
        lines.append(
            f"Duplicates removed {removed['duplicate']:,}, overlap removed {removed['overlap']:,} "
            f"(listed in {result.failures_path}; per identity in {result.report_path})."
        )
    shared = report["shared_across_identities"]["groups"]
    if shared:
        lines.append(
            f"{shared:,} images are byte-identical across identities (label noise?): kept, "
            f"listed in {result.report_path}."
        )
    if report["refused"]:
        lines.append(f"{report['refused']:,} images failed to re-encode ({result.failures_path}).")
        if not result.accepted:
            allowed = result.manifest["options"]["max_failures"]
            lines.append(f"More than --max-failures {allowed} refused: exit status 3.")
    return "\n".join(lines)


def main():
    """Run the command line (the `rectool` console script)."""
    # SIGTERM (a job scheduler's stop, `kill`) cleans up and reports as Ctrl-C does.
    signal.signal(signal.SIGTERM, _on_sigterm)
    cli(prog_name="rectool")
