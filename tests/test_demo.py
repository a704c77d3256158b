"""`make demo`: what it tells a new user about the `rectool` command."""

from __future__ import annotations

import pytest

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


def test_the_demo_never_empties_a_folder_it_did_not_make(tmp_path):
    from rectool.demo import fresh_folder

    home = tmp_path / "home"
    (home / "thesis").mkdir(parents=True)
    (home / "thesis" / "chapter1.tex").write_text("years of work")
    with pytest.raises(SystemExit, match="holds files the demo did not write"):
        fresh_folder(home)
    assert (home / "thesis" / "chapter1.tex").read_text() == "years of work"
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit, match="exists and is not a folder"):
        fresh_folder(tmp_path / "file")
    (tmp_path / "link").symlink_to(home)
    with pytest.raises(SystemExit, match="exists and is not a folder"):
        fresh_folder(tmp_path / "link")
    assert (home / "thesis" / "chapter1.tex").exists()


def test_the_demo_empties_its_own_folder_and_takes_an_empty_one(tmp_path):
    from rectool.demo import fresh_folder

    out = tmp_path / "demo-out"
    fresh_folder(out)
    (out / "tree").mkdir()
    fresh_folder(out)  # a second run: the demo's own folder, emptied
    assert [p.name for p in out.iterdir()] == [".rectool-demo"]
    empty = tmp_path / "empty"
    empty.mkdir()
    fresh_folder(empty)
    assert [p.name for p in empty.iterdir()] == [".rectool-demo"]


def test_the_demo_never_deletes_files_it_did_not_write_in_a_folder_it_took(tmp_path):
    from rectool.demo import fresh_folder

    project = tmp_path / "project"
    project.mkdir()
    fresh_folder(project)  # empty: taken (the demo did not make it)
    (project / "tree").mkdir()  # what the demo writes
    (project / "train.py").write_text("weeks of work")  # what the user wrote there since
    with pytest.raises(SystemExit, match=r"holds files the demo did not write \(train.py\)"):
        fresh_folder(project)
    assert (project / "train.py").read_text() == "weeks of work"
    assert (project / "tree").is_dir()


def test_the_demo_never_writes_through_a_marker_that_is_a_link(tmp_path):
    """A folder whose .rectool-demo is a link to a user's file (planted, or a dotfiles manager
    linking every dotfile): `fresh_folder` accepts it as the demo's and writes its marker text
    through the link, over the user's file."""
    from rectool.demo import MARKER, fresh_folder

    victim = tmp_path / "bashrc"
    victim.write_text("years of aliases")
    out = tmp_path / "demo"
    out.mkdir()
    (out / MARKER).symlink_to(victim)
    try:
        fresh_folder(out)
    except SystemExit:
        pass  # refused: fine
    assert victim.read_text() == "years of aliases"


def test_the_demo_refuses_a_marker_that_is_a_folder_with_a_message(tmp_path):
    """.rectool-demo a folder: an IsADirectoryError traceback instead of the demo's refusal."""
    from rectool.demo import MARKER, fresh_folder

    out = tmp_path / "demo"
    (out / MARKER).mkdir(parents=True)
    (out / MARKER / "notes.txt").write_text("mine")
    try:
        fresh_folder(out)
    except SystemExit:
        pass
    assert (out / MARKER / "notes.txt").read_text() == "mine"
