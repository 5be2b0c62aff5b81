"""Code the config names as ``"package.module:attr"``: a solver, a rollout generator, a
service class. What such a name must look like, and how it is imported, is stated here once
for every section that takes one (a section may also offer builtin short names for some)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def check_choice(key: str, value: str, builtins: Mapping[str, str]) -> None:
    """``ValueError`` unless ``value`` is "" (none), a builtin name or "module:attr"."""
    module, colon, attr = value.partition(":")
    if value and value not in builtins and not (colon and module and attr):
        raise ValueError(f"{key} {value!r} is neither one of {sorted(builtins)} nor "
                         "'module:callable' ('' = none)")


def load(spec: str, builtins: Mapping[str, str] | None = None) -> Any:
    """The object ``spec`` names (a builtin name first resolved through ``builtins``);
    ImportError or AttributeError when it is not there."""
    module_name, _, attr = (builtins or {}).get(spec, spec).partition(":")
    return getattr(importlib.import_module(module_name), attr)
