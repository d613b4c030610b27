"""model_args: typing of lmms-eval's strings, defaults, and the errors that stop a run at start."""
from __future__ import annotations

import pytest
import torch
from lmms_eval.utils import simple_parse_args_string

from lvspec_eval.demo import models as demo_models
from lvspec_eval.models.args import DEMO_MAX_FRAMES, ModelArgs, read_gen_kwargs

NO_CUDA = not torch.cuda.is_available()


def parse(arg_string: str) -> ModelArgs:
    """As lmms-eval does it: `k=v,k=v` half-typed by its own parser, then ours."""
    return ModelArgs.parse(simple_parse_args_string(arg_string))


def test_values_get_their_field_types():
    args = parse("pretrained=Qwen/Qwen2.5-VL-7B-Instruct,method=sd_tree,max_frames=16,fps=1,min_pixels=784,"
                 "max_new_tokens=32,tree=chain,tree_depth=7,prune_ratio=0.5,prune_lambda=1")
    assert (args.max_frames, args.fps, args.min_pixels, args.max_new_tokens) == (16, 1.0, 784, 32)
    assert isinstance(args.fps, float)
    assert args.options == {"tree": "chain", "tree_depth": 7, "prune_ratio": 0.5, "prune_lambda": 1.0}
    assert isinstance(args.options["prune_lambda"], float)


def test_verifier_and_drafter_options_pass_through_typed():
    args = parse("pretrained=demo,fly_window=4,lv_threshold=0.25,lv_loose=topk,pst=off")
    assert args.options == {"fly_window": 4, "lv_threshold": 0.25, "lv_loose": "topk", "pst": "off"}


def test_verifier_options_are_checked_by_their_owners_at_start():
    with pytest.raises(ValueError, match="lv_treshold"):
        parse("pretrained=demo,lv_treshold=0.5")


def test_python_callers_may_pass_strings():
    args = ModelArgs.parse({"pretrained": "demo", "max_frames": "12", "fps": "0.5", "tree_topk": "4"})
    assert (args.max_frames, args.fps, args.options["tree_topk"]) == (12, 0.5, 4)


@pytest.mark.skipif(not NO_CUDA, reason="defaults differ on a CUDA machine")
def test_defaults_on_cpu():
    args = parse("pretrained=Qwen/Qwen2.5-VL-7B-Instruct")
    assert (args.method, args.draft, args.device, args.dtype, args.attn_implementation) == (
        "vanilla", "self", "cpu", "float32", "sdpa")
    # max_new_tokens None: the matched lmms-eval class's default (models/parity.py), e.g. 128 for qwen2_5_vl chat
    assert (args.fps, args.max_frames, args.max_new_tokens, args.batch_size) == (None, None, None, 1)
    assert args.video_rule == "lmms_eval"  # fps/max_frames None: lmms-eval's own (backends/frame_rules.py)
    assert args.until == "class"  # the task's stop strings are treated as lmms-eval's class treats them


def test_demo_defaults_follow_the_demo_videos():
    args = parse("pretrained=demo")
    assert args.draft == "demo-draft"
    assert (args.fps, args.max_frames) == (demo_models.FPS, DEMO_MAX_FRAMES)  # every frame of every synthvid video
    assert parse("pretrained=demo,draft=self,fps=2,max_frames=8").draft == "self"
    assert parse("pretrained=demo").until == "task"  # the demo's figures were made with the task's stop strings
    with pytest.raises(ValueError, match="until='never'.*class, task"):
        parse("pretrained=demo,until=never")


def test_runner_kwargs_carry_everything_the_runner_takes():
    kwargs = parse("pretrained=demo,method=sd_tree,draft=self,tree_depth=3,min_pixels=784").runner_kwargs()
    assert kwargs["pretrained"] == "demo" and kwargs["method"] == "sd_tree" and kwargs["draft"] == "self"
    assert kwargs["options"] == {"tree_depth": 3} and kwargs["min_pixels"] == 784
    assert kwargs["paired_timing"] is False
    assert parse("pretrained=demo,method=sd_tree,paired_timing=true").runner_kwargs()["paired_timing"] is True


