"""What an archive holds, read once into an index: its members' names, kinds, places and sizes.

Every archive reader (`tar.py`, `zip.py`, `webdataset.py`) turns its headers into one
`MemberIndex`, through the same rules, so that an archive is hostile input in one place:

- a name is the path a tree extracted from it would have: `./` and a trailing `/` dropped; an
  absolute name, a `..` part, an empty part, a NUL or a backslash is refused (`unsafe_name`);
- a name held twice (a second member that would replace the first when extracted) is refused;
- a link (symbolic or hard), a device, a FIFO, a sparse or encrypted member, or anything else
  that is no regular file is indexed as what it is and never read: `list` passes it over as
  `not_regular`, `pack` refuses it naming the member;
- a member whose data would run past the end of the archive is a truncated archive.

An archive whose members all lie in one folder holding only folders (`train/n000002/…`, as
VGGFace2's `train.tar.gz`) is read from inside that folder: member names are relative to it, as
a tree's paths are relative to ROOT after `tar xf` and `ROOT=train`. So a list made from the
archive packs the extracted tree and the other way round.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import InputError

# Member kinds, one byte each in the index.
FILE, FOLDER, SYMLINK, HARDLINK, DEVICE, FIFO, OTHER, SPARSE, ENCRYPTED = range(9)
KIND_NAMES = {
    SPARSE: "a sparse file",
    ENCRYPTED: "an encrypted member",
    FILE: "a regular file",
    FOLDER: "a folder",
    SYMLINK: "a symbolic link",
    HARDLINK: "a hard link",
    DEVICE: "a device",
    FIFO: "a FIFO",
    OTHER: "not a regular file",
}


class ArchiveError(InputError):
    """An archive that cannot be read as one: damaged, truncated, or hostile (an unsafe or
    repeated member name, a decompression bomb); the message names the archive and member."""


def unsafe_name(name: str) -> str | None:
    """Return why a member name cannot be a path under ROOT, or None when it can."""
    if not name:
        return "an empty name"
    if "\0" in name:
        return "a NUL in its name"
    if name.startswith("/") or (name[0].isalpha() and name[1:3] in (":/", ":\\")):
        return "an absolute name"
    if "\\" in name:
        return "a backslash in its name (a Windows path?)"
    for part in name.split("/"):
        if part == "..":
            return "a '..' in its name, which would lead out of the folder it is extracted to"
        if part == "":
            return "an empty part in its name ('//')"
    return None


def clean_name(raw: str) -> str:
    """Return a member name as a tree's path: leading `./` and a trailing `/` dropped."""
    while raw.startswith("./"):
        raw = raw[2:]
    while raw.endswith("/"):
        raw = raw[:-1]
    return "" if raw == "." else raw


@dataclass(frozen=True)
class Member:
    """One member: its name (relative to the archive's root folder), its kind, where its data
    starts in the archive file, and its size (stored: `stored` bytes; zip's method and CRC)."""

    name: str
    kind: int
    offset: int
    size: int
    stored: int
    method: int = 0
    crc: int = 0
    part: int = 0  # which file of a set of shards holds it (webdataset)

    @property
    def kind_name(self) -> str:
        """Return what the member is, in words."""
        return KIND_NAMES.get(self.kind, KIND_NAMES[OTHER])


