"""Anthropic's Messages API (`/v1/messages`), an adapter in and out of the chat path:

    request.py      the request model, and the chat request it becomes
    cache_hints.py  the client's session id and cache_control breakpoints, in the engine's terms
    output.py       content blocks, stop_reason and usage of a reply
    stream.py       Anthropic's event stream
    errors.py       errors in Anthropic's shape and statuses
    route.py        the routes
"""
