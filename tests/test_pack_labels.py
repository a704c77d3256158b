"""Labels a pack cannot store as given are refused before anything is written, naming the
list file and line: integers a float32 does not hold, and labels outside the label map."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rectool.cli import cli
from rectool.packer.listfile import ListFormatError
from rectool.packer.packing import PackOptions, pack_images
from rectool.reader import open_dataset

sys.path.insert(0, str(Path(__file__).parent))
from helpers.image_files import write_list  # noqa: E402


def _list_with(small_tree, tmp_path, line, label):
    """The small tree's list with list line `line` (1-based) given `label`."""
    items = [
        (index, label if number == line else old, rel)
        for number, (index, old, rel) in enumerate(small_tree.items, start=1)
    ]
    return write_list(tmp_path / "bad.lst", items)


def _two_class_map(path):
    path.write_text("0\talice\n1\tbob\n", encoding="utf-8")
    return path


def test_an_integer_a_float32_does_not_hold_is_refused_naming_the_line(small_tree, tmp_path):
    lst = _list_with(small_tree, tmp_path, 3, 16777217)
    with pytest.raises(ListFormatError) as caught:
        pack_images(lst, small_tree.root, tmp_path / "out" / "p", PackOptions())
    assert caught.value.path == str(lst) and caught.value.line == 3
    assert "16777217" in str(caught.value) and "16777216" in str(caught.value)
    assert not (tmp_path / "out" / "p.rec").exists()


def test_a_large_integer_a_float32_holds_is_packed(small_tree, tmp_path):
    lst = _list_with(small_tree, tmp_path, 3, 16777218)  # 2**24 + 2: a float32
    pack_images(lst, small_tree.root, tmp_path / "out" / "p", PackOptions())
    labels = open_dataset(str(tmp_path / "out" / "p")).labels
    assert 16777218 in labels.tolist()


def test_an_integer_in_im2rec_spelling_is_refused_too(small_tree, tmp_path):
    lst = tmp_path / "im2rec.lst"
    rel = small_tree.items[0][2]
    lst.write_text(f"0\t1.000000\t{rel}\n1\t-16777217.000000\t{rel}\n", encoding="utf-8")
    with pytest.raises(ListFormatError, match=r"line 2: label -16777217 is not a float32"):
        pack_images(lst, small_tree.root, tmp_path / "out" / "p", PackOptions())


@pytest.mark.parametrize("label", [-1, 0.5, 2])
def test_a_label_outside_the_label_map_is_refused_naming_the_line(small_tree, tmp_path, label):
    lst = _list_with(small_tree, tmp_path, 2, label)
    _two_class_map(tmp_path / "bad.labels.tsv")  # found beside the list
    # The other lines must be in the map too: alice and bob only.
    text = lst.read_text().replace("\t2.000000\t", "\t1.000000\t")
    if label == 2:
        text = "".join(
            line.replace("\t1.000000\t", "\t2.000000\t", 1) if number == 2 else line
            for number, line in enumerate(text.splitlines(keepends=True), start=1)
        )
    lst.write_text(text)
    with pytest.raises(ListFormatError) as caught:
        pack_images(lst, small_tree.root, tmp_path / "out" / "p", PackOptions())
    assert caught.value.path == str(lst) and caught.value.line == 2
    assert "not in the label map" in str(caught.value)


