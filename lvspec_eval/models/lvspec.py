"""lmms-eval model `lvspec`: a chat class (the current interface) and a simple class.

Both are thin: they turn a request into (prompt, videos, generation settings), call
`runner.Runner.generate`, and write one statistics line per request. Decoding lives in decoding/,
model families in backends/. A sample that cannot be run (missing or corrupt video, a prompt
longer than the context, an error raised by the model) fails alone: it is logged with its doc id,
answered with an empty string and recorded with its reason; the run goes on.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmms_eval.api.instance import GenerationResult, Instance, TokenCounts
from lmms_eval.api.model import lmms
from lmms_eval.protocol import ChatMessages
from loguru import logger
from tqdm import tqdm

from ..runner import Generation, Runner, VideoInput
from .args import GenSettings, ModelArgs, read_gen_kwargs
from .stats_writer import StatsWriter, failure_record, success_record
from .video import VideoError, load_video


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
        self._rank, self._world_size, local_rank = distributed_env()
        self.stats = StatsWriter(self.args.stats_path) if self.args.stats_path else None
        kwargs = self.args.runner_kwargs()
        if self._world_size > 1 and kwargs["device"] == "cuda" and not self.args.device_map:
            kwargs["device"] = f"cuda:{local_rank}"  # one GPU per data-parallel process
        self.runner = Runner(**kwargs)
        self._warned_sampling = False

    @property
    def device(self):
        return self.runner.device

    @property
    def tokenizer(self):
        return self.runner.tokenizer

    # ---- lmms-eval entry points -----------------------------------------------------------------
    def generate_until(self, requests: list[Instance]) -> list[GenerationResult]:
        return [self._respond(r) for r in tqdm(requests, desc="lvspec", disable=self.rank != 0)]

    def loglikelihood(self, requests):
        raise NotImplementedError("lvspec measures speculative generation; loglikelihood requests (output_type "
                                  "loglikelihood or multiple_choice) are not supported: use a generate_until task")

    def generate_until_multi_round(self, requests):
        raise NotImplementedError("lvspec decodes single-turn requests; generate_until_multi_round is not supported")

    # ---- one request ------------------------------------------------------------------------------
    def _info(self, request: Instance) -> RequestInfo:
        raise NotImplementedError

    def _prompt_and_videos(self, info: RequestInfo) -> tuple[str, list[str]]:
        raise NotImplementedError

    def _doc(self, info: RequestInfo) -> dict:
        return self.task_dict[info.task][info.split][info.doc_id]

    def _respond(self, request: Instance) -> GenerationResult:
        info = self._info(request)
        try:
            settings = read_gen_kwargs(info.gen_kwargs, self.args.max_new_tokens)
            prompt, paths = self._prompt_and_videos(info)
            videos = [load_video(p, self.args.fps, self.args.max_frames) for p in paths]
            generation, max_new = self._generate(prompt, videos, settings)
        except (VideoError, ValueError, RuntimeError) as err:  # this sample only; the run goes on
            return self._fail(info, f"{type(err).__name__}: {err}")
        self._record(info, generation, settings, max_new)
        self.cache_hook.add_partial("generate_until", (info.context, info.gen_kwargs), generation.text)
        counts = TokenCounts(input_tokens=generation.stats.get("prompt_tokens"), output_tokens=len(generation.tokens))
        return GenerationResult(text=generation.text, token_counts=counts)

    def _generate(self, prompt: str, videos: list[VideoInput], settings: GenSettings) -> tuple[Generation, int]:
        if settings.sampling_ignored and not self._warned_sampling:
            logger.warning(f"lvspec: the task asks for sampling (temperature={settings.requested_temperature}); "
                           "lvspec decodes greedily only, so this run is greedy (recorded as sampling_ignored)")
            self._warned_sampling = True
        max_new = self._fit_context(prompt, videos, settings.max_new_tokens)
        return self.runner.generate(prompt, videos, max_new, settings.until), max_new

    def _fit_context(self, prompt: str, videos: list[VideoInput], max_new_tokens: int) -> int:
        """max_new_tokens, lowered to what the context leaves; ValueError if the prompt alone overflows it.

        Checked here because RoPE models do not fail past max_position_embeddings: they silently
        produce garbage, which would look like a quality loss of the method.
        """
        backend = self.runner.target
        limit = getattr(backend.model.config.get_text_config(), "max_position_embeddings", None)
        if not limit:
            return max_new_tokens
        inputs = backend.prepare(prompt, [(v.frames, v.fps) for v in videos])
        n = int(inputs.input_ids.shape[1])
        if n >= limit:
            raise ValueError(f"the prompt has {n} tokens ({inputs.num_visual_tokens} visual), more than the model's "
                             f"context of {limit} (max_position_embeddings); lower max_frames, fps or max_pixels")
        return min(max_new_tokens, limit - n)

    # ---- records ----------------------------------------------------------------------------------
    def _record(self, info: RequestInfo, generation: Generation, settings: GenSettings, max_new: int) -> None:
        if self.stats is None:
            return
        decode = self.runner.tokenizer.decode
        extra = {"max_new_tokens": max_new, "requested_temperature": settings.requested_temperature,
                 "sampling_ignored": settings.sampling_ignored,
                 "replaced_texts": [None if t is None else decode([t]) for t in generation.stats.get("replaced", [])]}
        self.stats.write(success_record(generation.stats, task=info.task, doc_id=info.doc_id, rank=self.rank,
                                        text=generation.text, token_texts=[decode([t]) for t in generation.tokens],
                                        extra=extra))

    def _fail(self, info: RequestInfo, reason: str) -> GenerationResult:
        logger.error(f"lvspec: task {info.task} doc {info.doc_id} failed, answering with an empty string: {reason}")
        if self.stats is not None:
            self.stats.write(failure_record(reason, method=self.runner.method, task=info.task, doc_id=info.doc_id,
                                            rank=self.rank))
        return GenerationResult(text="", token_counts=TokenCounts(output_tokens=0))


class LVSpecChat(_LVSpecModel):
    """Chat interface: requests carry doc_to_messages (user turn = video(s) + text)."""

    is_simple = False

    def _info(self, request: Instance) -> RequestInfo:
        context, doc_to_messages, gen_kwargs, doc_id, task, split = request.args
        return RequestInfo(context, gen_kwargs, doc_id, task, split, doc_to_messages)

    def _prompt_and_videos(self, info: RequestInfo) -> tuple[str, list[str]]:
        messages = call_task_function(info.build, self._doc(info))
        return messages_to_prompt(ChatMessages(messages=messages))


class LVSpecSimple(_LVSpecModel):
    """Simple interface: the prompt is doc_to_text's context, the videos come from doc_to_visual."""

    is_simple = True

    def _info(self, request: Instance) -> RequestInfo:
        context, gen_kwargs, doc_to_visual, doc_id, task, split = request.args
        return RequestInfo(context, gen_kwargs, doc_id, task, split, doc_to_visual)

    def _prompt_and_videos(self, info: RequestInfo) -> tuple[str, list[str]]:
        visuals = call_task_function(info.build, self._doc(info)) or []
        return info.context, [video_path(v) for v in visuals]


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


