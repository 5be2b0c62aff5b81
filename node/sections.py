"""Config sections that tune a protocol machine: :func:`tuning` derives a section's keys from
the protocol config they feed, :func:`fed_config` builds that config from a section.

A section whose keys feed a protocol config (``LedgerConfig``, ``AuctionConfig``, ...) is
declared with :func:`tuning`: ``@tuning(AuctionConfig, "bid_window_ms", ...)`` names the
protocol fields it exposes as keys, and they take their types and defaults from the protocol
dataclass, so there is one list of them (renaming a protocol field fails at import, naming
it). The class body declares only the node's own keys (``node_fields``); one named like a
field of the protocol config that has a default is refused (one named like a field the node
sets, without a default, is the node's own). The service builds the protocol config with
:func:`fed_config`, which passes every tuned field on; protocol fields a section leaves out
keep the protocol's default. A section that also feeds a second protocol config names those
keys with ``also=feed(Config, ...)`` (a key may be named apart from the field it sets,
``key="field"``) and builds that config with ``fed_config(section, Config)``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Feed:
    """Keys of a section that set fields of a further protocol config (:func:`tuning`'s
    ``also``): ``keys`` maps a key to the field of ``config`` it sets."""

    config: type
    keys: Mapping[str, str]


def feed(config: type, *names: str, **renamed: str) -> Feed:
    """A :class:`Feed` of ``config``'s fields ``names`` (keys named like them) and ``renamed``
    (key = field name)."""
    return Feed(config, {**{name: name for name in names}, **renamed})


def tuning(feeds: type, *names: str, also: Feed | None = None) -> Callable[[type], type]:
    """Make the decorated class a frozen config section with its own fields (the node's, its
    ``node_fields``) followed by the fields ``names`` of the protocol config ``feeds`` and the
    keys of ``also`` (fields of a second protocol config), with their types and defaults taken
    from the protocol configs (see the module docstring)."""
    fed = [Feed(feeds, {name: name for name in names}), *([also] if also else [])]
    keyed: dict[str, tuple[type, dataclasses.Field[Any]]] = {}
    for one in fed:
        theirs = {f.name: f for f in dataclasses.fields(one.config)}
        unknown = [name for name in one.keys.values() if name not in theirs]
        if unknown:
            raise TypeError(f"{one.config.__name__} has no field(s) {unknown}")
        keyed.update({key: (one.config, theirs[name]) for key, name in one.keys.items()})
    # a key named like a tunable protocol field (one with a default) would restate it; one
    # named like a field the node sets (no default) is the node's own
    shadowed = {f.name for one in fed for f in dataclasses.fields(one.config)
                if f.default is not dataclasses.MISSING
                or f.default_factory is not dataclasses.MISSING} | set(keyed)

    def section(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        shadowing = sorted(set(own) & shadowed)
        if shadowing:
            fed_names = " or ".join(one.config.__name__ for one in fed)
            raise TypeError(f"{cls.__name__}: {shadowing} are fields of {fed_names}; "
                            "name them in tuning(...) instead of declaring them")
        types = {key: typing.get_type_hints(config)[f.name] for key, (config, f) in keyed.items()}
        cls.__annotations__ = {**own, **types}
        for key, (config, f) in keyed.items():
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"{config.__name__}.{f.name} has no default: the node sets it")
            setattr(cls, key, dataclasses.field(default=f.default,
                                                default_factory=f.default_factory))
        cls.feeds = feeds  # type: ignore[attr-defined]
        cls.fed_keys = {one.config: dict(one.keys) for one in fed}  # type: ignore[attr-defined]
        cls.node_fields = tuple(own)  # type: ignore[attr-defined]
        return dataclass(frozen=True)(cls)

    return section


def fed_config(section: Any, config: type | None = None, **set_by_node: Any) -> Any:
    """The protocol config ``config`` (default: the one ``section`` feeds first, :func:`tuning`)
    with every field the section's keys set, plus ``set_by_node`` (values the node knows only
    at run time)."""
    config = type(section).feeds if config is None else config
    keys = type(section).fed_keys[config]
    return config(**{name: getattr(section, key) for key, name in keys.items()}, **set_by_node)
