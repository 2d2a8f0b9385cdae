"""Generate tests/fixtures/hf_qwen2_tiny, a tiny Qwen2 (Qwen2ForCausalLM), and its sibling
hf_mistral_tiny, a tiny Mistral (MistralForCausalLM), each saved by Hugging Face transformers
with the per-token losses transformers computes with it, in the form tests/fixtures/hf_llama_tiny
has.

    python3 tests/hf/make_qwen2_mistral_fixtures.py [OUT_DIR]   # default: tests/fixtures/hf_qwen2_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_qwen2_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. Qwen2 is a
Llama whose q, k and v projections alone have biases (Megatron's disable_bias_linear with
add_qkv_bias). The shape is Qwen2.5 0.5B's in miniature: grouped-query attention (4 query
heads sharing 2 key/value heads), rope_theta 1000000, rms_norm_eps 1e-6, the output layer
tied to the embedding. The biases are drawn large (std 0.5) beside weights of std 0.2, so
that a model which drops them, or puts one on the output projection, fails the losses.

Mistral is a Llama but for its sliding window; the fixture has none (sliding_window null, as
Mistral 7B v0.3), rope_theta 1000000, rms_norm_eps 1e-5, an output layer of its own, and
weights drawn as the Qwen2's are. Its sibling hf_mistral_nemo_tiny is Mistral Nemo in
miniature: heads of 16 at a width of 32 over 4 heads (Nemo's 128 at 5120 over 32), so the
attention's output (64 wide) is not the residual's width and o_proj is [32, 64]. And
hf_mistral_v01_tiny is Mistral 7B v0.1 in miniature: a sliding window of 5 keys on every
layer at 16 positions (v0.1's 4096 at 32768), its losses over sequences of 16 tokens, so
that the window leaves out keys of most queries.
"""

import os
import sys

import torch
from make_llama_fixture import TINY, T, randomized, save
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        **TINY,
        max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    model = randomized(Qwen2ForCausalLM, config, biases=("q_proj", "k_proj", "v_proj"))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def tiny_mistral(head_dim: int | None = None, sliding_window: int | None = None) -> MistralForCausalLM:
    torch.manual_seed(0)
    config = MistralConfig(
        **TINY,
        head_dim=head_dim,
        max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        sliding_window=sliding_window,
    )
    return randomized(MistralForCausalLM, config)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_qwen2_tiny")
    save(tiny_qwen2(), out, None, script="make_qwen2_mistral_fixtures.py")
    fixtures = os.path.dirname(os.path.abspath(out))
    save(tiny_mistral(), os.path.join(fixtures, "hf_mistral_tiny"), None, script="make_qwen2_mistral_fixtures.py")
    nemo = tiny_mistral(head_dim=16)
    assert nemo.model.layers[0].self_attn.o_proj.weight.shape == (32, 64)
    save(nemo, os.path.join(fixtures, "hf_mistral_nemo_tiny"), None, script="make_qwen2_mistral_fixtures.py")
    v01 = tiny_mistral(sliding_window=5)
    save(v01, os.path.join(fixtures, "hf_mistral_v01_tiny"), None, script="make_qwen2_mistral_fixtures.py")


if __name__ == "__main__":
    main()
