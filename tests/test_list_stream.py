"""`rectool list` in memory bounded by the identities, not the images (issue 37).

`list_images` spools the walk's paths to a scratch file and writes identity by identity
(`rectool.packer.streamlist`). Its bytes are checked against the listing as it was before
(`helpers.listing_before`, frozen), on generated trees with non-ASCII names, nested
folders and links the rules follow or refuse; its memory against the number of images.
"""

from __future__ import annotations

import gc
import os
import tracemalloc

import pytest
from helpers.image_trees import Symlink, make_tree
from helpers.listing_before import listed_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rectool.packer import streamlist
from rectool.packer.listfile import label_map_path
from rectool.packer.listing import list_images, list_paths, make_listing, walk_tree

NAMES = ["a", "B", "é", "e\u0301", "王芳", "x y", "a.b", "Z9", "ñ", "_"]
FILES = ["1.jpg", "2.JPG", "3.png", "é.jpg", "a b.jpg", "n.txt", ".h.jpg", "z.Jpeg", "10.jpg"]
# Beside a subfolder `sub`: per-component path order differs from the strings' order.
FILES += ["sub.jpg", "sub 2.jpg", "sub-3.png"]


@st.composite
def trees(draw):
    """Return a `make_tree` spec of a ROOT and a sibling folder `outside`, with links."""
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
    root: dict = {}
    for name in names:
        folder = {f: None for f in draw(st.lists(st.sampled_from(FILES), max_size=6, unique=True))}
        if draw(st.booleans()):
            inner = draw(st.lists(st.sampled_from(FILES), max_size=4, unique=True))
            folder["sub"] = {f: None for f in inner}
            if draw(st.booleans()):
                folder["sub"]["deep"] = {"d.jpg": None, "c.jpg": None}
        for link in draw(st.lists(st.sampled_from(range(7)), max_size=3, unique=True)):
            other = draw(st.sampled_from(names))
            folder[f"l{link}"] = Symlink(
                [
                    "..",  # a loop
                    f"../{other}",  # another identity: a repeat
                    f"../{other}/sub",  # a subfolder, maybe missing: a repeat or broken
                    "../../outside",  # out of ROOT
                    "../../outside/o1",
                    f"../{other}/1.jpg",  # a file link, maybe broken
                    "../../root/.hidden_faces",  # a folder only reachable through links
                ][link]
            )
        root[name] = folder
    root[".hidden_faces"] = {"h1.jpg": None, "h2.png": None}
    if draw(st.booleans()):
        root["top_link"] = Symlink(draw(st.sampled_from(["outside", "../outside", names[0]])))
    if draw(st.booleans()):
        root["zz_empty"] = {}
    return {"root": root, "outside": {"o1": {"x.jpg": None}, "y.jpg": None}}


@st.composite
def listing_options(draw):
    options: dict = {}
    options["min_per_id"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        options["max_per_id"] = draw(st.integers(options["min_per_id"], 4))
    options["chunks"] = draw(st.integers(1, 3))
    ratios = draw(
        st.sampled_from(
            [{}, {"val_ratio": 0.25}, {"train_ratio": 0.6, "test_ratio": 0.2}, {"test_ratio": 0.5}]
        )
    )
    options.update(ratios)
    if ratios and draw(st.booleans()):
        options["split_by"] = "identity"
    if draw(st.booleans()):
        options["shuffle"] = True
        options["seed"] = draw(st.integers(0, 2**32 - 1))
    return options


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"shuffle": True, "seed": 5, "chunks": 2},
        {"val_ratio": 0.3, "split_by": "identity"},
        {"max_per_id": 2, "test_ratio": 0.2},
    ],
)
def test_the_mixed_tree_is_listed_as_before(mixed_tree, tmp_path, options):
    lists, label_map, before = listed_bytes(mixed_tree.root, **options)
    out = tmp_path / "faces.lst"
    listing = list_images(mixed_tree.root, out, **options)
    assert written(out, lists) == lists
    assert open(label_map_path(out), "rb").read() == label_map
    assert listing.summary()["skipped"] == before.summary()["skipped"]
    assert listing.summary()["skipped_examples"] == before.summary()["skipped_examples"]


