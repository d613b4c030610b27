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

from .base import Backend
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

    return {"qwen2_5_vl": QwenVLBackend, "llava_onevision": LlavaOnevisionBackend}


def _model_class(model_type: str):
    from transformers import LlavaOnevisionForConditionalGeneration, Qwen2_5_VLForConditionalGeneration

    return {"qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
            "llava_onevision": LlavaOnevisionForConditionalGeneration}[model_type]


def _preprocess_overrides(path: str, **budget) -> dict:
    """Pixel budget from the checkpoint's preprocessor config, then from model_args."""
    out = {}
    local = Path(path)
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        if (local / name).exists():
            cfg = json.loads((local / name).read_text())
            for key in ("min_pixels", "max_pixels"):
                if key in cfg and key not in out:
                    out[key] = int(cfg[key])
            for key in ("image_mean", "image_std"):
                if key in cfg and key not in out:
                    out[key] = tuple(float(x) for x in cfg[key])
            if isinstance(cfg.get("size"), dict):
                out.setdefault("min_pixels", cfg["size"].get("shortest_edge"))
                out.setdefault("max_pixels", cfg["size"].get("longest_edge"))
    out.update({k: v for k, v in budget.items() if v is not None})
    return {k: v for k, v in out.items() if v is not None}


def load_backend(name: str, device: str = "cpu", dtype: str = "float32", attn_implementation: str = "sdpa",
                 device_map: str | None = None, min_pixels: int | None = None,
                 max_pixels: int | None = None) -> Backend:
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; expected one of {', '.join(DTYPES)}")
    path = resolve_path(name)
    config = AutoConfig.from_pretrained(path)
    families = _families()
    if config.model_type not in families:
        raise ValueError(f"{name}: model_type {config.model_type!r} is not supported; expected one of "
                         f"{', '.join(families)}")
    kwargs = {"dtype": DTYPES[dtype], "attn_implementation": attn_implementation}
    if device_map:
        kwargs["device_map"] = device_map
    model = _model_class(config.model_type).from_pretrained(path, **kwargs).eval()
    if not device_map:
        model.to(device)
    tokenizer = load_tokenizer(path)  # with the processor's chat template (chat_template.json) if it has one
    overrides = _preprocess_overrides(path, min_pixels=min_pixels, max_pixels=max_pixels)
    return families[config.model_type].from_pretrained_parts(model, tokenizer, model.device, overrides)
