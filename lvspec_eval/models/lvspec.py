"""lmms-eval model `lvspec`: a chat class (the current interface) and a simple class.

Both are thin: they turn a request into (prompt, videos, generation settings), call
`runner.Runner.generate`, and write one statistics line per request. Decoding lives in decoding/,
model families in backends/. A sample that cannot be run (missing or corrupt video, a prompt
longer than the context, an error raised by the model) fails alone: it is logged with its doc id,
answered with an empty string and recorded with its reason; the run goes on. A failure of the device
(a CUDA error such as a device-side assert, or running out of memory) stops the run instead, naming
the sample: after a device-side assert every later sample fails too, and lmms-eval would score the
empty answers (model_arg on_device_error=skip fails such a sample alone, e.g. to skip rare
out-of-memory samples). With lmms-eval's --use_cache and stats_path, a rerun of a killed run serves
the samples that completed from their stats records and decodes the rest (models/resume.py).
"""
from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from lmms_eval.api.instance import GenerationResult, Instance, TokenCounts
from lmms_eval.api.model import lmms
from lmms_eval.protocol import ChatMessages
from loguru import logger
from tqdm import tqdm

from ..backends import contention
from ..backends.chat_template import check_video_template, render_text
from ..decoding.loop import make_clock
from ..decoding.runner import Generation, Runner, VideoInput
from .args import GenSettings, ModelArgs, read_gen_kwargs
from .parity import PROMPT_VARIANT_VAR, class_rules, final_answer, prompt_variant, stop_strings, thinking_mode
from .resume import Resume, load_choices, machine_settings, request_key, run_settings, video_fingerprint
from .stats_writer import StatsWriter, failure_record, success_record
from .throughput import Throughput
from .video import VideoError, load_video

# Exceptions that mean the accelerator failed, not this sample's input (torch.AcceleratorError covers
# CUDA errors such as device-side asserts; DeferredCudaCallError is not even a RuntimeError).
DEVICE_ERRORS = (torch.AcceleratorError, torch.OutOfMemoryError, torch.cuda.CudaError,
                 torch.cuda.DeferredCudaCallError)
# ... and what older code paths raise as a plain RuntimeError for the same failures.
DEVICE_ERROR_MARKERS = ("CUDA error", "CUDA out of memory", "CUBLAS_STATUS_", "CUDNN_STATUS_", "NCCL error",
                        "device-side assert", "can't allocate memory")


class DeviceFailure(RuntimeError):
    """The device failed on a sample and on_device_error=abort: the run stops, naming the sample."""


@dataclass
class RequestInfo:
    """What every request carries, whichever interface built it."""

    context: str
    gen_kwargs: dict | None
    doc_id: int
    task: str
    split: str
    build: Callable  # doc_to_messages (chat) or doc_to_visual (simple)


