"""judge-check: does an LLM judge agree with the exact oracle on demo-world captions?

Why: an LLM judge's score is only evidence about caption fidelity if it tracks the truth. In the
demo world the truth is known (judges/oracle.py), so we can measure the judge before trusting it:
- rank agreement with the oracle (Spearman, Kendall) over captions of graded correctness;
- quadratic-weighted Cohen's kappa between the judge's 0-5 and the oracle's F1 mapped to 0-5;
- identity: the reference judged against itself must get the top score;
- perturbation: a caption with a wrong colour/shape/motion must score below the unperturbed one.

The captions need no trained model: per scene, the reference caption, a paraphrase of it, and the
paraphrase with 1, 2 or 3 facts swapped for wrong values (one single swap per kind).
"""
from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from judges import oracle
from lvspec_eval.demo import world

if TYPE_CHECKING:
    from judges.client import JudgeClient

PERTURB_KINDS = ("colour", "shape", "motion")
_VALUES = {"colour": tuple(world.COLOURS), "shape": world.SHAPES, "motion": world.MOTIONS}
TOP_SCORE = 5


@dataclass(frozen=True)
class Candidate:
    """A caption to judge against `reference`; `kind` is identity, paraphrase or perturbed-N."""

    scene_seed: int
    kind: str
    caption: str
    reference: str
    swaps: tuple[str, ...]  # what was made wrong, e.g. ("colour@0",)
    oracle_f1: float
    qa: tuple[tuple[str, str], ...]
    reference_facts: tuple[str, ...] = ()  # the scene's facts (oracle.scene_facts), for mode facts


def perturb_scene(scene: world.Scene, swaps: Sequence[tuple[int, str]], rng: random.Random) -> world.Scene:
    """`scene` with object i's attribute `kind` changed to another value, for each (i, kind)."""
    objects = list(scene.objects)
    for index, kind in swaps:
        if kind not in _VALUES:
            raise ValueError(f"perturbation kind {kind!r}; allowed: {', '.join(PERTURB_KINDS)}")
        current = getattr(objects[index], kind)
        wrong = rng.choice([v for v in _VALUES[kind] if v != current])
        objects[index] = dataclasses.replace(objects[index], **{kind: wrong})
    return dataclasses.replace(scene, objects=tuple(objects))


def perturbed_caption(scene: world.Scene, swaps: Sequence[tuple[int, str]], caption_seed: int,
                      rng: random.Random) -> str:
    """The caption of `caption_seed`'s wording with the swapped facts: only those words change.

    Rendering the caption from a perturbed scene with the same paraphrase seed is a word swap that
    also handles multi-word motion phrases ("stays still" -> "moves up"); the grammar draws the
    same random numbers whatever the values, so every filler word stays the same.
    """
    return world.make_caption(perturb_scene(scene, swaps, rng), seed=caption_seed)


def scene_qa(scene: world.Scene) -> tuple[tuple[str, str], ...]:
    """Open reference questions with their answers (for VDCscore mode), from the scene's MCQs."""
    qa = []
    for q in world.make_questions(scene):
        qa.append((q["question"], q["options"][world.LETTERS.index(q["answer"])]))
    return tuple(qa)


def pick_questions(qa: tuple[tuple[str, str], ...], max_questions: int | None,
                   seed: int) -> tuple[tuple[str, str], ...]:
    """At most `max_questions` of a scene's questions, drawn by `seed` alone (never by which facts
    a candidate got wrong), in their original order; None keeps all."""
    if max_questions is None or max_questions >= len(qa):
        return qa
    if max_questions < 1:
        raise ValueError(f"max_questions={max_questions}; allowed: an integer >= 1, or None for all")
    keep = sorted(random.Random(seed * 7919 + 17).sample(range(len(qa)), max_questions))
    return tuple(qa[k] for k in keep)


def make_candidates(num_scenes: int, first_seed: int = 10_000, max_questions: int | None = None) -> list[Candidate]:
    """Per scene: identity, paraphrase, three single swaps (one per kind), a double and a triple.

    `max_questions` bounds the reference questions per scene (VDCscore mode asks two requests per
    question and caption, the costly part of judge-check on a CPU judge).
    """
    out = []
    for seed in range(first_seed, first_seed + num_scenes):
        scene, rng = world.make_scene(seed), random.Random(seed)
        reference, para_seed = world.make_caption(scene), seed * 31 + 1
        slots = [(i, k) for i in range(len(scene.objects)) for k in PERTURB_KINDS]
        swap_sets = [[(rng.randrange(len(scene.objects)), k)] for k in PERTURB_KINDS]
        swap_sets += [rng.sample(slots, 2), rng.sample(slots, 3)]
        texts = [("identity", reference, ()), ("paraphrase", world.make_caption(scene, seed=para_seed), ())]
        for swaps in swap_sets:
            names = tuple(f"{k}@{i}" for i, k in swaps)
            texts.append((f"perturbed-{len(swaps)}", perturbed_caption(scene, swaps, para_seed, rng), names))
        qa, facts = pick_questions(scene_qa(scene), max_questions, seed), oracle.scene_facts(scene)
        for kind, text, names in texts:
            f1 = oracle.score_caption(text, scene)["f1"]
            out.append(Candidate(seed, kind, text, reference, names, f1, qa, facts))
    return out


def to_scale(score: float) -> int:
    """A 0-5 score as an integer rating, rounding half up (Python's round() rounds half to even)."""
    return math.floor(score + 0.5)


def oracle_to_scale(f1: float) -> int:
    """The oracle's F1 as an integer rating on the judge's 0-5 scale."""
    return to_scale(TOP_SCORE * f1)


