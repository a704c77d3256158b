"""Options several commands share, defined once (as pip-tools does), and their parameter
types: validation belongs in the type, so a bad value is a usage error naming the option."""

from __future__ import annotations

import functools
import os

import click
from click.core import ParameterSource

from ..choices import ENCODINGS


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
    from ..reader import DEFAULT_MAX_PIXELS

    return click.option(
        "--max-pixels",
        type=PixelCount(),
        default=f"{DEFAULT_MAX_PIXELS // 10**6}M",
        show_default=True,
        help=help + " E.g. 50M, 1.5G, 120000000.",
    )


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


class FailureLimit(click.ParamType):
    """--max-failures: a count (`0`, `12`) or a share of the images (`0.1%`), as the library's
    `max_failures` (an int, or a float from 0 to 1)."""

    name = "N|P%"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        try:
            if text.endswith("%"):
                share = float(text[:-1]) / 100
                if not 0 <= share <= 1:  # nan compares false: refused too
                    raise ValueError
                return share
            count = int(text)
            if not 0 <= count <= INT64_MAX:
                raise ValueError
            return count
        except ValueError:
            self.fail(f"{value!r} is not a count (12) or a percentage from 0% to 100% (0.1%)")


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
        from ..build.shards import parse_size

        try:
            size = parse_size(value)
        except ValueError:  # (also nan)
            self.fail(f"{value!r} is not a size (examples: 512MB, 2GiB, 1000000)", param, ctx)
        except OverflowError:  # inf, 1e400
            size = None
        if size is None or size > INT64_MAX:
            self.fail(f"{value!r} is too large: at most {INT64_MAX} bytes", param, ctx)
        return size


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


TRANSFORM_NAMES = ("resize", "center_crop", "quality", "encoding", "color")


def transform_of(values):
    """Return the `Transform` that the `transform_options` among `values` (a command's keyword
    arguments) ask for, or None; those five are taken out of `values`."""
    from ..build.images import transform_from_options  # here: only a command that runs

    return transform_from_options(**{name: values.pop(name) for name in TRANSFORM_NAMES})


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


def shard_options(func):
    """--shard-size and --shard-records: when pack and repack roll over to a new shard."""
    func = click.option(
        "--shard-records", type=Count(1), help="Roll over to a new shard every N records."
    )(func)
    return click.option(
        "--shard-size",
        type=ByteSize(),
        help="Roll over to a new shard before a shard's .rec passes this size (e.g. 512MB, 2GiB).",
    )(func)


def max_failures_option(images="the images"):
    """--max-failures N|P%: refusals accepted before pack's and repack's exit status turns 3."""
    return click.option(
        "--max-failures",
        type=FailureLimit(),
        default=0,
        show_default=True,
        help="Refused images accepted before the exit status turns to 3: a count, or a share of "
        f"{images} (0.1%).",
    )


def sha256_option(func):
    """--sha256: each file's SHA-256 in the manifest beside its xxh3-128."""
    return click.option(
        "--sha256",
        is_flag=True,
        help="Give each file's SHA-256 in the manifest as well as its xxh3-128 (a content address "
        "for a published dataset; costs about 1 s a GB more).",
    )(func)


def renamed_option(old, new, param, type=None):
    """Keep accepting `old`, the name an option had before it was unified across commands as
    `new` (whose value is the command's `param`): hidden from --help, it warns on stderr and
    gives its value to `param`. Giving both is a usage error."""
    dest = "renamed_" + param

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            value = kwargs.pop(dest)
            if value is not None:
                ctx = click.get_current_context()
                if ctx.get_parameter_source(param) is ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"give {new} or its old name {old}, not both")
                click.echo(f"Warning: {old} is now {new} (the same meaning); use {new}.", err=True)
                kwargs[param] = value
            return func(*args, **kwargs)

        return click.option(old, dest, type=type, default=None, hidden=True)(wrapper)

    return decorate
