"""drafter=mtp: draft with the checkpoint's own multi-token-prediction (MTP) layer.

The public Qwen3.5 (and Qwen3-Next) checkpoints store, beside the main weights, one MTP layer
trained with the model (`mtp_num_hidden_layers: 1` in the text config). transformers does not load
it (`_keys_to_ignore_on_load_unexpected = ["^mtp.*"]`); serving engines do (vLLM's qwen3_5_mtp /
qwen3_next_mtp, sglang). What they do, and what this module does the same way:

Weights (safetensors keys; `fc` has no bias):

    mtp.pre_fc_norm_embedding.weight   RMSNorm of the token's input embedding
    mtp.pre_fc_norm_hidden.weight      RMSNorm of the target's hidden state
    mtp.fc.weight                      [hidden, 2 * hidden]
    mtp.layers.0.*                     one decoder layer of the model's own kind, full attention
                                       (Qwen3.5: gated attention, q/k norms; MLP or MoE as the model;
                                       MoE experts fused or one at a time)
    mtp.norm.weight                    the output norm

The embedding and the LM head are the target's. At a sequence row s the layer input is

    fc([pre_fc_norm_embedding(embed(token_{s+1})); pre_fc_norm_hidden(h_s)])    (embedding first)

where h_s is the target's final hidden state (after its final norm: what its LM head reads) at
row s; the layer runs at the target's own position of row s (M-RoPE for Qwen3.5), and
norm(layer output) is the MTP's estimate of h_{s+1}: the LM head turns it into the next token.

- Prompt: the MTP layer's KV cache gets every prompt row s = 0 .. L-2 (the engines feed the drafter
  the same tokens as the target, shifted one ahead), visual rows included, with the same input
  embeddings the target had there (the vision tower's features at visual tokens), at the target's
  positions of the rows.
- Generated token i (sequence row L + i) is fed with h of row L + i - 1 at that row's position.
- More draft tokens than MTP layers: the one layer runs again, fed its own normed output as h and
  the drafted token, one position further on (vLLM: `positions + 1`, hidden = the MTP output).
  Trees grow the same way, each node fed its parent's output.

Everything else (which target hidden states are known, the pending tail, lazy preparation, tree
growth and the adaptive policy) is Sparrow's machinery: hidden_state.HiddenStateDrafter. Only
checkpoints with one MTP layer (every public Qwen3.5 / Qwen3-Next release) are supported.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import ClassVar

import torch
from safetensors import safe_open
from torch import nn

from ...backends.base import Backend, DecodeState, PreparedInputs
from ..tree import TreeConfig
from .hidden_state import HiddenStateDrafter

PREFIX = "mtp."
INDEX = "model.safetensors.index.json"


def full_attention_layer(text_model, text_config) -> nn.Module:
    """A full-attention decoder layer of the target (the MTP layer is one of its kind)."""
    kinds = getattr(text_config, "layer_types", None) or []
    index = kinds.index("full_attention") if "full_attention" in kinds else 0
    return text_model.layers[index]


def head_config(text_config):
    """The target's text config for one full-attention layer; sdpa with explicit float masks (as Sparrow)."""
    cfg = copy.deepcopy(text_config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = ["full_attention"]
    cfg._attn_implementation = "sdpa"
    return cfg


class MTPHead(nn.Module):
    """The checkpoint's MTP layer: its parameter names are the checkpoint's keys without `mtp.`.

    Built from the target (its full-attention decoder layer class, its norm class, its rotary
    embedding, borrowed, not owned: no weights of its own, and it keeps the target's float32 angles)."""

    def __init__(self, config, layer_cls: type, norm_cls: type, rotary: nn.Module):
        super().__init__()
        self.config = config
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = norm_cls(hidden, eps=eps)
        self.pre_fc_norm_hidden = norm_cls(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([layer_cls(config, layer_idx=0)])
        self.norm = norm_cls(hidden, eps=eps)
        self._rotary = (rotary,)  # a tuple: not a submodule (not in the state dict, not cast)

    @classmethod
    def for_target(cls, backend: Backend) -> MTPHead:
        """An MTP head shaped for `backend`'s text model (random weights until loaded)."""
        text_config = backend.model.config.get_text_config()
        text = backend.text_model()
        layer = full_attention_layer(text, text_config)
        return cls(head_config(text_config), type(layer), type(text.norm), text.rotary_emb)

    def project(self, embeds: torch.Tensor, prev_hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] x 2 -> [..., hidden]: the layer input from a token's embedding and the previous h."""
        return self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(prev_hidden)], dim=-1))

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None,
                cache=None) -> torch.Tensor:
        """x [b, m, hidden] layer inputs; position_ids as the target's text model takes them;
        mask [b, 1, m, keys] additive float (None: causal over x alone). Returns the normed
        outputs [b, m, hidden]; with a cache, the m new keys/values are appended to it."""
        out = self.layers[0](x, position_embeddings=self._rotary[0](x, position_ids), attention_mask=mask,
                             cache=cache, use_cache=cache is not None)
        return self.norm(out[0] if isinstance(out, tuple) else out)

    @classmethod
    def load(cls, backend: Backend, path: str | Path | None = None) -> MTPHead:
        """The MTP layer of the checkpoint at `path` (default: the folder `backend` was loaded from),
        on the target's device and dtype. ValueError when the checkpoint has no (or unusable) MTP weights."""
        folder = checkpoint_folder(path if path is not None else backend.model.name_or_path)
        tensors = read_mtp_tensors(folder)
        if not tensors:
            raise ValueError(f"drafter=mtp: the checkpoint in {folder} has no MTP weights ({PREFIX}* tensors); it "
                             "needs a checkpoint saved with its multi-token-prediction layer, as the public Qwen3.5 "
                             "releases are (transformers' save_pretrained drops it), or mtp_checkpoint=<folder that "
                             "has them>")
        text_config = backend.model.config.get_text_config()
        stored = {int(k.split(".")[1]) for k in tensors if k.startswith("layers.")}
        declared = int(getattr(text_config, "mtp_num_hidden_layers", None) or 1)
        if max(stored, default=0) > 0 or declared > 1:
            raise ValueError(f"drafter=mtp supports one MTP layer; the checkpoint in {folder} has "
                             f"{max(len(stored), declared)} (mtp_num_hidden_layers)")
        head = cls.for_target(backend)
        tensors = fuse_experts(tensors, head.state_dict())
        try:
            missing, unexpected = head.load_state_dict(tensors, strict=False)
        except RuntimeError as err:  # shape mismatches
            raise ValueError(f"drafter=mtp: the MTP weights in {folder} do not fit the target: {err}") from None
        if missing or unexpected:
            raise ValueError(f"drafter=mtp: the MTP weights in {folder} do not match the target's layer: missing "
                             f"{[PREFIX + k for k in missing]}, unexpected {[PREFIX + k for k in unexpected]}")
        return head.to(backend.device, backend.model.dtype).eval()


