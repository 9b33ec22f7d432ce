"""synth/writer.py: a random-weight GGUF of a shape loads as that shape (Qwen3's q/k norms, head size and
YaRN keys included) and generates."""
from __future__ import annotations

from pathlib import Path

from kvstrata.bench.synth.shapes import SHAPES
from kvstrata.bench.synth.writer import write_gguf
from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.model.weights import load_weights


def test_a_qwen3_shape_with_yarn_loads_as_written(tmp_path: Path, smollm2_path: Path) -> None:
    shape = SHAPES["tiny-qwen3"]
    path = tmp_path / "tiny-qwen3.gguf"
    write_gguf(path, shape, lambda name: "Q8_0", smollm2_path)
    arch = load_weights(path).arch
    assert (arch.architecture, arch.hidden_size, arch.num_layers, arch.num_heads, arch.num_kv_heads) == \
        ("qwen3", shape.hidden, shape.layers, shape.heads, shape.kv_heads)
    assert arch.head_dim == 128 != shape.hidden // shape.heads and arch.qk_norm and arch.tie_word_embeddings
    assert arch.max_position == 32768
    assert dict(arch.rope_scaling or ()) == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}
    llm = LLM(str(path), dtype="float32", max_total_tokens=4096, max_model_len=32768)
    out = llm.generate([list(range(100, 400))], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4


def test_ends_replies_makes_sampled_replies_short(tmp_path: Path, smollm2_path: Path) -> None:
    from kvstrata.bench.synth.command import end_of_turn_id

    path = tmp_path / "ending.gguf"
    eos = end_of_turn_id(smollm2_path)
    write_gguf(path, SHAPES["tiny-qwen3"], lambda name: "Q8_0", smollm2_path, ends_replies=eos)
    assert not load_weights(path).arch.tie_word_embeddings  # the head is its own tensor
    llm = LLM(str(path), dtype="float32", max_total_tokens=8192, max_model_len=4096)
    params = [SamplingParams(max_tokens=300, temperature=1.0, seed=s) for s in range(16)]
    outs = [llm.generate([list(range(500 + 9 * s, 800 + 9 * s))], p)[0] for s, p in enumerate(params)]
    lengths = sorted(len(o.token_ids) for o in outs)
    assert all(o.finish_reason == "stop" for o in outs), lengths  # each ended by itself
    assert lengths[8] <= 30, lengths


def test_a_chat_template_file_replaces_the_copied_one(tmp_path: Path, smollm2_path: Path) -> None:
    from kvstrata.model.tokenizer import Tokenizer

    template = Path(__file__).resolve().parents[3] / "bench/templates/chatml-tools.jinja"
    path = tmp_path / "tools.gguf"
    write_gguf(path, SHAPES["tiny"], lambda name: "Q8_0", smollm2_path, chat_template=template.read_text())
    tok = Tokenizer.from_path(path)
    tool = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[tool])
    assert "<tools>" in text and '"read_file"' in text and text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token_ids == Tokenizer.from_path(smollm2_path).eos_token_ids  # <|im_end|> still ends a turn
