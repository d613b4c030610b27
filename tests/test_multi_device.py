"""Models split over two devices (device_map): no operation mixes tensors of two devices.

There is one CPU here and no second device, so two are simulated. Every tensor carries a device
label, and a TorchFunctionMode sees every torch operation:
  - a tensor reports its label as `.device`; `.to(device)` / `.cpu()` / factories given `device=`
    give the result that label (the data stays on the CPU);
  - an operation whose tensor operands carry two labels raises, with PyTorch's own exceptions: a
    0-dim CPU tensor mixes with any device, and CPU index tensors may index a tensor elsewhere.
The two devices are `meta:0` and `meta:1` (labels only: nothing is ever allocated there), so host
tensors (CPU) are a third, as on a GPU machine. Models are split as accelerate's device_map
splits them: hooks move every module's inputs to that module's device; the first half of the
decoder layers (with the vision tower and the embeddings) sit on meta:0, the second half, the
final norm and the LM head on meta:1, and each layer's KV cache where its layer is.

What it proves: every method decodes with the target and the draft split like this, tokens equal
to an unsplit run, and without the fixes it raises (the SpecVLM collector summed layers of two
devices; prefill indexed meta:1 hidden states with a meta:0 mask; keep() gathered meta:1 cache
layers with a meta:0 index). What only a GPU run can confirm: kernels, copies between real
devices, and code that branches on a CUDA device type (clock synchronisation, memory figures).
"""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from lvspec_eval.backends.loading import load_backend
from lvspec_eval.demo import models, world
from lvspec_eval.decoding.runner import Runner, VideoInput

CPU, GPU0, GPU1 = torch.device("cpu"), torch.device("meta", 0), torch.device("meta", 1)
METHODS = ("vanilla", "sd_tree", "specvlm", "sparrow", "fly", "lvspec")
MAX_NEW = 24
DEVICE_GET, DATA_SET = torch.Tensor.device.__get__, torch.Tensor.data.__set__
INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)


def label(t: torch.Tensor) -> torch.device:
    return t.__dict__.get("_simulated_device", CPU)


def _tag(obj, device: torch.device) -> None:
    if isinstance(obj, torch.Tensor):
        obj._simulated_device = device
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            _tag(item, device)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _is_simulated(device) -> bool:
    return isinstance(device, (torch.device, str)) and torch.device(device).type == "meta"


class MixedDevices(RuntimeError):
    pass


class TwoDevices(TorchFunctionMode):
    """See the module docstring."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func == DEVICE_GET:
            return label(args[0])
        if func == DATA_SET:  # Module.to() swaps parameter data in place
            _tag(args[0], label(args[1]))
            return func(*args, **kwargs)
        if func is torch._has_compatible_shallow_copy_type:  # Module.to() asks whether it may do so
            return func(*args, **kwargs)
        if func in (torch.Tensor.to, torch.Tensor.cpu):
            return self._move(func, args, kwargs)
        target = kwargs.get("device")
        if _is_simulated(target):
            kwargs["device"] = "cpu"
        device = self._common_device(func, args, kwargs)
        out = func(*args, **kwargs)
        _tag(out, torch.device(target) if target is not None else device)
        return out

    @staticmethod
    def _common_device(func, args, kwargs) -> torch.device:
        operands = list(_tensors(kwargs))
        if func in INDEXING:  # tensor[index] = value: a CPU index may index any device
            operands += [args[0]] + [t for t in _tensors(args[1]) if label(t) != CPU] + list(_tensors(args[2:]))
        else:
            operands += list(_tensors(args))
        devices = {label(t) for t in operands if not (label(t) == CPU and t.dim() == 0)}
        if len(devices) > 1:
            raise MixedDevices(f"{getattr(func, '__name__', func)} mixes tensors on {sorted(map(str, devices))}")
        return devices.pop() if devices else CPU

    @staticmethod
    def _move(func, args, kwargs):
        source = args[0]
        target = CPU if func is torch.Tensor.cpu else label(source)
        rest = []
        for a in args[1:]:
            if isinstance(a, torch.Tensor):
                target = label(a)
            elif isinstance(a, (torch.device, str)):
                target, a = torch.device(a), ("cpu" if _is_simulated(a) else a)
            rest.append(a)
        if kwargs.get("device") is not None:
            target = torch.device(kwargs["device"])
            kwargs["device"] = "cpu"
        out = func(source, *rest, **kwargs)
        if out is source and target != label(source):
            out = out.view_as(out)  # a new tensor object for the copy on the other device
        _tag(out, target)
        return out


def _move_inputs(device):
    """accelerate's AlignDevicesHook: a module's tensor inputs go to its device."""

    def move(value):
        if isinstance(value, torch.Tensor):
            return value.to(device)
        if isinstance(value, (tuple, list)):
            return type(value)(move(v) for v in value)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        return value

    def hook(_module, args, kwargs):
        return move(args), move(kwargs)

    return hook


def split_over_two_devices(backend) -> None:
    """Place the backend's model on GPU0/GPU1 as a device_map would (see the module docstring)."""
    text = backend.text_model()
    half = len(text.layers) // 2
    second = list(text.layers[half:]) + [text.norm, backend.model.lm_head]
    first = [m for m in backend.model.children() if m is not backend.model.lm_head]  # vision, embeddings, ...
    for modules, device in ((first, GPU0), (second, GPU1)):
        for module in modules:
            for tensor in list(module.parameters()) + list(module.buffers()):
                _tag(tensor, device)
    for module in list(text.layers) + [text.norm, backend.model.lm_head]:
        module.register_forward_pre_hook(_move_inputs(GPU1 if module in second else GPU0), with_kwargs=True)
    backend.device = GPU0


