"""Cost-aware adaptive drafting (`tree=adaptive`): choose each step's draft from what the run measures.

Speculation pays when the tokens a step commits outweigh what the step costs against plain
decoding. Both sides depend on the pair and the hardware: on a CPU a 17-node verification costs
2-2.5x a one-token step, on a GPU about the same as one token; a 0.5B draft costs a third of a
1.5B target, the demo's draft an eighth. So the policy measures, per run and on the device in use,
and decides from that. Its parts, one job each (each module says how it works):

- fits.py         the cost model: the plain step, verify(t) as measured per token count (read along
                  log t between counts), draft(L, F) = r + c L + e F, and how far plans may grow past
                  what was measured (GROWTH);
- acceptance.py   the acceptance model: per width the chance c_w of going one level deeper, the
                  realised-over-model correction k, the calibration f(q) of the draft's probabilities;
- search.py       the plan search: the (depth, width) of the highest expected rate, the nodes to verify;
- schedule.py     when to measure a plain step, when to probe where nothing pays, when to explore;
- regime.py       whether the machine changed (surprises) and whether drafting really pays (realised rate);
- answer.py       how many tokens the answer still needs (a multiple-choice letter: none);
- preparation.py  whether preparing a request's draft (draft_prepare=lazy) is repaid;
- adaptive.py     AdaptivePolicy, which composes them and is what the drafters call;
- gate.py         DraftGate: the same decision of whether to draft, from the same parts, for a drafter
                  whose tree shape is its own (SAGE's, StD's chain; `draft_when=pays`).

Each step: the plan (depth D, width w) with the highest expected rate
    rate(D, w) = (1 + k sum_{d=1..D} c_w^d) / (draft(D - 1, w (D - 1)) + verify(1 + w D)),
or no draft at all when plain decoding, rate 1 / step, is faster (expected tokens capped by what the
answer still needs); after growing the tree it keeps the nodes whose calibrated path values pay for
their verification. Guards keep it from losing where its model is wrong: plans grow step by step
from measured costs, a changed machine is detected and re-measured, and a realised rate below plain
decoding backs it off. Anchors: transformers' assisted generation (a draft length that grows and
shrinks), SpecDec++ (stop where the predicted rejection probability is high), EAGLE-2
(confidence-ranked dynamic trees).
"""
from ..tree import Shape, dynamic_shape  # names callers have used as the policy's (tests/test_lossless.py)
from .acceptance import NUM_BINS, AcceptanceModel, Calibration, Rate, model_accepted
from .adaptive import AdaptivePolicy
from .answer import AnswerLength
from .fits import GROWTH, CostModel, CostTable, OnlineLinear
from .gate import DraftGate
from .preparation import CHEAP_SHARE, PREPARE_PROBE, RECENT, Preparation
from .regime import RECENT_STEPS, SURPRISE, SURPRISES, Regime
from .schedule import EXPLORE_EVERY, PLAIN_SPACING, REFRESH_EVERY, Schedule
from .search import best_plan, choose_total, neighbour

__all__ = ["CHEAP_SHARE", "EXPLORE_EVERY", "GROWTH", "NUM_BINS", "PLAIN_SPACING", "PREPARE_PROBE", "RECENT", "RECENT_STEPS",
           "REFRESH_EVERY", "SURPRISE", "SURPRISES", "AcceptanceModel", "AdaptivePolicy", "AnswerLength",
           "Calibration", "CostModel", "CostTable", "DraftGate", "OnlineLinear", "Preparation", "Rate", "Regime", "Schedule",
           "Shape", "best_plan", "choose_total", "dynamic_shape", "model_accepted", "neighbour"]
