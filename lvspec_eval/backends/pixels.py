"""Frame resizing and normalisation with the arithmetic of the reference pipelines, in plain torch.

lmms-eval's classes resize frames with torchvision, which does not import on a CPU-only torch (its
PyPI builds are CUDA builds whose C extension fails to load). Its resize is a thin layer over
`torch.nn.functional.interpolate`, so the same calls give the same bits:

- qwen-vl-utils (`fetch_video`, torchvision.transforms.functional.resize on a uint8 [T, C, H, W]
  tensor permuted from [T, H, W, C]): cast to float32 (strides kept), bicubic with antialias,
  clamp to [0, 255], round, back to uint8; qwen-vl-utils then hands the frames over as float.
- transformers' video processors (torchvision.transforms.v2.functional.resize on a contiguous uint8
  [T, C, H, W] tensor): on the CPU, bicubic runs torch's native uint8 kernel directly.
- both skip the resize when the size does not change.
- rescale and normalise fused as transformers' torchvision backend does: (x - mean * 255) / (std * 255)
  in float32, with mean * 255 and std * 255 computed in float32.

tests/test_parity.py checks these bit for bit against lmms-eval's classes running torchvision itself.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def resize_qwen_vl_utils(frames: np.ndarray, height: int, width: int) -> torch.Tensor:
    """uint8 [T, H, W, 3] -> float32 [T, 3, height, width] holding integers 0..255 (qwen-vl-utils)."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # strides as decord's frames get
    if tuple(x.shape[-2:]) == (height, width):
        return x.float()
    y = F.interpolate(x.to(torch.float32), size=[height, width], mode="bicubic", align_corners=False, antialias=True)
    return y.clamp_(0, 255).round_().to(torch.uint8).float()


def resize_transformers(frames: np.ndarray, height: int, width: int) -> torch.Tensor:
    """uint8 [T, H, W, 3] -> uint8 [T, 3, height, width] (transformers' torchvision video processors, CPU)."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()
    if tuple(x.shape[-2:]) == (height, width):
        return x
    return F.interpolate(x, size=[height, width], mode="bicubic", align_corners=False, antialias=True)


def normalise_fused(x: torch.Tensor, mean, std) -> torch.Tensor:
    """[T, 3, H, W] values 0..255 -> float32 (x - mean * 255) / (std * 255), channel-wise."""
    m = (torch.tensor(mean) * 255.0).view(-1, 1, 1)
    s = (torch.tensor(std) * 255.0).view(-1, 1, 1)
    return x.to(torch.float32).sub(m).div(s)