class _LVSpecModel(lmms):
    """Shared by both classes; subclasses say how a request becomes a prompt and video paths."""

    def __init__(self, **model_args: Any) -> None:
        super().__init__()
        self.args = ModelArgs.parse(model_args)
        use_cache = lmms_eval_use_cache(inspect.currentframe())
        self._rank, self._world_size, local_rank = distributed_env()
        self.stats = StatsWriter(self.args.stats_path) if self.args.stats_path else None
        kwargs = self.args.runner_kwargs()
        if self._world_size > 1 and kwargs["device"] == "cuda" and not self.args.device_map:
            kwargs["device"] = f"cuda:{local_rank}"  # one GPU per data-parallel process
        self.runner = Runner(**kwargs)
        # what every record carries, so that a resumed run reuses only records of the same settings
        self.settings = run_settings(self.args, self.runner.options, machine_settings()) if self.stats else None
        # what the run chose under the machine's load (CPU kernels): recorded, no resume key
        self.load = load_choices(self.runner.target, self.runner.draft_backend)
        self._key: tuple = (None, None)  # (the request, its request key): the last one computed
        self.resume = None  # the stats file's completed samples, with --use_cache (models/resume.py)
        self._start_resume(use_cache)
        self._throughput = Throughput(self.runner.method)  # this generate_until call's figures
        interface = "simple" if self.is_simple else "chat"
        # what lmms-eval's own class of this family does with stop strings, defaults and prompts
        self.rules = class_rules(self.runner.target.family, interface, self.args.until)
        self.max_new_tokens = self.args.max_new_tokens or self.rules.max_new_tokens
        # enable_thinking for the chat template, and answers cut after `</think>` (None: the template's default)
        self.thinking = thinking_mode(self.runner.target.family, interface, self.args.thinking)
        # the prompts the tasks give this family, as lmms-eval's own class would get them (set before the
        # tasks build their requests: lmms-eval builds the model first)
        os.environ[PROMPT_VARIANT_VAR] = prompt_variant(self.args.prompt_variant, self.runner.target.family, interface)
        logger.info(f"lvspec: prompts of the tasks' {os.environ[PROMPT_VARIANT_VAR]!r} variant where they have one "
                    f"(prompt_variant={self.args.prompt_variant})")
        # which frames each video gives under video_rule (a bad fps/max_frames fails here, not per sample)
        self.frame_plan = self.runner.target.frame_plan(self.args.fps, self.args.max_frames, interface)
        for name, backend in (("pretrained", self.runner.target), ("draft", self.runner.draft_backend)):
            if backend is not None:  # every sample would fail on a template that cannot take a video
                check_video_template(backend.tokenizer, backend.video_token_id, f"{name}={getattr(self.args, name)}")
        self._warned_sampling = False

    @property
    def device(self):
        return self.runner.device

    @property
    def tokenizer(self):
        return self.runner.tokenizer

    # ---- lmms-eval entry points -----------------------------------------------------------------
    def generate_until(self, requests: list[Instance]) -> list[GenerationResult]:
        if self.resume is None and called_by_response_cache(inspect.currentframe()):
            self._start_resume("(a ResponseCache)")  # a model built outside simple_evaluate is only seen here
        self._throughput = Throughput(self.runner.method)
        if self.runner.device.type == "cpu":  # where other busy processes oversubscribe the cores, say so
            busy = contention.check(torch.get_num_threads())  # (lmms-eval silences warnings: logged too)
            if busy["oversubscribed"]:
                logger.warning(busy["warning"])
        results = [self._respond(r) for r in tqdm(requests, desc="lvspec", disable=self.rank != 0)]
        self._throughput.log(self.rank)  # lmms-eval's results["throughput"], as its own classes fill it
        return results

    def loglikelihood(self, requests):
        raise NotImplementedError("lvspec measures speculative generation; loglikelihood requests (output_type "
                                  "loglikelihood or multiple_choice) are not supported: use a generate_until task")

    def generate_until_multi_round(self, requests):
        raise NotImplementedError("lvspec decodes single-turn requests; generate_until_multi_round is not supported")

    # ---- one request ------------------------------------------------------------------------------
    def _info(self, request: Instance) -> RequestInfo:
        raise NotImplementedError

    def _prompt_and_videos(self, info: RequestInfo) -> tuple[str | list[dict], list[str]]:
        """(the prompt: text or chat messages, the request's video paths in order)"""
        raise NotImplementedError

    def _doc(self, info: RequestInfo) -> dict:
        return self.task_dict[info.task][info.split][info.doc_id]

    def _start_resume(self, use_cache: str | None) -> None:
        """--use_cache: lmms-eval serves the answers its cache has; with stats_path, the samples that
        completed before a crash are served from their records (models/resume.py)."""
        if use_cache is None:
            if self.stats is not None and self.stats.path.stat().st_size and self._rank == 0:
                logger.warning(f"lvspec: stats_path={self.stats.path} already holds records; this run appends its "
                               "own (the report reads a sample's later record). To resume a killed run instead, "
                               "rerun with lmms-eval's --use_cache DIR")
            return
        if self.stats is None:
            logger.warning(f"lvspec: --use_cache {use_cache}: cached answers are served without decoding; "
                           "no speed is measured")
            return
        self.resume = Resume(self.stats.path, self.settings, self.args.resume_any_machine)

    def _respond(self, request: Instance) -> GenerationResult:
        info = self._info(request)
        done = self.resume.lookup(info.task, info.doc_id, self._request_key(info)) if self.resume else None
        if done is not None:  # completed before the run was killed: its answer, its record kept
            self._throughput.served += 1
            counts = TokenCounts(input_tokens=done.get("prompt_tokens"), output_tokens=len(done.get("tokens") or ()))
            return GenerationResult(text=done.get("text") or "", token_counts=counts)
        try:
            settings = read_gen_kwargs(info.gen_kwargs, self.max_new_tokens, self.rules.temperature)
            settings = replace(settings, until=stop_strings(settings.until, self.rules))
            prompt, paths = self._prompt_and_videos(info)
            if self.thinking is not None:  # the template's enable_thinking (rendered here, for target and draft)
                prompt = render_text(self.runner.tokenizer, prompt, len(paths), enable_thinking=self.thinking)
            videos = [self._video(p) for p in paths]
            generation, max_new = self._generate(prompt, videos, settings)
            generation.stats["frames"] = [None if v.indices is None else [int(i) for i in v.indices] for v in videos]
            generation = replace(generation, text=final_answer(generation.text, self.thinking))
        except DEVICE_ERRORS + (ValueError, RuntimeError) as err:  # VideoError is a ValueError
            if is_device_error(err):
                return self._device_failure(info, err)
            return self._fail(info, f"{type(err).__name__}: {err}")  # this sample only; the run goes on
        self._record(info, generation, settings, max_new)
        self._throughput.records.append(generation.stats)
        self.cache_hook.add_partial("generate_until", (info.context, info.gen_kwargs), generation.text)
        counts = TokenCounts(input_tokens=generation.stats.get("prompt_tokens"), output_tokens=len(generation.tokens))
        return GenerationResult(text=generation.text, token_counts=counts)

    def _video(self, path: str) -> VideoInput:
        video = load_video(path, plan=self.frame_plan)
        return video if self.rules.video_fps is None else VideoInput(video.frames, self.rules.video_fps)

    def _generate(self, prompt: str | list[dict], videos: list[VideoInput],
                  settings: GenSettings) -> tuple[Generation, int]:
        if settings.sampling_ignored and not self._warned_sampling:
            logger.warning(f"lvspec: the task asks for sampling (temperature={settings.requested_temperature}); "
                           "lvspec decodes greedily only, so this run is greedy (recorded as sampling_ignored)")
            self._warned_sampling = True
        target, request = self.runner.target, [v.request() for v in videos]
        clock = make_clock(target.device)
        t0 = clock()
        inputs = target.prepare(prompt, request)
        preprocess_s = clock() - t0
        max_new = fit_context(target, inputs, settings.max_new_tokens)
        with reuse_prepared(target, prompt, request, inputs):  # the frames are preprocessed once per request
            generation = self.runner.generate(prompt, videos, max_new, settings.until)
        charge_preprocessing(generation.stats, preprocess_s)
        return generation, max_new

    # ---- records ----------------------------------------------------------------------------------
    def _request_key(self, info: RequestInfo) -> str:
        """The request's key (models/resume.request_key): its text and generation kwargs, its video files
        and the frame rule. Computed once per request (the doc function is called again to decode)."""
        ident = (info.task, info.split, str(info.doc_id), info.context, repr(info.gen_kwargs))
        if self._key[0] != ident:
            try:
                videos = tuple(video_fingerprint(p) for p in self._prompt_and_videos(info)[1])
            except (ValueError, RuntimeError, OSError) as err:  # the sample fails the same way when decoded
                videos = (f"videos unavailable: {type(err).__name__}",)
            self._key = (ident, request_key(info.context, info.gen_kwargs, videos, self.frame_plan.describe))
        return self._key[1]

    def _provenance(self, info: RequestInfo) -> dict:
        """What a resumed run checks before reusing the record (the run's settings and the request),
        and what the run chose under its load (`load`: not checked, reported)."""
        return {"settings": self.settings, "request": self._request_key(info), "load": self.load}

    def _record(self, info: RequestInfo, generation: Generation, settings: GenSettings, max_new: int) -> None:
        if self.stats is None:
            return
        decode = self.runner.tokenizer.decode
        extra = {**self._provenance(info), "max_new_tokens": max_new, "requested_temperature": settings.requested_temperature,
                 "sampling_ignored": settings.sampling_ignored, "thinking": self.thinking,
                 "replaced_texts": [None if t is None else decode([t]) for t in generation.stats.get("replaced", [])]}
        self.stats.write(success_record(generation.stats, task=info.task, doc_id=info.doc_id, rank=self.rank,
                                        text=generation.text, token_texts=[decode([t]) for t in generation.tokens],
                                        extra=extra))

    def _fail(self, info: RequestInfo, reason: str, device_error: bool = False) -> GenerationResult:
        logger.error(f"lvspec: task {info.task} doc {info.doc_id} failed, answering with an empty string: {reason}")
        self._throughput.failed += 1
        self._record_failure(info, reason, device_error)
        return GenerationResult(text="", token_counts=TokenCounts(output_tokens=0))

    def _record_failure(self, info: RequestInfo, reason: str, device_error: bool, stopped_run: bool = False) -> None:
        """stopped_run: on_device_error=abort stopped the run on this sample; a resumed run decodes it again."""
        if self.stats is not None:
            extra = {**self._provenance(info), **({"stopped_run": True} if stopped_run else {})}
            self.stats.write(failure_record(reason, method=self.runner.method, task=info.task, doc_id=info.doc_id,
                                            rank=self.rank, device_error=device_error, extra=extra))

    def _device_failure(self, info: RequestInfo, err: BaseException) -> GenerationResult:
        """on_device_error=skip: this sample fails alone (cached memory freed first); abort: the run stops."""
        reason = f"device error, {type(err).__name__}: {err}"
        if self.args.on_device_error == "skip":
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # what the failed sample held, so an out-of-memory need not repeat
            return self._fail(info, reason, device_error=True)
        self._record_failure(info, reason, device_error=True, stopped_run=True)
        raise DeviceFailure(
            f"lvspec: task {info.task} doc {info.doc_id} failed on the device ({type(err).__name__}: {err}). The run "
            "stops here: after a device-side assert every later sample fails too, and lmms-eval would score empty "
            "answers. Pass on_device_error=skip in model_args to fail such samples alone instead.") from err


