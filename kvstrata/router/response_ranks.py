"""ResponseRanks: which rank stored a /v1/responses answer, for the turns that chain to it.

A rank keeps the conversations it answered (serving/responses/store.py), so a request with
`previous_response_id` must go back to that rank. The rank names each response in the
`RESPONSE_ID_HEADER` header; the gateway remembers (tenant, id) -> rank, the most recently used
`MAX_IDS` of them, and sends the next turn there while that rank is ready. Keyed by tenant: an id
guessed by another tenant routes as an unknown id does, so `x-kvstrata-rank` tells it nothing.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

MAX_IDS = 65536


class ResponseRanks:
    def __init__(self, max_ids: int = MAX_IDS) -> None:
        self.max_ids = max_ids
        self._ranks: OrderedDict[tuple[str | None, str], int] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, tenant: str | None, response_id: str, rank: int) -> None:
        with self._lock:
            self._ranks[(tenant, response_id)] = rank
            self._ranks.move_to_end((tenant, response_id))
            while len(self._ranks) > self.max_ids:
                self._ranks.popitem(last=False)

    def rank_of(self, tenant: str | None, response_id: object) -> int | None:
        """The rank that stored `response_id` for `tenant`, or None (unknown, forgotten, not a string)."""
        if not isinstance(response_id, str):
            return None
        with self._lock:
            rank = self._ranks.get((tenant, response_id))
            if rank is not None:
                self._ranks.move_to_end((tenant, response_id))
            return rank

    def __len__(self) -> int:
        return len(self._ranks)
