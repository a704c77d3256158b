"""The one door out: every file rectool writes goes through this module.

- `write_atomic`: a temporary file made with `mkstemp` (O_EXCL: a name planted in advance,
  a symlink say, is never followed), fsync, then a rename; the file gets the mode of a normally
  created one (0666 less the umask), not mkstemp's 0600. For files a command owns (a pack's
  manifest, binary index, identities, state and checksum files) that it replaces as part of
  its job.
- `write_output`: the same for a file the user names (`-o FILE`): an existing file is never
  replaced without `overwrite`, a file of a pack never (unless that pack is the command's job),
  and a missing folder is created.
- `scratch_file`: an unnamed temporary file (a listing's spool), gone once closed.
- `create_new`/`open_existing`: descriptors for files written in place (`.partial` shards,
  failures) that never follow a symlink at their name.
- `OutputLock`: one `flock` on `PREFIX.lock` for every command that writes under PREFIX:
  exclusive for a whole run (pack, --finalize, repack, Dask's client), shared by the
  `--only-shard` tasks of one plan, which each also lock their own shard.
- `commit`: a multi-file output moved into place as one unit. A journal written first (the
  commit point) lists every move and removal; after a crash at any instant the old output is
  whole (no journal yet) or `finish_commit` rolls the journal forward to the new one.
- `OutputFolder`: a tree written under one folder (unpack) through descriptors opened with
  O_NOFOLLOW, so a link planted inside it never leads a file outside.
- `fault_point`: the public fault-injection hook, called at every step (create, write, fsync, flush,
  rename, journal, swap, manifest), set by `set_fault_hook` or `RECTOOL_OUTPUT_FAULT`.

Every caller imports these from here; each rule lives in a module of its own beside it:
`files.py` (single files and descriptors, and the errors that name them), `targets.py` (what a
user-named output may replace), `lock.py` (`OutputLock`), `commit.py` (the journal and
`OutputFiles`), `folder.py` (`OutputFolder`) and `faults.py` (the hook). This module itself
holds `write_output`, which composes them. `tests/test_output_door.py` fails when a module
outside the door renames, links or opens files for writing itself.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import RectoolError
from ..format.paths import JOURNAL_SUFFIX, LOCK_SUFFIX, PACK_FILE_ENDINGS
from .commit import OutputFiles, commit, finish_commit, read_journal
from .faults import FAULT_ENV, FAULT_STEPS, fault_point, set_fault_hook
from .files import (
    create_new,
    current_umask,
    discard_stream,
    fsync_fd,
    make_folders,
    make_link,
    open_existing,
    open_lock_file,
    output_error,
    remove,
    remove_empty_folder,
    remove_quietly,
    remove_tree,
    rename,
    scratch_file,
    set_mtime,
    set_used,
    stage_file,
    truncate,
    write_atomic,
    write_fd,
    write_json_atomic,
)
from .folder import OutputFolder
from .lock import OutputLock
from .targets import check_target, check_targets, pack_file_reason, same_place

if TYPE_CHECKING:
    from _typeshed import StrPath

    from .files import Data


def write_output(path: StrPath, data: Data, overwrite: bool = False, what: str = "output") -> str:
    """Write a user-named output file whole: refused over an existing one without
    `overwrite` (and over a pack's file, a link or a folder always); its folder is created.

    Without `overwrite` the file is linked into place, so a file that appears meanwhile is
    still never replaced.
    """
    path = check_target(path, overwrite, what)
    make_folders(os.path.dirname(path))
    tmp = stage_file(path, data)
    if overwrite:
        rename(tmp, path)
        return path
    try:
        fault_point("rename", path)
        os.link(tmp, path)
    except FileExistsError:
        raise RectoolError(f"{path}: exists; use --overwrite to replace it") from None
    except OSError as exc:
        raise output_error(exc, path) from None
    finally:
        remove_quietly(tmp)
    return path


__all__ = [
    "FAULT_ENV",
    "FAULT_STEPS",
    "JOURNAL_SUFFIX",
    "LOCK_SUFFIX",
    "PACK_FILE_ENDINGS",
    "OutputFiles",
    "OutputFolder",
    "OutputLock",
    "check_target",
    "check_targets",
    "commit",
    "create_new",
    "current_umask",
    "discard_stream",
    "fault_point",
    "finish_commit",
    "fsync_fd",
    "make_folders",
    "make_link",
    "open_existing",
    "open_lock_file",
    "output_error",
    "pack_file_reason",
    "read_journal",
    "remove",
    "remove_empty_folder",
    "remove_tree",
    "rename",
    "same_place",
    "scratch_file",
    "set_fault_hook",
    "set_mtime",
    "set_used",
    "stage_file",
    "truncate",
    "write_atomic",
    "write_fd",
    "write_json_atomic",
    "write_output",
]
