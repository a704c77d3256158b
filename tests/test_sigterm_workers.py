"""SIGTERM is an interruption of rectool itself, not of the worker processes it forks."""

import subprocess
import sys


def test_a_forked_worker_ends_quietly_on_sigterm_as_by_default():
    """A forked worker (a pool's process) inherits rectool's SIGTERM handler; there it must end
    the process as SIGTERM's default does (killed by the signal, no traceback), not raise the
    interruption meant for rectool itself (it printed a `Terminated` traceback per worker)."""
    probe = (
        "import os, signal\n"
        "from rectool.commands.conventions import watch_sigterm\n"
        "watch_sigterm()\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        # Python runs a handler between bytecodes, so a signal landing just before pause()
        # left it waiting forever (it hung CI once). The signal's own wakeup byte cannot be
        # missed: read it, and the handler runs before the next line.
        "    wake_r, wake_w = os.pipe()\n"
        "    os.set_blocking(wake_w, False)\n"
        "    signal.set_wakeup_fd(wake_w)\n"
        "    os.write(w, b'x')\n"  # running Python code: the signal is not lost in the fork
        "    os.read(wake_r, 1)\n"
        "    os._exit(0)\n"
        "os.read(r, 1)\n"
        "os.kill(pid, signal.SIGTERM)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert "Traceback" not in done.stderr


def test_bench_with_worker_processes_ends_them_and_prints_no_traceback(small_pack):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rectool",
            "bench",
            str(small_pack.manifest),
            "--seconds",
            "0.1",
            "--samples",
            "3",
            "-j",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
