"""Tokens per second of `kvbudget tokens` over a generated JSON Lines request log of at least 100 MB
(streamed, chat template applied), beside its limit: the tokenizer's own `encode_batch` over the same prompts
rendered beforehand (what counting costs if reading, parsing and rendering were free). Prints figures; asserts
nothing.

    python benchmarks/bench_tokens.py [--mb 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from kvbudget.tokens import PromptCounter, iter_lines

WORDS = ("the quick brown fox jumps over lazy dog retrieval augmented generation passages cache tokens "
         "memory sequence layer attention window context budget engine request latency throughput").split()


def make_tokenizer(folder: Path) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=["<|user|>", "<|system|>", "<|assistant|>",
                                                                    "<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rng = random.Random(0)
    tok.train_from_iterator((" ".join(rng.choices(WORDS, k=40)) for _ in range(5000)), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    fast.save_pretrained(folder)


def make_log(path: Path, megabytes: int) -> int:
    rng = random.Random(1)
    target, lines = megabytes * 2**20, 0
    with path.open("w") as fh:
        while fh.tell() < target:
            docs = "\n\n".join(" ".join(rng.choices(WORDS, k=rng.randint(50, 400))) for _ in range(rng.randint(1, 6)))
            request = {"messages": [{"role": "system", "content": "Answer from the passages."},
                                    {"role": "user", "content": docs + "\nQuestion: what matters?"}],
                       "max_tokens": rng.choice([64, 256, 1024])}
            fh.write(json.dumps(request) + "\n")
            lines += 1
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, log = Path(tmp) / "tok", Path(tmp) / "requests.jsonl"
        make_tokenizer(folder)
        lines = make_log(log, args.mb)
        size = log.stat().st_size
        counter = PromptCounter(folder)
        rendered = [counter.render(json.loads(line)["messages"]) for line in iter_lines(str(log))]
        backend = counter.tokenizer.backend_tokenizer

        def ours() -> tuple[float, float]:
            start = time.perf_counter()
            stats = counter.count_jsonl(iter_lines(str(log)))
            return stats.prompt_tokens.mean * stats.count, time.perf_counter() - start

        def raw(name: str) -> tuple[float, float]:  # the Rust tokenizer alone, pre-rendered, batches of 256
            encode = getattr(backend, name)
            start = time.perf_counter()
            counted = sum(len(e) for i in range(0, len(rendered), 256)
                          for e in encode(rendered[i:i + 256], add_special_tokens=False))
            return counted, time.perf_counter() - start

        runs: dict[str, list[float]] = {"ours": [], "encode_batch": [], "encode_batch_fast": []}
        counts = set()
        for _ in range(args.rounds):  # alternating, so a slow spell of the machine hits every one alike
            for name, times in runs.items():
                counted, seconds = ours() if name == "ours" else raw(name)
                times.append(seconds)
                counts.add(round(counted))
        assert len(counts) == 1, counts  # the same counts every way
        tokens = counts.pop()
        seconds = statistics.median(runs["ours"])
        stats = counter.count_jsonl(iter_lines(str(log)))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
        print(f"log: {size / 2**20:,.0f} MiB, {lines:,} chat requests")
        print(f"counted {tokens:,.0f} prompt tokens in {seconds:.1f} s: {tokens / seconds:,.0f} tokens/s, "
              f"{stats.count / seconds:,.0f} requests/s, {size / 2**20 / seconds:.1f} MiB/s")
        print(f"prompt tokens: mean {stats.prompt_tokens.mean:,.0f}, p99 {stats.prompt_tokens.p99:,}; "
              f"peak RSS of the process {rss:,.0f} MiB (the limit's pre-rendered prompts included)")
        limit = tokens / statistics.median(runs["encode_batch"])
        fast = tokens / statistics.median(runs["encode_batch_fast"])
        print(f"limit: tokenizers' encode_batch on the pre-rendered prompts {limit:,.0f} tokens/s "
              f"(encode_batch_fast {fast:,.0f}); kvbudget tokens / limit = {tokens / seconds / limit:.2f} "
              f"(target >= 1.2); medians of {args.rounds} alternating rounds")


if __name__ == "__main__":
    main()
