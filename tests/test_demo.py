"""`make demo`: what it tells a new user about the `rectool` command."""

from __future__ import annotations

from rectool.demo import activation_hint


def test_the_demo_says_where_rectool_is_and_how_to_activate_it(tmp_path):
    venv_python = tmp_path / "repo" / ".venv" / "bin" / "python"
    hint = activation_hint(venv_python, "/x/.venv", "/usr", cwd=tmp_path / "repo")
    assert hint == (
        "the rectool command is .venv/bin/rectool: run `source .venv/bin/activate` "
        "to put it on your PATH"
    )


def test_outside_the_working_folder_the_path_is_absolute(tmp_path):
    venv_python = tmp_path / "env" / "bin" / "python"
    hint = activation_hint(venv_python, "/x/env", "/usr", cwd=tmp_path / "elsewhere")
    assert hint.startswith(f"the rectool command is {tmp_path / 'env' / 'bin' / 'rectool'}: ")
