"""Sparrow (SPEC.md section 4): a one-layer draft head that reads the target's hidden states and
holds no visual KV cache, so its draft step costs the same for 64 or 25,000 visual tokens.

The head (EAGLE-like): one Qwen2 decoder layer built from the target's text config, a projection
`fc` and an output norm. It borrows the target's frozen token embedding and LM head at run time;
a checkpoint holds only fc, the layer and the norm. Its input at text position t is

    fc([embedding(token_t); h_{t-1}])

where h_{t-1} is the target's final (normed) hidden state at the previous sequence position:
hidden-state reuse (HSR). Its output is trained to equal h_t, so the target's LM head turns it
into a prediction of token t+1, and it can be fed back as h for the next draft position.

Text-anchored attention (VATA): the head's cache holds only text tokens (the prompt's non-visual
positions, then the generated tokens). The video reaches the head only through h, which the
target computed while attending to every visual token.

Positions count text tokens only (0, 1, ... over the prompt's text, then the generated tokens).
The head never sees visual tokens, so giving it full-sequence positions would only open a gap as
wide as the video between the text before and after it; counting text tokens keeps every
distance the head sees independent of the video length, the same at 64 and at 25,000 visual
tokens, and the same as in training.

Bookkeeping (which target hidden states are known, the pending tail, tree growth) is shared with
drafter=mtp: hidden_state.HiddenStateDrafter.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DynamicCache, Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import (
    Qwen2DecoderLayer,
    Qwen2RMSNorm,
    Qwen2RotaryEmbedding,
)

from ...backends.base import Backend, PreparedInputs
from ...backends.loading import DEMO_NAMES
from ..tree import TreeConfig
from .hidden_state import HiddenStateDrafter

HEAD_CONFIG, HEAD_WEIGHTS = "sparrow_config.json", "sparrow_head.safetensors"
DEMO_HEAD = DEMO_NAMES["demo"].parent / "sparrow"
HSR_VALUES = ("on", "off")


def head_config(text_config) -> Qwen2Config:
    """A one-layer Qwen2 config with the target's width, heads and norm; 1-D RoPE (text only)."""
    rope = dict(getattr(text_config, "rope_parameters", None) or {})
    theta = rope.get("rope_theta", getattr(text_config, "rope_theta", 10000.0))
    cfg = Qwen2Config(
        vocab_size=text_config.vocab_size, hidden_size=text_config.hidden_size,
        intermediate_size=text_config.intermediate_size, num_hidden_layers=1,
        num_attention_heads=text_config.num_attention_heads, num_key_value_heads=text_config.num_key_value_heads,
        head_dim=getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads,
        hidden_act=text_config.hidden_act, rms_norm_eps=text_config.rms_norm_eps,
        max_position_embeddings=text_config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": float(theta)},
    )
    cfg._attn_implementation = "sdpa"  # explicit float masks keep sdpa exact (DESIGN.md)
    return cfg


class SparrowHead(nn.Module):
    """fc + one decoder layer + output norm. The target's embedding and LM head are not part of it."""

    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = Qwen2DecoderLayer(config, layer_idx=0)
        self.norm = Qwen2RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary = Qwen2RotaryEmbedding(config)  # buffers only: not in the checkpoint
        self.meta: dict = {}  # how it was trained (written to the checkpoint's config)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def _apply(self, fn, recurse: bool = True) -> SparrowHead:
        """Casts reach the parameters only: buffers (the rotary inv_freq) follow moves to another
        device but keep their float32 values, as the target keeps its own. A bfloat16 inv_freq
        puts the head's rotary angles 0.22 rad off the target's at text position 500 and 0.87 rad
        at 2,000."""
        before = dict(self.named_buffers())
        super()._apply(fn, recurse)
        for name, old in before.items():
            owner, _, leaf = name.rpartition(".")
            module = self.get_submodule(owner)
            if module._buffers[leaf].dtype != old.dtype:
                module._buffers[leaf] = old.to(module._buffers[leaf].device)
        return self

    @classmethod
    def for_target(cls, backend: Backend) -> SparrowHead:
        return cls(head_config(backend.model.config.get_text_config()))

    def project(self, embeds: torch.Tensor, prev_hidden: torch.Tensor) -> torch.Tensor:
        """[..., 2 * hidden] -> [..., hidden]: the layer input from a token and the previous h."""
        return self.fc(torch.cat([embeds, prev_hidden], dim=-1))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cache: DynamicCache | None = None) -> torch.Tensor:
        """x [b, m, hidden] layer inputs, positions [b, m], mask [b, 1, m, keys] additive float.

        Returns the normed outputs [b, m, hidden] (the head's estimate of the target's h); with a
        cache, the m new keys/values are appended to it.
        """
        out = self.layer(x, attention_mask=mask, position_ids=positions, cache=cache,
                         use_cache=cache is not None, position_embeddings=self.rotary(x, positions))
        return self.norm(out[0] if isinstance(out, tuple) else out)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        # Stored in bfloat16 (half the size; the committed demo heads count against a size budget);
        # `load` casts to the target's dtype.
        state = {k: v.detach().to(torch.bfloat16 if v.is_floating_point() else v.dtype).cpu().contiguous()
                 for k, v in self.state_dict().items()}
        save_file(state, str(path / HEAD_WEIGHTS))
        (path / HEAD_CONFIG).write_text(json.dumps({"config": self.config.to_dict(), "meta": self.meta}, indent=1))

    @classmethod
    def load(cls, path: str | Path, backend: Backend | None = None) -> SparrowHead:
        """Load a head; with a backend, check it fits that target and move it to its device/dtype."""
        path = Path(path)
        if not (path / HEAD_WEIGHTS).exists():
            raise ValueError(f"sparrow_head={str(path)!r} holds no Sparrow head ({HEAD_WEIGHTS} missing); "
                             "train one with `lvspec-eval train-sparrow --target ... --out DIR`")
        saved = json.loads((path / HEAD_CONFIG).read_text())
        config = Qwen2Config(**saved["config"])
        config._attn_implementation = "sdpa"
        head = cls(config)
        head.load_state_dict(load_file(str(path / HEAD_WEIGHTS)))
        head.meta = saved.get("meta", {})
        if backend is not None:
            target = backend.model.config.get_text_config()
            if (target.hidden_size, target.vocab_size) != (config.hidden_size, config.vocab_size):
                raise ValueError(f"the Sparrow head in {path} was trained for hidden size {config.hidden_size} and "
                                 f"vocabulary {config.vocab_size}; the target has {target.hidden_size} and "
                                 f"{target.vocab_size}")
            head.to(backend.device, backend.model.dtype)
        return head.eval()


