"""The invariant: exact methods are token-identical to vanilla greedy decoding (fp32, batch 1).

Modelled on transformers' test_assisted_decoding_matches_greedy_search: random prompts and videos
(random frame counts and sizes, some without a video), every tiny family, SD-Tree and SpecVLM
with a separate random draft (Std-SD: low acceptance, same output) and with the target drafting
for itself (Self-SD; SpecVLM's on the pruned video), over dynamic, static and chain trees; SAGE
(`sage`: the pruned draft with SAGE's entropy-driven tree, also grown by the target and Sparrow's head),
Sparse-to-Dense (`std`: the target over a sparse view of its own cache) and UV-Prune's scores
(`prune_scorer=uv`) likewise.
Also: vanilla equals HF `generate`, and the target drafting on the full video accepts every
draft token. The fast cases cover each method x draft x tree once per family or more; the slow
ones (`-m slow`) sweep every combination with more seeds and a hypothesis search.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lvspec_eval.decoding import loop, methods

from conftest import FAMILY_FIXTURES

MAX_NEW_TOKENS = 12
# Small trees keep the suite fast; `dynamic` still prunes (4 + 3 * 16 candidates -> 12 kept).
TREES = {
    "dynamic": {"tree": "dynamic", "tree_depth": 4, "tree_topk": 4, "tree_total": 12},
    "static": {"tree": "static", "tree_static": "specvlm26"},
    "chain": {"tree": "chain", "tree_depth": 4},
    "adaptive": {"tree": "adaptive", "tree_depth": 6},
    "std": {"tree": "chain", "tree_depth": 9, "std_keep": 0.25},  # Sparse-to-Dense's chain of 9
    "sage": {"tree": "sage"},  # SAGE's own settings (D_max 8, W_max 10, 64 nodes)
    # SpecVLM's pruning with UV-Prune's scores (hidden states, no attention maps)
    "uv": {"tree": "dynamic", "tree_depth": 4, "tree_topk": 4, "tree_total": 12, "prune_scorer": "uv"},
    # SAGE's tree and StD's chain draft only where the draft gate expects it to pay; these draft on every step
    "sage_always": {"tree": "sage", "draft_when": "always"},
    "std_always": {"tree": "chain", "tree_depth": 9, "std_keep": 0.25, "draft_when": "always"},
}
METHODS = ("sd_tree", "specvlm", "sage", "std")  # std ignores the draft: the target drafts over its own cache
DRAFTS = ("std", "self")  # std: the family's separate small draft; self: draft=None (the target)
FAMILIES = ("qwen2_5_vl", "llava_onevision", "qwen3_vl", "qwen3_5")

_vanilla_cache: dict[tuple[str, int, int], list[int]] = {}


def _generate(family, method: str, draft: str | None, tree: dict, case, max_new_tokens: int):
    spec = methods.resolve(method)
    draft_backend = family.draft if draft == "std" else None
    drafter, verifier = methods.build(spec, methods.make_options(spec, dict(tree)), draft_backend, family.target)
    return loop.generate(family.target, drafter, verifier, case.prompt, case.videos, max_new_tokens)


def _case(family, make_case, seed: int):
    """Every eighth case has no video (the text-only path must stay lossless too)."""
    return make_case(seed, family.max_side, with_video=seed % 8 != 7)


def _vanilla(family, make_case, seed: int, max_new_tokens: int = MAX_NEW_TOKENS) -> list[int]:
    key = (family.name, seed, max_new_tokens)
    if key not in _vanilla_cache:
        out = _generate(family, "vanilla", None, {}, _case(family, make_case, seed), max_new_tokens)
        _vanilla_cache[key] = out.tokens
    return _vanilla_cache[key]


def _check_lossless(family, make_case, method, draft, tree_kind, seed, max_new_tokens=MAX_NEW_TOKENS):
    case = _case(family, make_case, seed)
    out = _generate(family, method, draft, TREES[tree_kind], case, max_new_tokens)
    want = _vanilla(family, make_case, seed, max_new_tokens)
    assert out.tokens == want, f"{family.name} {method} draft={draft} tree={tree_kind} seed={seed}"


# Each family: every method, draft and tree kind at least once, one case without a video
# (seed 7); 12 fast cases in all.
FAST = [
    (fam, method, draft, tree_kind, seed)
    for fam in FAMILIES
    for seed, method, draft, tree_kind in [
        (0, "sd_tree", "std", "dynamic"), (1, "sd_tree", "std", "static"), (2, "sd_tree", "self", "chain"),
        (3, "specvlm", "std", "chain"), (4, "specvlm", "self", "dynamic"), (7, "specvlm", "self", "static"),
        (5, "sd_tree", "std", "adaptive"), (6, "specvlm", "self", "adaptive"),
        (8, "sage", "std", "sage"), (9, "sage", "self", "sage"), (15, "sd_tree", "self", "sage"),
        (10, "specvlm", "std", "uv"), (12, "specvlm", "self", "uv"), (13, "sage", "self", "uv"),
        (14, "std", None, "std"), (16, "std", None, "sage"), (23, "std", None, "std"),
        (17, "sage", "std", "sage_always"), (18, "std", None, "std_always"),
    ]
]
# Every combination, two more seeds each (48 cases).
SLOW = [
    pytest.param(fam, method, draft, tree_kind, seed, marks=pytest.mark.slow)
    for i, (fam, method, draft, tree_kind) in enumerate(itertools.product(
        FAMILIES, METHODS, DRAFTS, [t for t in TREES if not t.endswith("_always")]))
    for seed in (100 + 2 * i, 101 + 2 * i)
]


@pytest.mark.parametrize("family,method,draft,tree_kind,seed", FAST + SLOW, indirect=["family"])
def test_exact_methods_match_vanilla(family, make_case, method, draft, tree_kind, seed):
    _check_lossless(family, make_case, method, draft, tree_kind, seed)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True)
@given(fam=st.sampled_from(FAMILIES), method=st.sampled_from(METHODS), draft=st.sampled_from(DRAFTS),
       tree_kind=st.sampled_from(list(TREES)), seed=st.integers(1000, 10**6), max_new=st.integers(1, 16))
def test_exact_methods_match_vanilla_property(request, make_case, fam, method, draft, tree_kind, seed, max_new):
    family = request.getfixturevalue(FAMILY_FIXTURES[fam])
    _check_lossless(family, make_case, method, draft, tree_kind, seed, max_new)


@pytest.mark.parametrize("tree_kind,depth", [("chain", 4), ("static", 5)])
@pytest.mark.parametrize("family", FAMILIES, indirect=True)
def test_target_as_drafter_accepts_everything(family, make_case, tree_kind, depth):
    """Without pruning the target drafts exactly its own greedy tokens: every step accepts the
    whole depth (the static tree holds the all-rank-0 path of depth 5)."""
    seed = 11
    out = _generate(family, "sd_tree", None, TREES[tree_kind], _case(family, make_case, seed), MAX_NEW_TOKENS)
    assert out.tokens == _vanilla(family, make_case, seed)
    assert out.stats.steps and all(s.num_accepted == depth for s in out.stats.steps)


def _hf_greedy(family, case, max_new_tokens: int) -> list[int]:
    backend = family.target
    inputs = backend.prepare(case.prompt, case.videos)
    kwargs = family.hf_kwargs(backend, inputs, inputs.input_ids)
    with torch.no_grad():
        out = backend.model.generate(**kwargs, max_new_tokens=max_new_tokens, do_sample=False)
    tokens = out[0, inputs.input_ids.shape[1]:].tolist()
    eos = next((i for i, t in enumerate(tokens) if t in backend.eos_token_ids), len(tokens))
    return tokens[:eos]


@pytest.mark.parametrize("seed", [0, 7])  # seed 7 has no video
@pytest.mark.parametrize("family", FAMILIES, indirect=True)
def test_vanilla_matches_hf_generate(family, make_case, seed):
    case = _case(family, make_case, seed)
    assert _vanilla(family, make_case, seed) == _hf_greedy(family, case, MAX_NEW_TOKENS)


@pytest.mark.parametrize("family", FAMILIES, indirect=True)
def test_adaptive_wide_trees_are_lossless(family, make_case, monkeypatch):
    """The adaptive policy on wide trees (as it picks on a GPU, where verification cost hardly
    grows with the nodes): forced here by a clock under which a target forward costs the same
    whatever its width, so the policy's measured costs favour width."""
    from lvspec_eval.decoding import policy as policy_module

    real_plan = policy_module.AdaptivePolicy.plan

    def wide(self, num_generated=0):  # the policy's own plan, but at its widest
        shape, info = real_plan(self, num_generated)
        if shape is None:
            return shape, info
        depth = max(shape.depth, 3)
        return policy_module.dynamic_shape(depth, self.widths[-1], self.widths[-1], None), \
            {**info, "depth": depth, "width": self.widths[-1]}

    monkeypatch.setattr(policy_module.AdaptivePolicy, "plan", wide)
    monkeypatch.setattr(policy_module.AdaptivePolicy, "choose_total", lambda self, values, *a: values.numel())
    for seed in (21, 22):
        case = _case(family, make_case, seed)
        for draft in DRAFTS:
            out = _generate(family, "sd_tree", draft, {"tree": "adaptive", "tree_topk": 4, "tree_depth": 4}, case,
                            MAX_NEW_TOKENS)
            assert out.tokens == _vanilla(family, make_case, seed), (family.name, draft, seed)
            assert max(s.num_draft_nodes for s in out.stats.steps) > 4  # trees, not chains


