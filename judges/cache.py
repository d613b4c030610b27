"""On-disk cache of judge replies (sqlite), so no judgment is ever paid for twice.

Key = sha256 of the canonical JSON of (judge model, prompt name/version, messages, decoding
params). The value is the raw reply text, not the parsed score: parsing can be improved later
without asking again. Each reply is committed as soon as it arrives, so an interrupted run
resumes with every judgment it already received. One connection guarded by a lock makes the cache
safe to share between the client's worker threads; WAL mode lets other processes read meanwhile.

The `formats` table remembers which response_format an endpoint accepted, so a new client does not
renegotiate (and re-send rejected requests) on every run.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS replies (
    key TEXT PRIMARY KEY, model TEXT NOT NULL, prompt TEXT NOT NULL,
    request TEXT NOT NULL, reply TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS formats (
    endpoint TEXT NOT NULL, model TEXT NOT NULL, mode TEXT NOT NULL, PRIMARY KEY (endpoint, model));
"""


def canonical_json(obj: object) -> str:
    """One spelling per value: sorted keys, no spaces, unicode kept."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_key(model: str, prompt: str, messages: list[dict], params: dict) -> str:
    """Cache key of one request. `params` must not hold the response_format (see client.py)."""
    payload = {"model": model, "prompt": prompt, "messages": messages, "params": params}
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


class JudgeCache:
    """Thread-safe sqlite store of raw judge replies; use as a context manager or call close()."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=60)
        with self._lock:
            if self.path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            self._db.commit()
        self.hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        return f"JudgeCache({self.path!r}, hits={self.hits}, misses={self.misses})"

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
            return row[0]

    def put(self, key: str, model: str, prompt: str, request: dict, reply: str) -> None:
        """Store and commit at once (an interrupted run keeps it). The first reply for a key wins."""
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO replies (key, model, prompt, request, reply, created) VALUES (?,?,?,?,?,?)",
                (key, model, prompt, canonical_json(request), reply, time.time()),
            )
            self._db.commit()

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0])

    def get_format(self, endpoint: str, model: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT mode FROM formats WHERE endpoint = ? AND model = ?", (endpoint, model)
            ).fetchone()
            return None if row is None else row[0]

    def put_format(self, endpoint: str, model: str, mode: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO formats VALUES (?,?,?)", (endpoint, model, mode))
            self._db.commit()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> JudgeCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
