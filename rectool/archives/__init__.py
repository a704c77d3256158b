"""Archives as ROOT: tar, tar.gz, zip and webdataset shards listed and packed in place.

`archive_kind` tells an archive ROOT from a tree, `open_archive` opens and indexes one,
`list_archive` is `rectool list` over it and `open_member_reader` what `pack` reads from it.
"""

from .listing import list_archive
from .members import ArchiveError, Member, MemberIndex
from .reading import open_member_reader
from .source import archive_kind, open_archive

__all__ = [
    "ArchiveError",
    "Member",
    "MemberIndex",
    "archive_kind",
    "list_archive",
    "open_archive",
    "open_member_reader",
]