# ---- drafts prepared late (draft_prepare=lazy) -----------------------------------------------------------
LATE = 5  # generated tokens before the first step that drafts


@pytest.fixture
def late_drafting(monkeypatch):
    """Every drafter plans no draft before LATE tokens are committed (its planner says so, as the
    adaptive policy does when it expects no draft to pay yet); the lazy draft is prepared then."""
    from lvspec_eval.decoding.drafters import growth

    real = growth.TreePlanner.next_shape

    def next_shape(self, num_generated=0):
        if num_generated < LATE:
            return None, {"depth": 0, "width": 0, "reason": "test: not yet"}
        return real(self, num_generated)

    monkeypatch.setattr(growth.TreePlanner, "next_shape", next_shape)


def _sparrow_head(family, tmp_path_factory) -> str:
    from lvspec_eval.decoding.drafters.sparrow import SparrowHead

    path = tmp_path_factory.mktemp(f"head_{family.name}")
    torch.manual_seed(0)
    SparrowHead.for_target(family.target).save(path)
    return str(path)


@pytest.mark.parametrize("tree_kind", ["dynamic", "chain", "adaptive"])
@pytest.mark.parametrize("method,draft", [("sd_tree", "std"), ("sd_tree", "self"), ("specvlm", "std"),
                                          ("specvlm", "self"), ("sparrow", None)])
