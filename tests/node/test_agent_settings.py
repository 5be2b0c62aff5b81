"""node.toml's [tools] and [[mcp_servers]] (node/agents/settings.py): shapes and refusals."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from crypto.keys import Identity
from node.agents.settings import builtin_tools, parse_tool_settings
from node.agents.tools import ToolConfigError

PEER = Identity.from_seed(bytes(32)).peer_id


def _parse(text: str) -> Any:
    raw = tomllib.loads(text)
    return parse_tool_settings(raw.get("tools"), raw.get("mcp_servers"))


def test_the_documented_shape(tmp_path: Path) -> None:
    settings = _parse(f'''
[tools]
max_calls = 3
call_timeout_s = 5
[tools.docsearch]
folder = "{tmp_path}"
[tools."files.write_note"]
allow = ["{PEER}"]
[[mcp_servers]]
name = "files"
command = "python3"
args = ["server.py"]
env = {{ NOTES = "/tmp" }}
read_only_tools = ["read_note"]
side_effect_tools = ["write_note"]
''')
    assert settings.limits.max_calls == 3 and settings.limits.call_timeout_s == 5.0
    assert settings.policy.allow == {"files.write_note": frozenset({PEER})}
    server = settings.mcp_servers[0]
    assert (server.name, server.command, server.args) == ("files", "python3", ("server.py",))
    assert server.env == {"NOTES": "/tmp"} and server.read_only_tools == {"read_note"}
    assert sorted(builtin_tools(settings)) == ["calculator", "docsearch"]


def test_defaults_allow_nobody() -> None:
    settings = _parse("")
    assert settings.policy.allow == {} and settings.mcp_servers == ()
    assert sorted(builtin_tools(settings)) == ["calculator"]


@pytest.mark.parametrize("text, match", [
    ("[tools]\nmax_cals = 3", "unknown key"),
    ("[tools]\nmax_calls = true", "must be an integer"),
    ("[tools]\nmax_calls = 1000", "outside"),
    ('[tools.calculator]\nallow = ["*"]', "no wildcard"),
    ('[tools.calculator]\nallow = "everyone"', "list of strings"),
    ('[tools.calculator]\nfolder = "/"', "unknown key 'folder'"),
    ('[tools.docsearch]\nfolder = "/nonexistent/docs"', "tools.docsearch.folder"),
    ('[[mcp_servers]]\nname = "x"', "command must be"),
    ('[[mcp_servers]]\nname = "a.b"\ncommand = "c"', "name must be"),
    ('[[mcp_servers]]\nname = "x"\ncommand = "c"\nshell = true', "unknown key"),
    ('[[mcp_servers]]\nname = "x"\ncommand = "c"\nenv = { A = 1 }', "env must be"),
    ('[[mcp_servers]]\nname = "x"\ncommand = "c"\n[[mcp_servers]]\nname = "x"\ncommand = "d"',
     "unique"),
    ('[[mcp_servers]]\nname = "calculator"\ncommand = "c"', "built-in"),
])
def test_refused(text: str, match: str) -> None:
    with pytest.raises(ToolConfigError, match=match):
        builtin_tools(_parse(text))