def test_the_cli_names_the_list_and_line_of_a_label_outside_the_map(small_tree, tmp_path):
    lst = write_list(tmp_path / "two.lst", [(i, i % 2, rel) for i, _, rel in small_tree.items])
    text = lst.read_text().splitlines(keepends=True)
    text[4] = text[4].replace("\t0.000000\t", "\t-1.000000\t", 1)
    lst.write_text("".join(text))
    labels = _two_class_map(tmp_path / "names.tsv")
    args = ["pack", str(lst), str(small_tree.root), str(tmp_path / "o" / "p"), "-q"]
    result = CliRunner().invoke(cli, [*args, "--labels", str(labels)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {lst}: line 5: label -1 is not in the label map")


def test_labels_in_the_map_pack_in_both_spellings(small_tree, tmp_path):
    # Integers as `rectool list` writes them and as im2rec does (`1.000000`): the fast path.
    items = [(i, i % 2, rel) for i, _, rel in small_tree.items]
    for name, text in [
        ("ints.lst", "".join(f"{i}\t{label}\t{rel}\n" for i, label, rel in items)),
        ("floats.lst", write_list(tmp_path / "f.tmp", items).read_text()),
    ]:
        lst = tmp_path / name
        lst.write_text(text)
        out = tmp_path / "out" / lst.stem
        labels = _two_class_map(tmp_path / "names.tsv")
        pack_images(lst, small_tree.root, out, PackOptions(), label_map=labels)
        assert sorted(open_dataset(str(out)).labels.tolist()) == [0] * 6 + [1] * 6


def test_without_a_label_map_negative_and_fractional_labels_still_pack(small_tree, tmp_path):
    lst = _list_with(small_tree, tmp_path, 1, -1)
    lst.write_text(lst.read_text().replace("\t2.000000\t", "\t0.500000\t"))
    pack_images(lst, small_tree.root, tmp_path / "out" / "p", PackOptions())


def _vectors(small_tree, tmp_path, widths):
    """The small tree's list with line n given `widths[n]` labels (its own label first)."""
    items = [
        (index, [float(old), *[0.5] * (widths[n] - 1)], rel)
        for n, (index, old, rel) in enumerate(small_tree.items)
    ]
    return write_list(tmp_path / "vectors.lst", items)


@pytest.mark.parametrize("where", ["first block", "after 40,000 lines"])
def test_pack_label_refuses_lines_with_another_label_count_naming_the_line(
    small_tree, tmp_path, where
):
    """--pack-label writes every label, and a pack's binary index holds one width: a list
    whose lines differ stops before anything is written, at the first line that differs."""
    n = len(small_tree.items)
    widths = [2] * n
    widths[4] = 3
    lst = _vectors(small_tree, tmp_path, widths)
    if where != "first block":  # the same lines after 1.8 MB of good ones (a later block)
        text = lst.read_text()
        good = "".join(
            f"{100_000 + i}\t0.000000\t0.500000\t{small_tree.items[0][2]}\n" for i in range(40_000)
        )
        lst.write_text(good + text)
    out = tmp_path / "out" / "v"
    with pytest.raises(ListFormatError) as caught:
        pack_images(lst, small_tree.root, out, PackOptions(pack_label=True))
    line = 5 if where == "first block" else 40_005
    assert caught.value.path == str(lst) and caught.value.line == line
    assert str(caught.value) == (
        f"{lst}: line {line}: 3 labels, but line 1 has 2: --pack-label writes every label, "
        "and a pack's index holds one label width (give every line as many labels)"
    )
    assert not out.parent.exists() or not list(out.parent.iterdir())


def test_without_pack_label_lines_may_differ_in_label_count(small_tree, tmp_path):
    """Only the first label of each line is written: the widths do not matter."""
    widths = [1 + n % 3 for n in range(len(small_tree.items))]
    lst = _vectors(small_tree, tmp_path, widths)
    pack_images(lst, small_tree.root, tmp_path / "out" / "p", PackOptions())
    labels = open_dataset(str(tmp_path / "out" / "p")).labels
    assert labels.tolist() == [float(old) for _, old, _ in small_tree.items]


def test_pack_label_with_one_width_is_packed_as_vectors(small_tree, tmp_path):
    lst = _vectors(small_tree, tmp_path, [2] * len(small_tree.items))
    pack_images(lst, small_tree.root, tmp_path / "out" / "v", PackOptions(pack_label=True))
    labels = open_dataset(str(tmp_path / "out" / "v")).labels
    assert labels.tolist() == [[float(old), 0.5] for _, old, _ in small_tree.items]
