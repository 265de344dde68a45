"""The adapter registry's book and a replica's follower (replicas/serving/adapter_registry.py):
versions, refusals, what a replica loads and unloads, and when it asks the registry."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from replicas.serving import adapter_registry
from replicas.serving.adapter_registry import AdapterBook, AdapterFollower, adapter_changes


def test_the_book_counts_versions_and_refuses_a_taken_name_or_a_full_book() -> None:
    book = AdapterBook(max_loras=2, paths={"a": "/a"})
    assert book.snapshot() == (0, {"a": "/a"})
    assert book.add("b", "/b") == 1
    with pytest.raises(ValueError, match="already loaded"):
        book.add("a", "/a2")
    with pytest.raises(ValueError, match="max_loras=2"):
        book.add("c", "/c")
    assert book.remove("a") == 2 and book.snapshot() == (2, {"b": "/b"})
    with pytest.raises(KeyError):
        book.remove("a")


def test_changes_unload_what_left_or_moved_and_load_what_came() -> None:
    loaded = {"a": "/a", "b": "/b", "c": "/c"}
    wanted = {"a": "/a", "b": "/b2", "d": "/d"}
    assert adapter_changes(loaded, wanted) == (["b", "c"], [("b", "/b2"), ("d", "/d")])


class Registry:
    """A registry handle's ``snapshot.remote()``, counting calls."""

    def __init__(self, book: AdapterBook) -> None:
        self.book, self.calls = book, 0
        self.snapshot = self

    async def remote(self) -> tuple[int, dict[str, str]]:
        self.calls += 1
        return self.book.snapshot()


def test_a_follower_asks_for_every_named_adapter_and_a_stale_view_only(monkeypatch) -> None:
    now = [100.0]
    monkeypatch.setattr(adapter_registry.time, "monotonic", lambda: now[0])
    book = AdapterBook(max_loras=2, paths={"a": "/a"})
    registry, applied = Registry(book), []

    async def apply(loaded: Any, wanted: Any) -> None:
        applied.append((dict(loaded), dict(wanted)))

    follower = AdapterFollower(registry, {"a": "/a"}, apply)

    async def scenario() -> None:
        await follower.follow(None)  # never asked yet: stale
        await follower.follow(None)  # fresh, no adapter named: no call
        assert registry.calls == 1 and applied == [({"a": "/a"}, {"a": "/a"})]
        book.add("b", "/b")
        await follower.follow("b")  # an adapter named: a view fetched after the call
        assert registry.calls == 2 and follower.names == ("a", "b")
        book.remove("a")
        await follower.follow("a")  # read-your-writes: the unload is seen at once
        assert registry.calls == 3 and follower.names == ("b",)
        assert applied[-1] == ({"a": "/a", "b": "/b"}, {"b": "/b"})
        book.add("a", "/a2")
        await follower.follow(None)  # fresh: a base work waits for the view to age
        assert registry.calls == 3 and follower.names == ("b",)
        now[0] += adapter_registry.REFRESH_S
        await follower.follow(None)
        assert registry.calls == 4 and follower.names == ("b", "a")

    asyncio.run(scenario())


def test_waiting_follows_share_the_next_fetch_which_begins_after_them() -> None:
    book = AdapterBook(max_loras=2, paths={})
    started: list[int] = []  # the book's version when each fetch began
    release = asyncio.Event()

    class Slow:
        def __init__(self) -> None:
            self.snapshot = self

        async def remote(self) -> tuple[int, dict[str, str]]:
            started.append(book.version)
            await release.wait()
            return book.snapshot()

    async def apply(loaded: Any, wanted: Any) -> None:
        pass

    follower = AdapterFollower(Slow(), {}, apply)

    async def scenario() -> None:
        first = asyncio.create_task(follower.follow("x"))
        while not started:  # the first fetch under way
            await asyncio.sleep(0)
        book.add("x", "/x")  # a load answered while it runs
        waiting = [asyncio.create_task(follower.follow("x")) for _ in range(5)]
        for _ in range(5):  # every waiting follow has joined the next fetch
            await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, *waiting)
        assert started == [0, 1]  # one more fetch for the five, begun after the load
        assert follower.names == ("x",)

    asyncio.run(scenario())


def test_a_follower_keeps_its_view_while_the_registry_is_away() -> None:
    class Away:
        snapshot = None

        def __init__(self) -> None:
            self.snapshot = self

        async def remote(self) -> Any:
            raise ConnectionError("registry restarting")

    applied: list = []

    async def apply(loaded: Any, wanted: Any) -> None:
        applied.append(wanted)

    follower = AdapterFollower(Away(), {"a": "/a"}, apply)
    asyncio.run(follower.follow("b"))  # asked, unavailable: no change, no error
    assert follower.names == ("a",) and applied == []


class Remote:
    """A handle method's ``.remote(...)`` over a plain function of the book."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    async def remote(self, *args: Any) -> Any:
        return self._fn(*args)


def test_the_model_list_of_every_ingress_follows_a_load_and_an_unload_at_once() -> None:
    """Read-your-writes on ``/v1/models``: an adapter unloaded through one ingress is gone
    from the other's list in its next answer, not after the follower's next refresh."""
    from types import SimpleNamespace

    from app.adapters import AdapterAdmin, LiveNames

    book = AdapterBook(max_loras=2, paths={"ranker": "/r"})
    registry = SimpleNamespace(
        snapshot=Remote(book.snapshot), add=Remote(book.add), remove=Remote(book.remove)
    )
    replica = SimpleNamespace(load_adapter=Remote(lambda name, path: None))
    one, other = (AdapterAdmin("base", LiveNames(["ranker"]), replica, registry) for _ in "ab")
    asyncio.run(one.unload({"lora_name": "ranker"}))
    assert list(other.names) == ["ranker"]  # its follower has not run yet
    asyncio.run(other.current())  # what /v1/models awaits first
    assert list(other.names) == []
    asyncio.run(one.load({"lora_name": "ranker", "lora_path": "/r2"}))
    asyncio.run(other.current())
    assert list(other.names) == ["ranker"]
