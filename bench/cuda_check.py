"""CUDA path check: a tiny random Llama, float32 and bf16, kvstrata vs transformers on the GPU.

Four prompts share a 300-token prefix (prefill dedup, cascade decode attention); greedy tokens must be
the same batched, alone, from the prefix cache, and (float32) as transformers'. Sampled requests
(temperature, top-k, top-p; noise and seeded generators on the GPU) must run beside greedy ones, and a
seeded request must give the same tokens alone, in a batch, and again. Run where a GPU is:
`python bench/cuda_check.py TOKENIZER_DIR` (a folder with the SmolLM2 tokenizer.json,
tokenizer_config.json and chat_template.jinja, e.g. from `AutoTokenizer.from_pretrained(...,
gguf_file=...).save_pretrained(DIR)`). Prints PASS or FAIL.
"""
import random
import shutil
import sys
import time

import torch

sys.path.insert(0, ".")
from transformers import LlamaConfig, LlamaForCausalLM
from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams
out = "/tmp/tiny"
torch.manual_seed(0)
cfg = dict(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
           num_key_value_heads=2, max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=True,
           bos_token_id=1, eos_token_id=2)
ref = LlamaForCausalLM(LlamaConfig(**cfg))
ref.save_pretrained(out)
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(f"{sys.argv[1]}/{f}", out)
ref = ref.to("cuda").eval()
rng = random.Random(0)
system = [rng.randrange(3, 49000) for _ in range(300)]
prompts = [system + [rng.randrange(3, 49000) for _ in range(10 + 7 * i)] for i in range(4)]
G = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
ok = True
with torch.inference_mode():
    want = []
    for p in prompts:
        ids = ref.generate(torch.tensor([p], device="cuda"), max_new_tokens=24, do_sample=False, min_new_tokens=24)
        want.append(ids[0, len(p):].tolist())
for dtype in ("float32", "bfloat16"):
    llm = LLM(out, device="cuda", dtype=dtype, max_total_tokens=8192)
    print(dtype, "uses_quant", llm.engine.model.uses_quant)
    t = time.time(); together = [o.token_ids for o in llm.generate(prompts, G)]; dt = time.time() - t
    alone = [llm.generate([p], G)[0].token_ids for p in prompts]
    again = [o.token_ids for o in llm.generate(prompts, G)]  # now from the prefix cache
    llm.engine.check_integrity()
    same_ref = sum(a == b for a, b in zip(together, want))
    print(f"{dtype}: batch==alone {together == alone}, cached==uncached {again == together}, =transformers {same_ref}/4, {dt:.2f}s")
    if dtype == "float32":
        ok &= together == alone == again and same_ref == 4
    # sampling on the GPU: seeded rows repeat whatever shares their batch; unseeded rows just run
    seeded = [SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, top_k=50, seed=s, ignore_eos=True) for s in (1, 2)]
    loose = SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True)
    mixed = llm.generate(prompts[:2], seeded[0])[:1] + llm.generate(prompts[1:2], seeded[1])
    for i, (p, sp) in enumerate(zip(prompts, [seeded[0], seeded[1], loose, G])):
        llm.engine.add_request(f"mix-{i}", p, sp)
    got: dict[str, list[int]] = {}
    while llm.engine.has_unfinished():
        for o in llm.engine.step():
            assert o.error is None, o.error
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    repeat = [llm.generate([prompts[0]], seeded[0])[0].token_ids, llm.generate([prompts[1]], seeded[1])[0].token_ids]
    sampled_ok = (got["mix-0"] == mixed[0].token_ids == repeat[0] and got["mix-1"] == mixed[1].token_ids == repeat[1]
                  and len(got["mix-2"]) == 24 and got["mix-3"] == together[3] and got["mix-0"] != together[0])
    llm.engine.check_integrity()
    print(f"{dtype}: sampled+seeded ran on the GPU; seeded rows repeat alone/batched/again: {sampled_ok}")
    if dtype == "float32":  # bf16 logits move with the batch shape, so only float32 must repeat exactly
        ok &= sampled_ok
    del llm
print("CUDA CHECK", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