@pytest.mark.parametrize("arg_string, message", [
    ("pretrained=demo,temprature=0", r"unknown model_args temprature; accepted: pretrained, draft, method"),
    ("pretrained=demo,max_frames=abc", r"max_frames='abc' is not an integer"),
    ("pretrained=demo,max_frames=2.5", r"max_frames=2.5 is not an integer"),
    ("pretrained=demo,fps=fast", r"fps='fast' is not a number"),
    ("pretrained=demo,tree_depth=deep", r"tree_depth='deep' is not an integer"),
    ("pretrained=demo,prune_ratio=lots", r"prune_ratio='lots' is not a number"),
    ("pretrained=demo,method=vanila", r"unknown method 'vanila'.*Did you mean 'vanilla'"),
    ("pretrained=demo,method=custom", r"method=custom needs drafter=<name> and verifier=<name>"),
    ("pretrained=demo,method=custom,drafter=model,verifier=nope", r"unknown verifier 'nope'"),
    ("pretrained=demo,dtype=float64", r"dtype='float64' is not supported; expected one of float32"),
    ("pretrained=demo,attn_implementation=flash", r"attn_implementation='flash' is not supported"),
    ("pretrained=demo,batch_size=4", r"batch_size=4 is not supported"),
    ("pretrained=demo,max_new_tokens=0", r"max_new_tokens=0 must be a positive integer"),
    ("pretrained=demo,fps=0", r"fps=0.0 must be positive"),
    ("pretrained=demo,min_pixels=1000,max_pixels=10", r"min_pixels=1000 is larger than max_pixels=10"),
    ("pretrained=demo,tree=bushy", r"tree='bushy' is not a tree kind"),
    ("pretrained=demo,prune_ratio=1.5", r"prune_ratio must be in \[0, 1\)"),
    ("pretrained=demo,device=tpu9", r"device='tpu9' is not a device"),
    ("pretrained=/no/such/model", r"pretrained='/no/such/model' looks like a local path but does not exist"),
    ("pretrained=./no-such-model", r"pretrained='./no-such-model' looks like a local path"),
    ("pretrained=~/no-such-model-lvspec", r"pretrained='~/no-such-model-lvspec' looks like a local path"),
    ("pretrained=demo,draft=/no/such/draft", r"draft='/no/such/draft' looks like a local path"),
])
def test_bad_model_args_fail_with_a_message_naming_them(arg_string, message):
    with pytest.raises(ValueError, match=message):
        parse(arg_string)


@pytest.mark.skipif(not NO_CUDA, reason="CUDA is available here")
def test_cuda_requested_without_cuda():
    with pytest.raises(ValueError, match="device='cuda' but CUDA is not available"):
        parse("pretrained=demo,device=cuda")


def test_a_path_whose_first_part_exists_is_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ValueError, match="pretrained='checkpoints/missing' looks like a local path"):
        parse("pretrained=checkpoints/missing")
    assert parse("pretrained=Qwen/Qwen2.5-VL-7B-Instruct").pretrained == "Qwen/Qwen2.5-VL-7B-Instruct"  # hub id


def test_batch_size_one_in_any_form_is_accepted():
    assert ModelArgs.parse({"pretrained": "demo", "batch_size": "1"}).batch_size == 1
    assert ModelArgs.parse({"pretrained": "demo", "batch_size": 1, "max_batch_size": None}).batch_size == 1


def test_the_model_class_fails_at_construction_before_loading_anything():
    from lvspec_eval.models.lvspec import LVSpecChat, LVSpecSimple

    for cls in (LVSpecChat, LVSpecSimple):
        with pytest.raises(ValueError, match="unknown method 'fastest'"):
            cls(pretrained="/definitely/not/loaded", method="fastest")
        with pytest.raises(ValueError, match="does not exist"):
            cls(pretrained="/no/such/model", method="vanilla")


# ---- generation_kwargs ---------------------------------------------------------------------------

def test_gen_kwargs_defaults_and_overrides():
    s = read_gen_kwargs(None, 256)
    assert (s.max_new_tokens, s.until, s.sampling_ignored) == (256, (), False)
    s = read_gen_kwargs({"max_new_tokens": 64, "until": "\n\n", "temperature": 0}, 256)
    assert (s.max_new_tokens, s.until, s.sampling_ignored) == (64, ("\n\n",), False)
    s = read_gen_kwargs({"until": ["<|im_end|>", ""], "temperature": 0.7}, 16)
    assert (s.until, s.requested_temperature, s.sampling_ignored) == (("<|im_end|>",), 0.7, True)
    assert read_gen_kwargs({"do_sample": True}, 16).sampling_ignored


def test_stop_strings_follow_the_matched_lmms_eval_class():
    from lvspec_eval.models.parity import class_rules, stop_strings

    until = ("\n\n", "Question:")  # lmms-eval's default blank line, and a task's own stop string
    chat, simple = class_rules("qwen2_5_vl", "chat", "class"), class_rules("qwen2_5_vl", "simple", "class")
    assert stop_strings(until, chat) == ()  # lmms-eval's chat qwen2_5_vl never reads `until`
    assert stop_strings(until, simple) == ("Question:",)  # its simple class drops the blank line only
    assert stop_strings(until, class_rules("llava_onevision", "simple", "class")) == ()  # llava_hf never applies it
    assert stop_strings(until, class_rules("qwen2_5_vl", "chat", "task")) == until
    assert (chat.max_new_tokens, simple.max_new_tokens) == (128, 32768)
    with pytest.raises(ValueError, match="no lmms-eval reference class.*until=task"):
        class_rules("qwen9", "chat", "class")


def test_bad_gen_kwargs():
    with pytest.raises(ValueError, match="max_new_tokens='many' is not an integer"):
        read_gen_kwargs({"max_new_tokens": "many"}, 16)
    with pytest.raises(ValueError, match="max_new_tokens=0 must be at least 1"):
        read_gen_kwargs({"max_new_tokens": 0}, 16)


def test_on_device_error_defaults_to_abort_and_takes_skip():
    assert parse("pretrained=demo").on_device_error == "abort"
    assert parse("pretrained=demo,on_device_error=skip").on_device_error == "skip"
    with pytest.raises(ValueError, match="on_device_error='ignore' is not supported; expected one of abort, skip"):
        parse("pretrained=demo,on_device_error=ignore")
