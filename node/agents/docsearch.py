"""The built-in ``docsearch`` tool: read-only search over one folder of documents the operator
names (``[tools.docsearch] folder``).

Contract:
* Only regular ``.txt`` and ``.md`` files whose real path (symlinks resolved) lies inside the
  folder's real path are read; a symlink that leads out, a FIFO, a device are skipped. The
  optional ``subfolder`` argument narrows the search and is refused when it is absolute,
  contains ``..``, or resolves outside the folder.
* Bounded: at most ``MAX_FILES`` files are looked at, ``MAX_FILE_BYTES`` read of each,
  ``MAX_TOTAL_BYTES`` in all; a file is read again only when its size or mtime changed.
* Ranking is BM25 (k1 = 1.5, b = 0.75) of the query's words over passages of
  ``PASSAGE_WORDS`` words; the answer lists the top passages as ``path: snippet``.
* The reading runs in a worker thread, so the event loop never waits on the disk.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import trio

from node.agents.tools import ToolFailed, ToolRefused, ToolSpec

SUFFIXES = (".txt", ".md")
MAX_FILES = 500
MAX_FILE_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 16 * 1024 * 1024
MAX_QUERY_CHARS = 500
PASSAGE_WORDS = 60
DEFAULT_TOP_K = 3
MAX_TOP_K = 10
SNIPPET_CHARS = 400
BM25_K1 = 1.5
BM25_B = 0.75
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class Passage:
    path: str  # relative to the folder, with "/"
    text: str
    terms: Counter[str]
    length: int


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _passages(rel: str, text: str) -> list[Passage]:
    tokens = list(_WORD.finditer(text))
    found = []
    for start in range(0, len(tokens), PASSAGE_WORDS):
        chunk = tokens[start:start + PASSAGE_WORDS]
        end = tokens[start + PASSAGE_WORDS].start() if start + PASSAGE_WORDS < len(tokens) \
            else len(text)
        snippet = " ".join(text[chunk[0].start():end].split())
        terms = Counter(m.group().lower() for m in chunk)
        found.append(Passage(rel, snippet, terms, len(chunk)))
    return found


def rank(passages: list[Passage], query: str, top_k: int) -> list[tuple[float, Passage]]:
    """The ``top_k`` passages by BM25 score of ``query``'s words, best first; ties by path."""
    terms = set(words(query))
    if not passages or not terms:
        return []
    n = len(passages)
    average = sum(p.length for p in passages) / n
    df = {t: sum(1 for p in passages if t in p.terms) for t in terms}
    scored = []
    for p in passages:
        score = 0.0
        for t in terms:
            tf = p.terms.get(t, 0)
            if tf:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                norm = tf + BM25_K1 * (1 - BM25_B + BM25_B * p.length / average)
                score += idf * tf * (BM25_K1 + 1) / norm
        if score > 0:
            scored.append((score, p))
    scored.sort(key=lambda sp: (-sp[0], sp[1].path))
    return scored[:top_k]


class DocSearch:
    """The ``docsearch`` tool over ``folder`` (read-only)."""

    spec = ToolSpec(
        name="docsearch",
        description="Search the operator's documents; answers the best matching passages.",
        parameters={"type": "object",
                    "properties": {"query": {"type": "string", "maxLength": MAX_QUERY_CHARS},
                                   "top_k": {"type": "integer"},
                                   "subfolder": {"type": "string", "maxLength": 200}},
                    "required": ["query"], "additionalProperties": False},
        side_effects=False,
    )

    def __init__(self, folder: Path) -> None:
        self.root = Path(folder).expanduser().resolve(strict=True)
        if not self.root.is_dir():
            raise ValueError(f"docsearch folder {folder} is not a directory")
        #: rel path -> ((size, mtime_ns), passages)
        self._cache: dict[str, tuple[tuple[int, int], list[Passage]]] = {}

    async def prepare(self) -> None:
        return None

    async def run(self, arguments: dict[str, Any]) -> str:
        query = arguments["query"]
        top_k = arguments.get("top_k", DEFAULT_TOP_K)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
            raise ToolRefused(f"docsearch: top_k must be an integer in [1, {MAX_TOP_K}]")
        base = self.scope(arguments.get("subfolder", ""))
        return await trio.to_thread.run_sync(self.search, base, query, top_k,
                                             abandon_on_cancel=True)

    def scope(self, subfolder: object) -> Path:
        """The folder to search: the root, or a subfolder of it; refuses any escape."""
        if not isinstance(subfolder, str):
            raise ToolRefused("docsearch: subfolder must be a string")
        if not subfolder:
            return self.root
        parts = PurePosixPath(subfolder.replace("\\", "/"))
        if parts.is_absolute() or ".." in parts.parts or "\0" in subfolder:
            raise ToolRefused(f"docsearch: subfolder {subfolder!r} must be a relative path "
                              "inside the documents folder")
        target = (self.root / parts).resolve()
        if not target.is_relative_to(self.root) or not target.is_dir():
            raise ToolRefused(f"docsearch: subfolder {subfolder!r} is not a folder inside the "
                              "documents folder")
        return target

    def search(self, base: Path, query: str, top_k: int) -> str:
        hits = rank(self._load(base), query, top_k)
        if not hits:
            return "no passage matches the query"
        return "\n".join(f"{p.path}: {p.text[:SNIPPET_CHARS]}" for _, p in hits)

    def _load(self, base: Path) -> list[Passage]:
        passages: list[Passage] = []
        files = total = 0
        for directory, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SUFFIXES):
                    continue
                files += 1
                if files > MAX_FILES or total >= MAX_TOTAL_BYTES:
                    return passages
                loaded = self._file(Path(directory) / name, MAX_TOTAL_BYTES - total)
                if loaded is not None:
                    total += loaded[0]
                    passages.extend(loaded[1])
        return passages

    def _file(self, path: Path, budget: int) -> tuple[int, list[Passage]] | None:
        """(bytes read, passages) of one file, or None when it is not ours to read."""
        real = path.resolve()
        if not real.is_relative_to(self.root):
            return None  # a symlink that leads out of the folder
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None
            rel = real.relative_to(self.root).as_posix()
            key = (info.st_size, info.st_mtime_ns)
            cached = self._cache.get(rel)
            if cached is not None and cached[0] == key:
                return min(info.st_size, MAX_FILE_BYTES), cached[1]
            try:
                data = fh.read(min(MAX_FILE_BYTES, budget))
            except OSError as exc:
                raise ToolFailed(f"docsearch: cannot read {rel}: {exc.strerror}") from None
        found = _passages(rel, data.decode("utf-8", errors="replace"))
        if len(self._cache) >= 2 * MAX_FILES:
            self._cache.clear()  # files come and go; the cache never outgrows its bound
        self._cache[rel] = (key, found)
        return len(data), found
