"""rectool.packer.listing: walking an identity tree, labels, splits, chunks, the files written."""

from __future__ import annotations

import io
import os
import string
import threading
import unicodedata

import pytest
from helpers.image_trees import (
    MIXED_TREE_IDENTITIES,
    MIXED_TREE_IMAGES,
    MIXED_TREE_SKIPPED,
    Symlink,
    face_tree,
    make_tree,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rectool.errors import ListingError, RectoolError, UsageError
from rectool.packer import listing as listing_module
from rectool.packer import walk as walk_module
from rectool.packer.listfile import (
    find_label_map,
    format_list_line,
    format_list_lines,
    is_writable_path,
    read_label_map,
    read_list,
    unwritable_paths,
)
from rectool.packer.listing import (
    SKIP_REASONS,
    display_path,
    list_images,
    list_paths,
    make_listing,
    normalize_extensions,
    resolve_ratios,
    walk_tree,
    write_lists,
)


def rows_of(listing):
    return [row for rows in listing.lists.values() for row in rows]


# --- walking the tree ---------------------------------------------------------------------


def test_walk_lists_identities_in_code_point_order_with_their_images(mixed_tree):
    root, _ = mixed_tree
    walk = walk_tree(root)
    assert [identity.name for identity in walk.identities] == MIXED_TREE_IDENTITIES
    assert [
        (identity.name, path) for identity in walk.identities for path in identity.images
    ] == MIXED_TREE_IMAGES
    assert walk.image_count == len(MIXED_TREE_IMAGES)


def test_walk_counts_every_entry_it_passes_over_by_reason(mixed_tree):
    root, _ = mixed_tree
    walk = walk_tree(root)
    assert walk.skipped == MIXED_TREE_SKIPPED
    assert list(walk.skipped) == list(SKIP_REASONS)


def test_listed_paths_are_the_files_with_the_exact_bytes_of_their_names(mixed_tree):
    root, files = mixed_tree
    walk = walk_tree(root)
    for identity in walk.identities:
        for path in identity.images:
            with open(os.path.join(os.fsencode(root), path.encode("utf-8")), "rb") as f:
                data = f.read()
            # A symlinked image is followed: its bytes are those of its target.
            target = "alice/01.jpg" if path == "bob/link.jpg" else path
            assert data == files[target]


def test_nfc_and_nfd_spellings_stay_two_distinct_files(mixed_tree):
    root, _ = mixed_tree
    names = [path for identity in walk_tree(root).identities for path in identity.images]
    nfd, nfc = "José/e\u0301.jpg", "José/é.jpg"
    assert unicodedata.normalize("NFC", nfd) == nfc
    assert nfd in names and nfc in names


@pytest.mark.parametrize("threads", [1, 2, 8, 32])
def test_walk_result_does_not_depend_on_threads(mixed_tree, threads):
    root, _ = mixed_tree
    one = walk_tree(root, threads=1)
    many = walk_tree(root, threads=threads)
    assert many.identities == one.identities
    assert many.skipped == one.skipped
    assert many.folders == one.folders == 8


def test_extensions_are_case_insensitive_and_configurable(tmp_path):
    make_tree(tmp_path, {"a": {"1.JPG": None, "2.png": None, "3.Bmp": None, "4.gif": b"GIF8"}})
    walk = walk_tree(tmp_path, exts=["BMP", ".jpg"])
    assert walk.identities[0].images == ("a/1.JPG", "a/3.Bmp")
    assert walk.skipped["not_image"] == ["a/2.png", "a/4.gif"]


def test_default_extensions_cover_what_opencv_decodes_commonly(tmp_path):
    exts = ["jpg", "jpeg", "png", "bmp", "webp", "tif", "tiff"]
    make_tree(tmp_path, {"a": {f"x.{ext.upper()}": None for ext in exts} | {"y.gif": b"G"}})
    walk = walk_tree(tmp_path)
    assert len(walk.identities[0].images) == len(exts)
    assert walk.skipped["not_image"] == ["a/y.gif"]


def test_normalize_extensions():
    assert normalize_extensions(["JPG", ".Png", "jpg"]) == (".jpg", ".png")
    with pytest.raises(UsageError):
        normalize_extensions(["jpg", ""])
    with pytest.raises(UsageError):
        normalize_extensions([])


def test_recursive_is_the_default_and_no_recursive_counts_subfolders(tmp_path):
    make_tree(tmp_path, {"a": {"1.jpg": None, "s": {"2.jpg": None, "t": {"3.jpg": None}}}})
    assert walk_tree(tmp_path).identities[0].images == ("a/1.jpg", "a/s/2.jpg", "a/s/t/3.jpg")
    flat = walk_tree(tmp_path, recursive=False)
    assert flat.identities[0].images == ("a/1.jpg",)
    assert flat.skipped["subfolder"] == ["a/s"]


def test_nested_images_sort_by_folder_then_name(tmp_path):
    # As strings "a/b.jpg" > "a/b/c.jpg" ("." < "/"); by path components the folder b
    # sorts after the file name "b.jpg" ("b" < "b.jpg").
    make_tree(tmp_path, {"a": {"b.jpg": None, "b": {"c.jpg": None}, "a.jpg": None}})
    assert walk_tree(tmp_path, threads=4).identities[0].images == (
        "a/a.jpg",
        "a/b/c.jpg",
        "a/b.jpg",
    )


def test_symlinked_identity_and_subfolders_are_followed(tmp_path):
    make_tree(tmp_path / "elsewhere", {"p": {"1.jpg": None}, "2.jpg": None})
    root = tmp_path / "faces"
    make_tree(root, {"a": {"more": Symlink(str(tmp_path / "elsewhere" / "p"))}})
    os.symlink(tmp_path / "elsewhere", root / "b")
    # Both links lead out of ROOT: followed only when that is allowed.
    walk = walk_tree(root, allow_outside_root=True)
    assert [(i.name, i.images) for i in walk.identities] == [
        ("a", ("a/more/1.jpg",)),
        ("b", ("b/2.jpg",)),  # b/p is a/more, listed first (links go in path order)
    ]
    assert walk.skipped["symlink_repeat"] == ["b/p"]
    walk = walk_tree(root)
    assert walk.identities == []
    assert walk.skipped["outside_root"] == ["a/more", "b"]


@pytest.mark.parametrize("threads", [1, 4])
def test_symlink_loops_end_and_are_counted(tmp_path, threads):
    make_tree(
        tmp_path / "faces",
        {
            "a": {"1.jpg": None, "self": Symlink("."), "up": Symlink("..")},
            "b": {"2.jpg": None, "x": {"to_c": Symlink("../../c")}},
            "c": {"3.jpg": None, "to_b_x": Symlink("../b/x")},
            "root": Symlink("."),
        },
    )
    walk = walk_tree(tmp_path / "faces", threads=threads)
    # Every folder is listed once, by its real path: b/x/to_c is c, c/to_b_x is b/x.
    assert [(i.name, i.images) for i in walk.identities] == [
        ("a", ("a/1.jpg",)),
        ("b", ("b/2.jpg",)),
        ("c", ("c/3.jpg",)),
    ]
    assert walk.skipped["symlink_loop"] == ["a/self", "a/up", "root"]
    assert walk.skipped["symlink_repeat"] == ["b/x/to_c", "c/to_b_x"]
    assert walk.folders == 4


def test_two_links_to_one_folder_list_it_once(tmp_path):
    make_tree(tmp_path, {"a": {"1.jpg": None}, "b": {"x": Symlink("../a"), "y": Symlink("../a")}})
    walk = walk_tree(tmp_path)
    assert [(i.name, i.images) for i in walk.identities] == [("a", ("a/1.jpg",))]
    assert walk.skipped["symlink_repeat"] == ["b/x", "b/y"]


def make_unreadable(monkeypatch, path):
    """Make `path` unreadable: by permissions, and by patching when root ignores them."""
    os.chmod(path, 0)
    real = os.scandir
    blocked = os.fspath(path)

    def scandir(target="."):
        if os.fspath(target) == blocked:
            raise PermissionError(13, "Permission denied", blocked)
        return real(target)

    if os.geteuid() == 0:
        monkeypatch.setattr(listing_module.os, "scandir", scandir)
    return lambda: os.chmod(path, 0o755)


def test_unreadable_folders_are_counted_and_the_rest_listed(tmp_path, monkeypatch):
    make_tree(tmp_path, {"a": {"1.jpg": None, "s": {"2.jpg": None}}, "b": {"3.jpg": None}})
    restore_b = make_unreadable(monkeypatch, tmp_path / "b")
    restore_s = make_unreadable(monkeypatch, tmp_path / "a" / "s")
    try:
        walk = walk_tree(tmp_path, threads=3)
    finally:
        restore_b()
        restore_s()
    assert [(i.name, i.images) for i in walk.identities] == [("a", ("a/1.jpg",))]
    assert walk.skipped["unreadable_folder"] == ["a/s", "b"]
    # An unreadable identity is reported as unreadable, not also as empty.
    assert walk.skipped["empty_identity"] == []


def test_an_unreadable_root_is_an_error(tmp_path, monkeypatch):
    root = tmp_path / "faces"
    root.mkdir()
    restore = make_unreadable(monkeypatch, root)
    try:
        with pytest.raises(ListingError, match="cannot read the root folder"):
            walk_tree(root)
    finally:
        restore()


def test_walk_reports_progress_from_the_calling_thread(tmp_path):
    face_tree(tmp_path, identities=5, per_identity=2)
    calls = []
    walk_tree(tmp_path, threads=2, progress=lambda folders, images: calls.append((folders, images)))
    assert calls[-1] == (5, 10)
    assert calls == sorted(calls)


def test_walk_rejects_zero_threads(tmp_path):
    with pytest.raises(UsageError):
        walk_tree(tmp_path, threads=0)


# --- labels, shuffling, splits, chunks -------------------------------------------------------


def test_labels_follow_identity_names_and_indices_follow_output_order(mixed_tree):
    root, _ = mixed_tree
    listing = make_listing(walk_tree(root))
    label_of = {name: label for label, name in enumerate(MIXED_TREE_IDENTITIES)}
    assert listing.identities == dict(enumerate(MIXED_TREE_IDENTITIES))
    assert listing.lists == {
        "": [(i, label_of[name], path) for i, (name, path) in enumerate(MIXED_TREE_IMAGES)]
    }
    assert listing.seed is None


def test_min_and_max_per_identity(tmp_path):
    make_tree(
        tmp_path,
        {
            "a": {f"{n}.jpg": None for n in range(1)},
            "b": {f"{n}.jpg": None for n in range(3)},
            "c": {f"{n}.jpg": None for n in range(5)},
        },
    )
    listing = make_listing(walk_tree(tmp_path), min_per_id=2, max_per_id=3)
    assert listing.identities == {0: "b", 1: "c"}
    assert rows_of(listing) == [
        (0, 0, "b/0.jpg"),
        (1, 0, "b/1.jpg"),
        (2, 0, "b/2.jpg"),
        (3, 1, "c/0.jpg"),
        (4, 1, "c/1.jpg"),
        (5, 1, "c/2.jpg"),
    ]
    assert listing.skipped["below_min_per_id"] == ["a"]
    assert listing.skipped["above_max_per_id"] == ["c/3.jpg", "c/4.jpg"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_per_id": 0}, "--min-per-id must be at least 1, got 0"),
        ({"min_per_id": 3, "max_per_id": 2}, "--max-per-id 2 is below --min-per-id 3"),
        ({"seed": 1}, "--seed needs --shuffle"),
        ({"split_by": "person"}, "--split-by must be one of image, identity, got 'person'"),
        ({"split_by": "identity"}, "--split-by identity needs --train-ratio, --val-ratio or"),
        ({"chunks": 0}, "--chunks must be at least 1, got 0"),
        (
            {"train_ratio": 0.5, "val_ratio": 0.6},
            r"add up to 1: --train-ratio 0.5 \+ --val-ratio 0.6 = 1.1 > 1$",
        ),
        (
            {"val_ratio": 0.5, "test_ratio": 0.6},
            r"add up to 1: --val-ratio 0.5 \+ --test-ratio 0.6 = 1.1 > 1$",
        ),
        (
            {"train_ratio": 0.5, "val_ratio": 0.2, "test_ratio": 0.2},
            r"add up to 1: --train-ratio 0.5 \+ --val-ratio 0.2 \+ --test-ratio 0.2 = 0.9$",
        ),
    ],
)
def test_make_listing_refuses_options_that_cannot_work(tmp_path, kwargs, message):
    face_tree(tmp_path, 2, 2)
    with pytest.raises(UsageError, match=message):
        make_listing(walk_tree(tmp_path), **kwargs)


