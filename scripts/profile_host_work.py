"""The engine's own host work per decode step, broken down by what it does (issue 54).

For each method, on the demo (the target and draft `lvspec-eval bench` loads, the captions task),
two passes over the same requests after one untimed warm-up request:

1. sections: the engine's functions are wrapped with timers that keep exclusive time (a section's
   time minus the sections it calls), so the table reads as shares of the host work: tree growth,
   masks and positions, the forward wrapper, verification, the host view's one transfer, cache
   compaction, commit, the policy, stats and records, the stop check, and the loop's rest. Model
   forwards (the decoder stacks, LM heads, a drafter's head) and a lazy draft's preparation are
   their own rows and are not host work.
2. counts (load-independent): aten operations dispatched per step outside the models' forwards
   and inside them, host synchronisations per step (decoding/host_sync.py) with where they are
   made, and the operations of the target's one-token forward against its tree forwards.

    PYTHONPATH=. python scripts/profile_host_work.py --limit 5 --max-new-tokens 64 --threads 2
    PYTHONPATH=. python scripts/profile_host_work.py --methods sd_tree --cprofile 25   # + cProfile's top
    PYTHONPATH=. python scripts/profile_host_work.py --options tree=dynamic --skip-timing   # counts, every step drafting

Times are wall clock: compare shares, not milliseconds, on a loaded machine.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lvspec_eval.backends import base, tree_layout, types
from lvspec_eval.backends.loading import load_backend, load_draft
from lvspec_eval.decoding import loop, sage_tree, stats
from lvspec_eval.decoding.drafters import growth, hidden_state, model, sparse_view
from lvspec_eval.decoding.policy import AdaptivePolicy, DraftGate
from lvspec_eval.decoding.runner import Runner
from lvspec_eval.decoding.verifiers import exact, fly, lvspec
from lvspec_eval.measure.bench import _parse_kv, make_samples

METHODS = "vanilla,sd_tree,specvlm,sparrow,fly,lvspec,sage"
MODEL, PREPARATION = "model forward", "draft preparation"


def sections(backend_cls: type) -> list[tuple[object, str, str]]:
    """(owner, attribute, label): every function whose exclusive time is one row of the table."""
    drafters = (model.ModelDrafter, hidden_state.HiddenStateDrafter, sparse_view.SparseViewDrafter, model.NoDrafter)
    rows = [(d, "propose", "drafter (rest of propose)") for d in drafters]
    rows += [(d, "observe", "drafter observe (rest)") for d in drafters]
    rows += [(d, "prepare", PREPARATION) for d in drafters if hasattr(d, "prepare")]
    rows += [(growth.Grower, "grow", "tree growth"), (sage_tree.SageTree, "grow", "tree growth"),
             (growth, "extend_visibility", "masks and positions"),
             (tree_layout, "pending_and_tree_layout", "masks and positions"),
             (tree_layout, "ancestor_mask", "masks and positions"), (base, "additive_mask", "masks and positions"),
             (backend_cls, "position_ids", "masks and positions"),
             (base.Backend, "forward", "forward wrapper (rest)"), (base.Backend, "score", "score (rest)"),
             (base.Backend, "keep", "cache compaction"), (base.Backend, "commit", "commit (rest)"),
             (types, "_transfer", "host view transfer"),
             (stats.SampleStats, "add_step", "stats and records"), (stats.SampleStats, "add_step_time", "stats and records"),
             (loop._TokenRecords, "add", "stats and records"), (loop, "_finished", "stop check")]
    rows += [(v, "verify", "verification (rest)") for v in (exact.ExactVerifier, fly.FlyVerifier, lvspec.LVSpecVerifier)]
    rows += [(growth.TreePlanner, name, "policy") for name in ("next_shape", "observe")]
    rows += [(AdaptivePolicy, name, "policy") for name in ("plan", "observe", "choose_total", "node_value")]
    rows += [(DraftGate, name, "policy") for name in ("decide", "observe")]
    rows += [(sage_tree.SageTree, name, "policy") for name in ("next_shape", "observe")]
    return rows


class Timers:
    """Exclusive wall time per label, over nested wrapped calls."""

    def __init__(self):
        self.total = collections.Counter()
        self._stack: list[list] = []  # [label, start, time in children]

    def wrap(self, fn, label: str):
        def timed(*args, **kwargs):
            self._stack.append([label, time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                name, start, inner = self._stack.pop()
                spent = time.perf_counter() - start
                self.total[name] += spent - inner
                if self._stack:
                    self._stack[-1][2] += spent
        return timed


def patched(pairs, wrap):
    """Wrap each (owner, attribute) with wrap(fn, label); returns the undo list."""
    undo, seen = [], set()
    for owner, name, label in pairs:
        if (owner, name) in seen or name not in vars(owner):
            continue
        seen.add((owner, name))
        original = vars(owner)[name]
        undo.append((owner, name, original))
        setattr(owner, name, wrap(original, label))
    return undo


def restore(undo) -> None:
    for owner, name, original in reversed(undo):
        setattr(owner, name, original)


def wrap_forwards(runner: Runner, wrap) -> list:
    """Wrap the forwards of the modules the loop counts as model work (instance attributes)."""
    modules = loop._forward_modules(runner.target, runner.drafter)
    for module in modules:
        module.forward = wrap(module.forward, MODEL)
    return modules


def unwrap_forwards(modules) -> None:
    for module in modules:
        del module.forward


def run_requests(runner: Runner, samples, max_new_tokens: int) -> list[dict]:
    return [runner.generate(s["prompt"], [s["video"]], max_new_tokens).stats for s in samples]


def time_sections(runner: Runner, samples, max_new_tokens: int) -> tuple[dict, list[dict]]:
    timers = Timers()
    undo = patched(sections(type(runner.target)), timers.wrap)
    modules = wrap_forwards(runner, timers.wrap)
    real_decode = loop._decode

    def decode(*args):
        timers._stack.append(["loop (rest)", time.perf_counter(), 0.0])
        try:
            return real_decode(*args)
        finally:
            name, start, inner = timers._stack.pop()
            timers.total[name] += time.perf_counter() - start - inner

    loop._decode = decode
    try:
        records = run_requests(runner, samples, max_new_tokens)
    finally:
        loop._decode = real_decode
        unwrap_forwards(modules)
        restore(undo)
    return dict(timers.total), records


class OpCounter(TorchDispatchMode):
    """aten operations dispatched, split by whether a model forward is running, and outside the
    forwards by the innermost section running (`label`, kept up to date by the section wrappers)."""

    def __init__(self):
        super().__init__()
        self.inside = self.outside = 0
        self.depth = 0
        self.labels = ["loop (rest)"]
        self.by_label = collections.Counter()
        self.decoding = False

    def decode(self, real_decode):
        """loop._decode, counting while it runs (the decode steps)."""
        def counted(*args):
            self.decoding = True
            try:
                return real_decode(*args)
            finally:
                self.decoding = False
        return counted

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if not self.decoding:  # the prefills and the first token are not a step's work
            pass
        elif self.depth:
            self.inside += 1
        else:
            self.outside += 1
            self.by_label[self.labels[-1]] += 1
        return func(*args, **(kwargs or {}))

    def wrap(self, fn, label: str):
        def labelled(*args, **kwargs):
            self.labels.append(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self.labels.pop()
        return labelled


def count_ops(runner: Runner, samples, max_new_tokens: int) -> dict:
    """Ops per step outside and inside forwards, syncs per step and where, target forwards' ops by size."""
    ops, by_size = OpCounter(), collections.defaultdict(list)
    target_text = runner.target.text_model()

    def wrap(fn, label):
        def counted(*args, **kwargs):
            before, ops.depth = ops.inside, ops.depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                ops.depth -= 1
                if fn.__self__ is target_text and kwargs.get("input_ids") is not None:
                    by_size["1 token" if kwargs["input_ids"].numel() == 1 else "tree"].append(ops.inside - before)
        return counted

    counters = []
    real_counter = getattr(loop, "SyncCounter", None)  # None: code from before the count (a "before" run)

    def keeping():
        counters.append(real_counter(keep_where=True))
        return counters[-1]

    modules = wrap_forwards(runner, wrap)
    undo = patched(sections(type(runner.target)), ops.wrap)
    if real_counter is not None:
        loop.SyncCounter = keeping
    real_decode, loop._decode = loop._decode, ops.decode(loop._decode)
    try:
        with ops:
            records = run_requests(runner, samples, max_new_tokens)
    finally:
        loop._decode = real_decode
        if real_counter is not None:
            loop.SyncCounter = real_counter
        restore(undo)
        unwrap_forwards(modules)
    steps = sum(r["num_steps"] for r in records)
    where = collections.Counter(w for c in counters for w in c.where)
    return {"steps": steps, "ops_outside": ops.outside / steps, "ops_inside": ops.inside / steps,
            "syncs_per_step": statistics.mean(r.get("host_syncs_per_step", float("nan")) for r in records),
            "syncs_max": max(r.get("host_syncs_max_step", -1) for r in records), "where": where.most_common(8),
            "forward_ops": {k: statistics.median(v) for k, v in by_size.items()},
            "ops_by_section": {k: round(v / steps, 1) for k, v in ops.by_label.most_common()}}


