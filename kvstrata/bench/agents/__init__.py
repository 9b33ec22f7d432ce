"""`kvstrata bench agents`: Claude Code and Codex, headless, against each engine on the same GGUF.

    clients.py  the CLIs: environment, one turn, its outcome
    proxy.py    the measuring proxy every engine is timed through (TTFT, prompt and cached tokens)
    command.py  the run: engines x clients x sessions x turns, the restart over the file L3, the report
"""
