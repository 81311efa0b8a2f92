"""Download a Wikipedia ``pages-articles`` dump, resuming and verified against its checksums.

``fetch_wiki("en", "20261101", "/data/raw/wiki")`` reads the dump's published checksum file
(``enwiki-20261101-sha1sums.txt``, else ``-md5sums.txt``) from
``{base_url}/{lang}wiki/{date}/``, picks the ``pages-articles`` files it lists (the multistream
dump and its index by default, split parts when there is no single file), and downloads each.

Design choices:
1. The checksum file is the list of what exists: no HTML directory scraping, and every file is
   checked against the digest Wikimedia published for it.
2. A download goes to ``<name>.part`` and resumes with an HTTP ``Range`` request from the bytes
   already there (a server that answers 200 instead of 206 restarts it); the file gets its final
   name only once its digest matches, so a finished name is always a whole, verified file.
3. A file whose digest does not match is deleted and fetched again from scratch, up to
   ``attempts`` times, then refused with :class:`FetchError`; a file already present with the
   right digest is not fetched again.
4. ``out_url`` may be any fsspec URL: downloads are staged in a local folder and copied when the
   destination is remote (object stores cannot append).
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import fsspec

__all__ = ["fetch_wiki", "FetchError", "select_dump_files", "parse_checksums"]

log = logging.getLogger("bertflow.fetch")

DEFAULT_BASE_URL = "https://dumps.wikimedia.org"
_BLOCK = 1 << 20


class FetchError(RuntimeError):
    """A dump file could not be fetched or verified; the message names it."""


def parse_checksums(text: str) -> dict[str, str]:
    """{file name: hex digest} from a ``sha1sums``/``md5sums`` file (``<hex>  <name>`` lines)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and re.fullmatch(r"[0-9a-fA-F]{32,64}", parts[0]):
            out[parts[1].lstrip("*")] = parts[0].lower()
    return out


def select_dump_files(names: list[str], lang: str, date: str, multistream: bool = True) -> list[str]:
    """The ``pages-articles`` files to fetch among the names a checksum file lists: the single
    (multistream) dump and its index when listed, else its split parts; sorted."""
    prefix = re.escape(f"{lang}wiki-{date}-pages-articles")
    if multistream:
        dump = re.compile(prefix + r"-multistream(\d*)\.xml(-p\d+p\d+)?\.bz2$")
        index = re.compile(prefix + r"-multistream-index(\d*)\.txt(-p\d+p\d+)?\.bz2$")
    else:
        dump = re.compile(prefix + r"(\d*)\.xml(-p\d+p\d+)?\.bz2$")
        index = None
    dumps = [n for n in names if dump.match(n)]
    single = [n for n in dumps if not dump.match(n).group(1) and not dump.match(n).group(2)]
    chosen = single or dumps
    if index is not None:
        wanted = {(dump.match(n).group(1), dump.match(n).group(2)) for n in chosen}
        chosen += [n for n in names if index.match(n) and (index.match(n).group(1), index.match(n).group(2)) in wanted]
    return sorted(chosen)


def _digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def _get(url: str, timeout: float, start: int = 0):
    req = urllib.request.Request(url, headers={"User-Agent": "bertflow-fetch/1"})
    if start:
        req.add_header("Range", f"bytes={start}-")
    return urllib.request.urlopen(req, timeout=timeout)


def _download(url: str, part: Path, timeout: float) -> None:
    """Fetch ``url`` into ``part``, resuming from its current size; raises on a dropped
    connection (the bytes so far stay for the next try)."""
    have = part.stat().st_size if part.exists() else 0
    try:
        resp = _get(url, timeout, have)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to fetch: the part is whole (or wrong)
            return
        raise
    with resp:
        if have and resp.status != 206:  # no range support: start again
            have = 0
        with open(part, "ab" if have else "wb") as f:
            while True:
                block = resp.read(_BLOCK)
                if not block:
                    break
                f.write(block)
        expected = resp.headers.get("Content-Length")
    if expected is not None and part.stat().st_size < have + int(expected):
        raise OSError(f"{url}: connection closed after {part.stat().st_size} bytes")


