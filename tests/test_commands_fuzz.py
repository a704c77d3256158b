"""Mutated .rec/.idx/manifest/.npy/identities/.rec.crc bytes: the commands answer with an exit code.

The reader's own fuzz test (test_reader_fuzz.py) covers `open_dataset`; this one runs the
commands built over it (verify, verify --decode, info, reindex, unpack, report, index) on a damaged
copy of a small pack. Whatever the damage, each command must end with exit 0 (sound or
nothing to say), 1 (problems found, or an `Error: ...` line) or, for verify, 2 (unreadable)
— never a Python traceback, never
another exception out of the command, never a block (an alarm fails an example that blocks).
"""

from __future__ import annotations

import tempfile
import traceback
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import MAGIC
from helpers.image_files import write_list, write_pack_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rectool.cli import cli
from rectool.packer.packing import PackOptions, pack_images

FILES = [
    "faces-00000.rec",
    "faces-00000.idx",
    "faces-00001.idx",
    "faces-00000.rec.crc",
    "faces.offsets.npy",
    "faces.keys.npy",
    "faces.labels.npy",
    "faces.identities.json",
    "faces.manifest.json",
    "faces.failures.jsonl",
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A two-shard pack (with its .rec.crc files, its binary index and its identities file),
    as bytes by file name."""
    base = tmp_path_factory.mktemp("fuzzpack")
    # One empty image: a refusal, so there is a failures file to damage.
    items = write_pack_tree(base / "tree", ["ann", "bob"], 3, extra=[("ann/empty.jpg", b"", 0)])
    lst = write_list(base / "faces.lst", items)
    (base / "faces.labels.tsv").write_text("0\tann\n1\tbob\n", encoding="utf-8")  # the names
    prefix = base / "out" / "faces"
    pack_images(lst, base / "tree", prefix, PackOptions(shard_records=4, max_failures=1))
    files = Files({p.name: p.read_bytes() for p in (base / "out").iterdir()})
    assert set(FILES) <= set(files), sorted(files)
    return files


class Files(dict):
    """File bytes by name, shown by name only when hypothesis reports an example."""

    def __repr__(self):
        return f"Files({sorted(self)})"


def mutate(data, kind, at, blob):
    at = at % (len(data) + 1)
    if kind == "overwrite":
        return data[:at] + blob + data[at + len(blob) :]
    if kind == "cut":
        return data[:at]
    return data[:at] + blob + data[at:]


COMMANDS = [
    ["verify", "{m}", "-q"],
    ["verify", "{m}", "--decode", "--workers", "1", "--json"],
    ["info", "{m}", "--json"],
    ["info", "{p}"],
    ["unpack", "{m}", "{t}/unpacked"],
    ["report", "{m}", "-o", "{t}/r.html", "--sample", "4"],
    ["reindex", "{p}-00000.rec"],
    ["index", "{p}", "--force"],  # last: it writes the index again over the damage
]


def run_all(folder):
    """Run every command; return (command, exit code, exception text) for each bad ending."""
    bad = []
    values = {"m": folder / "faces.manifest.json", "p": folder / "faces", "t": folder}
    for command in COMMANDS:
        args = [part.format(**values) for part in command]
        result = CliRunner().invoke(cli, args)
        escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
        allowed = (0, 1, 2)  # 2: an unusable input (the exit-code table)
        if escaped or result.exit_code not in allowed or "Traceback" in result.output:
            text = "".join(traceback.format_exception(result.exception)) if escaped else ""
            bad.append((args, result.exit_code, result.output[-500:] + text[-2000:]))
    return bad


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    name=st.sampled_from(FILES),
    kind=st.sampled_from(["overwrite", "cut", "insert"]),
    at=st.integers(0, 10**6),
    blob=st.one_of(
        st.binary(min_size=1, max_size=8),
        st.sampled_from([MAGIC, b"\xff" * 4, b"\0" * 4, b"\n", b"\t", b"-1", b'"', b"null"]),
    ),
)
def test_damaged_packs_get_an_exit_code_not_a_traceback(pristine, alarm, name, kind, at, blob):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for file_name, data in pristine.items():
            (folder / file_name).write_bytes(data)
        (folder / name).write_bytes(mutate(pristine[name], kind, at, blob))
        alarm(30)
        bad = run_all(folder)
        assert not bad, "\n\n".join(f"{args}: exit {code}\n{text}" for args, code, text in bad)


def test_the_undamaged_pack_is_sound(pristine, tmp_path):
    for file_name, data in pristine.items():
        (tmp_path / file_name).write_bytes(data)
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "faces.manifest.json"), "-q"])
    assert result.exit_code == 0, result.output
    assert run_all(tmp_path) == []
