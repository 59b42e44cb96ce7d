"""Stored responses (`store: true`): one SQLite file under the state directory, kept across restarts.

One row per response holds its JSON (as GET /v1/responses/{id} returns it), its own input items and
its output items (each item's id indexed, for `item_reference` inputs); `previous_id` links a row to
the response it continued, and one recursive query walks those links back into a conversation. The
store is bounded by age, count and bytes, the oldest rows going first; a deleted or dropped link leaves
the later responses in place, their conversation marked incomplete. sqlite3 blocks, so one worker
thread owns the connection and every call.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from llmd.config import Settings
from llmd.errors import StoreError

FILE_NAME = "responses.sqlite3"
SCHEMA_VERSION = 1  # PRAGMA user_version: bump with a migration when the table changes
APPLICATION_ID = 0x6C6C6D64  # PRAGMA application_id, "llmd": tells our file from any other SQLite file
MAX_PAGE = 100  # OpenAI's largest `limit` for a list of input items

_SCHEMA = f"""
BEGIN IMMEDIATE;
CREATE TABLE responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    previous_id TEXT,
    size INTEGER NOT NULL,
    response BLOB NOT NULL,
    input_items BLOB NOT NULL,
    output_items BLOB NOT NULL
);
CREATE INDEX responses_by_age ON responses (created_at);
CREATE TABLE items (
    id TEXT NOT NULL,
    response_id TEXT NOT NULL,
    PRIMARY KEY (id, response_id)
);
CREATE INDEX items_by_response ON items (response_id);
CREATE TRIGGER items_go_with_their_response AFTER DELETE ON responses
BEGIN DELETE FROM items WHERE response_id = old.id; END;
PRAGMA application_id = {APPLICATION_ID};
PRAGMA user_version = {SCHEMA_VERSION};
COMMIT;
"""
_COLUMNS = "id, created_at, previous_id, response, input_items, output_items"
_NEWEST_FIRST = "ORDER BY created_at DESC, rowid DESC"
# Pruning, in order: past the age, then beyond the count (then beyond the bytes: `prune_bytes`).
_PRUNE = (
    "DELETE FROM responses WHERE created_at < :oldest",
    f"DELETE FROM responses WHERE rowid IN (SELECT rowid FROM responses {_NEWEST_FIRST} "
    "LIMIT -1 OFFSET :max_count)",
)
# The conversation ending at :id, newest link first. A cycle (a response saved again with another
# previous_id) cannot loop forever: the walk stops at :max_depth links, and each id counts once.
_CHAIN = """
WITH RECURSIVE chain(id, previous_id, depth) AS (
    SELECT id, previous_id, 0 FROM responses WHERE id = :id AND created_at >= :oldest
    UNION ALL
    SELECT r.id, r.previous_id, chain.depth + 1 FROM chain JOIN responses AS r ON r.id = chain.previous_id
    WHERE r.created_at >= :oldest AND chain.depth + 1 < :max_depth
),
links(id, depth) AS (SELECT id, MIN(depth) FROM chain GROUP BY id)
SELECT r.id, r.created_at, r.previous_id, r.response, r.input_items, r.output_items
FROM links JOIN responses AS r ON r.id = links.id ORDER BY links.depth DESC
"""

# The newest kept response holding the item :id (an echoed item is held by every response it was given to).
_ITEM_HOLDER = """
SELECT r.id FROM items AS i JOIN responses AS r ON r.id = i.response_id WHERE i.id = ? AND r.created_at >= ?
ORDER BY r.created_at DESC, r.rowid DESC LIMIT 1
"""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """How much the store keeps; past any bound the oldest responses go first."""

    max_age: float  # seconds a stored response is kept
    max_count: int  # responses kept at most
    max_bytes: int  # total stored bytes at most (see `record_size`)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: its wire JSON, and the items it adds to its conversation."""

    id: str
    created_at: float
    previous_id: str | None
    response: bytes  # the response object's JSON, as GET /v1/responses/{id} returns it
    input_items: bytes  # JSON array: this request's own input items (ids given), as input_items lists them
    output_items: bytes  # JSON array: the response's output items (they join the conversation)


