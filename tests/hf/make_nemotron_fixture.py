"""Generate tests/fixtures/hf_nemotron_tiny, a tiny Nemotron (NemotronForCausalLM) saved by
Hugging Face transformers with the per-token losses transformers computes with it, in the
form tests/fixtures/hf_llama_tiny has; and tests/fixtures/nemotron_config.json, the
config.json transformers writes for NemotronConfig's defaults (Nemotron-4 15B's shape) with 8
key/value heads, as Nemotron-4 15B has.

    python3 tests/hf/make_nemotron_fixture.py [OUT_DIR]   # default: tests/fixtures/hf_nemotron_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_nemotron_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. Nemotron is
NVIDIA's Megatron-trained family (Nemotron-4, Minitron): LayerNorm1P (a LayerNorm with a bias
that scales by 1 + weight), squared ReLU on one projection, a rotary embedding on half of
each head, no linear biases, an output layer of its own. The shape is Minitron 8B's in
miniature: heads of 16 at a width of 32 over 4 heads (Minitron's 128 at 4096 over 48), 2
key/value heads. The LayerNorm1P weights are drawn about 0 (+- 0.4) and their biases about 0
(+- 0.5), so a model that scales by the weight rather than 1 + weight, drops the bias,
rotates the whole head or takes GELU for squared ReLU fails the losses.
"""

import json
import os
import sys

import torch
from make_fixture import versions
from make_llama_fixture import TINY, T, randomized, save
from transformers import NemotronConfig, NemotronForCausalLM

NORM_BIASES = ("input_layernorm", "post_attention_layernorm", "norm")


def tiny_nemotron() -> NemotronForCausalLM:
    torch.manual_seed(0)
    config = NemotronConfig(
        **TINY,
        head_dim=16,
        max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        norm_eps=1e-5,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
    )
    model = randomized(NemotronForCausalLM, config, biases=NORM_BIASES)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # zero-centred: the norm scales by 1 + weight
                p.copy_(0.4 * torch.randn_like(p))
    layer = model.model.layers[0]
    assert layer.self_attn.o_proj.weight.shape == (32, 64) and layer.mlp.up_proj.weight.shape == (48, 32)
    assert config.hidden_act == "relu2"
    return model


def write_default_config(path: str) -> None:
    """NemotronConfig's defaults, Nemotron-4 15B's shape, with its 8 key/value heads."""
    config = json.loads(NemotronConfig(num_key_value_heads=8).to_json_string())
    with open(path, "w") as f:
        json.dump({"generated_by": "tests/hf/make_nemotron_fixture.py", **versions(), "config": config}, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_nemotron_tiny")
    save(tiny_nemotron(), out, None, script="make_nemotron_fixture.py")
    write_default_config(os.path.join(os.path.dirname(os.path.abspath(out)), "nemotron_config.json"))


if __name__ == "__main__":
    main()
