"""No credential is ever shown: secrets planted in every place a URL enters rectool (a source,
`--drop-overlap`, an output prefix, the endpoint in the environment, a manifest's shard names,
a redirect) appear nowhere in stdout, stderr or the `--json` document, whatever fails.

The rule is `rectool.redaction`, applied by the command line where it makes its messages and
documents (`commands/conventions.py`); servers are real, on 127.0.0.1 (tests/helpers/servers.py).
"""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner
from helpers.servers import RangeServer

from rectool.cli import cli
from rectool.redaction import redact, safe_url, secrets_of
from rectool.remote.store import Retry

PASSWORD = "hunter2-PASSWORD-x9"
SIGNATURE = "SIGNATURE-f00dfeed"
CREDENTIAL = "CREDENTIAL-AKIAXXXX"
TOKEN = "SESSIONTOKEN-abcabc"
ENDPOINT_PASSWORD = "ENDPOINT-PASSWORD-77"
SECRETS = (PASSWORD, SIGNATURE, CREDENTIAL, TOKEN, ENDPOINT_PASSWORD)

PRESIGNED = (
    f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={CREDENTIAL}%2F20251201"
    f"&X-Amz-Security-Token={TOKEN}&X-Amz-Signature={SIGNATURE}"
)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def shows_nothing_secret(result):
    """Assert that no planted secret is in what the command printed; return the output."""
    shown = result.stdout + result.stderr
    for secret in SECRETS:
        assert secret not in shown, shown
    assert "Traceback" not in shown, shown
    return shown


@pytest.fixture(autouse=True)
def quick(monkeypatch, tmp_path):
    """No backoff between retries (the failures here are all certain), and a fresh cache."""
    monkeypatch.setattr(Retry, "delay", lambda self, failures: 0.0)
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))


def with_password(url):
    return url.replace("http://", f"http://alice:{PASSWORD}@", 1)


# --- The rule itself ---------------------------------------------------------------------------


def test_a_url_in_running_text_loses_its_user_password_query_and_fragment():
    text = f"source {with_password('http://h:9/p/x.manifest.json')}{PRESIGNED}#frag: not found"
    assert redact(text) == "source http://h:9/p/x.manifest.json: not found"
    assert safe_url(f"s3://me:{PASSWORD}@bucket/k{PRESIGNED}") == "s3://bucket/k"


def test_text_without_a_credential_is_kept_as_written():
    for text in ("s3://, gs:// and az:// URLs", "see https://example.org/a.html.", "a/b:c"):
        assert redact(text) == text


def test_a_secret_parameter_quoted_without_its_url_is_starred():
    assert redact(f"bad X-Amz-Signature={SIGNATURE}&x=1") == "bad X-Amz-Signature=***&x=1"


def test_a_secret_from_the_command_line_is_removed_where_a_library_quoted_it_alone():
    secrets = secrets_of([with_password("http://h/x.manifest.json") + PRESIGNED])
    text = f"parse error: password {PASSWORD!r}, signature {SIGNATURE}, token {TOKEN}"
    assert not any(secret in redact(text, secrets) for secret in SECRETS)


def test_credential_variables_and_the_password_of_an_endpoint_url_are_removed(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-secret-key-1234")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://u:{ENDPOINT_PASSWORD}@127.0.0.1:1")
    text = f"Url {{ password: Some({ENDPOINT_PASSWORD!r}) }} the-secret-key-1234"
    assert "the-secret-key-1234" not in redact(text) and ENDPOINT_PASSWORD not in redact(text)


# --- Sources: repack, info, verify, report ---------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_repack_of_a_url_with_a_password_never_shows_it(http_pack, tmp_path, as_json):
    url = with_password(http_pack.url)
    result = invoke("repack", url, tmp_path / "out", *(["--json"] if as_json else []))
    assert result.exit_code != 0
    shown = shows_nothing_secret(result)
    assert "127.0.0.1" in shown  # the URL is named, without its credentials
    if as_json:
        assert "error" in json.loads(result.stdout)


