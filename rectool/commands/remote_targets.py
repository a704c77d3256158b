"""What a command does with a TARGET that is a URL (s3://, https://): reads a local copy of
its pack (`rectool.remote.mirror`), and shows the copy's paths as the URL's, so that what it
says names what the user gave, never the cache folder and never a credential."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

import click

from ..redaction import safe_url


def local_targets(targets: Iterable[str], quiet: bool = False) -> list[str]:
    """Return `targets` with each URL (s3://, https://...) replaced by the manifest of a local
    copy of its pack (`rectool.remote.mirror`), said on stderr unless `quiet`."""
    from ..remote.store import is_url

    out = []
    for target in targets:
        if is_url(target):
            from ..remote.mirror import local_copy

            target_copy = local_copy(target)
            if not quiet:
                where = target_copy.rsplit("/", 1)[0]
                click.echo(f"{safe_url(target)}: reading a copy downloaded to {where}", err=True)
            target = target_copy
        out.append(target)
    return out


def named_by_url(copy: str, url: str) -> Callable[[str], str]:
    """Return what renames the paths under a pack's local `copy` (its manifest) by the
    pack's `url` (no credentials: `safe_url`), so that what a command shows names what the
    user gave, not the cache folder."""
    folder, url_folder = os.path.dirname(copy) + os.sep, safe_url(url).rsplit("/", 1)[0] + "/"
    return lambda text: text.replace(folder, url_folder)


def named_by_urls(targets: Sequence[str], local: Sequence[str]) -> Callable[[str], str] | None:
    """Return what renames the paths under the local copy of each URL of `targets` by that
    URL (`local`: what `local_targets` returned for them), or None when none is a URL."""
    from ..remote.store import is_url

    renames = [named_by_url(copy, url) for url, copy in zip(targets, local) if is_url(url)]
    if not renames:
        return None

    def shown_as(text: str) -> str:
        for rename in renames:
            text = rename(text)
        return text

    return shown_as
