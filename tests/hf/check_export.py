"""Load a pipetrain export (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, NemotronForCausalLM, StableLmForCausalLM, GemmaForCausalLM,
Olmo2ForCausalLM or Phi3ForCausalLM) in
transformers and print what it computes.

    pipetrain export --checkpoint RUN --hf OUT
    python3 tests/hf/check_export.py OUT [val.bin] [--windows N --seq-length T]

Prints the sum of the logits for a fixed input and, given a token file (positional or
--data), the mean loss over its first N non-overlapping windows, the figure `pipetrain eval
--checkpoint OUT --data val.bin --windows N --seq-length T` prints: the two should agree to
about 1e-5.
Needs torch and transformers; not part of CI.
"""

import argparse

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def windows(path: str, n: int, t: int) -> torch.Tensor:
    """The first n windows of t + 1 tokens (window k starts at k * t) of an llm.c .bin file."""
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[0] == 20240520 and header[1] == 1, f"{path}: not a token file"
    tokens = np.fromfile(path, dtype="<u2", offset=1024)
    assert len(tokens) == header[2] and len(tokens) >= n * t + 1, f"{path}: too few tokens"
    return torch.tensor(np.stack([tokens[k * t : k * t + t + 1] for k in range(n)]).astype(np.int64))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("bin", nargs="?", help="a token file (.bin); same as --data")
    p.add_argument("--data")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--seq-length", type=int)
    a = p.parse_args()
    a.data = a.data or a.bin

    model, info = AutoModelForCausalLM.from_pretrained(a.dir, attn_implementation="eager", output_loading_info=True)
    model.eval()
    # from_pretrained fills a tensor the files lack with its random init and only warns, so a
    # misnamed or missing tensor in the export would otherwise go unseen.
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"{a.dir}: {problems}"
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert tied == model.config.tie_word_embeddings, f"tie_word_embeddings is {model.config.tie_word_embeddings}"
    vocab, n_pos = model.config.vocab_size, model.config.max_position_embeddings
    fixed = torch.tensor([[50256, 464, 1266, 286, 1243, 13, 632, 373][: n_pos]]) % vocab
    with torch.no_grad():
        print(f"logits sum {model(fixed).logits.double().sum().item():.6f} for input {fixed.tolist()[0]}")
        if a.data:
            t = a.seq_length or n_pos
            w = windows(a.data, a.windows, t)
            # Mean over all windows' tokens: every window has t targets, so this equals the
            # mean of per-window means that pipetrain eval prints.
            loss = model(w[:, :-1], labels=None).logits.log_softmax(-1)
            nll = -loss.gather(-1, w[:, 1:, None]).squeeze(-1)
            print(f"mean loss {nll.double().mean().item():.6f} over {a.windows} windows of {t} tokens")


if __name__ == "__main__":
    main()
