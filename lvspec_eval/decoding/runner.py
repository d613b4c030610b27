"""Load the target (and draft) once, build the method, and generate one request at a time.

This is what the lmms-eval model classes and the benchmark call; it knows nothing of lmms-eval.
"""
from __future__ import annotations

import contextlib
import copy
import gc
from dataclasses import dataclass, field

import numpy as np
import torch

from ..backends import linear_kernels
from ..backends.loading import load_backend, load_draft
from . import loop, methods


PAIRED_WITH = ("vanilla", "self")  # what paired timing times beside the method (`self`: an A/A check)


@dataclass
class VideoInput:
    frames: np.ndarray  # uint8 [T, H, W, 3]
    fps: float  # rate at which the frames were sampled
    indices: np.ndarray | None = None  # each frame's index in the file (None: 0..T-1 at `fps`)
    native_fps: float | None = None  # the file's own frame rate

    def request(self) -> tuple:
        """What a backend's `prepare` takes: (frames, fps, indices, native fps). Qwen3-VL writes each
        temporal patch's time from the original indices and the native rate."""
        return self.frames, self.fps, self.indices, self.native_fps


@dataclass
class Generation:
    text: str
    tokens: list[int]
    stats: dict  # the per-sample record (decoding/stats.py keys)
    kinds: list[str] = field(default_factory=list)
    relevance: list[float | None] = field(default_factory=list)


