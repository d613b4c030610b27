"""How many tokens the current answer still needs: the expected tokens of a plan are capped by it
(after the letter of a multiple-choice answer nothing is left to draft for)."""
from __future__ import annotations

import math


class AnswerLength:
    """Decayed mean answer length (tokens) per request budget (max_new_tokens, which lmms-eval sets
    per task), and the current answer's progress. Requests are told apart by budget because lmms-eval
    runs one task's requests after another's: with one mean for the run, ten one-letter answers of a
    multiple-choice task made the next task's captions undrafted."""

    def __init__(self):
        self.mean_lengths: dict[int | None, float] = {}
        self.budget: int | None = None  # the current request's max_new_tokens
        self.sample_tokens = 0  # tokens committed so far in the current answer
        self.generated = 0  # tokens the current answer had when this step was planned

    def start(self, budget: int | None) -> None:
        """A new request of `budget` tokens: fold the last answer into its budget's mean length."""
        if self.sample_tokens:
            self.mean_lengths[self.budget] = self._mean_for(self.budget)
        self.sample_tokens = 0
        self.budget = budget

    def _mean_for(self, budget: int | None) -> float | None:
        """The mean length of `budget`'s answers once the last answer is folded in (`start` folds it)."""
        mean = self.mean_lengths.get(budget)
        if self.sample_tokens and budget == self.budget:
            n = self.sample_tokens
            mean = n if mean is None else 0.8 * mean + 0.2 * n
        return mean

    def steps_may_draft(self, budget: int | None) -> bool:
        """Whether a step of the next request, of `budget` new tokens, can expect more than its own
        token to be left to commit (`left()` > 1), asked before the request starts. No: the budget
        leaves the steps one token, or answers of this budget are at most 2 tokens long (a
        multiple-choice letter and its end; `remaining()` is then at most 1 from the first step on,
        the prefill's token being the first): no step of the request drafts, so nothing only a
        draft needs is worth capturing at its prefill."""
        if budget is not None and budget <= 2:
            return False
        mean = self._mean_for(budget)
        return mean is None or max(mean - 1.0, mean / 4) > 1.0

    def committed(self, tokens: list[int], eos_token_ids: frozenset[int]) -> None:
        """This step committed `tokens`; the answer's length counts up to its end token."""
        ends = [i for i, t in enumerate(tokens) if t in eos_token_ids]
        self.sample_tokens = self.generated + (ends[0] + 1 if ends else len(tokens))

    @property
    def mean_length(self) -> float | None:
        """The mean answer length of requests with the current one's budget (None: none seen yet)."""
        return self.mean_lengths.get(self.budget)

    def remaining(self) -> float:
        """Tokens the answer is still expected to need: the mean length minus what this one has, but
        never under a quarter of the mean (an answer longer than most goes on). A one-token answer
        (multiple choice) leaves nothing to draft for: no step pays for a draft there."""
        if self.mean_length is None:
            return math.inf
        return max(self.mean_length - self.generated, self.mean_length / 4)

    def left(self) -> float:
        """The tokens still needed, within the request's budget."""
        left = self.remaining()
        return min(left, self.budget - self.generated) if self.budget else left
