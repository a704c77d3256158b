"""The licence pyproject.toml declares is the one in LICENSE, and both the sdist and the wheel
carry that file."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_license_file_is_the_apache_license_pyproject_declares():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text


def test_sdist_and_wheel_carry_the_license(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "rectool", src / "rectool", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    built = []
    for hook in ("build_sdist", "build_wheel"):  # one process each: setuptools keeps state
        code = f"import sys; from setuptools import build_meta as b; print(b.{hook}(sys.argv[1]))"
        done = subprocess.run(
            [sys.executable, "-c", code, str(dist)], cwd=src, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        built.append(done.stdout.split()[-1])
    sdist, wheel = built
    with tarfile.open(dist / sdist) as tar:
        names = tar.getnames()
        assert f"{sdist.removesuffix('.tar.gz')}/LICENSE" in names
    with zipfile.ZipFile(dist / wheel) as whl:
        licences = [n for n in whl.namelist() if n.endswith("/LICENSE")]
        assert licences and all(".dist-info/" in n for n in licences)
        assert whl.read(licences[0]) == (REPO / "LICENSE").read_bytes()
        metadata = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        assert "License-Expression: Apache-2.0" in whl.read(metadata).decode()