def test_shuffle_is_a_seeded_permutation_with_fresh_indices(tmp_path):
    face_tree(tmp_path, identities=4, per_identity=5)
    walk = walk_tree(tmp_path)
    plain = rows_of(make_listing(walk))
    first = rows_of(make_listing(walk, shuffle=True, seed=7))
    again = rows_of(make_listing(walk, shuffle=True, seed=7))
    other = rows_of(make_listing(walk, shuffle=True, seed=8))
    assert first == again
    assert first != other
    assert [index for index, _, _ in first] == list(range(20))
    assert sorted((label, path) for _, label, path in first) == [(lb, p) for _, lb, p in plain]
    assert [(label, path) for _, label, path in first] != [(lb, p) for _, lb, p in plain]


def test_shuffle_without_seed_draws_one_and_reports_it(tmp_path):
    face_tree(tmp_path, identities=3, per_identity=4)
    walk = walk_tree(tmp_path)
    listing = make_listing(walk, shuffle=True)
    assert isinstance(listing.seed, int)
    assert rows_of(make_listing(walk, shuffle=True, seed=listing.seed)) == rows_of(listing)


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ((None, None, None), None),
        ((1.0, None, None), None),
        ((0.8, None, None), (0.8, 0.2, 0.0)),
        ((0.8, None, 0.1), (0.8, 0.1, 0.1)),
        ((None, 0.1, None), (0.9, 0.1, 0.0)),
        ((None, None, 0.25), (0.75, 0.0, 0.25)),
        ((0.5, 0.25, None), (0.5, 0.25, 0.25)),
        ((0.7, 0.2, 0.1), (0.7, 0.2, 0.1)),
        # A val ratio given is a split, however small; the rest of 0.7 + 0.3 is no test list.
        ((None, 1e-10, None), (1.0, 1e-10, 0.0)),
        ((0.7, 0.3, None), (0.7, 0.3, 0.0)),
        ((None, 0.0, None), None),
    ],
)
def test_resolve_ratios(ratios, expected):
    result = resolve_ratios(*ratios)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


