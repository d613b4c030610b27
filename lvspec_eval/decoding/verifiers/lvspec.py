"""LVSpec: loose verification guided by visual relevance, plus position-shift tolerance (PST).
SPEC.md section 6 (LVSpec, "Visual anchors": strict on visually grounded tokens, loose on fillers).

For every draft node c (hanging off parent node q; logits row q + 1 judges it):
- relevance r_c: the mean of the `lv_topn` largest cosine similarities between a hidden state of
  the target (layer `lv_layer`, from the verification forward: free) and the visual tokens'
  hidden states at the same layer (cached at prefill), both centred on the video's mean state
  (lv_center=visual; see loose.VisualIndex). Whose hidden state (lv_anchor): `parent`, the
  state at q that predicts c's token (default), asks "is this slot about the video?", so a
  draft's filler proposed where the target is about to name a colour is judged strictly too;
  `node`, the state at c that has read c's token, asks "is this token, in context, about the
  video?", which misses exactly that case (a filler read in context looks non-visual). On the
  demo targets, parent + centring separated visual words from fillers best (AUC 0.69-0.79 at
  layer 2 vs 0.58-0.63 for node; `lvspec-eval sweep` prints this probe). A prompt
  without visual tokens gives r_c = 0: every token counts as non-visual and is verified loosely
  (there is nothing visual to protect).
- strict when r_c >= lv_threshold: only an exact match is accepted (kind EXACT).
- loose when r_c < lv_threshold: a mismatch is accepted (kind LOOSE, the draft's token is kept)
  if the target finds it plausible at its parent: lv_loose=ratio: p(c) / p(argmax) >= lv_lambda;
  lv_loose=topk: c's token is among the target's lv_topk best.
- PST (position-shift tolerance): when no child of the current node matches or is loosely
  acceptable, but the target's token t there equals a draft token j levels further down
  (1 <= j <= pst_window: the draft inserted j tokens) on a child's favourite chain (its
  highest-scored descendants; for a chain draft, the chain itself), and at least `pst_confirm`
  draft tokens after it match the target exactly, commit t (kind PST) and continue the walk
  from that deeper node. The confirmation is our guard: without it, in a wide tree the target's
  token is often found somewhere below by chance, and the shift would only add a token predicted
  from a context the target never saw. Lossy approximation: the deeper node and everything after
  it were scored with the j skipped tokens in context and at positions shifted by j, and are
  judged as if they were not. Their KV entries are therefore dropped: num_cached = the index of
  the first PST node in the path, and the tokens from there on are re-fed (pending) in the next
  target forward.
The walk is greedy on trees: exact child, else the loosely acceptable child the target likes
best, else the shallowest confirmed PST match (ties: the one whose parent gives the target's
token the highest logit).
Ablations: lv_relevance=off (loose everywhere, a visually blind loose verifier), pst=off or
pst_window=0 (no shifts), lv_threshold=-1 (strict everywhere: with pst off, token-identical to
exact verification).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch

from .. import tree
from ..types import EXACT, LOOSE, PST, TARGET, Draft, Scores, Verdict
from . import loose

# Defaults from `lvspec-eval sweep` on the demo pair (results/sweep/sweep.md): layer 2 of the 8-layer
# demo target separates visual words from fillers best (AUC 0.69 vs 0.59-0.63 at layers 4-8), with
# its best threshold at 0.57. lv_lambda 0.1 (the draft token must have at least a tenth of the top
# token's probability) is on the Pareto front at 100% retention; lv_lambda 0, which lets the
# relevance gate alone decide, lost 11 visual facts in 6 captions (90.2%). With the grounded demo
# target every mismatch the distilled draft leaves is one the target finds implausible, so LVSpec
# is exact here; with the restyled demo draft (another wording) these defaults accept its wording
# loosely without losing a fact, and so does lv_relevance=off: on the demo the lv_lambda test is what
# keeps the facts (results/sweep_restyled/sweep.md); with lv_lambda 0 the relevance gate still cuts
# the facts lost from 29 (blind) to 11 (results/loose/blind_lambda0_*). For a real target, run the
# probe and sweep again: the best layer and the cosine scale differ per model.
RULES = {
    "lv_layer": loose.Option(2, int, "1-based decoder layer whose hidden states judge relevance (-1: final norm)",
                             low=-1),
    "lv_anchor": loose.Option("parent", str, "whose hidden state judges a token: parent (the state that predicts "
                              "it: is this slot visual?) or node (the state that has read it)",
                              choices=("parent", "node")),
    "lv_center": loose.Option("visual", str, "subtract the video's mean hidden state before the cosines",
                              choices=("visual", "none")),
    "lv_topn": loose.Option(8, int, "relevance = mean of this many best cosine similarities to visual tokens", low=1),
    "lv_threshold": loose.Option(0.55, float, "relevance at or above this -> strict exact match", low=-1.0, high=1.0),
    "lv_lambda": loose.Option(0.1, float, "lv_loose=ratio: accept when p(draft)/p(top) >= this", low=0.0, high=1.0),
    "lv_loose": loose.Option("ratio", str, "plausibility test of a loose mismatch", choices=("ratio", "topk")),
    "lv_topk": loose.Option(3, int, "lv_loose=topk: accept a draft token among the target's top-k", low=1),
    "lv_relevance": loose.Option("on", str, "off: loose everywhere (no visual gate)", choices=("on", "off")),
    "pst": loose.Option("on", str, "position-shift tolerance", choices=("on", "off")),
    "pst_window": loose.Option(2, int, "PST: most draft tokens the draft may have inserted", low=0),
    "pst_confirm": loose.Option(1, int, "PST: exact matches needed after the shifted token", low=0),
}


@dataclass
class Walk:
    """The committed part of a draft: nodes in commit order, their kinds, the first PST index."""

    path: list[int]
    kinds: list[str]
    num_cached: int


@dataclass(frozen=True)
class Judged:
    """What the walk needs to know about each draft node (lists indexed by node)."""

    tokens: list[int]
    target: list[int]  # target[q + 1]: the target's token after node q (q = -1: the root)
    lenient: list[bool]  # may be accepted on a mismatch (loose rule passed)
    preference: list[float]  # the target's logit of the node's token at its parent
    kids: list[list[int]]  # tree.children(parents), each list by falling draft score


def lvspec_walk(j: Judged, pst_window: int, pst_confirm: int = 1) -> Walk:
    """Greedy walk from the root: exact child, else the lenient child the target prefers, else a
    confirmed position shift; stop when none applies.

    Example (a chain, pst_window=1): draft [5, 9, 7]; the target wants 9 after the root and 7
    after node 1. Node 0 (5) neither matches nor is lenient, but node 1 one level further down
    carries 9, and its child 7 matches (the confirmation): commit 9 (PST), then 7 (EXACT):
    Walk(path=[1, 2], kinds=[pst, exact], num_cached=0). The caller appends the target's token.
    """
    path, kinds, shift, node = [], [], None, -1
    while j.kids[node + 1]:
        want, options = j.target[node + 1], j.kids[node + 1]
        exact = next((c for c in options if j.tokens[c] == want), None)
        lenient = [c for c in options if j.lenient[c]]
        if exact is not None:
            node, kind = exact, EXACT
        elif lenient:
            node, kind = max(lenient, key=lambda c: j.preference[c]), LOOSE
        else:
            hit = _shifted_match(j, node, pst_window, pst_confirm)
            if hit is None:
                break
            node, kind, shift = hit, PST, len(path) if shift is None else shift
        path.append(node)
        kinds.append(kind)
    return Walk(path, kinds, len(path) if shift is None else shift)


def _shifted_match(j: Judged, node: int, window: int, confirm: int) -> int | None:
    """PST: a node 1..window levels below a child of `node`, on that child's favourite chain (its
    highest-scored descendants), carrying the target's token after `node`, followed by at least
    `confirm` exact matches. The shallowest such node wins; ties go to the target's preference."""
    want = j.target[node + 1]
    chains = [[c] for c in j.kids[node + 1]]
    for _ in range(window):
        chains = [ch + [j.kids[ch[-1] + 1][0]] for ch in chains if j.kids[ch[-1] + 1]]
        hits = [ch[-1] for ch in chains if j.tokens[ch[-1]] == want and _exact_run(j, ch[-1], confirm) >= confirm]
        if hits:
            return max(hits, key=lambda c: j.preference[c])
    return None


