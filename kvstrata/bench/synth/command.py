"""`kvstrata bench synth-model --shape llama-3.2-1b --quant Q4_K_M [--out FILE]`.

Writes the shape's random weights as Q8_0 blocks (no float16 intermediate: an 8B one would be 16 GB),
then has llama.cpp's own `llama-quantize` requantize them to the file type asked for, so the file mixes
block types exactly as a downloaded Q4_K_M or Q5_K_M does. `--direct` instead writes every weight in
one block type (Q4_0 ... Q6_K) without llama-quantize (the tests' small models). `llama-quantize` comes
from `bench/peers/build_llama_server.sh` (.peers/llama.cpp/bin/), or `--llama-quantize PATH`.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from kvstrata.bench.synth.shapes import SHAPES
from kvstrata.bench.synth.writer import write_gguf
from kvstrata.model.quant.blocks import BLOCK_TYPES

PEER_QUANTIZE = Path(".peers/llama.cpp/bin/llama-quantize")


def add_synth_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b", help="model shape (default: %(default)s)")
    parser.add_argument("--quant", default="Q4_K_M",
                        help="file type: any llama-quantize type (Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0, ...), or with "
                             f"--direct one block type ({', '.join(sorted(BLOCK_TYPES))}) (default: %(default)s)")
    parser.add_argument("--direct", action="store_true", help="write --quant blocks directly (no llama-quantize)")
    parser.add_argument("--out", type=Path, help="output file (default: models/<shape>-<quant>.gguf)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer-from", default="smollm2", help="a GGUF (or model name) whose tokenizer to copy")
    parser.add_argument("--llama-quantize", type=Path, help=f"llama-quantize binary (default: {PEER_QUANTIZE} or PATH)")
    parser.add_argument("--chat-template", type=Path,
                        help="a Jinja file to write as the chat template instead of the tokenizer GGUF's (e.g. "
                             "bench/templates/chatml-tools.jinja, which renders tools)")
    parser.add_argument("--ends-replies", action="store_true",
                        help="rig the weights so replies end after a few tokens (synth/ending.py), for agent CLIs "
                             "that refuse replies cut by max_tokens (`kvstrata bench agents`)")


def find_quantize(given: Path | None) -> Path | None:
    if given is not None:
        return given
    if PEER_QUANTIZE.is_file():
        return PEER_QUANTIZE
    found = shutil.which("llama-quantize")
    return Path(found) if found else None


def end_of_turn_id(tokenizer_gguf: Path) -> int:
    """The token the copied chat template ends a turn with (ChatML's <|im_end|>), else the GGUF's eos."""
    from kvstrata.model.tokenizer import END_OF_TURN_TOKENS, Tokenizer

    tok = Tokenizer.from_path(tokenizer_gguf)
    source = tok.chat_template.source if tok.chat_template is not None else ""
    for name in END_OF_TURN_TOKENS:
        if name in source and (found := tok.token_to_id(name)) is not None:
            return found
    return tok.eos_token_ids[0]


def run_synth_model(args: argparse.Namespace) -> int:
    from kvstrata.model.fetch import resolve_model

    shape = SHAPES[args.shape]
    quant = args.quant.upper()
    out: Path = args.out or Path("models") / f"{args.shape}-{quant}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = resolve_model(args.tokenizer_from)
    start = time.perf_counter()
    eos = end_of_turn_id(tokenizer) if args.ends_replies else None
    template = args.chat_template.read_text(encoding="utf-8") if args.chat_template else None
    if args.direct or quant == "Q8_0":
        if quant not in BLOCK_TYPES:
            print(f"--direct writes one block type ({', '.join(sorted(BLOCK_TYPES))}), not {quant}", file=sys.stderr)
            return 2
        if eos is not None and quant != "Q8_0":
            print("--ends-replies rigs Q8_0 blocks: use --quant Q8_0, or a llama-quantize type", file=sys.stderr)
            return 2
        write_gguf(out, shape, lambda name: quant, tokenizer, args.seed, eos, template)
    else:
        quantize = find_quantize(args.llama_quantize)
        if quantize is None:
            print(f"no llama-quantize: run bench/peers/build_llama_server.sh (it builds {PEER_QUANTIZE}), pass "
                  "--llama-quantize PATH, or --direct with one block type", file=sys.stderr)
            return 2
        source = out.with_name(out.stem + ".q8_0.tmp.gguf")
        try:
            write_gguf(source, shape, lambda name: "Q8_0", tokenizer, args.seed, eos, template)
            done = subprocess.run([str(quantize), "--allow-requantize", str(source), str(out), quant],
                                  capture_output=True, text=True)
        finally:
            source.unlink(missing_ok=True)
        if done.returncode != 0:
            print(f"llama-quantize failed ({done.returncode}): {done.stderr.strip()[-800:]}", file=sys.stderr)
            return 1
    size = out.stat().st_size
    print(f"{out}: {args.shape} ({shape.params() / 1e9:.2f} B params) {quant}, {size / 2**20:.0f} MiB, "
          f"{time.perf_counter() - start:.0f} s")
    return 0
