"""Stored responses: a real SQLite file, bounded by age, count and bytes, walked into conversations."""

from __future__ import annotations

import asyncio
import sqlite3
import stat
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from llmd.api.responses.store import (
    ItemPage,
    ResponseStore,
    StoredResponse,
    StoreLimits,
    default_store_path,
    page_items,
    record_size,
    store_from_settings,
)
from llmd.config import load_settings
from llmd.errors import ConfigError, StoreError

T = TypeVar("T")
DAY = 24 * 3600.0
ROOMY = StoreLimits(max_age=30 * DAY, max_count=100, max_bytes=10**6)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def record(response_id: str, previous_id: str | None = None, *, created_at: float = 1_000_000.0,
           inputs: list[dict[str, Any]] | None = None, padding: int = 0) -> StoredResponse:
    """A stored response whose JSON names its id; `padding` bytes make it bigger."""
    body = {"id": response_id, "object": "response", "padding": "x" * padding}
    items = inputs if inputs is not None else [{"id": f"in_{response_id}", "type": "message"}]
    return StoredResponse(id=response_id, created_at=created_at, previous_id=previous_id,
                          response=msgspec.json.encode(body), input_items=msgspec.json.encode(items),
                          output_items=msgspec.json.encode([{"id": f"out_{response_id}"}]))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "responses.sqlite3"


@pytest.fixture
def store(path: Path, clock: Clock) -> Iterator[ResponseStore]:
    opened = ResponseStore(path, ROOMY, clock)
    yield opened
    opened.close()


def save_all(store: ResponseStore, *records: StoredResponse) -> None:
    async def main() -> None:
        for each in records:
            await store.save(each)

    run(main())


def rows(path: Path) -> list[str]:
    """The ids in the file, read by a connection of the test's own, oldest first."""
    with sqlite3.connect(path) as connection:
        return [row[0] for row in connection.execute("SELECT id FROM responses ORDER BY created_at, rowid")]


def test_save_get_delete_round_trip(store: ResponseStore) -> None:
    saved = record("resp_1")
    save_all(store, saved)
    assert run(store.get("resp_1")) == saved
    assert run(store.delete("resp_1")) is True
    assert run(store.get("resp_1")) is None
    assert run(store.delete("resp_1")) is False


def test_saving_the_same_id_replaces_it(store: ResponseStore, path: Path) -> None:
    save_all(store, record("resp_1"), record("resp_1", "resp_0", padding=5))
    got = run(store.get("resp_1"))
    assert got is not None and got.previous_id == "resp_0" and rows(path) == ["resp_1"]


def test_an_expired_response_is_gone_before_any_pruning(store: ResponseStore, clock: Clock) -> None:
    save_all(store, record("resp_1", created_at=clock.now))
    clock.now += ROOMY.max_age
    assert run(store.get("resp_1")) is not None
    clock.now += 1
    assert run(store.get("resp_1")) is None
    assert run(store.conversation("resp_1")) is None and run(store.delete("resp_1")) is False


def test_a_save_prunes_by_age(store: ResponseStore, clock: Clock, path: Path) -> None:
    save_all(store, record("old", created_at=clock.now - 31 * DAY), record("new", created_at=clock.now))
    assert rows(path) == ["new"]


def test_a_save_prunes_by_count_oldest_first(path: Path, clock: Clock) -> None:
    store = ResponseStore(path, StoreLimits(max_age=DAY, max_count=3, max_bytes=10**6), clock)
    save_all(store, *(record(f"r{i}", created_at=clock.now - 10 + i) for i in range(5)))
    store.close()
    assert rows(path) == ["r2", "r3", "r4"]


def test_a_save_prunes_by_bytes_oldest_first(path: Path, clock: Clock) -> None:
    sizes = [record_size(record(f"r{i}", padding=100)) for i in range(4)]
    limits = StoreLimits(max_age=DAY, max_count=100, max_bytes=sizes[0] * 2 + 10)
    store = ResponseStore(path, limits, clock)
    save_all(store, *(record(f"r{i}", created_at=clock.now - 10 + i, padding=100) for i in range(4)))
    store.close()
    assert rows(path) == ["r2", "r3"]


def test_a_record_larger_than_the_byte_bound_is_not_kept(path: Path, clock: Clock) -> None:
    small = record("small")
    store = ResponseStore(path, StoreLimits(max_age=DAY, max_count=100, max_bytes=record_size(small) + 50),
                          clock)
    save_all(store, small, record("big", padding=1000))
    assert run(store.get("big")) is None and run(store.get("small")) == small
    save_all(store, record("small", padding=1000))  # a too-big replacement drops the old one too
    store.close()
    assert rows(path) == []