class LVSpecChat(_LVSpecModel):
    """Chat interface: requests carry doc_to_messages (user turn = video(s) + text)."""

    is_simple = False

    def _info(self, request: Instance) -> RequestInfo:
        context, doc_to_messages, gen_kwargs, doc_id, task, split = request.args
        return RequestInfo(context, gen_kwargs, doc_id, task, split, doc_to_messages)

    def _prompt_and_videos(self, info: RequestInfo) -> tuple[list[dict], list[str]]:
        messages, paths = messages_to_prompt(ChatMessages(messages=call_task_function(info.build, self._doc(info))))
        system = self.rules.chat_system_prompt  # e.g. lmms-eval's chat qwen3_vl puts its own first
        if system is not None:
            messages = [{"role": "system", "content": [{"type": "text", "text": system}]}] + messages
        return messages, paths


class LVSpecSimple(_LVSpecModel):
    """Simple interface: the prompt is doc_to_text's context, the videos come from doc_to_visual."""

    is_simple = True

    def _info(self, request: Instance) -> RequestInfo:
        context, gen_kwargs, doc_to_visual, doc_id, task, split = request.args
        return RequestInfo(context, gen_kwargs, doc_id, task, split, doc_to_visual)

    def _prompt_and_videos(self, info: RequestInfo) -> tuple[str | list[dict], list[str]]:
        visuals = call_task_function(info.build, self._doc(info)) or []
        paths = [video_path(v) for v in visuals]
        if self.rules.simple_prompt is None:  # until=task (the demo): the context, after the videos
            return info.context, paths
        return self.rules.simple_prompt(info.context, len(paths), self.runner.tokenizer), paths


