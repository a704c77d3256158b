"""Every shell and Python example in README.md and docs/*.md runs, as written, on generated data.

Conventions (the docs follow them; this test enforces them):

- A fence marked `sh`, `bash`, `console` or `python` is an example and runs. Output samples,
  synopses and file contents use a fence without one of those (`text`, `json`, or none).
- The examples of one page run in order, in one folder of their own, so a page reads as one
  runnable sequence: a later example may use what an earlier one wrote. The folder starts with
  what the page says the reader has (`SETUP` below): always `faces/<identity>/<image>.jpg`
  (3 identities x 4 JPEGs of 112x112), plus, per page, the packs it starts from.
- A shell example runs under `bash -euo pipefail` with `rectool` resolving to this checkout
  (in a `console` block, the lines after `$ `; the other lines are its output).
- A Python example runs as a script (`python example.py`, so a missing
  `if __name__ == "__main__":` guard fails as it would for a user), with the page's folder as
  the working directory and on the path (the emitted `rectool_reader.py` imports from there).
- `<!-- continues -->` on the line before a Python fence: the snippet goes on from the page's
  previous Python example, which runs first in the same script.
- `<!-- not-run: REASON -->` on the line before a fence (or before other comment lines just
  before it): the example is reported as skipped with
  that reason. Only for what needs a GPU, a cluster, or runs elsewhere in the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.image_files import jpeg_bytes

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
RUN = {"sh": "sh", "bash": "sh", "console": "sh", "python": "python"}
FENCE = re.compile(
    r"^(?:<!-- (?P<mark>not-run: (?P<reason>.+?)|continues) -->\n)?(?:<!--[^\n]*-->\n)*"
    r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```[ \t]*$",
    re.M | re.S,
)
IDENTITIES, PER_IDENTITY = ("ann", "bob", "cyd"), 4


@dataclass
class Example:
    page: Path
    number: int  # among the page's examples, from 1
    line: int
    lang: str
    code: str
    not_run: str | None
    continues: bool

    @property
    def id(self):
        return f"{self.page.name}:{self.line}"


def examples(page, text=None):
    text = page.read_text(encoding="utf-8") if text is None else text
    found = []
    for match in FENCE.finditer(text):
        lang = RUN.get(match["lang"])
        if lang is None:
            continue
        code = match["code"]
        if match["lang"] == "console":  # the commands are the `$ ` lines; the rest is output
            code = "".join(line[2:] for line in code.splitlines(True) if line.startswith("$ "))
        found.append(
            Example(
                page=page,
                number=len(found) + 1,
                line=text.count("\n", 0, match.start("lang")) + 1,
                lang=lang,
                code=code,
                not_run=match["reason"],
                continues=match["mark"] == "continues",
            )
        )
    return found


ALL = [example for page in PAGES for example in examples(page)]


# --- What each page says its reader has before its first example. ------------------------------


def rectool(folder, *args):
    from rectool.cli import cli

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        result = CliRunner().invoke(cli, list(args))
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, f"setup: rectool {' '.join(args)}\n{result.output}"


def faces_tree(folder):
    seed = 0
    for name in IDENTITIES:
        (folder / "faces" / name).mkdir(parents=True)
        for n in range(PER_IDENTITY):
            seed += 1
            (folder / "faces" / name / f"{n:03d}.jpg").write_bytes(jpeg_bytes(seed, 112, 112))


def listed(folder):
    rectool(folder, "list", "faces/", "faces.lst", "-q")


def packed(prefix, *options):
    def setup(folder):
        if not (folder / "faces.lst").exists():
            listed(folder)
        rectool(folder, "pack", "faces.lst", "faces/", prefix, "-q", *options)

    return setup


def insightface_download(name):
    """NAME/train.rec + train.idx, as insightface publishes them (no manifest)."""

    def setup(folder):
        packed(f"{name}-pack", "--layout", "insightface")(folder)
        (folder / name).mkdir()
        for ext in ("rec", "idx"):
            (folder / f"{name}-pack.{ext}").rename(folder / name / f"train.{ext}")

    return setup


def eval_sets(name, *sets):
    """NAME/SET.bin for each SET: insightface verification sets (a pickle of (images, issame)),
    each holding two of NAME/train.rec's images and two new ones, as a download ships them."""

    def setup(folder):
        import pickle

        from rectool.dataset.packs import open_dataset

        with open_dataset(folder / name) as ds:
            for k, set_name in enumerate(sets):
                images = [bytes(ds[2 * k][0]), jpeg_bytes(900 + k, 112, 112)]
                images += [bytes(ds[2 * k + 1][0]), jpeg_bytes(950 + k, 112, 112)]
                data = pickle.dumps((images, [False, False]), protocol=2)
                (folder / name / f"{set_name}.bin").write_bytes(data)

    return setup