def test_the_conversation_walks_back_oldest_first(store: ResponseStore, clock: Clock) -> None:
    chain = [record("a", created_at=clock.now - 3), record("b", "a", created_at=clock.now - 2),
             record("c", "b", created_at=clock.now - 1), record("other", created_at=clock.now)]
    save_all(store, *chain)
    conversation = run(store.conversation("c"))
    assert conversation is not None and conversation.complete
    assert [each.id for each in conversation.records] == ["a", "b", "c"]
    assert conversation.records == chain[:3]


def test_a_deleted_link_leaves_the_later_ones_incomplete(store: ResponseStore, clock: Clock) -> None:
    save_all(store, record("a"), record("b", "a"), record("c", "b"))
    assert run(store.delete("b")) is True
    conversation = run(store.conversation("c"))
    assert conversation is not None and not conversation.complete
    assert [each.id for each in conversation.records] == ["c"]
    assert run(store.get("a")) is not None


def test_an_expired_link_ends_the_walk(store: ResponseStore, clock: Clock) -> None:
    save_all(store, record("a", created_at=clock.now - 10 * DAY), record("b", "a", created_at=clock.now))
    clock.now += 25 * DAY
    conversation = run(store.conversation("b"))
    assert conversation is not None and not conversation.complete
    assert [each.id for each in conversation.records] == ["b"]


def test_unknown_ids(store: ResponseStore) -> None:
    assert run(store.get("nope")) is None and run(store.conversation("nope")) is None
    assert run(store.input_items("nope", limit=20, order="desc", after=None, before=None)) is None
    assert run(store.delete("nope")) is False


def test_a_cycle_of_previous_ids_ends(store: ResponseStore) -> None:
    save_all(store, record("a", "b"), record("b", "a"))
    conversation = run(store.conversation("a"))
    assert conversation is not None and not conversation.complete
    assert [each.id for each in conversation.records] == ["b", "a"]
    save_all(store, record("self", "self"))
    looped = run(store.conversation("self"))
    assert looped is not None and [each.id for each in looped.records] == ["self"]


ITEMS = [{"id": f"i{n}", "type": "message"} for n in range(1, 6)]


def ids(page: ItemPage) -> list[str]:
    return [item["id"] for item in page.items]


@pytest.mark.parametrize(
    ("limit", "order", "after", "before", "expected", "has_more"),
    [
        (2, "asc", None, None, ["i1", "i2"], True),
        (2, "asc", "i2", None, ["i3", "i4"], True),
        (2, "asc", "i4", None, ["i5"], False),
        (20, "desc", None, None, ["i5", "i4", "i3", "i2", "i1"], False),
        (2, "desc", "i4", None, ["i3", "i2"], True),
        (2, "asc", None, "i4", ["i2", "i3"], True),
        (3, "asc", None, "i4", ["i1", "i2", "i3"], False),
        (2, "desc", None, "i2", ["i4", "i3"], True),
        (5, "asc", "i1", "i5", ["i2", "i3", "i4"], False),
        (2, "asc", "i4", "i2", [], False),
        (2, "asc", "unknown", None, [], False),
        (2, "desc", None, "unknown", [], False),
    ],
)
def test_page_items(limit: int, order: Any, after: str | None, before: str | None, expected: list[str],
                    has_more: bool) -> None:
    page = page_items(ITEMS, limit=limit, order=order, after=after, before=before)
    assert ids(page) == expected and page.has_more is has_more
    assert (page.first_id, page.last_id) == ((expected[0], expected[-1]) if expected else (None, None))