# ---- helpers ---------------------------------------------------------------------------------------

def distributed_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) as torchrun and accelerate launch set them (RANK, ...)."""
    values = []
    for name, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)):
        raw = os.environ.get(name, str(default))
        try:
            values.append(int(raw))
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    return values[0], values[1], values[2]


def is_device_error(err: BaseException) -> bool:
    """Whether `err` is a failure of the device (CUDA error, out of memory) rather than of the sample."""
    if isinstance(err, DEVICE_ERRORS):
        return True
    return isinstance(err, RuntimeError) and any(marker in str(err) for marker in DEVICE_ERROR_MARKERS)


def fit_context(backend, inputs, max_new_tokens: int) -> int:
    """max_new_tokens, lowered to what the context leaves; ValueError if the prompt alone overflows it.

    Checked here because RoPE models do not fail past max_position_embeddings: they silently
    produce garbage, which would look like a quality loss of the method.
    """
    limit = getattr(backend.model.config.get_text_config(), "max_position_embeddings", None)
    if not limit:
        return max_new_tokens
    n = int(inputs.input_ids.shape[1])
    if n >= limit:
        raise ValueError(f"the prompt has {n} tokens ({inputs.num_visual_tokens} visual), more than the model's "
                         f"context of {limit} (max_position_embeddings); lower max_frames, fps or max_pixels")
    return min(max_new_tokens, limit - n)


def charge_preprocessing(record: dict, seconds: float) -> None:
    """Put the request's one preprocessing (run before decoding for the context check, then served to
    the loop from memory) back into its timings where the loop would have counted it: preprocess_s,
    and the end-to-end figures of the method and of its paired vanilla decode."""
    if "preprocess_s" not in record:
        return
    record["preprocess_s"] += seconds
    record["e2e_s"] += seconds
    record["e2e_tokens_per_s"] = record["num_new_tokens"] / record["e2e_s"] if record["e2e_s"] > 0 else 0.0
    if "vanilla_e2e_s" in record:
        record["vanilla_e2e_s"] += seconds


@contextlib.contextmanager
def reuse_prepared(backend, prompt: str, videos: list[tuple], inputs):
    """While decoding one request, `backend.prepare` of that same request returns `inputs` (already made
    for the context check) instead of preprocessing the frames again; any other call goes through.
    The instance attribute shadows the method and is removed on exit."""
    original = backend.prepare

    def prepare(p: str, vs: list[tuple]):
        same = p == prompt and len(vs) == len(videos) and all(
            a[0] is b[0] and a[1] == b[1] for a, b in zip(vs, videos))
        return inputs if same else original(p, vs)

    backend.prepare = prepare
    try:
        yield
    finally:
        del backend.prepare


def lmms_eval_use_cache(frame) -> str | None:
    """The `use_cache` of the lmms-eval `simple_evaluate` call building this model, if any.

    lmms-eval 0.7.3 builds the model inside evaluator.simple_evaluate and creates its ResponseCache
    afterwards without telling the model, so the argument is read from that caller's frame.
    """
    while frame is not None:
        if frame.f_code.co_name == "simple_evaluate" and frame.f_globals.get("__name__") == "lmms_eval.evaluator":
            return frame.f_locals.get("use_cache")
        frame = frame.f_back
    return None


def called_by_response_cache(frame) -> bool:
    """Whether lmms-eval's ResponseCache.execute is on the stack (it calls the model on cache misses only)."""
    while frame is not None:
        if frame.f_code.co_name == "execute" and type(frame.f_locals.get("self")).__name__ == "ResponseCache":
            return True
        frame = frame.f_back
    return False


