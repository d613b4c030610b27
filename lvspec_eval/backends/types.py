"""The values a backend scores and commits: a draft tree, the target's scores of it, a verdict.

They are the words of the contract between the engine and the backends (backends/base.py:
`Backend.score(state, draft) -> Scores`, `Backend.commit(state, verdict)`), so they live below both:
decoding/ uses them (and re-exports them from decoding/types.py), backends/ imports nothing of decoding/.

Vocabulary (used everywhere in `decoding/` and `backends/`):
- root: the last committed token. Its target KV entry may not exist yet: committed tokens whose
  KV has not been computed are "pending" and are fed at the front of the next target forward.
- draft: a tree of proposed tokens hanging off the root. A chain is a tree whose parents are
  [-1, 0, 1, ...]. Node i's parent is `parents[i]` (-1 = the root); parents come before children.
- verdict: what a verifier decided: the committed tokens (draft tokens accepted along one
  root-to-leaf path, then one token chosen by the target: the "bonus"), and how many of the
  accepted nodes keep their KV entries (a prefix of the path whose context is exactly what was
  committed). The rest of the committed tokens become pending.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

# How a committed token got there (per-token records in stats):
EXACT, LOOSE, PST, TARGET = "exact", "loose", "pst", "target"


@dataclass(frozen=True)
class Draft:
    """A draft tree. Its tensors live on the drafter's device: building and scoring it needs no
    host round trip; what the host needs of it travels once per step (see `HostView`)."""

    tokens: torch.Tensor  # [num_nodes] long
    parents: torch.Tensor  # [num_nodes] long; -1 = the root; parents[i] < i
    scores: torch.Tensor | None = None  # [num_nodes] draft cumulative log-prob, if known
    probs: torch.Tensor | None = None  # [num_nodes] draft probability of each token at its parent
    depth: int | None = None  # the deepest node's depth, when the drafter knows it (saves a look)
    plan: dict | None = None  # what a draft policy chose for this step and why (stats records)

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())  # numel is metadata: no device sync

    @staticmethod
    def empty(device: torch.device | str = "cpu", plan: dict | None = None) -> "Draft":
        z = torch.zeros(0, dtype=torch.long, device=device)
        return Draft(tokens=z, parents=z.clone(), depth=0, plan=plan)


@dataclass(frozen=True)
class HostView:
    """What the host needs of one verification step, copied from the device in one transfer:
    the draft's tokens, parents and scores, and per logits row the target's greedy token and its
    margin (top-1 minus top-2 logit: how close the target was to choosing otherwise)."""

    tokens: list[int]  # [num_nodes]
    parents: list[int]  # [num_nodes]
    scores: list[float] | None  # [num_nodes] draft cumulative log-prob, or None when unknown
    probs: list[float] | None  # [num_nodes] draft probability at the parent, or None
    target: list[int]  # [num_nodes + 1] the target's argmax after the root (0) and after node i (i + 1)
    margins: list[float]  # [num_nodes + 1] top-1 minus top-2 logit of the same rows
    extra: tuple[list[float], ...] = ()  # columns a verifier asked for, in the order it gave them


@dataclass(frozen=True)
class Scores:
    """The target's verification forward over [pending..., root, nodes...]."""

    logits: torch.Tensor  # [num_nodes + 1, vocab]: row 0 predicts after the root, row i+1 after node i
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [num_pending + num_nodes, hidden]
    num_pending: int = 1  # rows of `hidden` before the nodes; the root is row num_pending - 1
    _memo: dict = field(default_factory=dict, repr=False, compare=False)  # host_view's one transfer

    def host_view(self, draft: Draft | None, extra: tuple[torch.Tensor, ...] = ()) -> HostView:
        """The step's host-side view (one device-to-host transfer, made once and kept).

        extra: 1-D float tensors a verifier needs on the host too (per node or per row); they ride
        along in the same transfer. A call with extra columns always transfers (and its view is
        kept); a call without reuses the kept view. In the loop the verifier asks first.
        """
        if "view" not in self._memo or extra:
            if draft is None:
                raise ValueError("host_view(None) before the step's view was made: pass the draft")
            self._memo["view"] = _transfer(draft, self.logits, self.greedy(), extra)
        return self._memo["view"]

    def greedy(self) -> torch.Tensor:
        """[num_nodes + 1] the target's argmax per row, on the device (computed once): commit takes the
        next step's root from it without a host round trip."""
        if "greedy" not in self._memo:
            self._memo["greedy"] = self.logits.argmax(-1)
        return self._memo["greedy"]

    def node_ids(self, nodes: list[int]) -> torch.Tensor:
        """[len(nodes)] long on the logits' device: the step's one upload of an accepted path, made
        once and shared (commit's cache gather, a drafter's catch-up on the committed tokens)."""
        memo = self._memo.setdefault("nodes", {})
        key = tuple(nodes)
        if key not in memo:
            memo[key] = torch.tensor(nodes, dtype=torch.long, device=self.logits.device)
        return memo[key]

    def committed_ids(self, draft: Draft, verdict: Verdict) -> torch.Tensor | None:
        """[len(verdict.tokens)] the committed tokens on the device, from the draft's tokens along
        the path and the target's own last token; None where the verdict commits other tokens (a
        loose verifier's substitutes) or the host view was not made."""
        view, root = self._memo.get("view"), self.committed_root(verdict)
        if root is None or [view.tokens[i] for i in verdict.path] != verdict.tokens[:-1]:
            return None
        path, tokens = verdict.path, draft.tokens
        if path == list(range(len(path))):  # a chain's prefix: a slice, no index to upload
            accepted = tokens[: len(path)]
        else:
            accepted = tokens.index_select(0, self.node_ids(path).to(tokens.device))
        return torch.cat([accepted.to(root.device), root])

    def committed_root(self, verdict: Verdict) -> torch.Tensor | None:
        """[1] the verdict's last token on the device, where it is the target's greedy token after the
        last accepted node (every verifier's bonus) and the host view was made; else None."""
        view = self._memo.get("view")
        row = (verdict.path[-1] if verdict.path else -1) + 1
        if view is None or view.target[row] != verdict.tokens[-1]:
            return None
        return self.greedy()[row: row + 1]


