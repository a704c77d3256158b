"""docs/training.md: its complete training loop runs as written, on the emitted reader.

The script is taken from the guide itself (the block after `<!-- guide: train.py -->`), so
the guide cannot drift from what is tested. It runs on the CPU: one process, then two ranks
under torch.distributed.run with the gloo backend, then a stop and resume mid-epoch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree

from rectool.emit import emit_reader
from rectool.packer.packing import pack_images

pytest.importorskip("torch")

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "training.md"


def guide_script():
    text = GUIDE.read_text(encoding="utf-8")
    found = re.search(r"<!-- guide: train.py -->\n```python\n(.*?)```", text, re.S)
    assert found, "docs/training.md lost its train.py block"
    return found.group(1)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """train.py, rectool_reader.py, rectool_training.py, a pack of 3 identities x 8 images.

    Each identity has 7 images of 40x32 and one of another size: the loop must batch any tree.
    """
    folder = tmp_path_factory.mktemp("guide")
    (folder / "train.py").write_text(guide_script(), encoding="utf-8")
    emit_reader(folder / "rectool_reader.py")
    emit_reader(folder / "rectool_training.py", training_module=True)
    odd = [
        (f"{name}/odd.jpg", jpeg_bytes(90 + n, 50 + 30 * n, 120 - 20 * n), n)
        for n, name in enumerate(["ann", "bob", "cyd"])
    ]
    items = write_pack_tree(folder / "tree", ["ann", "bob", "cyd"], 7, extra=odd)
    lst = write_list(folder / "faces.lst", items)
    pack_images(lst, folder / "tree", folder / "out" / "faces")
    return folder


def train(workdir, *args, ranks=1):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(workdir)  # the emitted reader only: rectool is not needed
    launcher = [sys.executable]
    logs = Path(tempfile.mkdtemp(dir=workdir, prefix="ranks-"))
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        # Each rank's stdout to a file of its own: read from the launcher's one pipe, a rank's
        # line went missing once in a full test run.
        launcher += ["--redirects", "1", "--log-dir", str(logs)]
        env["GLOO_SOCKET_IFNAME"] = "lo"  # the ranks talk over the loopback interface only
    proc = subprocess.run(
        [*launcher, "train.py", "out/faces", "--batch-size", "4", *map(str, args)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    outputs = [proc.stdout] + [p.read_text() for p in sorted(logs.rglob("stdout.log"))]
    if ranks > 1:
        assert len(outputs) == 1 + ranks, (sorted(logs.rglob("*")), proc.stderr[-4000:])
    return sorted(
        line for text in outputs for line in text.splitlines() if line.startswith("rank ")
    )


def samples_per_epoch(lines):
    return [re.match(r"rank (\d+) epoch (\d+): (\d+) samples", line).groups() for line in lines]


def test_one_process_with_workers(workdir):
    lines = train(workdir, "--epochs", 2, "--workers", 2, "--checkpoint", "one.pt")
    assert samples_per_epoch(lines) == [("0", "0", "24"), ("0", "1", "24")]
    assert (workdir / "one.pt").exists()


def test_two_ranks_share_each_epoch(workdir):
    lines = train(workdir, "--epochs", 1, "--workers", 0, "--checkpoint", "two.pt", ranks=2)
    assert samples_per_epoch(lines) == [("0", "0", "12"), ("1", "0", "12")]


def test_stop_and_resume_mid_epoch(workdir):
    first = train(workdir, "--epochs", 1, "--workers", 2, "--max-steps", 2, "--checkpoint", "r.pt")
    assert first == ["rank 0 epoch 0: stopped after 8 samples"]
    rest = train(workdir, "--epochs", 2, "--workers", 2, "--checkpoint", "r.pt")
    assert samples_per_epoch(rest) == [("0", "0", "16"), ("0", "1", "24")]
