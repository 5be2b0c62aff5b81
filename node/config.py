"""The daemon's configuration: one frozen ``Config`` built from four layers.

Precedence, highest first: command-line flag > ``SYMPHONY_*`` environment variable > TOML file
(``--config PATH``, else ``<data_dir>/node.toml``) > the defaults below. The CLI only parses
and calls :func:`load_config`; nothing else reads the environment or the file.

Keys
----
Top-level keys are the fields of :class:`Config` (except ``sections``). A service adds its own
section by declaring a frozen dataclass of defaults (``Service.config_section``); the section
is read from the TOML table ``[name]`` and from ``SYMPHONY_<NAME>__<KEY>`` variables, and
reaches the service as ``ctx.config.section(name)`` (an instance of that dataclass).

A section that tunes a protocol machine takes its keys from the protocol config
(node/sections.py).

Errors
------
An unknown key, top level or in a section, is a :class:`ConfigError` naming the key and its
source; so is a value of the wrong type or out of range (naming key and value). ``SYMPHONY_*``
variables that name no key are ignored (other tools share the prefix), nothing else unknown is.

Value types understood in files, env and flags: ``str``, ``int``, ``float``, ``bool``,
``Path``, ``tuple[str, ...]`` (env: comma-separated). A bool is never accepted as an int.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.agents.config import AGENTS_KEY, AgentSpec, parse_agents
from node.agents.settings import ToolSettings, check_agent_tools, parse_tool_settings
from node.p2p import multiaddrs
from node.p2p.link import parse_link
from protocol.inference.routing import parse_serve_blocks
from protocol.names import check_network_id

ENV_PREFIX = "SYMPHONY_"
CONFIG_FILE_NAME = "node.toml"
DEFAULT_DATA_DIR = Path("~/.symphony")
DEFAULT_LISTEN = ("/ip4/0.0.0.0/tcp/4001",)
DEFAULT_NETWORK_ID = "symphony-main"
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_TARGET_PEERS = 1000
TOOL_KEYS = ("tools", "mcp_servers")  # TOML tables read by node/agents/settings.py
NOT_KEYS = ("sections", AGENTS_KEY, "tools")  # Config fields that are no key of flags/env/TOML


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names the key, value and source."""


@dataclass(frozen=True)
class Config:
    #: data directory: key, node.toml, SQLite DB, api.token, daemon.json, chunk store
    data_dir: Path = DEFAULT_DATA_DIR
    #: multiaddrs to listen on (``/tcp/0`` picks a free port)
    listen: tuple[str, ...] = DEFAULT_LISTEN
    #: multiaddrs ending in /p2p/<peer id> to dial at start
    bootstrap: tuple[str, ...] = ()
    #: nodes only talk to nodes with the same network id (it is part of every protocol id)
    network_id: str = DEFAULT_NETWORK_ID
    #: connections the node keeps, dialing peers it learned of when below it
    target_peers: int = 8
    #: local HTTP API port on 127.0.0.1; 0 picks a free port (clients read daemon.json)
    api_port: int = 0
    log_level: str = "info"
    #: one JSON object per log line instead of the human console format
    json_logs: bool = False
    #: "module:Class" services loaded after the registry (node/daemon.py SERVICES): for tests
    #: and experiments, e.g. a gossip load generator; they cannot declare a config section
    extra_services: tuple[str, ...] = ()
    #: serve a range of the inference model's blocks to chains: "" (off), "auto" (the range
    #: the network covers worst, moving with coverage) or "A:B" (blocks A..B-1); see
    #: node/inference/service.py and the [inference] section
    serve_blocks: str = ""
    #: shape every connection as this link, e.g. "rtt=60ms,up=20mbit" (node/p2p/link.py)
    link: str = ""
    agents: tuple[AgentSpec, ...] = ()  #: ``[[agents]]`` as declared (node/agents/config.py)
    tools: ToolSettings = ToolSettings()  #: ``[tools]``, ``[[mcp_servers]]`` (agents/settings.py)
    #: service name -> its section dataclass instance (see module docstring)
    sections: Mapping[str, Any] = field(default_factory=dict)

    def section(self, name: str) -> Any:
        try:
            return self.sections[name]
        except KeyError:
            raise KeyError(f"no config section {name!r}; known: {sorted(self.sections)}") from None

    @property
    def key_path(self) -> Path:
        return self.data_dir / "node.key"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "node.db"

    @property
    def config_path(self) -> Path:
        return self.data_dir / CONFIG_FILE_NAME


