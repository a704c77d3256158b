"""README's Quick start runs as written on a tree of mixed image sizes, without rectool.

The commands of its `sh` block run through `python -m rectool` in a fresh folder holding
faces/<identity>/<image> of five different sizes; then its `python` block runs in a process
where `import rectool` fails, on the two files those commands emitted. Both blocks are taken
from the README itself, so it cannot drift from what is tested.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.image_files import jpeg_bytes

README = Path(__file__).resolve().parents[1] / "README.md"
SIZES = [(120, 100), (60, 80), (112, 112), (300, 240), (90, 200)]  # height x width
IDENTITIES, PER_IDENTITY = ("ann", "bob", "cyd"), 5


def quick_start(language):
    """Return the first `language` block of the README's Quick start section."""
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Quick start\n(.*?)^## ", text, re.S | re.M)
    assert section, "README.md lost its Quick start section"
    block = re.search(rf"```{language}\n(.*?)```", section.group(1), re.S)
    assert block, f"README.md's Quick start lost its {language} block"
    return block.group(1)


# What the snippet leaves behind, checked after it ran: the last batch and the loader's counts.
CHECK = """
assert images.shape[1:] == (112, 112, 3) and str(images.dtype) == "uint8", images.shape
assert str(labels.dtype) == "int64", labels.dtype
assert loader.stats == {"batches": 2, "samples": 30, "skipped": 0, "replaced": 0}, loader.stats
assert "torch" not in sys.modules
print("ok")
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with faces/<identity>/<n>.jpg in five sizes, after the Quick start commands."""
    folder = tmp_path_factory.mktemp("readme")
    for i, name in enumerate(IDENTITIES):
        (folder / "faces" / name).mkdir(parents=True)
        for n in range(PER_IDENTITY):
            height, width = SIZES[(i + n) % len(SIZES)]
            (folder / "faces" / name / f"{n}.jpg").write_bytes(jpeg_bytes(n, height, width))
    env = {**os.environ, "PYTHONPATH": str(README.parent)}
    for line in quick_start("sh").splitlines():
        args = shlex.split(line, comments=True)
        assert args[0] == "rectool", line
        proc = subprocess.run(
            [sys.executable, "-m", "rectool", *args[1:]],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, f"{line}\n{proc.stdout}{proc.stderr}"
    return folder


def test_the_python_block_batches_a_mixed_size_tree(workdir):
    script = "import sys\nsys.modules['rectool'] = None\n" + quick_start("python") + CHECK
    (workdir / "quick_start.py").write_text(script, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(workdir)}  # the emitted files only
    proc = subprocess.run(
        [sys.executable, "quick_start.py"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr[-4000:]