@pytest.mark.parametrize("command", ["repack", "info", "verify", "report"])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_presigned_url_never_shows_its_signature_credential_or_token(
    http_pack, tmp_path, command, as_json
):
    url = with_password(http_pack.url) + PRESIGNED
    out = {"repack": [tmp_path / "out"], "report": ["-o", tmp_path / "r.html"]}.get(command, [])
    result = invoke(command, url, *out, *(["--json"] if as_json else []))
    assert result.exit_code != 0
    shows_nothing_secret(result)
    if as_json:
        assert json.loads(result.stdout)["exit"] == result.exit_code


@pytest.mark.parametrize("command", ["info", "verify"])
def test_info_and_verify_of_a_url_with_a_password_name_it_without_the_password(http_pack, command):
    result = invoke(command, with_password(http_pack.url), "--json")
    shows_nothing_secret(result)
    assert json.loads(result.stdout)  # one document, whatever the outcome


def test_drop_overlap_of_a_url_with_credentials_never_shows_them(http_pack, tmp_path):
    url = with_password(http_pack.url) + PRESIGNED
    for as_json in ([], ["--json"]):
        result = invoke(
            "repack", http_pack.local, tmp_path / "dropped", "--drop-overlap", url, *as_json
        )
        assert result.exit_code != 0
        shows_nothing_secret(result)


@pytest.mark.parametrize(
    "args", [["reindex", "{url}"], ["list", "{url}", "out.lst"], ["dali-index", "{url}", "o.idx"]]
)
def test_a_usage_error_quoting_the_url_does_not_show_its_credentials(tmp_path, args):
    url = "http://bob:" + PASSWORD + "@127.0.0.1:1/x.manifest.json" + PRESIGNED
    args = [arg.format(url=url) for arg in args]
    for as_json in ([], ["--json"]):
        result = invoke(*args, *as_json)
        assert result.exit_code == 2
        assert "http://127.0.0.1:1/x.manifest.json" in shows_nothing_secret(result)


def test_a_url_with_credentials_that_works_is_named_without_them(s3_pack, tmp_path):
    # obstore takes s3://USER:PASSWORD@bucket as the bucket: every command succeeds, and
    # what it says (the stderr line naming the copy, the report, the JSON) names the URL.
    url = s3_pack.url.replace("s3://", f"s3://AKIA:{PASSWORD}@")
    for args in (
        ["verify", url],
        ["verify", url, "--json"],
        ["repack", url, tmp_path / "repacked"],
        ["unpack", url, tmp_path / "unpacked"],
        ["unpack", url, tmp_path / "unpacked-json", "--json"],
    ):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        shown = shows_nothing_secret(result)
        if args[0] == "verify":
            assert s3_pack.url.split("/")[2] in shown  # the URL is named, without them


def test_what_a_repack_writes_holds_no_credential_of_its_source_or_overlap_url(s3_pack, tmp_path):
    # The manifest's sources and options, the report and the label map are files users share.
    url = s3_pack.url.replace("s3://", f"s3://AKIA:{PASSWORD}@")
    out = tmp_path / "repacked"
    result = invoke("repack", url, out / "r", "--drop-overlap", url)
    assert result.exit_code in (0, 3), result.output
    written = sorted(p for p in out.iterdir() if p.suffix in (".json", ".jsonl", ".tsv"))
    assert any(p.name.endswith(".manifest.json") for p in written)
    for path in written:
        assert PASSWORD not in path.read_text(encoding="utf-8"), path.name


def test_an_output_prefix_url_with_credentials_is_never_shown(small_tree, tmp_path):
    prefix = f"http://carol:{PASSWORD}@127.0.0.1:1/packs/faces{PRESIGNED}"
    for as_json in ([], ["--json"]):
        result = invoke("pack", small_tree.list_path, small_tree.root, prefix, *as_json)
        assert result.exit_code != 0
        shows_nothing_secret(result)


# --- The endpoint in the environment ---------------------------------------------------------


