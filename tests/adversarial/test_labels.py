"""Issue 36: one rule for labels float32 would change (`packer/listcheck.py`).

A label of 16777217 was refused (float32 stores 16777216) while 1e-50 was stored as 0.0
without a word. The rule is now one: a label that float32, the type records store labels in,
would store as another value than the line says is refused, naming the list and line: an
integer it does not hold, or a value below its smallest normal number (`FLOAT32_TINY`) that
it does not hold exactly. Other values are real values, rounded to float32's precision.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.image_files import write_list

from rectool.cli import cli
from rectool.packer.listcheck import validate_list
from rectool.packer.listfile import ListFormatError

ZEROS_THEN_ONE = "0." + "0" * 49 + "1"  # 1e-50 with no exponent: an ordinary-looking line


@pytest.mark.parametrize(
    ("spelled", "stored"),
    [
        ("1e-50", "0"),
        ("-1e-50", "0"),  # -0.0, which format_label writes as 0
        (ZEROS_THEN_ONE, "0"),
        ("1e-40", repr(float(np.float32(1e-40)))),  # a subnormal: digits lost
        ("16777217", "16777216"),
    ],
)
def test_a_label_float32_would_change_is_refused_naming_the_line(tmp_path, spelled, stored):
    lst = tmp_path / "faces.lst"
    lst.write_text(f"0\t1\ta/0.jpg\n1\t{spelled}\ta/1.jpg\n2\t3\ta/2.jpg\n", encoding="utf-8")
    with pytest.raises(ListFormatError) as caught:
        validate_list(str(lst), "images")
    assert caught.value.line == 2
    assert str(caught.value) == (
        f"{lst}: line 2: label {float(spelled)!r} is not a float32, the type records store "
        f"labels in: it would be stored as {stored}"
    ).replace("label 16777217.0 ", "label 16777217 ")


@pytest.mark.parametrize(
    "spelled",
    ["0", "0.1", "-2.5", "1e-30", "3.4e38", repr(2.0**-149), "16777218", "0." + "0" * 29 + "1"],
)
def test_values_float32_keeps_to_its_precision_pass(tmp_path, spelled):
    lst = tmp_path / "faces.lst"
    lst.write_text(f"0\t{spelled}\ta/0.jpg\n", encoding="utf-8")
    assert validate_list(str(lst), "images")[1] == 1


def test_the_rule_bound_is_float32s_smallest_normal():
    from rectool.packer.listcheck import FLOAT32_TINY

    assert FLOAT32_TINY == float(np.finfo(np.float32).tiny)


def test_the_cli_refuses_1e_minus_50_before_anything_is_written(tmp_path):
    (tmp_path / "faces" / "a").mkdir(parents=True)
    lst = write_list(tmp_path / "faces.lst", [(0, 1, "a/0.jpg"), (1, 2, "a/1.jpg")])
    lst.write_text(lst.read_text().replace("\t2.000000\t", "\t1e-50\t"), encoding="utf-8")
    out = tmp_path / "out" / "p"
    result = CliRunner().invoke(
        cli, ["pack", str(lst), str(tmp_path / "faces"), str(out), "--json"]
    )
    assert result.exit_code != 0
    assert json.loads(result.output)["error"] == (
        f"{lst}: line 2: label 1e-50 is not a float32, the type records store labels in: "
        "it would be stored as 0"
    )
    assert not out.with_suffix(".rec").exists()
