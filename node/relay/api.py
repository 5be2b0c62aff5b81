"""HTTP routes of the relay service, mounted under ``/relay`` by the daemon's API.

``GET /status`` (open); ``POST /publish {path, name, version?, format?, chunk_size?,
recipients?}``, ``POST /fetch {name, signer?}``, ``POST /export {name, version?, out}``,
``POST /limits {upload_limit_bps, upload_bps?}`` (benchmarks), ``POST /pull {model}`` (a model
by name or weights hash from the peers that offer it, node/relay/models.py) (all POSTs need
the API token).
Bodies and answers are JSON; a bad request answers 400 with ``{"error": ...}``, an artifact
not held 404. Paths name files on this machine (the CLI and the daemon share it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from node.api.app import json_object, token_route
from node.relay.chunk_store import ChunkStoreError
from protocol.relay.manifest import ArtifactFormat, Manifest, ManifestError


@dataclass(frozen=True)
class Publication:
    """What to publish: the file ``path`` as ``version`` (None: the next) of artifact ``name``,
    cut in chunks of ``chunk_size`` bytes (None: the section's) for ``recipients`` (None: the
    peers connected now)."""

    path: Path
    name: str
    version: int | None = None
    format: ArtifactFormat = ArtifactFormat.RAW
    chunk_size: int | None = None
    recipients: tuple[str, ...] | None = None


class RelayAccess(Protocol):
    """What the routes use of the relay service (node/relay/service.py passes itself)."""

    def status(self) -> dict[str, Any]: ...

    async def publish(self, what: Publication) -> Manifest: ...

    async def fetch(self, name: str, signer: str | None = None) -> None: ...

    async def pull_model(self, model: str) -> dict[str, Any]:
        """Raises ValueError when no peer offers ``model``."""
        ...

    def latest(self, name: str, signer: str | None = None) -> Manifest | None: ...

    def complete_version(self, name: str, version: int) -> Manifest | None: ...

    async def export(self, manifest: Manifest, out: Path) -> None: ...

    def set_upload(self, *, limit_bps: int, advertised_bps: int = 0) -> None:
        """Raises ValueError for a negative bandwidth."""
        ...

    def upload_settings(self) -> tuple[int, int]:
        """(upload_limit_bps, advertised upload_bps) in force now."""
        ...


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def relay_routes(service: RelayAccess) -> list[BaseRoute]:
    endpoints = RelayEndpoints(service)
    return [
        Route("/status", endpoints.status, methods=["GET"]),
        token_route("/limits", endpoints.limits),
        token_route("/publish", endpoints.publish),
        token_route("/fetch", endpoints.fetch),
        token_route("/pull", endpoints.pull),
        token_route("/export", endpoints.export),
    ]


def _manifest_json(manifest: Manifest) -> dict[str, Any]:
    return {
        "id": manifest.id.hex(),
        "name": manifest.name,
        "version": manifest.version,
        "chunks": manifest.chunks,
        "total_size": manifest.body.total_size,
        "recipients": [r.peer_id for r in manifest.body.recipients],
    }


def _optional_int(body: dict[str, Any], key: str) -> int | None:
    return None if body.get(key) is None else int(body[key])


class RelayEndpoints:
    """One endpoint per route, each a call on the relay service."""

    def __init__(self, service: RelayAccess) -> None:
        self.service = service

    async def status(self, request: Request) -> Response:
        return JSONResponse(self.service.status())

    async def publish(self, request: Request) -> Response:
        body = await json_object(request)
        if body is None:
            return _error("the body must be a JSON object")
        try:
            path = Path(str(body["path"])).expanduser()
            if not path.is_file():
                return _error(f"{path} is not a file")
            manifest = await self.service.publish(Publication(
                path,
                str(body["name"]),
                version=_optional_int(body, "version"),
                format=ArtifactFormat(body.get("format", ArtifactFormat.RAW.value)),
                chunk_size=_optional_int(body, "chunk_size"),
                recipients=None
                if body.get("recipients") is None
                else tuple(str(p) for p in body["recipients"]),
            ))
        except (KeyError, ValueError, TypeError, ManifestError, ChunkStoreError) as exc:
            return _error(f"cannot publish: {exc}")
        return JSONResponse(_manifest_json(manifest))

    async def fetch(self, request: Request) -> Response:
        body = await json_object(request)
        if body is None:
            return _error("the body must be a JSON object")
        if not isinstance(body.get("name"), str):
            return _error("fetch needs a name")
        await self.service.fetch(body["name"], body.get("signer"))
        return JSONResponse({"fetching": body["name"]})

    async def pull(self, request: Request) -> Response:
        body = await json_object(request)
        if body is None:
            return _error("the body must be a JSON object")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return _error("pull needs a model (a name or a weights hash)")
        try:
            return JSONResponse(await self.service.pull_model(body["model"]))
        except ValueError as exc:
            return _error(str(exc), 404)

    async def export(self, request: Request) -> Response:
        body = await json_object(request)
        if body is None:
            return _error("the body must be a JSON object")
        try:
            name, out = str(body["name"]), Path(str(body["out"])).expanduser()
            version = _optional_int(body, "version")
        except (KeyError, ValueError, TypeError) as exc:
            return _error(f"export needs name and out: {exc}")
        manifest = self.service.latest(name)
        if version is not None:
            manifest = self.service.complete_version(name, version)
        if manifest is None:
            return _error(
                f"no complete version of {name!r}"
                + (f" at version {version}" if version is not None else ""),
                404,
            )
        try:
            await self.service.export(manifest, out)
        except (ChunkStoreError, OSError) as exc:
            return _error(f"export failed: {exc}", 500)
        return JSONResponse(
            {
                "name": name,
                "version": manifest.version,
                "out": str(out),
                "size": manifest.body.total_size,
                "id": manifest.id.hex(),
            }
        )

    async def limits(self, request: Request) -> Response:
        body = await json_object(request)
        if body is None:
            return _error("the body must be a JSON object")
        try:
            self.service.set_upload(
                limit_bps=int(body["upload_limit_bps"]),
                advertised_bps=int(body.get("upload_bps", 0)),
            )
        except (KeyError, ValueError, TypeError) as exc:
            return _error(f"limits need upload_limit_bps >= 0: {exc}")
        limit_bps, upload_bps = self.service.upload_settings()
        return JSONResponse({"upload_limit_bps": limit_bps, "upload_bps": upload_bps})
