"""Static checks that are part of the suite: mypy --strict on the pure layers, ruff everywhere."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_strict_on_protocol_and_crypto() -> None:
    from mypy import api

    stdout, stderr, status = api.run(["--config-file", str(ROOT / "setup.cfg"),
                                      str(ROOT / "protocol"), str(ROOT / "crypto")])
    assert status == 0, stdout + stderr


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or "ruff"
    result = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