class MemberIndex:
    """An archive's members in archive order, and by name.

    Kept as parallel arrays (a name, a kind byte, 64-bit offsets and sizes) rather than an
    object a member, so that millions of members cost tens of bytes each.
    """

    def __init__(self, archive: str) -> None:
        self.archive = archive
        self.names: list[str] = []
        self.kinds = bytearray()
        self.offsets = array("q")
        self.sizes = array("q")
        self.stored = array("q")
        self.methods = bytearray()
        self.crcs = array("L")
        self.parts = array("l")
        self._by_name: dict[str, int] = {}
        self.base = ""  # the root folder every member lies in ("" when none), with its "/"

    def __len__(self) -> int:
        return len(self.names)

    def add(
        self,
        raw_name: str,
        kind: int,
        offset: int,
        size: int,
        stored: int | None = None,
        method: int = 0,
        crc: int = 0,
        part: int = 0,
    ) -> None:
        """Add a member, refusing an unsafe or repeated name (`ArchiveError`)."""
        name = raw_name
        if name[:2] == "./":  # as `tar -C ROOT .` names every member
            name = name[2:]
        if name[:2] == "./" or name[-1:] == "/":
            name = clean_name(name)
        # Most names are plainly safe: the full check only where one of its signs shows.
        if (
            not name
            or name[0] == "/"
            or ".." in name
            or "//" in name
            or "\\" in name
            or ("\0" in name or name[1:2] == ":")
        ):
            if name == "" and kind == FOLDER:
                return  # the archive's own root folder, `./`
            why = unsafe_name(name)
            if why is not None:
                raise ArchiveError(f"{self.archive}: member {raw_name!r}: {why}; refused")
        if name in self._by_name:
            if kind == FOLDER and self.kinds[self._by_name[name]] == FOLDER:
                return  # a folder named twice extracts as one folder
            raise ArchiveError(
                f"{self.archive}: member {raw_name!r} appears twice (extracting would keep "
                "the last one only); refused"
            )
        self._by_name[name] = len(self.names)
        self.names.append(name)
        self.kinds.append(kind)
        self.offsets.append(offset)
        self.sizes.append(size)
        self.stored.append(size if stored is None else stored)
        self.methods.append(method)
        self.crcs.append(crc & 0xFFFFFFFF)
        self.parts.append(part)

    def finish(self) -> MemberIndex:
        """Find the archive's root folder (see the module's docstring); return the index."""
        tops = {name.split("/", 1)[0] for name in self.names}
        if len(tops) == 1:
            (top,) = tops
            folder = self._by_name.get(top)
            if folder is None or self.kinds[folder] == FOLDER:
                inside = [n for n in self.names if n != top]
                # Only folders (and what they hold) below it: it is a root, not an identity.
                if inside and all(
                    "/" in n[len(top) + 1 :] or self.kinds[self._by_name[n]] == FOLDER
                    for n in inside
                ):
                    self.base = top + "/"
        return self

    def position(self, path: str) -> int | None:
        """Return the archive-order position of the member at list path `path`, or None."""
        return self._by_name.get(self.base + path if self.base else path)

    def find(self, path: str) -> Member | None:
        """Return the member at list path `path` (relative to the root folder), or None."""
        i = self._by_name.get(self.base + path if self.base else path)
        return None if i is None else self.member(i)

    def member(self, i: int) -> Member:
        """Return member `i` (archive order)."""
        return Member(
            self.relative(self.names[i]),
            self.kinds[i],
            self.offsets[i],
            self.sizes[i],
            self.stored[i],
            self.methods[i],
            self.crcs[i],
            self.parts[i],
        )

    def relative(self, name: str) -> str:
        """Return a member name relative to the root folder."""
        return name[len(self.base) :] if self.base and name.startswith(self.base) else name

    def __iter__(self) -> Iterator[Member]:
        for i in range(len(self.names)):
            yield self.member(i)


def refusal(member: Member | None, limit: int) -> str | None:
    """Return why a listed member cannot be packed (pack's refusal reason), or None."""
    if member is None:
        return "file not found (no such member in the archive)"
    if member.kind == FOLDER:
        return "is a directory, not an image file"
    if member.kind in (SPARSE, ENCRYPTED):
        # Its stored bytes are not the file's: a tar's sparse data lacks its holes.
        return f"{member.kind_name}, which rectool does not read (extract it, then pack the tree)"
    if member.kind != FILE:
        return f"not a regular file ({member.kind_name} member: archives' links are not followed)"
    if member.size > limit or member.stored > limit:
        return f"record exceeds the RecordIO limit of {limit} bytes"
    if member.size == 0:
        return "empty file"
    return None
