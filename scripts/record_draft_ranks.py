"""Record what a draft says along its target's answers, for the policy's hindsight replay
(lvspec_eval/measure/policy_replay.py, tests/test_policy_hindsight.py).

    python scripts/record_draft_ranks.py --target T --draft D --prompts builtin --limit 4 \
        --max-new-tokens 64 --name realpair_builtin --out tests/fixtures/policy_recordings.json

Per prompt: the target's greedy answer (our vanilla loop), then one draft forward over prompt and
answer (teacher forcing): per answer position the draft's rank of the target's token (NUM_RANKS where
beyond its NUM_RANKS best) and its NUM_RANKS best probabilities. The set is added to --out under
--name (other sets there are kept). The held-out set is refused: the policy is never tuned on it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding.runner import Runner
from lvspec_eval.measure import prompts as bench_prompts
from lvspec_eval.measure.policy_replay import (
    NUM_RANKS,
    Recording,
    load_recordings,
    save_recordings,
)


@torch.no_grad()
def record(runner: Runner, draft, prompt: str, max_new_tokens: int) -> Recording:
    answer = runner.generate(prompt, [], max_new_tokens).tokens
    ids = runner.target.prepare(prompt, []).input_ids  # [1, prompt]
    full = torch.cat([ids, torch.tensor([answer[:-1]], dtype=ids.dtype)], dim=1)
    logits = draft.model(input_ids=full).logits[0, ids.shape[1] - 1:].float()  # [answer, vocab]
    probs = logits.softmax(-1)
    top = probs.topk(NUM_RANKS, dim=-1).values.tolist()
    target = torch.tensor(answer)
    ranks = (logits > logits.gather(1, target[:, None])).sum(-1).clamp(max=NUM_RANKS).tolist()
    return Recording(tuple(ranks), tuple(tuple(row) for row in top))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", default="builtin")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.prompts == "heldout":
        raise ValueError("--prompts heldout: the held-out set is never recorded for tuning; use builtin or a file")
    torch.set_num_threads(args.threads)
    runner = Runner(args.target, "vanilla")
    draft = load_backend(args.draft)
    recs = [record(runner, draft, p_, args.max_new_tokens) for p_ in bench_prompts.load(args.prompts)[:args.limit]]
    sets = load_recordings(args.out) if Path(args.out).is_file() else {}
    save_recordings(args.out, {**sets, args.name: recs})
    print(f"{args.name}: {len(recs)} answers, {sum(len(r.ranks) for r in recs)} positions, top-1 agreement "
          f"{sum(r.ranks.count(0) for r in recs) / sum(len(r.ranks) for r in recs):.3f} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
