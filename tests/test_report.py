"""`rectool report`: the page's numbers, contact sheet, refusals, duplicates, and a real browser.

The browser tests drive Debian's headless `chromium` over the DevTools protocol on a pipe
(stdlib only): they collect console messages, exceptions, log entries and every network
request while the page loads, take a screenshot, and read element boxes from the live DOM.
`make test` installs chromium; without it these tests fail rather than skip.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import MAGIC, write_insightface, write_pack
from helpers.image_files import jpeg_bytes, write_list
from helpers.rec_files import make_pack

from rectool.cli import cli
from rectool.packer.listfile import write_label_map
from rectool.packer.packing import PackOptions, pack_images

# Identities and their image counts: uneven, so smallest and largest differ.
COUNTS = {"ann": 1, "ben": 2, "cyd": 3, "dot": 5, "eve": 12}
THUMB = 48


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def report_pack(tmp_path_factory):
    """A pack of COUNTS (+ a duplicate across ann/ben, one within eve) and three refusals.

    Refused: `ben/empty.jpg` (empty; replaced after packing by a good JPEG, so its source
    decodes now), `cyd/cut.jpg` (half a JPEG), `dot/gone.jpg` (deleted after packing).
    """
    tmp = tmp_path_factory.mktemp("report")
    root, items, index = tmp / "tree", [], 0
    for label, (name, count) in enumerate(COUNTS.items()):
        (root / name).mkdir(parents=True)
        for n in range(count):
            rel = f"{name}/{n:03d}.jpg"
            (root / rel).write_bytes(jpeg_bytes(index + 1, 64, 48))
            items.append((index, label, rel))
            index += 1
    extra = {
        "ben/copy-of-ann.jpg": (1, (root / "ann/000.jpg").read_bytes()),
        "eve/again.jpg": (4, (root / "eve/000.jpg").read_bytes()),
        "ben/empty.jpg": (1, b""),
        "cyd/cut.jpg": (2, jpeg_bytes(99, 64, 48)[:300]),
        "dot/gone.jpg": (3, b""),
    }
    for rel, (label, data) in extra.items():
        (root / rel).write_bytes(data)
        items.append((index, label, rel))
        index += 1
    lst = write_list(tmp / "faces.lst", items)
    labels = tmp / "faces.labels.tsv"
    write_label_map(labels, dict(enumerate(COUNTS)))
    out = tmp / "out"
    pack_images(lst, root, out / "faces", PackOptions(max_failures=3, workers=1), label_map=labels)
    (root / "ben/empty.jpg").write_bytes(jpeg_bytes(7, 64, 48))
    (root / "dot/gone.jpg").unlink()
    return tmp


def manifest(pack):
    return pack / "out" / "faces.manifest.json"


@pytest.fixture(scope="module")
def page(report_pack):
    """The report of `pack` (thumbnails of refused sources on), and its parsed HTML."""
    out = report_pack / "report.html"
    options = ["--thumb", THUMB, "--identities", 3, "--per-identity", 4]
    result = invoke(
        "report", manifest(report_pack), "-o", out, "--images-root", report_pack / "tree", *options
    )
    assert result.exit_code == 0, result.output
    return out, parse(out.read_text(encoding="utf-8"))


class Page(HTMLParser):
    """Collect what the tests check: tables by id, headings, images, attributes, text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables, self.headings, self.images, self.attrs = {}, [], [], []
        self.section, self.sections, self.meta = None, [], []
        self._table = self._row = self._cell = self._heading = None
        self.text = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.attrs.append((tag, attrs))
        if tag == "section":
            self.section = attrs.get("id")
            self.sections.append(self.section)
        elif tag == "table":
            self._table = self.tables.setdefault(attrs.get("id"), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
            self._table.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = [tag, attrs, ""]
            self._row.append(self._cell)
        elif re.fullmatch("h[1-6]", tag):
            self._heading = [tag, ""]
            self.headings.append(self._heading)
        elif tag == "img":
            self.images.append((self.section, attrs))
        elif tag == "meta":
            self.meta.append(attrs)

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag in ("td", "th"):
            self._cell = None
        elif re.fullmatch("h[1-6]", tag):
            self._heading = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell[2] += data
        if self._heading is not None:
            self._heading[1] += data

    def rows(self, table_id):
        """Return a table's rows as lists of cell texts, header row first."""
        return [[cell[2].strip() for cell in row] for row in self.tables[table_id]]

    def summary(self):
        """Return {row name: data-value as int} for the summary table's numeric rows."""
        out = {}
        for row in self.tables["summary-table"]:
            (_, _, name), (_, attrs, _) = row
            if "data-value" in attrs:
                out[name.strip()] = int(attrs["data-value"])
        return out


def parse(html):
    parser = Page()
    parser.feed(html)
    parser.close()
    return parser


def info_json(target):
    result = invoke("info", target, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


# --- the numbers -------------------------------------------------------------------------------


def test_summary_matches_info_json_and_the_tree(report_pack, page):
    _, html = page
    info = info_json(manifest(report_pack))
    summary = html.summary()
    packed = sum(COUNTS.values()) + 2  # the two copies
    assert (summary["Records"], summary["Images"]) == (info["records"], info["images"])
    assert (summary["Records"], summary["Images"], summary["Identities"]) == (packed, packed, 5)
    assert summary["Identities"] == info["identities"]
    assert summary["Shards"] == info["shards"] == 1
    assert (
        summary[".rec bytes"] == info["rec_bytes"] == (report_pack / "out/faces.rec").stat().st_size
    )
    assert summary["Image bytes"] == info["image_bytes"]["total"]
    assert summary["Refused by the pack"] == 3


def test_images_per_identity_table_holds_the_charts_log_bins(report_pack, page):
    _, html = page
    info = info_json(manifest(report_pack))
    rows = html.rows("per-identity-table")
    assert rows[0] == ["Images per identity", "Identities"]
    # ann 1, ben 2+1, cyd 3, dot 5, eve 12+1: the chart's log-spaced bins (few identities,
    # few bars: tests/test_report_chart.py), every identity info counts in one of them.
    assert rows[1:] == [["1", "1"], ["2\u20133", "2"], ["4\u201310", "1"], ["11\u201330", "1"]]
    assert sum(int(n) for _, n in rows[1:]) == info["identities"] == 5


def test_contact_sheet_rows_name_each_identity_and_its_count(page):
    _, html = page
    rows = [text for tag, text in html.headings if tag == "h4"]
    per = {"ann": 1, "ben": 3, "cyd": 3, "dot": 5, "eve": 13}
    label_of = {name: n for n, name in enumerate(COUNTS)}
    for text in rows:
        m = re.fullmatch(r"Identity (\d+) \((\w+)\): (\d+) images?", text)
        assert m, text
        assert int(m[1]) == label_of[m[2]] and int(m[3]) == per[m[2]]
    # 3 sampled, then the 2 smallest (ann, then ben/cyd by label: ben) and the 2 largest.
    assert len(rows) == 3 + 2 + 2
    assert [r.split(":")[0] for r in rows[3:]] == [
        "Identity 0 (ann)",
        "Identity 1 (ben)",
        "Identity 4 (eve)",
        "Identity 3 (dot)",
    ]
    sheet = [attrs for section, attrs in html.images if section == "contact-sheet"]
    # Every thumbnail: a JPEG data URI no larger than --thumb, with alt text naming its identity.
    assert len(sheet) == sum(min(4, per[r.split("(")[1].split(")")[0]]) for r in rows)
    for attrs in sheet:
        assert attrs["src"].startswith("data:image/jpeg;base64,")
        assert re.match(r"identity \d+ \(\w+\), image at faces\.rec byte [\d,]+$", attrs["alt"])
        image = decode_data_uri(attrs["src"])
        assert max(image.shape[:2]) <= THUMB
        assert (int(attrs["height"]), int(attrs["width"])) == image.shape[:2]


def decode_data_uri(src):
    data = base64.b64decode(src.split(",", 1)[1])
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)


def test_refusals_are_counted_and_listed_with_a_thumbnail_where_the_source_decodes(page):
    _, html = page
    reasons = html.rows("refusal-reasons")
    assert reasons[0] == ["Reason", "Images"]
    assert sum(int(n) for _, n in reasons[1:]) == 3
    listed = {row[1]: row for row in html.rows("refusal-list")[1:]}
    assert set(listed) == {"ben/empty.jpg", "cyd/cut.jpg", "dot/gone.jpg"}
    assert listed["ben/empty.jpg"][2] == "empty file"
    assert listed["cyd/cut.jpg"][3] == "source does not decode"
    assert listed["dot/gone.jpg"][3] == "source not found"
    thumbs = [attrs for section, attrs in html.images if section == "refusals"]
    assert len(thumbs) == 1
    assert thumbs[0]["alt"].startswith("refused image ben/empty.jpg (list line ")


def test_exact_duplicates_across_identities_are_listed(page):
    _, html = page
    rows = html.rows("duplicate-list")
    assert len(rows) == 2  # ann/ben only; eve's copy is within one identity
    image, copies, where, digest = rows[1]
    assert copies == "2"
    assert re.fullmatch(
        r"identity 0: faces\.rec byte [\d,]+identity 1: faces\.rec byte [\d,]+", where
    )
    assert re.fullmatch("[0-9a-f]{32}", digest)
    text = "".join(html.text)
    assert (
        "1 image is stored byte for byte under more than one identity (2 copies in all); "
        "1 more image is repeated within one identity." in text
    )


def test_duplicates_of_split_records_are_found(tmp_path):
    # A magic word at an aligned offset splits the record: its bytes are read the slow way.
    image = jpeg_bytes(1, 16, 16) + MAGIC * 3 + b"tail-of-it"
    other = jpeg_bytes(2, 16, 16) + MAGIC * 3 + b"tail-of-it"
    write_pack(tmp_path / "p", [[(0, image, 0.0), (1, other, 1.0), (2, image, 2.0)]])
    out = tmp_path / "r.html"
    assert invoke("report", tmp_path / "p", "-o", out).exit_code == 0
    rows = parse(out.read_text()).rows("duplicate-list")
    assert len(rows) == 2 and rows[1][1] == "2"
    assert "identity 0:" in rows[1][2] and "identity 2:" in rows[1][2]


# --- inputs and options -----------------------------------------------------------------------


def test_same_seed_same_page_other_seed_other_sample(report_pack, tmp_path):
    pages = []
    for seed in (5, 5, 6):
        out = tmp_path / f"{len(pages)}.html"
        result = invoke(
            "report", manifest(report_pack), "-o", out, "--seed", seed, "--identities", 2
        )
        assert result.exit_code == 0, result.output
        pages.append(out.read_bytes())
    assert pages[0] == pages[1]
    sampled = [[t for tag, t in parse(p.decode()).headings if tag == "h4"][:2] for p in pages[1:]]
    assert sampled[0] != sampled[1]


def test_insightface_folder(tmp_path):
    folder = tmp_path / "faces_emore"
    folder.mkdir()
    write_insightface(
        folder / "train.rec", folder / "train.idx", [2, 4, 1], lambda n: jpeg_bytes(n, 32, 32)
    )
    out = tmp_path / "r.html"
    result = invoke("report", folder, "-o", out)
    assert result.exit_code == 0, result.output
    html = parse(out.read_text())
    info = info_json(folder)
    assert html.summary()["Images"] == info["images"] == 7
    assert html.summary()["Identities"] == info["identities"] == 3
    assert html.rows("summary-table")[2] == ["Layout", "insightface"]
    assert "No manifest" in "".join(html.text)


def test_label_vectors_are_said_beside_the_layout(tmp_path):
    pack = make_pack(tmp_path, pack_label=True)
    out = tmp_path / "r.html"
    result = invoke("report", pack.manifest, "-o", out)
    assert result.exit_code == 0, result.output
    html = parse(out.read_text())
    assert html.rows("summary-table")[2] == ["Layout", "images, label vectors"]


def test_missing_failures_file_is_said_on_the_page(report_pack, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(report_pack / "out", copy)
    (copy / "faces.failures.jsonl").unlink()
    out = tmp_path / "r.html"
    result = invoke("report", copy / "faces.manifest.json", "-o", out)
    assert result.exit_code == 0, result.output
    text = "".join(parse(out.read_text()).text)
    assert f"The failures file {copy / 'faces.failures.jsonl'} is missing" in text
    assert "(the manifest counts 3 refusals)" in text


def test_a_split_copy_of_a_whole_record_is_a_duplicate(tmp_path):
    # The key 0xCED7230A puts a magic word at payload offset 8: that record is split, read
    # the slow way; its twin is whole, read vectorised. Odd length: middles must agree.
    image = jpeg_bytes(5, 16, 16)
    image += b"x" * (1 - len(image) % 2)
    write_pack(
        tmp_path / "p", [[(1, image, 0.0), (2, jpeg_bytes(6), 0.0), (0xCED7230A, image, 1.0)]]
    )
    assert (tmp_path / "p.rec").read_bytes().count(MAGIC) == 4  # 3 records, one in 2 parts
    out = tmp_path / "r.html"
    assert invoke("report", tmp_path / "p", "-o", out).exit_code == 0
    rows = parse(out.read_text()).rows("duplicate-list")
    assert len(rows) == 2 and rows[1][1] == "2"


def test_duplicates_across_shards_name_both_files(tmp_path):
    image = jpeg_bytes(3, 16, 16)
    shards = [[(0, image, 0.0), (1, jpeg_bytes(4, 16, 16), 1.0)], [(2, image, 1.0)]]
    write_pack(tmp_path / "p", shards)
    out = tmp_path / "r.html"
    assert invoke("report", tmp_path / "p", "-o", out).exit_code == 0
    html = parse(out.read_text())
    assert html.summary()["Shards"] == 2
    rows = html.rows("duplicate-list")
    assert len(rows) == 2
    assert re.fullmatch(
        r"identity 0: p-00000\.rec byte 0identity 1: p-00001\.rec byte 0", rows[1][2]
    )


def test_labels_that_are_not_class_ids(tmp_path):
    write_pack(tmp_path / "p", [[(k, jpeg_bytes(k), 0.5 * k) for k in range(5)]])
    out = tmp_path / "r.html"
    result = invoke("report", tmp_path / "p", "-o", out, "--identities", 1, "--per-identity", 3)
    assert result.exit_code == 0, result.output
    html = parse(out.read_text())
    assert html.rows("summary-table")[6] == ["Identities", "labels are not integral class ids"]
    assert [t for tag, t in html.headings if tag == "h4"] == ["Images sampled from all 5"]
    assert len([a for s, a in html.images if s == "contact-sheet"]) == 3


def test_verify_result_on_the_page(report_pack, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(report_pack / "out", copy)
    target = copy / "faces.manifest.json"
    out = tmp_path / "r.html"
    assert invoke("report", target, "-o", out, "--verify", "--decode").exit_code == 0
    verdict = parse(out.read_text()).rows("summary-table")[-1]
    assert verdict == [
        "Verify",
        "sound: no problems found (framing, index, headers, checksums, decoding)",
    ]
    rec = copy / "faces.rec"
    data = bytearray(rec.read_bytes())
    data[-8] ^= 0xFF  # inside the last image: the checksum no longer matches
    rec.write_bytes(bytes(data))
    assert invoke("report", target, "-o", out, "--verify", "--overwrite").exit_code == 0
    html = parse(out.read_text())
    assert html.rows("summary-table")[-1] == [
        "Verify",
        "2 problems (checksum-mismatch 1, record-checksum-mismatch 1); checked framing, "
        "index, headers, checksums",
    ]
    problems = sorted(row[0] for row in html.rows("verify-problems")[1:])
    assert problems == ["checksum-mismatch", "record-checksum-mismatch"]


def test_images_that_do_not_decode_are_shown_as_such(tmp_path):
    samples = write_pack(tmp_path / "p", [[(0, jpeg_bytes(1), 0.0), (1, b"not an image", 0.0)]])
    out = tmp_path / "r.html"
    result = invoke("report", tmp_path / "p", "-o", out, "--sample", 0)
    assert result.exit_code == 0, result.output
    html = parse(out.read_text())
    # One identity: it is the sample, the smallest and the largest; each row shows the good
    # image and a placeholder for the other.
    assert len([a for s, a in html.images if s == "contact-sheet"]) == 3
    problems = "".join(html.text)
    bad = f"identity 0, image at p.rec byte {samples[1].offset:,}: does not decode"
    assert problems.count(bad) == 1  # in the list of problems
    placeholders = [a for tag, a in html.attrs if a.get("role") == "img" and tag == "div"]
    assert [a["aria-label"] for a in placeholders] == [bad] * 3
    assert "Problems met while reporting" in problems


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "no dataset here"),
        (lambda p: (p.parent / "x.manifest.json").write_text("{"), "not a rectool manifest"),
        (lambda p: (p.parent / "x.rec").write_bytes(b"\x01" * 64), "x.rec"),
    ],
)
def test_unreadable_pack_is_a_clear_error(tmp_path, make, message):
    make(tmp_path / "x")
    result = invoke("report", tmp_path / "x", "-o", tmp_path / "r.html")
    assert result.exit_code in (1, 2)  # 2: no dataset at all, 1: a dataset that is damaged
    assert result.output.startswith("Error: ") and message in result.output
    assert not (tmp_path / "r.html").exists()


