"""LMCache's multi-round QA (`kvstrata bench multiround`): users with a shared system prompt and their own
history, driven by the agentic driver."""