class TaskFunctionError(ValueError):
    """The task's doc_to_messages/doc_to_visual raised on this doc: the sample fails alone."""


def call_task_function(fn: Callable, doc: dict):
    """Call a task's doc_to_messages/doc_to_visual. lmms-eval's built-in video tasks call sys.exit
    on a missing video, which would end the whole run: make it this sample's VideoError instead. Any
    other error of the task's code (a doc without the key it reads, a file it cannot open) is this
    doc's too: the sample fails alone, its reason recorded, and the run goes on."""
    name = getattr(fn, "__name__", "doc function")
    try:
        return fn(doc)
    except SystemExit as err:
        raise VideoError(f"the task's {name} exited (code {err.code}); usually a missing video file") from err
    except Exception as err:  # the task's own code, whatever it raises; a device error keeps its type
        if is_device_error(err):
            raise
        raise TaskFunctionError(f"the task's {name} raised {type(err).__name__}: {err}") from err


def video_path(visual) -> str:
    """A video given by the task as a path; anything else (images, clips, arrays) is refused."""
    if isinstance(visual, (str, os.PathLike)):
        return os.fspath(visual)
    raise ValueError(f"a visual of type {type(visual).__name__}: lvspec takes video file paths only")


def messages_to_prompt(chat: ChatMessages) -> tuple[list[dict], list[str]]:
    """A task's messages -> (chat messages as the checkpoint's template takes them, every turn and part
    in the task's order, videos as {"type": "video"}; the video paths in order). The template renders
    them as lmms-eval's classes do (a system turn as given, text parts one after another)."""
    messages, paths = [], []
    for message in chat.messages:
        parts = []
        for content in message.content:
            if content.type == "text":
                parts.append({"type": "text", "text": content.text})
            elif content.type == "video":
                parts.append({"type": "video"})
                paths.append(video_path(content.url))
            else:
                raise ValueError(f"{content.type} input: lvspec takes video and text only")
        messages.append({"role": message.role, "content": parts})
    return messages, paths
