"""Generate tests/fixtures/hf_phi3_tiny, a tiny Phi-3 (Phi3ForCausalLM) saved by Hugging Face
transformers with the per-token losses transformers computes with it, in the form
tests/fixtures/hf_llama_tiny has, and beside it hf_phi3_partial_tiny.

    python3 tests/hf/make_phi3_fixture.py [OUT_DIR]   # default: tests/fixtures/hf_phi3_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_phi3_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. Phi-3 is a
Llama whose checkpoint holds q, k and v as one tensor (`self_attn.qkv_proj`) and the gate and
up projections as another (`mlp.gate_up_proj`), stacked in Llama's order: pipetrain's own
fused names. Phi-4 (14B) is one without a sliding window or a partial rotation; this is Phi-4
in miniature: grouped-query attention (4 query heads over 2 key/value heads), rope_theta
250000, rms_norm_eps 1e-5, an output layer of its own. The weights are drawn as the Llama
fixture's, so a loader that splits a fused tensor in the wrong place fails the losses.

hf_phi3_partial_tiny is Phi-4 mini in miniature without its longrope: the rotary embedding
turns 6 of each head's 8 channels (partial_rotary_factor 0.75), and the output layer is the
embedding. No Llama class builds it, so pipetrain exports it as the Phi-3 it is, fused.
"""

import os
import sys

import torch
from make_llama_fixture import TINY, T, randomized, save
from transformers import Phi3Config, Phi3ForCausalLM


def tiny_phi3(share: float = 1.0, tied: bool = False) -> Phi3ForCausalLM:
    torch.manual_seed(0)
    config = Phi3Config(
        **TINY,
        max_position_embeddings=T,
        original_max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 250000.0, "partial_rotary_factor": share},
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        sliding_window=None,
        pad_token_id=None,
    )
    model = randomized(Phi3ForCausalLM, config)
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attention.qkv_proj.weight.shape == (64, 32) and mlp.gate_up_proj.weight.shape == (96, 32)
    return model


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_phi3_tiny")
    save(tiny_phi3(), out, None, script="make_phi3_fixture.py")
    partial = os.path.join(os.path.dirname(os.path.abspath(out)), "hf_phi3_partial_tiny")
    save(tiny_phi3(share=0.75, tied=True), partial, None, script="make_phi3_fixture.py")


if __name__ == "__main__":
    main()