SETUP = {
    "distributed.md": [listed],
    "format.md": [packed("out/faces")],
    "migration.md": [insightface_download("faces_emore")],
    "training.md": [packed("out/faces")],
    "verify.md": [
        packed("out/faces"),
        insightface_download("faces_emore"),
        packed("shard", "--shard-records", "5"),
    ],
    "repack.md": [
        insightface_download("faces_emore"),
        eval_sets("faces_emore", "lfw", "cfp_fp", "agedb_30"),
        packed("a/faces"),
        packed("b/faces"),
        packed("out/faces_train"),
    ],
}


# --- Running a page's examples in order. --------------------------------------------------------


class Page:
    """One page's folder and the examples run in it so far."""

    def __init__(self, page, folder):
        self.folder = folder
        self.examples = examples(page)
        self.done = {}  # number -> None (passed) or a failure message
        faces_tree(folder)
        for setup in SETUP.get(page.name, []):
            setup(folder)
        self.env = dict(os.environ)
        shims = folder / ".bin"
        shims.mkdir()
        shim = shims / "rectool"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rectool "$@"\n')
        shim.chmod(0o755)
        path = [str(shims), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
        self.env["PATH"] = os.pathsep.join(path)
        python_path = [str(folder), str(folder / "train"), str(REPO)]
        self.env["PYTHONPATH"] = os.pathsep.join(python_path)
        self.env["SLURM_ARRAY_TASK_ID"] = "0"  # the job-array script runs as task 0

    def script(self, example):
        code = example.code
        if example.continues:
            before = [e for e in self.examples if e.lang == "python" and e.number < example.number]
            assert before, f"{example.id}: `continues` but no Python example before it"
            code = self.script(before[-1]) + "\n" + code
        return code

    def run(self, example):
        for earlier in self.examples:
            if earlier.number >= example.number:
                break
            if earlier.not_run is None and earlier.number not in self.done:
                self.done[earlier.number] = self._run(earlier)
        if example.number not in self.done:
            self.done[example.number] = self._run(example)
        failed = [n for n in sorted(self.done) if n < example.number and self.done[n]]
        assert not failed, f"an earlier example of the page failed: {failed}"
        assert self.done[example.number] is None, self.done[example.number]

    def _run(self, example):
        if example.lang == "sh":
            command = ["bash", "-euo", "pipefail", "-c", example.code]
        else:
            path = self.folder / f".example-{example.number}.py"
            path.write_text(self.script(example), encoding="utf-8")
            command = [sys.executable, path.name]
        # The timeout only stops a hung example; no example comes near it.
        done = subprocess.run(
            command, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=600
        )
        if done.returncode == 0:
            return None
        return (
            f"{example.id} exited {done.returncode}\n--- code\n{example.code}"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    made = {}

    def page(path):
        if path not in made:
            made[path] = Page(path, tmp_path_factory.mktemp(path.stem.lower()))
        return made[path]

    return page


@pytest.mark.parametrize("example", ALL, ids=lambda e: e.id)
def test_example_runs(example, pages):
    if example.not_run:
        pytest.skip(example.not_run)
    pages(example.page).run(example)


def test_the_examples_are_found():
    pages = {e.page.name for e in ALL}
    assert {"README.md", "training.md", "distributed.md", "repack.md", "verify.md"} <= pages
    skipped = [e for e in ALL if e.not_run]
    assert len(skipped) <= len(ALL) // 3, "most examples must run"


def test_the_conventions_are_read():
    text = (
        "```sh\necho 1\n```\n<!-- not-run: needs a GPU -->\n```python\nx\n```\n"
        "<!-- continues -->\n```python\ny\n```\n```text\nout\n```\n```json\n{}\n```\n"
        "```console\n$ rectool info out/faces\nRecords: 12\n```\n"
    )
    found = [(e.lang, e.code, e.not_run, e.continues) for e in examples(REPO / "x.md", text)]
    assert found == [
        ("sh", "echo 1\n", None, False),
        ("python", "x\n", "needs a GPU", False),
        ("python", "y\n", None, True),
        ("sh", "rectool info out/faces\n", None, False),
    ]