def _exact_run(j: Judged, node: int, limit: int) -> int:
    """How many exact matches follow `node` along the tree (counting stops at `limit`)."""
    run = 0
    while run < limit:
        node = next((c for c in j.kids[node + 1] if j.tokens[c] == j.target[node + 1]), None)
        if node is None:
            break
        run += 1
    return run


def _children_by_score(parents: list[int], scores: list[float] | None) -> list[list[int]]:
    """tree.children, each list sorted by falling draft score (kept in order when unknown)."""
    kids = tree.children(parents)
    if scores is None:
        return kids
    return [sorted(k, key=lambda c: -scores[c]) for k in kids]


class LVSpecVerifier:
    name = "lvspec"
    OPTIONS: ClassVar[dict] = {name: rule.default for name, rule in RULES.items()}  # name -> default

    def __init__(self, **options):
        values = loose.parse_options(options, RULES, ("lv_", "pst"), "LVSpec")
        unknown = sorted(set(options) - set(RULES))
        if unknown:
            raise ValueError(f"unknown LVSpec option(s) {', '.join(unknown)}; known: {', '.join(RULES)}")
        self.options = values
        self.layer, self.topn, self.threshold = values["lv_layer"], values["lv_topn"], values["lv_threshold"]
        if self.layer == 0:
            raise ValueError("lv_layer=0 is not a layer; expected a 1-based decoder layer or -1 (final norm)")
        self.use_relevance = values["lv_relevance"] == "on"
        self.pst_window = values["pst_window"] if values["pst"] == "on" else 0
        self.hidden_layers: tuple[int, ...] = (self.layer,) if self.use_relevance else ()
        self.anchor = values["lv_anchor"]
        # memo: the index of a sample's visual states, kept while the request holds them (a weak
        # reference: the index goes with its tensor, never held into the next request)
        self._visual_src: weakref.ref | None = None
        self._visual_index: loose.VisualIndex | None = None

    @classmethod
    def from_options(cls, extra: dict) -> LVSpecVerifier:
        """From DecodeOptions.extra (keys lv_*, pst*); unknown ones raise ValueError listing the known."""
        return cls(**loose.parse_options(extra, RULES, ("lv_", "pst"), "LVSpec"))

    def __repr__(self) -> str:
        return "LVSpecVerifier(" + ", ".join(f"{k}={v}" for k, v in self.options.items()) + ")"

    def verify(self, draft: Draft, scores: Scores, visual_hidden: dict | None = None) -> Verdict:
        logits = scores.logits  # [num_nodes + 1, vocab]
        parents = draft.parents.to(logits.device)
        judging = logits[parents + 1]  # [num_nodes, vocab]: the row that judges each node
        relevance = self.relevance(draft, scores, visual_hidden)  # [num_nodes] or None
        lenient = self.plausible(judging, draft.tokens)
        if relevance is not None:
            relevance = relevance.to(logits.device)
            lenient &= relevance < self.threshold
        preference = judging.float().gather(-1, draft.tokens.view(-1, 1).to(logits.device)).squeeze(-1)
        # the three per-node columns the walk reads travel with the step's one transfer
        view = scores.host_view(draft, extra=(lenient.float(), preference, torch.zeros_like(preference)
                                              if relevance is None else relevance.float()))
        lenient_h, preference_h, relevance_h = view.extra
        walk = lvspec_walk(Judged(view.tokens, view.target, [x > 0.5 for x in lenient_h], preference_h,
                                  _children_by_score(view.parents, view.scores)),
                           self.pst_window, self.options["pst_confirm"])
        last = walk.path[-1] if walk.path else -1
        tokens = [view.tokens[c] for c in walk.path] + [view.target[last + 1]]
        # The target's token is recorded with the relevance of the draft token it replaced (the
        # draft's favourite there, whose token the loop records as `replaced`; with
        # lv_anchor=parent, the relevance of the slot itself), or None when the draft had nothing
        # there (a bonus token).
        rejected = tree.best_child(view.parents, view.scores, last)
        rel = None if relevance is None else [relevance_h[c] for c in walk.path] + [
            None if rejected is None else relevance_h[rejected]]
        return Verdict(tokens=tokens, path=walk.path, num_cached=walk.num_cached, kinds=walk.kinds + [TARGET],
                       relevance=rel)

    def plausible(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[rows] bool: the target would not mind `tokens` (one per row of `logits`)."""
        if self.options["lv_loose"] == "topk":
            return loose.target_rank(logits, tokens) < self.options["lv_topk"]
        return loose.prob_ratio(logits, tokens) >= self.options["lv_lambda"]

    def relevance(self, draft: Draft, scores: Scores, visual_hidden: dict | None) -> torch.Tensor | None:
        """[num_nodes] visual relevance of each node's token (None when lv_relevance=off)."""
        if not self.use_relevance:
            return None
        if self.layer not in scores.hidden or visual_hidden is None or self.layer not in visual_hidden:
            raise ValueError(f"LVSpec needs the target's hidden states at lv_layer={self.layer} for the draft "
                             "and the visual tokens; the backend did not record them")
        hidden = scores.hidden[self.layer]  # [num_pending + num_nodes, dim]; node i at row p + i, root at p - 1
        p = scores.num_pending
        rows = p + (draft.parents.to(hidden.device) if self.anchor == "parent"
                    else torch.arange(draft.num_nodes, device=hidden.device))
        return self._index(visual_hidden[self.layer]).relevance(hidden[rows], self.topn)

    def _index(self, visual: torch.Tensor) -> loose.VisualIndex:
        """Index a sample's visual states once (the loop passes the same tensor every step)."""
        if self._visual_src is None or self._visual_src() is not visual:
            self._visual_src = weakref.ref(visual, self._forget)
            self._visual_index = loose.VisualIndex.build(visual, self.options["lv_center"] == "visual")
        return self._visual_index

    def _forget(self, ref: weakref.ref) -> None:
        """The indexed visual states were freed (their request is over): free their index too."""
        if ref is self._visual_src:
            self._visual_src, self._visual_index = None, None
