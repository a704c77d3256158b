"""Archives as ROOT: tar, tar.gz, zip and webdataset shards listed and packed in place.

`archive_kind` tells an archive ROOT from a tree, `open_archive` opens and indexes one, and
`open_member_reader` is what `pack` reads from it; `rectool list` over an archive is
`archives.listing.list_archive` (not imported here: it builds on `packer/`, which imports this
package to read members).
"""

from .members import ArchiveError, Member, MemberIndex
from .reading import open_member_reader
from .source import archive_kind, open_archive

__all__ = [
    "ArchiveError",
    "Member",
    "MemberIndex",
    "archive_kind",
    "open_archive",
    "open_member_reader",
]
