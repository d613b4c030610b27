"""The values the judge's modules share: a request, a judgment, a caption to score, and what
scoring needs of a judge. Their own module so that client.py (which asks) and facts.py (a scoring
mode) import them from below instead of from each other, and so that importing them needs no openai.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from judges.prompts import Messages, PromptSpec

DEFAULT_QUESTION = "Describe the video in detail."


@dataclass(frozen=True)
class JudgeRequest:
    """One question to the judge: which prompt (for the cache key and the schema) and its messages."""

    spec: PromptSpec
    messages: Messages


@dataclass(frozen=True)
class Judgment:
    """The judge's answer: `value` is the validated reply, or None (missing) with `error` saying why."""

    value: dict | None
    raw: str | None
    error: str | None
    asks: int  # requests made for it, re-asks included (cached ones too)
    cached: bool  # every ask was answered from the cache


@dataclass(frozen=True)
class CaptionItem:
    """A caption to judge, its reference, the question that asked for it, (vdc) reference Q&A and
    (facts) the reference's atomic facts when the task knows them (else the judge splits it)."""

    key: str
    caption: str
    reference: str
    question: str = DEFAULT_QUESTION
    qa: tuple[tuple[str, str], ...] = ()
    reference_facts: tuple[str, ...] = ()


class Judge(Protocol):
    """What a scoring mode needs of a judge (client.JudgeClient is one): a judgment per request, in order."""

    def judge_many(self, requests: list[JudgeRequest], desc: str = "judging") -> list[Judgment]: ...
