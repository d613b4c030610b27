"""Shared pieces of the loose verifiers (FLy, LVSpec): typed options, the target's uncertainty,
plausibility of a draft token, visual relevance, and walking a draft tree.

All functions are pure and work on plain tensors:
    logits  [rows, vocab]  the target's verification logits (row 0: after the root, row i+1: after node i)
    tokens  [rows]         one candidate token per row
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import tree
from ..types import Draft

# ---- options ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One user option of a verifier: its default, type and allowed values."""

    default: object
    kind: type  # int, float or str
    help: str
    low: float | None = None  # inclusive bounds for numbers
    high: float | None = None
    choices: tuple = ()  # allowed values for strings

    def allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        kind = "an integer" if self.kind is int else "a number"
        lo = "" if self.low is None else f" >= {self.low}"
        hi = "" if self.high is None else f" <= {self.high}"
        return kind + (lo + (" and" if lo and hi else "") + hi)


def _coerce(name: str, value: object, opt: Option) -> object:
    """`value` as the option's type, or ValueError naming the option and what it allows."""
    bad = ValueError(f"{name}={value!r} is not allowed; expected {opt.allowed()}")
    if opt.kind is str:
        text = str(value).lower()
        text = {"true": "on", "false": "off", "1": "on", "0": "off"}.get(text, text) if "on" in opt.choices else text
        if text not in opt.choices:
            raise bad
        return text
    if isinstance(value, bool):
        raise bad
    if opt.kind is int and isinstance(value, float):
        value = int(value) if value.is_integer() else str(value)  # 2.0 -> 2; 2.5 fails below
    try:
        number = opt.kind(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or (isinstance(number, float) and math.isnan(number)):
        raise bad
    if (opt.low is not None and number < opt.low) or (opt.high is not None and number > opt.high):
        raise bad
    return number


def parse_options(given: dict, rules: dict[str, Option], prefixes: tuple[str, ...], owner: str) -> dict:
    """Typed values for every option in `rules` (defaults filled in) from a user dict.

    Keys of `given` that start with one of `prefixes` must be known; other keys belong to other
    components and are ignored here.
    """
    unknown = sorted(k for k in given if k.startswith(prefixes) and k not in rules)
    if unknown:
        raise ValueError(f"unknown {owner} option(s) {', '.join(unknown)}; known: {', '.join(rules)}")
    return {k: _coerce(k, given[k], r) if k in given else r.default for k, r in rules.items()}


# ---- what the target thinks of a token ----------------------------------------------------------

def topk_entropy(logits: torch.Tensor, k: int = 3) -> torch.Tensor:
    """[rows] entropy (nats) of the target's k most likely tokens, -sum p log p over the top k.

    p are full-softmax probabilities, NOT renormalised over the top k (FLy's gate, SPEC.md
    section 5): a flat long tail gives a small value, so a target that has no favourite at all is
    treated like a confident one and its mismatches are rejected (the conservative side).
    """
    probs = torch.softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1).values
    return -torch.special.xlogy(probs, probs).sum(-1)


def prob_ratio(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[rows] p_target(token) / p_target(argmax) = exp(logit[token] - max logit), in (0, 1]."""
    logits = logits.float()
    picked = logits.gather(-1, tokens.view(-1, 1).to(logits.device)).squeeze(-1)
    return torch.exp(picked - logits.max(-1).values)


def target_rank(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[rows] 0-based rank of `token` in the target's distribution (ties count in its favour)."""
    logits = logits.float()
    picked = logits.gather(-1, tokens.view(-1, 1).to(logits.device))
    return (logits > picked).sum(-1)


# ---- visual relevance (LVSpec) ------------------------------------------------------------------

def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """[rows, dim] float32 rows scaled to unit length (zero rows stay zero)."""
    return torch.nn.functional.normalize(x.float(), dim=-1)


@dataclass(frozen=True)
class VisualIndex:
    """A sample's visual hidden states at one layer, ready for cosine look-ups.

    centred: the mean visual state is subtracted from the visual states and from every query.
    Hidden states share a large common direction (more so in small models), which makes raw
    cosines between any two states high and alike; centring on the video's own mean removes it,
    so that the similarity says which visual content a state is about. (On the demo target,
    centring lifts the AUC of relevance for visual words vs fillers from about 0.5 to 0.7-0.8:
    `lvspec-eval sweep` prints this probe.)
    """

    unit: torch.Tensor  # [num_visual, dim] unit rows (after centring)
    mean: torch.Tensor | None  # [dim] subtracted from both sides, or None

    @staticmethod
    def build(visual: torch.Tensor, centred: bool) -> VisualIndex:
        visual = visual.float()
        mean = visual.mean(0) if centred and visual.shape[0] else None
        return VisualIndex(unit_rows(visual - mean if mean is not None else visual), mean)

    def relevance(self, hidden: torch.Tensor, topn: int) -> torch.Tensor:
        """[rows] mean of the top-`topn` cosine similarities of each row of hidden [rows, dim] to
        the visual states. No visual tokens -> 0 for every row. Returned on the visual states'
        device (the caller copies what it needs to the host, once)."""
        if self.unit.shape[0] == 0:
            return torch.zeros(hidden.shape[0], device=self.unit.device)
        hidden = hidden.float().to(self.unit.device)
        queries = unit_rows(hidden - self.mean if self.mean is not None else hidden)
        sims = queries @ self.unit.T  # [rows, num_visual]
        return sims.topk(min(topn, self.unit.shape[0]), dim=-1).values.mean(-1)


# ---- walking a draft ----------------------------------------------------------------------------

def draft_chain(view) -> list[int]:
    """One root-to-leaf path: at each node the child carrying the target's token, else the
    draft's favourite child (highest draft score; the first child when scores are unknown).

    view: the step's HostView (draft tokens, parents, scores and the target's tokens as lists).
    For a chain draft this is the whole chain. Lets a chain-only rule (FLy) run on any tree.
    """
    kids = tree.children(view.parents)
    path, node = [], -1
    while kids[node + 1]:
        match = next((c for c in kids[node + 1] if view.tokens[c] == view.target[node + 1]), None)
        node = match if match is not None else tree.best_child(view.parents, view.scores, node)
        path.append(node)
    return path