@pytest.mark.parametrize(
    "ratios", [(0.7, 0.2, 0.2), (0.5, 0.2, 0.2), (1.5, None, None), (None, 0.6, 0.6)]
)
def test_resolve_ratios_refuses_what_does_not_add_up(ratios):
    with pytest.raises(UsageError):
        resolve_ratios(*ratios)


def test_split_by_image_cuts_runs_in_order(tmp_path):
    face_tree(tmp_path, identities=2, per_identity=5)
    listing = make_listing(walk_tree(tmp_path), train_ratio=0.6, val_ratio=0.2, test_ratio=0.2)
    assert {k: [r[0] for r in v] for k, v in listing.lists.items()} == {
        "_train": [0, 1, 2, 3, 4, 5],
        "_val": [6, 7],
        "_test": [8, 9],
    }


def test_split_only_writes_splits_with_a_positive_ratio(tmp_path):
    face_tree(tmp_path, identities=2, per_identity=5)
    listing = make_listing(walk_tree(tmp_path), train_ratio=0.9)
    assert {k: len(v) for k, v in listing.lists.items()} == {"_train": 9, "_val": 1}


def test_split_by_identity_keeps_each_identity_in_one_split(tmp_path):
    face_tree(tmp_path, identities=10, per_identity=3)
    listing = make_listing(
        walk_tree(tmp_path),
        shuffle=True,
        seed=3,
        train_ratio=0.6,
        val_ratio=0.2,
        test_ratio=0.2,
        split_by="identity",
    )
    labels = {split: {row[1] for row in rows} for split, rows in listing.lists.items()}
    assert sorted(labels) == ["_test", "_train", "_val"]
    assert [len(labels[s]) for s in ("_train", "_val", "_test")] == [6, 2, 2]
    assert not labels["_train"] & labels["_val"]
    assert not labels["_train"] & labels["_test"]
    assert not labels["_val"] & labels["_test"]
    indices = sorted(row[0] for row in rows_of(listing))
    assert indices == list(range(30))
    for rows in listing.lists.values():
        assert [row[0] for row in rows] == sorted(row[0] for row in rows)


