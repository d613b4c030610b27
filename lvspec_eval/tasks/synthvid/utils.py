"""Functions of the synthvid tasks (YAMLs in this folder): data, prompts and scoring.

The prompt of every doc is fixed (no random instruction choice), so two runs see identical inputs.
Captions are scored exactly against the scene that produced the video (judges/oracle.py).
"""
from __future__ import annotations

import re

import datasets

from judges.oracle import correct_facts, score_caption
from lvspec_eval.demo import tasks_data, world


def process_docs(dataset: datasets.Dataset) -> datasets.Dataset:
    """The stub file names its task; return that task's docs (generated into the cache if needed)."""
    names = sorted(set(dataset["task"]))
    if len(names) != 1:
        raise ValueError(f"a synthvid stub file must name exactly one task, got {names}")
    return datasets.Dataset.from_list(tasks_data.load_docs(names[0]))


def doc_to_visual(doc: dict) -> list[str]:
    return [doc["video"]]


def doc_to_text(doc: dict, lmms_eval_specific_kwargs: dict | None = None) -> str:
    kwargs = lmms_eval_specific_kwargs or {}
    return f"{kwargs.get('pre_prompt', '')}{doc['prompt']}{kwargs.get('post_prompt', '')}"


def doc_to_messages(doc: dict, lmms_eval_specific_kwargs: dict | None = None) -> list[dict]:
    """One user turn: the video, then the prompt (the layout the demo models were trained on)."""
    content = [{"type": "video", "url": doc["video"]}, {"type": "text", "text": doc_to_text(doc, lmms_eval_specific_kwargs)}]
    return [{"role": "user", "content": content}]


def process_caption(doc: dict, results: list[str]) -> dict:
    """Oracle scores; the per-sample visual_fact_accuracy also lists the facts stated right
    ("facts_right"), from which `lvspec-eval report` counts the fact errors a method introduced
    against vanilla's answer to the same doc."""
    scene = world.Scene.from_dict(doc["scene"])
    score = score_caption(results[0], scene)
    return {
        "fidelity_f1": score["f1"],
        "fidelity_precision": score["precision"],
        "fidelity_recall": score["recall"],
        "visual_fact_accuracy": {"correct": score["visual_correct"], "stated": score["visual_stated"],
                                 "facts_right": sorted(correct_facts(results[0], scene))},
    }


def visual_fact_accuracy(items: list[dict]) -> float:
    """Right colour/shape/motion facts over stated ones, pooled over samples (0 if none stated)."""
    stated = sum(item["stated"] for item in items)
    return sum(item["correct"] for item in items) / stated if stated else 0.0


def parse_letter(response: str, num_options: int = 4) -> str | None:
    """The first standalone option letter in the response ("B", "B.", "(B) red" -> "B"), else None."""
    letters = world.LETTERS[:num_options]
    match = re.search(rf"\b([{letters}])\b", response)
    return match.group(1) if match else None


def process_mcq(doc: dict, results: list[str]) -> dict:
    return {"accuracy": float(parse_letter(results[0], len(doc["options"])) == doc["answer"])}
