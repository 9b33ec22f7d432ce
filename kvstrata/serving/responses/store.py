"""Responses kept for `previous_response_id`: bounded, in memory, least recently used dropped."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

DEFAULT_MAX_RESPONSES = 1024


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES) -> None:
        self.max_responses = max_responses
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        """`conversation`: the chat messages of the whole exchange, this response's output included."""
        with self._lock:
            self._items[response_id] = conversation
            self._items.move_to_end(response_id)
            while len(self._items) > self.max_responses:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        with self._lock:
            found = self._items.get(response_id)
            if found is not None:
                self._items.move_to_end(response_id)
            return None if found is None else list(found)

    def __len__(self) -> int:
        return len(self._items)