class Runner:
    def __init__(self, pretrained: str, method: str = "vanilla", draft: str | None = None, device: str = "cpu",
                 dtype: str = "float32", attn_implementation: str = "sdpa", options: dict | None = None,
                 drafter: str | None = None, verifier: str | None = None, device_map: str | None = None,
                 min_pixels: int | None = None, max_pixels: int | None = None, video_rule: str = "fps",
                 target_backend=None, draft_backend=None, paired_timing: bool = False, cpu_kernels: str = "auto",
                 one_token_kernels: str = "torch", draft_dtype: str | None = None,
                 draft_vocab: int | None = None, draft_vocab_table: str | None = None,
                 paired_with: str = "vanilla", warmup: bool = False):
        """target_backend / draft_backend: already loaded backends to share (benchmarks run several
        methods on one model in one process). paired_timing: also decode every request with vanilla
        greedy on the same target, right before or after the method (alternating), and put its
        timings in the record (vanilla_decode_s, vanilla_e2e_s, vanilla_prefill_s, vanilla_num_new_tokens,
        vanilla_tokens): speedups on the same clock even when each method is its own lmms-eval run.
        A pair is timed so that a stall cannot decide it (`timed_pair`): a stalled pair is decoded
        again with the method's learning rewound, and a pair that stalls twice is marked `untimed`.
        paired_with: what paired timing times beside the method: `vanilla`, or `self` (an A/A check: a
        second, independent instance of this method, with its own drafter and policy, on the same models;
        vanilla paired with itself when the method is vanilla).
        cpu_kernels: the linear layers' kernels for multi-token forwards on a CPU (backends/linear_kernels.py).
        warmup: before the first request is timed, decode it once untimed (WARMUP_TOKENS, every arm; the
        drafters' learning rewound after it), so that the first record does not carry the process's
        one-time costs (first-touch allocation, kernel primitives, lazy imports): in four 2-core
        processes under load the first request took 1.2-6.3x the median of the others.
        one_token_kernels: `engine`: every one-token step (the method's, and the paired vanilla's) runs the
        kernel measured fastest for one row, where the backends were loaded with it; `torch`: nn.Linear's.
        draft_dtype: the draft model's precision (backends/draft_precision.py; `auto`: measured; None: dtype's).
        draft_vocab / draft_vocab_table: FR-Spec, the draft's LM head cut to its K most frequent tokens (draft_vocab.py)."""
        if one_token_kernels not in linear_kernels.ONE_TOKEN_MODES:
            raise ValueError(f"one_token_kernels={one_token_kernels!r}; expected one of "
                             f"{', '.join(linear_kernels.ONE_TOKEN_MODES)}")
        self.spec = methods.resolve(method, drafter, verifier)
        self.method = method if method != "custom" else f"custom:{self.spec.drafter}+{self.spec.verifier}"
        self.options = methods.make_options(self.spec, options or {})
        load = dict(device=device, dtype=dtype, attn_implementation=attn_implementation, device_map=device_map,
                    min_pixels=min_pixels, max_pixels=max_pixels, video_rule=video_rule, cpu_kernels=cpu_kernels,
                    one_token_kernels=one_token_kernels)
        self.target = target_backend or load_backend(pretrained, **load)
        self.draft_backend = None
        if self.spec.drafter in ("model", "pruned") and draft not in (None, "self"):
            self.draft_backend = draft_backend or load_draft(
                draft, draft_dtype, draft_vocab, draft_vocab_table, **load)
            check_pairing(self.target, self.draft_backend, pretrained, draft)
        self.drafter, self.verifier = methods.build(self.spec, self.options, self.draft_backend, self.target)
        self.baseline = self._baseline(paired_with) if paired_timing else None  # (drafter, verifier) timed beside
        self._requests = 0
        self.one_token_steps = linear_kernels.one_token_steps if one_token_kernels == "engine" else contextlib.nullcontext
        self.warmup = warmup

    def _baseline(self, paired_with: str):
        """The (drafter, verifier) timed beside each request (None: vanilla's own run times itself)."""
        if paired_with not in PAIRED_WITH:
            raise ValueError(f"paired_with={paired_with!r}; expected one of {', '.join(PAIRED_WITH)}")
        if paired_with == "self":
            return methods.build(self.spec, self.options, self.draft_backend, self.target)
        vanilla = methods.resolve("vanilla")
        if self.spec == vanilla:
            return None
        return methods.build(vanilla, methods.make_options(vanilla, {}), None, self.target)

    def _warm_up(self, prompt: str, videos: list[VideoInput], max_new_tokens: int, until: tuple[str, ...]) -> None:
        """Decode the request once with every arm, untimed and unrecorded; nothing is learnt from it."""
        arms = [arm for arm in ((self.drafter, self.verifier), self.baseline) if arm is not None]
        rewind = rewinder(*(drafter for drafter, _ in arms))
        for arm in arms:
            self._decode(arm, prompt, videos, max_new_tokens, until)
        rewind()

    def _decode(self, arm, prompt: str, videos: list[VideoInput], max_new_tokens: int,
                until: tuple[str, ...]) -> loop.Output:
        """One decode of the request with one (drafter, verifier) arm, as every timed or warm-up run is made."""
        with paused_gc(), self.one_token_steps():
            return loop.generate(self.target, *arm, prompt, [v.request() for v in videos], max_new_tokens, tuple(until))

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def generate(self, prompt: str, videos: list[VideoInput], max_new_tokens: int,
                 until: tuple[str, ...] = ()) -> Generation:
        def decode(arm) -> loop.Output:
            return self._decode(arm, prompt, videos, max_new_tokens, until)

        method = (self.drafter, self.verifier)
        if self.warmup and self._requests == 0:
            self._warm_up(prompt, videos, min(WARMUP_TOKENS, max_new_tokens), until)
        if self.baseline is None:
            pair = TimedPair(decode(method), None)
        else:
            baseline_first = self._requests % 2 == 1  # alternate: drift cancels out
            pair = timed_pair(lambda: decode(method), lambda: decode(self.baseline), baseline_first,
                              rewinder(self.drafter, self.baseline[0]))
        self._requests += 1
        out, base = pair.method, pair.vanilla
        record = out.stats.to_dict()
        record.update(method=self.method, tokens=out.tokens, kinds=out.kinds, relevance=out.relevance,
                      replaced=out.replaced, margins=out.margins)
        record["request_index"] = self._requests - 1  # 0: the process's first, cold-start request (reporting/speed.py)
        record["warmed_up"] = self.warmup  # the first request was decoded once untimed before it was timed
        if base is not None:
            record.update(vanilla_decode_s=base.stats.decode_s, vanilla_e2e_s=base.stats.e2e_s,
                          vanilla_prefill_s=base.stats.prefill_s, vanilla_num_new_tokens=base.stats.num_new_tokens,
                          vanilla_tokens=base.tokens, vanilla_margins=base.margins, retimed=pair.retimed,
                          untimed=pair.untimed)
        return Generation(out.text, out.tokens, record, out.kinds, out.relevance)


WARMUP_TOKENS = 8  # new tokens of the untimed warm-up decode (Runner's `warmup`)
STALL_RATIO = 1.5  # one arm's target prefill this many times the other's (and STALL_S longer) is a stall
STALL_S = 0.02


