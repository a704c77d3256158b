"""A Loader's ring of batch slots leaves nothing in /dev/shm even when its process is killed
(SIGKILL, which runs no cleanup) while its spawn workers are starting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes

# The training process: a Loader with two spawn workers. An injected hook stops it right after
# the first worker process has started, the ring made and no worker ready yet, and says so on
# stdout: the moment the test kills it.
TRAINING = textwrap.dedent(
    """
    import multiprocessing.context, sys
    from rectool.reader import open_dataset
    from rectool.training import Loader

    start = multiprocessing.context.SpawnProcess.start

    def start_then_wait(process):
        start(process)
        print("worker started", flush=True)
        sys.stdin.read()  # until killed: the test never writes

    multiprocessing.context.SpawnProcess.start = start_then_wait
    if __name__ == "__main__":
        loader = Loader(open_dataset(sys.argv[1]), 4, workers=2, start_method="spawn")
        next(iter(loader))
    """
)


def _rings_of(pid):
    mine = f"rectool-loader-{pid}-"
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(mine))


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_a_parent_killed_while_spawn_workers_start_leaves_no_ring(tmp_path):
    items = [(n, jpeg_bytes(n, 40, 32), float(n)) for n in range(8)]
    write_pack(tmp_path / "faces", [items], index=True)
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path.cwd()), *sys.path]))
    child = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "faces")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:
        assert child.stdout.readline() == "worker started\n"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        # The worker holds the same stdout: end of file once it (and every worker) has exited.
        assert child.stdout.read() == ""
        assert _rings_of(child.pid) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stdin.close()
        for name in _rings_of(child.pid):  # what a failing run left: not for the next one
            os.unlink(os.path.join("/dev/shm", name))