def test_split_by_identity_without_shuffle_takes_identities_in_name_order(tmp_path):
    face_tree(tmp_path, identities=4, per_identity=2)
    listing = make_listing(walk_tree(tmp_path), test_ratio=0.25, split_by="identity")
    assert {k: sorted({r[1] for r in v}) for k, v in listing.lists.items()} == {
        "_train": [0, 1, 2],
        "_test": [3],
    }


def test_chunks_are_nearly_equal_runs_with_global_indices(tmp_path):
    face_tree(tmp_path, identities=2, per_identity=5)
    listing = make_listing(walk_tree(tmp_path), chunks=3)
    assert {k: [r[0] for r in v] for k, v in listing.lists.items()} == {
        "_0": [0, 1, 2],
        "_1": [3, 4, 5],
        "_2": [6, 7, 8, 9],
    }


def test_chunks_and_splits_combine(tmp_path):
    face_tree(tmp_path, identities=2, per_identity=5)
    listing = make_listing(walk_tree(tmp_path), chunks=2, train_ratio=0.6)
    assert {k: [r[0] for r in v] for k, v in listing.lists.items()} == {
        "_0_train": [0, 1, 2],
        "_0_val": [3, 4],
        "_1_train": [5, 6, 7],
        "_1_val": [8, 9],
    }


