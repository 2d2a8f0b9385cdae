"""Generate tests/fixtures/hf_qwen2_tiny: a tiny Qwen2 (Qwen2ForCausalLM) saved by Hugging Face
transformers, with the per-token losses transformers computes with it, in the form
tests/fixtures/hf_llama_tiny has.

    python3 tests/hf/make_qwen2_fixture.py [OUT_DIR]   # default: tests/fixtures/hf_qwen2_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_qwen2_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. Qwen2 is a
Llama whose q, k and v projections alone have biases (Megatron's disable_bias_linear with
add_qkv_bias). The shape is Qwen2.5 0.5B's in miniature: grouped-query attention (4 query
heads sharing 2 key/value heads), rope_theta 1000000, rms_norm_eps 1e-6, the output layer
tied to the embedding. The biases are drawn large (std 0.5) beside weights of std 0.2, so
that a model which drops them, or puts one on the output projection, fails the losses.
"""

import os
import sys

import torch
from make_llama_fixture import BATCH, T, VOCAB, save
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
    )
    config._attn_implementation = "eager"
    model = Qwen2ForCausalLM(config).eval()
    biases = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.4 * torch.randn_like(p))
            elif name.endswith(".bias"):
                biases.append(name.split(".")[-2])
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    assert sorted(set(biases)) == ["k_proj", "q_proj", "v_proj"], biases
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_qwen2_tiny")
    save(tiny_qwen2(), out, None, script="make_qwen2_fixture.py")


if __name__ == "__main__":
    main()
