"""Write FIXTURE_DIR/generate.json: the tokens transformers' greedy `generate(do_sample=False)`
produces from a committed tiny model (the GPT-2 of hf_tiny or the Llama of hf_llama_tiny),
for tests/generate_cli.rs.

    python3 tests/hf/make_generate_fixture.py [FIXTURE_DIR]   # default: tests/fixtures/hf_tiny

Needs torch and transformers (CPU is enough); CI only reads the committed output. The model
never stops at its end-of-text token here (pipetrain generates the tokens asked for), and
each prompt is given as the single-byte GPT-2 tokens its text encodes to, which the
fixture's 96-token vocabulary holds. Where the fixture has a tokenizer.json, the prompt is
what that tokenizer makes of the text (`tokenizer(text)`, its post-processor's special tokens
included) and each case also holds `tokenizer.decode` of the whole output.
"""

import os
import sys

import torch
from make_fixture import versions, write_json
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

# (prompt text, its GPT-2 BPE tokens, new tokens): byte tokens are the byte minus 33, and
# the pre-tokenizer splits letters from punctuation, so nothing merges.
CASES = [("!", [0], 15), ("x=y", [87, 28, 88], 13), ("Q", [48], 6)]


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    fixture = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "hf_tiny")
    model = AutoModelForCausalLM.from_pretrained(fixture, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None
    tokenizer_json = os.path.join(fixture, "tokenizer.json")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json) if os.path.exists(tokenizer_json) else None
    cases = []
    for text, prompt, new in CASES:
        assert all(ord(ch) - 33 == t for ch, t in zip(text, prompt)), text
        if tokenizer:
            encoded = tokenizer(text)["input_ids"]
            assert encoded[len(encoded) - len(prompt) :] == prompt, (text, encoded)
            prompt = encoded
        assert len(prompt) + new <= model.config.max_position_embeddings
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=0,
                return_dict_in_generate=True,
                output_scores=True,
            )
        tokens = out.sequences[0, len(prompt) :].tolist()
        assert len(tokens) == new, tokens
        # Every choice clear of the runner-up, so fp32 rounding elsewhere cannot flip it.
        margin = min((lambda top: (top[0] - top[1]).item())(s[0].topk(2).values) for s in out.scores)
        assert margin > 1e-3, (text, margin)
        case = {"prompt": text, "prompt_tokens": prompt, "new_tokens": tokens}
        if tokenizer:
            case["text"] = tokenizer.decode(prompt + tokens, clean_up_tokenization_spaces=False)
        cases.append(case)

    path = os.path.join(fixture, "generate.json")
    write_json(path, {"generated_by": "tests/hf/make_generate_fixture.py", **versions(), "greedy": cases})
    print(f"wrote {path}: {[c['new_tokens'] for c in cases]}")


if __name__ == "__main__":
    main()