def _fetch_one(url: str, dest: Path, digest: str, algo: str, attempts: int, timeout: float) -> None:
    part = dest.with_name(dest.name + ".part")
    for attempt in range(1, attempts + 1):
        tries = 0
        while True:  # resume after dropped connections
            try:
                _download(url, part, timeout)
                break
            except (OSError, urllib.error.URLError, http.client.HTTPException) as exc:
                tries += 1
                if tries >= attempts * 3:
                    raise FetchError(f"{url}: download failed {tries} times: {exc}") from exc
                log.warning(
                    "fetch: %s interrupted (%s); resuming at byte %d",
                    url,
                    exc,
                    part.stat().st_size if part.exists() else 0,
                )
                time.sleep(min(2**tries * 0.1, 5))
        got = _digest(part, algo)
        if got == digest:
            os.replace(part, dest)
            return
        log.warning(
            "fetch: %s has %s %s, expected %s (attempt %d of %d); fetching it again",
            url,
            algo,
            got,
            digest,
            attempt,
            attempts,
        )
        part.unlink()
    raise FetchError(f"{url}: {algo} does not match the published checksum after {attempts} attempts; refused")


def fetch_wiki(
    lang: str,
    date: str,
    out_url: str,
    base_url: str = DEFAULT_BASE_URL,
    multistream: bool = True,
    attempts: int = 3,
    timeout: float = 60.0,
    staging_dir: str | None = None,
) -> list[str]:
    """Download the ``pages-articles`` files of ``{lang}wiki`` dump ``date`` into ``out_url``
    (resuming, checksum-verified; see the module docstring). Returns the URLs of the files,
    dumps and indexes, sorted. Raises FetchError when the checksum file is missing or lists no
    such file, or a file stays corrupt."""
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", lang) or not re.fullmatch(r"\d{8}|latest", date):
        raise FetchError(f"fetch_wiki: bad lang {lang!r} or date {date!r} (want e.g. 'en', '20261101')")
    folder = f"{base_url.rstrip('/')}/{lang}wiki/{date}"
    sums, algo = None, None
    for algo in ("sha1", "md5"):
        name = f"{lang}wiki-{date}-{algo}sums.txt"
        try:
            with _get(f"{folder}/{name}", timeout) as resp:
                sums = parse_checksums(resp.read().decode("utf-8", "replace"))
            break
        except (urllib.error.HTTPError, urllib.error.URLError, OSError) as exc:
            log.info("fetch: no %s (%s)", name, exc)
    if not sums:
        raise FetchError(f"fetch_wiki: no sha1sums or md5sums file under {folder}")
    names = select_dump_files(sorted(sums), lang, date, multistream)
    if not names:
        raise FetchError(f"fetch_wiki: {folder} lists no pages-articles files in its {algo}sums")

    fs, out_path = fsspec.core.url_to_fs(out_url)
    local = fs.protocol in ("file", "local") or "file" in fs.protocol
    stage = Path(out_path) if local else Path(staging_dir or tempfile.gettempdir()) / "bertflow-fetch"
    stage.mkdir(parents=True, exist_ok=True)
    urls = []
    for name in names:
        dest = stage / name
        if dest.exists() and _digest(dest, algo) == sums[name]:
            log.info("fetch: %s already present and verified", name)
        else:
            log.info("fetch: %s/%s -> %s", folder, name, dest)
            _fetch_one(f"{folder}/{name}", dest, sums[name], algo, attempts, timeout)
        target = f"{out_url.rstrip('/')}/{name}"
        if not local:
            fs.put(str(dest), f"{out_path.rstrip('/')}/{name}")
        urls.append(target)
    return urls
