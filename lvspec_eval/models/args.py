"""model_args of `--model lvspec` and the per-request generation settings, parsed and checked.

lmms-eval hands model_args over as keyword arguments whose values it has already half-typed
("32" -> 32, "0.5" -> 0.5, "true" -> True, anything else a string), and Python callers pass real
values. Everything is checked here, at construction, so a typo fails the run before the first
sample instead of after an hour of decoding.
"""
from __future__ import annotations

import logging
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from ..backends import linear_kernels
from ..backends.draft_precision import DRAFT_DTYPES
from ..backends.frame_rules import VIDEO_RULES
from ..backends.loading import DEMO_NAMES, DTYPES
from ..decoding import methods
from ..decoding.runner import PAIRED_WITH
from ..demo import models as demo_models
from .parity import THINKING_MODES, UNTIL_MODES

log = logging.getLogger(__name__)

ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
ON_DEVICE_ERROR = ("abort", "skip")  # what a CUDA error or out-of-memory does (models/lvspec.py)
# verifier/drafter options owned by their modules (FLy, LVSpec, PST, Sparrow, MTP): passed through typed
OPTION_PREFIXES = ("fly_", "lv_", "pst", "sparrow_", "mtp_")
PATH_ARGS = ("pretrained", "draft", "draft_vocab_table")
DEFAULT_FPS, DEFAULT_MAX_FRAMES = 2.0, 32
# pretrained=demo samples every frame of every synthvid video: the longest task
# (synthvid_caption_f512, lvspec_eval/demo/tasks_data.py) has 512 frames = 4,096 visual tokens
DEMO_MAX_FRAMES = 512


