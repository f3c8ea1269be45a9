"""Where the shared real data live (importable from tests, unlike conftest)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CYTO_SHARED_DATA", ROOT.parent / "shared" / "data"))


def shared_bone_marrow() -> Path | None:
    path = SHARED_DATA / "bone_marrow"
    return path if (path / "LYT").is_dir() else None
