"""Tool calls and structured outputs on Chat Completions: formats (parsers per family), rendering
of tools and calls into prompts, validation, and the grammars constrained decoding follows."""
