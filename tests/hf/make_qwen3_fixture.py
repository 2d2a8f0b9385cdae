"""Generate tests/fixtures/hf_qwen3_tiny, a tiny Qwen3 (Qwen3ForCausalLM) saved by Hugging Face
transformers with the per-token losses transformers computes with it, in the form
tests/fixtures/hf_llama_tiny has.

    python3 tests/hf/make_qwen3_fixture.py [OUT_DIR]   # default: tests/fixtures/hf_qwen3_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_qwen3_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. Qwen3 is a
Llama with QK-norm: an RMSNorm over each query head and each key head, before the rotary
embedding (Megatron's qk_layernorm). The shape is Qwen3 0.6B's in miniature: heads of 16 at a
width of 32 over 4 heads (0.6B's 128 at 1024 over 16), grouped-query attention (2 key/value
heads), rope_theta 1000000, rms_norm_eps 1e-6, the output layer tied to the embedding. The
q_norm and k_norm weights are drawn as every norm's (about 1 +- 0.4), so a model that drops
either norm, swaps them or normalises over the wrong axis fails the losses.
"""

import os
import sys

import torch
from make_llama_fixture import TINY, T, randomized, save
from transformers import Qwen3Config, Qwen3ForCausalLM


def tiny_qwen3() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        **TINY,
        head_dim=16,
        max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        attention_bias=False,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    model = randomized(Qwen3ForCausalLM, config)
    attention = model.model.layers[0].self_attn
    assert attention.q_norm.weight.shape == (16,) and attention.o_proj.weight.shape == (32, 64)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_qwen3_tiny")
    save(tiny_qwen3(), out, None, script="make_qwen3_fixture.py")


if __name__ == "__main__":
    main()
