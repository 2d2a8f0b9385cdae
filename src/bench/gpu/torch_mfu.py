"""PyTorch's time for the training step `pipetrain bench gpu` measures: GPT-2 of the same
shape (pre-LN blocks, tanh GELU, learned positions, LM head tied to the token embedding),
the same micro batch and microbatches per step, AdamW, on the same GPU. Attention is
PyTorch's own scaled_dot_product_attention, causal. Run by pipetrain with one argument, a
JSON object of the shape (with "compile": true, the model goes through torch.compile first);
prints one JSON line: {"step_s": median seconds, "peak_bytes": the CUDA allocator's peak}
or {"error": why}.
"""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.wte = nn.Embedding(s["vocab"], s["hidden"])
        self.wpe = nn.Embedding(s["seq"], s["hidden"])
        self.blocks = nn.ModuleList(Block(s["hidden"], s["heads"]) for _ in range(s["layers"]))
        self.ln_f = nn.LayerNorm(s["hidden"])

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def main():
    s = json.loads(sys.argv[1])
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device"}))
        return
    torch.manual_seed(0)
    model = Gpt(s).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if s.get("compile"):
        model = torch.compile(model)
    bf16 = s["precision"] == "bf16"
    data = torch.randint(0, s["vocab"], (s["micro_batch"], s["seq"] + 1), device="cuda")

    def step():
        for _ in range(s["microbatches"]):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                logits = model(data[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, s["vocab"]), data[:, 1:].reshape(-1))
            (loss / s["microbatches"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    times = []
    for _ in range(s["steps"]):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    print(json.dumps({"step_s": times[len(times) // 2], "peak_bytes": torch.cuda.max_memory_allocated()}))


if __name__ == "__main__":
    main()
