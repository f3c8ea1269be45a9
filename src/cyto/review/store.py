"""The marks of a review: an append-only SQLite log in the review folder (``marks.sqlite``).

Every click is one row (reviewer, case, grid position, marked or cleared, second-level label,
time), committed with ``synchronous=FULL`` before the page is told it is saved: closing the tab,
killing the server or a power cut loses at most the mark in flight. Rows are never updated or
deleted (triggers refuse it); a reviewer's current state of a cell is its latest row, so the log is
also the history. Several servers (one per reviewer) may write the same log at once (WAL mode).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path

MARKS_FILE = "marks.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    reviewer TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('mark', 'done')),
    case_id TEXT NOT NULL,
    position INTEGER,
    value INTEGER NOT NULL CHECK (value IN (0, 1)),
    detail TEXT NOT NULL DEFAULT '',
    time TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the marks log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the marks log is append-only'); END;
"""


class MarkStore:
    """The append-only marks log of one review folder."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / MARKS_FILE
        self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _append(self, reviewer, kind, case, position, value, detail) -> None:
        now = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        with self._db:  # one transaction, committed (and synced) on exit
            self._db.execute(
                "INSERT INTO events (reviewer, kind, case_id, position, value, detail, time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (reviewer, kind, case, position, int(value), detail, now),
            )

    def mark(self, reviewer: str, case: str, position: int, marked: bool, detail: str = "") -> None:
        self._append(reviewer, "mark", case, int(position), marked, detail if marked else "")

    def set_done(self, reviewer: str, case: str, done: bool) -> None:
        self._append(reviewer, "done", case, None, done, "")

    def marks(
        self, reviewer: str | None = None, case: str | None = None
    ) -> dict[tuple[str, str, int], tuple[bool, str]]:
        """Current marks, ``{(reviewer, case, position): (marked, detail)}`` (latest row wins);
        cells whose latest row clears them are left out. ``None`` filters: everyone, every case."""
        rows = self._db.execute(
            "SELECT reviewer, case_id, position, value, detail FROM events "
            "WHERE kind = 'mark' AND (? IS NULL OR reviewer = ?) AND (? IS NULL OR case_id = ?) "
            "ORDER BY seq",
            (reviewer, reviewer, case, case),
        ).fetchall()
        state: dict[tuple[str, str, int], tuple[bool, str]] = {}
        for who, case, pos, value, detail in rows:
            state[(who, case, int(pos))] = (bool(value), detail)
        return {k: v for k, v in state.items() if v[0]}

    def done(self, reviewer: str | None = None) -> set[tuple[str, str]]:
        """``{(reviewer, case)}`` whose latest 'done' row says done."""
        rows = self._db.execute(
            "SELECT reviewer, case_id, value FROM events "
            "WHERE kind = 'done' AND (? IS NULL OR reviewer = ?) ORDER BY seq",
            (reviewer, reviewer),
        ).fetchall()
        state = {}
        for who, case, value in rows:
            state[(who, case)] = bool(value)
        return {k for k, v in state.items() if v}

    def reviewers(self) -> list[str]:
        rows = self._db.execute("SELECT DISTINCT reviewer FROM events ORDER BY reviewer")
        return [r[0] for r in rows]
