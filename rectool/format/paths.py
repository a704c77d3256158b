"""A pack's file names, all derived from its prefix in one place: `PackPaths`.

A pack at `out/faces` is `out/faces.rec` and `.idx` (or numbered shards `out/faces-00000.rec`,
...), each shard's `.rec.crc`, the binary index (`out/faces.offsets.npy`, ...), the identities
file, the failures file and, written last, `out/faces.manifest.json`; while it is being made,
`.partial` shards, the state file, a copy of a list read from stdin, and for `--only-shard`
tasks each shard's own failures, state and plan files; while it is replaced, the staging
folder `out/.faces.overwrite/` and the commit journal; while anything writes it, the lock.
A command makes one `PackPaths` where it gets its prefix and passes it down, so that no other
module spells a name. The names the emitted reader needs (manifest, state, journal) are the
reader's own constants (it must stand alone), imported here so they are defined once.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..reader import INDEX_ARRAYS, JOURNAL_SUFFIX, MANIFEST_SUFFIX, STATE_SUFFIX

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = [
    "CHECKSUM_SUFFIX",
    "FAILURES_SUFFIX",
    "IDENTITIES_SUFFIX",
    "INDEX_SUFFIXES",
    "JOURNAL_SUFFIX",
    "LABEL_MAP_SUFFIX",
    "LOCK_SUFFIX",
    "MANIFEST_SUFFIX",
    "PACK_FILE_ENDINGS",
    "PARTIAL_SUFFIX",
    "PLAN_SUFFIX",
    "RELABEL_SUFFIX",
    "REPORT_SUFFIX",
    "SHARD_DIGITS",
    "STAGING_SUFFIX",
    "STATE_SUFFIX",
    "STDIN_COPY_SUFFIX",
    "PackPaths",
]

REC_SUFFIX, IDX_SUFFIX = ".rec", ".idx"
SHARD_DIGITS = 5  # PREFIX-00000.rec
CHECKSUM_SUFFIX = ".crc"  # after a shard's .rec: format/checksums.py
# The binary index (format 3) and the identity names: format/binindex.py.
INDEX_SUFFIXES = {name: f".{name}.npy" for name in (*INDEX_ARRAYS, "identity_ranges")}
IDENTITIES_SUFFIX = ".identities.json"
FAILURES_SUFFIX = ".failures.jsonl"
PARTIAL_SUFFIX = ".partial"  # after any file until it is complete
STDIN_COPY_SUFFIX = ".stdin.lst"
STAGING_SUFFIX = ".overwrite"  # the hidden folder `.NAME.overwrite` beside the prefix
LOCK_SUFFIX = ".lock"
# A shard packed alone (`pack --only-shard K`) carries `PREFIX-0000K.plan.json` until
# `--finalize`: see format/manifest.py's `plan_document`.
PLAN_SUFFIX = ".plan.json"
# What a repack writes beside its shards; a label map also sits beside a list (`x.lst`).
RELABEL_SUFFIX = ".relabel.tsv"
REPORT_SUFFIX = ".report.json"
LABEL_MAP_SUFFIX = ".labels.tsv"
# What follows a prefix in a shard's name: `.rec`, `-00003.idx`, ...
_SHARD_TAIL = re.compile(rf"(?:-[0-9]{{{SHARD_DIGITS}}})?\.(?:rec|idx)")
_TEMPORARY_SUFFIX = ".tmp"  # `.NAME.XXXX.tmp`: doors/files.py's write_atomic

# How the names of a pack's files end: what a user-named output must never replace
# (doors/targets.py).
PACK_FILE_ENDINGS = (
    REC_SUFFIX,
    IDX_SUFFIX,
    *(s for s in INDEX_SUFFIXES.values()),
    IDENTITIES_SUFFIX,
    REC_SUFFIX + CHECKSUM_SUFFIX,
    MANIFEST_SUFFIX,
    FAILURES_SUFFIX,
    STATE_SUFFIX,
    PARTIAL_SUFFIX,
    LOCK_SUFFIX,
    JOURNAL_SUFFIX,
)

# What follows a prefix in the name of any file a pack or a repack writes.
_OWN_ENDINGS = (
    *PACK_FILE_ENDINGS,
    PLAN_SUFFIX,
    RELABEL_SUFFIX,
    REPORT_SUFFIX,
    LABEL_MAP_SUFFIX,
    STDIN_COPY_SUFFIX,
)


@dataclass(frozen=True)
class PackPaths:
    """Every file name of the pack at `prefix` (`out/faces`), derived in one place.

    Make it once with `PackPaths.of(prefix)` (which takes a `PackPaths` as it is) and pass it
    down. A numbered shard's own files (an `--only-shard` task's failures, state and plan) are
    `paths.shard(k)`'s: the same names after the shard's stem, `out/faces-00003`.
    """

    prefix: str

    @classmethod
    def of(cls, prefix: StrPath | PackPaths) -> PackPaths:
        """Return the paths of the pack at `prefix` (a path, or already a `PackPaths`)."""
        return prefix if isinstance(prefix, PackPaths) else cls(os.fspath(prefix))

    @classmethod
    def of_manifest(cls, manifest: StrPath) -> PackPaths:
        """Return the paths of the pack whose manifest is `manifest` (`PREFIX.manifest.json`)."""
        path = os.fspath(manifest)
        if not cls.is_manifest(path):
            raise ValueError(f"{path}: a manifest is named PREFIX{MANIFEST_SUFFIX}")
        return cls(path[: -len(MANIFEST_SUFFIX)])

    @classmethod
    def of_rec(cls, rec: StrPath) -> PackPaths:
        """Return the paths named after the shard `rec` (`PREFIX.rec`, `PREFIX-00003.rec`)."""
        path = os.fspath(rec)
        return cls(path[: -len(REC_SUFFIX)] if path.endswith(REC_SUFFIX) else path)

    @staticmethod
    def is_manifest(path: StrPath) -> bool:
        """Return True when `path` is named like a pack's manifest."""
        return os.fspath(path).endswith(MANIFEST_SUFFIX)

    def __str__(self) -> str:
        return self.prefix

    def __fspath__(self) -> str:
        return self.prefix

    # Where the pack is.
    @property
    def folder(self) -> str:
        """The folder of the pack ("" for a prefix in the current folder)."""
        return os.path.dirname(self.prefix)

    @property
    def stem(self) -> str:
        """The prefix's last part (`faces`)."""
        return os.path.basename(self.prefix)

    def beside(self, name: str) -> str:
        """Return the path of the file `name` in the pack's folder."""
        return os.path.join(self.folder, name)

    # The pack's files.
    @property
    def rec(self) -> str:
        """The single shard's records (`PREFIX.rec`)."""
        return self.prefix + REC_SUFFIX

    @property
    def idx(self) -> str:
        """The single shard's text index (`PREFIX.idx`)."""
        return self.prefix + IDX_SUFFIX

    @property
    def checksums(self) -> str:
        """The single shard's per-record checksums (`PREFIX.rec.crc`)."""
        return self.checksums_of(self.rec)

    @staticmethod
    def checksums_of(rec: StrPath) -> str:
        """Return the per-record checksum file of the shard `rec` (`REC.crc`)."""
        return os.fspath(rec) + CHECKSUM_SUFFIX

    @property
    def manifest(self) -> str:
        """The manifest, written last: the mark that the pack is complete."""
        return self.prefix + MANIFEST_SUFFIX

    @property
    def arrays(self) -> dict[str, str]:
        """The binary index's arrays by name (`offsets`: `PREFIX.offsets.npy`, ...)."""
        return {name: self.prefix + suffix for name, suffix in INDEX_SUFFIXES.items()}

    @property
    def identities(self) -> str:
        """The identity names (`PREFIX.identities.json`)."""
        return self.prefix + IDENTITIES_SUFFIX

    @property
    def failures(self) -> str:
        """What was refused, one JSON line each (`PREFIX.failures.jsonl`)."""
        return self.prefix + FAILURES_SUFFIX

    @property
    def state(self) -> str:
        """The state file: the pack is unfinished while it is there."""
        return self.prefix + STATE_SUFFIX

    @property
    def journal(self) -> str:
        """The commit journal of a replacement not yet finished (doors/commit.py)."""
        return self.prefix + JOURNAL_SUFFIX

    @property
    def lock(self) -> str:
        """The lock every run that writes the prefix holds (doors/lock.py)."""
        return self.prefix + LOCK_SUFFIX

    @property
    def stdin_copy(self) -> str:
        """The copy of a list read from stdin, kept so that the run can be resumed."""
        return self.prefix + STDIN_COPY_SUFFIX

    @property
    def plan(self) -> str:
        """The plan file of a shard packed alone (of `shard(k)`: `PREFIX-0000K.plan.json`)."""
        return self.prefix + PLAN_SUFFIX

    @property
    def label_map(self) -> str:
        """The label map written beside a repacked pack (`PREFIX.labels.tsv`)."""
        return self.prefix + LABEL_MAP_SUFFIX

    @property
    def relabel(self) -> str:
        """A repack's old-to-new label table (`PREFIX.relabel.tsv`)."""
        return self.prefix + RELABEL_SUFFIX

    @property
    def report(self) -> str:
        """A repack's per-identity report (`PREFIX.report.json`)."""
        return self.prefix + REPORT_SUFFIX

    @staticmethod
    def partial(path: str) -> str:
        """Return the name `path` has until it is complete (`PATH.partial`)."""
        return path + PARTIAL_SUFFIX

    # Shards.
    def shard(self, number: int) -> PackPaths:
        """Return the names of numbered shard `number` (stem `PREFIX-00003`): its `.rec`,
        `.idx`, `.rec.crc`, and an `--only-shard` task's failures, state and plan."""
        return PackPaths(f"{self.prefix}-{number:0{SHARD_DIGITS}d}")

    def shard_names(self, number: int, numbered: bool) -> tuple[str, str]:
        """Return the (rec, idx) of shard `number`: numbered (`PREFIX-00003.rec`: a pack
        planned in shards, even of one), or the single shard (`PREFIX.rec`)."""
        stem = self.shard(number) if numbered else self
        return stem.rec, stem.idx

    def numbered_recs(self) -> list[str]:
        """Return the `.rec` of each numbered shard there is, sorted (`PREFIX-00000.rec`, ...)."""
        stem = glob.escape(self.prefix) + "-" + "[0-9]" * SHARD_DIGITS
        return sorted(glob.glob(stem + REC_SUFFIX))

    @staticmethod
    def idx_beside(rec: StrPath) -> str:
        """Return the `.idx` beside the shard `rec` (its name with `.idx` for its extension)."""
        return os.path.splitext(os.fspath(rec))[0] + IDX_SUFFIX

    def owns(self, name: str) -> bool:
        """Return True when the file `name` in the pack's folder is named after the pack
        (`NAME.*`, `NAME-3.*`; not another pack's such as `NAME2.rec`)."""
        return re.fullmatch(re.escape(self.stem) + r"(?:-[0-9]+)?\..+", name) is not None

    def numbered_files(self) -> list[str]:
        """Return the files of numbered shards there are (`.rec`, `.idx`, `.rec.crc`, plan)."""
        stem = glob.escape(self.prefix) + "-" + "[0-9]" * SHARD_DIGITS
        endings = (REC_SUFFIX, IDX_SUFFIX, REC_SUFFIX + CHECKSUM_SUFFIX, PLAN_SUFFIX)
        return sorted(name for ending in endings for name in glob.glob(stem + ending))

    def numbered_pack(self) -> PackPaths | None:
        """Return the pack whose numbered shard these are the names of (`PREFIX-00003`:
        `PREFIX`), or None when they are not a numbered shard's."""
        stem, digits = self.prefix[: -SHARD_DIGITS - 1], self.prefix[-SHARD_DIGITS:]
        dash = self.prefix[-SHARD_DIGITS - 1 : -SHARD_DIGITS]
        numbered = len(self.prefix) > SHARD_DIGITS + 1 and dash == "-" and digits.isdigit()
        return PackPaths(stem) if numbered else None

    @staticmethod
    def shard_number(rec: str) -> int | None:
        """Return the number of a numbered shard's `.rec` (`PREFIX-00003.rec`: 3), or None."""
        end = len(rec) - len(REC_SUFFIX)
        digits = rec[end - SHARD_DIGITS : end]
        if not rec.endswith(REC_SUFFIX) or rec[end - SHARD_DIGITS - 1 : end - SHARD_DIGITS] != "-":
            return None
        return int(digits) if digits.isdigit() and digits.isascii() else None

    @staticmethod
    def is_shard_tail(tail: str) -> bool:
        """Return True when `tail`, what follows a prefix, ends a shard's name (`.rec`,
        `-00003.idx`)."""
        return _SHARD_TAIL.fullmatch(tail) is not None

    # Replacing a pack (--overwrite).
    @property
    def staging(self) -> str:
        """The hidden folder beside the prefix where `--overwrite` builds (`.NAME.overwrite`)."""
        return self.beside(f".{self.stem}{STAGING_SUFFIX}")

    @property
    def staged(self) -> PackPaths:
        """The paths of the new pack built in `staging` (`.NAME.overwrite/NAME`)."""
        return PackPaths(os.path.join(self.staging, self.stem))

    @staticmethod
    def journal_beside(path: StrPath) -> str:
        """Return the hidden commit journal of the outputs named after `path` (a list's,
        a report's: `.NAME.commit-journal.json` beside it; a pack's is `journal`)."""
        folder, name = os.path.split(os.fspath(path))
        return os.path.join(folder, f".{name}{JOURNAL_SUFFIX}")

    def temporaries(self) -> list[str]:
        """Return the temporary files (`.NAME.XXXX.tmp`) a killed run of this pack left.

        NAME is one of its files (`p.rec`, `p-00001.idx`, `p.manifest.json`, ...): a pack
        beside it (`pq`, `p.v2`, `p-small`) has its own, maybe being written now."""
        pattern = "." + glob.escape(self.stem) + "[.-]*" + _TEMPORARY_SUFFIX
        found = glob.glob(os.path.join(glob.escape(self.folder), pattern))
        # `.NAME.` + mkstemp's 8 characters + `.tmp`.
        own = re.compile(
            r"\." + re.escape(self.stem) + rf"(?:-[0-9]{{{SHARD_DIGITS}}})?"
            rf"(?:{'|'.join(map(re.escape, _OWN_ENDINGS))})(?:\.partial)?\.[^.]+\.tmp"
        )
        return [name for name in found if own.fullmatch(os.path.basename(name))]
