"""Generate tests/fixtures/hf_gemma_tiny, a tiny Gemma (GemmaForCausalLM) saved by Hugging Face
transformers with the per-token losses transformers computes with it, in the form
tests/fixtures/hf_llama_tiny has; and tests/fixtures/gemma_config.json, the config.json
transformers writes for GemmaConfig's defaults (Gemma 7B's shape).

    python3 tests/hf/make_gemma_fixture.py [OUT_DIR]   # default: tests/fixtures/hf_gemma_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_gemma_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. Gemma is a
Llama whose RMSNorms scale by 1 + weight, whose MLP is GeGLU (the tanh GELU on the gate), and
whose embeddings are multiplied by sqrt(hidden_size), the output layer tied to them. The shape
is Gemma 2B's in miniature: multi-query attention (4 query heads over 1 key/value head), heads
of 16 at a width of 32 (Gemma 7B's heads of 256 are wider than 3072 / 16 too). The norm
weights are drawn about 0 (+- 0.4), so a model that scales by the weight rather than 1 +
weight, drops the embedding multiplier or takes SiLU for the gate fails the losses.
"""

import json
import os
import sys

import torch
from make_fixture import versions
from make_llama_fixture import TINY, T, randomized, save
from transformers import GemmaConfig, GemmaForCausalLM


def tiny_gemma() -> GemmaForCausalLM:
    torch.manual_seed(0)
    config = GemmaConfig(
        **{**TINY, "num_key_value_heads": 1},
        head_dim=16,
        max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        hidden_act="gelu_pytorch_tanh",
        attention_bias=False,
        tie_word_embeddings=True,
        pad_token_id=None,
    )
    model = randomized(GemmaForCausalLM, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # zero-centred: the norm scales by 1 + weight
                p.copy_(0.4 * torch.randn_like(p))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.model.layers[0].self_attn.o_proj.weight.shape == (32, 64)
    return model


def write_default_config(path: str) -> None:
    """GemmaConfig's defaults: Gemma 7B's shape."""
    config = json.loads(GemmaConfig().to_json_string())
    with open(path, "w") as f:
        json.dump({"generated_by": "tests/hf/make_gemma_fixture.py", **versions(), "config": config}, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_gemma_tiny")
    save(tiny_gemma(), out, None, script="make_gemma_fixture.py")
    write_default_config(os.path.join(os.path.dirname(os.path.abspath(out)), "gemma_config.json"))


if __name__ == "__main__":
    main()
