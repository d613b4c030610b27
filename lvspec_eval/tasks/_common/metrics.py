"""Aggregations and answer parsing shared by the tasks.

Two rules the built-in tasks do not all follow, and why we need them:
- A missing judged score is left out of the mean and counted, never read as 0 (a judge outage
  would otherwise look like a quality loss of the decoding method being measured).
- Parsing a multiple-choice answer is deterministic: an unparsable answer is wrong, never a
  random letter (LongVideoBench's built-in parser guesses at random, which would make two runs of
  the same outputs disagree and blur the comparison of a method with vanilla).
"""
from __future__ import annotations

from loguru import logger


def mean_judged(results: list[dict]) -> float | None:
    """Mean "score" over the samples that were judged; None when none was."""
    scores = [r["score"] for r in results if isinstance(r, dict) and r.get("score") is not None]
    missing = len(results) - len(scores)
    if missing:
        logger.warning(f"lvspec tasks: {missing} of {len(results)} judged scores are missing; the mean "
                       "covers the judged samples only")
    return sum(scores) / len(scores) if scores else None


def parse_choice(response: str, letters: list[str]) -> str:
    """The option letter a free-form answer picks, or "" (counted wrong) when there is none."""
    from lmms_eval.tasks._task_utils.mcq_extract import extract_mcq_answer

    return extract_mcq_answer(response or "", choices=letters) or ""


def accuracy(results: list[dict]) -> float:
    """Share of samples whose "score" is 1 (every sample counts; failed ones are wrong)."""
    return sum(float(r["score"]) for r in results) / len(results) if results else 0.0
