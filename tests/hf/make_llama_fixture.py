"""Generate tests/fixtures/hf_llama_tiny: a tiny Llama (LlamaForCausalLM) saved by Hugging Face
transformers as sharded safetensors with model.safetensors.index.json, and the per-token
losses transformers computes with it, in the form tests/fixtures/hf_tiny has for GPT-2.

    python3 tests/hf/make_llama_fixture.py [OUT_DIR]   # default: tests/fixtures/hf_llama_tiny
    python3 tests/hf/make_generate_fixture.py tests/fixtures/hf_llama_tiny

Also writes OUT_DIR's sibling hf_llama_tiny_rope500k: the same weights with rope_theta 500000
(Llama 3's), saved as one model.safetensors, so a loader that ignores rope_theta (10000 is
transformers' default) or reads only one of the two layouts fails one of them.

And OUT_DIR's sibling hf_llama_tiny_rope_llama3, Llama 3.2 1B in miniature: rope_type "llama3"
(factor 32, low and high frequency factors 1 and 4, 8192 original positions) at rope_theta
500000, the output layer tied to the embedding, and 128 positions, enough that the blended
band's angles (pair 2 of a head of 8 has a wavelength of about 4400 positions) move by a tenth
of a radian: a loader or a rope that drops the scaling fails it. Its tokenizer.json is Llama
3's in miniature: ids 0..93 the characters ! to ~ (GPT-2's single-byte tokens), 94
<|begin_of_text|>, which its post-processor puts before every text, and 95 <|end_of_text|>.
Beside the fixtures,
llama3_inv_freq.json holds transformers' inv_freq bits for Llama 3.1 8B's and Llama 3.2 1B's
config.json, and Llama 3 8B's unscaled.

Needs torch and transformers (CPU is enough); CI only reads the committed output. The shape
has what separates Llama from GPT-2: grouped-query attention (4 query heads sharing 2
key/value heads), a SwiGLU width that is not 4x the model's, no biases, an output layer apart
from the embedding. The weights are random and far from init: every RMSNorm weight is random
(some near 0, some negative), the matrices are wide enough (std 0.2) that attention is far
from uniform, and the embedding and output layer are drawn separately, so a mistake in any of
them shows in the losses.
"""

import json
import os
import struct
import sys

import torch
from make_fixture import losses_on_a_stream, summary, versions, write_json
from tokenizers import Tokenizer, decoders, models, processors
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

VOCAB, T, BATCH = 96, 16, 2
# Small enough that the ~85 KB of weights span several shards.
SHARD_SIZE = "40KB"


LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def llama3_rope(rope_theta: float, factor: float) -> dict:
    return {"rope_type": "llama3", "rope_theta": rope_theta, "factor": factor, **LLAMA3_SCALING}


# The shape every tiny fixture shares: 4 query heads over 2 key/value heads, a SwiGLU width
# of 48, the fixture's vocabulary, its last id the end of text.
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    bos_token_id=VOCAB - 1,
    eos_token_id=VOCAB - 1,
)


def tiny_llama(rope_parameters: dict, positions: int = T, tied: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        **TINY,
        head_dim=8,
        max_position_embeddings=positions,
        rope_parameters=rope_parameters,
        rms_norm_eps=1e-5,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=tied,
    )
    model = randomized(LlamaForCausalLM, config)
    head_tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert head_tied == tied, f"head tied: {head_tied}"
    return model


def randomized(cls, config, biases: tuple = ()):
    """The model in eager attention (the documented math: QK^T / sqrt(d), causal mask,
    softmax, times V) with every parameter redrawn far from init: norm weights about
    1 +- 0.4, biases (only on the projections `biases` names) of std 0.5, weights of std 0.2."""
    config._attn_implementation = "eager"
    model = cls(config).eval()
    assert model.config._attn_implementation == "eager"
    drawn = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # input_layernorm, post_attention_layernorm, model.norm
                p.copy_(1.0 + 0.4 * torch.randn_like(p))
            elif name.endswith(".bias"):
                drawn.append(name.split(".")[-2])
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    assert sorted(set(drawn)) == sorted(biases), drawn
    return model


def save(model, out: str, shard_size: str | None, t: int = T, script: str = "make_llama_fixture.py") -> dict:
    os.makedirs(out, exist_ok=True)
    if shard_size:
        model.save_pretrained(out, max_shard_size=shard_size)
    else:
        model.save_pretrained(out)
    expected = {"generated_by": f"tests/hf/{script}", **versions()}
    expected.update(losses_on_a_stream(model, VOCAB, t, BATCH))
    write_json(os.path.join(out, "expected.json"), expected)
    print(f"wrote {out}: {sorted(os.listdir(out))}, {summary(expected)}")
    return expected


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_llama_tiny")
    save(tiny_llama({"rope_type": "default", "rope_theta": 10000.0}), out, SHARD_SIZE)
    shards = [f for f in os.listdir(out) if f.endswith(".safetensors")]
    assert len(shards) >= 2 and os.path.exists(os.path.join(out, "model.safetensors.index.json")), shards
    rope500k = os.path.join(os.path.dirname(os.path.abspath(out)), "hf_llama_tiny_rope500k")
    save(tiny_llama({"rope_type": "default", "rope_theta": 500000.0}), rope500k, None)
    fixtures = os.path.dirname(os.path.abspath(out))
    llama3 = os.path.join(fixtures, "hf_llama_tiny_rope_llama3")
    save(tiny_llama(llama3_rope(500000.0, 32.0), positions=128, tied=True), llama3, None, t=128)
    write_llama3_style_tokenizer(os.path.join(llama3, "tokenizer.json"))
    write_inv_freq(os.path.join(fixtures, "llama3_inv_freq.json"))


def write_llama3_style_tokenizer(path: str) -> None:
    """A character-level tokenizer.json over the fixture's 96 ids with Llama 3's special tokens
    and its post-processor, which begins every text with <|begin_of_text|>."""
    vocab = {chr(33 + i): i for i in range(VOCAB - 2)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    assert tok.token_to_id("<|begin_of_text|>") == VOCAB - 2 and tok.token_to_id("<|end_of_text|>") == VOCAB - 1
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", VOCAB - 2)]
    )
    tok.decoder = decoders.Fuse()
    assert tok.encode("x=y").ids == [VOCAB - 2, 87, 28, 88]
    tok.save(path)
    print(f"wrote {path}")


def write_inv_freq(path: str) -> None:
    """transformers' inv_freq, as f32 bits, for the rotary embeddings of Llama 3 8B (unscaled),
    Llama 3.1 8B (factor 8) and Llama 3.2 1B (factor 32), each built from its config.json's keys."""
    cases = []
    for head_dim, heads, factor in [(128, 32, None), (128, 32, 8.0), (64, 32, 32.0)]:
        rope = llama3_rope(500000.0, factor) if factor else {"rope_type": "default", "rope_theta": 500000.0}
        config = LlamaConfig(
            hidden_size=head_dim * heads,
            num_attention_heads=heads,
            head_dim=head_dim,
            max_position_embeddings=131072,
            rope_parameters=rope,
        )
        inv_freq = LlamaRotaryEmbedding(config).inv_freq
        assert inv_freq.dtype == torch.float32 and inv_freq.shape == (head_dim // 2,)
        bits = [struct.unpack("<I", struct.pack("<f", x))[0] for x in inv_freq.tolist()]
        cases.append({"head_dim": head_dim, "rope_theta": 500000.0, "factor": factor, "inv_freq_bits": bits})
    with open(path, "w") as f:
        json.dump({"generated_by": "tests/hf/make_llama_fixture.py", **versions(), "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
