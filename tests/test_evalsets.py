"""`rectool.repack.evalsets`: insightface's verification sets read without running the pickle.

The files are made here: by the standard pickler (protocols 2 to 5), by Python 2.7.18 (a
literal below), or opcode by opcode; expected values are the lists the test pickled.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import shlex
import struct

import pytest

from rectool.errors import RectoolError
from rectool.repack import evalsets
from rectool.repack.evalsets import is_eval_set, read_eval_set

IMAGES = [b"\xff\xd8\xff\xe0one", b"\xff\xd8\xff\xe0" + bytes(range(256)) * 2, b"z", b"\x00\x80"]
FLAGS = [True, False]

# pickle.dumps((bins, [True, False]), pickle.HIGHEST_PROTOCOL) run by Python 2.7.18 with
# bins = ['\xff\xd8\xff\xe0', 'y' * 300, 'z', '\x00\x80\xff'] (Python 2 str): protocol 2, the
# short strings as SHORT_BINSTRING, the long one as BINSTRING, the flags NEWTRUE/NEWFALSE.
PY2_PICKLE = (
    b"\x80\x02]q\x00(U\x04\xff\xd8\xff\xe0q\x01T,\x01\x00\x00"
    + b"y" * 300
    + b"q\x02U\x01zq\x03U\x03\x00\x80\xffq\x04e]q\x05(\x88\x89e\x86q\x06."
)
PY2_IMAGES = [b"\xff\xd8\xff\xe0", b"y" * 300, b"z", b"\x00\x80\xff"]


def write(tmp_path, data, name="lfw.bin"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def refused(path, *words):
    with pytest.raises(RectoolError) as info:
        read_eval_set(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    for word in words:
        assert word in message, message
    return message


# -- what is read ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_reads_pickles_of_every_protocol_insightface_may_write(tmp_path, protocol):
    path = write(tmp_path, pickle.dumps((IMAGES, FLAGS), protocol=protocol))
    got = read_eval_set(path)
    assert got.images == IMAGES and got.issame == FLAGS
    assert [type(image) for image in got.images] == [bytes] * 4


def test_reads_a_python2_pickle_of_str_images_as_bytes(tmp_path):
    ops = {op.name for op, _, _ in pickletools.genops(PY2_PICKLE)}
    assert {"SHORT_BINSTRING", "BINSTRING"} <= ops  # the fixture is what it claims to be
    got = read_eval_set(write(tmp_path, PY2_PICKLE))
    assert got.images == PY2_IMAGES and got.issame == [True, False]


def test_protocol_2_by_python3_is_read_with_only_its_latin1_call(tmp_path):
    data = pickle.dumps((IMAGES[:2], [True]), protocol=2)
    assert b"c_codecs\nencode\n" in data  # Python 3 writes bytes as _codecs.encode(str, ...)
    assert read_eval_set(write(tmp_path, data)).images == IMAGES[:2]


def test_a_big_set_of_jpeg_sized_images(tmp_path):
    images = [bytes([k % 251]) * (3000 + k) for k in range(2000)]
    flags = [k % 3 == 0 for k in range(1000)]
    got = read_eval_set(write(tmp_path, pickle.dumps((images, flags), protocol=4)))
    assert got.images == images and got.issame == flags


def test_is_eval_set_means_a_bin_file_not_a_folder(tmp_path):
    (tmp_path / "lfw.bin").write_bytes(b"")
    (tmp_path / "folder.bin").mkdir()
    assert is_eval_set(tmp_path / "lfw.bin") and is_eval_set(tmp_path / "AGEDB_30.BIN")
    assert is_eval_set(str(tmp_path / "missing.bin"))  # read, and said to be missing
    assert not is_eval_set(tmp_path / "folder.bin") and not is_eval_set(tmp_path / "lfw")


# -- what is refused, and nothing runs -------------------------------------------------------------


class _System:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize(
    ("protocol", "words"),
    [
        (2, "refused global posix.system"),  # GLOBAL
        (3, "refused global posix.system"),
        (4, "refused opcode STACK_GLOBAL"),
        (5, "refused opcode STACK_GLOBAL"),
    ],
)
def test_a_reduce_calling_os_system_is_refused_without_running(tmp_path, protocol, words):
    marker = tmp_path / "ran"
    payload = ([_System(f"touch {shlex.quote(str(marker))}"), IMAGES[1]], [True])
    data = pickle.dumps(payload, protocol=protocol)
    # The payload is live: a plain pickle.loads runs it (the control for this test).
    pickle.loads(data)
    assert marker.exists()
    marker.unlink()
    refused(write(tmp_path, data), words)
    assert not marker.exists()


def test_stack_global_is_refused(tmp_path):
    marker = tmp_path / "ran"
    data = pickle.dumps(_System(f"touch {shlex.quote(str(marker))}"), protocol=4)
    assert "STACK_GLOBAL" in {op.name for op, _, _ in pickletools.genops(data)}
    refused(write(tmp_path, data), "STACK_GLOBAL")
    assert not marker.exists()


def test_a_global_other_than_latin1_encoding_is_refused_by_the_unpickler_too(tmp_path, monkeypatch):
    # Past the opcode check (patched out), find_class still admits no global.
    marker = tmp_path / "ran"
    data = pickle.dumps((IMAGES, [_System(f"touch {shlex.quote(str(marker))}")]), protocol=2)
    path = write(tmp_path, data)
    monkeypatch.setattr(evalsets, "_check_opcodes", lambda path, data: None)
    refused(path, "cannot unpickle", "refused global posix.system")
    assert not marker.exists()


def test_codecs_encode_with_another_encoding_is_refused(tmp_path):
    data = pickle.dumps(([b"ab", b"cd"], [True]), protocol=2).replace(b"latin1", b"utf_16")
    refused(write(tmp_path, data), "refused call")


def test_a_huge_declared_length_is_refused_without_allocating_it(tmp_path):
    # BINBYTES8 declaring 2**62 bytes in a 30-byte file.
    data = b"\x80\x04](\x8e" + struct.pack("<Q", 1 << 62) + b"\xff\xd8" + b"e]\x88a\x86."
    refused(write(tmp_path, data), "damaged pickle")
    data = b"\x80\x02](T" + struct.pack("<i", 2**31 - 1) + b"\xff\xd8e]\x88a\x86."  # BINSTRING
    refused(write(tmp_path, data), "damaged pickle")


def test_a_huge_memo_index_is_refused(tmp_path):
    # LONG_BINPUT 2**31 - 1: the unpickler would make room for that many memo entries.
    data = b"\x80\x02]r" + struct.pack("<I", 2**31 - 1) + b"(U\x01aU\x01be]\x88a\x86."
    refused(write(tmp_path, data), "LONG_BINPUT 2,147,483,647: a memo index over 1,000,000")
    ok = data.replace(struct.pack("<I", 2**31 - 1), struct.pack("<I", 999_999))
    assert read_eval_set(write(tmp_path, ok, "ok.bin")).images == [b"a", b"b"]


def test_deep_nesting_is_refused(tmp_path):
    lists = b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b"]\x88a\x86."
    refused(write(tmp_path, lists), "not bytes or a bool")
    marks = b"\x80\x02" + b"(" * 100_000 + b"."
    refused(write(tmp_path, marks, "marks.bin"), "nested MARK")
    tuples = pickle.dumps(((((IMAGES, FLAGS),),),), protocol=2)
    refused(write(tmp_path, tuples, "tuples.bin"), "refused opcode TUPLE1")


def test_more_objects_than_the_limit_are_refused(tmp_path, monkeypatch):
    path = write(tmp_path, pickle.dumps(([b"a"] * 6, [True] * 3), protocol=4))
    # 2 lists + 6 images + 3 flags + the tuple = 12 objects.
    monkeypatch.setattr(evalsets, "MAX_OBJECTS", 12)
    assert len(read_eval_set(path)) == 6
    monkeypatch.setattr(evalsets, "MAX_OBJECTS", 11)
    refused(path, "more than 11 objects")


def test_a_file_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    data = pickle.dumps((IMAGES, FLAGS), protocol=4)
    path = write(tmp_path, data)
    monkeypatch.setattr(evalsets, "MAX_FILE_BYTES", len(data))
    assert read_eval_set(path).images == IMAGES
    monkeypatch.setattr(evalsets, "MAX_FILE_BYTES", len(data) - 1)
    refused(path, f"the verification set is {len(data):,} bytes, over {len(data) - 1:,}")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ((IMAGES, FLAGS, [0.5] * 4), "refused opcode"),  # a _yaw.bin: three lists and floats
        ((IMAGES, FLAGS, FLAGS), "refused opcode TUPLE3"),
        ((IMAGES,), "refused opcode TUPLE1"),
        ([IMAGES, FLAGS], "nested MARK"),
        ((IMAGES, [1, 0]), "refused opcode BININT1"),  # flags as ints
        ((["text", "x"], [True]), "not bytes or a bool"),  # str images (Python 3)
        ((IMAGES, [b"a", b"b"]), "a pair flag that is not a bool"),
        (([True, False], FLAGS[:1]), "an image that is not bytes"),
        ((IMAGES, [True]), "4 images for 1 pair flags"),
        (([], []), "no images"),
        (([b"a", b""], [True]), "image 1 is empty"),
        ({"bins": IMAGES}, "refused opcode EMPTY_DICT"),
    ],
)
def test_anything_but_images_and_pair_flags_is_refused(tmp_path, value, words):
    refused(write(tmp_path, pickle.dumps(value, protocol=4)), words)


def test_numpy_encoded_images_are_refused_by_name(tmp_path):
    np = pytest.importorskip("numpy")
    data = pickle.dumps(([np.frombuffer(b"\xff\xd8", np.uint8)] * 2, [True]), protocol=4)
    refused(write(tmp_path, data), "refused opcode STACK_GLOBAL")


def test_damaged_files_are_refused_with_the_file_named(tmp_path):
    data = pickle.dumps((IMAGES, FLAGS), protocol=4)
    refused(write(tmp_path, data[:-5], "cut.bin"), "damaged pickle")
    refused(write(tmp_path, data[:-1], "nostop.bin"), "before seeing STOP")
    refused(write(tmp_path, data + b"junk", "tail.bin"), "4 bytes after the end")
    refused(write(tmp_path, b"", "empty.bin"), "before seeing STOP")
    refused(write(tmp_path, b"\x89PNG\r\n\x1a\n", "png.bin"), "protocol 2 to 5")
    refused(write(tmp_path, pickle.dumps((IMAGES, FLAGS), 0), "p0.bin"), "protocol 2 to 5")
    refused(write(tmp_path, pickle.dumps((IMAGES, FLAGS), 1), "p1.bin"), "protocol 2 to 5")
    refused(tmp_path / "missing.bin", "not found")
    (tmp_path / "dir.bin").mkdir()
    refused(tmp_path / "dir.bin", "a folder")


def test_persistent_ids_are_refused(tmp_path):
    data = b"\x80\x02](X\x01\x00\x00\x00pQe]\x88a\x86."  # BINPERSID
    refused(write(tmp_path, data), "refused opcode BINPERSID")


def test_the_docs_state_the_limits_the_code_has():
    root = os.path.join(os.path.dirname(__file__), os.pardir, "docs")
    assert evalsets.MAX_FILE_BYTES == 1 << 30  # "1 GiB" below
    assert evalsets.MAX_IMAGE_BYTES == 4 << 30  # "4 GiB" in repack.md
    with open(os.path.join(root, "repack.md"), encoding="utf-8") as f:
        assert "add up to more than 4 GiB is refused" in " ".join(f.read().split())
    for page in ("repack.md", "architecture.md"):
        with open(os.path.join(root, page), encoding="utf-8") as f:
            text = " ".join(f.read().split())
        assert "at most 1 GiB" in text, page
        assert f"at most {evalsets.MAX_OBJECTS:,}" in text, page
