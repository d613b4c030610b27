"""What lmms-eval 0.7.3's own model classes do with a request, per model family and interface.

`--model lvspec` (chat class) and its simple class answer a request as the lmms-eval class of the
same family and interface does, so that `method=vanilla` scores equal the ones users already have
(docs/ARGS.md, "Parity with lmms-eval"; tests/test_parity.py runs those classes and ours side by side):

| family, interface | lmms-eval class | the task's `until` | max_new_tokens when the task gives none |
|---|---|---|---|
| qwen2_5_vl, chat | models/chat/qwen2_5_vl.py | ignored | 128 |
| qwen2_5_vl, simple | models/simple/qwen2_5_vl.py | applied to the answer, except "\\n\\n" | 32768 |
| qwen3_vl, chat | models/chat/qwen3_vl.py (adds its system turn) | ignored | 128 |
| qwen3_vl, simple | models/simple/qwen3_vl.py | applied to the answer, except "\\n\\n" | 128 |
| qwen3_5, chat | models/chat/qwen3_5.py (adds its system turn; thinking on) | ignored | 1024 |
| qwen3_5, simple | models/simple/qwen3_5.py (thinking on) | applied to the answer, except "\\n\\n" | 1024 |
| llava_onevision, chat | models/chat/llava_hf.py | ignored | 1024 |
| llava_onevision, simple | models/simple/llava_hf.py | ignored | 1024 |

lmms-eval hands `until=["\\n\\n"]` to every task that sets none, so a class that applied it would cut
paragraphs and answers that begin with a blank line. Frames and pixels follow from `video_rule`
(backends/frame_rules.py); the eos token from the tokenizer (backends/base.py stop_token_ids).
The demo models (and `until=task`) keep the task's stop strings and a 256-token default.
A new family adds its two rows here.

Thinking (lmms-eval's Qwen3 classes, models/simple/qwen3_vl.py): the class hands `enable_thinking` to the
chat template when it is set, and then answers with what follows the first `</think>` (stripped; an empty
answer when the model never closed its thinking). The `qwen3_5` classes set it (enable_thinking=True: the
Qwen3.5 template opens `<think>\\n` after the assistant header), the `qwen3_vl` ones do not. Model_arg
`thinking=on|off` sets it for either family (lmms-eval's `enable_thinking=true|false`); by default it is
what the class does. Their sampling defaults (qwen3_5: temperature 0.7, top_p 0.8, top_k 20 when the task
gives no temperature) are not followed: lvspec decodes greedily and records the request as sampling_ignored.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..backends.chat_template import RenderedPrompt

UNTIL_MODES = ("class", "task")  # model_arg `until`
THINKING_MODES = ("on", "off")  # model_arg `thinking` (None: the class's own)
THINK_END = "</think>"
BLANK_LINE = "\n\n"
# lmms-eval 0.7.3 models/simple/llava_hf.py: the template it falls back to when the tokenizer has none
VICUNA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.index0 == 0 %}A chat between a curious user and an artificial "
    "intelligence assistant. The assistant gives helpful, detailed, and polite answers to the user's questions. "
    "USER: {{ message['content'] }} {% elif message['role'] == 'user' %}USER: {{ message['content'] }} {% else %} "
    "ASSISTANT: {{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")


@dataclass(frozen=True)
class ClassRules:
    reference: str  # the lmms-eval class matched
    until: str  # "ignore" | "no_blank_line" | "all": what happens to the task's stop strings
    max_new_tokens: int  # the class's default when the task's generation_kwargs give none
    video_fps: float | None = None  # the frame rate the class's processor assumes (None: the sampled rate)
    chat_system_prompt: str | None = None  # chat interface: a system turn the class puts before the task's turns
    # simple interface: (doc_to_text's context, number of videos, tokenizer) -> the prompt (chat messages,
    # or a RenderedPrompt)
    simple_prompt: Callable[[str, int, object], list[dict] | RenderedPrompt] | None = None
    thinking_switch: bool = False  # the class takes enable_thinking (lmms-eval's Qwen3 classes)
    thinking: bool | None = None  # the enable_thinking it hands the chat template by default (None: none)
    temperature: float = 0.0  # what it samples at when the task gives no temperature (lvspec: greedy)


def qwen_simple_prompt(context: str, num_videos: int, tokenizer=None) -> list[dict]:
    """lmms-eval's simple qwen2_5_vl: its system prompt, then the videos and the context without `<image>`."""
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "video"}] * num_videos
             + [{"type": "text", "text": context.replace("<image>", "")}]}]


def llava_hf_simple_prompt(context: str, num_videos: int, tokenizer) -> RenderedPrompt:
    """lmms-eval's simple llava_hf: one `<video>` per video, a newline, the context, as one string turn,
    rendered with the tokenizer's own chat template (not the processor's chat_template.json), or without
    one, lmms-eval's Vicuna template."""
    if num_videos and "<image>" not in context:
        context = " ".join(["<video>"] * num_videos) + "\n" + context
    template = getattr(tokenizer, "own_chat_template", None) or VICUNA_CHAT_TEMPLATE
    return RenderedPrompt(tokenizer.apply_chat_template([{"role": "user", "content": context}], chat_template=template,
                                                        add_generation_prompt=True, tokenize=False))


