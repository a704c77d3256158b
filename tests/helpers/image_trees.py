"""Build small identity-per-folder trees of real, distinct images under tmp_path.

    from helpers.image_trees import Symlink, make_tree
    files = make_tree(tmp_path / "faces", {
        "alice": {"1.jpg": None, "2.PNG": None, "notes.txt": b"not an image"},
        "bob": {"sub": {"3.jpg": None}, "loop": Symlink("..")},
        "empty": {},
    })

A dict is a folder, `None` an image encoded after the file's extension (distinct pixels for
every file), bytes the exact content, `Symlink(target)` a symbolic link. Names may be bytes,
for names that are not valid UTF-8.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import cv2
import numpy as np

# What cv2.imencode writes for each extension a tree may hold.
ENCODED_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class Symlink:
    """A symbolic link to `target` (relative to the link's folder, or absolute)."""

    target: str


def image_bytes(seed, ext=".jpg", height=12, width=10):
    """Return a tiny image encoded as `ext`, with pixels that differ for every seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 7 + seed) % 256, (y * 11 + 3 * seed) % 256, (x * y + seed) % 256], -1)
    image = np.clip(base + rng.integers(0, 40, base.shape), 0, 255).astype(np.uint8)
    ok, encoded = cv2.imencode(ext.lower(), image)
    assert ok, ext
    return encoded.tobytes()


def make_tree(root, spec, _counter=None):
    """Create `spec` under `root`; return {relative path: bytes} of every file written.

    Relative paths use `/` and are str (bytes names are decoded as `os.fsdecode` does).
    """
    counter = [0] if _counter is None else _counter
    root = os.fsencode(root)
    os.makedirs(root, exist_ok=True)
    written = {}
    for name, value in spec.items():
        path = os.path.join(root, os.fsencode(name))
        rel = os.fsdecode(os.fsencode(name))
        if isinstance(value, dict):
            os.mkdir(path)
            for sub, data in make_tree(path, value, counter).items():
                written[f"{rel}/{sub}"] = data
            continue
        if isinstance(value, Symlink):
            os.symlink(value.target, path)
            continue
        if value is None:
            ext = os.path.splitext(rel)[1].lower()
            counter[0] += 1
            value = (
                image_bytes(counter[0], ext)
                if ext in ENCODED_EXTENSIONS
                else f"file {counter[0]}\n".encode()
            )
        with open(path, "wb") as f:
            f.write(value)
        written[rel] = value
    return written


def face_tree(root, identities=3, per_identity=4, ext=".jpg"):
    """Write `identities` folders `id0`.. of `per_identity` images; return make_tree's dict."""
    spec = {
        f"id{i}": {f"{n:02d}{ext}": None for n in range(per_identity)} for i in range(identities)
    }
    return make_tree(root, spec)


# A tree with one of everything `rectool list` must pass over, and what it must list. The
# expectations are written out by hand, not computed.
MIXED_TREE = {
    ".cache": {"x.jpg": None},
    "README.md": b"about\n",
    "loose.jpg": None,
    "alice": {
        "01.jpg": None,
        "02.JPG": None,
        "03.Jpeg": None,
        "04.png": None,
        "notes.txt": None,
        ".DS_Store": b"\0",
        "tab\tname.jpg": None,
        "new\nline.jpg": None,
        " lead.jpg": None,
        "sub": {"05.jpg": None, ".hidden.jpg": None},
        "broken.jpg": Symlink("missing.jpg"),
        "loop": Symlink(".."),
    },
    "bob": {"b.png": None, "link.jpg": Symlink("../alice/01.jpg")},
    "carol\tx": {"c.jpg": None},
    b"caf\xe9": {"c.jpg": None},
    "dave": {"ok.jpg": None, b"\xff.jpg": None},
    "empty": {},
    "only_text": {"a.txt": None},
    "José": {"ñ.jpg": None, "e\u0301.jpg": None, "é.jpg": None},
    "王芳": {"照片.jpg": None},
}
# Made by the test after make_tree: a named pipe with an image extension.
MIXED_TREE_FIFO = "alice/pipe.jpg"
# Identities in code-point order (upper case before lower case, not locale order).
MIXED_TREE_IDENTITIES = ["José", "alice", "bob", "dave", "王芳"]
MIXED_TREE_IMAGES = [
    ("José", "José/e\u0301.jpg"),
    ("José", "José/é.jpg"),
    ("José", "José/ñ.jpg"),
    ("alice", "alice/01.jpg"),
    ("alice", "alice/02.JPG"),
    ("alice", "alice/03.Jpeg"),
    ("alice", "alice/04.png"),
    ("alice", "alice/sub/05.jpg"),
    ("bob", "bob/b.png"),
    ("bob", "bob/link.jpg"),
    ("dave", "dave/ok.jpg"),
    ("王芳", "王芳/照片.jpg"),
]
MIXED_TREE_SKIPPED = {
    "not_image": ["alice/notes.txt", "only_text/a.txt"],
    "hidden": [".cache", "alice/.DS_Store", "alice/sub/.hidden.jpg"],
    "outside_identity": ["README.md", "loose.jpg"],
    "empty_identity": ["empty", "only_text"],
    "unreadable_folder": [],
    "unwritable_name": [
        "alice/ lead.jpg",
        "alice/new\nline.jpg",
        "alice/tab\tname.jpg",
        "caf\udce9",
        "carol\tx",
        "dave/\udcff.jpg",
    ],
    "not_regular": ["alice/broken.jpg", "alice/pipe.jpg"],
    "symlink_loop": ["alice/loop"],
    "symlink_repeat": [],
    "outside_root": [],
    "subfolder": [],
    "below_min_per_id": [],
    "above_max_per_id": [],
}


def make_mixed_tree(root):
    """Write MIXED_TREE (and its named pipe) under `root`; return make_tree's dict."""
    written = make_tree(root, MIXED_TREE)
    os.mkfifo(os.path.join(root, MIXED_TREE_FIFO))
    return written


__all__ = [
    "ENCODED_EXTENSIONS",
    "MIXED_TREE",
    "MIXED_TREE_IDENTITIES",
    "MIXED_TREE_IMAGES",
    "MIXED_TREE_SKIPPED",
    "Symlink",
    "face_tree",
    "image_bytes",
    "make_mixed_tree",
    "make_tree",
]