# --- writing -------------------------------------------------------------------------------


def test_list_paths_follow_im2rec_names():
    assert list_paths("d/faces.lst", ["", "_train", "_0_val"]) == {
        "": "d/faces.lst",
        "_train": "d/faces_train.lst",
        "_0_val": "d/faces_0_val.lst",
    }
    assert list_paths("faces", ["", "_1"]) == {"": "faces", "_1": "faces_1.lst"}


def test_write_lists_writes_lines_and_the_label_map(mixed_tree, tmp_path):
    root, _ = mixed_tree
    out = tmp_path / "out" / "faces.lst"
    out.parent.mkdir()
    listing = write_lists(make_listing(walk_tree(root)), out)
    label_of = {name: label for label, name in enumerate(MIXED_TREE_IDENTITIES)}
    expected = "".join(
        f"{i}\t{label_of[name]}\t{path}\n" for i, (name, path) in enumerate(MIXED_TREE_IMAGES)
    )
    assert out.read_bytes() == expected.encode("utf-8")
    labels = tmp_path / "out" / "faces.labels.tsv"
    assert labels.read_text(encoding="utf-8") == "".join(
        f"{label}\t{name}\n" for label, name in enumerate(MIXED_TREE_IDENTITIES)
    )
    assert listing.written == {"": str(out)}
    assert listing.label_map == str(labels)
    assert [(item.index, item.label, item.path) for item in read_list(out)] == [
        (i, float(label_of[name]), path) for i, (name, path) in enumerate(MIXED_TREE_IMAGES)
    ]
    assert read_label_map(labels) == dict(enumerate(MIXED_TREE_IDENTITIES))
    assert sorted(os.listdir(out.parent)) == ["faces.labels.tsv", "faces.lst"]


def test_split_lists_share_one_label_map_that_each_finds(tmp_path):
    face_tree(tmp_path / "faces", identities=2, per_identity=5)
    out = tmp_path / "faces.lst"
    listing = make_listing(walk_tree(tmp_path / "faces"), chunks=2, test_ratio=0.2)
    write_lists(listing, out)
    written = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert written == [
        "faces.labels.tsv",
        "faces_0_test.lst",
        "faces_0_train.lst",
        "faces_1_test.lst",
        "faces_1_train.lst",
    ]
    for name in written[1:]:
        assert find_label_map(tmp_path / name) == str(tmp_path / "faces.labels.tsv")


