"""A bounded stdio transport for MCP clients: runs an MCP server as a child process and carries
newline-delimited JSON-RPC over its stdin and stdout.

Why not ``mcp.client.stdio.stdio_client``: that one reads a whole line into memory however
long it is, and stops a server by closing its stdin and waiting out grace periods. A tool
server here may be hostile or broken, so this transport:

* reads at most ``max_message_bytes`` of one message: a server that writes a longer line is
  killed and the session sees its connection end (a flood costs bounded memory);
* kills the server's whole process group with SIGKILL the moment the transport closes or
  :meth:`StdioTransport.kill` is called (the server runs in a new session, so its children go
  too), then reaps it;
* gives the server only a minimal environment (``PATH``, ``HOME``, ... as the SDK's
  ``get_default_environment``) plus what the operator configured, so the daemon's own
  environment (tokens, keys) does not leak into it; its stderr goes to ``stderr_path`` when
  given, else nowhere.

It runs on any anyio backend: the daemon drives it from trio.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import anyio
import mcp_types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from node.agents.settings import MAX_MESSAGE_BYTES


class ServerFlooded(Exception):
    """The server wrote a message longer than the transport's bound."""


class StdioTransport:
    """An ``mcp.Client`` transport (an async context manager yielding the two streams) that
    owns the server process: ``process`` while open, ``flooded`` once a line was too long."""

    def __init__(self, command: str, args: Sequence[str] = (), *,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None,
                 stderr_path: Path | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.command = command
        self.args = list(args)
        self.env = get_default_environment() | dict(env or {})
        self.cwd = cwd
        self.stderr_path = stderr_path
        self.max_message_bytes = max_message_bytes
        self.process: Process | None = None
        self.flooded = False
        self._cm: contextlib.AbstractAsyncContextManager[Any] | None = None

    async def __aenter__(self) -> tuple[Any, Any]:
        self._cm = self._open()
        streams: tuple[Any, Any] = await self._cm.__aenter__()
        return streams

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        assert self._cm is not None  # only ever after __aenter__, by the async with
        return await self._cm.__aexit__(exc_type, exc, tb)

    def kill(self) -> None:
        """SIGKILL the server's process group now (the reaping happens when the transport
        closes). Safe to call twice or after it exited."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    @contextlib.asynccontextmanager
    async def _open(self) -> AsyncIterator[tuple[Any, Any]]:
        with contextlib.ExitStack() as files:
            stderr: IO[bytes] | int = subprocess.DEVNULL
            if self.stderr_path is not None:
                stderr = files.enter_context(open(self.stderr_path, "ab"))
            self.process = await anyio.open_process(
                [self.command, *self.args], env=self.env, cwd=self.cwd, stderr=stderr,
                start_new_session=True)
        incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._read, self.process, incoming_send)
            tg.start_soon(self._write, self.process, outgoing_receive)
            try:
                yield incoming, outgoing
            finally:
                self.kill()
                with anyio.CancelScope(shield=True):
                    await self.process.wait()
                    for stream in (incoming, outgoing, self.process.stdin, self.process.stdout):
                        with contextlib.suppress(Exception):
                            await stream.aclose()  # type: ignore[union-attr]
                tg.cancel_scope.cancel()

    async def _read(self, process: Process,
                    sink: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        assert process.stdout is not None  # opened with a pipe
        buffer = bytearray()
        async with sink:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                     anyio.EndOfStream, OSError):
                async for chunk in process.stdout:
                    *lines, rest = (buffer + chunk).split(b"\n")
                    buffer = bytearray(rest)
                    if len(buffer) > self.max_message_bytes or \
                            any(len(line) > self.max_message_bytes for line in lines):
                        self.flooded = True
                        self.kill()
                        return
                    for line in lines:
                        if line.strip():
                            await sink.send(_parse(bytes(line)))

    async def _write(self, process: Process,
                     source: MemoryObjectReceiveStream[SessionMessage]) -> None:
        assert process.stdin is not None  # opened with a pipe
        async with source:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                     OSError):
                async for message in source:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")


def _parse(line: bytes) -> SessionMessage | Exception:
    """One JSON-RPC message, or the parse error as a value for the session to report."""
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return exc
    return SessionMessage(message)
