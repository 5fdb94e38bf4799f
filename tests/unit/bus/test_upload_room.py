"""The room uploads have left: shared by the uploads one process takes in, refused only on a fresh look.

The store is a fake here (a usage figure the test sets); the same room against a real nats-server is
exercised by tests/integration/control/test_assets.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import pytest

from nvcf_mono.bus import upload_room as upload_room_module
from nvcf_mono.bus.api import StoreUsage
from nvcf_mono.bus.upload_room import UploadRoom, upload_room
from nvcf_mono.config.model import BusSettings, Settings, UploadSettings


class Full(Exception):
    pass


class Store:
    """What the store holds; each look at it is counted."""

    def __init__(self) -> None:
        self.storage = 0
        self.looks = 0

    async def usage(self) -> StoreUsage:
        self.looks += 1
        return StoreUsage(storage=self.storage, memory=0, reserved_storage=0, reserved_memory=0, streams=0, consumers=0)


def room_of(store: Store, size: int = 1000) -> UploadRoom:
    return upload_room(store, Settings(uploads=UploadSettings(store_size=size, reserve=0.0)))  # type: ignore[arg-type]


async def pieces(n: int, size: int, *, pause: anyio.Event | None = None) -> AsyncIterator[bytes]:
    for i in range(n):
        if pause is not None and i == 1:
            await pause.wait()
        yield b"x" * size


async def put(store: Store, held: AsyncIterator[bytes]) -> int:
    """As an object-store put: each piece is stored as it comes; a failed put keeps nothing."""
    kept = 0
    try:
        async for chunk in held:
            store.storage += len(chunk)
            kept += len(chunk)
    except Full:
        store.storage -= kept
        raise
    return kept


async def test_uploads_under_way_share_the_room_rather_than_each_having_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upload_room_module, "REFRESH", 60.0)  # the look each upload starts with is all it gets
    store = Store()
    room = room_of(store)
    assert room is room_of(store)  # one per bus: every upload of the process shares it
    assert await room.left() == 1000
    outcomes: list[str] = []

    async def upload() -> None:
        try:
            await put(store, room.hold(pieces(6, 100), Full))
            outcomes.append("kept")
        except Full:
            outcomes.append("refused")

    async with anyio.create_task_group() as tg:
        for _ in range(3):  # 1800 bytes at once against 1000
            tg.start_soon(upload)
    assert "refused" in outcomes and store.storage <= 1000, (outcomes, store.storage)


async def test_a_declared_upload_takes_its_room_whole_before_its_first_byte() -> None:
    store = Store()
    room = room_of(store)
    pause = anyio.Event()
    first = room.hold(pieces(6, 100, pause=pause), Full, declared=600)
    async with aclosing(first):
        assert await anext(first) == b"x" * 100  # under way: 600 promised, 100 of it brought and stored
        store.storage = 100
        assert await room.left() == 400
        with pytest.raises(Full):  # a second one of 600 does not fit beside it: refused before a byte
            await anext(room.hold(pieces(6, 100), Full, declared=600))
        pause.set()
        assert len(b"".join([chunk async for chunk in first])) == 500
    store.storage = 600  # what the first stored
    assert await room.left() == 400  # nothing left promised
    # One given up early gives back what it promised.
    early = room.hold(pieces(3, 100), Full, declared=300)
    async with aclosing(early):
        await anext(early)
    assert await room.left() == 400


async def test_a_refusal_is_made_on_a_fresh_look_and_credit_counts_what_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upload_room_module, "REFRESH", 60.0)
    store = Store()
    room = room_of(store)
    assert await put(store, room.hold(pieces(9, 100), Full)) == 900
    store.storage = 0  # that upload's content was deleted meanwhile (by another node, say)
    looks = store.looks
    assert await put(store, room.hold(pieces(5, 100), Full)) == 500  # past the estimate: looked again
    assert store.looks > looks
    # New content for an asset of 400 frees the old: 900 fits where 500 are stored (the old 400 among them).
    assert await put(store, room.hold(pieces(9, 100), Full, credit=400)) == 900
    with pytest.raises(Full):
        await put(store, room.hold(pieces(1, 100), Full))


async def test_without_a_known_store_size_nothing_is_refused() -> None:
    store = Store()
    external = Settings(bus=BusSettings(url="nats://nats.example:4222"), uploads=UploadSettings(store_size=None))
    room = upload_room(store, external)  # type: ignore[arg-type]
    assert await room.left() is None
    assert await put(store, room.hold(b"x" * 10_000, Full)) == 10_000
