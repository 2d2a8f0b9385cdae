"""Generate tests/fixtures/hf_stablelm_tiny, a tiny StableLM 2 (StableLmForCausalLM) saved by
Hugging Face transformers with the per-token losses transformers computes with it, in the
form tests/fixtures/hf_llama_tiny has; and tests/fixtures/stablelm_config.json, the
config.json transformers writes for StableLM 2 1.6B's shape.

    python3 tests/hf/make_stablelm_fixture.py [OUT_DIR]   # default: tests/fixtures/hf_stablelm_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_stablelm_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. StableLM 2
is a Llama with LayerNorms (with biases), biases on q, k and v, and a rotary embedding on a
quarter of each head. The shape is StableLM 2 1.6B's in miniature: heads of 16 (its 64), a
quarter of each turning, 4 query heads over 2 key/value heads. Every LayerNorm weight and bias
and every q, k, v bias is drawn random, so a model that takes RMSNorm for LayerNorm, drops a
bias or turns the whole head fails the losses.
"""

import json
import os
import sys

import torch
from make_fixture import versions
from make_llama_fixture import TINY, T, randomized, save
from transformers import StableLmConfig, StableLmForCausalLM

BIASES = ("input_layernorm", "post_attention_layernorm", "norm", "q_proj", "k_proj", "v_proj")


def tiny_stablelm() -> StableLmForCausalLM:
    torch.manual_seed(0)
    config = StableLmConfig(
        **{**TINY, "hidden_size": 64},
        max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        layer_norm_eps=1e-5,
        use_qkv_bias=True,
        qk_layernorm=False,
        use_parallel_residual=False,
        tie_word_embeddings=False,
    )
    model = randomized(StableLmForCausalLM, config, biases=BIASES)
    attention = model.model.layers[0].self_attn
    assert attention.head_dim == 16 and attention.rotary_ndims == 4, (attention.head_dim, attention.rotary_ndims)
    assert attention.o_proj.bias is None and model.model.layers[0].mlp.gate_proj.bias is None
    return model


def write_default_config(path: str) -> None:
    """StableLM 2 1.6B's shape: 24 layers of 2048, 32 heads, SwiGLU of 5632, 100352 tokens."""
    config = StableLmConfig(
        vocab_size=100352,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        use_qkv_bias=True,
        bos_token_id=100257,
        eos_token_id=100257,
    )
    with open(path, "w") as f:
        body = {"generated_by": "tests/hf/make_stablelm_fixture.py", **versions()}
        json.dump({**body, "config": json.loads(config.to_json_string())}, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_stablelm_tiny")
    save(tiny_stablelm(), out, None, script="make_stablelm_fixture.py")
    write_default_config(os.path.join(os.path.dirname(os.path.abspath(out)), "stablelm_config.json"))


if __name__ == "__main__":
    main()
