"""Run lmms-eval's OWN model class on one request and record what it fed the model and what it got back.

tests/test_parity.py runs this file in a subprocess (`python tests/parity_reference.py SPEC.json`), so that
the packages lmms-eval's classes need, and which the project's environment does not import, stay out of
the test process:

- torchvision: the only builds the package index has are CUDA builds; their C extension does not load on
  a CPU-only torch, and `import torchvision` dies in `torchvision/_meta_registrations.py` ("operator
  torchvision::nms does not exist"). The wheel (pinned, PARITY_DEPS in test_parity.py) is unpacked into
  a folder of its own and that one module is replaced by an empty one before the import; everything the
  classes use (transforms.functional.resize, transforms.v2.functional, transformers' video processors)
  is torchvision's own pure-Python code calling torch.
- decord (pinned, the same folder): lmms-eval's classes read videos with it (a real build, it imports).
- qwen-vl-utils is installed with lmms-eval; it imports torchvision, so it only imports here.

The spec (JSON) names lmms-eval's class (module, name, model_args), its interface (`kind`: `chat` or
`simple`), the checkpoint folder, the task's doc (messages for chat, context + video for simple) and
gen_kwargs. With `"build": true` the script instead
writes a tiny random checkpoint in the family's public folder layout (weights, tokenizer, processor
configs, chat template), which only a torchvision install can save. What it records (torch.save):
the frames lmms-eval's video reader (decord) decoded, the inputs the class handed to generate() (the
processor's output), the position ids of the prefill, the generated tokens and the answer text.
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path


def bootstrap(deps: str) -> None:
    """Make torchvision (CUDA build, pure-Python parts only) and decord importable from `deps`."""
    sys.path.insert(0, deps)
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")


# ---- checkpoints in the families' public layouts -----------------------------------------------

def build_checkpoint(spec: dict) -> None:
    """spec["builder"]: the name of a function of parity_checkpoints.py (test_parity.FAMILIES)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import parity_checkpoints

    torch.manual_seed(spec.get("seed", 0))
    getattr(parity_checkpoints, spec["builder"])(Path(spec["checkpoint"]))


# ---- lmms-eval's classes ---------------------------------------------------------------------------

def make_class(spec: dict):
    """spec["reference"]: [module, class name, extra model_args] of the lmms-eval class (test_parity.FAMILIES)."""
    import importlib

    module, name, extra = spec["reference"]
    return getattr(importlib.import_module(module), name)(pretrained=spec["checkpoint"], device="cpu", **extra)


def record_model_calls(model, record: dict) -> None:
    """Wrap model.generate (its inputs and output) and the language model's first forward (positions)."""
    generate = model.generate

    def wrapped(*args, **kwargs):
        record["generate_kwargs"] = {k: v.detach().clone() for k, v in kwargs.items() if hasattr(v, "detach")}
        out = generate(*args, **kwargs)
        record["sequences"] = out.detach().clone()
        return out

    model.generate = wrapped

    def pre_hook(_module, args, kwargs):
        if "position_ids" not in record:
            record["position_ids"] = kwargs["position_ids"].detach().clone()

    model.model.language_model.register_forward_pre_hook(pre_hook, with_kwargs=True)


def record_frames(record: dict) -> None:
    """What decord handed over (frame indices and uint8 frames)."""
    import decord

    get_batch = decord.VideoReader.get_batch

    def wrapped(self, indices):
        out = get_batch(self, indices)
        record.setdefault("decord_indices", []).append(list(indices))
        record.setdefault("decord_frames", []).append(out.asnumpy().copy())
        return out

    decord.VideoReader.get_batch = wrapped


def request(spec: dict):
    from lmms_eval.api.instance import Instance

    doc = spec["doc"]
    if spec["kind"] == "chat":
        args = ("ctx", lambda d: d["messages"], dict(spec["gen_kwargs"]), 0, "parity", "test")
    else:
        args = (doc["context"], dict(spec["gen_kwargs"]), lambda d: [d["video"]], 0, "parity", "test")
    return Instance(request_type="generate_until", arguments=args, idx=0,
                    metadata={"task": "parity", "doc_id": 0, "repeats": 1})


def run(spec: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    record: dict = {}
    record_frames(record)
    lm = make_class(spec)
    record_model_calls(lm.model, record)
    lm.task_dict = {"parity": {"test": [spec["doc"]]}}
    out = lm.generate_until([request(spec)])[0]
    record["text"] = out.text if hasattr(out, "text") else out
    record["dtype"] = str(lm.model.dtype)
    record["model_class"] = type(lm.model).__name__
    return record


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    bootstrap(spec["deps"])
    if spec.get("build"):
        build_checkpoint(spec)
        return
    import torch

    torch.save(run(spec), spec["out"])


if __name__ == "__main__":
    main()
