"""Write a Hugging Face safetensors copy of a GGUF model (what vLLM needs to serve the same weights).

`python -m kvstrata.bench.compare.export_hf [--model smollm2] [--out .peers/smollm2-hf]`
"""
from __future__ import annotations

import argparse
from pathlib import Path


def export_hf(model: str, out: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvstrata.model.fetch import resolve_model

    if (out / "config.json").exists():
        return out
    path = resolve_model(model)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    hf.hf_quantizer.remove_quantization_config(hf)  # else: "quantized with gguf and not serializable"
    tmp = out.with_name(out.name + ".tmp")
    hf.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(tmp)
    tmp.rename(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--out", default=".peers/smollm2-hf")
    ns = p.parse_args()
    print(export_hf(ns.model, Path(ns.out)))


if __name__ == "__main__":
    main()
