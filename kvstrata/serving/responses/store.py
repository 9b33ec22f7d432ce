"""Responses kept for `previous_response_id`: bounded, in memory, least recently used dropped.

Each response belongs to the tenant of the API key that created it (None when authentication is
off): `get` finds it only for that tenant, and answers another tenant exactly as it answers an id
that never existed, so ids are no oracle of other tenants' traffic.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

DEFAULT_MAX_RESPONSES = 1024
_Key = tuple[str | None, str]  # (tenant, response id)


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES) -> None:
        self.max_responses = max_responses
        self._items: OrderedDict[_Key, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, tenant: str | None, response_id: str, conversation: list[dict[str, Any]]) -> None:
        """`conversation`: the chat messages of the whole exchange, this response's output included."""
        key = (tenant, response_id)
        with self._lock:
            self._items[key] = conversation
            self._items.move_to_end(key)
            while len(self._items) > self.max_responses:
                self._items.popitem(last=False)

    def get(self, tenant: str | None, response_id: str) -> list[dict[str, Any]] | None:
        """The stored conversation, or None: unknown, evicted, or another tenant's."""
        key = (tenant, response_id)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return None if found is None else list(found)

    def __len__(self) -> int:
        return len(self._items)