def call_task_function(fn: Callable, doc: dict):
    """Call a task's doc_to_messages/doc_to_visual. lmms-eval's built-in video tasks call sys.exit
    on a missing video, which would end the whole run: make it this sample's VideoError instead."""
    try:
        return fn(doc)
    except SystemExit as err:
        raise VideoError(f"the task's {getattr(fn, '__name__', 'doc function')} exited (code {err.code}); "
                         "usually a missing video file") from err


def video_path(visual) -> str:
    """A video given by the task as a path; anything else (images, clips, arrays) is refused."""
    if isinstance(visual, (str, os.PathLike)):
        return os.fspath(visual)
    raise ValueError(f"a visual of type {type(visual).__name__}: lvspec takes video file paths only")


def messages_to_prompt(chat: ChatMessages) -> tuple[str, list[str]]:
    """One user turn -> (its text parts joined by newlines, its video paths in order)."""
    texts, paths = [], []
    for message in chat.messages:
        if message.role != "user":
            raise ValueError(f"a {message.role} turn: lvspec takes a single user turn (video + text)")
        for content in message.content:
            if content.type == "text":
                texts.append(content.text)
            elif content.type == "video":
                paths.append(video_path(content.url))
            else:
                raise ValueError(f"{content.type} input: lvspec takes video and text only")
    return "\n".join(texts), paths
