"""The response cache: repeated requests answered from memory, without the model.

Inner to outer, each module importing only those before it:
- `cache.py` (`ResponseCache`, an LRU of keys to short result lists) and `single_flight.py` know
  nothing of HTTP or requests;
- `key.py`: a request's canonical key (the validated body of `serving/protocol.py`);
- `replay.py`: what is stored for a request and how a hit is answered (JSON or SSE);
- `header.py`: the `x-kvstrata-cache` header, and the middleware that marks error answers `bypass`;
- `service.py`: the HTTP edge the routes call (hit, miss or bypass, said in that header).
"""
from __future__ import annotations

from kvstrata.serving.response_cache.cache import ResponseCache
from kvstrata.serving.response_cache.single_flight import SingleFlight

__all__ = ["ResponseCache", "SingleFlight"]
