"""The marks of a review: an append-only SQLite log in the review folder (``marks.sqlite``).

Every click is one row (reviewer, case, grid position, marked or cleared, second-level label,
time), committed with ``synchronous=FULL`` before the page is told it is saved: closing the tab,
killing the server or a power cut loses at most the mark in flight. Rows are never updated or
deleted (triggers refuse it); a reviewer's current state of a cell is its latest row, so the log is
also the history. Several servers (one per reviewer) may write the same log at once (WAL mode).

A log belongs to one review: it is stamped, as it is made, with the review's id (``session_id``
in the review's sealed ``key.json`` and ``cases.json``), and a log of another review (copied into
this folder) is refused as it opens: its marks are of other cells at the same grid positions.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from cyto.errors import InputPathError

MARKS_FILE = "marks.sqlite"
#: the first bytes of every SQLite database file
SQLITE_HEADER = b"SQLite format 3\x00"

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
CREATE TABLE IF NOT EXISTS review (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    session_id TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS review_no_update BEFORE UPDATE ON review
BEGIN SELECT RAISE(ABORT, 'the marks log belongs to one review'); END;
CREATE TRIGGER IF NOT EXISTS review_no_delete BEFORE DELETE ON review
BEGIN SELECT RAISE(ABORT, 'the marks log belongs to one review'); END;
"""
#: the review's public cases (:data:`cyto.review.session.CASES_FILE`), which hold its id
_CASES_FILE = "cases.json"
_UNSET = object()


def review_id(folder: Path) -> str | None:
    """The id of the review in ``folder`` (its ``cases.json``'s ``session_id``); None for a
    folder that holds none (a review of an older cyto, or no review)."""
    try:
        data = json.loads((Path(folder) / _CASES_FILE).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    value = data.get("session_id") if isinstance(data, dict) else None
    return value if isinstance(value, str) and value else None


class MarkStore:
    """The append-only marks log of one review folder.

    ``session_id``: the review's id (:attr:`cyto.review.session.Session.session_id`; by default
    read from the folder's ``cases.json``). A new log is stamped with it; a log stamped with
    another id, or holding marks without one for a review that has one, is refused in one line.
    """

    def __init__(self, folder: Path, session_id: str | None | object = _UNSET) -> None:
        self.path = Path(folder) / MARKS_FILE
        if session_id is _UNSET:
            session_id = review_id(folder)
        self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        with self._readable():
            with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as fh:
                head = fh.read(len(SQLITE_HEADER))
                if head and head != SQLITE_HEADER:  # SQLite would start an empty log over it
                    raise sqlite3.DatabaseError("file is not a database")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            # a damaged log is found as it opens, not in the middle of a page or a report
            found = self._db.execute("PRAGMA quick_check").fetchone()
            if found is None or found[0] != "ok":
                raise sqlite3.DatabaseError(found[0] if found else "no answer to a check")
            self._db.executescript(_SCHEMA)
            self._belongs(session_id)

    def _belongs(self, session_id) -> None:
        """Stamp a new log with the review's id, or refuse a log of another review."""
        with self._db:
            if session_id is not None and not self._has_events():
                self._db.execute(
                    "INSERT OR IGNORE INTO review (one, session_id) VALUES (1, ?)", (session_id,)
                )
        row = self._db.execute("SELECT session_id FROM review").fetchone()
        stamped = row[0] if row else None
        if stamped == session_id or (stamped is None and not self._has_events()):
            return
        self._db.close()
        if stamped is None:
            whose = "carries no review id (made by an older cyto, or for another review)"
        elif session_id is None:
            whose = "belongs to a review other than this one (this review has no id)"
        else:
            whose = f"belongs to another review (id {stamped[:8]}, this one is {session_id[:8]})"
        raise InputPathError(
            f"{self.path} {whose}: its marks would be counted against other cells; move it "
            "back to the review it came from, or away to start this review's marks anew"
        )

    def _has_events(self) -> bool:
        return self._db.execute("SELECT 1 FROM events LIMIT 1").fetchone() is not None

    @contextlib.contextmanager
    def _readable(self) -> Iterator[None]:
        """SQLite's errors of a damaged or foreign file, as one line naming the log: the marks
        are the review's record, so nothing is made anew over them."""
        try:
            yield
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # damaged page; damaged text
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            self._db.close()
            said = " ".join(str(exc).split())  # SQLite's check answers in several lines
            said = said if len(said) <= 120 else said[:117] + "..."
            raise InputPathError(
                f"{self.path} cannot be read as the review's marks log ({said}): it is damaged or "
                "not cyto's; restore it from a backup (the marks are in it), or move it away to "
                "start the review's marks anew"
            ) from None

    def close(self) -> None:
        self._db.close()

    def _append(self, reviewer, kind, case, position, value, detail) -> None:
        now = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        with self._readable(), self._db:  # one transaction, committed (and synced) on exit
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
        with self._readable():
            rows = self._db.execute(
                "SELECT reviewer, case_id, position, value, detail FROM events "
                "WHERE kind = 'mark' AND (? IS NULL OR reviewer = ?) "
                "AND (? IS NULL OR case_id = ?) ORDER BY seq",
                (reviewer, reviewer, case, case),
            ).fetchall()
        state: dict[tuple[str, str, int], tuple[bool, str]] = {}
        for who, case, pos, value, detail in rows:
            state[(who, case, int(pos))] = (bool(value), detail)
        return {k: v for k, v in state.items() if v[0]}

    def done(self, reviewer: str | None = None) -> set[tuple[str, str]]:
        """``{(reviewer, case)}`` whose latest 'done' row says done."""
        with self._readable():
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
        with self._readable():
            rows = self._db.execute("SELECT DISTINCT reviewer FROM events ORDER BY reviewer")
            return [r[0] for r in rows]