def test_write_lists_to_a_stream_writes_the_label_map_only_when_asked(tmp_path):
    face_tree(tmp_path / "faces", identities=2, per_identity=1)
    listing = make_listing(walk_tree(tmp_path / "faces"))
    stream = io.BytesIO()
    write_lists(listing, stream)
    assert stream.getvalue() == b"0\t0\tid0/00.jpg\n1\t1\tid1/00.jpg\n"
    assert listing.label_map is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faces"]
    write_lists(listing, io.BytesIO(), labels=tmp_path / "l.tsv")
    assert (tmp_path / "l.tsv").read_text() == "0\tid0\n1\tid1\n"


def test_a_stream_takes_no_split(tmp_path):
    face_tree(tmp_path, identities=2, per_identity=2)
    with pytest.raises(UsageError, match=r"OUT - \(standard output\) takes a single list"):
        write_lists(make_listing(walk_tree(tmp_path), chunks=2), io.BytesIO())


def test_an_unwritable_output_is_a_listing_error(tmp_path):
    face_tree(tmp_path / "faces", identities=1, per_identity=1)
    (tmp_path / "blocked").write_text("a file where the folder should be")
    with pytest.raises(ListingError, match="exists and is not a folder"):
        list_images(tmp_path / "faces", tmp_path / "blocked" / "x.lst")


def test_list_images_refuses_a_tree_without_images(tmp_path):
    make_tree(tmp_path / "faces", {"a": {"x.txt": None}, "b": {}})
    with pytest.raises(ListingError, match="no images to list") as err:
        list_images(tmp_path / "faces", tmp_path / "x.lst")
    assert "1 not_image, 2 empty_identity" in str(err.value)
    assert not (tmp_path / "x.lst").exists()


def test_list_images_checks_options_before_walking(tmp_path):
    with pytest.raises(UsageError):
        list_images(tmp_path / "does-not-exist", tmp_path / "x.lst", seed=3)
    with pytest.raises(UsageError):
        list_images(tmp_path / "does-not-exist", io.BytesIO(), chunks=2)


def test_listing_errors_are_rectool_errors():
    assert issubclass(ListingError, RectoolError)


def test_summary_counts_every_reason(mixed_tree):
    root, _ = mixed_tree
    listing = make_listing(walk_tree(root))
    summary = listing.summary()
    assert summary["images"] == len(MIXED_TREE_IMAGES)
    assert summary["identities"] == len(MIXED_TREE_IDENTITIES)
    assert summary["skipped"] == {k: len(v) for k, v in MIXED_TREE_SKIPPED.items()}
    assert summary["skipped_examples"]["unwritable_name"][2:] == [
        "alice/tab\\tname.jpg",
        "caf\\xe9",
        "carol\\tx",
    ]


def test_display_path_escapes_what_a_terminal_would_mangle():
    assert display_path("a\tb\nc\rd") == "a\\tb\\nc\\rd"
    assert display_path(os.fsdecode(b"caf\xe9")) == "caf\\xe9"
    assert display_path("José/王") == "José/王"


# --- .lst helpers in listfile ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "writable"),
    [
        ("a/b.jpg", True),
        ("José/照片 1.jpg", True),
        ("a\tb", False),
        ("a\nb", False),
        ("a\rb", False),
        (" a", False),
        ("a ", False),
        ("a\u3000", False),
        (os.fsdecode(b"\xff"), False),
        ("a\u200bb", True),
    ],
)
def test_is_writable_path(path, writable):
    assert is_writable_path(path) is writable
    assert unwritable_paths(["ok", path]) == ([] if writable else [path])


names = st.text(
    alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)


@given(st.lists(names, min_size=1, max_size=8))
def test_unwritable_paths_agrees_with_is_writable_path(paths):
    assert unwritable_paths(paths) == [p for p in paths if not is_writable_path(p)]


@given(
    st.lists(
        st.tuples(st.integers(0, 10**12), st.integers(0, 2**24), names.map(lambda s: "a/" + s)),
        max_size=20,
    )
)
def test_format_list_lines_matches_format_list_line(rows):
    assert format_list_lines(rows) == "".join(format_list_line(i, lb, p) for i, lb, p in rows)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(names, min_size=1, max_size=6, unique=True))
