"""Tiny real images and .lst files for pack tests, built under tmp_path."""

from __future__ import annotations

import cv2
import numpy as np


def image_array(seed, height=40, width=32, channels=3):
    """Return a smooth-plus-noise uint8 image, different for every seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 3 + seed) % 256, (y * 5 + 2 * seed) % 256, (x + y + 7 * seed) % 256], -1)
    noisy = base + rng.normal(0, 10, base.shape)
    image = np.clip(noisy, 0, 255).astype(np.uint8)
    return image[..., 0] if channels == 1 else image


def encode(image, ext=".jpg", params=()):
    ok, buf = cv2.imencode(ext, image, list(params))
    assert ok
    return buf.tobytes()


def jpeg_bytes(seed, height=40, width=32):
    return encode(image_array(seed, height, width), ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 90])


def write_pack_tree(root, identities, per_identity, height=40, width=32, extra=()):
    """Write JPEGs root/<identity>/<n>.jpg; return .lst lines (index, label, relpath) in order.

    `extra` is a sequence of (relpath, bytes, label) written and listed after the images.
    """
    items = []
    index = 0
    for label, name in enumerate(identities):
        (root / name).mkdir(parents=True, exist_ok=True)
        for n in range(per_identity):
            rel = f"{name}/{n:03d}.jpg"
            (root / rel).write_bytes(jpeg_bytes(index + 1, height, width))
            items.append((index, label, rel))
            index += 1
    for rel, data, label in extra:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is not None:
            path.write_bytes(data)
        items.append((index, label, rel))
        index += 1
    return items


def write_list(path, items):
    """Write (index, label, relpath) items as a .lst the way im2rec formats it."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for index, label, rel in items:
            labels = label if isinstance(label, (list, tuple)) else [label]
            f.write("\t".join([str(index), *(f"{x:f}" for x in labels), rel]) + "\n")
    return path
