"""`kvstrata bench perplexity`: a text's perplexity on any OpenAI-compatible server through `echo` and
`logprobs`, scored window by window the way llama.cpp's `llama-perplexity` scores (windows.py), with the
tool itself run beside it on request (llama.py)."""
