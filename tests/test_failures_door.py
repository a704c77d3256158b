"""One door for the failures file (rectool/doors/failures.py): its lines are written and read
there only, every field checked, and bad input is an error naming the file and the line."""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree

from rectool.cli import cli
from rectool.doors import failures
from rectool.doors.failures import KINDS, PACK, REPACK, failure_line, open_failures
from rectool.errors import InputError
from rectool.packer.images import Transform
from rectool.packer.packing import PackOptions, pack_images
from rectool.repack.pipeline import RepackOptions, repack

PACK_LINE = (
    b'{"line": 3, "index": 2, "path": "bob/\xc3\xa9t\xc3\xa9.jpg", "reason": "empty file"}\n'
)
PLAN_LINE = (
    b'{"source": "a", "key": 4, "label": 1, "identity": null, "stage": "plan", '
    b'"reason": "duplicate", "detail": "byte-identical to key 2 of a, kept"}\n'
)
WRITE_LINE = (
    b'{"source": "a", "key": 5, "label": 0, "identity": "ann", "stage": "write", '
    b'"position": 7, "reason": "empty file"}\n'
)


def lines_of(path, kinds=(PACK,), **options):
    with open_failures(path, kinds, **options) as opened:
        return list(opened)


def write(tmp_path, data, name="x.failures.jsonl"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# -- writing ------------------------------------------------------------------------------------


def test_a_line_is_the_entry_as_utf8_json_with_its_newline():
    entry = {"line": 3, "index": 2, "path": "bob/été.jpg", "reason": "empty file"}
    assert failure_line(entry) == PACK_LINE


def test_a_line_too_long_to_read_back_is_written_shortened(tmp_path):
    path = "a/" + "x" * (2 << 20)
    line = failure_line({"line": 1, "index": 0, "path": path, "reason": "cannot read"})
    assert len(line) <= failures.MAX_LINE_BYTES
    (got,) = lines_of(write(tmp_path, line))
    assert got.entry["path"] == path[: 1 << 14] + "... (2,097,154 characters in all)"
    assert got.entry["reason"] == "cannot read"


# -- reading ------------------------------------------------------------------------------------


def test_the_lines_of_both_kinds_are_read_with_their_numbers_and_ends(tmp_path):
    path = write(tmp_path, PLAN_LINE + WRITE_LINE)
    got = lines_of(path, (REPACK,))
    assert [(g.number, g.end, g.text) for g in got] == [
        (1, len(PLAN_LINE), PLAN_LINE),
        (2, len(PLAN_LINE) + len(WRITE_LINE), WRITE_LINE),
    ]
    assert got[1].entry["position"] == 7 and got[0].entry["identity"] is None
    assert lines_of(path, (PACK,), bad_lines=True)[0].entry is None
    mixed = write(tmp_path, PACK_LINE + WRITE_LINE, "mixed.jsonl")
    assert [g.entry["reason"] for g in lines_of(mixed, KINDS)] == ["empty file"] * 2


def test_a_last_line_without_its_newline_is_read_when_it_is_whole(tmp_path):
    got = lines_of(write(tmp_path, PACK_LINE + PACK_LINE[:-1]))
    assert [g.entry["path"] for g in got] == ["bob/été.jpg", "bob/été.jpg"]


BAD = {
    "cut short": (PACK_LINE + PACK_LINE[:30], 2, "not JSON (Expecting ':' delimiter"),
    "not JSON": (b"hello\n" + PACK_LINE, 1, "not JSON (Expecting value: line 1 column 1"),
    "blank": (PACK_LINE + b"\n" + PACK_LINE, 2, "not JSON (Expecting value"),
    "not an object": (b"[1, 2]\n", 1, "not a JSON object"),
    "not UTF-8": (PACK_LINE.replace(b"\xc3\xa9", b"\xe9"), 1, "not UTF-8"),
    "UTF-16": (PACK_LINE.decode("utf-8").encode("utf-16"), 1, "not UTF-8"),
    "deep": (b"[" * 100_000 + b"]" * 100_000 + b"\n", 1, "not JSON (nested too deep)"),
    "huge number": (b'{"line": ' + b"9" * 5000 + b"}\n", 1, "not JSON (Exceeds the limit"),
    "field missing": (b'{"line": 1, "index": 0, "path": "a"}\n', 1, "no field 'reason'"),
    "field extra": (
        PACK_LINE.replace(b"}", b', "more": 1}'),
        1,
        "a field 'more' a pack failures line does not have",
    ),
    "string line": (PACK_LINE.replace(b"3", b'"3"'), 1, "field 'line' must be an integer"),
    "float line": (PACK_LINE.replace(b"3", b"3.0"), 1, "field 'line' must be an integer"),
    "true index": (PACK_LINE.replace(b"2", b"true"), 1, "field 'index' must be an integer"),
    "null path": (b'{"line": 1, "index": 0, "path": null, "reason": "r"}\n', 1, "field 'path'"),
    "lone surrogate": (
        PACK_LINE.replace(b"bob/", b"\\ud800/"),
        1,
        "field 'path' is not text (it holds half of a UTF-16 surrogate pair)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_line_is_an_error_naming_the_file_and_line(tmp_path, case):
    data, number, problem = BAD[case]
    path = write(tmp_path, data)
    with pytest.raises(InputError) as caught:
        lines_of(path)
    assert str(caught.value).startswith(f"{path}: line {number}: {problem}")
    bad = next(g for g in lines_of(path, bad_lines=True) if g.entry is None)
    assert (bad.number, bad.problem) == (number, str(caught.value).split(": ", 2)[2])


REPACK_BAD = {
    "plan without detail": (PLAN_LINE.replace(b', "detail"', b', "other"'), "no field 'detail'"),
    "write without position": (WRITE_LINE.replace(b'"position": 7, ', b""), "no field 'position'"),
    "negative position": (
        WRITE_LINE.replace(b"7", b"-1"),
        "field 'position' must be an integer >= 0",
    ),
    "other stage": (WRITE_LINE.replace(b'"write"', b'"read"'), "field 'stage' must be \"plan\""),
    "position in a plan line": (
        PLAN_LINE.replace(b"}", b', "position": 1}'),
        "a field 'position' a repack failures line does not have",
    ),
    "identity a number": (WRITE_LINE.replace(b'"ann"', b"1"), "field 'identity' must be a string"),
}


@pytest.mark.parametrize("case", sorted(REPACK_BAD))
def test_each_field_of_a_repack_line_is_checked(tmp_path, case):
    data, problem = REPACK_BAD[case]
    path = write(tmp_path, data)
    with pytest.raises(InputError, match="^" + ": ".join([str(path), "line 1", problem])):
        lines_of(path, (REPACK,))


def test_a_line_of_neither_kind_says_why_for_each(tmp_path):
    path = write(tmp_path, b'{"line": 1}\n')
    with pytest.raises(InputError) as caught:
        lines_of(path, KINDS)
    assert str(caught.value) == (
        f"{path}: line 1: as a pack line: no field 'index'; as a repack line: no field 'source'"
    )


def test_a_huge_line_is_read_past_in_bounded_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(failures, "MAX_LINE_BYTES", 4096)
    path = write(tmp_path, PACK_LINE + b"x" * (64 << 20) + b"\n" + PACK_LINE)
    tracemalloc.start()
    try:
        got = lines_of(path, bad_lines=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # the 64 MiB line is never held
    assert [(g.number, g.problem) for g in got] == [
        (1, None),
        (2, "longer than 4,096 bytes"),
        (3, None),
    ]
    assert got[2].end == os.path.getsize(path)
    with pytest.raises(InputError, match=f"^{path}: line 2: longer than 4,096 bytes$"):
        lines_of(path)


def test_a_torn_last_line_is_no_line_when_resuming(tmp_path, monkeypatch):
    monkeypatch.setattr(failures, "MAX_LINE_BYTES", 4096)
    for torn in (PACK_LINE[:-1], PACK_LINE[:20], b"x" * 10_000):
        got = lines_of(write(tmp_path, PACK_LINE + torn), torn_tail=True)
        assert [(g.number, g.end) for g in got] == [(1, len(PACK_LINE))]
    # A bad line that has its newline was written whole: still an error.
    path = write(tmp_path, PACK_LINE + b"{}\n" + PACK_LINE[:9])
    with pytest.raises(InputError, match=f"^{path}: line 2: no field 'line'$"):
        lines_of(path, torn_tail=True)


def test_the_file_is_opened_through_the_door_in(tmp_path):
    with pytest.raises(InputError, match="failures file not found"):
        open_failures(tmp_path / "missing.jsonl")
    os.symlink(write(tmp_path, PACK_LINE), tmp_path / "link.jsonl")
    with pytest.raises(InputError, match="cannot open the failures file"):
        open_failures(tmp_path / "link.jsonl", follow=False)
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(InputError, match="not a regular file"):
        open_failures(tmp_path / "fifo.jsonl")


# -- resuming pack and repack -------------------------------------------------------------------


def interrupted(run, after):
    """Run `run(progress)`, interrupting it once `after` items are done."""

    def progress(done, total, refused):
        if done >= after:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(progress)


REPACKED = RepackOptions(transform=Transform(quality=70), workers=1, max_failures=100)


def interrupted_repack(tmp_path, after, labels=lambda k: 0.0):
    """Repack a source of 80 records, every third one broken, and interrupt it once `after`
    items are done; return (source, prefix, partial failures file)."""
    items = [(k, b"broken" if k % 3 == 1 else jpeg_bytes(k, 12, 10), labels(k)) for k in range(80)]
    write_pack(tmp_path / "src", [items])
    prefix = tmp_path / "out" / "o"

    def run(progress):
        repack([tmp_path / "src"], prefix, REPACKED, progress=progress)

    interrupted(run, after)
    return tmp_path / "src", prefix, tmp_path / "out" / "o.failures.jsonl.partial"


@pytest.fixture
def tree_with_refusals(tmp_path):
    """A tree of 60 images and 20 empty files, every fourth item empty; its list (more items
    than a chunk of work, so that a run can be interrupted in the middle)."""
    extra = [(f"bob/empty{n}.jpg", b"", 1) for n in range(20)]
    items = write_pack_tree(tmp_path / "tree", ["ann", "bob"], 30, height=16, width=16, extra=extra)
    images, empty = items[:60], items[60:]
    order = [empty.pop() if i % 4 == 3 else images.pop() for i in range(80)]
    return tmp_path / "tree", write_list(tmp_path / "t.lst", order)


PACKED = PackOptions(transform=Transform(resize=12), workers=1, max_failures=100)


def interrupted_pack(tree_with_refusals, tmp_path):
    """Pack the tree with refusals and interrupt it after its first chunk of items; return
    (root, list, prefix, partial failures file)."""
    root, lst = tree_with_refusals
    prefix = tmp_path / "out" / "t"
    interrupted(lambda progress: pack_images(lst, root, prefix, PACKED, progress=progress), 1)
    return root, lst, prefix, tmp_path / "out" / "t.failures.jsonl.partial"


def test_pack_resume_cuts_a_torn_last_line_and_writes_it_again(tree_with_refusals, tmp_path):
    root, lst, prefix, partial = interrupted_pack(tree_with_refusals, tmp_path)
    pack_images(lst, root, tmp_path / "ref" / "t", PACKED)
    before = partial.read_bytes()
    with open(partial, "ab") as f:
        f.write(b'{"line": 12, "index": 1')  # a kill in the middle of writing a line
    result = pack_images(lst, root, prefix, PACKED, resume=True)
    assert 0 < result.resumed_from < 80 and result.outcome == "resumed"
    assert (tmp_path / "out" / "t.failures.jsonl").read_bytes().startswith(before)
    for name in ("t.rec", "t.idx", "t.failures.jsonl"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()


def test_pack_resume_over_a_bad_line_is_an_error_naming_it(tree_with_refusals, tmp_path):
    root, lst, prefix, partial = interrupted_pack(tree_with_refusals, tmp_path)
    number = partial.read_bytes().count(b"\n") + 1
    with open(partial, "ab") as f:
        f.write(b'{"line": "twelve"}\n')
    before = partial.read_bytes()
    result = CliRunner().invoke(
        cli, ["pack", str(lst), str(root), str(prefix), "-q", "--resize", "12", "--resume"]
    )
    assert result.exit_code == 2
    assert result.stderr == f"Error: {partial}: line {number}: no field 'index'\n"
    assert partial.read_bytes() == before  # nothing cut


def test_a_complete_pack_with_a_bad_failures_file_is_an_error_naming_it(
    tree_with_refusals, tmp_path
):
    root, lst = tree_with_refusals
    prefix = tmp_path / "out" / "t"
    pack_images(lst, root, prefix, PACKED)
    failures_file = tmp_path / "out" / "t.failures.jsonl"
    failures_file.write_bytes(b"[]\n" + failures_file.read_bytes())
    with pytest.raises(InputError, match=f"^{failures_file}: line 1: not a JSON object$"):
        pack_images(lst, root, prefix, PACKED, resume=True)


def test_repack_resume_cuts_a_torn_last_line(tmp_path):
    source, prefix, partial = interrupted_repack(tmp_path, 2, labels=lambda k: float(k % 2))
    repack([source], tmp_path / "ref" / "o", REPACKED)
    assert b'"stage": "write"' in partial.read_bytes()
    with open(partial, "ab") as f:
        f.write(WRITE_LINE[:40])
    result = repack([source], prefix, REPACKED, resume=True)
    assert 0 < result.resumed_from < 80
    for name in ("o.rec", "o.idx", "o.failures.jsonl"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()


def test_repack_resume_over_a_position_outside_the_plan_is_an_error(tmp_path):
    source, prefix, partial = interrupted_repack(tmp_path, 2)
    number = partial.read_bytes().count(b"\n") + 1
    entry = json.loads(WRITE_LINE)
    with open(partial, "ab") as f:
        f.write(failure_line({**entry, "position": 80}))
    with pytest.raises(
        InputError, match=f"^{partial}: line {number}: position 80: not in the plan$"
    ):
        repack([source], prefix, REPACKED, resume=True)


def test_the_report_lists_the_lines_that_are_not_refusals_and_counts_the_rest(tmp_path):
    from rectool.report.data import ReportOptions
    from rectool.report.refusals import read_refusals
    from rectool.report.thumbs import ThumbBudget

    data = PACK_LINE + b"\n" + b'{"path": "a.jpg"}\n' + WRITE_LINE + b"[1]\n" + PACK_LINE[:20]
    write(tmp_path, data, "f.jsonl")
    manifest = {"failures_file": "f.jsonl"}
    out = read_refusals(
        manifest, str(tmp_path / "m.json"), ReportOptions(), ThumbBudget(1 << 20), 1
    )
    assert (out.total, out.bad_lines, out.note) == (2, [3, 5, 6], None)
    assert out.reasons == {"empty file": 2}
    assert [row[:3] for row in out.rows] == [
        (3, "bob/été.jpg", "empty file"),
        (None, "", "empty file"),
    ]


def test_the_report_lists_a_line_that_holds_no_text_as_a_bad_line(tmp_path):
    """A \\udc80 escape alone is half a UTF-16 pair: such a path or reason cannot be written to
    the page (it was a UnicodeEncodeError traceback); the line is listed as not a refusal."""
    from helpers.rec_files import make_pack

    pack = make_pack(tmp_path)
    failures_file = pack.manifest.parent / "faces.failures.jsonl"
    failures_file.write_bytes(
        PACK_LINE
        + PACK_LINE.replace(b"bob/", b"\\ud800/")
        + PACK_LINE.replace(b'"empty file"', b'"\\udfff"')
    )
    page = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", str(pack.manifest), "-o", str(page)])
    assert result.exit_code == 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "1 refusal," in result.stderr
    assert "Lines of the failures file that are not refusals" in page.read_text(encoding="utf-8")


# -- a failures file that disagrees with what the interrupted run wrote -------------------------
# Resume counts the lines of the partial failures file as items done: written records + lines =
# where to go on. A line that names an item past that point (or one listed twice) would move the
# point: an item skipped, never packed and never refused. Resume refuses such a file instead.


def test_pack_resume_over_a_line_naming_a_later_item_is_an_error(tree_with_refusals, tmp_path):
    root, lst, prefix, partial = interrupted_pack(tree_with_refusals, tmp_path)
    number = partial.read_bytes().count(b"\n") + 1
    with open(partial, "ab") as f:  # list line 80 is an image, far past where the run stopped
        f.write(failure_line({"line": 80, "index": 79, "path": "ann/x.jpg", "reason": "r"}))
    with pytest.raises(InputError) as caught:  # not an image skipped silently
        pack_images(lst, root, prefix, PACKED, resume=True)
    assert str(caught.value).startswith(
        f"{partial}: line {number}: list line 80: past where the interrupted run stopped ("
    )


def test_pack_resume_over_a_line_refused_twice_is_an_error(tree_with_refusals, tmp_path):
    root, lst, prefix, partial = interrupted_pack(tree_with_refusals, tmp_path)
    lines = partial.read_bytes().splitlines(keepends=True)
    assert lines and b'"line": 4,' in lines[0]  # every fourth item is empty: line 4 first
    with open(partial, "ab") as f:
        f.write(lines[0])
    with pytest.raises(InputError) as caught:
        pack_images(lst, root, prefix, PACKED, resume=True)
    assert str(caught.value) == f"{partial}: line {len(lines) + 1}: list line 4: refused twice"


def test_repack_resume_over_a_later_position_is_an_error(tmp_path):
    source, prefix, partial = interrupted_repack(tmp_path, 2)
    number = partial.read_bytes().count(b"\n") + 1
    entry = json.loads(WRITE_LINE)
    with open(partial, "ab") as f:  # position 78 holds an image that re-encodes
        f.write(failure_line({**entry, "position": 78}))
    with pytest.raises(InputError) as caught:  # not a record skipped silently
        repack([source], prefix, REPACKED, resume=True)
    assert str(caught.value).startswith(
        f"{partial}: line {number}: position 78: past where the interrupted run stopped ("
    )


def test_repack_resume_over_a_position_refused_twice_is_an_error(tmp_path):
    source, prefix, partial = interrupted_repack(tmp_path, 40)
    lines = partial.read_bytes().splitlines(keepends=True)
    assert b'"position": 1,' in lines[0]  # item 1 is broken: the first refusal
    with open(partial, "ab") as f:
        f.write(lines[0])
    with pytest.raises(InputError) as caught:
        repack([source], prefix, REPACKED, resume=True)
    assert str(caught.value) == f"{partial}: line {len(lines) + 1}: position 1: refused twice"
