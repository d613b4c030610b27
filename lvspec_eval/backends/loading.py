"""Load a target or draft model and wrap it in its family's backend.

`pretrained` is a local folder, a hub id, or `demo` / `demo-draft` / `demo-draft-restyled` (the
shipped demo models).
The family comes from the checkpoint's config (`model_type`), never from the name.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig

from . import attention, draft_int8, draft_precision, draft_vocab, linear_kernels, linear_state
from .base import Backend
from .frame_rules import check_rule
from .chat_template import load_tokenizer

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo" / "checkpoints"
DEMO_NAMES = {"demo": DEMO_DIR / "target", "demo-draft": DEMO_DIR / "draft",
              "demo-draft-restyled": DEMO_DIR / "draft_restyled"}
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "auto": "auto"}


def resolve_path(name: str) -> str:
    """Map demo names to their folders; leave local paths and hub ids alone."""
    if name in DEMO_NAMES:
        path = DEMO_NAMES[name]
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"the demo checkpoint {path} is missing; run `lvspec-eval build-demo`")
        return str(path)
    return name


def _families() -> dict:
    from .llava_onevision import LlavaOnevisionBackend
    from .qwen2_5_vl import QwenVLBackend
    from .qwen3_5 import Qwen3_5Backend
    from .qwen3_vl import Qwen3VLBackend

    return {"qwen2_5_vl": QwenVLBackend, "llava_onevision": LlavaOnevisionBackend,
            "qwen3_vl": Qwen3VLBackend, "qwen3_vl_moe": Qwen3VLBackend,
            "qwen3_5": Qwen3_5Backend, "qwen3_5_moe": Qwen3_5Backend}


def _model_class(model_type: str):
    import transformers

    return getattr(transformers, {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                                  "llava_onevision": "LlavaOnevisionForConditionalGeneration",
                                  "qwen3_vl": "Qwen3VLForConditionalGeneration",
                                  "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
                                  "qwen3_5": "Qwen3_5ForConditionalGeneration",
                                  "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}[model_type])


def check_model_type(name: str, model_type: str) -> None:
    """ValueError unless lvspec can decode this family speculatively; says why when it cannot."""
    if model_type not in _families():
        raise ValueError(f"{name}: model_type {model_type!r} is not supported; expected one of "
                         f"{', '.join(_families())}")


def _checkpoint_preprocessing(local: Path) -> dict:
    """min/max pixels and mean/std of a checkpoint folder: its video processor config first, then its
    image processor config (released Qwen2.5-VL folders only have the latter)."""
    out = {}
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        if not (local / name).exists():
            continue
        cfg = json.loads((local / name).read_text())
        size = cfg.get("size") if isinstance(cfg.get("size"), dict) else {}
        for key, size_key in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            value = cfg.get(key, size.get(size_key))
            if value is not None and key not in out:
                out[key] = int(value)
        for key in ("image_mean", "image_std"):
            if key in cfg and key not in out:
                out[key] = tuple(float(x) for x in cfg[key])
    return out


def _preprocess_overrides(path: str, video_rule: str = "fps", **budget) -> dict:
    """What the family's backend builds its preprocessing from: the video rule, the checkpoint's
    mean/std and pixel limits, and the min_pixels/max_pixels given as model_args (`budget`, these
    win). Under rule `fps` the checkpoint's limits are the per-frame limits; under `qwen_vl_utils`
    they are those of the processor's resize after qwen-vl-utils' (`checkpoint_pixels`); under
    `lmms_eval` lmms-eval passes its own limits to the processor, so the checkpoint's are unused."""
    check_rule(video_rule)
    found = _checkpoint_preprocessing(Path(path))
    out = {"video_rule": video_rule, **{k: v for k, v in found.items() if k in ("image_mean", "image_std")}}
    limits = {k: v for k, v in found.items() if k in ("min_pixels", "max_pixels")}
    if video_rule == "fps":
        out.update(limits)
    elif video_rule == "qwen_vl_utils" and len(limits) == 2:
        out["checkpoint_pixels"] = (limits["min_pixels"], limits["max_pixels"])
    out.update({k: v for k, v in budget.items() if v is not None})
    return out


def placement(device: str, device_map: str | dict | None) -> dict:
    """from_pretrained's placement argument: weights load straight onto their device(s).

    With a device_map, transformers places each layer; without one, an accelerator device gets
    the whole model as {"": device}, so the weights are never first materialised in host memory
    (65 GB for a 32B target in bf16, per data-parallel rank). The CPU needs neither.
    """
    if device_map:
        return {"device_map": device_map}
    return {} if torch.device(device).type == "cpu" else {"device_map": {"": device}}


