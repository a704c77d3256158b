"""`rectool reindex`: an .idx rebuilt from the .rec alone, resynchronising past damage."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
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
from rectool.format.indexcache import write_index_cache
from rectool.format.writer import IndexedRecordWriter, pack_image_record
from rectool.inspect.reindex import reindex
from rectool.inspect.verify import verify_dataset
from rectool.reader import index_cache_path, open_dataset, read_index_cache


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


def test_overwrite_leaves_no_stale_sidecar_cache(small_pack):
    keys = np.array([k for k, _ in small_pack.lines], np.int64)
    write_index_cache(small_pack.idx, keys, np.array([o for _, o in small_pack.lines], np.int64))
    assert os.path.exists(index_cache_path(small_pack.idx))
    reindex(small_pack.rec, overwrite=True)
    # The cache is written again, of the new .idx (see the section at the end).
    cached = read_index_cache(small_pack.idx)
    assert cached is not None and cached[0].tolist() == [k for k, _ in small_pack.lines]
    assert idx_lines(small_pack.idx) == small_pack.lines


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
    assert result.stderr == f"Wrote {small_pack.idx}: 12 records, keys from record headers.\n"
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


# --- the index caches a rebuilt .idx made stale are written again -----------------------------
# A rebuilt .idx, even byte-identical to the old, has a new mtime: every cache made of it is
# retired, and at WebFace42M's size a pack read without its cache holds its whole index in every
# loader worker. `rectool info --json` says which caches a reader would map.


def _index_cache_state(target):
    result = invoke("info", target, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["index_cache"]


def _sharded_pack(folder, shards=3, per=40):
    from helpers.handmade_datasets import write_pack

    prefix = os.fspath(folder / "many")
    write_pack(prefix, [[(k, b"img%d" % k, 0.0) for k in range(s * per, (s + 1) * per)]
                        for s in range(shards)])  # fmt: skip
    return prefix


def test_reindex_of_a_shard_writes_its_packs_cache_again(tmp_path):
    prefix = _sharded_pack(tmp_path)
    assert invoke("index-cache", prefix).exit_code == 0
    assert _index_cache_state(prefix)["pack"] == f"{prefix}.idx.rtc"
    before = open(f"{prefix}-00001.idx", "rb").read()
    result = invoke("reindex", f"{prefix}-00001.rec", "--overwrite")
    assert result.exit_code == 0, result.output
    assert open(f"{prefix}-00001.idx", "rb").read() == before  # a sound shard: the same text
    assert _index_cache_state(prefix) == {"pack": f"{prefix}.idx.rtc", "shards_cached": 3,
                                          "shards": 3}  # fmt: skip
    assert f"{prefix}.idx.rtc" in result.output  # the summary names what it wrote again
    assert open_dataset(prefix).keys.tolist() == list(range(120))


def test_reindex_of_a_shard_into_another_file_leaves_the_packs_cache_as_it_is(tmp_path):
    prefix = _sharded_pack(tmp_path)
    assert invoke("index-cache", prefix).exit_code == 0
    cache = f"{prefix}.idx.rtc"
    stamp = os.stat(cache).st_mtime_ns, open(cache, "rb").read()
    result = invoke("reindex", f"{prefix}-00001.rec", "-o", tmp_path / "elsewhere.idx", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["index_caches"] == []
    assert (os.stat(cache).st_mtime_ns, open(cache, "rb").read()) == stamp
    assert _index_cache_state(prefix)["pack"] == cache


def test_reindex_writes_a_shards_own_cache_again_where_it_had_one(small_pack):
    assert invoke("index-cache", small_pack.rec).exit_code == 0
    assert _index_cache_state(small_pack.rec)["shards_cached"] == 1
    result = invoke("reindex", small_pack.rec, "--overwrite", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["index_caches"] == [index_cache_path(small_pack.idx)]
    assert _index_cache_state(small_pack.rec)["shards_cached"] == 1


def test_reindex_of_a_small_shard_without_a_cache_writes_none(small_pack):
    assert not os.path.exists(index_cache_path(small_pack.idx))
    result = invoke("reindex", small_pack.rec, "--overwrite", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["index_caches"] == []
    assert not os.path.exists(index_cache_path(small_pack.idx))


def test_reindex_into_prefix_idx_leaves_the_cache_of_a_pack_of_several_shards(tmp_path):
    """`-o PREFIX.idx` beside a pack of several shards: the .idx's own cache would be named
    PREFIX.idx.rtc, the pack's cache. That is not this .idx's to write again or remove."""
    prefix = _sharded_pack(tmp_path)
    assert invoke("index-cache", prefix).exit_code == 0
    cache = f"{prefix}.idx.rtc"
    stamp = open(cache, "rb").read()
    result = invoke("reindex", f"{prefix}-00000.rec", "-o", f"{prefix}.idx", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["index_caches"] == []
    assert open(cache, "rb").read() == stamp
    assert _index_cache_state(prefix)["pack"] == cache
