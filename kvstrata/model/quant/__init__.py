"""The quantized-weight path: a GGUF's own blocks, run without a dense copy.

    blocks.py      GGUF block types -> IntWeight (w = scale * q + bias per group), exactly as the file says
    int_dot.py     IntWeight -> tiles of our integer-dot kernels (csrc/int_dot_*.cpp), and their ops
    linear.py      a layer's four linears on those tiles (parts of mixed types), or on torch_int4.py
    torch_int4.py  Q4_0/Q4_1 on torch's CPU int4 kernel, where ours has no vector form
    int8_head.py   the LM head in int8 with exact rescoring of each row's top candidates
    q4_head.py     the LM head's candidates in 4-bit blocks on the int-dot kernels (--head-bits 4)
    gguf_rows.py   rows of the embedding / LM head read from the file (csrc/gguf_rows.cpp)
    plan.py        which of these a model runs (--q4-decode, --prefill-weights, --activation-bits,
                   --head-bits) and the start-up plan line
"""