def written(out, suffixes):
    return {suffix: open(path, "rb").read() for suffix, path in list_paths(out, suffixes).items()}


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    spec=trees(),
    options=listing_options(),
    threads=st.sampled_from([None, 1, 3]),
    outside=st.booleans(),
    recursive=st.booleans(),
)
def test_list_writes_the_bytes_it_wrote_before(
    tmp_path_factory, spec, options, threads, outside, recursive
):
    base = tmp_path_factory.mktemp("tree")
    make_tree(base, spec)
    root = base / "root"
    extra = {"allow_outside_root": outside, "recursive": recursive}
    try:
        lists, label_map, before = listed_bytes(root, **extra, **options)
    except Exception as error:  # the old listing refused: so must the new one
        with pytest.raises(type(error)):
            list_images(root, base / "out.lst", threads=threads, **extra, **options)
        return
    out = base / "out" / "faces.lst"
    if not before.image_count:
        with pytest.raises(Exception, match="no images to list"):
            list_images(root, out, threads=threads, **extra, **options)
        return
    listing = list_images(root, out, threads=threads, **extra, **options)
    assert written(out, lists) == lists
    assert open(label_map_path(out), "rb").read() == label_map
    assert sorted(os.listdir(out.parent)) == sorted(
        os.path.basename(p) for p in [*list_paths(out, lists).values(), label_map_path(out)]
    )  # nothing else: the spool has no name
    summary, expected = listing.summary(), before.summary()
    for key in ("images", "identities", "folders_scanned", "seed", "skipped", "skipped_examples"):
        assert summary[key] == expected[key], key
    assert listing.sizes == {suffix: len(rows) for suffix, rows in before.lists.items()}


@pytest.mark.parametrize("threads", [1, 4])
def test_a_list_to_a_stream_is_the_same_bytes(tmp_path, threads):
    make_tree(
        tmp_path / "t", {f"i{n:02d}": {f"{k}.jpg": None for k in range(n % 4)} for n in range(30)}
    )
    import io

    stream = io.BytesIO()
    list_images(tmp_path / "t", stream, threads=threads)
    lists, _, _ = listed_bytes(tmp_path / "t")
    assert stream.getvalue() == lists[""]


def peak_bytes(action):
    """Return the peak of Python's allocations while `action()` runs, in bytes."""
    gc.collect()
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def wide_tree(root, identities, per_identity):
    """Write `identities` folders of `per_identity` empty .jpg files (the walk reads no bytes)."""
    for i in range(identities):
        folder = root / f"identity_{i:05d}"
        folder.mkdir(parents=True)
        for n in range(per_identity):
            (folder / f"image_{n:05d}.jpg").touch()


@pytest.mark.parametrize("options", [{}, {"val_ratio": 0.1, "chunks": 2}])
def test_memory_grows_with_the_identities_not_the_images(tmp_path, options):
    # The same 150 identity folders with 4 and with 60 images each: 8,400 more paths. The
    # listing held every path (and a row for it), about 200 bytes each: 1.7 MB more. Now
    # only one identity's paths and a block of lines are held at a time.
    small, large = tmp_path / "small", tmp_path / "large"
    wide_tree(small, 150, 4)
    wide_tree(large, 150, 60)
    extra = 8400

    def list_tree(root):
        return lambda: list_images(root, tmp_path / root.name / "x.lst", threads=1, **options)

    growth = peak_bytes(list_tree(large)) - peak_bytes(list_tree(small))
    assert growth < 40 * extra  # 336 KB: 64 KB blocks of lines and one identity's paths

    def list_before(root):
        return lambda: make_listing(walk_tree(root, threads=1), **options)

    # The bound is one the listing held in memory does not meet.
    assert peak_bytes(list_before(large)) - peak_bytes(list_before(small)) > 100 * extra


def test_the_walk_hands_on_each_folders_images_as_it_reads_them(tmp_path, monkeypatch):
    # What the walk holds: the spool gets each folder's paths, one folder at a time, and
    # nothing keeps them (the list handed on is the folder's own).
    wide_tree(tmp_path / "t", 20, 3)
    (tmp_path / "t" / "identity_00003" / "nested").mkdir()
    (tmp_path / "t" / "identity_00003" / "nested" / "x.jpg").touch()
    handed = []
    real_add = streamlist.PathSpool.add

    def add(spool, identity, paths):
        handed.append((identity, sorted(paths)))
        real_add(spool, identity, paths)

    monkeypatch.setattr(streamlist.PathSpool, "add", add)
    list_images(tmp_path / "t", tmp_path / "x.lst", threads=1)
    assert len(handed) == 21  # 20 identity folders and the nested one
    assert all(len(paths) <= 3 for _, paths in handed)
    assert (3, ["identity_00003/nested/x.jpg"]) in handed


@given(total=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1))
def test_the_shuffle_in_steps_is_random_shuffle_s_permutation(total, seed):
    import random

    expected = list(range(total))
    random.Random(seed).shuffle(expected)
    steps = []
    rows = streamlist.shuffle_rows(random.Random(seed), total, lambda *a: steps.append(a), 7)
    assert rows.tolist() == expected
    assert steps[0] == ("shuffle", 0, total) and steps[-1][1] == (total if total > 1 else 0)
