"""One rule for what rectool says about URLs and the environment: never a credential.

    redact("http://me:pw@host/x.json?X-Amz-Signature=abc: not found")
    # -> "http://host/x.json: not found"

A secret reaches a message in three ways, and `redact` removes each:

- inside a URL: every URL in the text (any `scheme://`) loses its `user:password@`, its query
  string (a presigned URL's signature, credential and session token live there) and its
  fragment, as `safe_url` does to one URL;
- as a query parameter a library quoted without its URL (`X-Amz-Signature=...`, `sig=...`,
  `token=...`): the value becomes `***`;
- as a value from the environment or the command line that a library copied into its own
  words (obstore's messages quote `AWS_ENDPOINT_URL`, parsed or not): the values of credential
  variables (`AWS_SECRET_ACCESS_KEY`, `*_TOKEN`, `*PASSWORD*`, ...), and the user, password
  and secret query values of every URL in the environment or among `secrets_of(args)`,
  become `***` wherever they appear.

The command line applies it where its messages and JSON documents are made
(`commands/conventions.py`: errors, `emit_json`, answers and every line on stderr), so a
command cannot forget it; the library's own errors name URLs through `safe_url` as well.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any, cast

# Environment variables whose values must never appear in a message.
_SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASSWORD|PASSWD|ACCESS_KEY|ACCOUNT_KEY|CREDENTIAL|SIGNATURE|SAS_KEY|API_KEY",
    re.I,
)
# Query parameters that carry a credential (S3's and GCS's presigned URLs, Azure's SAS tokens,
# the usual names of a bearer token).
_SECRET_PARAMS = (
    "X-Amz-Signature",
    "X-Amz-Credential",
    "X-Amz-Security-Token",
    "X-Goog-Signature",
    "X-Goog-Credential",
    "Signature",
    "sig",
    "token",
    "access_token",
    "sas",
    "key",
    "password",
    "AWSAccessKeyId",
    "Credential",
    "Policy",
    "Key-Pair-Id",
)
_SECRET_PARAM = re.compile(
    r"(?<![\w-])((?:" + "|".join(map(re.escape, _SECRET_PARAMS)) + r")=)[^&\s'\"<>]+",
    re.I,
)
# A URL in running text: a scheme, `://`, then everything up to a space or a quote.
_URL_IN_TEXT = re.compile(r"(?<![\w+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*")
# What a secret shown as `***` must be at least, so that a short password ("pw") does not
# star out every word that contains it. A shorter one is still removed from every URL.
_MIN_SECRET = 4
_MIN_ENV_SECRET = 6
STARS = "***"


def safe_url(url: str) -> str:
    """Return `url` without a user:password, a query string (a signature) or a fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # a malformed URL (an unclosed `[`): keep what precedes its host
        scheme, _, rest = url.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2].split('?', 1)[0].split('#', 1)[0]}"
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _url_secrets(url: str) -> set[str]:
    """Return the user, password and secret query values of `url`, as written and decoded."""
    try:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=False)
    except ValueError:
        return set()
    found = set()
    userinfo = parts.netloc.rpartition("@")[0]
    if userinfo:
        found.update(userinfo.split(":", 1))
    names = {name.lower() for name in _SECRET_PARAMS}
    raw = dict(pair.partition("=")[::2] for pair in parts.query.split("&"))
    for name, value in query:
        if name.lower() in names:
            found.add(value)
            found.add(raw.get(name, value))
    both = found | {urllib.parse.unquote(s) for s in found}
    return {s for s in both if len(s) >= _MIN_SECRET}


def secrets_of(texts: Iterable[str]) -> frozenset[str]:
    """Return the credentials written in the URLs among `texts` (a command line's arguments):
    what `redact` must also remove where a library quoted them outside their URL."""
    found: set[str] = set()
    for text in texts:
        for match in _URL_IN_TEXT.finditer(str(text)):
            found |= _url_secrets(match.group())
    return frozenset(found)


def environment_secrets(environ: Mapping[str, str] | None = None) -> set[str]:
    """Return the values of credential variables in the environment, and the credentials in
    the URLs it holds (an `AWS_ENDPOINT_URL` with a user and password)."""
    environ = os.environ if environ is None else environ
    found = set()
    for name, value in environ.items():
        if len(value) >= _MIN_ENV_SECRET and _SECRET_NAME.search(name):
            found.add(value)
        if "://" in value:
            found |= _url_secrets(value)
    return found


def scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    """Return `text` with `secrets` (by default the environment's: `environment_secrets`)
    replaced by `***`, longest first, so that no part of one is left."""
    secrets = environment_secrets() if secrets is None else secrets
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, STARS)
    return text


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """Return `text` with no credential: every URL in it as `safe_url` gives it, every
    secret query parameter's value starred, and `secrets` removed (by default the
    environment's; a command passes those and its arguments': `secrets_of`)."""
    text = scrub(text, secrets)  # first: a secret is found whole, before URLs are cut
    if "://" in text:
        text = _URL_IN_TEXT.sub(_safe_match, text)
    if "=" in text:
        text = _SECRET_PARAM.sub(lambda match: match.group(1) + STARS, text)
    return text


def _safe_match(match: re.Match[str]) -> str:
    # Punctuation that ends a URL in a sentence ("URL: not found") stays after it.
    url = match.group()
    end = len(url.rstrip(":,;.)]!"))
    if not any(c in url[:end] for c in "@?#"):  # nothing to remove: kept as written
        return url
    return safe_url(url[:end]) + url[end:]


def redact_document(value: object, secrets: Iterable[str] | None = None) -> object:
    """Return a JSON document (dicts, lists, strings, numbers) with `redact` applied to every
    string in it, keys included."""
    known = tuple(environment_secrets() if secrets is None else secrets)

    def redacted(value: object) -> object:
        if isinstance(value, str):
            return redact(value, known)
        if isinstance(value, Mapping):
            return {redacted(k): redacted(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [redacted(item) for item in value]
        return value

    return redacted(value)


class RedactedStream:
    """A text stream (stderr) through which every line is written `redact`ed: what a command
    says on stderr (its summaries, warnings, progress) cannot show a credential, whichever
    module wrote it. It offers no `buffer`, so that nothing writes around it."""

    def __init__(self, stream: IO[str], secrets: frozenset[str]) -> None:
        self.stream, self.secrets = stream, secrets

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # click asks whether a stream takes bytes
            raise TypeError("RedactedStream writes text")
        self.stream.write(redact(text, self.secrets))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        if name == "buffer":
            raise AttributeError(name)
        return getattr(self.stream, name)


@contextlib.contextmanager
def redacted_stderr(secrets: frozenset[str]) -> Iterator[None]:
    """Make `sys.stderr` a `RedactedStream` while the block runs."""
    stream = sys.stderr
    sys.stderr = cast(IO[str], RedactedStream(stream, secrets))
    try:
        yield
    finally:
        sys.stderr = stream