@pytest.fixture(scope="module")
def video():
    torch.set_num_threads(1)
    scene = world.make_scene(2)
    return VideoInput(world.render(scene, models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE), models.FPS)


def _decode(target, draft, method: str, video) -> list[int]:
    runner = Runner("demo", method, draft="demo-draft", target_backend=target, draft_backend=draft)
    return runner.generate(world.CAPTION_PROMPT, [video], MAX_NEW).tokens


@pytest.fixture(scope="module")
def one_device_tokens(video) -> dict[str, list[int]]:
    target, draft = load_backend("demo"), load_backend("demo-draft")
    return {m: _decode(target, draft, m, video) for m in METHODS}


@pytest.fixture(scope="module")
def two_device_pair():
    target, draft = load_backend("demo"), load_backend("demo-draft")
    split_over_two_devices(target)
    split_over_two_devices(draft)
    return target, draft


def test_the_simulation_catches_what_two_gpus_refuse():
    a, b = torch.ones(3), torch.ones(3)
    with TwoDevices():
        a, b = a.to(GPU0), b.to(GPU1)
        assert a.device == GPU0 and (a + 1).device == GPU0 and a.cpu().device == CPU
        assert (b[torch.tensor([True, False, True])]).device == GPU1  # CPU indices are allowed
        assert (a + torch.tensor(2.0)).device == GPU0  # so are CPU scalars
        with pytest.raises(MixedDevices):
            a + b
        with pytest.raises(MixedDevices):
            b[a > 0]
        with pytest.raises(MixedDevices):
            b.index_select(0, torch.tensor([0, 1], device=GPU0))
        with pytest.raises(MixedDevices):
            a + torch.ones(3)  # a host tensor is a third device


@pytest.mark.parametrize("method", METHODS)
def test_every_method_decodes_with_both_models_split_over_two_devices(method, two_device_pair, one_device_tokens,
                                                                      video):
    target, draft = two_device_pair
    with TwoDevices():
        tokens = _decode(target, draft, method, video)
    assert tokens == one_device_tokens[method]


def test_the_clock_waits_for_every_cuda_device(monkeypatch):
    """With a device_map the models span several GPUs: the loop's clock must synchronise each of
    them (it synchronised only the first before), and none on a CPU-only run."""
    from lvspec_eval.decoding import loop

    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(str(device)))
    clock = loop.make_clock([torch.device("cuda:0"), torch.device("cuda:1"), torch.device("cpu")])
    clock()
    assert synced == ["cuda:0", "cuda:1"]
    synced.clear()
    loop.make_clock([torch.device("cpu")])()
    assert synced == []


@pytest.mark.parametrize("method", ("vanilla", "sd_tree", "specvlm", "fly", "lvspec"))
@pytest.mark.parametrize("fixture", ("qwen3_family", "qwen3_5_family"))
def test_qwen3_families_decode_split_over_two_devices(method, fixture, request):
    """Qwen3-VL's DeepStack features come from the tower on the first device and are added after
    layers that sit on the second (the tiny target's layers 2-3, the draft's layer 2), and its
    pruned drafts gather them by the kept indices; Qwen3.5's linear-attention states and their
    temporary entries sit with their layers on either device: the same tokens as on one device."""
    import contextlib

    import numpy as np

    family = request.getfixturevalue(fixture)
    paths = [str(b.model.name_or_path) for b in (family.target, family.draft)]
    frames = np.random.default_rng(3).integers(0, 256, size=(4, 64, 96, 3), dtype=np.uint8)
    video = VideoInput(frames, 2.0, np.array([0, 10, 20, 30]), 20.0)

    def decode(split: bool) -> list[int]:
        target, draft = load_backend(paths[0]), load_backend(paths[1])
        if split:
            split_over_two_devices(target)
            split_over_two_devices(draft)
        with TwoDevices() if split else contextlib.nullcontext():
            # a fixed tree: the adaptive one follows the clock, and a lossy method's tokens with it
            runner = Runner(paths[0], method, draft=paths[1], target_backend=target, draft_backend=draft,
                            options={"tree": "dynamic", "tree_depth": 3, "tree_topk": 2, "tree_total": 6})
            return runner.generate("describe the video", [video], 12).tokens

    assert decode(True) == decode(False)
