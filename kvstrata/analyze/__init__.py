"""`kvstrata analyze`: why a request log misses the prefix cache, and what to change."""