@dataclass(frozen=True, slots=True)
class Conversation:
    """A stored response and the ones it continues, as far back as they are still stored."""

    records: list[StoredResponse]  # oldest first, ending with the asked id
    complete: bool  # False when an earlier link (a previous_id) is no longer stored


@dataclass(frozen=True, slots=True)
class ItemPage:
    """One page of a response's input items, in the order asked for."""

    items: list[dict[str, Any]]
    has_more: bool  # more items lie beyond this page, in the direction the page was read

    @property
    def first_id(self) -> str | None:
        """The first item's id (OpenAI's `first_id`), None on an empty page."""
        return self.items[0].get("id") if self.items else None

    @property
    def last_id(self) -> str | None:
        """The last item's id (OpenAI's `last_id`), None on an empty page."""
        return self.items[-1].get("id") if self.items else None


def record_size(record: StoredResponse) -> int:
    """The bytes a record counts against `max_bytes`: its ids and its three JSON documents."""
    ids = len(record.id.encode()) + len((record.previous_id or "").encode())
    return ids + len(record.response) + len(record.input_items) + len(record.output_items)


def complete_chain(records: list[StoredResponse]) -> bool:
    """Whether the oldest record starts the conversation (a cycle or a missing link: it does not)."""
    return bool(records) and records[0].previous_id is None


def page_items(items: list[dict[str, Any]], *, limit: int, order: Literal["asc", "desc"],
               after: str | None, before: str | None) -> ItemPage:
    """OpenAI's cursor paging over items: `desc` is newest (last) first; `after`/`before` are item ids.

    The page holds the items after `after` and before `before` in the listing order; with only
    `before` it is the `limit` items just before that cursor. An unknown cursor gives an empty page.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be 1 to {MAX_PAGE}, not {limit}")
    listed = items if order == "asc" else items[::-1]
    ids = [item.get("id") for item in listed]
    if (after is not None and after not in ids) or (before is not None and before not in ids):
        return ItemPage([], has_more=False)
    start = ids.index(after) + 1 if after is not None else 0
    window = listed[start:ids.index(before) if before is not None else len(listed)]
    page = window[-limit:] if before is not None and after is None else window[:limit]
    return ItemPage(page, has_more=len(window) > limit)


def default_store_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Where stored responses live without `responses_path`.

    `$STATE_DIRECTORY` (systemd's StateDirectory=; its first entry), else `$LLMD_HOME`, else
    `$XDG_STATE_HOME/llmd`, else `~/.local/state/llmd`; the file is `responses.sqlite3` in it.
    """
    state_dirs = environ.get("STATE_DIRECTORY", "").split(":")
    if state_dirs[0]:
        return Path(state_dirs[0]) / FILE_NAME
    if environ.get("LLMD_HOME"):
        return Path(environ["LLMD_HOME"]) / FILE_NAME
    xdg_state = environ.get("XDG_STATE_HOME", "")
    if Path(xdg_state).is_absolute():
        return Path(xdg_state) / "llmd" / FILE_NAME
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return home / ".local" / "state" / "llmd" / FILE_NAME


def store_from_settings(settings: Settings) -> ResponseStore | None:
    """The response store the settings ask for, opened (pruned once); None with `store_responses: false`."""
    if not settings.store_responses:
        return None
    path = Path(settings.responses_path).expanduser() if settings.responses_path else default_store_path()
    limits = StoreLimits(max_age=settings.responses_max_age, max_count=settings.responses_max_count,
                         max_bytes=settings.responses_byte_limit)
    return ResponseStore(path, limits)


