"""Generate tests/fixtures/hf_olmo2_tiny, a tiny OLMo 2 (Olmo2ForCausalLM) saved by Hugging Face
transformers with the per-token losses transformers computes with it, in the form
tests/fixtures/hf_llama_tiny has.

    python3 tests/hf/make_olmo2_fixture.py [OUT_DIR]   # default: tests/fixtures/hf_olmo2_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_olmo2_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. OLMo 2 is a
Llama whose two norms sit on the attention's and the MLP's outputs, before each joins the
residual stream (post_attention_layernorm, post_feedforward_layernorm), with an RMSNorm over
the whole query projection and the whole key projection (q_norm [NH hs], k_norm [KV hs]).
The shape is OLMo 2 7B's in miniature: as many key/value heads as query heads (4), rope_theta
500000, rms_norm_eps 1e-6, an output layer of its own. The norm weights are drawn as every
norm's (about 1 +- 0.4), so a model that normalises the wrong tensor or over the wrong axis
fails the losses.
"""

import os
import sys

import torch
from make_llama_fixture import TINY, T, randomized, save
from transformers import Olmo2Config, Olmo2ForCausalLM


def tiny_olmo2() -> Olmo2ForCausalLM:
    torch.manual_seed(0)
    config = Olmo2Config(
        **{**TINY, "num_key_value_heads": TINY["num_attention_heads"]},
        max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        rms_norm_eps=1e-6,
        attention_bias=False,
        tie_word_embeddings=False,
        pad_token_id=None,
    )
    model = randomized(Olmo2ForCausalLM, config)
    attention = model.model.layers[0].self_attn
    assert attention.q_norm.weight.shape == (32,) and attention.k_norm.weight.shape == (32,)
    return model


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_olmo2_tiny")
    save(tiny_olmo2(), out, None, script="make_olmo2_fixture.py")


if __name__ == "__main__":
    main()
