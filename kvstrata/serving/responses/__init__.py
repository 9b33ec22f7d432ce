"""`POST /v1/responses`: the subset of OpenAI's Responses API the OpenAI Agents SDK uses to run an
agent loop with function tools (request.py: fields and their mapping onto a chat request;
output.py: output items, the response object and its stream events; store.py: responses kept for
`previous_response_id`; route.py: the route)."""
