"""HTTP routes of the relay service, mounted under ``/relay`` by the daemon's API.

``GET /status`` (open); ``POST /publish {path, name, version?, format?, chunk_size?,
recipients?}``, ``POST /fetch {name, signer?}``, ``POST /export {name, version?, out}``,
``POST /limits {upload_limit_bps, upload_bps?}`` (benchmarks) (all POSTs need the API token).
Bodies and answers are JSON; a bad request answers 400 with ``{"error": ...}``, an artifact
not held 404. Paths name files on this machine (the CLI and the daemon share it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from node.api.app import token_route
from node.relay.chunk_store import ChunkStoreError
from protocol.relay.manifest import ArtifactFormat, ManifestError

if TYPE_CHECKING:
    from node.relay.service import RelayService


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def relay_routes(service: RelayService) -> list[BaseRoute]:
    async def status(request: Request) -> Response:
        return JSONResponse(service.status())

    async def publish(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        try:
            path = Path(str(body["path"])).expanduser()
            if not path.is_file():
                return _error(f"{path} is not a file")
            manifest = await service.publish(
                path,
                str(body["name"]),
                version=None if body.get("version") is None else int(body["version"]),
                format=ArtifactFormat(body.get("format", ArtifactFormat.RAW.value)),
                chunk_size=None if body.get("chunk_size") is None else int(body["chunk_size"]),
                recipients=None
                if body.get("recipients") is None
                else [str(p) for p in body["recipients"]],
            )
        except (KeyError, ValueError, TypeError, ManifestError, ChunkStoreError) as exc:
            return _error(f"cannot publish: {exc}")
        return JSONResponse(
            {
                "id": manifest.id.hex(),
                "name": manifest.name,
                "version": manifest.version,
                "chunks": manifest.chunks,
                "total_size": manifest.body.total_size,
                "recipients": [r.peer_id for r in manifest.body.recipients],
            }
        )

    async def fetch(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        if not isinstance(body.get("name"), str):
            return _error("fetch needs a name")
        await service.fetch(body["name"], body.get("signer"))
        return JSONResponse({"fetching": body["name"]})

    async def export(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        try:
            name, out = str(body["name"]), Path(str(body["out"])).expanduser()
            version = None if body.get("version") is None else int(body["version"])
        except (KeyError, ValueError, TypeError) as exc:
            return _error(f"export needs name and out: {exc}")
        manifest = service.latest(name)
        if version is not None:
            manifest = service.complete_version(name, version)
        if manifest is None:
            return _error(
                f"no complete version of {name!r}"
                + (f" at version {version}" if version is not None else ""),
                404,
            )
        try:
            await service.export(manifest, out)
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

    async def limits(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        try:
            service.set_upload(
                limit_bps=int(body["upload_limit_bps"]),
                advertised_bps=int(body.get("upload_bps", 0)),
            )
        except (KeyError, ValueError, TypeError) as exc:
            return _error(f"limits need upload_limit_bps >= 0: {exc}")
        return JSONResponse(
            {
                "upload_limit_bps": service.section.upload_limit_bps,
                "upload_bps": service.section.upload_bps,
            }
        )

    return [
        Route("/status", status, methods=["GET"]),
        token_route("/limits", limits),
        token_route("/publish", publish),
        token_route("/fetch", fetch),
        token_route("/export", export),
    ]