@dataclass
class ModelArgs:
    pretrained: str = "demo"  # local folder, hub id, or `demo`
    draft: str | None = None  # folder, hub id, `demo-draft` or `self`; default set by parse()
    method: str = "vanilla"
    drafter: str | None = None  # method=custom (or to swap one part of a named method)
    verifier: str | None = None
    device: str | None = None  # default: cuda if available, else cpu
    dtype: str | None = None  # default: float32 on cpu, bfloat16 on cuda
    attn_implementation: str = "sdpa"
    # on a CPU, the linear layers' kernels for multi-token forwards (verification, drafting): auto = the
    # fastest measured on this machine (cached), measure = measure again, torch = nn.Linear throughout
    cpu_kernels: str = "auto"
    # on a CPU, one-token steps: torch = transformers' own (lmms-eval's classes' path), engine = the kernel measured
    # fastest for one row too (an "engine vanilla": a method's speedup over it is the speculation's alone)
    one_token_kernels: str = "torch"
    # the draft model's precision (backends/draft_precision.py): auto = measured on this CPU (bfloat16 where
    # it is faster), float32 | bfloat16 | float16; default: dtype's. Exact methods output the same either way
    draft_dtype: str | None = None
    draft_vocab: int | None = None  # FR-Spec: the draft's LM head cut to its K most frequent tokens (draft_vocab.py)
    draft_vocab_table: str | None = None  # the token-frequency table for draft_vocab (default: the demo's, for the demo)
    device_map: str | None = None
    max_frames: int | None = None  # default 32 (demo: 512, the longest synthvid videos' frame count)
    fps: float | None = None  # default 2.0 (demo: the rate the demo models were trained at)
    min_pixels: int | None = None
    max_pixels: int | None = None
    # frames and pixels per video (backends/frame_rules.py): lmms_eval | qwen_vl_utils | fps; default fps for
    # the demo models, else lmms_eval, whose own defaults (not the two lines above) then apply to fps/max_frames
    video_rule: str | None = None
    max_new_tokens: int | None = None  # default: the matched lmms-eval class's (models/parity.py); demo 256
    until: str | None = None  # the task's stop strings: `class` (as lmms-eval's class does) or `task`; demo: task
    # on | off: the chat template's enable_thinking, and answers cut after `</think>` (on); default: what the
    # family's lmms-eval class does (qwen3_5: on; qwen3_vl: not passed); Qwen3 families only (models/parity.py)
    thinking: str | None = None
    # the prompts of the tasks that have per-model variants (lmms-eval's lmms_eval_specific_kwargs): auto = those
    # of the family's lmms-eval class (Video-MME's qwen3_vl for Qwen3-VL), default, or an lmms-eval model name
    prompt_variant: str = "auto"
    stats_path: str | None = None  # JSONL of per-sample decode statistics
    paired_timing: bool = False  # also time vanilla greedy on every request, beside the method (same clock)
    paired_with: str = "vanilla"  # with paired_timing: vanilla, or self (an A/A check: the method beside itself)
    warmup: bool = True  # decode the first request once untimed before timing it (runner.Runner's warmup)
    on_device_error: str = "abort"  # a CUDA error or out-of-memory: stop the run (abort) or fail the sample (skip)
    # with --use_cache and stats_path: reuse records made on another machine (models/resume.py; refused otherwise)
    resume_any_machine: bool = False
    batch_size: int = 1  # lmms-eval always passes it; speculative decoding here is batch 1
    max_batch_size: int | None = None  # passed by lmms-eval with --max_batch_size; unused
    options: dict = field(default_factory=dict)  # DecodeOptions fields and prefixed options

    @classmethod
    def accepted_keys(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "options"] + sorted(methods.DecodeOptions.field_names())

    @classmethod
    def parse(cls, raw: Mapping[str, object]) -> ModelArgs:
        """Typed, defaulted and validated arguments; ValueError names the offending argument."""
        unknown = sorted(k for k in raw if k not in cls.accepted_keys() and not k.startswith(OPTION_PREFIXES))
        if unknown:
            raise ValueError(f"unknown model_args {', '.join(unknown)}; accepted: {', '.join(cls.accepted_keys())}, "
                             f"and verifier/drafter options starting with {', '.join(OPTION_PREFIXES)}")
        own = _field_types(cls, exclude={"options"})
        decode = _field_types(methods.DecodeOptions, exclude={"extra"})
        values = {k: coerce(k, v, own[k]) for k, v in raw.items() if k in own}
        options = {k: coerce(k, v, decode[k]) for k, v in raw.items() if k in decode}
        options.update({k: auto_type(v) for k, v in raw.items() if k.startswith(OPTION_PREFIXES)})
        args = cls(**values, options=options)
        args.fill_defaults()
        args.validate()
        return args

    def fill_defaults(self) -> None:
        """Defaults that depend on the machine or on the demo."""
        demo = self.pretrained in DEMO_NAMES
        if self.draft is None:
            self.draft = "demo-draft" if self.pretrained == "demo" else "self"
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.dtype is None:
            self.dtype = "float32" if self.device == "cpu" else "bfloat16"
        if self.video_rule is None:
            self.video_rule = "fps" if demo else "lmms_eval"
        if self.until is None:  # the demo's figures were made with the task's stop strings
            self.until = "task" if demo else "class"
        if self.fps is None and self.video_rule == "fps":
            self.fps = demo_models.FPS if demo else DEFAULT_FPS
        if self.max_frames is None and self.video_rule == "fps":
            self.max_frames = DEMO_MAX_FRAMES if demo else DEFAULT_MAX_FRAMES

    def validate(self) -> None:
        spec = methods.resolve(self.method, self.drafter, self.verifier)  # unknown names list alternatives
        options = methods.make_options(spec, self.options)
        options.tree_config()  # the constructors check tree_* and prune_* values
        options.prune_config()
        _one_of("dtype", self.dtype, tuple(DTYPES))
        _one_of("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        _one_of("cpu_kernels", self.cpu_kernels, linear_kernels.MODES)
        _one_of("one_token_kernels", self.one_token_kernels, linear_kernels.ONE_TOKEN_MODES)
        if self.draft_dtype is not None:
            _one_of("draft_dtype", self.draft_dtype, DRAFT_DTYPES)
        _one_of("on_device_error", self.on_device_error, ON_DEVICE_ERROR)
        _one_of("paired_with", self.paired_with, PAIRED_WITH)
        _one_of("until", self.until, UNTIL_MODES)
        if self.thinking is not None:  # lmms-eval half-types true/false: accept them for on/off
            self.thinking = {"true": "on", "false": "off"}.get(self.thinking.lower(), self.thinking.lower())
            _one_of("thinking", self.thinking, THINKING_MODES)
        _check_prompt_variant(self.prompt_variant)
        _check_device(self.device)
        if self.batch_size != 1:
            raise ValueError(f"batch_size={self.batch_size} is not supported: lvspec decodes one request at a time "
                             "(speculative decoding is measured at batch 1); use batch_size=1")
        for name in ("max_frames", "max_new_tokens", "min_pixels", "max_pixels", "draft_vocab"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value} must be a positive integer")
        _one_of("video_rule", self.video_rule, VIDEO_RULES)
        if self.fps is not None and self.fps <= 0:
            raise ValueError(f"fps={self.fps} must be positive (frames sampled per second of video)")
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels={self.min_pixels} is larger than max_pixels={self.max_pixels}")
        for name in PATH_ARGS:
            check_path(name, getattr(self, name))

    def runner_kwargs(self) -> dict:
        """Keyword arguments of lvspec_eval.decoding.runner.Runner."""
        return {"pretrained": self.pretrained, "method": self.method, "draft": self.draft, "device": self.device,
                "dtype": self.dtype, "attn_implementation": self.attn_implementation, "options": dict(self.options),
                "drafter": self.drafter, "verifier": self.verifier, "device_map": self.device_map,
                "min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "paired_timing": self.paired_timing,
                "video_rule": self.video_rule, "cpu_kernels": self.cpu_kernels,
                "one_token_kernels": self.one_token_kernels, "draft_dtype": self.draft_dtype,
                "draft_vocab": self.draft_vocab, "draft_vocab_table": self.draft_vocab_table,
                "paired_with": self.paired_with, "warmup": self.warmup}


def documented_arguments() -> list[str]:
    """Every model_arg name: ModelArgs' and DecodeOptions' fields and the verifiers' and drafters' own
    options (docs/ARGS.md lists exactly these; tests/test_args_doc.py checks it)."""
    from ..decoding.drafters.mtp import MTPDrafter
    from ..decoding.drafters.sparrow import SparrowDrafter
    from ..decoding.verifiers.fly import FlyVerifier
    from ..decoding.verifiers.lvspec import LVSpecVerifier

    owned = [name for owner in (FlyVerifier, LVSpecVerifier, SparrowDrafter, MTPDrafter) for name in owner.OPTIONS]
    return ModelArgs.accepted_keys() + owned


# ---- typing helpers -----------------------------------------------------------------------------

def _field_types(cls, exclude: set[str]) -> dict[str, type]:
    """name -> base type (str, int, float, bool) of a dataclass's fields; `X | None` -> X."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        if f.name in exclude:
            continue
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        out[f.name] = hint
    return out


def coerce(name: str, value: object, kind: type) -> object:
    """`value` as `kind`; a malformed value raises ValueError naming the argument and the value."""
    if value is None:
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "false", "1", "0"):
            return str(value).lower() in ("true", "1")
    elif kind is str:
        return str(value).lower() if isinstance(value, bool) else str(value)
    elif kind is int and not isinstance(value, (bool, float)):
        try:
            return int(value)
        except ValueError:
            pass
    elif kind is float and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    names = {int: "an integer", float: "a number", bool: "true or false"}
    raise ValueError(f"model_args {name}={value!r} is not {names.get(kind, kind.__name__)}")


def auto_type(value: object) -> object:
    """A pass-through option's value: int, then float, then the string as given."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; expected one of {', '.join(allowed)}")


def _check_prompt_variant(value: str) -> None:
    from .parity import CLASS_RULES, PROMPT_VARIANT_CHOICES, lmms_model_name

    names = sorted({lmms_model_name(f, i) for f, i in CLASS_RULES})
    if value not in PROMPT_VARIANT_CHOICES and value not in names:
        raise ValueError(f"prompt_variant={value!r} is not supported; expected one of "
                         f"{', '.join(PROMPT_VARIANT_CHOICES + tuple(names))}")


def _check_device(device: str) -> None:
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device={device!r} is not a device (expected cpu, cuda or cuda:N): {err}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here; use device=cpu")


def looks_like_path(value: str) -> bool:
    """A local path rather than a hub id: starts with / . ~, or its first component exists here."""
    if value.startswith(("/", ".", "~")):
        return True
    first = Path(value).parts[0] if Path(value).parts else ""
    return "/" in value and bool(first) and Path(first).exists()


def check_path(name: str, value: str | None) -> None:
    """Fail at start on a path that does not exist (a hub id or a demo name is left alone)."""
    if value is None or value in DEMO_NAMES or value == "self" or not looks_like_path(value):
        return
    if not Path(value).expanduser().exists():
        raise ValueError(f"{name}={value!r} looks like a local path but does not exist")


# ---- per-request generation settings ----------------------------------------------------------

@dataclass
class GenSettings:
    max_new_tokens: int
    until: tuple[str, ...]
    requested_temperature: float  # what the task asked for; decoding is greedy regardless
    sampling_ignored: bool  # True when the task asked for sampling and got greedy decoding


def read_gen_kwargs(gen_kwargs: Mapping | None, default_max_new_tokens: int,
                    default_temperature: float = 0.0) -> GenSettings:
    """The task's generation_kwargs: max_new_tokens, until (str or list), temperature/do_sample.
    default_temperature: what the matched lmms-eval class samples at when the task gives none."""
    gen = dict(gen_kwargs or {})
    until = gen.get("until") or ()
    until = (until,) if isinstance(until, str) else tuple(s for s in until if s)
    max_new = gen.get("max_new_tokens")
    max_new = default_max_new_tokens if max_new is None else coerce("max_new_tokens", max_new, int)
    if max_new < 1:
        raise ValueError(f"generation_kwargs max_new_tokens={max_new} must be at least 1")
    raw = gen.get("temperature")
    temperature = default_temperature if raw is None else coerce("temperature", raw or 0.0, float)
    sampling = temperature > 0 or bool(gen.get("do_sample"))
    return GenSettings(max_new, until, temperature, sampling)
