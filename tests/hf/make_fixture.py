"""Generate tests/fixtures/hf_tiny: a tiny GPT-2 saved by Hugging Face transformers, and the
per-token losses transformers computes with it, for tests/hf_equivalence.rs.

    python3 tests/hf/make_fixture.py [OUT_DIR]      # default: tests/fixtures/hf_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. The weights
are random but far from GPT-2's init: every bias and every LayerNorm weight and bias is
random, and the matrices are wide enough (std 0.2) that attention is far from uniform and the
losses spread well away from log(vocab), so a mistake in any of them shows in the losses.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, T, BATCH = 96, 16, 2


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_tiny")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=T,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
    )
    config._attn_implementation = "eager"
    # Eager attention is the documented math (QK^T / sqrt(d), causal mask, softmax, times V).
    model = GPT2LMHeadModel(config).eval()
    assert model.config._attn_implementation == "eager"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("lm_head."):
                continue  # tied to transformer.wte.weight
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                if name.endswith(".weight"):
                    p.copy_(1.0 + 0.4 * torch.randn_like(p))  # some near 0, some negative
                else:
                    p.copy_(0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "head not tied"

    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    expected = {"generated_by": "tests/hf/make_fixture.py", **versions()}
    expected.update(losses_on_a_stream(model, VOCAB, T, BATCH))
    write_json(os.path.join(out, "expected.json"), expected)
    print(f"wrote {out}: {summary(expected)}")


def versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def losses_on_a_stream(model, vocab: int, t: int, batch: int) -> dict:
    """A random token stream, its `batch` windows of `t` tokens and the per-token losses
    `model` computes on them (fp32 forward, cross entropy in fp64)."""
    # One stream of batch * t + 1 tokens; sequence b reads stream[b*t : b*t+t] and predicts the
    # next token of each, so `pipetrain eval` on a .bin of this stream sees the same windows.
    g = torch.Generator().manual_seed(1)
    stream = torch.randint(0, vocab, (batch * t + 1,), generator=g)
    stream[3], stream[20] = 0, vocab - 1  # both ends of the vocabulary
    tokens = torch.stack([stream[b * t : b * t + t] for b in range(batch)])
    targets = torch.stack([stream[b * t + 1 : b * t + t + 1] for b in range(batch)])

    with torch.no_grad():
        logits = model(tokens).logits  # fp32 forward
        losses = F.cross_entropy(logits.double().reshape(-1, vocab), targets.reshape(-1), reduction="none")
        # Window 0 of the stream, computed on its own as `pipetrain eval --windows 1` does.
        w0 = model(stream[None, :t]).logits.double()
        window0 = F.cross_entropy(w0[0], stream[1 : t + 1], reduction="none").mean().item()
    return {
        "stream": stream.tolist(),
        "tokens": tokens.tolist(),
        "targets": targets.tolist(),
        "losses": losses.tolist(),
        "logits_sum": logits.double().sum().item(),
        "eval_window0_mean": window0,
    }


def summary(expected: dict) -> str:
    losses = expected["losses"]
    return f"losses {min(losses):.3f}..{max(losses):.3f}, window 0 mean {expected['eval_window0_mean']:.6f}"


def write_json(path: str, d: dict) -> None:
    with open(path, "w") as f:
        # One key per line, each value on one line (repr of a float reads back exactly).
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in d.items()) + "\n}\n")


if __name__ == "__main__":
    main()
