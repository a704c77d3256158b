"""End-to-end demo: a small face-like tree: list, pack, verify, report, emit the reader, read.

Run with `make demo` or `python -m rectool.demo OUT_DIR`. Every step is a real `rectool`
command, printed before it runs; the demo stops at the first step that fails.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np

from .doors.output import make_folders, remove_tree, write_atomic
from .format.paths import PackPaths
from .packer.listfile import label_map_path

IDENTITIES = ("ada", "grace", "hedy", "katherine", "margaret", "radia")
PER_IDENTITY = 8


def make_tree(root: Path) -> None:
    """Write 112x112 JPEGs in one folder per identity, plus two broken files to be refused."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:112, 0:112]
    for number, name in enumerate(IDENTITIES):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(PER_IDENTITY):
            base = np.stack([(x + 40 * number) % 256, (y * 2 + i * 9) % 256, (x + y) % 256], -1)
            image = np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)
            cv2.imwrite(str(folder / f"{i:03d}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    (root / "grace" / "empty.jpg").write_bytes(b"")
    good = (root / "hedy" / "000.jpg").read_bytes()
    (root / "hedy" / "cut-off.jpg").write_bytes(good[: len(good) // 2])


def step(*args: object, ok: tuple[int, ...] = (0,)) -> None:
    """Run one rectool command, echoing it; exit when its status is not in `ok`."""
    print(f"\n$ rectool {shlex.join(str(a) for a in args)}", flush=True)
    status = subprocess.run([sys.executable, "-m", "rectool", *map(str, args)]).returncode
    if status not in ok:
        sys.exit(f"demo failed: rectool {args[0]} exited with status {status}")


READ_BACK = """
import sys
sys.path.insert(0, sys.argv[1])
import rectool_reader  # the emitted file, not the rectool package
from rectool_reader import open_dataset
ds = open_dataset(sys.argv[2], decode="rgb")
labels = [int(label) for _, label in ds]
image, label = ds[0]
print(f"read {len(ds)} images with the emitted reader ({rectool_reader.__file__}):")
print(f"  first image {image.shape} {image.dtype}, label {label}")
print(f"  labels per identity: {[labels.count(k) for k in sorted(set(labels))]}")
"""


def activation_hint(
    executable: str | Path | None = None,
    prefix: str | None = None,
    base_prefix: str | None = None,
    cwd: str | Path | None = None,
) -> str:
    """Return the line that says where the `rectool` command is and how to put it on PATH."""
    executable = Path(executable or sys.executable)
    prefix = sys.prefix if prefix is None else prefix
    base_prefix = sys.base_prefix if base_prefix is None else base_prefix
    if prefix == base_prefix:  # not in a virtual environment: pip put it with this Python
        return f"the rectool command was installed beside {executable}"
    bin_dir = executable.parent
    try:
        bin_dir = bin_dir.relative_to(Path(cwd or Path.cwd()))
    except ValueError:
        pass
    return (
        f"the rectool command is {bin_dir / 'rectool'}: run `source {bin_dir / 'activate'}` "
        "to put it on your PATH"
    )


# The demo clears its folder before a run only when this file says the demo made it, and then
# only of what it writes there.
MARKER = ".rectool-demo"
DEMO_NAMES = {
    MARKER,
    "tree",
    "faces.lst",
    label_map_path("faces.lst"),  # faces.labels.tsv, `rectool list`'s label map
    "packed",
    "report.html",
    "rectool_reader.py",
    "__pycache__",  # importing the emitted reader from the folder leaves it
}


def fresh_folder(out: Path) -> None:
    """Make `out` an empty folder of the demo's: create it, take an empty one, or remove what
    an earlier run wrote into one marked as the demo's.

    Anything else is refused, never deleted: `python -m rectool.demo ~` must not remove a home
    folder, nor a later run files put beside the demo's since.
    """
    if not os.path.lexists(out):
        make_folders(os.fspath(out))
    elif out.is_symlink() or not out.is_dir():
        sys.exit(f"demo: {out} exists and is not a folder; give a new or empty folder")
    names = {path.name for path in out.iterdir()}
    marker = out / MARKER
    if MARKER in names and (marker.is_symlink() or not marker.is_file()):
        sys.exit(
            f"demo: {marker} is not the demo's mark (a link, or not a file); give a new folder"
        )
    if (names and MARKER not in names) or names - DEMO_NAMES:
        others = sorted(names - DEMO_NAMES) if MARKER in names else sorted(names)
        sys.exit(
            f"demo: {out} holds files the demo did not write ({', '.join(others[:3])}); give a "
            "new or empty folder (the demo removes what it wrote there before each run)"
        )
    for name in sorted(names - {MARKER}):
        remove_tree(os.fspath(out / name))  # a link is removed, never followed
    write_atomic(marker, "made by python -m rectool.demo\n")  # replaced, not written through


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "demo-out")
    fresh_folder(out)
    tree = out / "tree"
    make_tree(tree)
    print(f"generated {len(IDENTITIES) * PER_IDENTITY} images and 2 broken files under {tree}")
    step("list", tree, out / "faces.lst")
    pack = PackPaths.of(out / "packed" / "faces")
    manifest = Path(pack.manifest)
    step("pack", out / "faces.lst", tree, pack.prefix, "--max-failures", "2")
    step("verify", manifest)
    step("info", manifest)
    report = out / "report.html"
    step("report", manifest, "-o", report, "--images-root", tree)
    step("reader", "-o", out / "rectool_reader.py")
    print(f"\n$ python (import {out / 'rectool_reader.py'}, read every image)", flush=True)
    # The script imports the emitted file by path; -I keeps the working folder and PYTHON*
    # variables out of the way, so what runs is that file, not the package next to it.
    code = textwrap.dedent(READ_BACK)
    status = subprocess.run([sys.executable, "-I", "-c", code, str(out.resolve()), str(manifest)])
    if status.returncode:
        sys.exit("demo failed: the emitted reader could not read the pack")
    print("\ndemo complete: everything above ran for real; see", out)
    print(activation_hint())
    print(f"the dataset's report: {report.resolve()} (open it in a browser)")


if __name__ == "__main__":
    main()
