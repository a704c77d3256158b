"""The parameter types of rectool's options: validation belongs in the type, so a bad value
(nan, inf, a negative or huge number, a malformed size) is a usage error naming the option."""

from __future__ import annotations

from typing import Any

import click

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

    def __init__(self, min: int, max: int = INT64_MAX) -> None:
        super().__init__(min, max)

    def _describe_range(self) -> str:
        if self.max == INT64_MAX:
            return f"x>={self.min}"
        return super()._describe_range()


class FailureLimit(click.ParamType):
    """--max-failures: a count (`0`, `12`) or a share of the images (`0.1%`), as the library's
    `max_failures` (an int, or a float from 0 to 1)."""

    name = "N|P%"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | float:
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

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        number = super().convert(value, param, ctx)
        if number != number or number in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class ByteSize(click.ParamType):
    """A byte count written as `512MB`, `2GiB` or a plain number."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from ..packer.shards import parse_size

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

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, int]:
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


class PixelCount(click.ParamType):
    """A pixel count written as `50M`, `1.5G`, `250k` or a plain number (>= 1)."""

    name = "pixels"
    _SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
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


class LocalTarget(click.ParamType):
    """A dataset TARGET on this machine (manifest, prefix, .rec files, folder): a URL
    (s3://, https://) is refused, naming what to do instead, by a command that must read or
    name local files (DALI reads the .rec paths `dali-index` prints)."""

    name = "target"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from ..remote.store import is_url  # here: a local target needs none of remote/

        if is_url(value):
            command = f"`rectool {ctx.info_name}`" if ctx is not None else "this command"
            self.fail(
                f"{value}: URLs are not supported by {command}, which needs the pack's files on "
                "this machine; copy the pack's folder here (every file beside its manifest) "
                "and give the local manifest",
                param,
                ctx,
            )
        return str(value)


class SourceRoot(click.ParamType):
    """ROOT: an image tree (a folder), or an archive of one: a .tar, .tar.gz/.tgz or .zip
    file, or webdataset shards (a folder of .tar files, a glob, a {000..099} pattern)."""

    name = "root"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import os
        from pathlib import Path

        from ..archives.source import archive_kind
        from ..errors import InputError

        text = os.fspath(value)
        try:
            kind = archive_kind(text)
        except InputError as exc:
            self.fail(str(exc), param, ctx)
        if kind == "webdataset":
            return Path(text)
        if kind is not None:
            archive = click.Path(exists=True, dir_okay=False, path_type=Path)
            return archive.convert(value, param, ctx)
        archives = "an archive (.tar, .tar.gz, .tgz, .zip, webdataset shards)"
        if os.path.exists(text) and not os.path.isdir(text):  # a FIFO too: never walked
            what = "a file" if os.path.isfile(text) else "a special file (FIFO, socket, device)"
            self.fail(f"{text!r} is {what}, neither a folder nor {archives}", param, ctx)
        tree = click.Path(exists=True, file_okay=False, path_type=Path)
        return tree.convert(value, param, ctx)
