"""The output convention every command keeps: human text on stderr, data on stdout, and with
--json exactly one JSON document on stdout (a result with `seconds`, or `error` and `exit`)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree
from helpers.rec_files import make_pack

from rectool.cli import cli
from rectool.commands.conventions import RectoolCommand


@pytest.fixture
def world(tmp_path):
    """A tree with its list, a sound pack of another tree, and a tree without images."""
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["ann", "bob"], 2)
    lst = write_list(tmp_path / "faces.lst", items)
    pack = make_pack(tmp_path / "packed")
    (tmp_path / "no-images" / "ann").mkdir(parents=True)
    (tmp_path / "no-images" / "ann" / "notes.txt").write_text("x")
    return {
        "root": root,
        "lst": lst,
        "manifest": pack.manifest,
        "rec": pack.rec,
        "tmp": tmp_path,
    }


def args_for(command, world, case):
    """Return the command line of `command` for `case`: ok, library (error) or usage (error)."""
    t, m = world["tmp"], world["manifest"]
    table = {
        "list": {
            "ok": [world["root"], t / "out.lst"],
            "library": [t / "no-images", t / "x.lst"],
            "usage": [world["root"], t / "x.lst", "--seed", "3"],
        },
        "pack": {
            "ok": [world["lst"], world["root"], t / "out" / "p"],
            "library": [t / "none.lst", world["root"], t / "out" / "q"],
            "usage": [world["lst"], world["root"], t / "out" / "q", "--quality", "0"],
        },
        "verify": {
            "ok": [m],
            "library": [t / "nothing"],
            "usage": [m, "--size", "10x10"],
        },
        "reindex": {
            "ok": [world["rec"], "-o", t / "again.idx"],
            "library": [world["rec"]],  # its .idx exists: needs --overwrite
            "usage": [world["rec"], "--keys", "nonsense"],
        },
        "info": {
            "ok": [m, "--sample", "2"],
            "library": [t / "nothing"],
            "usage": [m, "--sample", "-1"],
        },
        "unpack": {
            "ok": [m, t / "unpacked"],
            "library": [t / "nothing", t / "unpacked"],
            "usage": [m],
        },
        "reader": {
            "ok": ["-o", t / "reader_copy.py"],
            "library": ["-o", world["rec"]],  # a pack's shard: never replaced
            "usage": [],  # -o - with --json: stdout would be the module
        },
        "bench": {
            "ok": [m, "--samples", "2", "--seconds", "0.1", "--workers", "1"],
            "library": [t / "nothing"],
            "usage": [m, "--decode", "cmyk"],
        },
        "report": {
            "ok": [m, "--sheet", t / "sheet.jpg"],
            "library": [t / "nothing", "-o", t / "page.html"],
            "usage": [m],  # neither --output nor --sheet
        },
        "index": {
            "ok": [m, "--force"],
            "library": [t / "nothing"],
            "usage": [],  # no TARGET
        },
    }
    return [str(a) for a in [command, *table[command][case]]]


COMMANDS = [
    "list",
    "pack",
    "verify",
    "reindex",
    "info",
    "unpack",
    "reader",
    "bench",
    "report",
    "index",
]
# The "library" case of these commands is an input that does not exist: unusable input, 2.
UNUSABLE_INPUT = {"pack", "verify", "info", "unpack", "bench", "report", "index"}
EXIT_OF = {
    command: {"library": 2 if command in UNUSABLE_INPUT else 1, "usage": 2} for command in COMMANDS
}
# Commands whose answer is their output (stdout); the others report work done (stderr).
# (reindex's findings go to stdout too, when it has some: tests/test_reindex.py.)
ANSWERS = {"verify", "info", "bench"}


def invoke(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def one_document(text):
    """Return the one JSON document `text` holds (json.loads refuses anything more)."""
    return json.loads(text)


@pytest.mark.parametrize("command", COMMANDS)
def test_json_success_is_one_document_with_seconds(world, command):
    result = invoke([*args_for(command, world, "ok"), "--json"])
    assert result.exit_code == 0, result.output
    document = one_document(result.stdout)
    assert isinstance(document["seconds"], float | int) and document["seconds"] >= 0
    assert "error" not in document
    assert result.stderr == ""


@pytest.mark.parametrize("case", ["library", "usage"])
@pytest.mark.parametrize("command", COMMANDS)
def test_json_errors_are_one_document_with_error_and_exit(world, command, case):
    result = invoke([*args_for(command, world, case), "--json"])
    expected = EXIT_OF[command][case]
    assert result.exit_code == expected, result.output
    document = one_document(result.stdout)
    assert document["exit"] == expected
    assert isinstance(document["error"], str) and document["error"]
    assert "Usage:" not in document["error"] and "Traceback" not in result.output
    assert document["seconds"] >= 0
    assert result.stderr == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_an_answer_goes_to_stdout_and_a_summary_of_work_to_stderr(world, command):
    result = invoke(args_for(command, world, "ok"))
    assert result.exit_code == 0, result.output
    answer, summary = (result.stdout, result.stderr)
    if command not in ANSWERS:
        answer, summary = summary, answer
    assert answer.strip()
    assert summary == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_errors_without_json_go_to_stderr(world, command):
    result = invoke(args_for(command, world, "library"))
    assert result.exit_code == EXIT_OF[command]["library"]
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ")


@pytest.mark.parametrize("name", sorted(cli.load_all()))
def test_every_command_keeps_the_convention_even_on_click_parse_errors(name):
    command = cli.load_all()[name]
    assert isinstance(command, RectoolCommand)
    assert "--json" in {opt for p in command.params for opt in p.opts}, f"{name} has no --json"
    for args in (["--json", "--no-such-option"], ["--json"]):
        result = invoke([name, *args])
        if result.exit_code == 0:  # a command whose every argument is optional
            continue
        assert result.exit_code == 2, result.output
        document = one_document(result.stdout)
        assert document["exit"] == 2
        assert document["error"].startswith(("No such option", "Missing", "--json needs"))
        assert result.stderr == ""


def test_a_missing_argument_reads_as_clicks_own_message():
    result = invoke(["info", "--json"])
    assert one_document(result.stdout)["error"] == "Missing argument 'TARGET'."


def test_json_after_double_dash_is_not_the_flag(world):
    result = invoke(["info", "--", "--json"])
    assert result.exit_code == 2  # no dataset named "--json": an unusable input
    assert result.stdout == ""
    assert result.stderr.startswith("Error: --json")


def test_pack_exit_3_is_the_summary_with_error_and_exit(world):
    root, t = world["root"], world["tmp"]
    (root / "bob" / "empty.jpg").write_bytes(b"")
    lst = write_list(t / "bad.lst", [(0, 0, "ann/000.jpg"), (1, 1, "bob/empty.jpg")])
    result = invoke(["pack", str(lst), str(root), str(t / "three"), "--json"])
    assert result.exit_code == 3
    document = one_document(result.stdout)
    assert (document["exit"], document["images"], document["failures"]) == (3, 1, 1)
    assert document["error"] == "more than --max-failures 0 refused (1)"
    assert document["seconds"] >= 0


def test_ctrl_c_is_one_document_with_exit_130(world, monkeypatch):
    import rectool.packer.packing

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rectool.packer.packing, "pack_images", interrupted)
    args = args_for("pack", world, "ok")
    result = invoke([*args, "--json"])
    assert result.exit_code == 130
    document = one_document(result.stdout)
    assert document["exit"] == 130
    assert document["error"].startswith("Interrupted after 0 list items")
    human = invoke(args)
    assert (human.exit_code, human.stdout) == (130, "")
    assert human.stderr.startswith("Interrupted after 0 list items")


def test_list_to_stdout_keeps_stdout_for_the_list_and_json_on_stderr(world):
    result = invoke(["list", str(world["root"]), "-", "--json"])
    assert result.exit_code == 0
    assert len(result.stdout.splitlines()) == 4
    assert one_document(result.stderr)["lists"] == {"-": {"images": 4, "suffix": ""}}


def test_paths_in_a_document_are_as_given(world, monkeypatch):
    monkeypatch.chdir(world["tmp"])
    result = invoke(["pack", "faces.lst", "tree", "rel/faces", "--json"])
    assert result.exit_code == 0, result.output
    document = one_document(result.stdout)
    assert document["manifest"] == "rel/faces.manifest.json"
    assert document["shards"] == ["rel/faces.rec"]
    assert document["failures_file"] == "rel/faces.failures.jsonl"


def test_a_list_error_with_stdout_as_the_list_goes_to_stderr_as_json(world):
    result = invoke(["list", str(world["tmp"] / "no-images"), "-", "--json"])
    assert result.exit_code == 1
    assert result.stdout == ""
    document = one_document(result.stderr)
    assert document["exit"] == 1
    assert document["error"].startswith("no images to list under ")


def test_a_real_pipe_into_json_tool_succeeds_on_success_and_on_error(world):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
    }
    script = (
        f"{sys.executable} -m rectool info {world['manifest']} --json --sample 1 "
        f"| {sys.executable} -m json.tool > /dev/null; echo ${{PIPESTATUS[@]}}; "
        f"{sys.executable} -m rectool info {world['tmp'] / 'nothing'} --json "
        f"| {sys.executable} -m json.tool > /dev/null; echo ${{PIPESTATUS[@]}}; "
        f"{sys.executable} -m rectool info --json --sample x "
        f"| {sys.executable} -m json.tool > /dev/null; echo ${{PIPESTATUS[@]}}"
    )
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.stdout.splitlines() == ["0 0", "2 0", "2 0"], done.stderr
    assert done.stderr == ""


def test_a_list_parse_error_with_stdout_as_the_list_goes_to_stderr_as_json(world):
    result = invoke(["list", str(world["root"]), "-", "--json", "--chunks", "x"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert one_document(result.stderr)["error"].startswith("Invalid value for '--chunks'")
