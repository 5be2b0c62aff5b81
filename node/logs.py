"""Structured logging for the daemon (structlog), configured once per process.

Every line is an event name plus key-value fields, written to stderr: the human console format
by default, one JSON object per line with ``--json-logs`` (what tests and log shippers read).
The daemon binds ``peer_id`` on its logger; protocol/ never logs: its ``Emit`` effects become
log lines through :func:`log_emit`. The standard library's ``logging`` (py-libp2p, hypercorn)
is routed to the same stream at the same level, so nothing prints in another format.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}
#: chatty third-party loggers that stay at warning unless the node logs at debug
_QUIET = ("libp2p", "multiaddr", "hypercorn.access", "hypercorn.error", "async_service")


def configure_logging(level: str = "info", *, json_logs: bool = False,
                      stream: TextIO | None = None) -> None:
    """Set up structlog and stdlib logging for this process (idempotent)."""
    stream = sys.stderr if stream is None else stream
    numeric = _LEVELS[level.lower()]
    renderer: Any = (
        structlog.processors.JSONRenderer(default=_jsonable)
        if json_logs
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info if json_logs else _noop,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(
        '{"event": "stdlib", "logger": "%(name)s", "level": "%(levelname)s", '
        '"message": %(message)r}' if json_logs else "%(levelname)s %(name)s: %(message)s"
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))


def _noop(logger: Any, method: str, event_dict: Any) -> Any:
    return event_dict


def _jsonable(value: object) -> object:
    if isinstance(value, bytes):
        return value.hex()
    return repr(value)


def get_logger(**bound: Any) -> Any:
    """A structlog logger with ``bound`` fields (e.g. ``peer_id=...``) on every line."""
    return structlog.get_logger("symphony").bind(**bound)


def log_emit(log: Any, service: str, event: str, fields: Mapping[str, object]) -> None:
    """Log a machine's ``Emit``: the event name is ``<service>.<event>``; warnings stand out.

    An ``Emit`` whose fields carry ``level="warning"`` (or error/debug) is logged at that level.
    """
    data = {k: _plain(v) for k, v in fields.items()}
    level = str(data.pop("level", "info"))
    method = getattr(log, level if level in _LEVELS else "info")
    method(f"{service}.{event}", **data)


def _plain(value: object) -> object:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
