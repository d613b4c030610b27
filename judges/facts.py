"""Judge mode `facts`: caption fidelity as the F1 of atomic facts, each checked with a yes/no question.

Why: a small judge is poor at a holistic 0-5 score (docs/JUDGE.md: Qwen2.5-Coder-1.5B misses one
wrong fact in four in mode `detail`) and much better at one short question about one fact. This is
the field's fact-level scoring for video captions (DREAM-1K's AutoDQ, FactScore), in four steps:

1. The reference is split into atomic facts (objects, attributes, actions, order): the task's own
   facts when it has them (`CaptionItem.reference_facts`; the demo world states its scene's facts,
   judges/oracle.scene_facts), else one LLM request per distinct reference (prompt `facts-split`).
2. The prediction is split the same way (one request per distinct caption; `caption_facts=
   "judge"`), or, on a slow judge, into its sentences (`"sentences"`: no request, each sentence one
   fact to check, so a sentence with one wrong value is one hallucinated fact). A split generates
   a JSON list (about 8 tokens per fact): on a CPU judge that is most of a caption's cost.
3. recall = share of the reference's facts the prediction supports; precision = share of the
   prediction's facts the reference supports (a fact it does not: hallucinated). Each is one
   `fact-check` request, a plain-text yes/no with max_tokens=1: one generated token per fact.
4. F1 of the two; `score` = 5 x F1, on the 0-5 scale of the other modes.

Every request goes through JudgeClient: cached (a rerun or an interrupted run asks nothing twice),
run `max_concurrency` at a time. A text split once serves every item that shares it (a reference's
facts are asked for once however many captions it has), and identical questions are asked once.
Questions are sent grouped by the description they are about, so consecutive requests share the
description's prefix (llama.cpp evaluates it once). A missing judgment (split or check) leaves the
caption's score missing, never 0, with the reason in "errors".
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from judges import prompts
from judges.types import CaptionItem, Judge, JudgeRequest, Judgment

TOP_SCORE = 5


def fact_f1(recall_verdicts: Sequence[bool], precision_verdicts: Sequence[bool]) -> dict:
    """{"recall", "precision", "f1"} from the yes/no verdicts of the reference's facts (checked
    against the prediction) and of the prediction's facts (checked against the reference).

    A side with no facts scores 0 (a caption that states nothing checkable has no right facts);
    F1 is 0 when both are 0.
    """
    recall = sum(recall_verdicts) / len(recall_verdicts) if recall_verdicts else 0.0
    precision = sum(precision_verdicts) / len(precision_verdicts) if precision_verdicts else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"recall": recall, "precision": precision, "f1": f1}


def f1_to_scale(f1: float) -> float:
    """F1 in [0, 1] on the 0-5 scale of the other modes (not rounded: ties stay ties, order stays)."""
    if not 0.0 <= f1 <= 1.0:
        raise ValueError(f"f1={f1!r}; allowed: 0 <= f1 <= 1")
    return TOP_SCORE * f1


def clean_facts(facts: Sequence[str]) -> tuple[str, ...]:
    """Split facts stripped, empty ones dropped, repeats kept once (a fact said twice counts once)."""
    out = dict.fromkeys(f.strip() for f in facts if f and f.strip())
    return tuple(out)


CAPTION_FACTS = ("judge", "sentences")


def sentence_facts(text: str) -> tuple[str, ...]:
    """A caption's sentences as its facts (the split that asks no judge)."""
    return clean_facts(re.split(r"(?<=[.!?;])\s+", text))


def score_facts(client: Judge, items: list[CaptionItem], caption_facts: str = "judge") -> list[dict]:
    """One result per item: {key, mode, score (0-5 or None), parts, errors, recall, precision, f1,
    reference_facts_from ("task" or "judge"), reference_facts and caption_facts ([{fact, supported}])}.
    `caption_facts`: how the captions are split, "judge" (an LLM request each) or "sentences"."""
    if caption_facts not in CAPTION_FACTS:
        raise ValueError(f"caption_facts={caption_facts!r}; allowed: {', '.join(CAPTION_FACTS)}")
    by_judge = [i.caption for i in items] if caption_facts == "judge" else []
    split = _split_all(client, [i.reference for i in items if not i.reference_facts] + by_judge)
    if caption_facts == "sentences":
        split.update({i.caption: (sentence_facts(i.caption), None) for i in items})
    reference = {i.key: (clean_facts(i.reference_facts), None) if i.reference_facts else split[i.reference]
                 for i in items}
    pairs = []  # (description, fact): recall asks about the caption, precision about the reference
    for item in items:
        pairs += [(item.caption, f) for f in reference[item.key][0]]
        pairs += [(item.reference, f) for f in split[item.caption][0]]
    verdicts = _check_all(client, pairs)
    return [_item_result(i, reference[i.key], split[i.caption], verdicts) for i in items]


def _split_all(client: Judge, texts: list[str]) -> dict[str, tuple[tuple[str, ...], str | None]]:
    """Each distinct text's facts (empty with an error when the split is missing)."""
    unique = list(dict.fromkeys(texts))
    judged = client.judge_many([JudgeRequest(prompts.FACTS_SPLIT, prompts.facts_split_messages(t)) for t in unique],
                               desc="judge facts: split")
    return {t: ((clean_facts(j.value["facts"]), None) if j.value is not None else ((), j.error))
            for t, j in zip(unique, judged)}


def _check_all(client: Judge, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], Judgment]:
    """Each distinct (description, fact) question asked once, grouped by description."""
    by_text: dict[str, dict[str, None]] = {}
    for text, fact in pairs:
        by_text.setdefault(text, {})[fact] = None
    unique = [(text, fact) for text, facts in by_text.items() for fact in facts]
    judged = client.judge_many([JudgeRequest(prompts.FACT_CHECK, prompts.fact_check_messages(t, f))
                                for t, f in unique], desc="judge facts: check")
    return dict(zip(unique, judged))


def _verdicts(text: str, facts: tuple[str, ...], verdicts: dict) -> tuple[list[dict], list[str]]:
    rows, errors = [], []
    for fact in facts:
        judgment = verdicts[(text, fact)]
        supported = None if judgment.value is None else judgment.value["answer"] == "yes"
        rows.append({"fact": fact, "supported": supported})
        if judgment.error:
            errors.append(judgment.error)
    return rows, errors


def _item_result(item: CaptionItem, reference: tuple, caption: tuple, verdicts: dict) -> dict:
    (ref_facts, ref_error), (cap_facts, cap_error) = reference, caption
    ref_rows, ref_errors = _verdicts(item.caption, ref_facts, verdicts)
    cap_rows, cap_errors = _verdicts(item.reference, cap_facts, verdicts)
    errors = [e for e in (ref_error, cap_error) if e] + ref_errors + cap_errors
    if not ref_facts and not ref_error:
        errors.append("the reference split into no facts")
    out = {"key": item.key, "mode": "facts", "score": None, "parts": {"facts": None}, "errors": errors,
           "recall": None, "precision": None, "f1": None,
           "reference_facts_from": "task" if item.reference_facts else "judge",
           "reference_facts": ref_rows, "caption_facts": cap_rows}
    if errors:
        return out
    figures = fact_f1([r["supported"] for r in ref_rows], [r["supported"] for r in cap_rows])
    score = f1_to_scale(figures["f1"])
    return {**out, **figures, "score": score, "parts": {"facts": score}}