class ResponseStore:
    """Stored responses in one SQLite file, read and written on the store's own thread.

    Opening creates the file (its folder 0700, the file 0600) or checks that it is an llmd store of
    this schema, then prunes. A save replaces a response with the same id, then prunes; a record
    larger than `max_bytes` on its own is not kept at all (nor the one it replaced).
    """

    def __init__(self, path: Path, limits: StoreLimits, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.limits = limits
        self._clock = clock
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmd-store")
        try:
            self._connection = self._executor.submit(self._guarded, self._open).result()
        except BaseException:
            self._executor.shutdown(wait=True)
            raise

    async def save(self, record: StoredResponse) -> None:
        """Store `record` (replacing one with the same id), then drop what the limits no longer allow."""
        await self._call(self._save, record, self._clock())

    async def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None when unknown or past `max_age`."""
        return await self._call(self._get, response_id, self._clock())

    async def delete(self, response_id: str) -> bool:
        """Forget a response (not the ones that continue it); True when it was stored."""
        return await self._call(self._delete, response_id, self._clock())

    async def conversation(self, response_id: str) -> Conversation | None:
        """The response and those it continues, oldest first; None when the id is unknown or expired."""
        records = await self._call(self._chain, response_id, self._clock())
        return Conversation(records, complete_chain(records)) if records else None

    async def item(self, item_id: str) -> dict[str, Any] | None:
        """The stored input or output item `item_id` (an `item_reference` names it); None when unknown."""
        return await self._call(self._item, item_id, self._clock())

    async def input_items(self, response_id: str, *, limit: int, order: Literal["asc", "desc"],
                          after: str | None, before: str | None) -> ItemPage | None:
        """A page of the response's own input items (see `page_items`); None when the id is unknown."""
        items = await self._call(self._input_items, response_id, self._clock())
        return None if items is None else page_items(items, limit=limit, order=order, after=after,
                                                     before=before)

    def close(self) -> None:
        """Finish the calls already handed over, then close the database; later calls raise StoreError."""
        if self._closed:
            return
        self._closed = True
        self._executor.submit(self._connection.close)
        self._executor.shutdown(wait=True)

    async def _call(self, work: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreError(f"response store {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._guarded, work, *args))

    def _guarded(self, work: Callable[..., T], *args: Any) -> T:
        """Run `work` on the store's thread, any database failure raised as a StoreError naming the file."""
        try:
            return work(*args)
        except (sqlite3.Error, msgspec.DecodeError) as exc:
            raise StoreError(f"response store {self.path}: {exc}") from exc

    # Everything below runs on the store's thread.

    def _open(self) -> sqlite3.Connection:
        create_file(self.path)
        connection = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        try:
            check_schema(connection, self.path)
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("PRAGMA synchronous = NORMAL")
            with transaction(connection):
                self._prune(connection, self._clock())
        except BaseException:
            connection.close()
            raise
        return connection

    def _save(self, record: StoredResponse, now: float) -> None:
        size = record_size(record)
        with transaction(self._connection):
            self._connection.execute("DELETE FROM responses WHERE id = ?", (record.id,))
            if size <= self.limits.max_bytes:
                self._connection.execute(
                    f"INSERT INTO responses ({_COLUMNS}, size) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (*astuple(record), size))
                self._connection.executemany("INSERT OR IGNORE INTO items (id, response_id) VALUES (?, ?)",
                                             [(item_id, record.id) for item_id in item_ids(record)])
            self._prune(self._connection, now)

    def _get(self, response_id: str, now: float) -> StoredResponse | None:
        row = self._connection.execute(
            f"SELECT {_COLUMNS} FROM responses WHERE id = ? AND created_at >= ?",
            (response_id, self._oldest(now))).fetchone()
        return StoredResponse(*row) if row is not None else None

    def _delete(self, response_id: str, now: float) -> bool:
        with transaction(self._connection):
            self._connection.execute(_PRUNE[0], {"oldest": self._oldest(now)})
            cursor = self._connection.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cursor.rowcount > 0

    def _chain(self, response_id: str, now: float) -> list[StoredResponse]:
        rows = self._connection.execute(
            _CHAIN, {"id": response_id, "oldest": self._oldest(now), "max_depth": self.limits.max_count})
        return [StoredResponse(*row) for row in rows]

    def _item(self, item_id: str, now: float) -> dict[str, Any] | None:
        row = self._connection.execute(_ITEM_HOLDER, (item_id, self._oldest(now))).fetchone()
        record = self._get(row[0], now) if row is not None else None
        if record is None:
            return None
        items = [*decoded_items(record.input_items), *decoded_items(record.output_items)]
        return next((item for item in items if item.get("id") == item_id), None)

    def _input_items(self, response_id: str, now: float) -> list[dict[str, Any]] | None:
        record = self._get(response_id, now)
        return None if record is None else decoded_items(record.input_items)

    def _prune(self, connection: sqlite3.Connection, now: float) -> None:
        bounds = {"oldest": self._oldest(now), "max_count": self.limits.max_count}
        for statement in _PRUNE:
            connection.execute(statement, bounds)
        prune_bytes(connection, self.limits.max_bytes)

    def _oldest(self, now: float) -> float:
        """The earliest `created_at` still kept."""
        return now - self.limits.max_age


def decoded_items(blob: bytes) -> list[dict[str, Any]]:
    """A stored JSON array of items."""
    return msgspec.json.decode(blob, type=list[dict[str, Any]])


def item_ids(record: StoredResponse) -> list[str]:
    """The ids of a record's input and output items (an item without one cannot be referenced)."""
    items = [*decoded_items(record.input_items), *decoded_items(record.output_items)]
    return [item["id"] for item in items if isinstance(item.get("id"), str)]


def create_file(path: Path) -> None:
    """Make the database's folder (0700) and the file itself (0600) unless they exist."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError as exc:
        raise StoreError(f"response store {path}: cannot create: {exc.strerror}; set `responses_path` "
                         "to a writable file or `store_responses: false`", param="responses_path") from exc


def check_schema(connection: sqlite3.Connection, path: Path) -> None:
    """Create the table in an empty file; refuse a file that is not an llmd store of this schema.

    A foreign or newer file is never changed or deleted: it may be someone's data.
    """
    try:
        application_id = connection.execute("PRAGMA application_id").fetchone()[0]
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"response store {path}: not an SQLite database ({exc}); move it aside or set "
                         "`responses_path`", param="responses_path") from exc
    if application_id == 0 and version == 0 and tables == 0:
        connection.executescript(_SCHEMA)
    elif application_id != APPLICATION_ID:
        raise StoreError(f"response store {path}: not an llmd response store (another program's SQLite "
                         "database?); move it aside or set `responses_path`", param="responses_path")
    elif version != SCHEMA_VERSION:
        raise StoreError(f"response store {path}: schema version {version}, this llmd reads "
                         f"{SCHEMA_VERSION}; use the llmd that wrote it or move the file aside",
                         param="responses_path")


def prune_bytes(connection: sqlite3.Connection, max_bytes: int) -> None:
    """Delete the oldest rows until the sizes left sum to `max_bytes` at most.

    Reads the oldest rows only as far as the excess reaches: usually one, when a save tipped it over.
    """
    excess = connection.execute("SELECT total(size) FROM responses").fetchone()[0] - max_bytes
    if excess <= 0:
        return
    doomed: list[tuple[int]] = []
    oldest_first = connection.execute("SELECT rowid, size FROM responses ORDER BY created_at, rowid")
    for rowid, size in oldest_first:
        doomed.append((rowid,))
        excess -= size
        if excess <= 0:
            break
    oldest_first.close()
    connection.executemany("DELETE FROM responses WHERE rowid = ?", doomed)


@contextmanager
def transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: committed when the block ends, rolled back when it raises."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:  # a failed COMMIT (disk full) leaves it open too
            connection.execute("ROLLBACK")
        raise
