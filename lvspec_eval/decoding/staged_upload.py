"""Host values to the device without a host synchronisation (host_sync.py counts what does synchronise)."""
from __future__ import annotations

import numpy as np
import torch


class StagedUpload:
    """Small device tensors made from host values without a host synchronisation: the values go into
    a host buffer (pinned on CUDA) and are copied to the device asynchronously, behind the work already
    queued, so every later use of the tensor sees them (`torch.tensor(values, device=...)` copies from
    pageable memory, which waits for the queue). An upload first waits for the previous copy to have
    left the buffer (an event, long done by then: the steps read the device in between). On a CPU it
    is a plain copy."""

    def __init__(self, size: int, device: torch.device, dtype=torch.float32):
        device = torch.device(device)
        cuda = device.type == "cuda"
        self.device = device
        self._host = torch.empty(size, dtype=dtype, pin_memory=cuda)
        self._event = torch.cuda.Event() if cuda else None

    def upload(self, values: list[float]) -> torch.Tensor:
        """`values` (`size` of them) on the device, as a new tensor."""
        if self._event is not None:
            self._event.synchronize()  # the previous copy has read the buffer
        self._host.copy_(torch.from_numpy(np.asarray(values, dtype=np.float64)))
        tensor = self._host.to(self.device, non_blocking=True)
        if self._event is not None:
            self._event.record()
        return tensor if tensor is not self._host else tensor.clone()  # on a CPU: not the buffer itself
