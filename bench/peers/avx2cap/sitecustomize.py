"""On the path of the vLLM peer (bench/peers/vllm_serve.sh) under KVSTRATA_CPU_ISA=avx2 only: vLLM picks
its kernel library from torch.cpu's AVX-512 checks, which read the hardware and ignore
ATEN_CPU_CAPABILITY, so on an AVX-512 machine it ran its AVX-512(-BF16) kernels beside our AVX2 ones.
Here both checks say no, and vLLM loads its AVX2 build (vllm/_C_AVX2), as on an AVX2-only CPU."""
import torch.cpu

torch.cpu._is_avx512_supported = lambda: False  # type: ignore[attr-defined]
torch.cpu._is_avx512_bf16_supported = lambda: False  # type: ignore[attr-defined]
