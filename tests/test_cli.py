"""The `rectool` group: version, help, errors, and what start-up imports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rectool import __version__
from rectool import cli as cli_module
from rectool.cli import cli
from rectool.packer.images import CHECK_MODES, ENCODINGS
from rectool.packer.packing import LAYOUTS


def test_version_and_help():
    runner = CliRunner()
    version = runner.invoke(cli, ["--version"])
    assert (version.exit_code, version.output) == (0, f"rectool, version {__version__}\n")
    helped = runner.invoke(cli, ["--help"])
    assert helped.exit_code == 0
    for command in ("list", "pack", "verify", "reindex", "info", "unpack", "reader"):
        assert f"  {command} " in helped.output


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command 'frobnicate'" in result.stderr


def test_cli_choices_are_the_library_constants_themselves():
    # One definition (rectool/choices.py, import-free), not two copies kept equal.
    assert cli_module.CHECK_MODES is CHECK_MODES
    assert cli_module.ENCODINGS is ENCODINGS
    assert cli_module.LAYOUTS is LAYOUTS


def test_start_up_does_not_import_numpy_opencv_tqdm_or_the_pipeline():
    probe = (
        "import sys, rectool.cli; "
        "print(sorted(m for m in ('numpy', 'cv2', 'tqdm', 'rectool.packer.packing', "
        "'rectool.packer.images') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_command_imports_its_own_module_only():
    # Each command's module is imported when it runs, not the other eleven (issue 22: the
    # start-up of every command counts against copy speed).
    probe = (
        "import sys; from rectool.cli import main; sys.argv = ['rectool', 'reader', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "shared = {'rectool.commands.conventions', 'rectool.commands.options', "
        "'rectool.commands.paramtypes'}\n"
        "print(sorted(m for m in sys.modules if m.startswith('rectool.commands.') "
        "and m not in shared), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stderr.strip() == "['rectool.commands.reader']"


@pytest.mark.parametrize("argv", [["--version"], ["info", "/nonexistent/pack"]])
def test_the_command_line_freezes_what_it_made_before_the_exit(argv):
    # Interpreter teardown then skips those objects in its last collections (29-34 ms of a
    # repack's exit, 8.5 ms frozen); an error's exit too. Exit handlers still run after it.
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, file=sys.stderr))\n"
        f"sys.argv = ['rectool', *{argv!r}]\n"
        "from rectool.cli import main\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == (0 if argv == ["--version"] else 2), out.stderr
    assert out.stderr.endswith("frozen True\n"), out.stderr


def test_the_group_lists_every_command_module():
    folder = Path(cli_module.__file__).parent / "commands"
    modules = {
        p.stem for p in folder.glob("*.py") if re.search(r"^def \w+_command\(", p.read_text(), re.M)
    }
    assert set(cli_module.COMMANDS.values()) == modules
    assert cli.list_commands(None) == sorted(cli_module.COMMANDS)
    assert all(cli.get_command(None, name).name == name for name in cli_module.COMMANDS)


def test_package_exports_resolve():
    import rectool

    for name in rectool.__all__:
        assert getattr(rectool, name) is not None
    # The package's open_dataset takes every source; the core's (the emitted reader's) only a
    # format-3 pack, and the package's dataset is the core's class.
    assert rectool.open_dataset.__module__ == "rectool.dataset.packs"
    assert rectool.RecordDataset.__module__ == "rectool.reader"
    assert issubclass(rectool.PackDataset, rectool.RecordDataset)


def test_the_command_line_starts_numpy_with_one_blas_thread_unless_told_otherwise():
    # OpenBLAS threads, one per core, spin as numpy is imported; no command does linear algebra.
    show = "import os, rectool.cli, numpy; print(os.environ.get('OPENBLAS_NUM_THREADS'))"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    run = [sys.executable, "-c", show]
    assert subprocess.run(run, env=env, capture_output=True, text=True).stdout.strip() == "1"
    told = {**env, "OPENBLAS_NUM_THREADS": "2"}
    assert subprocess.run(run, env=told, capture_output=True, text=True).stdout.strip() == "2"


# Modules only a remote pack needs: the download and dataset code, HTTP and TLS.
REMOTE_ONLY = (
    "rectool.remote.cache",
    "rectool.remote.dataset",
    "rectool.remote.fetch",
    "rectool.remote.order",
    "rectool.training",
    "http.client",
    "urllib.request",
    "ssl",
)


def _imported_by(args, cwd):
    probe = (
        "import atexit, runpy, sys\n"
        f"atexit.register(lambda: print(sorted(m for m in sys.modules if m in {REMOTE_ONLY!r}),"
        " file=sys.stderr))\n"
        f"sys.argv = ['rectool', *{list(map(str, args))!r}]\n"
        "runpy.run_module('rectool', run_name='__main__')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(cli_module.__file__).parent.parent)}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=cwd, env=env
    )
    assert out.returncode == 0, out.stderr
    return out.stderr.strip().splitlines()[-1]


def test_pack_and_repack_of_local_paths_import_no_remote_code(small_tree, small_pack, tmp_path):
    # Start-up counts against cp and tar (issue 22): a local pack or repack asks `is_url` and
    # goes no further into the remote folder (~15 ms of imports: the dataset code, the
    # emitted training module, http.client, urllib.request, ssl).
    pack = ["pack", small_tree.list_path, small_tree.root, tmp_path / "p" / "faces", "-q"]
    assert _imported_by(pack, tmp_path) == "[]"
    repack = ["repack", small_pack.manifest, tmp_path / "r" / "faces", "-q"]
    assert _imported_by(repack, tmp_path) == "[]"