def fuse_experts(tensors: dict[str, torch.Tensor], expected: dict) -> dict[str, torch.Tensor]:
    """MoE MTP layers stored one expert at a time (`...mlp.experts.<e>.gate_proj.weight`, `up_proj`,
    `down_proj`) into the fused parameters transformers' MoE layer holds (`experts.gate_up_proj`
    [experts, 2 * inter, hidden], gate rows first; `experts.down_proj` [experts, hidden, inter]), as
    transformers converts the main weights at load. Other keys pass unchanged."""
    out, parts = dict(tensors), ("gate_proj", "up_proj", "down_proj")
    for fused in (k for k in expected if k.endswith("experts.gate_up_proj")):
        base = fused[: -len("gate_up_proj")]
        names = {part: [f"{base}{e}.{part}.weight" for e in range(expected[fused].shape[0])] for part in parts}
        if fused in out or not all(n in out for ns in names.values() for n in ns):
            continue
        gate, up, down = (torch.stack([out.pop(n) for n in names[part]]) for part in parts)
        out[fused], out[base + "down_proj"] = torch.cat([gate, up], dim=1), down
    return out


def checkpoint_folder(name: str | Path) -> Path:
    """A local folder, or a hub id already in the local cache (nothing is downloaded)."""
    path = Path(name)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(str(name), local_files_only=True, allow_patterns=["*.safetensors", "*.json"]))
    except (OSError, ValueError) as err:  # not in the local cache, not a hub id
        raise ValueError(f"drafter=mtp: cannot find the checkpoint folder of {str(name)!r} ({err}); "
                         "give it with mtp_checkpoint=<folder>") from None


