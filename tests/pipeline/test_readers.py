"""Readers: streaming MediaWiki exports, input expansion, books."""

import bz2
import gzip

import pytest

from pipeline.corpus.books import iter_books, read_book
from pipeline.corpus.inputs import expand_inputs
from pipeline.corpus.records import CorpusReadError, Page
from pipeline.corpus.wiki import iter_pages

NS10 = "http://www.mediawiki.org/xml/export-0.10/"


def export(pages: str, ns: str | None = NS10) -> str:
    xmlns = f' xmlns="{ns}"' if ns else ""
    return (
        f'<mediawiki{xmlns} version="0.10" xml:lang="en">\n'
        "  <siteinfo><sitename>Wikipedia</sitename>\n"
        '    <namespaces><namespace key="0" case="first-letter" /></namespaces>\n'
        "  </siteinfo>\n" + pages + "</mediawiki>\n"
    )


PAGES = """
  <page>
    <title>Alpha</title><ns>0</ns><id>10</id>
    <revision><id>900</id><contributor><username>U</username><id>77</id></contributor>
      <text bytes="40" xml:space="preserve">'''Alpha''' is &lt;b&gt;first&lt;/b&gt; &amp;amp; best.</text>
    </revision>
  </page>
  <page>
    <title>Beta</title><ns>0</ns><id>11</id>
    <redirect title="Alpha" />
    <revision><id>901</id><text xml:space="preserve">#REDIRECT [[Alpha]]</text></revision>
  </page>
  <page>
    <title>Talk:Alpha</title><ns>1</ns><id>12</id>
    <revision><id>902</id><text xml:space="preserve">Chat.</text></revision>
  </page>
  <page>
    <title>Empty</title><ns>0</ns><id>13</id>
    <revision><id>903</id><text deleted="deleted" /></revision>
  </page>
  <page>
    <title>History</title><ns>0</ns><id>14</id>
    <revision><id>1</id><text>old</text></revision>
    <revision><id>2</id><text>new</text></revision>
  </page>
"""


def test_iter_pages_fields_redirects_namespaces(tmp_path):
    path = tmp_path / "dump.xml"
    path.write_text(export(PAGES), encoding="utf-8")
    pages = list(iter_pages(str(path)))
    assert [p.page_id for p in pages] == ["10", "11", "12", "13", "14"]  # page id, not revision/user id
    alpha = pages[0]
    assert alpha == Page("10", "Alpha", 0, None, "'''Alpha''' is <b>first</b> &amp; best.")
    assert pages[1].redirect == "Alpha"
    assert pages[2].ns == 1
    assert pages[3].text == ""
    assert pages[4].text == "new"  # latest revision of a full-history export


@pytest.mark.parametrize("ns", [NS10, "http://www.mediawiki.org/xml/export-0.11/", None])
def test_iter_pages_is_namespace_agnostic(tmp_path, ns):
    path = tmp_path / "dump.xml"
    path.write_text(export(PAGES, ns), encoding="utf-8")
    assert [p.title for p in iter_pages(str(path))][:2] == ["Alpha", "Beta"]


def test_iter_pages_reads_compressed_by_suffix(tmp_path):
    bz = tmp_path / "dump.xml.bz2"
    bz.write_bytes(bz2.compress(export(PAGES).encode()))
    gz = tmp_path / "dump.xml.gz"
    gz.write_bytes(gzip.compress(export(PAGES).encode()))
    assert len(list(iter_pages(str(bz)))) == 5
    assert len(list(iter_pages(str(gz)))) == 5


def test_iter_pages_strict_names_file_page_and_fault(tmp_path):
    path = tmp_path / "broken.xml"
    path.write_text(export(PAGES).replace("</page>\n  <page>\n    <title>Beta", "<page><title>Beta", 1))
    with pytest.raises(CorpusReadError, match=r"broken\.xml: page 'Alpha' \(id 10\) unclosed_page"):
        list(iter_pages(str(path)))


def test_iter_pages_truncated_archive_names_file(tmp_path):
    data = bz2.compress(export(PAGES).encode())
    path = tmp_path / "cut.xml.bz2"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorpusReadError, match=r"cut\.xml\.bz2"):
        list(iter_pages(str(path)))


def test_iter_pages_streams_in_constant_memory(tmp_path):
    # Pages are cleared as they go: the reader holds its read buffers and the page being parsed,
    # whatever the file's size. Measured on two files, 4x apart: a kept tree (or a buffer that
    # grows with the file) makes the larger one's peak grow with it.
    import tracemalloc

    page = "<page><title>T{i}</title><ns>0</ns><id>{i}</id><revision><text>{body}</text></revision></page>\n"
    body = "word " * 200
    list(iter_pages(str(_write(tmp_path / "warm.xml", page, body, 2))))  # lazy imports out of the count
    peaks = []
    for n in (3000, 12000):
        path = _write(tmp_path / f"big{n}.xml", page, body, n)
        tracemalloc.start()
        count = sum(1 for _ in iter_pages(str(path)))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert count == n
    size = path.stat().st_size  # ~13 MB
    assert peaks[1] < size / 8, peaks  # two 256 KiB read buffers and a page: ~1 MB
    assert peaks[1] < 1.25 * peaks[0], peaks


def _write(path, page, body, n):
    path.write_text(export("".join(page.format(i=i, body=body) for i in range(n))))
    return path


def test_expand_inputs_file_folder_glob(tmp_path):
    (tmp_path / "d").mkdir()
    for name in ("b.xml.bz2", "a.xml", "notes.md", "_manifest.json", ".hidden.xml"):
        (tmp_path / "d" / name).write_text("x")
    (tmp_path / "d" / "sub").mkdir()
    (tmp_path / "d" / "sub" / "c.xml").write_text("x")
    d = str(tmp_path / "d")
    assert expand_inputs(d, (".xml", ".xml.bz2")) == [f"{d}/a.xml", f"{d}/b.xml.bz2", f"{d}/sub/c.xml"]
    assert expand_inputs(f"{d}/*.xml*") == [f"{d}/a.xml", f"{d}/b.xml.bz2"]
    assert expand_inputs(f"{d}/notes.md") == [f"{d}/notes.md"]
    assert expand_inputs("file://" + d + "/a.xml") == ["file://" + d + "/a.xml"]
    with pytest.raises(FileNotFoundError, match="nothing"):
        expand_inputs(str(tmp_path / "nothing"))


def test_books_read_title_and_bad_utf8(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "moby.txt").write_bytes("\ufeffMoby Dick\n\nCall me Ishmael.\n".encode())
    (tmp_path / "b" / "plain.txt").write_text("It was a dark night.\nThe end came.\n")
    (tmp_path / "b" / "bad.txt").write_bytes(b"caf\xe9 au lait\n")
    moby = read_book(str(tmp_path / "b" / "moby.txt"))
    assert (moby.name, moby.title) == ("moby", "Moby Dick")
    assert moby.text.startswith("Moby Dick")  # BOM dropped
    assert read_book(str(tmp_path / "b" / "plain.txt")).title == "plain"  # first line is prose
    latin = read_book(str(tmp_path / "b" / "bad.txt"))  # latin-1 is detected, not dropped
    assert (latin.text, latin.encoding) == ("café au lait\n", "cp1252")
    (tmp_path / "b" / "bad.txt").unlink()
    assert [b.name for b in iter_books(str(tmp_path / "b"))] == ["moby", "plain"]
