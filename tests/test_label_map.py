"""A label map that cannot be read is an error naming its file and line, not a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.packer.listfile import read_label_map


def test_a_label_map_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"0\talice\n1\t\xffbob\n")
    with pytest.raises(RectoolError, match=r"bad.tsv: line 2: not valid UTF-8"):
        read_label_map(path)


def test_pack_labels_with_a_file_that_is_not_utf8_is_an_error_not_a_traceback(small_tree, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"0\t\xff\n")
    args = ["pack", str(small_tree.list_path), str(small_tree.root), str(tmp_path / "o" / "p")]
    result = CliRunner().invoke(cli, [*args, "-q", "--labels", str(bad)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {bad}: line 1: not valid UTF-8")
