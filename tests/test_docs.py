"""The documentation cannot drift from the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rectool.cli import cli

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_cli_reference_matches_the_real_help():
    check = subprocess.run(
        [sys.executable, "-m", "cogapp", "--check", "--diff", str(DOCS / "cli.md")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, f"docs/cli.md is stale: run `make docs`\n{check.stdout}"


@pytest.mark.parametrize("command", sorted(cli.load_all()))
def test_every_command_help_has_an_example(command):
    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=100)
    assert result.exit_code == 0
    assert "Example:\n      rectool " + command in result.output


def _every_help(group=cli, path=()):
    """(command path, --help output) for the group and every command under it."""
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    yield path, result.output
    for name, command in sorted(getattr(group, "commands", {}).items()):
        yield from _every_help(command, (*path, name))


def test_no_help_text_points_to_files_an_installed_user_lacks():
    helps = dict(_every_help())
    assert len(helps) > len(cli.load_all())  # the group and each command were read
    for path, text in helps.items():
        assert "docs/" not in text and ".md" not in text, f"rectool {' '.join(path)} --help"