class SparrowDrafter(HiddenStateDrafter):
    """Drafts trees (or chains) with a SparrowHead; the machinery (bookkeeping, catch-up, tree
    growth) is hidden_state.HiddenStateDrafter's. The head's cache gets the prompt's text rows
    only, and its positions count them (the module docstring)."""

    name = "sparrow"
    # model_args options (the `sparrow_` prefix routes them here) and their defaults
    OPTIONS: ClassVar[dict] = {"sparrow_head": None, "sparrow_hsr": "on"}

    def __init__(self, head: SparrowHead, target: Backend, tree: TreeConfig, hsr: bool = True, eager: bool = True):
        super().__init__(head, target, tree, eager)
        self.hsr = hsr

    @property
    def num_text(self) -> int:
        """Prompt text tokens (the head's positions count text tokens only)."""
        return self.prompt_slots

    def _prompt_rows(self, inputs: PreparedInputs, hidden: torch.Tensor):
        """The prompt's text tokens, each with the target's h at the previous sequence position
        (the head has no vision tower and no visual KV: nothing to prune or embed)."""
        text_idx = (~inputs.visual_mask).nonzero().flatten()
        prev = torch.cat([torch.zeros_like(hidden[:1]), hidden[:-1]])[text_idx.to(hidden.device)]
        tokens = inputs.input_ids[0, text_idx.to(inputs.input_ids.device)]
        return tokens, None, prev


# ---- the method's factory -------------------------------------------------------------------------

def is_demo_target(backend: Backend) -> bool:
    name = getattr(backend.model, "name_or_path", "") or ""
    return bool(name) and Path(name).resolve() == DEMO_NAMES["demo"].resolve()


def parse_options(extra: dict) -> dict:
    """The sparrow_* options with defaults; ValueError names an unknown option or bad value."""
    unknown = sorted(k for k in extra if k.startswith("sparrow_") and k not in SparrowDrafter.OPTIONS)
    if unknown:
        raise ValueError(f"unknown Sparrow option(s) {', '.join(unknown)}; expected {', '.join(SparrowDrafter.OPTIONS)}")
    values = {k: extra.get(k, default) for k, default in SparrowDrafter.OPTIONS.items()}
    hsr = str(values["sparrow_hsr"]).lower()
    hsr = {"true": "on", "1": "on", "false": "off", "0": "off"}.get(hsr, hsr)
    if hsr not in HSR_VALUES:
        raise ValueError(f"sparrow_hsr={values['sparrow_hsr']!r}; expected one of {', '.join(HSR_VALUES)}")
    values["sparrow_hsr"] = hsr
    return values


def build_drafter(options, draft_backend, target_backend) -> SparrowDrafter:
    """methods.DRAFTERS["sparrow"]: the head from sparrow_head (default: the demo's, for the demo)."""
    if target_backend is None:
        raise ValueError("the Sparrow drafter needs the target backend (it reuses its embedding, LM head "
                         "and hidden states)")
    values = parse_options(options.extra)
    path = values["sparrow_head"]
    if path is None:
        if not is_demo_target(target_backend):
            raise ValueError("method=sparrow needs sparrow_head=<folder of a head trained for this target> "
                             "(`lvspec-eval train-sparrow --target ... --out DIR`); only the demo target has a "
                             "default head")
        path = DEMO_HEAD
    head = SparrowHead.load(path, target_backend)
    return SparrowDrafter(head, target_backend, options.tree_config(), hsr=values["sparrow_hsr"] == "on",
                          eager=options.eager_draft())