@pytest.mark.parametrize("command", ["info", "verify"])
def test_a_password_in_aws_endpoint_url_never_reaches_the_message(s3, monkeypatch, command):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://dave:{ENDPOINT_PASSWORD}@127.0.0.1:1")
    for as_json in ([], ["--json"]):
        result = invoke(command, "s3://bucket/packs/faces.manifest.json", *as_json)
        assert result.exit_code != 0
        shows_nothing_secret(result)


# --- Manifests whose shard names carry credentials, and redirects ----------------------------


def hostile_manifest_pack(http_pack, tmp_path):
    """A copy of the served pack whose manifest names its first shard by a URL with
    credentials; served by a new server. Returns (server, manifest URL)."""
    folder = tmp_path / "hostile"
    shutil.copytree(http_pack.folder, folder)
    manifest = folder / http_pack.local.name
    doc = json.loads(manifest.read_text())
    doc["shards"][0]["rec"] = with_password("http://127.0.0.1:1/faces-00000.rec") + PRESIGNED
    manifest.write_text(json.dumps(doc))
    server = RangeServer(folder)
    return server, f"{server.url}/{manifest.name}"


@pytest.mark.parametrize("command", ["info", "verify", "repack"])
def test_a_manifest_whose_shard_name_holds_credentials_never_shows_them(
    http_pack, tmp_path, command
):
    server, url = hostile_manifest_pack(http_pack, tmp_path)
    try:
        out = [tmp_path / "out"] if command == "repack" else []
        for as_json in ([], ["--json"]):
            result = invoke(command, url, *out, *as_json)
            shows_nothing_secret(result)
    finally:
        server.stop()


class Redirector:
    """An HTTP server that answers every GET with a redirect to a presigned URL that
    answers 403 (an expired signature)."""

    def __init__(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if "X-Amz-Signature" in self.path:
                    body = f"<Error>expired {self.path}</Error>".encode()
                    self.send_response(403)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(302)
                self.send_header("Location", f"{server.url}/signed{self.path}{PRESIGNED}")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.mark.parametrize("command", ["info", "verify"])
def test_a_redirect_to_a_presigned_url_never_shows_its_signature(command):
    server = Redirector()
    try:
        for as_json in ([], ["--json"]):
            result = invoke(command, f"{server.url}/faces.manifest.json", *as_json)
            assert result.exit_code != 0
            shows_nothing_secret(result)
    finally:
        server.stop()


def test_pack_to_an_s3_prefix_with_credentials_names_it_without_them(s3, small_tree):
    bucket = "redaction-out"
    s3.client().create_bucket(Bucket=bucket)
    for n, as_json in enumerate(([], ["--json"])):
        prefix = f"s3://AKIA:{PASSWORD}@{bucket}/p{n}/faces"
        result = invoke("pack", small_tree.list_path, small_tree.root, prefix, *as_json)
        assert result.exit_code == 0, result.output
        assert f"s3://{bucket}/p{n}/faces.manifest.json" in shows_nothing_secret(result)


# --- The door: every command goes through it --------------------------------------------------


def test_every_command_is_a_rectool_command_so_its_output_is_redacted():
    from rectool.commands.conventions import RectoolCommand

    commands = cli.load_all()
    assert len(commands) >= 12
    assert {name for name, c in commands.items() if not isinstance(c, RectoolCommand)} == set()


def test_a_url_given_as_the_command_is_named_without_its_credentials():
    result = invoke(with_password("http://127.0.0.1:1/x.manifest.json") + PRESIGNED)
    assert result.exit_code == 2
    assert "'http://127.0.0.1:1/x.manifest.json'" in shows_nothing_secret(result)


def test_stderr_is_redacted_whichever_module_writes_it(monkeypatch):
    # A command whose module writes a URL to sys.stderr itself, not through click.
    import sys

    from rectool.commands.conventions import RectoolCommand

    def run():
        print(with_password("http://h/x.manifest.json") + PRESIGNED, file=sys.stderr)

    command = RectoolCommand("leaky", callback=run)
    result = CliRunner().invoke(command, [])
    assert result.exit_code == 0
    assert shows_nothing_secret(result).strip() == "http://h/x.manifest.json"
