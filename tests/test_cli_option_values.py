"""Every numeric option of every command refuses nan, inf, negative and huge values itself.

Each is a usage error (exit 2) naming the option, from the option's click type, never a
traceback from the code the value would have reached (`pack --shard-size inf` once raised
OverflowError, `repack --seed -1 --order shuffle` numpy's ValueError).
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from rectool.cli import cli
from rectool.commands.paramtypes import ByteSize, ImageSize

BAD_VALUES = ["nan", "inf", "-inf", "-1", "1e400", "1" + "0" * 30]
NUMERIC_TYPES = (click.types._NumberParamTypeBase, ByteSize, ImageSize)


def _numeric_options():
    found = []
    for name, command in sorted(cli.load_all().items()):
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, NUMERIC_TYPES):
                found.append((name, param.opts[0]))
    return found


NUMERIC_OPTIONS = _numeric_options()


def test_the_sweep_sees_the_numeric_options_of_every_command():
    # The parametrized test below must not pass by finding nothing.
    commands = {name for name, _ in NUMERIC_OPTIONS}
    assert {"pack", "repack", "report", "list", "verify", "info", "bench"} <= commands
    assert ("pack", "--shard-size") in NUMERIC_OPTIONS
    assert ("repack", "--seed") in NUMERIC_OPTIONS
    assert ("report", "--max-bytes") in NUMERIC_OPTIONS


@pytest.mark.parametrize("value", BAD_VALUES)
@pytest.mark.parametrize(("command", "option"), NUMERIC_OPTIONS)
def test_a_numeric_option_refuses_a_value_out_of_range_as_a_usage_error(command, option, value):
    # The option comes first: click converts parameters in command-line order, so its value is
    # checked before any missing argument could end the run.
    result = CliRunner().invoke(cli, [command, f"{option}={value}", "x", "y", "z"])
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    assert "Traceback" not in result.output
    assert f"Invalid value for '{option}'" in result.output, result.output


@pytest.mark.parametrize(
    "args",
    [
        ["pack", "--shard-size", "inf"],
        ["pack", "--shard-size", "1e400"],
        ["repack", "--seed", "-1", "--order", "shuffle"],
        ["report", "--seed", "-1"],
        ["report", "--max-bytes", "inf"],
    ],
)
def test_the_reported_option_values_are_usage_errors(args):
    result = CliRunner().invoke(cli, [*args, "x", "y", "z"])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{args[1]}'" in result.output


def test_a_seed_and_a_size_in_range_are_taken():
    assert ByteSize().convert("2GiB", None, None) == 2 * 1024**3
    seed = next(p for p in cli.load_all()["repack"].params if p.name == "seed")
    assert seed.type.convert(str(2**64 - 1), None, None) == 2**64 - 1