def load_backend(name: str, device: str = "cpu", dtype: str = "float32", attn_implementation: str = "sdpa",
                 device_map: str | None = None, min_pixels: int | None = None,
                 max_pixels: int | None = None, video_rule: str = "fps", cpu_kernels: str = "torch",
                 one_token_kernels: str = "torch") -> Backend:
    """video_rule: how frames are sized (frame_rules.py); `fps` keeps the checkpoint's own limits.
    cpu_kernels: on a CPU, `auto` / `measure` pick the linear layers' kernels for multi-token forwards
    by measuring (linear_kernels.py; `measure` ignores the cached measurements); `torch`: nn.Linear.
    one_token_kernels: `engine` also installs the kernel measured fastest for one row, which one-token
    steps take inside linear_kernels.one_token_steps() (the runner enters it); `torch`: not installed."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; expected one of {', '.join(DTYPES)}")
    if cpu_kernels not in linear_kernels.MODES:
        raise ValueError(f"cpu_kernels={cpu_kernels!r}; expected one of {', '.join(linear_kernels.MODES)}")
    if one_token_kernels not in linear_kernels.ONE_TOKEN_MODES:
        raise ValueError(f"one_token_kernels={one_token_kernels!r}; expected one of "
                         f"{', '.join(linear_kernels.ONE_TOKEN_MODES)}")
    attention.tree_path(attn_implementation)  # refuse an unsupported kernel before loading anything
    path = resolve_path(name)
    config = AutoConfig.from_pretrained(path)
    check_model_type(name, config.model_type)
    families = _families()
    kwargs = {"dtype": DTYPES[dtype], "attn_implementation": attn_implementation, **placement(device, device_map)}
    model = _model_class(config.model_type).from_pretrained(path, **kwargs).eval()
    # The vision tower keeps the kernel it was loaded with; the language model's attention routes
    # tree-masked forwards to a path that honours the mask (attention.py).
    attention.install(model)
    linear_state.install(model)  # Gated DeltaNet layers (Qwen3.5) follow draft trees and roll back
    tokenizer = load_tokenizer(path)  # with the processor's chat template (chat_template.json) if it has one
    overrides = _preprocess_overrides(path, video_rule, min_pixels=min_pixels, max_pixels=max_pixels)
    backend = families[config.model_type].from_pretrained_parts(model, tokenizer, model.device, overrides)
    # None where nothing was installed (an accelerator, cpu_kernels=torch, or nn.Linear fastest throughout)
    backend.kernels = linear_kernels.install([backend.text_model(), model.lm_head], cpu_kernels,
                                             one_token=one_token_kernels == "engine")
    return backend


def load_draft(name: str, draft_dtype: str | None = None, vocab: int | None = None, vocab_table: str | None = None,
               **load) -> Backend:
    """The draft model, in `draft_dtype` (draft_precision.py): float32 / bfloat16 / float16 as asked;
    int8 (CPU only): float32 with its linear layers in dynamic int8 (draft_int8.py);
    `auto` on a CPU the faster of float32 and bfloat16 as measured on this machine (cached), on an
    accelerator the load dtype (`load["dtype"]`, the target's); None: the load dtype, as the target.
    A bfloat16 / float16 draft's one-row calls take the kernel measured fastest for one row (its
    numerics never change an exact method's output).
    vocab: FR-Spec, the LM head cut to the `vocab` most frequent tokens of `vocab_table`
    (backends/draft_vocab.py). Both are settled before the CPU's multi-token kernels are measured and
    installed, so those are measured on the weights the draft runs with. The backend's `precision`
    says what was chosen and why; `vocab_size` how many tokens its head keeps."""
    if draft_dtype is not None and draft_dtype not in draft_precision.DRAFT_DTYPES:
        raise ValueError(f"draft_dtype={draft_dtype!r}; expected one of {', '.join(draft_precision.DRAFT_DTYPES)}")
    kernels = load.get("cpu_kernels", "torch")
    fixed = draft_dtype not in (None, "auto")
    int8 = draft_dtype == "int8"
    if int8 and not draft_int8.supported(torch.device(load.get("device") or "cpu")):
        raise ValueError("draft_dtype=int8 runs on a CPU only (torch's dynamic quantized linear layers); "
                         "on an accelerator use draft_dtype=bfloat16 or float16")
    load_dtype = "float32" if int8 else draft_dtype
    backend = load_backend(name, **{**load, "cpu_kernels": "torch", "one_token_kernels": "torch",
                                    **({"dtype": load_dtype} if fixed else {})})
    if vocab is not None:
        table = draft_vocab.table_for(vocab_table, backend.tokenizer, resolve_path(name))
        draft_vocab.restrict(backend.model, draft_vocab.kept_ids(table, vocab, backend.tokenizer, backend.eos_token_ids))
    modules = [backend.text_model(), backend.model.lm_head]
    loaded = str(backend.model.dtype).removeprefix("torch.")
    if draft_dtype == "auto":
        backend.precision = draft_precision.choose(modules, backend.device, backend.model.dtype, kernels == "measure")
    else:
        backend.precision = draft_precision.Decision(loaded, "draft_dtype" if fixed else "the target's dtype")
    if int8:
        backend.precision = draft_precision.Decision(
            "int8", f"draft_dtype: {draft_int8.quantize(modules)} linear layers in int8 (embeddings, norms, "
                    "attention in float32)")
        backend.kernels = None
        return backend
    if backend.precision.dtype != loaded:
        cast_parameters(backend.model, DTYPES[backend.precision.dtype])
    # The draft's numerics never change an exact method's output, so a reduced-precision draft's
    # one-token steps take the kernel measured fastest for one row too: transformers' bf16 path reads
    # its weights at half the bandwidth (the real pair's 0.5B: a 77 ms step, 58 ms with the measured
    # kernel). An fp32 draft keeps nn.Linear for one row, as the target does: at the bandwidth floor
    # already on the real pair, and on the demo's small draft the measured kernels made sd_tree slower
    # (captions 1.12x against 1.19x, two runs each, docs/RESULTS.md).
    reduced = backend.precision.dtype in ("bfloat16", "float16")
    one_token = "always" if reduced else load.get("one_token_kernels") == "engine"
    backend.kernels = linear_kernels.install(modules, kernels, one_token=one_token)
    return backend


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """The weights in `dtype`, buffers left alone: as from_pretrained(dtype=...) loads a model, the
    rotary embeddings' inverse frequencies stay float32 (`model.to` would round them too)."""
    for param in model.parameters():
        if param.is_floating_point():
            param.data = param.data.to(dtype)
