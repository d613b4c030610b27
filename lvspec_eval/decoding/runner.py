"""Load the target (and draft) once, build the method, and generate one request at a time.

This is what the lmms-eval model classes and the benchmark call; it knows nothing of lmms-eval.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field

import numpy as np
import torch

from ..backends import linear_kernels
from ..backends.loading import load_backend, load_draft
from . import loop, methods


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
                 draft_vocab: int | None = None, draft_vocab_table: str | None = None):
        """target_backend / draft_backend: already loaded backends to share (benchmarks run several
        methods on one model in one process). paired_timing: also decode every request with vanilla
        greedy on the same target, right before or after the method (alternating), and put its
        timings in the record (vanilla_decode_s, vanilla_e2e_s, vanilla_prefill_s, vanilla_num_new_tokens,
        vanilla_tokens): speedups on the same clock even when each method is its own lmms-eval run.
        A pair is timed so that a stall cannot decide it (`timed_pair`).
        cpu_kernels: the linear layers' kernels for multi-token forwards on a CPU (backends/linear_kernels.py).
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
        self.baseline = None  # (drafter, verifier) of vanilla decoding, timed beside each request
        if paired_timing and self.spec != methods.resolve("vanilla"):
            vanilla = methods.resolve("vanilla")
            self.baseline = methods.build(vanilla, methods.make_options(vanilla, {}), None, self.target)
        self._requests = 0
        self.one_token_steps = linear_kernels.one_token_steps if one_token_kernels == "engine" else contextlib.nullcontext

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def generate(self, prompt: str, videos: list[VideoInput], max_new_tokens: int,
                 until: tuple[str, ...] = ()) -> Generation:
        def decode(arm) -> loop.Output:
            with paused_gc(), self.one_token_steps():
                return loop.generate(self.target, *arm, prompt, [v.request() for v in videos], max_new_tokens,
                                     tuple(until))

        method = (self.drafter, self.verifier)
        if self.baseline is None:
            out, base, retimed = decode(method), None, None
        else:
            baseline_first = self._requests % 2 == 1  # alternate: drift cancels out
            out, base, retimed = timed_pair(lambda: decode(method), lambda: decode(self.baseline), baseline_first)
        self._requests += 1
        record = out.stats.to_dict()
        record.update(method=self.method, tokens=out.tokens, kinds=out.kinds, relevance=out.relevance,
                      replaced=out.replaced, margins=out.margins)
        record["request_index"] = self._requests - 1  # 0: the process's first, cold-start request (reporting/speed.py)
        if base is not None:
            record.update(vanilla_decode_s=base.stats.decode_s, vanilla_e2e_s=base.stats.e2e_s,
                          vanilla_prefill_s=base.stats.prefill_s, vanilla_num_new_tokens=base.stats.num_new_tokens,
                          vanilla_tokens=base.tokens, vanilla_margins=base.margins, retimed=retimed)
        return Generation(out.text, out.tokens, record, out.kinds, out.relevance)


STALL_RATIO = 1.5  # one arm's target prefill this many times the other's (and STALL_S longer) is a stall
STALL_S = 0.02


def timed_pair(method, vanilla, vanilla_first: bool) -> tuple[loop.Output, loop.Output, str | None]:
    """Decode a request with the method and with vanilla (callables), back to back; returns
    (method's output, vanilla's, "method" / "vanilla": the arm timed again, or None).

    Both arms run the same target prefill on the same inputs (the method's capture of hidden states
    or attention queries costs nothing measurable: docs/RESULTS.md), so prefill times that differ by
    more than STALL_RATIO say that one arm was stalled by something outside its own work (a pause of
    the process or the machine; the first arm of a request met it most). That arm is then decoded
    once more, right away, and the faster of its two runs (end to end) is kept: a stall costs one
    more decode of one arm instead of deciding the pair. Outputs are deterministic, so the tokens
    are the same either way."""
    arms = {"vanilla": vanilla, "method": method} if vanilla_first else {"method": method, "vanilla": vanilla}
    runs = {name: arm() for name, arm in arms.items()}  # in that order
    slow = stalled_arm({name: run.stats.prefill_s for name, run in runs.items()})
    if slow is not None:
        runs[slow] = min(runs[slow], arms[slow](), key=lambda o: o.stats.e2e_s)
    return runs["method"], runs["vanilla"], slow


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
