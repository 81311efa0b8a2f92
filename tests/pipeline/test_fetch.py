"""fetch_wiki against a loopback HTTP server serving a fixture dump and its checksum files."""

import hashlib
import http.server
import threading

import pytest

from pipeline.corpus.fetch import FetchError, fetch_wiki, parse_checksums, select_dump_files
from pipeline.corpus.wiki import iter_wiki
from synth.dumps import pages_xml, write_multistream

DATE = "20261101"


class DumpServer(http.server.SimpleHTTPRequestHandler):
    """Static files with Range support, and faults on demand: ``corrupt`` serves wrong bytes for
    the next N full downloads, ``drop`` closes the connection half-way for the next N."""

    faults = {"corrupt": 0, "drop": 0}
    log: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.translate_path(self.path)
        try:
            data = open(path, "rb").read()
        except OSError:
            self.send_error(404)
            return
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
        type(self).log.append((self.path.rsplit("/", 1)[-1], start))
        body = data[start:]
        if not rng and self.path.endswith(".bz2") and self.faults["corrupt"]:
            self.faults["corrupt"] -= 1
            body = body[:-10] + b"X" * 10
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path.endswith(".bz2") and self.faults["drop"] and len(body) > 100:
            self.faults["drop"] -= 1
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "mirror"
    folder = root / "xxwiki" / DATE
    folder.mkdir(parents=True)
    dump, index = write_multistream(
        folder / f"xxwiki-{DATE}-pages-articles-multistream.xml.bz2", pages_xml(120), per_stream=20
    )
    other = folder / f"xxwiki-{DATE}-pages-meta-history.xml.bz2"
    other.write_bytes(b"not wanted")
    sums = "".join(f"{hashlib.sha1(p.read_bytes()).hexdigest()}  {p.name}\n" for p in (dump, index, other))
    (folder / f"xxwiki-{DATE}-sha1sums.txt").write_text(sums)
    DumpServer.faults = {"corrupt": 0, "drop": 0}
    DumpServer.log = []
    handler = lambda *a, **k: DumpServer(*a, directory=str(root), **k)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", dump, index
    httpd.shutdown()
    httpd.server_close()


def test_fetch_downloads_verifies_and_skips_what_is_there(server, tmp_path):
    base, dump, index = server
    out = tmp_path / "raw"
    urls = fetch_wiki("xx", DATE, str(out), base_url=base)
    assert [u.rsplit("/", 1)[-1] for u in urls] == sorted([dump.name, index.name])
    assert (out / dump.name).read_bytes() == dump.read_bytes()
    assert sum(1 for p in iter_wiki(str(out / dump.name)) if hasattr(p, "page_id")) == 120
    DumpServer.log.clear()
    fetch_wiki("xx", DATE, str(out), base_url=base)  # already there and verified: no download
    assert [n for n, _ in DumpServer.log if n.endswith(".bz2")] == []


def test_fetch_resumes_a_dropped_download_with_range(server, tmp_path):
    base, dump, _ = server
    DumpServer.faults["drop"] = 1
    fetch_wiki("xx", DATE, str(tmp_path / "raw"), base_url=base)
    assert (tmp_path / "raw" / dump.name).read_bytes() == dump.read_bytes()
    resumed = [start for name, start in DumpServer.log if name == dump.name or name.endswith("index.txt.bz2")]
    assert any(start > 0 for start in resumed)  # the second request asked for the rest only
    assert not list((tmp_path / "raw").glob("*.part"))


def test_fetch_refuses_a_corrupt_file_and_fetches_it_again(server, tmp_path):
    base, dump, _ = server
    DumpServer.faults["corrupt"] = 1
    fetch_wiki("xx", DATE, str(tmp_path / "raw"), base_url=base)
    assert (tmp_path / "raw" / dump.name).read_bytes() == dump.read_bytes()
    DumpServer.faults["corrupt"] = 99
    with pytest.raises(FetchError, match="does not match the published checksum after 2 attempts"):
        fetch_wiki("xx", DATE, str(tmp_path / "raw2"), base_url=base, attempts=2)
    assert not list((tmp_path / "raw2").glob("*.bz2"))  # nothing unverified under a final name


def test_fetch_errors_name_what_is_missing(server, tmp_path):
    base, _, _ = server
    with pytest.raises(FetchError, match="no sha1sums or md5sums file under .*/yywiki/20261101"):
        fetch_wiki("yy", DATE, str(tmp_path / "raw"), base_url=base, timeout=5)
    with pytest.raises(FetchError, match="bad lang"):
        fetch_wiki("en/../x", DATE, str(tmp_path / "raw"), base_url=base)


def test_select_dump_files_and_parse_checksums():
    names = [
        "enwiki-1-pages-articles-multistream.xml.bz2",
        "enwiki-1-pages-articles-multistream-index.txt.bz2",
        "enwiki-1-pages-articles-multistream1.xml-p1p41242.bz2",
        "enwiki-1-pages-articles-multistream-index1.txt-p1p41242.bz2",
        "enwiki-1-pages-articles.xml.bz2",
        "enwiki-1-pages-articles1.xml-p1p41242.bz2",
        "enwiki-1-pages-meta-current.xml.bz2",
    ]
    assert select_dump_files(names, "en", "1") == sorted(names[:2])
    parts = select_dump_files(names[2:], "en", "1")
    assert parts == sorted(names[2:4])
    assert select_dump_files(names, "en", "1", multistream=False) == ["enwiki-1-pages-articles.xml.bz2"]
    assert parse_checksums("ab" * 20 + "  x.bz2\nnoise line\n") == {"x.bz2": "ab" * 20}


def test_the_cli_fetches_and_names_the_next_command(server, tmp_path, capsys):
    from flows.cli import main

    base, dump, _ = server
    out = tmp_path / "raw"
    assert main(["fetch-wiki", "--lang", "xx", "--date", DATE, "--out", str(out), "--base-url", base]) == 0
    printed = capsys.readouterr().out
    assert dump.name in printed and f"data.wiki={out}" in printed
    assert main(["fetch-wiki", "--lang", "yy", "--date", DATE, "--out", str(out), "--base-url", base]) == 1


def test_select_dump_files_of_jawiki_and_zhwiki():
    # the names Wikimedia publishes for jawiki and zhwiki: one multistream file with its index,
    # and split parts (jawiki's pNNpNN ranges); the namespaces come from each page's <ns>
    ja = [
        "jawiki-20261101-pages-articles-multistream.xml.bz2",
        "jawiki-20261101-pages-articles-multistream-index.txt.bz2",
        "jawiki-20261101-pages-articles-multistream1.xml-p1p114794.bz2",
        "jawiki-20261101-pages-articles-multistream-index1.txt-p1p114794.bz2",
        "jawiki-20261101-pages-articles.xml.bz2",
        "jawiki-20261101-pages-meta-current.xml.bz2",
    ]
    assert select_dump_files(ja, "ja", "20261101") == sorted(ja[:2])
    assert select_dump_files(ja, "ja", "20261101", multistream=False) == ["jawiki-20261101-pages-articles.xml.bz2"]
    zh = [n.replace("jawiki", "zhwiki") for n in ja[2:4]]
    assert select_dump_files(zh, "zh", "20261101") == sorted(zh)