def read_mtp_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The `mtp.*` tensors of a safetensors checkpoint (one file, or shards with an index), keys
    without the prefix."""
    index = folder / INDEX
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({file for key, file in weight_map.items() if key.startswith(PREFIX)})
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    tensors = {}
    for file in files:
        with safe_open(str(folder / file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safetensors file, not a dict)
                if key.startswith(PREFIX):
                    tensors[key[len(PREFIX):]] = f.get_tensor(key)
    return tensors


class MTPDrafter(HiddenStateDrafter):
    """Drafts trees (or chains) with the checkpoint's MTP layer (see the module docstring).

    Cache slot s holds sequence row s (h_s and the token after it): the prompt's rows 0 .. L-2,
    then generated token i in slot L - 1 + i; a slot's position is the target's position of its row."""

    name = "mtp"
    OPTIONS: ClassVar[dict] = {"mtp_checkpoint": None}

    def __init__(self, head: MTPHead, target: Backend, tree: TreeConfig, eager: bool = True):
        super().__init__(head, target, tree, eager)
        self.prompt_len = 0
        self.prompt_positions: torch.Tensor | None = None  # the target's position ids of the prompt rows
        self.state_extra: dict = {}  # the target's per-request position state (e.g. Qwen's rope delta)
        self._embeds: torch.Tensor | None = None  # the target's prompt embeddings, until prepared

    @torch.no_grad()
    def start(self, target: Backend, inputs: PreparedInputs, target_state: DecodeState, clock) -> dict:
        self.prompt_len = int(inputs.input_ids.shape[1])
        self.prompt_positions = target.prefill_positions(inputs).to(target.device)
        self.state_extra = target_state.extra
        self._embeds = inputs.extra.get("embeds")  # the target's own (vision tower included), computed at prefill
        return super().start(target, inputs, target_state, clock)

    def finish(self) -> None:
        """Also let go of the prompt's position ids, the target's per-request position state and its prompt
        embeddings (held until prepared)."""
        super().finish()
        self.prompt_positions, self.state_extra, self._embeds = None, {}, None

    def _prompt_rows(self, inputs: PreparedInputs, hidden: torch.Tensor):
        """Rows 1 .. L-1 (every token but the first, visual ones included) with the target's input
        embeddings there, each fed with h of the row before it."""
        embeds = self._embeds if self._embeds is not None else self.target.input_embeds(inputs)
        self._embeds = None
        return inputs.input_ids[0, 1:], embeds[0, 1:], hidden[:-1]

    def _kept_visual_tokens(self, inputs: PreparedInputs) -> int:
        return inputs.num_visual_tokens

    def _position_ids(self, slots: torch.Tensor) -> torch.Tensor:
        """The target's position ids of sequence rows `slots`: the prompt's own, then the
        generated tokens' (`Backend.position_ids`)."""
        last = self.prompt_len - 1
        inside = self.prompt_positions[..., slots.clamp(max=last)]
        after = self.target.position_ids(self.state_extra, slots).to(inside.device)
        return torch.where(slots <= last, inside, after)


def parse_options(extra: dict) -> dict:
    unknown = sorted(k for k in extra if k.startswith("mtp_") and k not in MTPDrafter.OPTIONS)
    if unknown:
        raise ValueError(f"unknown MTP option(s) {', '.join(unknown)}; expected {', '.join(MTPDrafter.OPTIONS)}")
    return {k: extra.get(k, default) for k, default in MTPDrafter.OPTIONS.items()}


def build_drafter(options, draft_backend, target_backend) -> MTPDrafter:
    """methods.DRAFTERS["mtp"]: the target checkpoint's MTP layer (or mtp_checkpoint's)."""
    if target_backend is None:
        raise ValueError("the MTP drafter needs the target backend (its MTP layer reads the target's hidden states)")
    values = parse_options(options.extra)
    head = MTPHead.load(target_backend, values["mtp_checkpoint"])
    return MTPDrafter(head, target_backend, options.tree_config(), eager=options.eager_draft())