def report(method: str, spent: dict, records: list[dict], counts: dict) -> None:
    steps = sum(r["num_steps"] for r in records)
    host = {k: v for k, v in spent.items() if k not in (MODEL, PREPARATION)}
    host_s = sum(host.values())
    print(f"\n## {method}: {steps} steps, tau {statistics.mean(r['tau'] for r in records):.2f}, "
          f"host work {1000 * host_s / steps:.2f} ms/step, model forwards {1000 * spent.get(MODEL, 0) / steps:.2f} ms/step, "
          f"overhead_step_ms (records, median) {statistics.median(r['overhead_step_ms'] for r in records):.2f}")
    print("| section | ms/step | share of host work |\n|---|---|---|")
    for label, seconds in sorted(host.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {1000 * seconds / steps:.3f} | {100 * seconds / host_s:.1f} % |")
    print(f"ops dispatched per step: {counts['ops_outside']:.0f} outside model forwards, {counts['ops_inside']:.0f} inside; "
          f"target forward ops (median): {counts['forward_ops']}")
    print(f"ops per step outside the forwards, by section: {counts['ops_by_section']}")
    print(f"host syncs per step: {counts['syncs_per_step']:.2f} (most in one step: {counts['syncs_max']}); "
          f"where: {counts['where']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--limit", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--options", default="", help="decoding options as model_args, e.g. tree=dynamic (the adaptive "
                                                 "policy drafts less on a loaded machine: a fixed tree drafts every step)")
    p.add_argument("--skip-timing", action="store_true", help="only the load-independent counts")
    p.add_argument("--cprofile", type=int, default=0, help="also print cProfile's top N by cumulative time")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_backend("demo")
    draft = load_draft("demo-draft", None, None, None, device="cpu", dtype="float32")
    samples = make_samples("synthvid_caption", args.limit)
    for method in args.methods.split(","):
        runner = Runner("demo", method, draft="demo-draft", target_backend=target, draft_backend=draft,
                        options=_parse_kv(args.options))
        run_requests(runner, samples[:1], args.max_new_tokens)  # warm-up, untimed
        counts = count_ops(runner, samples, args.max_new_tokens)
        if args.skip_timing:
            print(f"\n## {method}: {counts}")
            continue
        spent, records = time_sections(runner, samples, args.max_new_tokens)
        report(method, spent, records, counts)
        if args.cprofile:
            profile = cProfile.Profile()
            profile.runcall(run_requests, runner, samples, args.max_new_tokens)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(args.cprofile)


if __name__ == "__main__":
    main()