TOP_LEVEL_KEYS = tuple(f.name for f in dataclasses.fields(Config) if f.name not in NOT_KEYS)


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$SYMPHONY_DATA_DIR`` if set, else ``~/.symphony``, expanded."""
    env = os.environ if env is None else env
    raw = env.get(ENV_PREFIX + "DATA_DIR")
    return Path(raw).expanduser() if raw else DEFAULT_DATA_DIR.expanduser()


def load_config(
    flags: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    sections: Mapping[str, type] | None = None,
    profile: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Merge flags > env > TOML > profile > defaults into a validated Config.

    ``flags`` holds only the options given on the command line (None values are ignored);
    ``sections`` maps section names to their dataclass of defaults. ``config_file`` given
    explicitly must exist; otherwise ``<data_dir>/node.toml`` is read when present.
    ``profile`` (section -> key -> value) replaces section defaults for one kind of daemon
    (node/daemon.py LIGHT_PROFILE); the file and the environment still win over it.
    """
    env = os.environ if env is None else env
    flags = {k: v for k, v in (flags or {}).items() if v is not None and v != ()}
    sections = dict(sections or {})
    _check_sections(sections)
    unknown_flags = set(flags) - set(TOP_LEVEL_KEYS)
    if unknown_flags:
        raise ConfigError(f"unknown flag key(s) {sorted(unknown_flags)}")

    env_top, env_sections = _read_env(env, sections)
    # The data dir decides where the TOML file is, so resolve it first (flag > env > default).
    data_dir = _data_dir(flags, env_top)
    file_path = _config_file(config_file, data_dir)
    file_top, file_sections = _read_toml(file_path, sections) if file_path else ({}, {})

    values = _top_level_values(flags, env_top, file_top, str(file_path))
    values["data_dir"] = Path(values.get("data_dir", data_dir)).expanduser()
    profiled = {name: {k: (v, "profile") for k, v in keys.items()}
                for name, keys in (profile or {}).items()}
    for name, keys in profiled.items():
        known = {f.name for f in dataclasses.fields(sections[name])} if name in sections else ()
        if not known or set(keys) - set(known):
            raise ConfigError(f"profile: unknown section or key in [{name}] {sorted(keys)}")
    built = {name: _build_section(name, cls, {**profiled.get(name, {}),
                                              **file_sections.get(name, {}),
                                              **env_sections.get(name, {})})
             for name, cls in sections.items()}
    config = Config(**values, agents=file_top.get(AGENTS_KEY, ()),
                    tools=file_top.get("tools", ToolSettings()), sections=built)
    _validate(config)
    check_agent_tools(config.agents, config.tools, error=ConfigError)
    return config


def _check_sections(sections: Mapping[str, type]) -> None:
    for name, cls in sections.items():
        if name in TOP_LEVEL_KEYS or not dataclasses.is_dataclass(cls):
            raise ConfigError(f"section {name!r} must be a dataclass whose name is not a key")


def _data_dir(flags: Mapping[str, Any], env_top: Mapping[str, str]) -> Path:
    if "data_dir" in flags:
        data_dir = _coerce("data_dir", Path, flags["data_dir"], "flag")
    elif "data_dir" in env_top:
        data_dir = _coerce("data_dir", Path, env_top["data_dir"], "env SYMPHONY_DATA_DIR")
    else:
        data_dir = DEFAULT_DATA_DIR
    return Path(data_dir).expanduser()


def _config_file(config_file: Path | None, data_dir: Path) -> Path | None:
    """The TOML file to read: the one given (it must exist), else ``<data_dir>/node.toml``
    when present."""
    if config_file is not None:
        if not Path(config_file).is_file():
            raise ConfigError(f"config file {config_file} does not exist")
        return Path(config_file)
    default = data_dir / CONFIG_FILE_NAME
    return default if default.is_file() else None


def _top_level_values(flags: Mapping[str, Any], env_top: Mapping[str, str],
                      file_top: Mapping[str, Any], file_source: str) -> dict[str, Any]:
    """Each top-level key given in some layer, from the highest one (flag > env > file)."""
    hints = typing.get_type_hints(Config)
    values: dict[str, Any] = {}
    for key in TOP_LEVEL_KEYS:
        for layer, source in ((flags, "flag"), (env_top, "env"), (file_top, file_source)):
            if key in layer:
                where = f"env {ENV_PREFIX}{key.upper()}" if source == "env" else source
                values[key] = _coerce(key, hints[key], layer[key], where)
                break
    return values


def _build_section(name: str, cls: type, given: Mapping[str, tuple[Any, str]]) -> Any:
    """Section ``name`` from its given keys (key -> (value, source)) over its defaults."""
    hints = typing.get_type_hints(cls)
    kwargs = {k: _coerce(f"{name}.{k}", hints[k], v, src) for k, (v, src) in given.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"section [{name}]: {exc}") from None


def _read_env(
    env: Mapping[str, str], sections: Mapping[str, type]
) -> tuple[dict[str, str], dict[str, dict[str, tuple[str, str]]]]:
    top: dict[str, str] = {}
    per_section: dict[str, dict[str, tuple[str, str]]] = {}
    for var, value in env.items():
        if not var.startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX) :].lower()
        if "__" in rest:
            name, _, key = rest.partition("__")
            cls = sections.get(name)
            if cls is not None:
                if key not in {f.name for f in dataclasses.fields(cls)}:
                    raise ConfigError(f"env {var}: unknown key {key!r} in section [{name}]")
                per_section.setdefault(name, {})[key] = (value, f"env {var}")
        elif rest in TOP_LEVEL_KEYS:
            top[rest] = value
    return top, per_section