@dataclass
class TimedPair:
    """A request decoded by the method and by the arm timed beside it (`vanilla`; None: not paired)."""

    method: loop.Output
    vanilla: loop.Output | None
    retimed: str | None = None  # "method" / "vanilla": the arm whose stall had the pair decoded again
    untimed: bool = False  # the second pair stalled too: the request is left out of the speed figures


def timed_pair(method, vanilla, vanilla_first: bool, rewind=None) -> TimedPair:
    """Decode a request with the method and with vanilla (callables), back to back, in the given order.

    Both arms run the same target prefill on the same inputs (the method's capture of hidden states
    or attention queries costs nothing measurable: docs/RESULTS.md), so prefill times that differ by
    more than STALL_RATIO say that one arm was stalled by something outside its own work (a pause of
    the process or the machine). Then `rewind()` puts the method's drafter back to its state before
    the request (its adaptive policy must learn from one run of each request: a second run would
    find this request's answer length and costs already learnt) and both arms are decoded again, in
    the same order; the new pair is kept, whatever its times (keeping the faster of two runs of one
    arm would give that arm a minimum of two where the other gets one). If the new pair stalls too,
    it is kept for its tokens and marked `untimed`: the report leaves the request out of its speed
    figures and counts it. Outputs are deterministic, so the tokens are the same either way."""
    runs = _decode_pair(method, vanilla, vanilla_first)
    slow = stalled_arm(_prefills(runs))
    if slow is None:
        return TimedPair(runs["method"], runs["vanilla"])
    if rewind is not None:
        rewind()
    runs = _decode_pair(method, vanilla, vanilla_first)
    again = stalled_arm(_prefills(runs))
    return TimedPair(runs["method"], runs["vanilla"], retimed=slow, untimed=again is not None)


def _decode_pair(method, vanilla, vanilla_first: bool) -> dict[str, loop.Output]:
    arms = {"vanilla": vanilla, "method": method} if vanilla_first else {"method": method, "vanilla": vanilla}
    return {name: arm() for name, arm in arms.items()}  # in that order


def _prefills(runs: dict[str, loop.Output]) -> dict[str, float]:
    return {name: run.stats.prefill_s for name, run in runs.items()}


def rewinder(*drafters):
    """A function that puts the drafters' learning back where it is now. What a drafter carries from
    one request to the next is its TreePlanner (decoding/drafters/growth.py: the adaptive policy's
    cost fits, acceptance rates, calibration, mean answer lengths; None before its first request);
    everything else it holds belongs to the current request and is reset by `start`, and the
    verifiers keep nothing between requests. The planner is copied whole (numbers and a few small
    index tensors), before the request and outside its timed windows."""
    saved = [(d, copy.deepcopy(d.planner)) for d in drafters if hasattr(d, "planner")]

    def rewind() -> None:
        for drafter, planner in saved:
            drafter.planner = copy.deepcopy(planner)  # a copy: a pair may be rewound more than once
    return rewind


def stalled_arm(prefill_s: dict[str, float]) -> str | None:
    """The arm whose target prefill took STALL_RATIO times the other's and STALL_S longer, or None."""
    slow, fast = max(prefill_s, key=prefill_s.get), min(prefill_s, key=prefill_s.get)
    if prefill_s[slow] > STALL_RATIO * prefill_s[fast] and prefill_s[slow] - prefill_s[fast] > STALL_S:
        return slow
    return None


@contextlib.contextmanager
def paused_gc():
    """No automatic garbage collection while a request is timed: a full collection of an lmms-eval
    process (half a million objects) pauses it for 0.4-0.7 s on this kind of machine, in whichever
    arm it lands. Collection resumes right after (reference counting frees nearly everything
    meanwhile), so the pause moves between the timed windows and the run takes no longer."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def check_pairing(target, draft, target_name: str, draft_name: str) -> None:
    """A draft must share the tokenizer and the visual-token layout of its target."""
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ValueError(f"draft {draft_name!r} does not share the tokenizer of target {target_name!r}")
    if target.layout() != draft.layout():
        raise ValueError(f"draft {draft_name!r} has visual-token layout {draft.layout()}, target "
                         f"{target_name!r} has {target.layout()}; they must match")