@pytest.mark.parametrize("limit", [0, 101])
def test_page_items_refuses_a_limit_out_of_range(limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        page_items(ITEMS, limit=limit, order="asc", after=None, before=None)


def test_input_items_pages_a_stored_response(store: ResponseStore) -> None:
    save_all(store, record("r", inputs=ITEMS))
    page = run(store.input_items("r", limit=2, order="desc", after="i5", before=None))
    assert page is not None and ids(page) == ["i4", "i3"] and page.has_more
    assert page.items[0] == {"id": "i4", "type": "message"}


def test_the_data_survives_a_restart(path: Path, clock: Clock) -> None:
    first = ResponseStore(path, ROOMY, clock)
    save_all(first, record("a"), record("b", "a"))
    first.close()
    second = ResponseStore(path, ROOMY, clock)
    conversation = run(second.conversation("b"))
    second.close()
    assert conversation is not None and [each.id for each in conversation.records] == ["a", "b"]


def test_opening_prunes_to_the_new_limits(path: Path, clock: Clock) -> None:
    first = ResponseStore(path, ROOMY, clock)
    save_all(first, *(record(f"r{i}", created_at=clock.now - 10 + i) for i in range(4)))
    first.close()
    ResponseStore(path, StoreLimits(max_age=DAY, max_count=1, max_bytes=10**6), clock).close()
    assert rows(path) == ["r3"]


def test_opening_prunes_many_rows_by_bytes(path: Path, clock: Clock) -> None:
    first = ResponseStore(path, ROOMY, clock)
    save_all(first, *(record(f"r{i}", created_at=clock.now - 10 + i) for i in range(5)))
    first.close()
    two = 2 * record_size(record("r0"))
    ResponseStore(path, StoreLimits(max_age=DAY, max_count=100, max_bytes=two), clock).close()
    assert rows(path) == ["r3", "r4"]


def test_responses_created_in_the_same_second_go_in_the_order_saved(path: Path, clock: Clock) -> None:
    store = ResponseStore(path, StoreLimits(max_age=DAY, max_count=2, max_bytes=10**6), clock)
    save_all(store, record("first"), record("second"), record("third"))
    store.close()
    assert rows(path) == ["second", "third"]


def test_a_closed_store_refuses_calls_and_a_new_one_opens(path: Path, clock: Clock) -> None:
    first = ResponseStore(path, ROOMY, clock)
    save_all(first, record("a"))
    first.close()
    first.close()
    with pytest.raises(StoreError, match="closed"):
        run(first.get("a"))
    second = ResponseStore(path, ROOMY, clock)
    assert run(second.get("a")) is not None
    second.close()


def test_the_folder_and_the_files_are_private(path: Path, store: ResponseStore) -> None:
    save_all(store, record("a"))
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for sidecar in path.parent.glob("*-wal"):
        assert stat.S_IMODE(sidecar.stat().st_mode) == 0o600


def test_another_programs_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "theirs.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not an llmd response store") as err:
        ResponseStore(path, ROOMY)
    assert str(path) in err.value.message and isinstance(err.value, ConfigError)
    assert path.read_bytes() == before


def test_a_corrupt_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    path.write_bytes(b"this is not a database, it is somebody's notes\n" * 100)
    with pytest.raises(StoreError, match="not an SQLite database") as err:
        ResponseStore(path, ROOMY)
    assert str(path) in err.value.message
    assert path.read_bytes() == b"this is not a database, it is somebody's notes\n" * 100


def test_another_schema_version_is_refused(path: Path) -> None:
    ResponseStore(path, ROOMY).close()
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA user_version = 2")
    with pytest.raises(StoreError, match=r"schema version 2, this llmd reads 1") as err:
        ResponseStore(path, ROOMY)
    assert str(path) in err.value.message


def test_an_unwritable_place_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="cannot create") as err:
        ResponseStore(tmp_path / "file" / "responses.sqlite3", ROOMY)
    assert err.value.param == "responses_path"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"STATE_DIRECTORY": "/var/lib/llmd:/var/lib/other", "LLMD_HOME": "/h"}, "/var/lib/llmd"),
        ({"LLMD_HOME": "/h", "XDG_STATE_HOME": "/x"}, "/h"),
        ({"XDG_STATE_HOME": "/x", "HOME": "/home/u"}, "/x/llmd"),
        ({"XDG_STATE_HOME": "relative", "HOME": "/home/u"}, "/home/u/.local/state/llmd"),
        ({"STATE_DIRECTORY": "", "LLMD_HOME": "", "HOME": "/home/u"}, "/home/u/.local/state/llmd"),
    ],
)
def test_default_store_path(environ: dict[str, str], expected: str) -> None:
    assert default_store_path(environ) == Path(expected) / "responses.sqlite3"


def test_the_store_from_settings(tmp_path: Path) -> None:
    assert store_from_settings(load_settings(None, {"store_responses": False})) is None
    path = tmp_path / "r.sqlite3"
    settings = load_settings(None, {"responses_path": str(path), "responses_max_count": 7,
                                    "responses_max_bytes": "2MiB", "responses_max_age": 60.0})
    store = store_from_settings(settings)
    assert store is not None
    store.close()
    assert store.path == path and store.limits == StoreLimits(max_age=60.0, max_count=7, max_bytes=2 * 2**20)


def test_a_stored_item_is_found_by_its_id_until_its_response_goes(store: ResponseStore) -> None:
    save_all(store, record("resp_a"), record("resp_b", inputs=[{"id": "in_b", "type": "message", "n": 2}]))
    assert run(store.item("out_resp_a")) == {"id": "out_resp_a"}
    assert run(store.item("in_b")) == {"id": "in_b", "type": "message", "n": 2}
    assert run(store.item("nope")) is None
    assert run(store.delete("resp_a"))
    assert run(store.item("out_resp_a")) is None and run(store.item("out_resp_b")) == {"id": "out_resp_b"}


def test_an_item_given_again_is_found_in_the_newer_response(store: ResponseStore) -> None:
    save_all(store, record("resp_a"), record("resp_b", inputs=[{"id": "out_resp_a", "echoed": True}]))
    assert run(store.item("out_resp_a")) == {"id": "out_resp_a", "echoed": True}
    assert run(store.delete("resp_b"))
    assert run(store.item("out_resp_a")) == {"id": "out_resp_a"}  # the older response still holds it
