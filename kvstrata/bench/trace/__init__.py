"""`kvstrata bench trace`: Mooncake FAST'25 traces read, turned into token-id prompts, replayed live against a
server, or simulated through the real KV cache code at given tier capacities."""
