"""The optional extras: which module each installs, and the one line that says how.

    pip install 'rectool[remote]'   # obstore: s3://, gs://, az://
    pip install 'rectool[dask]'     # dask.distributed: pack --executor dask

A command that needs a module an extra installs fails with `MissingExtraError` (exit 2, one
line) wherever the import happens: the command line turns an `ImportError` of such a module
into it (`missing_extra`), so no command shows a `ModuleNotFoundError` traceback.
"""

from __future__ import annotations

from pathlib import Path

from .reader import RectoolError

# The top-level module -> (the extra that installs it, what needs it).
EXTRAS = {
    "obstore": ("remote", "s3://, gs:// and az:// URLs need obstore"),
    "dask": ("dask", "--executor dask needs Dask"),
    "distributed": ("dask", "--executor dask needs Dask"),
}


class MissingExtraError(RectoolError):
    """A module an optional extra installs is not installed: names the `pip install` that
    adds it. The command line reports it in one line, exit 2."""


def in_checkout() -> bool:
    """Return whether rectool runs from a source tree (a checkout, an editable install), where
    `pip install -e '.[EXTRA]'` is the way to add an extra."""
    return (Path(__file__).resolve().parent.parent / "pyproject.toml").is_file()


def install_hint(extra: str) -> str:
    """Return how to install `extra`: from an index, and from a checkout when rectool runs
    from one (rectool need not be on an index: then only the checkout's form works)."""
    hint = f"pip install 'rectool[{extra}]'"
    if in_checkout():
        hint += f" from an index, or from a checkout of rectool: pip install -e '.[{extra}]'"
    return hint


def missing_module(module: str) -> MissingExtraError:
    """Return the error for `module` (a key of `EXTRAS`) not installed."""
    extra, needs = EXTRAS[module]
    return MissingExtraError(f"{needs}, which is not installed: {install_hint(extra)}")


def missing_extra(exc: ImportError) -> MissingExtraError | None:
    """Return the `MissingExtraError` that `exc` means when it is the import of a module an
    extra installs, else None."""
    name = (exc.name or "").split(".", 1)[0]
    return missing_module(name) if name in EXTRAS else None
