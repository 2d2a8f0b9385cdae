"""Generate tests/fixtures/hf_olmo3_tiny, a tiny OLMo 3 (Olmo3ForCausalLM) saved by Hugging Face
transformers with the per-token losses transformers computes with it, in the form
tests/fixtures/hf_llama_tiny has.

    python3 tests/hf/make_olmo3_fixture.py [OUT_DIR]   # default: tests/fixtures/hf_olmo3_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_olmo3_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. OLMo 3 is
OLMo 2 (its norms on the attention's and the MLP's outputs, QK-norm over the whole
projections) with a sliding window on three layers in four, the fourth attending to every
key. The fixture has four layers (Olmo3Config's default layer_types: sliding, sliding,
sliding, full) and a window of 5 keys at 16 positions (OLMo 3 7B's 4096 at 8192 before its
long-context stage), so that the window leaves out keys of most queries and a model that
windows the wrong layers fails the losses. Its 4 query heads share 2 key/value heads, as OLMo
3 32B's 40 share 8, so its q_norm is twice as wide as its k_norm.
"""

import os
import sys

import torch
from make_llama_fixture import TINY, T, randomized, save
from transformers import Olmo3Config, Olmo3ForCausalLM


def tiny_olmo3() -> Olmo3ForCausalLM:
    torch.manual_seed(1)  # seed 0's greedy generations repeat one token; seed 1's vary
    config = Olmo3Config(
        **{**TINY, "num_hidden_layers": 4},
        max_position_embeddings=T,
        rope_theta=500000.0,
        rms_norm_eps=1e-6,
        attention_bias=False,
        tie_word_embeddings=False,
        pad_token_id=None,
        sliding_window=5,
    )
    assert config.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    return randomized(Olmo3ForCausalLM, config)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_olmo3_tiny")
    save(tiny_olmo3(), out, None, script="make_olmo3_fixture.py")


if __name__ == "__main__":
    main()