@dataclass(frozen=True)
class Verdict:
    tokens: list[int]  # committed this step, in order; the last one is the target's (bonus)
    path: list[int]  # draft node indices whose tokens are committed (in commit order)
    num_cached: int  # the first num_cached nodes of `path` keep their target KV entries
    kinds: list[str]  # per committed token: EXACT, LOOSE, PST or TARGET
    relevance: list[float | None] | None = None  # per committed token, when the verifier computes it

    @property
    def num_accepted(self) -> int:
        """Draft tokens accepted this step (the bonus is not counted, as in the papers)."""
        return len(self.tokens) - 1


def _transfer(draft: Draft, logits: torch.Tensor, greedy: torch.Tensor, extra: tuple[torch.Tensor, ...] = ()) -> HostView:
    """Pack everything the host needs into one float64 tensor and copy it once (token ids are
    exact in float64). greedy: [n + 1] the logits' argmax per row."""
    n, device = draft.num_nodes, logits.device
    top2 = logits.float().topk(min(2, logits.shape[-1]), dim=-1).values  # [n + 1, 2]
    margins = top2[:, 0] - top2[:, -1]
    zeros = torch.zeros(n, dtype=torch.float64, device=device)
    parts = [draft.tokens.to(device), draft.parents.to(device),
             zeros if draft.scores is None else draft.scores.to(device),
             zeros if draft.probs is None else draft.probs.to(device),
             greedy, margins, *(e.to(device) for e in extra)]
    flat = torch.cat([p.to(torch.float64).flatten() for p in parts]).tolist()
    cut = [0]
    for p in parts:
        cut.append(cut[-1] + p.numel())
    cols = [flat[a:b] for a, b in zip(cut[:-1], cut[1:])]
    tokens, parents, scores, probs, target, margin = cols[:6]
    return HostView(tokens=[int(t) for t in tokens], parents=[int(p) for p in parents],
                    scores=None if draft.scores is None else scores, probs=None if draft.probs is None else probs,
                    target=[int(t) for t in target], margins=margin, extra=tuple(cols[6:]))
