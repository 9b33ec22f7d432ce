"""The agentic workload (`kvstrata bench agentic`): seeded agent sessions with tool schemas, the driver that
interleaves their turns against a server, the scan of one-off prompts beside them, and the cache-hostile
variants `kvstrata analyze` is tested on."""
