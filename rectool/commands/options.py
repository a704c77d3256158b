"""Options several commands share, defined once (as pip-tools does), and their parameter
types: validation belongs in the type, so a bad value is a usage error naming the option."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
from click.core import ParameterSource

from ..choices import ENCODINGS, LAYOUTS
from .paramtypes import SEED, ByteSize, Count, FailureLimit, PixelCount

if TYPE_CHECKING:
    from ..packer.images import Transform

ALL_CORES = os.cpu_count() or 1

# A command's function, decorated: each option keeps its type.
F = TypeVar("F", bound=Callable[..., Any])


def workers_option(
    help: str,
    type: click.ParamType | None = None,
    default: int | None = ALL_CORES,
    show_default: bool | str | None = "all cores",
) -> Callable[[F], F]:
    """--workers/-j N, default all cores; `help` says what the workers do."""
    return click.option(
        "--workers",
        "-j",
        type=type or Count(1),
        default=default,
        show_default=show_default,
        help=help,
    )


def quiet_option(help: str = "No progress bar and no summary.") -> Callable[[F], F]:
    """--quiet/-q."""
    return click.option("--quiet", "-q", is_flag=True, help=help)


def overwrite_option(help: str = "Replace an existing output file.") -> Callable[[F], F]:
    """--overwrite: without it no existing output is replaced (a pack's files never are)."""
    return click.option("--overwrite", is_flag=True, help=help)


def resume_option(help: str) -> Callable[[F], F]:
    """--resume: continue an interrupted run where it stopped."""
    return click.option("--resume", is_flag=True, help=help)


def allow_outside_root_option(help: str) -> Callable[[F], F]:
    """--allow-outside-root: take paths that leave ROOT (refused or skipped by default)."""
    return click.option("--allow-outside-root", is_flag=True, help=help)


def decode_option(help: str) -> Callable[[F], F]:
    """--decode: decode every image as well."""
    return click.option("--decode", is_flag=True, help=help)


def output_option(help: str, type: click.ParamType, *dest: str, **more: Any) -> Callable[[F], F]:
    """--output/-o PATH: where a command writes its one output file (`dest` renames it)."""
    return click.option("--output", "-o", *dest, type=type, help=help, **more)


def labels_option(help: str, dest: str, type: click.ParamType, **more: Any) -> Callable[[F], F]:
    """--labels FILE: the label map (label<TAB>identity) that list writes and pack reads."""
    return click.option("--labels", dest, type=type, help=help, **more)


def layout_option(help: str) -> Callable[[F], F]:
    """--layout images|insightface (default images): how a pack's records are laid out."""
    return click.option(
        "--layout", type=click.Choice(LAYOUTS), default="images", show_default=True, help=help
    )


def pack_label_option(help: str) -> Callable[[F], F]:
    """--pack-label: store each image's labels as a float32 vector (flag > 0), not a scalar."""
    return click.option("--pack-label", is_flag=True, help=help)


def check_option(modes: tuple[str, ...], help: str) -> Callable[[F], F]:
    """--check MODE (default structure): what each image is checked for before it is written."""
    return click.option(
        "--check", type=click.Choice(modes), default="structure", show_default=True, help=help
    )


def sample_option(help: str) -> Callable[[F], F]:
    """--sample N (default 200): images decoded, spread over the dataset."""
    return click.option("--sample", type=Count(0), default=200, show_default=True, help=help)


def seed_option(
    help: str, type: click.ParamType | None = None, default: int | None = 0
) -> Callable[[F], F]:
    """--seed N, default 0 (None: no default, the command picks one)."""
    shown: dict[str, Any] = {} if default is None else {"default": default, "show_default": True}
    return click.option("--seed", type=type or SEED, help=help, **shown)


def per_id_options(
    min_help: str, max_help: str, min_default: int | None = None
) -> Callable[[F], F]:
    """--min-per-id and --max-per-id N: identities kept by their count of images."""
    shown: dict[str, Any] = {}
    if min_default is not None:
        shown = {"default": min_default, "show_default": True}

    def decorate(func: F) -> F:
        func = click.option("--max-per-id", type=Count(1), help=max_help)(func)
        return click.option("--min-per-id", type=Count(1), help=min_help, **shown)(func)

    return decorate


def json_option(help: str = "Print the summary as JSON on stdout.") -> Callable[[F], F]:
    """--json, passed to the command as `as_json`."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def max_pixels_option(
    help: str = "Refuse images whose header declares more pixels, before decoding.",
) -> Callable[[F], F]:
    """--max-pixels N: the decode guard's budget (`reader.admit_image`), 50M by default."""
    from ..reader import DEFAULT_MAX_PIXELS

    return click.option(
        "--max-pixels",
        type=PixelCount(),
        default=f"{DEFAULT_MAX_PIXELS // 10**6}M",
        show_default=True,
        help=help + " E.g. 50M, 1.5G, 120000000.",
    )


TRANSFORM_NAMES = ("resize", "center_crop", "quality", "encoding", "color")


def transform_of(values: dict[str, Any]) -> Transform | None:
    """Return the `Transform` that the `transform_options` among `values` (a command's keyword
    arguments) ask for, or None; those five are taken out of `values`."""
    from ..packer.images import transform_from_options  # here: only a command that runs

    return transform_from_options(**{name: values.pop(name) for name in TRANSFORM_NAMES})


def transform_options(func: F) -> F:
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


def shard_options(func: F) -> F:
    """--shard-size and --shard-records: when pack and repack roll over to a new shard."""
    func = click.option(
        "--shard-records", type=Count(1), help="Roll over to a new shard every N records."
    )(func)
    return click.option(
        "--shard-size",
        type=ByteSize(),
        help="Roll over to a new shard before a shard's .rec passes this size (e.g. 512MB, 2GiB).",
    )(func)


def max_failures_option(images: str = "the images") -> Callable[[F], F]:
    """--max-failures N|P%: refusals accepted before pack's and repack's exit status turns 3."""
    return click.option(
        "--max-failures",
        type=FailureLimit(),
        default=0,
        show_default=True,
        help="Refused images accepted before the exit status turns to 3: a count, or a share of "
        f"{images} (0.1%).",
    )


def sha256_option(func: F) -> F:
    """--sha256: each file's SHA-256 in the manifest beside its xxh3-128."""
    return click.option(
        "--sha256",
        is_flag=True,
        help="Give each file's SHA-256 in the manifest as well as its xxh3-128 (a content address "
        "for a published dataset; costs about 1 s a GB more).",
    )(func)


def renamed_option(
    old: str, new: str, param: str, type: click.ParamType | None = None
) -> Callable[[F], F]:
    """Keep accepting `old`, the name an option had before it was unified across commands as
    `new` (whose value is the command's `param`): hidden from --help, it warns on stderr and
    gives its value to `param`. Giving both is a usage error."""
    dest = "renamed_" + param

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(dest)
            if value is not None:
                ctx = click.get_current_context()
                if ctx.get_parameter_source(param) is ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"give {new} or its old name {old}, not both")
                click.echo(f"Warning: {old} is now {new} (the same meaning); use {new}.", err=True)
                kwargs[param] = value
            return func(*args, **kwargs)

        return cast(F, click.option(old, dest, type=type, default=None, hidden=True)(wrapper))

    return decorate