def test_usage_errors(report_pack, tmp_path):
    assert invoke("report", manifest(report_pack)).exit_code == 2
    assert (
        invoke("report", manifest(report_pack), "-o", tmp_path / "r.html", "--decode").exit_code
        == 2
    )
    result = invoke("report", manifest(report_pack), "--sheet", tmp_path / "s.gif")
    assert result.exit_code == 2 and ".jpg or .png" in result.output


def test_page_stays_within_max_bytes(report_pack, tmp_path):
    out = tmp_path / "r.html"
    result = invoke("report", manifest(report_pack), "-o", out, "--max-bytes", "400KB")
    assert result.exit_code == 0, result.output
    assert out.stat().st_size <= 400_000
    html = parse(out.read_text())
    assert not [a for s, a in html.images if s == "contact-sheet"]
    assert "thumbnails left out to keep the page within 400,000 bytes" in "".join(html.text)


def test_sheet_alone(report_pack, tmp_path):
    sheet = tmp_path / "sheet.png"
    result = invoke(
        "report",
        manifest(report_pack),
        "--sheet",
        sheet,
        "--thumb",
        32,
        "--identities",
        2,
        "--per-identity",
        3,
    )
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == [sheet]
    image = cv2.imread(str(sheet))
    rows = 2 + 2 + 2  # sampled, smallest, largest
    assert image.shape == (rows * (32 + 4) + 4, 220 + 3 * (32 + 4) + 4, 3)
    assert image[4 : 4 + 32, 224 : 224 + 32].std() > 5  # a thumbnail, not blank paper


