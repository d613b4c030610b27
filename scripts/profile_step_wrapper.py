"""Where a one-token forward's host time goes outside the model (issue 54): the demo target, one
request prefilled, then `--steps` one-token forwards of the engine's own parts, each timed alone.

    PYTHONPATH=. python scripts/profile_step_wrapper.py --steps 300 --threads 2

Rows: positions (Backend.position_ids), the decoder stack's call outside its forward (hooks, the
engine's contexts), the LM head's call and cast outside its forward, and `keep` (dropping the step's
temporary cache entries, what a drafter does after each tree). Milliseconds per step, idle machine.
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch

from lvspec_eval.backends import linear_state
from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding.stats import ForwardClock
from lvspec_eval.measure.bench import make_samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    backend = load_backend("demo")
    sample = make_samples("synthvid_caption", 1)[0]
    state, _ = backend.prefill(backend.prepare(sample["prompt"], [sample["video"].request()]))
    token, offsets = torch.tensor([5]), torch.zeros(1, dtype=torch.long)
    text, head = backend.text_model(), backend.model.lm_head
    clock = ForwardClock([text, head])
    spent: dict[str, float] = {}

    def timed(name: str, fn, inside: bool = False):
        before, t0 = clock.seconds, time.perf_counter()
        out = fn()
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0 - (clock.seconds - before if inside else 0.0)
        return out

    def step() -> None:
        positions = timed("positions", lambda: backend.position_ids(state.extra, state.next_pos + offsets))

        def decoder():
            with linear_state.temporary(linear_state.PLAIN), contextlib.nullcontext():
                return text(input_ids=token.view(1, -1), position_ids=positions, attention_mask=None,
                            cache=state.cache, use_cache=True)

        out = timed("decoder call, outside its forward", decoder, inside=True)
        timed("LM head call and cast, outside its forward", lambda: head(out.last_hidden_state[0]).float(), inside=True)
        state.temp_len += 1
        timed("keep (drop the temporary entries)", lambda: backend.keep(state, 0))

    with clock:
        for _ in range(30):
            step()
        spent.clear()
        clock.seconds = 0.0
        for _ in range(args.steps):
            step()
    print(f"| part of a one-token step | ms |\n|---|---|")
    for name, seconds in spent.items():
        print(f"| {name} | {seconds / args.steps * 1e3:.3f} |")
    print(f"| the model's forwards | {clock.seconds / args.steps * 1e3:.3f} |")


if __name__ == "__main__":
    main()
