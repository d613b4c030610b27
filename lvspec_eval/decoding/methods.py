"""The named methods: each is a drafter and a verifier (plus tree and pruning settings).

    vanilla  = no drafter            + exact
    sd_tree  = model drafter         + exact     (SPEC.md section 2)
    specvlm  = pruned model drafter  + exact     (section 3)
    sparrow  = Sparrow head          + exact     (section 4)
    mtp      = the checkpoint's MTP layer + exact (Qwen3.5's own multi-token prediction)
    fly      = pruned model drafter  + fly       (section 5; chain drafts)
    lvspec   = pruned model drafter  + lvspec    (section 6)
    sage     = pruned model drafter  + exact, tree=sage (SAGE's entropy-driven tree: sage_tree.py)
    std      = the target over a sparse view of its own KV cache + exact (Sparse-to-Dense; chain of 9)
    custom   = drafter=<name>, verifier=<name>   (any combination)

A new method is a new drafter or verifier registered below plus one line in METHODS.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Callable

from .drafters import mtp, sparrow, sparse_view
from .drafters.model import ModelDrafter, NoDrafter
from .pruning import PruneConfig
from .tree import TreeConfig
from .verifiers.exact import ExactVerifier
from .verifiers.fly import FlyVerifier
from .verifiers.lvspec import LVSpecVerifier


@dataclass(frozen=True)
class MethodSpec:
    drafter: str
    verifier: str
    defaults: dict = field(default_factory=dict)  # option defaults this method changes


METHODS: dict[str, MethodSpec] = {
    "vanilla": MethodSpec("none", "exact"),
    "sd_tree": MethodSpec("model", "exact"),
    "specvlm": MethodSpec("pruned", "exact"),
    "sparrow": MethodSpec("sparrow", "exact"),
    "mtp": MethodSpec("mtp", "exact"),
    "fly": MethodSpec("pruned", "fly", {"tree_depth": 15}),  # FLy's public chain length k, as the cap
    "lvspec": MethodSpec("pruned", "lvspec"),
    "sage": MethodSpec("pruned", "exact", {"tree": "sage"}),  # SpecVLM's pruned draft, SAGE's entropy-driven tree
    # Sparse-to-Dense: chain of 9, drafted where drafting pays (as sage's tree and the adaptive policy)
    "std": MethodSpec("sparse_view", "exact", {"tree": "chain", "tree_depth": 9, "draft_when": "pays"}),
}
LOSSLESS_VERIFIERS = ("exact",)


# (depth, topk, total) per tree kind when the user sets none. The fixed shapes keep the settings
# every earlier figure was measured with; adaptive's are caps, wide enough for a GPU, where a
# 64-node verification costs about one target step (the policy measures and stays narrow on a CPU).
DRAFT_PREPARE = ("eager", "lazy")
DRAFT_WHEN = ("pays", "always")
GATED_TREES = ("adaptive", "sage")  # the kinds that draft only where it pays unless draft_when says otherwise
TREE_DEFAULTS = {"adaptive": (12, 8, 64), "dynamic": (8, 4, 16), "chain": (8, 1, 8), "static": (5, 4, 25),
                 "sage": (8, 10, 64)}  # SAGE: D_max 8, W_max 10, 64 nodes (its section 5.1)


@dataclass
class DecodeOptions:
    """Every decoding knob a user can set through model_args, with its default."""

    tree: str = "adaptive"  # adaptive | dynamic | static | chain | sage
    # None: the kind's own default (TREE_DEFAULTS). For adaptive they are caps on what the policy picks.
    tree_depth: int | None = None
    tree_topk: int | None = None
    tree_total: int | None = None
    tree_static: str = "specvlm26"
    prune_ratio: float = 0.9
    prune_lambda: float = 0.4
    prune_scorer: str = "attention"  # attention (SpecVLM's) | uv (UV-Prune: decoding/uv_prune.py)
    # std (Sparse-to-Dense): video entries kept per layer and KV head in the draft's sparse view of the
    # target's cache: a share of the video tokens (<= 1) or a count (> 1); std_budget: StD's K + m_t
    # (entries per layer, 1024 in the paper), which sets K instead when given
    std_keep: float = 0.1
    std_budget: int | None = None
    prune_uv_layers: str | None = None  # uv: "l1:l2" (1-based decoder layers); None: 1 and max(2, L/4)
    # eager: prepare the draft (pruning, its vision tower, its prefill) right after the target's
    # prefill, every request; lazy: on the first step that drafts (the adaptive policy's choice,
    # weighing what preparing costs; a fixed tree's first step), never for a one-token answer.
    # None: lazy where a step drafts only when it pays (draft_when), eager where every step drafts.
    draft_prepare: str | None = None
    # pays: a step drafts only where drafting is expected to pay (the adaptive policy decides for
    # tree=adaptive; the draft gate, policy/gate.py, for SAGE's tree and the fixed ones: no draft for a
    # one-letter answer); always: every step drafts. None: pays for tree=adaptive and tree=sage (and
    # std, whose method default says so), always for the fixed trees (their behaviour before the option).
    draft_when: str | None = None
    extra: dict = field(default_factory=dict)  # verifier/drafter options (fly_*, lv_*, sparrow_*, mtp_*)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)} - {"extra"}

    def __post_init__(self):
        if self.std_keep <= 0:
            raise ValueError(f"std_keep={self.std_keep} must be > 0 (a share of the video tokens up to 1, a count above 1)")
        if self.std_budget is not None and self.std_budget < 1:
            raise ValueError(f"std_budget={self.std_budget} must be >= 1 (entries per layer, K + text)")
        if self.draft_prepare not in (None, *DRAFT_PREPARE):
            raise ValueError(f"draft_prepare={self.draft_prepare!r}; expected one of {', '.join(DRAFT_PREPARE)}")
        if self.draft_when not in (None, *DRAFT_WHEN):
            raise ValueError(f"draft_when={self.draft_when!r}; expected one of {', '.join(DRAFT_WHEN)}")
        if self.draft_when == "always" and self.tree == "adaptive":
            raise ValueError("draft_when=always with tree=adaptive: the adaptive policy decides when a step drafts; "
                             "pick a fixed tree (dynamic, static, chain) or sage to draft on every step")

    def gated(self) -> bool:
        """Whether a step drafts only where drafting is expected to pay (see `draft_when`)."""
        if self.draft_when is None:
            return self.tree in GATED_TREES
        return self.draft_when == "pays"

    def eager_draft(self) -> bool:
        """Whether the draft is prepared at the start of every request (see `draft_prepare`)."""
        if self.draft_prepare is None:
            return not self.gated()
        return self.draft_prepare == "eager"

    def tree_config(self) -> TreeConfig:
        depth, topk, total = (given if given is not None else default for given, default in
                              zip((self.tree_depth, self.tree_topk, self.tree_total),
                                  TREE_DEFAULTS.get(self.tree, TREE_DEFAULTS["dynamic"])))
        return TreeConfig(self.tree, depth, topk, total, self.tree_static, gated=self.gated())

    def prune_config(self) -> PruneConfig:
        layers = None
        if self.prune_uv_layers is not None:
            try:
                layers = tuple(int(x) for x in str(self.prune_uv_layers).split(":"))
            except ValueError:
                layers = ()
            if len(layers) != 2:
                raise ValueError(f"prune_uv_layers={self.prune_uv_layers!r}; expected two layer numbers as l1:l2, e.g. 1:7")
        return PruneConfig(self.prune_ratio, self.prune_lambda, self.prune_scorer, layers)


# name -> factory(options, draft_backend, target_backend); draft_backend None means the target
# itself drafts (Self-SD)
DRAFTERS: dict[str, Callable] = {
    "none": lambda opts, draft, target: NoDrafter(),
    "model": lambda opts, draft, target: ModelDrafter(opts.tree_config(), draft, eager=opts.eager_draft(),
                                                      target=target),
    "pruned": lambda opts, draft, target: ModelDrafter(opts.tree_config(), draft, opts.prune_config(),
                                                       eager=opts.eager_draft(), target=target),
    "sparrow": sparrow.build_drafter,
    "mtp": mtp.build_drafter,
    "sparse_view": sparse_view.build_drafter,  # the target over a sparse view of its own cache (StD)
}
# name -> factory(options)
VERIFIERS: dict[str, Callable] = {
    "exact": lambda opts: ExactVerifier(),
    "fly": lambda opts: FlyVerifier.from_options(opts.extra),
    "lvspec": lambda opts: LVSpecVerifier.from_options(opts.extra),
}
# option prefix -> the verifier class that owns (and validates) those options; see its OPTIONS
VERIFIER_OPTIONS = {"fly_": FlyVerifier, "lv_": LVSpecVerifier, "pst": LVSpecVerifier}


def _unknown(kind: str, name: str, known) -> ValueError:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {kind} {name!r}; expected one of {', '.join(sorted(known))}.{hint}")


def resolve(method: str, drafter: str | None = None, verifier: str | None = None) -> MethodSpec:
    """The (drafter, verifier) pair a method name stands for; `custom` takes both explicitly."""
    if method == "custom":
        if not drafter or not verifier:
            raise ValueError("method=custom needs drafter=<name> and verifier=<name>; drafters: "
                             f"{', '.join(DRAFTERS)}; verifiers: {', '.join(VERIFIERS)}")
        spec = MethodSpec(drafter, verifier)
    elif method in METHODS:
        spec = METHODS[method]
        if drafter or verifier:
            spec = MethodSpec(drafter or spec.drafter, verifier or spec.verifier, spec.defaults)
    else:
        raise _unknown("method", method, [*METHODS, "custom"])
    if spec.drafter not in DRAFTERS:
        raise _unknown("drafter", spec.drafter, DRAFTERS)
    if spec.verifier not in VERIFIERS:
        raise _unknown("verifier", spec.verifier, VERIFIERS)
    return spec


def make_options(spec: MethodSpec, user: dict) -> DecodeOptions:
    """Defaults, then the method's own defaults, then what the user set (already typed)."""
    values = {**spec.defaults, **user}
    for owner in dict.fromkeys(VERIFIER_OPTIONS.values()):  # typos and bad values fail here, before any model loads
        owner.from_options(values)
    if spec.verifier == "fly" and "fly_k" in values:  # FLy's chain length is the draft depth
        if "tree_depth" in user and user["tree_depth"] != values["fly_k"]:
            raise ValueError(f"fly_k={values['fly_k']} and tree_depth={user['tree_depth']} disagree; "
                             "fly_k sets the FLy chain length, give only one of them")
        values["tree_depth"] = values["fly_k"]
    known = DecodeOptions.field_names()
    return DecodeOptions(**{k: v for k, v in values.items() if k in known},
                         extra={k: v for k, v in values.items() if k not in known})


def build(spec: MethodSpec, options: DecodeOptions, draft_backend=None, target_backend=None):
    """(drafter, verifier) objects for one run."""
    return DRAFTERS[spec.drafter](options, draft_backend, target_backend), VERIFIERS[spec.verifier](options)


def is_lossless(spec: MethodSpec) -> bool:
    return spec.verifier in LOSSLESS_VERIFIERS


def describe(spec: MethodSpec, options: DecodeOptions) -> str:
    """One line: drafter (with its pruning or sparse view), verifier, tree, and whether it is lossless
    (dry-run prints it, so a run's composition is visible before it starts)."""
    drafter = spec.drafter
    if spec.drafter == "pruned":
        drafter += f" (drops {options.prune_ratio:.0%} of the video, scorer {options.prune_scorer})"
    elif spec.drafter == "sparse_view":
        keep = options.std_budget and f"K + text = {options.std_budget}" or f"std_keep {options.std_keep:g}"
        drafter += f" (the target over a sparse view of its cache: {keep} per layer)"
    tree = options.tree_config()
    return (f"drafter {drafter} + verifier {spec.verifier}, {tree!r}; "
            f"{'lossless (exact verification)' if is_lossless(spec) else 'lossy'}")
