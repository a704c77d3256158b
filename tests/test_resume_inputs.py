"""What `pack --resume` reads of an interrupted run goes through the input door.

The state file (`PREFIX.pack-state.json`) and a shard's `.idx.partial` are files an earlier run
wrote, but anything may have replaced them since: bad bytes are an error naming the file, never
a traceback, and a file that is not regular (here a FIFO, which would hang a plain `open`) is
refused before it is read.
"""

from __future__ import annotations

import os

import pytest
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree

from rectool.errors import InputError, RectoolError
from rectool.packer.images import Transform
from rectool.packer.manifest import STATE_SUFFIX
from rectool.packer.packing import PackOptions, pack_images
from rectool.repack.pipeline import RepackOptions, repack

OPTIONS = PackOptions(transform=Transform(resize=12), workers=1, max_failures=100)


@pytest.fixture
def interrupted(tmp_path):
    """An image tree, its list and the prefix of a pack interrupted after a few images."""
    items = write_pack_tree(tmp_path / "tree", ["ann", "bob"], 40, height=16, width=16)
    lst = write_list(tmp_path / "t.lst", items)
    prefix = tmp_path / "out" / "t"

    def stop(done, total, refused):
        if done >= 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack_images(lst, tmp_path / "tree", prefix, OPTIONS, progress=stop)
    assert os.path.exists(f"{prefix}{STATE_SUFFIX}")
    return tmp_path / "tree", lst, prefix


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "not a pack state file: Expecting property name"),
        (b"\xff\xfe{}", "not a pack state file: "),
        (b"[1, 2]", "not a pack state file: not a JSON object"),
        (b'{"list_sha256": 5}', "not a pack state file: list_sha256 is not a str"),
        (b'{"options": "fast"}', "not a pack state file: options is not a dict"),
    ],
)
def test_a_bad_state_file_is_an_error_naming_it(interrupted, content, why):
    root, lst, prefix = interrupted
    state = f"{prefix}{STATE_SUFFIX}"
    with open(state, "wb") as f:
        f.write(content)
    with pytest.raises(InputError) as caught:
        pack_images(lst, root, prefix, OPTIONS, resume=True)
    assert str(caught.value).startswith(f"{state}: {why}")


def test_a_state_file_that_is_a_fifo_is_refused_unread(interrupted, no_hang):
    root, lst, prefix = interrupted
    state = f"{prefix}{STATE_SUFFIX}"
    os.unlink(state)
    os.mkfifo(state)  # a plain open() would wait for a writer forever
    with pytest.raises(RectoolError, match=f"^{state}: "):
        pack_images(lst, root, prefix, OPTIONS, resume=True)


def test_a_partial_index_that_is_a_fifo_is_refused_unread(interrupted, no_hang):
    root, lst, prefix = interrupted
    partial = f"{prefix}.idx.partial"
    assert os.path.exists(partial)
    os.unlink(partial)
    os.mkfifo(partial)
    with pytest.raises(RectoolError, match=f"^{partial}: "):
        pack_images(lst, root, prefix, OPTIONS, resume=True)


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"[1, 2]", "not a repack state: not a JSON object"), (b"{oops", "not a repack state: ")],
)
def test_a_bad_repack_state_file_is_an_error_naming_it(tmp_path, content, why):
    items = [(k, jpeg_bytes(k, 12, 10), 0.0) for k in range(80)]
    write_pack(tmp_path / "src", [items])
    options = RepackOptions(transform=Transform(quality=70), workers=1)
    prefix = tmp_path / "out" / "o"

    def stop(done, total, refused):
        if done >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack([tmp_path / "src"], prefix, options, progress=stop)
    state = f"{prefix}{STATE_SUFFIX}"
    with open(state, "wb") as f:
        f.write(content)
    with pytest.raises(RectoolError) as caught:
        repack([tmp_path / "src"], prefix, options, resume=True)
    assert str(caught.value).startswith(f"{state}: {why}")
    assert str(caught.value).endswith("; start again with --overwrite")
