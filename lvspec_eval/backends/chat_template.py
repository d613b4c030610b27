"""The chat template a checkpoint's processor renders, and a check that it can take a video.

transformers' tokenizers read their template from `chat_template.jinja` or `tokenizer_config.json`;
its processors (what lmms-eval's own model classes render prompts with) read `chat_template.jinja`
first, then the legacy `chat_template.json`. Checkpoints that keep their multimodal template only in
`chat_template.json` therefore give a tokenizer with no template, or with a text-only one, and every
prompt with a video fails. `load_tokenizer` gives the tokenizer the template the processor would use,
read from the file (AutoProcessor itself needs torchvision for the video processors).
"""
from __future__ import annotations

import json

from jinja2 import TemplateError
from transformers import AutoTokenizer
from transformers.utils import cached_file

JINJA_FILE = "chat_template.jinja"  # read by tokenizers and processors alike
PROCESSOR_JSON_FILE = "chat_template.json"  # legacy processor file: {"chat_template": "..."}
PROBE_PROMPT = "Describe the video."


def load_tokenizer(path: str, **kwargs):
    """AutoTokenizer.from_pretrained(path), with the processor's chat template where it differs. The
    tokenizer's own template (None without one) stays in `own_chat_template`: lmms-eval's simple llava_hf
    renders with it (models/parity.py)."""
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    tokenizer.own_chat_template = tokenizer.chat_template
    template = processor_chat_template(path, **kwargs)
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


class RenderedPrompt(str):
    """A prompt already rendered with a chat template (generation prompt included): tokenized as it is."""


def processor_chat_template(path: str, **kwargs) -> str | None:
    """The template of `chat_template.json` when the checkpoint has no `chat_template.jinja` (which
    the tokenizer has already read), else None. A local folder or a hub id (cache or download)."""
    if _find(path, JINJA_FILE, **kwargs):
        return None
    found = _find(path, PROCESSOR_JSON_FILE, **kwargs)
    if found is None:
        return None
    with open(found, encoding="utf-8") as f:
        template = json.load(f).get("chat_template")
    if not isinstance(template, str):
        raise ValueError(f"{path}: {PROCESSOR_JSON_FILE} has no string 'chat_template' entry (found "
                         f"{type(template).__name__}); expected {{\"chat_template\": \"...\"}}")
    return template


def _find(path: str, filename: str, **kwargs) -> str | None:
    return cached_file(path, filename, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False, **kwargs)


def video_prompt(tokenizer, prompt: str = PROBE_PROMPT) -> str:
    """The chat text of one user turn holding a video and `prompt`, as the backends build it."""
    content = [{"type": "video"}, {"type": "text", "text": prompt}]
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)


def check_video_template(tokenizer, video_token_id: int, name: str) -> str:
    """Render a video + text turn; ValueError unless it holds exactly one video token. Returns the text."""
    files = f"tokenizer_config.json, {JINJA_FILE} or {PROCESSOR_JSON_FILE}"
    if not tokenizer.chat_template:
        raise ValueError(f"{name}: no chat template (none in {files}); lvspec renders every prompt with the "
                         "checkpoint's chat template")
    try:
        text = video_prompt(tokenizer)
    except TemplateError as err:
        raise ValueError(f"{name}: its chat template cannot render a video part ({err})") from err
    found = tokenizer(text, add_special_tokens=False).input_ids.count(video_token_id)
    if found != 1:
        token = tokenizer.convert_ids_to_tokens(video_token_id)
        raise ValueError(f"{name}: its chat template renders a video part as {found} video tokens ({token!r}, id "
                         f"{video_token_id}), expected one: it cannot take a video (rendered: {text!r}); give the "
                         f"checkpoint its multimodal template ({files})")
    return text


def chat_messages(prompt: str | list[dict], num_videos: int) -> list[dict]:
    """A request as chat messages. A string becomes one user turn with its videos first (as lmms-eval's
    simple classes place them); a list of messages (a task's own turns, system turn included, parts in
    the task's order, video parts as {"type": "video"}) is used as given, after checking that it holds
    one video part per video."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": [{"type": "video"}] * num_videos + [{"type": "text", "text": prompt}]}]
    if any(isinstance(m["content"], str) for m in prompt):
        return prompt  # a turn of plain text may name its videos itself (`<video>`); the backend counts them
    found = sum(1 for m in prompt for part in m["content"] if part.get("type") == "video")
    if found != num_videos:
        raise ValueError(f"the messages hold {found} video parts for {num_videos} videos")
    return prompt


def render_text(tokenizer, prompt: str | list[dict], num_videos: int, **template_kwargs) -> RenderedPrompt:
    """The request rendered with the checkpoint's chat template, generation prompt added; template_kwargs
    go to the template (e.g. enable_thinking). A RenderedPrompt is returned as it is."""
    if isinstance(prompt, RenderedPrompt):
        return prompt
    return RenderedPrompt(tokenizer.apply_chat_template(chat_messages(prompt, num_videos), add_generation_prompt=True,
                                                        tokenize=False, **template_kwargs))


def render_chat(tokenizer, prompt: str | list[dict], num_videos: int) -> list[int]:
    """Token ids of the request rendered with the checkpoint's chat template, generation prompt added
    (a RenderedPrompt is tokenized as it is)."""
    return tokenizer(str(render_text(tokenizer, prompt, num_videos)), add_special_tokens=False).input_ids
