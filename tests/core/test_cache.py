import torch

from cockpit_core import Cache


def test_entries_expire_after_their_step_and_forever_entries_stay():
    cache = Cache()
    cache.put("update_size", "start", torch.zeros(10), expires_after=3)
    cache.put("distance", "initial", torch.zeros(5))
    assert cache.evict(3) == []
    assert len(cache) == 2
    assert cache.evict(4) == [("update_size", "start")]
    assert cache.get("distance", "initial") is not None
    assert cache.keys() == [("distance", "initial")]


def test_keys_are_private_per_owner_and_pop_removes():
    cache = Cache()
    cache.put("a", "k", 1)
    cache.put("b", "k", 2)
    assert cache.get("a", "k") == 1 and cache.get("b", "k") == 2
    assert cache.pop("a", "k") == 1
    assert ("a", "k") not in cache and cache.get("a", "k", "gone") == "gone"


def test_remove_owner_and_nbytes():
    cache = Cache()
    cache.put("q", "x", [torch.zeros(4, dtype=torch.float64), {"y": torch.zeros(2)}])
    cache.put("r", "x", torch.zeros(3))
    assert cache.nbytes() == 4 * 8 + 2 * 4 + 3 * 4
    cache.remove_owner("q")
    assert cache.keys() == [("r", "x")]
