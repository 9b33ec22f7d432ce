"""`POST /v1/responses`: the subset of OpenAI's Responses API that the OpenAI Agents SDK and Codex CLI
use to run an agent loop with function tools (request.py: fields and their mapping onto a chat
request; tools.py: function, namespace and hosted tools; reasoning_items.py: reasoning items and
their encrypted_content; output.py: output items, the response object and its stream events;
stream.py: the events; store.py: responses kept for `previous_response_id`; route.py: the route)."""
