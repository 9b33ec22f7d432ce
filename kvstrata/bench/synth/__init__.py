"""`kvstrata bench synth-model`: random-weight GGUF models of real shapes, so anyone can measure the
models users bring (1B-8B, K-quants) without downloading weights. A random-weight model decodes at the
speed of a trained one of its shape: speed depends on shapes and block types, not on the values.

    shapes.py         the shapes (Llama 3.2 1B/3B, Llama 3.1 8B, Qwen2.5 7B, a tiny one for tests)
    random_blocks.py  random GGUF blocks of any type our kernels run (valid float16 scales)
    writer.py         a GGUF written tensor by tensor (never the whole model in memory), tokenizer copied
    command.py        the CLI: write Q8_0 (or one block type) directly, then `llama-quantize` to a file type
"""