# --- a self-contained, accessible page ---------------------------------------------------------

RESOURCE_ATTRS = ("src", "href", "srcset", "action", "data", "poster", "xlink:href", "background")


def test_no_resource_leaves_the_file_and_the_page_is_accessible(page):
    path, html = page
    csp = [m["content"] for m in html.meta if m.get("http-equiv") == "Content-Security-Policy"]
    assert csp == ["default-src 'none'; img-src data:; style-src 'unsafe-inline'"]
    for tag, attrs in html.attrs:
        for name in RESOURCE_ATTRS:
            if name in attrs:
                assert attrs[name].startswith("data:"), (tag, name, attrs[name][:80])
    source = path.read_text()
    assert not re.search(r"url\(|@import|<script|<link|<iframe", source)
    assert not re.search(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}", re.sub(r"data:[^\"']*", "", source))
    assert [t for t, _ in html.headings[:2]] == ["h1", "h2"]
    assert all(attrs.get("alt") for _, attrs in html.images)
    for table_id, rows in html.tables.items():
        assert any(cell[0] == "th" for cell in rows[0]), table_id
    assert html.sections[:5] == ["summary", "charts", "contact-sheet", "refusals", "duplicates"]


# --- in a real browser ---------------------------------------------------------------------


class Browser:
    """Headless chromium driven over --remote-debugging-pipe (fd 3 in, fd 4 out)."""

    def __init__(self, profile):
        exe = shutil.which("chromium")
        assert exe, "chromium is not installed: run `make chromium` (make test does)"
        to_r, self._to = os.pipe()
        self._from, from_w = os.pipe()

        def wire():
            os.dup2(to_r, 3)
            os.dup2(from_w, 4)

        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "--no-first-run",
                "--hide-scrollbars",
                "--disable-extensions",
                "--disable-background-networking",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire,
            close_fds=False,
        )
        os.close(to_r)
        os.close(from_w)
        self._buffer, self._id, self.events = b"", 0, []

    def close(self):
        try:
            self.send("Browser.close")
        except OSError:
            pass
        os.close(self._to)
        os.close(self._from)
        self.proc.wait(timeout=60)

    def _message(self, timeout=120):
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from], [], [], timeout)
            assert ready, f"chromium sent nothing for {timeout} s"
            chunk = os.read(self._from, 1 << 20)
            assert chunk, "chromium closed the DevTools pipe"
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method, session=None, **params):
        """Send a command; return its result, keeping the events that arrive meanwhile."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._message()
            if reply.get("id") == self._id:
                assert "error" not in reply, reply
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method):
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._message())

    def load(self, url, width=1200, height=900):
        """Open `url` in a new tab with console, log and network events on; return the session."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.events.clear()
        self.send("Page.navigate", session, url=url)
        self.wait_for("Page.loadEventFired")
        return session

    def evaluate(self, session, expression):
        result = self.send("Runtime.evaluate", session, expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"]["value"]

    def screenshot(self, session):
        size = self.send("Page.getLayoutMetrics", session)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.send(
            "Page.captureScreenshot", session, format="png", captureBeyondViewport=True, clip=clip
        )
        data = np.frombuffer(base64.b64decode(shot["data"]), np.uint8)
        return cv2.imdecode(data, cv2.IMREAD_COLOR)

    def complaints(self):
        """Return console errors/warnings, exceptions and log errors seen so far."""
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "warning"):
                out.append(("console", params["args"]))
            elif method == "Runtime.exceptionThrown":
                out.append(("exception", params["exceptionDetails"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                out.append(("log", params["entry"]["text"]))
        return out

    def requests(self):
        """Return the URLs the page asked for (data: URIs included)."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


BOXES = """JSON.stringify([...document.querySelectorAll('svg.chart, #contact-sheet img')].map(e => {
  const r = e.getBoundingClientRect();
  return [e.tagName.toLowerCase(), e.id, r.left + scrollX, r.top + scrollY, r.width, r.height,
          e.complete === undefined ? true : e.complete && e.naturalWidth > 0];
}))"""


def test_page_renders_in_chromium_without_errors_or_requests(page, browser):
    path, html = page
    url = path.resolve().as_uri()
    session = browser.load(url)
    assert browser.complaints() == []
    requests = browser.requests()
    assert requests[0] == url
    assert all(u.startswith("data:image/jpeg;base64,") for u in requests[1:]), requests
    boxes = json.loads(browser.evaluate(session, BOXES))
    charts = [b for b in boxes if b[0] == "svg"]
    thumbs = [b for b in boxes if b[0] == "img"]
    assert [b[1] for b in charts] == ["chart-per-identity", "chart-dimensions", "chart-bytes"]
    assert len(thumbs) == len([a for s, a in html.images if s == "contact-sheet"]) > 0
    assert all(b[6] for b in thumbs), "a thumbnail failed to load"
    shot = browser.screenshot(session)
    for tag, ident, x, y, w, h, _ in charts + thumbs:
        assert w > 10 and h > 10, (tag, ident)
        region = shot[int(y) : int(y + h), int(x) : int(x + w)]
        assert region.size and region.std() > 10, (tag, ident, region.std())
    # The page's text is really there: the summary heading rendered as an element.
    assert browser.evaluate(session, "document.querySelector('#summary h2').textContent") == (
        "Summary"
    )


def test_the_browser_check_sees_a_page_that_reaches_out(tmp_path, browser):
    # The same checks must fail on a page that asks for something outside the file.
    leaky = tmp_path / "leaky.html"
    leaky.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; img-src data:\"></head><body>"
        '<img alt="x" src="http://127.0.0.1:9/x.png"></body></html>'
    )
    browser.load(leaky.resolve().as_uri())
    assert browser.complaints(), "a blocked request must show up as an error"
    open_page = tmp_path / "open.html"
    open_page.write_text('<!DOCTYPE html><html><body><img alt="x" src="http://127.0.0.1:9/x.png">')
    browser.load(open_page.resolve().as_uri())
    assert "http://127.0.0.1:9/x.png" in browser.requests()


def test_demo_writes_a_report_and_says_where(tmp_path):
    out = tmp_path / "demo-out"
    repo = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "rectool.demo", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = out / "report.html"
    assert done.stdout.splitlines()[-1] == (
        f"the dataset's report: {report.resolve()} (open it in a browser)"
    )
    html = parse(report.read_text())
    assert html.summary()["Images"] == 48
    assert len(html.rows("refusal-list")) == 1 + 2
