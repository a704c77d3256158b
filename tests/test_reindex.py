"""`rectool reindex`: an .idx rebuilt from the .rec alone, resynchronising past damage."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.rec_files import (
    MAGIC,
    idx_lines,
    image_payload,
    make_pack,
    set_bytes,
    write_records,
    xor_byte,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.format.writer import pack_image_record
from rectool.inspect.reindex import reindex
from rectool.inspect.verify import verify_dataset
from rectool.packer.writers import IndexedRecordWriter
from rectool.reader import open_dataset


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def rebuilt(pack, **kwargs):
    """Reindex into a new file beside the pack; return (result, its lines)."""
    out = pack.rec.with_name("rebuilt.idx")
    result = reindex(pack.rec, out, **kwargs)
    return result, idx_lines(out)


def test_sound_pack_gives_an_identical_idx(small_pack):
    original = small_pack.idx.read_bytes()
    small_pack.idx.unlink()
    result = reindex(small_pack.rec)
    assert result.sound
    assert (result.records, result.skipped, result.unkeyed) == (12, [], [])
    assert small_pack.idx.read_bytes() == original


def test_insightface_pack_gives_an_identical_idx(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    original = pack.idx.read_bytes()
    assert idx_lines(pack.idx)[-1][0] == 0  # record 0 last: keys are not in file order
    result = reindex(pack.rec, pack.idx, overwrite=True)
    assert result.sound
    assert pack.idx.read_bytes() == original


def test_split_records_are_indexed_once(tmp_path):
    rec, idx = tmp_path / "s.rec", tmp_path / "s.idx"
    with IndexedRecordWriter(rec, idx) as w:
        for key in (5, 9, 2):
            w.write(key, pack_image_record(MAGIC * 3 + bytes(range(key)), 1.0, key))
    original = idx.read_bytes()
    result = reindex(rec, tmp_path / "r.idx")
    assert result.sound
    assert (tmp_path / "r.idx").read_bytes() == original


def test_refuses_to_replace_an_existing_idx(small_pack):
    with pytest.raises(RectoolError, match="exists; use --overwrite"):
        reindex(small_pack.rec)


def test_bad_magic_is_skipped_up_to_the_next_record(small_pack):
    _, start = small_pack.lines[4]
    end = small_pack.lines[5][1]
    xor_byte(small_pack.rec, start, 0x01)
    result, lines = rebuilt(small_pack)
    assert [(d.start, d.end, d.kind) for d in result.skipped] == [(start, end, "bad-magic")]
    assert lines == small_pack.lines[:4] + small_pack.lines[5:]
    assert not result.sound


def test_garbage_inserted_between_records(small_pack):
    _, at = small_pack.lines[7]
    data = small_pack.rec.read_bytes()
    small_pack.rec.write_bytes(data[:at] + b"not a record" + data[at:])  # 12 bytes keep alignment
    result, lines = rebuilt(small_pack)
    assert [(d.start, d.end, d.kind) for d in result.skipped] == [(at, at + 12, "bad-magic")]
    assert lines == small_pack.lines[:7] + [(k, o + 12) for k, o in small_pack.lines[7:]]


def test_truncated_tail(small_pack):
    _, start = small_pack.lines[-1]
    os.truncate(small_pack.rec, start + 30)
    result, lines = rebuilt(small_pack)
    assert [(d.start, d.end, d.kind) for d in result.skipped] == [(start, start + 30, "truncated")]
    assert lines == small_pack.lines[:-1]


def test_a_rebuilt_index_leaves_only_the_damage_to_verify(small_pack):
    key, start = small_pack.lines[2]
    xor_byte(small_pack.rec, start, 0x01)
    small_pack.manifest.unlink()
    reindex(small_pack.rec, overwrite=True)
    report = verify_dataset(small_pack.rec)
    # The .rec.crc still names the record's place: the record the .idx lost is damaged.
    assert [(p.kind, p.key, p.offset) for p in report.problems] == [
        ("bad-magic", None, start),
        ("record-checksum-mismatch", None, start),
    ]


def test_keys_by_position(small_pack):
    result, lines = rebuilt(small_pack, keys="position")
    assert result.sound
    assert lines == [(i, o) for i, (_, o) in enumerate(small_pack.lines)]


def test_duplicate_and_missing_header_ids(tmp_path):
    rec = tmp_path / "x.rec"
    offsets = write_records(
        rec,
        tmp_path / "x.idx",
        [
            (0, image_payload(b"\xff\xd8\xffa", 0.0, 0)),
            (1, image_payload(b"\xff\xd8\xffb", 0.0, 0)),  # the same id: a careless writer
            (2, b"tiny"),
        ],
    )
    result = reindex(rec, tmp_path / "r.idx")
    assert result.duplicates == {0: 2}
    assert result.unkeyed == [
        (offsets[2], "a record of 4 bytes has no image header to take a key from")
    ]
    assert idx_lines(tmp_path / "r.idx") == [(0, offsets[0]), (0, offsets[1])]


# -- property: any sound file written by the writer reindexes to its own .idx -----------------


payloads = st.lists(
    st.tuples(
        st.integers(0, 2**40),
        st.lists(st.sampled_from([MAGIC, b"\xff\xd8\xff\xe0", b"abcd", b"\0"]), max_size=12),
    ),
    max_size=8,
    unique_by=lambda item: item[0],
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=payloads)
def test_property_reindex_reproduces_the_writer_idx(tmp_path, records):
    folder = tmp_path / f"p{abs(hash(str(records)))}"
    folder.mkdir()
    rec, idx = folder / "p.rec", folder / "p.idx"
    with IndexedRecordWriter(rec, idx) as w:
        for key, pieces in records:
            w.write(key, pack_image_record(b"".join(pieces), 3.0, key))
    result = reindex(rec, folder / "r.idx")
    assert result.sound
    assert (folder / "r.idx").read_bytes() == idx.read_bytes()
    shutil.rmtree(folder)


# -- the command line -----------------------------------------------------------------------------


def test_cli_sound_exit_0(small_pack):
    original = small_pack.idx.read_bytes()
    result = invoke("reindex", small_pack.rec, "--overwrite")
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"Wrote {small_pack.idx}: 12 records, keys from record headers. The index of the pack "
        f"{small_pack.manifest} matches it already.\n"
    )
    assert small_pack.idx.read_bytes() == original


def test_cli_existing_idx_is_an_error(small_pack):
    result = invoke("reindex", small_pack.rec)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {small_pack.idx}: exists; use --overwrite to replace it\n"


def test_cli_damage_exit_1_lists_the_skipped_ranges(small_pack):
    _, start = small_pack.lines[4]
    end = small_pack.lines[5][1]
    set_bytes(small_pack.rec, start, b"XXXX")
    out = small_pack.rec.with_name("new.idx")
    result = invoke("reindex", small_pack.rec, "-o", out)
    assert result.exit_code == 1
    assert result.stderr == f"Wrote {out}: 11 records, keys from record headers.\n"
    assert result.stdout.splitlines() == [
        f"Skipped 1 damaged byte range ({end - start:,} bytes):",
        f"  bytes {start}..{end} ({end - start:,} bytes): bad-magic: bad magic 0x58585858 "
        "(expected 0xced7230a)",
        f"1 damaged record (per {small_pack.rec}.crc):",
        f"  byte offset {start}: bytes {start}..{end} differ from their xxh3-64; "
        "no record starts there any more (record 4 of faces.rec.crc)",
    ]
    assert idx_lines(out) == small_pack.lines[:4] + small_pack.lines[5:]


def test_cli_json_and_duplicates(tmp_path):
    rec = tmp_path / "x.rec"
    write_records(
        rec,
        tmp_path / "x.idx",
        [(k, image_payload(b"\xff\xd8\xff" + bytes([k]), 0.0, 7)) for k in range(3)],
    )
    result = invoke("reindex", rec, "--overwrite")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0] == (
        "1 key appears more than once: 7 (3 times); readers keep the last (try --keys position)."
    )
    result = invoke("reindex", rec, "--overwrite", "--keys", "position", "--json")
    assert result.exit_code == 0
    assert '"duplicates": {}' in result.stdout
    assert [k for k, _ in idx_lines(tmp_path / "x.idx")] == [0, 1, 2]


def test_cli_usage_errors(tmp_path, small_pack):
    assert invoke("reindex", tmp_path / "missing.rec").exit_code == 2
    assert invoke("reindex", small_pack.rec, "--keys", "bogus").exit_code == 2


# --- a shard of a pack with a binary index: the index follows its .idx --------------------------
# The reader reads a format-3 pack through its .npy index, MXNet through the .idx: a rebuilt .idx
# that lists other records than the index was made from is written into the pack's index too.


def _indexed_pack(folder, shards=3, per=4):
    """A pack of `shards` shards written by hand (keys 10*k, image b"img<k>", label k), then
    given its manifest and index by `rectool index`; return (prefix, its samples)."""
    from helpers.handmade_datasets import write_pack

    prefix = os.fspath(folder / "many")
    samples = write_pack(
        prefix,
        [[(10 * k, b"img%d" % k, float(k)) for k in range(s * per, (s + 1) * per)]
         for s in range(shards)],
        manifest=False,
    )  # fmt: skip
    assert invoke("index", prefix).exit_code == 0
    return prefix, samples


def _index_files(prefix):
    return {
        name: open(f"{prefix}.{name}.npy", "rb").read() for name in ("offsets", "keys", "labels")
    }


def test_reindex_of_a_sound_shard_leaves_the_packs_index_as_it_is(tmp_path):
    prefix, _ = _indexed_pack(tmp_path)
    before = open(f"{prefix}-00001.idx", "rb").read()
    index, manifest = _index_files(prefix), open(f"{prefix}.manifest.json", "rb").read()
    os.unlink(f"{prefix}-00001.idx")  # lost: rebuilt from the .rec
    result = invoke("reindex", f"{prefix}-00001.rec", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["pack"], doc["pack_index_written"]) == (f"{prefix}.manifest.json", [])
    assert open(f"{prefix}-00001.idx", "rb").read() == before
    assert _index_files(prefix) == index
    assert open(f"{prefix}.manifest.json", "rb").read() == manifest


def test_reindex_of_a_damaged_shard_writes_the_packs_index_to_match(tmp_path):
    prefix, samples = _indexed_pack(tmp_path)
    lost = samples[5]  # the second record of shard 1
    assert (lost.key, lost.rec) == (50, f"{prefix}-00001.rec")
    xor_byte(Path(lost.rec), lost.offset, 0x01)  # its magic: the walk skips the record
    result = invoke("reindex", lost.rec, "--overwrite")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"Wrote {prefix}-00001.idx: 3 records, keys from record headers. Wrote the index of "
        f"the pack {prefix}.manifest.json again to match it.\n"
    )
    kept = [s for s in samples if s is not lost]
    ds = open_dataset(prefix)
    assert [ds[i] for i in range(len(ds))] == [(s.image, s.label) for s in kept]
    assert ds.keys.tolist() == [s.key for s in kept]
    assert ds.labels.tolist() == [s.label for s in kept]
    assert idx_lines(Path(f"{prefix}-00001.idx")) == [(s.key, s.offset) for s in kept[4:7]]
    manifest = json.loads(open(f"{prefix}.manifest.json").read())
    assert [s["records"] for s in manifest["shards"]] == [4, 3, 4]
    assert (manifest["totals"]["records"], manifest["index"]["samples"]) == (11, [4, 3, 4])
    assert manifest["shards"][1]["idx_bytes"] == os.path.getsize(f"{prefix}-00001.idx")


def test_reindex_into_another_file_leaves_the_pack_alone(tmp_path):
    prefix, samples = _indexed_pack(tmp_path)
    xor_byte(Path(samples[5].rec), samples[5].offset, 0x01)
    manifest = open(f"{prefix}.manifest.json", "rb").read()
    result = invoke("reindex", samples[5].rec, "-o", tmp_path / "elsewhere.idx", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert (doc["pack"], doc["pack_index_written"], doc["records"]) == (None, [], 3)
    assert open(f"{prefix}.manifest.json", "rb").read() == manifest
    assert len(open_dataset(prefix)) == 12  # the pack still reads what its index says


def test_a_rebuilt_insightface_idx_that_loses_an_image_is_written_and_the_refusal_named(
    tmp_path,
):
    """Keys 1..N are the images of an insightface pack: an .idx without one of them cannot
    be indexed (record 0 says it exists). The .idx is written as asked; the pack's index is
    left as it was, and the message says so."""
    from helpers.handmade_datasets import write_insightface

    folder = tmp_path / "faces"
    folder.mkdir()
    samples, _ = write_insightface(
        folder / "train.rec", folder / "train.idx", [2, 3], lambda k: b"face%d" % k
    )
    assert invoke("index", folder).exit_code == 0
    index = _index_files(folder / "train")
    xor_byte(folder / "train.rec", samples[2].offset, 0x01)
    result = invoke("reindex", folder / "train.rec", "--overwrite")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"Error: {folder}/train.idx: written, but the index of the pack "
        f"{folder}/train.manifest.json could not be written to match it ("
    )
    assert "key 3 is not in the index" in result.stderr
    assert 3 not in [k for k, _ in idx_lines(folder / "train.idx")]
    assert _index_files(folder / "train") == index