CLASS_RULES = {
    ("qwen2_5_vl", "chat"): ClassRules("lmms_eval.models.chat.qwen2_5_vl.Qwen2_5_VL", "ignore", 128),
    # no video metadata reaches its processor, which then takes transformers' default of 24 frames per second
    ("qwen2_5_vl", "simple"): ClassRules("lmms_eval.models.simple.qwen2_5_vl.Qwen2_5_VL", "no_blank_line", 32768,
                                         video_fps=24.0, simple_prompt=qwen_simple_prompt),
    # Qwen3-VL (backends/qwen3_vl.py): its chat class inserts its system prompt before the task's turns
    ("qwen3_vl", "chat"): ClassRules("lmms_eval.models.chat.qwen3_vl.Qwen3_VL", "ignore", 128,
                                     chat_system_prompt="You are a helpful assistant.", thinking_switch=True),
    ("qwen3_vl", "simple"): ClassRules("lmms_eval.models.simple.qwen3_vl.Qwen3_VL", "no_blank_line", 128,
                                       simple_prompt=qwen_simple_prompt, thinking_switch=True),
    # Qwen3.5 (backends/qwen3_5.py): the qwen3_vl classes with Qwen3.5's defaults (models/simple/qwen3_5.py
    # DEFAULT_GEN_KWARGS and __init__: max_new_tokens 1024, temperature 0.7, enable_thinking=True)
    ("qwen3_5", "chat"): ClassRules("lmms_eval.models.chat.qwen3_5.Qwen3_5", "ignore", 1024,
                                    chat_system_prompt="You are a helpful assistant.", thinking_switch=True,
                                    thinking=True, temperature=0.7),
    ("qwen3_5", "simple"): ClassRules("lmms_eval.models.simple.qwen3_5.Qwen3_5", "no_blank_line", 1024,
                                      simple_prompt=qwen_simple_prompt, thinking_switch=True, thinking=True,
                                      temperature=0.7),
    ("llava_onevision", "chat"): ClassRules("lmms_eval.models.chat.llava_hf.LlavaHf", "ignore", 1024),
    ("llava_onevision", "simple"): ClassRules("lmms_eval.models.simple.llava_hf.LlavaHf", "ignore", 1024,
                                              simple_prompt=llava_hf_simple_prompt),
}
TASK_RULES = ClassRules("the task's generation_kwargs", "all", 256)


def class_rules(family: str, interface: str, until: str) -> ClassRules:
    """The rules for a family's chat or simple class; `until=task` (and the demo) keep the task's stop strings."""
    if until not in UNTIL_MODES:
        raise ValueError(f"until={until!r} is not supported; expected one of {', '.join(UNTIL_MODES)}")
    if until == "task":
        return TASK_RULES
    if (family, interface) not in CLASS_RULES:
        known = ", ".join(f"{f}/{i}" for f, i in CLASS_RULES)
        raise ValueError(f"no lmms-eval reference class is recorded for {family}/{interface} (known: {known}); "
                         "add it to lvspec_eval/models/parity.py or pass until=task")
    return CLASS_RULES[(family, interface)]


def stop_strings(until: tuple[str, ...], rules: ClassRules) -> tuple[str, ...]:
    """The stop strings a request's answer is cut at, from the task's `until`."""
    if rules.until == "ignore":
        return ()
    if rules.until == "no_blank_line":
        return tuple(s for s in until if s != BLANK_LINE)
    return until


def thinking_mode(family: str, interface: str, requested: str | None) -> bool | None:
    """The enable_thinking prompts are rendered with (None: not passed to the template) and answers
    stripped by: the model_arg `thinking` (on|off) where the family's lmms-eval class takes it, else
    what that class does by default (whatever `until` says)."""
    rules = CLASS_RULES.get((family, interface))
    if requested is None:
        return rules.thinking if rules is not None else None
    if requested not in THINKING_MODES:
        raise ValueError(f"thinking={requested!r} is not supported; expected one of {', '.join(THINKING_MODES)}")
    if rules is None or not rules.thinking_switch:
        takes = sorted({f for (f, _), r in CLASS_RULES.items() if r.thinking_switch})
        raise ValueError(f"thinking={requested}: {family}'s chat template has no thinking switch (lmms-eval's classes "
                         f"take enable_thinking for {', '.join(takes)} only)")
    return requested == "on"


def final_answer(text: str, thinking: bool | None) -> str:
    """lmms-eval's Qwen3 `_strip_thinking`: with thinking on, what follows the first `</think>`, stripped
    (empty when the model never closed its thinking); otherwise the text as it is."""
    if not thinking:
        return text
    return text.partition(THINK_END)[2].strip()


# ---- per-model prompt variants ------------------------------------------------------------------
# lmms-eval picks a task's prompt kwargs by the --model name (lmms_eval_specific_kwargs[<name>], else
# "default"); under `--model lvspec` that name is never a family's. The lvspec model therefore names
# the lmms-eval model whose prompts a run gets in this environment variable, which this project's
# tasks read (tasks/_common/prompts.py, the same name): no import between the two rooms.
PROMPT_VARIANT_VAR = "LVSPEC_PROMPT_VARIANT"
PROMPT_VARIANT_CHOICES = ("auto", "default")  # or an lmms-eval model name, e.g. qwen3_vl


def lmms_model_name(family: str, interface: str) -> str | None:
    """The --model name of the family's lmms-eval class (its module's name: qwen3_vl, llava_hf), if known."""
    rules = CLASS_RULES.get((family, interface))
    return rules.reference.split(".")[-2] if rules is not None else None


def prompt_variant(requested: str, family: str, interface: str) -> str:
    """The lmms-eval model name whose prompts the tasks use: auto = the family's class's, so that a
    Qwen3-VL checkpoint gets the prompts `--model qwen3_vl` gets; default = the tasks' default prompts."""
    if requested == "auto":
        return lmms_model_name(family, interface) or "default"
    return requested