@pytest.mark.parametrize("family", FAMILIES, indirect=True)
def test_a_draft_prepared_late_stays_lossless(family, make_case, method, draft, tree_kind, late_drafting,
                                              tmp_path_factory):
    """model, pruned, self (full and pruned) and Sparrow drafters, prepared mid-request: the draft
    catches up on the committed tokens and the answer is still vanilla's, token for token."""
    options = {**TREES[tree_kind], "draft_prepare": "lazy"}
    if method == "sparrow":
        options["sparrow_head"] = _sparrow_head(family, tmp_path_factory)
    for seed in (31, 32):
        case = _case(family, make_case, seed)
        out = _generate(family, method, draft, options, case, MAX_NEW_TOKENS)
        assert out.tokens == _vanilla(family, make_case, seed), (family.name, method, draft, tree_kind, seed)
        at = out.stats.draft_prepared_at
        # the adaptive policy measured plain steps meanwhile, so it probes (and prepares) at LATE too
        assert at == LATE, (at, out.stats.num_new_tokens)
        assert out.stats.draft_prepare_s > 0 and max(s.num_draft_nodes for s in out.stats.steps) > 0


@pytest.mark.parametrize("family", FAMILIES, indirect=True)
def test_std_over_its_whole_cache_accepts_everything(family, make_case):
    """Sparse-to-Dense keeping every video entry (std_keep=1.0): the view is the target's own cache,
    so the target drafts its own greedy tokens and every step accepts the whole chain of 9 (the
    view's gathering, its growth with committed entries and the drafted positions are all exact)."""
    seed = 11
    out = _generate(family, "std", None, {"std_keep": 1.0}, _case(family, make_case, seed), MAX_NEW_TOKENS)
    assert out.tokens == _vanilla(family, make_case, seed)
    # the draft gate decodes the run's first step plainly (to measure it), and the view is prepared
    # then (lazily): it catches up on the committed entries before the first chain
    drafted = [s for s in out.stats.steps if s.num_draft_nodes]
    assert drafted and all(s.num_accepted == 9 for s in drafted)


@pytest.mark.parametrize("family", FAMILIES, indirect=True)
def test_sage_tree_with_a_sparrow_head_is_lossless(family, make_case, tmp_path_factory):
    """tree=sage is a tree kind every drafter grows: Sparrow's head (no visual KV) included."""
    options = {"tree": "sage", "sparrow_head": _sparrow_head(family, tmp_path_factory)}
    for seed in (41, 47):  # 47: no video
        out = _generate(family, "sparrow", None, options, _case(family, make_case, seed), MAX_NEW_TOKENS)
        assert out.tokens == _vanilla(family, make_case, seed), (family.name, seed)
        assert max(s.num_draft_nodes for s in out.stats.steps) > 1
