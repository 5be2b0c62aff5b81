"""Structured logging for the daemon (structlog), configured once per process.

Every line is an event name plus key-value fields, written to stderr: the human console format
by default, one JSON object per line with ``--json-logs`` (what tests and log shippers read).
The daemon binds ``peer_id`` on its logger; protocol/ never logs: its ``Emit`` effects become
log lines through :func:`log_emit`. The standard library's ``logging`` (py-libp2p, hypercorn)
is routed to the same stream at the same level, so nothing prints in another format.

Logs a peer can provoke cannot be used to fill the disk: :class:`RepeatLog` logs the first
occurrence of a (peer, fault kind) and then at most one summary line per interval with the
count; first occurrences, across all keys, pass at most ``MAX_FIRST_LINES`` times per interval
(an attacker that makes up keys, fresh peer ids say, gets no more: the rest are counted, and
the next line that passes says how many were left out); and :class:`RepeatFilter` does the same for third-party loggers (py-libp2p logs a line
per bad frame), keyed by the line of code that logs, with their tracebacks dropped: a peer's
bytes never produce a traceback, only our own bugs do. (py-libp2p detaches its own logger
from the root at import; node/p2p reattaches it, see ``route_library_logs``.)
"""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}
#: chatty third-party loggers that stay at warning unless the node logs at debug
_QUIET = ("libp2p", "multiaddr", "hypercorn.access", "hypercorn.error", "async_service")
#: third-party loggers whose lines a peer's bytes can provoke (RepeatFilter applies to them)
_PEER_FED = ("libp2p", "multiaddr", "async_service")
#: a repeated line is summarized at most this often
REPEAT_INTERVAL_MS = 60_000
#: distinct keys remembered; the least recently seen is forgotten beyond it
MAX_REPEAT_KEYS = 4096
#: first occurrences (of all keys together) that pass per interval; the rest are counted
MAX_FIRST_LINES = 128


class RepeatRule:
    """The repeat rule of :class:`RepeatLog` and :class:`RepeatFilter`: the first occurrence of
    a key passes; later ones are counted, and the first one at least ``interval`` after the
    last that passed passes again as the summary of those counted. At most ``max_keys`` keys
    are remembered; beyond it the least recently seen is forgotten (it passes again). At most
    ``max_first`` first occurrences pass per interval (all keys together, the interval
    starting at the first of them); one beyond is suppressed, its key not remembered, and
    counted until :meth:`take_dropped`."""

    def __init__(self, interval: float, max_keys: int = MAX_REPEAT_KEYS,
                 max_first: int = MAX_FIRST_LINES) -> None:
        self._interval = interval
        self._max_keys = max_keys
        self._max_first = max_first
        #: key -> [last passed at, occurrences not passed since]
        self._seen: OrderedDict[Hashable, list[float]] = OrderedDict()
        #: when the current interval of first occurrences began, how many passed in it
        self._window: tuple[float, int] | None = None
        self._dropped = 0

    def check(self, key: Hashable, now: float) -> tuple[int, float] | None:
        """None: suppress this occurrence; ``(0, 0)``: the first, pass it; else
        ``(repeats, since)``: pass it as a summary of ``repeats`` suppressed over ``since``."""
        entry = self._seen.get(key)
        if entry is None:
            if self._window is None or now - self._window[0] >= self._interval:
                self._window = (now, 0)
            if self._window[1] >= self._max_first:
                self._dropped += 1
                return None
            self._window = (self._window[0], self._window[1] + 1)
            if len(self._seen) >= self._max_keys:
                self._seen.popitem(last=False)
            self._seen[key] = [now, 0]
            return 0, 0
        self._seen.move_to_end(key)
        entry[1] += 1
        since = now - entry[0]
        if since < self._interval:
            return None
        repeats = int(entry[1])
        entry[0], entry[1] = now, 0
        return repeats, since

    def take_dropped(self) -> int:
        """First occurrences suppressed by the cap since the last call."""
        dropped, self._dropped = self._dropped, 0
        return dropped


class RepeatLog:
    """First occurrence of each key logged, later ones counted and summarized once per interval.

    ``note(key, now_ms, event, **fields)`` logs ``event`` at warning level the first time
    ``key`` is seen (an ``exc_info`` field makes it an error with its traceback); after that
    it counts, and the first note at least ``interval_ms`` after the last line logs
    ``<event>.repeated`` with ``repeats`` (how many were not logged) and the latest fields.
    """

    def __init__(self, log: Any, *, interval_ms: int = REPEAT_INTERVAL_MS,
                 max_keys: int = MAX_REPEAT_KEYS, max_first: int = MAX_FIRST_LINES) -> None:
        self._log = log
        self._rule = RepeatRule(interval_ms, max_keys, max_first)
        #: lines not written because they repeated (all keys)
        self.suppressed = 0

    def note(self, key: Hashable, now_ms: int, event: str, **fields: Any) -> None:
        passed = self._rule.check(key, now_ms)
        if passed is None:
            self.suppressed += 1
            return
        repeats, since_ms = passed
        if repeats:
            fields.pop("exc_info", None)  # a summary carries no traceback
            event, fields = f"{event}.repeated", {**fields, "repeats": repeats,
                                                  "over_s": round(since_ms / 1000, 1)}
        dropped = self._rule.take_dropped()
        if dropped:  # first lines of other keys the cap left out
            fields = {**fields, "new_keys_suppressed": dropped}
        method = self._log.error if "exc_info" in fields else self._log.warning
        method(event, **fields)


class RepeatFilter(logging.Filter):
    """RepeatLog's rule for stdlib records: first of each (logger, template) passes, then one
    summary per interval; tracebacks dropped (third-party code logs them for peers' bytes)."""

    def __init__(self, interval_s: float = REPEAT_INTERVAL_MS / 1000,
                 max_first: int = MAX_FIRST_LINES) -> None:
        super().__init__()
        self._rule = RepeatRule(interval_s, max_first=max_first)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(_PEER_FED):
            return True
        record.exc_info = None
        record.exc_text = None
        # the call site is the key: its text may vary per peer
        passed = self._rule.check((record.pathname, record.lineno), time.monotonic())
        if passed is None:
            return False
        repeats, since_s = passed
        if repeats:
            record.msg = f"{record.msg} [repeated {repeats} times in {since_s:.0f} s]"
        dropped = self._rule.take_dropped()
        if dropped:
            record.msg = f"{record.msg} [{dropped} other lines suppressed]"
        return True


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
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))


def route_library_logs(name: str) -> None:
    """Send logger ``name``'s records to our handler (and its RepeatFilter) again.

    py-libp2p 0.8.1 sets its ``libp2p`` logger's ``propagate`` to False at import when
    ``LIBP2P_DEBUG`` is unset, so its warnings and errors reached stderr through logging's
    last-resort handler: unformatted, multi-line, and not rate-limited."""
    logger = logging.getLogger(name)
    logger.propagate = True
    logger.handlers.clear()


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