def _read_toml(
    path: Path, sections: Mapping[str, type]
) -> tuple[dict[str, Any], dict[str, dict[str, tuple[Any, str]]]]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    top: dict[str, Any] = {}
    per_section: dict[str, dict[str, tuple[Any, str]]] = {}
    for key, value in data.items():
        if key in TOP_LEVEL_KEYS:
            top[key] = value
        elif key == AGENTS_KEY:  # an array of tables, TOML only: node/agents/config.py
            top[key] = parse_agents(value, str(path), error=ConfigError)
        elif key in TOOL_KEYS:  # TOML only: node/agents/settings.py
            top["tools"] = parse_tool_settings(data.get("tools"), data.get("mcp_servers"),
                                               str(path), error=ConfigError)
        elif key in sections:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: [{key}] must be a table, got {value!r}")
            known = {f.name for f in dataclasses.fields(sections[key])}
            for sub, sub_value in value.items():
                if sub not in known:
                    raise ConfigError(f"{path}: unknown key {sub!r} in section [{key}] "
                                      f"(known: {', '.join(sorted(known))})")
                per_section.setdefault(key, {})[sub] = (sub_value, str(path))
        else:
            raise ConfigError(f"{path}: unknown key {key!r} (known keys: "
                              f"{', '.join(TOP_LEVEL_KEYS)}; sections: "
                              f"{', '.join(sorted(sections)) or 'none'})")
    return top, per_section


def _coerce(key: str, tp: Any, value: Any, source: str) -> Any:
    """Turn ``value`` (a TOML value, or a string from env/flags) into ``tp`` or fail naming it."""

    def bad(what: str) -> ConfigError:
        return ConfigError(f"{source}: key {key!r}: {value!r} is not {what}")

    origin = typing.get_origin(tp)
    if origin is tuple:
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings")
        return tuple(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise bad("a boolean (true/false)")
    if tp is int or tp is float:
        what = "an integer" if tp is int else "a number"
        if isinstance(value, bool) or (tp is int and not isinstance(value, int | str)):
            raise bad(what)
        try:
            return tp(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise bad(what) from None
    if tp is Path:
        if not isinstance(value, (str, Path)) or not str(value):
            raise bad("a path")
        return Path(value).expanduser()
    if tp is str:
        if not isinstance(value, str):
            raise bad("a string")
        return value
    raise ConfigError(f"key {key!r}: unsupported config type {tp!r}")


def _validate(config: Config) -> None:
    for key, check in (("network_id", check_network_id), ("link", parse_link),
                       ("serve_blocks", parse_serve_blocks)):
        try:
            check(getattr(config, key))
        except ValueError as exc:
            raise ConfigError(f"key {key!r}: {exc}") from None
    if not 0 <= config.target_peers <= MAX_TARGET_PEERS:
        raise ConfigError(f"key 'target_peers': {config.target_peers!r} is not within "
                          f"0..{MAX_TARGET_PEERS}")
    if not 0 <= config.api_port <= 65535:
        raise ConfigError(f"key 'api_port': {config.api_port!r} is not a port (0..65535)")
    if config.log_level.lower() not in LOG_LEVELS:
        raise ConfigError(f"key 'log_level': {config.log_level!r} is not one of "
                          f"{', '.join(LOG_LEVELS)}")
    if not config.listen:
        raise ConfigError("key 'listen': at least one multiaddr is needed")
    for key, addrs in (("listen", config.listen), ("bootstrap", config.bootstrap)):
        for addr in addrs:
            try:
                last = multiaddrs.parts(addr)[-1][0]
            except multiaddrs.AddrError as exc:
                raise ConfigError(f"key {key!r}: {exc}") from None
            if key == "bootstrap" and last != "p2p":
                raise ConfigError(f"key 'bootstrap': {addr!r} must end in /p2p/<peer id>")


def default_toml(sections: Mapping[str, type] | None = None) -> str:
    """The config file written on first run: every key with its default, commented out."""
    import tomli_w

    defaults = Config()
    table = {k: getattr(defaults, k) for k in TOP_LEVEL_KEYS if k != "data_dir"}
    lines = ["# symphony node configuration. Precedence: flag > SYMPHONY_* env > this file.",
             "# Uncomment a key to change it; an unknown key is an error."]
    lines += ["# " + line for line in tomli_w.dumps(_plain(table)).splitlines()]
    for name, cls in (sections or {}).items():
        lines += ["", f"# [{name}]"]
        sec = {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}
        lines += ["# " + line for line in tomli_w.dumps(_plain(sec)).splitlines()]
    return "\n".join(lines) + "\n"


def _plain(table: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
            for k, v in table.items()}
