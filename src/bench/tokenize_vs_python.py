#!/usr/bin/env python3
"""`pipetrain tokenize` against Hugging Face `tokenizers` and `tiktoken` in Python, with the same
tokenizer (GPT-2's BPE), on one generated JSONL file (which pipetrain writes as shards), in one
run: tokens per second (and per core) and each process's peak resident memory.

    python3 src/bench/tokenize_vs_python.py [--mb 200] [--threads N] [--work DIR]

Needs `pip install tokenizers tiktoken` and a release build (target/release/pipetrain). Nothing
is downloaded: GPT-2's vocabulary comes from the tiktoken-rs crate in the cargo registry
(encoder.json and vocab.bpe, which are GPT-2's vocab.json and merges.txt; r50k_base.tiktoken
for tiktoken). The JSONL is the shipped corpus's paragraphs in a seeded shuffle, repeated to
the size asked. The Rust and Python sides of each implementation (tiktoken, tokenizers) must
produce the same number of tokens, or the run fails. (The two implementations of GPT-2's BPE
differ on a few whitespace runs, by about 15 tokens in a million.)
"""
import argparse
import glob
import json
import os
import platform
import random
import subprocess
import sys
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# GPT-2's pre-tokenizer pattern (tiktoken's r50k_base).
R50K_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
BATCH = 1000  # documents per Python batch call
SHARD_TOKENS = "10000000"  # pipetrain writes shards, about 5 for 200 MB


def assets():
    found = glob.glob(os.path.expanduser("~/.cargo/registry/src/*/tiktoken-rs-*/assets"))
    if not found:
        sys.exit("tiktoken-rs is not in the cargo registry: run `cargo build --release` first")
    return sorted(found)[-1]


def make_jsonl(path, mb):
    if os.path.exists(path) and os.path.getsize(path) >= mb * 1_000_000:
        return
    text = open(os.path.join(ROOT, "data/corpus/train.txt"), encoding="utf-8").read()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    rng = random.Random(0)
    size = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        while size < mb * 1_000_000:
            doc = "\n\n".join(rng.sample(paragraphs, rng.randint(1, 12)))
            line = json.dumps({"text": doc}) + "\n"
            f.write(line)
            size += len(line.encode("utf-8"))
    os.replace(path + ".tmp", path)


def make_hf_tokenizer(path, asset_dir):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    bpe = models.BPE.from_file(os.path.join(asset_dir, "encoder.json"), os.path.join(asset_dir, "vocab.bpe"))
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tok.save(path)


def run_measured(cmd, env=None):
    """Runs cmd; returns (seconds, peak RSS in MB, stdout)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        sys.exit(f"{' '.join(cmd)} failed ({status})")
    return seconds, usage.ru_maxrss / 1024, out.decode()


def python_child(kind, jsonl, threads, tok_path, asset_dir):
    """One contender in its own process: prints the token count."""
    if kind == "tokenizers":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tok_path)
        encode = lambda texts: sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    else:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        enc = tiktoken.Encoding(
            "gpt2",
            pat_str=R50K_PATTERN,
            mergeable_ranks=load_tiktoken_bpe(os.path.join(asset_dir, "r50k_base.tiktoken")),
            special_tokens={"<|endoftext|>": 50256},
        )
        encode = lambda texts: sum(len(t) for t in enc.encode_ordinary_batch(texts, num_threads=threads))
    total, batch = 0, []
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            batch.append(json.loads(line)["text"])
            if len(batch) == BATCH:
                total += encode(batch)
                batch = []
    total += encode(batch) if batch else 0
    print(total)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--work", default=os.path.join(ROOT, "runs/tokenize-bench"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    asset_dir = assets()
    jsonl = os.path.join(args.work, "docs.jsonl")
    tok_path = os.path.join(args.work, "gpt2-tokenizer.json")
    if args.child:
        return python_child(args.child, jsonl, args.threads, tok_path, asset_dir)

    os.makedirs(args.work, exist_ok=True)
    make_jsonl(jsonl, args.mb)
    make_hf_tokenizer(tok_path, asset_dir)
    size = os.path.getsize(jsonl)
    docs = sum(1 for _ in open(jsonl, "rb"))
    binary = os.path.join(ROOT, "target/release/pipetrain")
    n = str(args.threads)
    # Hugging Face tokenizers parallelises encode_batch over RAYON_NUM_THREADS.
    env = dict(os.environ, RAYON_NUM_THREADS=n, TOKENIZERS_PARALLELISM="true")
    # (name, implementation, command): the same implementation must give the same tokens.
    contenders = [
        ("pipetrain tokenize --tokenizer gpt2 (tiktoken-rs)", "tiktoken", [binary, "tokenize", jsonl, os.path.join(args.work, "a.bin"), "--force", "--quiet", "--threads", n, "--shard-tokens", SHARD_TOKENS]),
        ("pipetrain tokenize --tokenizer gpt2-tokenizer.json (tokenizers crate)", "tokenizers", [binary, "tokenize", jsonl, os.path.join(args.work, "b.bin"), "--force", "--quiet", "--threads", n, "--shard-tokens", SHARD_TOKENS, "--tokenizer", tok_path]),
        ("Python tokenizers encode_batch", "tokenizers", [sys.executable, __file__, "--work", args.work, "--threads", n, "--child", "tokenizers"]),
        ("Python tiktoken encode_ordinary_batch", "tiktoken", [sys.executable, __file__, "--work", args.work, "--threads", n, "--child", "tiktoken"]),
    ]
    import tiktoken
    import tokenizers

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu}, {os.cpu_count()} cores, {n} threads each")
    print(f"input: {size / 1e6:.0f} MB JSONL, {docs} documents; tokenizers {tokenizers.__version__}, tiktoken {tiktoken.__version__}")
    print(f"{'contender':<72} {'tokens':>11} {'s':>7} {'MB/s':>7} {'tok/s':>11} {'tok/s/core':>11} {'peak RSS MB':>12}")
    counts = {}
    for name, implementation, cmd in contenders:
        seconds, rss, out = run_measured(cmd, env)
        if cmd[0] == binary:
            # The summary counts one <|endoftext|> per document; the others count text tokens.
            tokens = int(out.split(": ", 1)[1].split(" tokens")[0]) - docs
        else:
            tokens = int(out.strip())
        counts.setdefault(implementation, set()).add(tokens)
        rate = tokens / seconds
        print(f"{name:<72} {tokens:>11} {seconds:>7.1f} {size / 1e6 / seconds:>7.1f} {rate:>11.0f} {rate / args.threads:>11.0f} {rss:>12.0f}")
    for implementation, seen in counts.items():
        if len(seen) != 1:
            sys.exit(f"the {implementation} contenders disagree on the token count: {sorted(seen)}")


if __name__ == "__main__":
    main()
