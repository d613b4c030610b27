"""A noisy neighbour for speed runs: another process decoding with a real model on the same cores.

    python scripts/noisy_neighbour.py MODEL_DIR [--seconds 3600] [--threads 2]

Loads the model with transformers (any causal or Qwen2.5-VL checkpoint; text only) and decodes
greedily, request after request, until `--seconds` have passed or it is killed; prints one line per
request (tokens/s), so a log shows it was busy. `make bench-realpair NEIGHBOUR=1` starts it beside
the benchmark (scripts/bench_realpair.sh) and stops it afterwards.
"""
from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForImageTextToText, AutoTokenizer

PROMPT = "Write a Python function that parses a CSV file and returns the rows as dictionaries."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 (default: half the memory of float32) or float32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).eval()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    end = time.monotonic() + args.seconds
    print("neighbour: decoding", flush=True)
    while time.monotonic() < end:
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=args.max_new_tokens, do_sample=False)
        n = out.shape[1] - ids["input_ids"].shape[1]
        print(f"neighbour: {n} tokens, {n / (time.perf_counter() - t):.2f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
