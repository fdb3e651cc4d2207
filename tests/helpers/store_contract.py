"""The contract of :mod:`wal.store` that every store must keep, as a base class: a test module
subclasses :class:`StoreContract` and gives it a ``store`` fixture (a fresh, empty store)."""

from __future__ import annotations

import threading

import pytest

from wal.errors import StoreUnavailable


class StoreContract:
    """Publish once, read whole, list in key order, delete."""

    def test_a_created_object_reads_back_whole(self, store):
        assert store.create("seals/00000000000000000001.seal", b"seal one\n") is True
        assert store.read("seals/00000000000000000001.seal") == b"seal one\n"

    def test_a_key_is_published_once_and_the_first_object_stays(self, store):
        assert store.create("a/b.seg", b"first") is True
        assert store.create("a/b.seg", b"second") is False
        assert store.read("a/b.seg") == b"first"

    def test_of_writers_racing_for_one_key_exactly_one_wins_and_its_bytes_stay(self, store):
        results: dict[int, bool] = {}
        barrier = threading.Barrier(6)

        def writer(i: int) -> None:
            barrier.wait()
            results[i] = store.create("race/seal", f"writer {i} ".encode() * 1000)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [i for i, won in results.items() if won]
        assert len(results) == 6 and len(winners) == 1, results
        assert store.read("race/seal") == f"writer {winners[0]} ".encode() * 1000
        assert store.list("race") == ["race/seal"]          # no temp file left behind

    def test_an_empty_object_is_an_object(self, store):
        assert store.create("empty", b"") is True
        assert store.read("empty") == b""
        assert store.create("empty", b"x") is False

    def test_a_missing_key_reads_as_none(self, store):
        assert store.read("nothing/here") is None

    def test_list_gives_every_key_under_a_prefix_in_key_order(self, store):
        for key in ("segments/2/b.seg", "segments/10/a.seg", "segments/2/a.seg",
                    "seals/2.seal", "target.json"):
            assert store.create(key, key.encode())
        assert store.list("segments") == ["segments/10/a.seg", "segments/2/a.seg",
                                          "segments/2/b.seg"]
        assert store.list() == ["seals/2.seal", "segments/10/a.seg", "segments/2/a.seg",
                                "segments/2/b.seg", "target.json"]
        assert store.list("nowhere") == []

    def test_delete_folder_keeps_what_is_in_it_and_drops_it_once_empty(self, store):
        store.create("segments/00000000000000000007/a.seg", b"a")
        store.delete_folder("segments/00000000000000000007")       # not empty: kept whole
        assert store.read("segments/00000000000000000007/a.seg") == b"a"
        store.delete("segments/00000000000000000007/a.seg")
        store.delete_folder("segments/00000000000000000007")
        store.delete_folder("segments/00000000000000000007")       # gone: harmless
        assert store.list("segments") == []
        assert store.create("segments/00000000000000000007/b.seg", b"b") is True

    def test_delete_removes_and_a_second_delete_is_harmless(self, store):
        store.create("x/y", b"1")
        store.delete("x/y")
        assert store.read("x/y") is None
        store.delete("x/y")
        assert store.create("x/y", b"2") is True     # the name is free again

    def test_delete_many_removes_the_keys_named_and_nothing_else(self, store):
        for key in ("s/1/a.seg", "s/1/b.seg", "s/1/c.seg", "s/10/a.seg", "t.json"):
            store.create(key, b"x")
        store.delete_many(["s/1/a.seg", "s/1/c.seg", "s/1/never.seg"])   # an absent key: fine
        assert store.list() == ["s/1/b.seg", "s/10/a.seg", "t.json"]
        store.delete_many([])
        store.delete_many(["s/1/b.seg"])
        assert store.list("s/1") == []

    def test_a_recursive_delete_folder_takes_everything_under_it_and_nothing_beside(self, store):
        for key in ("segments/00000000000000000007/a.seg", "segments/00000000000000000007/b.seg",
                    "segments/00000000000000000007/deeper/c", "segments/000000000000000000070/a.seg",
                    "seals/00000000000000000007/1.seal"):
            store.create(key, b"x")
        store.delete_folder("segments/00000000000000000007", recursive=True)
        assert store.list() == ["seals/00000000000000000007/1.seal",
                                "segments/000000000000000000070/a.seg"]
        store.delete_folder("segments/00000000000000000007", recursive=True)  # gone: harmless
        assert store.create("segments/00000000000000000007/a.seg", b"again") is True

    @pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a"])
    def test_a_key_that_is_not_a_plain_relative_path_is_refused(self, store, key):
        with pytest.raises(ValueError, match="bad store key"):
            store.create(key, b"x")


def assert_unavailable(store) -> None:
    """A store whose server is gone: every call fails as StoreUnavailable (transient)."""
    for call in (lambda: store.create("k", b"v"), lambda: store.read("k"),
                 lambda: store.list(), lambda: store.delete("k"),
                 lambda: store.delete_many(["k", "l"]),
                 lambda: store.delete_folder("f", recursive=True)):
        with pytest.raises(StoreUnavailable):
            call()