def test_any_file_name_is_listed_exactly_or_counted(tmp_path_factory, file_names):
    root = tmp_path_factory.mktemp("names")
    identity = root / "id"
    identity.mkdir()
    for name in file_names:
        (identity / (name + ".jpg")).write_bytes(b"x")
    walk = walk_tree(root, threads=2)
    listed = [p for i in walk.identities for p in i.images]
    on_disk = sorted("id/" + n + ".jpg" for n in file_names)
    hidden = [p for p in on_disk if p.startswith("id/.")]
    bad = [p for p in on_disk if p not in hidden and not is_writable_path(p[3:])]
    assert sorted(listed) == sorted(set(on_disk) - set(hidden) - set(bad))
    assert walk.skipped["hidden"] == hidden and sorted(walk.skipped["unwritable_name"]) == bad
    for path in listed:
        assert (root / path).read_bytes() == b"x"
        assert format_list_line(0, 0, path).split("\t")[2][:-1] == path


def test_printable_ascii_file_names_round_trip_through_the_list(tmp_path):
    allowed = "".join(c for c in string.printable if c not in "/\t\n\r\x0b\x0c")
    names = sorted({allowed[i : i + 7].strip() + ".jpg" for i in range(0, len(allowed), 7)})
    names = [n for n in names if not n.startswith(".")]
    make_tree(tmp_path / "faces", {"id": dict.fromkeys(names)})
    out = tmp_path / "x.lst"
    list_images(tmp_path / "faces", out)
    assert [item.path for item in read_list(out)] == sorted("id/" + n for n in names)


def walk_with_latency(monkeypatch, root, seconds, **options):
    """Walk with every folder listing under `root` taking `seconds` on the listing clock (a
    virtual one: no sleeping, whatever the machine's load); return (result, pools), pools
    being (thread pool size, folders listed on other threads than this one) per pool made."""
    real_scandir, real_pool = os.scandir, walk_module.ThreadPoolExecutor
    caller = threading.get_ident()
    pools = []
    now = [0.0]

    def slow_scandir(path="."):
        if os.fspath(path) != os.fspath(root):
            now[0] += seconds
            if threading.get_ident() != caller:
                pools[-1][1] += 1
        return real_scandir(path)

    def counting_pool(max_workers=None, **kwargs):
        pools.append([max_workers, 0])
        return real_pool(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(listing_module.os, "scandir", slow_scandir)
    monkeypatch.setattr(walk_module, "ThreadPoolExecutor", counting_pool)
    monkeypatch.setattr(walk_module, "listing_clock", lambda: now[0])
    result = walk_tree(root, **options)
    return result, [tuple(pool) for pool in pools]


def test_default_threads_start_when_folders_list_slowly(tmp_path, monkeypatch):
    face_tree(tmp_path, identities=40, per_identity=1)
    fast, fast_pools = walk_with_latency(monkeypatch, tmp_path, 0.0)
    assert fast_pools == []  # a fast disk: all on the calling thread
    slow, slow_pools = walk_with_latency(monkeypatch, tmp_path, 0.002)
    # 16 folders timed on the calling thread, the other 24 listed by the pool.
    assert slow_pools == [(listing_module.default_threads(), 40 - 16)]
    assert slow.identities == fast.identities
    _, forced = walk_with_latency(monkeypatch, tmp_path, 0.0, threads=3)
    assert forced == [(3, 40)]


def test_the_label_map_is_written_before_the_first_list_line(tmp_path):
    # A `pack -` at the other end of a pipe reads the label map once the list has arrived.
    face_tree(tmp_path / "faces", identities=2, per_identity=2)
    labels = tmp_path / "map.tsv"
    seen = []

    class Stream(io.BytesIO):
        def write(self, data):
            seen.append(labels.exists())
            return super().write(data)

    stream = Stream()
    list_images(tmp_path / "faces", stream, labels=labels)
    assert seen and all(seen)
    assert len(stream.getvalue().splitlines()) == 4
