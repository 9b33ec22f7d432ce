"""ResponseStore (serving/responses/store.py): a response is found only by its own tenant, and
another tenant's lookup answers exactly as for an id that never existed."""
from __future__ import annotations

from kvstrata.serving.responses.store import ResponseStore

TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_a_response_belongs_to_its_tenant() -> None:
    store = ResponseStore()
    store.put("alice", "resp_1", TURN)
    assert store.get("alice", "resp_1") == TURN
    assert store.get("bob", "resp_1") is None and store.get(None, "resp_1") is None
    assert store.get("bob", "resp_1") == store.get("bob", "resp_never")  # no oracle
    store.put(None, "resp_2", TURN)  # authentication off: one anonymous owner
    assert store.get(None, "resp_2") == TURN and store.get("alice", "resp_2") is None


def test_least_recently_used_is_dropped_first() -> None:
    store = ResponseStore(max_responses=2)
    store.put("a", "r1", TURN)
    store.put("a", "r2", TURN)
    assert store.get("a", "r1") is not None  # r1 is now the most recent
    store.put("b", "r3", TURN)
    assert store.get("a", "r2") is None and store.get("a", "r1") is not None and len(store) == 2
