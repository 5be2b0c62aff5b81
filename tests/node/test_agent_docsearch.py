"""The docsearch tool: ranked passages from the operator's folder, nothing outside it
(node/agents/docsearch.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from node.agents.docsearch import MAX_FILE_BYTES, DocSearch
from node.agents.tools import ToolLimits, ToolPolicy, ToolRefused, ToolRegistry, ToolSession


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    docs, secret = tmp_path / "docs", tmp_path / "secret"
    (docs / "guide").mkdir(parents=True)
    secret.mkdir()
    (docs / "relay.md").write_text("# Relay\nThe weight relay forwards chunks to peers.\n")
    (docs / "guide" / "voting.txt").write_text(
        "CoT voting combines answers by reputation-weighted voting. Voting voting.\n")
    (docs / "notes.py").write_text("voting in a python file is never read\n")
    (secret / "keys.txt").write_text("voting secret private key material\n")
    return docs, secret


def _search(tool: DocSearch, **arguments: object) -> str:
    session = ToolSession(ToolRegistry([tool]), ToolPolicy(), ToolLimits(), "12D3KooWAnyone")
    return trio.run(session.call, "docsearch", arguments)


def test_ranked_passages(folders: tuple[Path, Path]) -> None:
    tool = DocSearch(folders[0])
    out = _search(tool, query="reputation voting")
    assert out.splitlines()[0].startswith("guide/voting.txt: CoT voting combines")
    assert "python" not in out
    assert _search(tool, query="relay chunks", top_k=1) == \
        "relay.md: Relay The weight relay forwards chunks to peers."
    assert _search(tool, query="nothing here matches") == "no passage matches the query"


def test_symlinks_out_of_the_folder_are_never_read(folders: tuple[Path, Path]) -> None:
    docs, secret = folders
    (docs / "leak.txt").symlink_to(secret / "keys.txt")
    (docs / "leakdir").symlink_to(secret, target_is_directory=True)
    (docs / "inside.md").symlink_to(docs / "relay.md")
    out = _search(DocSearch(docs), query="secret private key voting", top_k=10)
    assert "secret" not in out and "private" not in out
    assert "relay.md" not in _search(DocSearch(docs), query="secret")


@pytest.mark.parametrize("subfolder", ["..", "../secret", "guide/../../secret", "/etc",
                                       "leakdir", "nope", "guide/../.."])
def test_subfolder_escapes_are_refused(folders: tuple[Path, Path], subfolder: str) -> None:
    docs, secret = folders
    (docs / "leakdir").symlink_to(secret, target_is_directory=True)
    with pytest.raises(ToolRefused, match="subfolder"):
        _search(DocSearch(docs), query="voting", subfolder=subfolder)


def test_subfolder_inside_is_searched(folders: tuple[Path, Path]) -> None:
    out = _search(DocSearch(folders[0]), query="relay voting", subfolder="guide")
    assert out.startswith("guide/voting.txt") and "relay.md" not in out


def test_a_fifo_is_skipped_and_files_are_read_only_up_to_the_bound(
        folders: tuple[Path, Path]) -> None:
    docs = folders[0]
    os.mkfifo(docs / "pipe.txt")  # opening it for reading would block a careless reader
    (docs / "big.txt").write_text("filler " * (MAX_FILE_BYTES // 7) + "needle\n")
    out = _search(DocSearch(docs), query="needle")
    assert out == "no passage matches the query"


def test_top_k_is_bounded(folders: tuple[Path, Path]) -> None:
    with pytest.raises(ToolRefused, match="top_k"):
        _search(DocSearch(folders[0]), query="voting", top_k=1000)


def test_changed_files_are_read_again(folders: tuple[Path, Path]) -> None:
    docs = folders[0]
    tool = DocSearch(docs)
    assert _search(tool, query="zebra") == "no passage matches the query"
    (docs / "relay.md").write_text("a zebra appears\n")
    assert _search(tool, query="zebra") == "relay.md: a zebra appears"
