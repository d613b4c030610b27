"""Load the target (and draft) once, build the method, and generate one request at a time.

This is what the lmms-eval model classes and the benchmark call; it knows nothing of lmms-eval.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..backends.loading import load_backend
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
                 target_backend=None, draft_backend=None, paired_timing: bool = False, cpu_kernels: str = "auto"):
        """target_backend / draft_backend: already loaded backends to share (benchmarks run several
        methods on one model in one process). paired_timing: also decode every request with vanilla
        greedy on the same target, right before or after the method (alternating), and put its
        timings in the record (vanilla_decode_s, vanilla_e2e_s, vanilla_num_new_tokens,
        vanilla_tokens): speedups on the same clock even when each method is its own lmms-eval run.
        cpu_kernels: the linear layers' kernels for multi-token forwards on a CPU (backends/linear_kernels.py)."""
        self.spec = methods.resolve(method, drafter, verifier)
        self.method = method if method != "custom" else f"custom:{self.spec.drafter}+{self.spec.verifier}"
        self.options = methods.make_options(self.spec, options or {})
        load = dict(device=device, dtype=dtype, attn_implementation=attn_implementation, device_map=device_map,
                    min_pixels=min_pixels, max_pixels=max_pixels, video_rule=video_rule, cpu_kernels=cpu_kernels)
        self.target = target_backend or load_backend(pretrained, **load)
        self.draft_backend = None
        if self.spec.drafter in ("model", "pruned") and draft not in (None, "self"):
            self.draft_backend = draft_backend or load_backend(draft, **load)
            check_pairing(self.target, self.draft_backend, pretrained, draft)
        self.drafter, self.verifier = methods.build(self.spec, self.options, self.draft_backend, self.target)
        self.baseline = None  # (drafter, verifier) of vanilla decoding, timed beside each request
        if paired_timing and self.spec != methods.resolve("vanilla"):
            vanilla = methods.resolve("vanilla")
            self.baseline = methods.build(vanilla, methods.make_options(vanilla, {}), None, self.target)
        self._requests = 0

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def generate(self, prompt: str, videos: list[VideoInput], max_new_tokens: int,
                 until: tuple[str, ...] = ()) -> Generation:
        def decode(drafter, verifier) -> loop.Output:
            return loop.generate(self.target, drafter, verifier, prompt, [v.request() for v in videos],
                                 max_new_tokens, tuple(until))

        baseline_first = self.baseline is not None and self._requests % 2 == 1  # alternate: drift cancels out
        self._requests += 1
        base = decode(*self.baseline) if baseline_first else None
        out = decode(self.drafter, self.verifier)
        if self.baseline is not None and base is None:
            base = decode(*self.baseline)
        record = out.stats.to_dict()
        record.update(method=self.method, tokens=out.tokens, kinds=out.kinds, relevance=out.relevance,
                      replaced=out.replaced, margins=out.margins)
        if base is not None:
            record.update(vanilla_decode_s=base.stats.decode_s, vanilla_e2e_s=base.stats.e2e_s,
                          vanilla_num_new_tokens=base.stats.num_new_tokens, vanilla_tokens=base.tokens,
                          vanilla_margins=base.margins)
        return Generation(out.text, out.tokens, record, out.kinds, out.relevance)


def check_pairing(target, draft, target_name: str, draft_name: str) -> None:
    """A draft must share the tokenizer and the visual-token layout of its target."""
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ValueError(f"draft {draft_name!r} does not share the tokenizer of target {target_name!r}")
    if target.layout() != draft.layout():
        raise ValueError(f"draft {draft_name!r} has visual-token layout {draft.layout()}, target "
                         f"{target_name!r} has {target.layout()}; they must match")
