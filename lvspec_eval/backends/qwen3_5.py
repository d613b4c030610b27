"""Qwen3.5 (dense, and MoE where the text model allows it): natively multimodal, hybrid linear attention.

What differs from Qwen3-VL (qwen3_vl.py), as transformers 5.24 does it:
- The language model is a hybrid: three of every four decoder layers are Gated DeltaNet (linear
  attention: a recurrent state and a short convolution state instead of keys and values), one in
  four full attention. The engine's cache contract covers both (linear_state.py): nothing here.
- No DeepStack: the vision tower returns only its merged tokens.
- The processor, timestamps and M-RoPE positions are Qwen3-VL's (`get_rope_index(input_ids,
  mm_token_type_ids, video_grid_thw)`, one group per temporal patch); patch 16, merge 2.
- Rule `lmms_eval` follows lmms-eval's `qwen3_5` class (qwen_vision.LMMS_EVAL_QWEN3_5): qwen-vl-utils'
  2 frames per second up to 768 frames, 64 to 768 tokens per frame within 224 x 1024 tokens a video,
  where Qwen3-VL's class takes 32 frames. Its thinking prompt and answers: models/parity.py.
"""
from __future__ import annotations

import torch

from .base import PreparedInputs
from .qwen3_vl import Qwen3VLBackend
from .qwen_vision import LMMS_EVAL_QWEN3_5


class Qwen3_5Backend(Qwen3VLBackend):
    layout_name = "qwen3_5"  # dense and MoE share it: a small dense draft serves an MoE target
    lmms_eval_video = LMMS_EVAL_QWEN3_5

    @property
    def family(self) -> str:
        """lmms-eval's qwen3_5 class serves dense and MoE checkpoints alike (models/parity.py)."""
        return "qwen3_5"

    def vision_outputs(self, inputs: PreparedInputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """([num_visual, hidden] merged tokens, no DeepStack features)."""
        kw = inputs.model_kwargs
        out = self.model.model.visual(kw["pixel_values_videos"], grid_thw=kw["video_grid_thw"])
        return out.pooler_output, []