def quadratic_kappa(a: Sequence[int], b: Sequence[int], num_classes: int = TOP_SCORE + 1) -> float | None:
    """Cohen's kappa with quadratic weights for ratings 0..num_classes-1; None if undefined."""
    if len(a) != len(b):
        raise ValueError(f"rating lists differ in length: {len(a)} vs {len(b)}")
    if not a:
        return None
    observed = np.zeros((num_classes, num_classes))
    for x, y in zip(a, b):
        observed[x, y] += 1
    expected = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    i, j = np.indices(observed.shape)
    weights = (i - j) ** 2 / (num_classes - 1) ** 2
    denominator = float((weights * expected).sum())
    if denominator == 0.0:  # both raters constant: agreement beyond chance is undefined
        return None
    return 1.0 - float((weights * observed).sum()) / denominator


def _rank(x: list[float], y: list[float]) -> dict:
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return {"spearman": None, "spearman_p": None, "kendall": None, "kendall_p": None, "n": len(x)}
    rho, rho_p = stats.spearmanr(x, y)
    tau, tau_p = stats.kendalltau(x, y)
    return {"spearman": float(rho), "spearman_p": float(rho_p), "kendall": float(tau),
            "kendall_p": float(tau_p), "n": len(x)}


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _perturbation(cands: list[Candidate], scores: list[float | None]) -> dict:
    """Share of perturbed captions scored strictly below (and equal to) their scene's paraphrase."""
    para = {c.scene_seed: s for c, s in zip(cands, scores) if c.kind == "paraphrase"}
    pairs = [(c, s, para.get(c.scene_seed)) for c, s in zip(cands, scores) if c.kind.startswith("perturbed")]
    pairs = [(c, s, p) for c, s, p in pairs if s is not None and p is not None]
    by_kind = {}
    for kind in PERTURB_KINDS:
        mine = [s < p for c, s, p in pairs if c.kind == "perturbed-1" and c.swaps[0].startswith(kind)]
        by_kind[kind] = {"lower_share": _share(mine), "n": len(mine)}
    return {"lower_share": _share([s < p for _, s, p in pairs]), "tie_share": _share([s == p for _, s, p in pairs]),
            "n": len(pairs), "by_kind": by_kind}


def summarise(cands: list[Candidate], scores: list[float | None]) -> dict:
    """All judge-check metrics for judge `scores` (0-5, None = missing) of `cands`."""
    kept = [(c, s) for c, s in zip(cands, scores) if s is not None]
    judge = [float(s) for _, s in kept]
    truth = [c.oracle_f1 for c, _ in kept]
    identity = [s for c, s in zip(cands, scores) if c.kind == "identity" and s is not None]
    return {
        "num_captions": len(cands),
        "num_missing": len(cands) - len(kept),
        "missing_share": (len(cands) - len(kept)) / len(cands) if cands else None,
        "rank": _rank(judge, truth),
        "kappa_quadratic": quadratic_kappa([to_scale(s) for s in judge], [oracle_to_scale(t) for t in truth]),
        "identity": {"top_share": _share([s >= TOP_SCORE for s in identity]),
                     "mean": sum(identity) / len(identity) if identity else None, "n": len(identity)},
        "perturbation": _perturbation(cands, scores),
        "mean_score_by_kind": _mean_by_kind(cands, scores),
    }


def _mean_by_kind(cands: list[Candidate], scores: list[float | None]) -> dict:
    groups: dict[str, list[float]] = {}
    for c, s in zip(cands, scores):
        if s is not None:
            groups.setdefault(c.kind, []).append(float(s))
    return {k: sum(v) / len(v) for k, v in sorted(groups.items())}


def oracle_scores(cands: list[Candidate]) -> list[float]:
    """The oracle as a judge (F1 scaled to 0-5): the ceiling every metric is compared with."""
    return [TOP_SCORE * c.oracle_f1 for c in cands]


def run_check(cands: list[Candidate], judge: Callable[[list[Candidate]], list[float | None]]) -> dict:
    """Judge the candidates with `judge` and return metrics plus one row per caption."""
    scores = judge(cands)
    rows = [{"scene_seed": c.scene_seed, "kind": c.kind, "swaps": list(c.swaps), "oracle_f1": c.oracle_f1,
             "judge_score": s, "caption": c.caption} for c, s in zip(cands, scores)]
    return {**summarise(cands, scores), "oracle_ceiling": summarise(cands, oracle_scores(cands)), "rows": rows}


REFERENCE_FACTS = ("scene", "judge")


def llm_judge(client: JudgeClient, mode: str, reference_facts: str = "scene", details: list | None = None,
              caption_facts: str = "judge") -> Callable[[list[Candidate]], list[float | None]]:
    """An LLM judge for `run_check`: each candidate judged against its reference in `mode`.

    Mode facts takes the reference's facts from the scene (`reference_facts="scene"`, what a task
    that knows its facts does) or has the judge split the reference ("judge", what a task without
    them gets); `caption_facts` says how it splits the captions (judges/facts.py). `details`, if
    given, receives the judge's full result per candidate.
    """
    from judges.client import CaptionItem, score_captions  # here: the oracle path needs no openai

    if reference_facts not in REFERENCE_FACTS:
        raise ValueError(f"reference_facts={reference_facts!r}; allowed: {', '.join(REFERENCE_FACTS)}")

    def judge(cands: list[Candidate]) -> list[float | None]:
        items = [CaptionItem(key=f"{c.scene_seed}/{n}", caption=c.caption, reference=c.reference,
                             question=world.CAPTION_PROMPT, qa=c.qa,
                             reference_facts=c.reference_facts if reference_facts == "scene" else ())
                 for n, c in enumerate(cands)]
        results = score_captions(client, items, mode, caption_facts)
        if details is not None:
            details.extend(results)
        return [r["score"] for r in results]

    return judge
