"""The API token file: ``<data_dir>/api.token``, a random secret (mode 0600) that every
mutating endpoint of the local HTTP API requires as ``Authorization: Bearer <token>``.

The daemon creates it on first run (:func:`load_or_create_token`); the CLI, the benches and
the network learner read it (:func:`read_token`). This module imports nothing of the web app,
so a client reads the token without loading Starlette or hypercorn.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

TOKEN_FILE_NAME = "api.token"
TOKEN_FILE_MODE = 0o600


def load_or_create_token(data_dir: Path) -> str:
    """The API token of this data dir, created (mode 0600, atomically) if missing."""
    path = Path(data_dir) / TOKEN_FILE_NAME
    if path.exists():
        return read_token(data_dir)
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, TOKEN_FILE_MODE)
    try:
        os.fchmod(fd, TOKEN_FILE_MODE)
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def read_token(data_dir: Path) -> str:
    """The API token of this data dir; refuses a file others may read."""
    path = Path(data_dir) / TOKEN_FILE_NAME
    if path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is readable by others; fix: chmod 600 {path}")
    return path.read_text().strip()
