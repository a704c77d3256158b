"""Every error rectool defines is reachable from `rectool.errors`, the one place callers import
errors from, under its own name."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import rectool.errors as errors
from rectool.errors import RectoolError

PACKAGE = Path(__file__).resolve().parent.parent / "rectool"
# Standalone modules, each with its own copy of the base class (they import nothing of rectool).
STANDALONE = {"training.py", "recordio.py"}


def _module_names():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in STANDALONE or rel.endswith("__main__.py"):
            continue
        parts = ["rectool", *rel[: -len(".py")].split("/")]
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts)


def defined_errors():
    """Return {name: class} of every RectoolError subclass defined in the package."""
    found = {}
    for name in _module_names():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, RectoolError)
                and value.__module__ == name
                and not attr.startswith("_")
            ):
                found[attr] = value
    return found


def test_the_sweep_finds_errors_defined_outside_errors_py():
    found = defined_errors()
    assert {"RemoteError", "ListFormatError", "ImageRefused", "ChecksumFileError"} <= set(found)
    assert found["RectoolError"].__module__ == "rectool.reader"


@pytest.mark.parametrize("name", sorted(defined_errors()))
def test_every_error_is_importable_from_errors(name):
    cls = defined_errors()[name]
    assert name in errors.__all__, f"{cls.__module__}.{name} is not listed in rectool.errors"
    assert getattr(errors, name) is cls
    assert name in dir(errors)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchError'"):
        errors.NoSuchError  # noqa: B018
