"""The LLM judge client: the official openai client plus format negotiation, retries and a cache.

Why each piece:
- Any OpenAI-compatible server (OpenAI, Azure, vLLM, llama.cpp, Ollama) can judge, but they
  differ in what `response_format` they take. We try the strictest first (json_schema), fall back
  to json_object with the schema attached (llama-cpp-python's form), then plain json_object, then
  plain text, and remember per client (and in the cache, per endpoint and model) which one worked. The prompt always describes the reply format, so every mode sends the
  same messages.
- temperature 0 and a fixed seed: a judgment should be a function of its input.
- Two kinds of retry: the openai client's own (`max_retries`: connection errors, 429, 5xx), and
  parse-level re-asks when a reply does not parse or validate (the bad reply is shown back to the
  judge with the reason, so the re-ask is a different, still deterministic, request).
- A judgment that still fails is missing (value None) with its reason, never a 0: a judge that
  cannot answer says nothing about the caption. `stats.failure_rate` reports how often.
- Replies are cached on disk (cache.py) before they are parsed, so nothing is paid for twice.
- A judge that is gone is not a judge that said nothing: after `max_connection_failures`
  consecutive connection failures (refused, reset, timed out; each already retried by the openai
  client) the client stops with one JudgeUnreachableError naming the endpoint, instead of recording
  every remaining judgment as missing. What was judged before stays in the cache, so a rerun
  resumes where it stopped.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass

import openai
from tqdm import tqdm

from judges import prompts
from judges.cache import JudgeCache, request_key
from judges.config import FORMAT_MODES, KEY_VARS, JudgeConfig, api_key_from_env
from judges.facts import score_facts
from judges.prompts import Messages, PromptSpec, parse_reply
from judges.types import DEFAULT_QUESTION, CaptionItem, JudgeRequest, Judgment

# the judge's types (judges/types.py) stay importable from here, as before they had a module of their own
__all__ = ["DEFAULT_QUESTION", "MODES", "CaptionItem", "ClientStats", "JudgeClient", "JudgeRequest",
           "JudgeSetupError", "JudgeUnreachableError", "Judgment", "make_openai_client", "score_captions"]

log = logging.getLogger("judges")

# Status codes that say nothing about the response_format: wrong key, no such model, slow down.
_NOT_A_FORMAT_PROBLEM = (401, 403, 404, 429)
_FATAL = (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError)
NO_KEY = "EMPTY"  # sent to local servers that need no key (vLLM's convention); OpenAI rejects it


class JudgeSetupError(RuntimeError):
    """The judge refused us as a client (key, permission, model or URL): stop, do not record missing."""


class JudgeUnreachableError(RuntimeError):
    """The judge stopped answering (connection failures in a row): stop, do not record missing."""


@dataclass
class ClientStats:
    """Counts over a client's life; `failure_rate` is the share of judgments left missing."""

    judgments: int = 0
    missing: int = 0
    requests_sent: int = 0
    cache_hits: int = 0
    reasks: int = 0
    format_fallbacks: int = 0
    # what the requests sent cost (cached replies cost nothing): the server's usage counts, and
    # seconds from sending to the full reply
    prompt_tokens: int = 0
    completion_tokens: int = 0
    request_seconds: float = 0.0

    @property
    def failure_rate(self) -> float:
        return self.missing / self.judgments if self.judgments else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "failure_rate": self.failure_rate}


def make_openai_client(config: JudgeConfig, http_client: object | None = None) -> openai.OpenAI:
    """The openai (or AzureOpenAI) client for `config`; the key comes from the environment only."""
    key = api_key_from_env(config.api_type)
    common = {"max_retries": config.max_retries, "timeout": config.timeout_s, "http_client": http_client}
    if config.api_type == "azure":
        return openai.AzureOpenAI(
            api_key=key or NO_KEY, azure_endpoint=config.azure_endpoint, api_version=config.api_version, **common
        )
    return openai.OpenAI(api_key=key or NO_KEY, base_url=config.base_url, **common)


class JudgeClient:
    """Asks an OpenAI-compatible judge; thread-safe, so `judge_many` can run requests in parallel."""

    def __init__(
        self,
        config: JudgeConfig | None = None,
        *,
        cache: JudgeCache | None = None,
        http_client: object | None = None,
        progress: bool = True,
        **overrides: object,
    ) -> None:
        base = config if config is not None else JudgeConfig.from_env()
        self.config = base.with_overrides(**overrides)
        self.cache = cache
        self.progress = progress
        self._openai = make_openai_client(self.config, http_client)
        self.endpoint = str(self._openai.base_url).rstrip("/")
        self.stats = ClientStats()
        self._stats_lock = threading.Lock()
        self._format_lock = threading.Lock()
        self.format_mode, self._format_known = self._initial_format()
        self._failures_in_a_row = 0
        self._unreachable: str | None = None  # set once: every later judgment stops with it

    def __repr__(self) -> str:  # no key here, by construction
        return f"JudgeClient(model={self.config.model!r}, endpoint={self.endpoint!r}, format={self.format_mode!r})"

    def _initial_format(self) -> tuple[str, bool]:
        if self.config.response_format != "auto":
            return self.config.response_format, True
        remembered = self.cache.get_format(self.endpoint, self.config.model) if self.cache else None
        if remembered in FORMAT_MODES:
            return remembered, True
        return FORMAT_MODES[0], False

    def describe(self) -> dict:
        """What a report records about this judge (settings, negotiated format, counts; no key)."""
        return {"endpoint": self.endpoint, "format_mode": self.format_mode, **self.config.describe(),
                "stats": self.stats.as_dict()}

    def _count(self, **increments: float) -> None:
        with self._stats_lock:
            for name, inc in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + inc)

    # ------------------------------------------------------------------------------------------
    # One judgment

    def judge(self, request: JudgeRequest) -> Judgment:
        """Ask, parse, re-ask up to `parse_retries` times; a failure comes back as missing."""
        messages, raw, error, all_cached = list(request.messages), None, "", True
        for attempt in range(self.config.parse_retries + 1):
            try:
                raw, cached = self._ask(request.spec, messages)
            except _FATAL as err:  # wrong key, model or URL: every other request would fail the same way
                raise JudgeSetupError(_setup_message(err, self.endpoint, self.config.api_type)) from None
            except openai.APIConnectionError as err:  # refused, reset or timed out (APITimeoutError)
                self._connection_failed(err)
                error = f"request failed: {type(err).__name__}: {err}"
                break
            except openai.APIError as err:
                self._answered()
                error = f"request failed: {type(err).__name__}: {err}"
                break
            if not cached:  # only an answer from the server says it is there
                self._answered()
            all_cached &= cached
            try:
                value = parse_reply(request.spec, raw)
            except ValueError as err:
                error = f"unparsable reply: {err}"
                messages = messages + _reask(request.spec, raw, str(err))
                self._count(reasks=int(attempt < self.config.parse_retries))
                continue
            self._count(judgments=1)
            return Judgment(value, raw, None, attempt + 1, all_cached)
        self._count(judgments=1, missing=1)
        log.warning("judge %s: missing judgment (%s)", request.spec.key, error)
        return Judgment(None, raw, error, attempt + 1, all_cached)

    def judge_many(self, requests: list[JudgeRequest], desc: str = "judging") -> list[Judgment]:
        """All `requests`, `max_concurrency` at a time, in input order, with a progress bar.

        A JudgeSetupError or JudgeUnreachableError from any request cancels the queued ones and
        is raised here (once): the judgments made so far are already in the cache.
        """
        results: list[Judgment | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), desc=desc, disable=not self.progress)
        pool = ThreadPoolExecutor(max_workers=self.config.max_concurrency)
        try:
            futures = {pool.submit(self.judge, r): i for i, r in enumerate(requests)}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                bar.update(1)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            bar.close()
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------------------------------
    # Is the judge still there?

    def _answered(self) -> None:
        with self._stats_lock:
            self._failures_in_a_row = 0

    def _connection_failed(self, err: openai.APIConnectionError) -> None:
        """Count a connection failure; the `max_connection_failures`-th in a row stops the client."""
        with self._stats_lock:
            self._failures_in_a_row += 1
            if self._unreachable is None and self._failures_in_a_row >= self.config.max_connection_failures:
                cached = f"; the judgments made so far are in the cache ({self.cache.path}): a rerun resumes" \
                    if self.cache is not None else ""
                self._unreachable = (
                    f"judge at {self.endpoint} did not answer {self._failures_in_a_row} requests in a row "
                    f"(last: {type(err).__name__}: {err}); stopped after "
                    f"{_judgments(self.stats.judgments - self.stats.missing)}{cached}")
            message = self._unreachable
        if message is not None:
            raise JudgeUnreachableError(message)

    def _check_reachable(self) -> None:
        if self._unreachable is not None:
            raise JudgeUnreachableError(self._unreachable)

    # ------------------------------------------------------------------------------------------
    # Transport

    def _params(self, spec: PromptSpec) -> dict:
        c = self.config
        return {"temperature": c.temperature, "seed": c.seed, "max_tokens": spec.max_tokens or c.max_tokens}

    def _ask(self, spec: PromptSpec, messages: Messages) -> tuple[str, bool]:
        """The raw reply from the cache, or from the server (then cached at once)."""
        params = self._params(spec)
        key = request_key(self.config.model, spec.key, messages, params)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self._count(cache_hits=1)
                return hit, True
        self._check_reachable()  # queued requests after the judge was given up on send nothing
        raw = self._send(spec, messages, params)
        if self.cache is not None:
            request = {"model": self.config.model, "prompt": spec.key, "messages": messages, "params": params}
            self.cache.put(key, self.config.model, spec.key, request, raw)
        return raw, False

    def _send(self, spec: PromptSpec, messages: Messages, params: dict) -> str:
        if spec.plain:  # a one-word reply needs no format, and must not be forced into JSON
            return self._create("text", spec, messages, params)
        if not self._format_known:
            with self._format_lock:  # one thread negotiates; the others wait for its answer
                if not self._format_known:
                    return self._negotiate(spec, messages, params)
        return self._create(self.format_mode, spec, messages, params)

    def _negotiate(self, spec: PromptSpec, messages: Messages, params: dict) -> str:
        """Send in the best format the server accepts, and remember it."""
        modes = FORMAT_MODES[FORMAT_MODES.index(self.format_mode):]
        for mode in modes[:-1]:
            try:
                return self._settle(mode, self._create(mode, spec, messages, params))
            except openai.APIStatusError as err:
                if err.status_code in _NOT_A_FORMAT_PROBLEM:
                    raise
                log.info("judge at %s rejected response_format %s (HTTP %s); trying the next",
                         self.endpoint, mode, err.status_code)
                self._count(format_fallbacks=1)
        return self._settle(modes[-1], self._create(modes[-1], spec, messages, params))

    def _settle(self, mode: str, raw: str) -> str:
        self.format_mode, self._format_known = mode, True
        if self.cache is not None:
            self.cache.put_format(self.endpoint, self.config.model, mode)
        return raw

    def _create(self, mode: str, spec: PromptSpec, messages: Messages, params: dict) -> str:
        kwargs: dict = {"model": self.config.model, "messages": messages, **params}
        if mode == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": spec.name.replace("-", "_"), "schema": spec.schema, "strict": True},
            }
        elif mode == "json_object_schema":
            kwargs["response_format"] = {"type": "json_object", "schema": spec.schema}
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        self._count(requests_sent=1)
        start = time.perf_counter()
        completion = self._openai.chat.completions.create(**kwargs)
        usage = getattr(completion, "usage", None)
        self._count(request_seconds=time.perf_counter() - start,
                    prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                    completion_tokens=getattr(usage, "completion_tokens", 0) or 0)
        if not completion.choices:
            return ""
        return completion.choices[0].message.content or ""


def _judgments(n: int) -> str:
    return f"{n} judgment" if n == 1 else f"{n} judgments"


def _setup_message(err: openai.APIStatusError, endpoint: str, api_type: str) -> str:
    """A message about a refused request that cannot leak the key.

    A 401 message from OpenAI quotes part of the key, so it is dropped; other messages (model not
    found, no permission) are kept with any exact copy of the key removed.
    """
    hint = f"check the key variable ({' or '.join(KEY_VARS[api_type])}), MODEL_VERSION and the base URL"
    if err.status_code == 401:
        return f"judge at {endpoint}: HTTP 401, authentication failed; {hint}"
    detail = str(err.message)
    key = api_key_from_env(api_type)
    if key:
        detail = detail.replace(key, "[redacted]")
    return f"judge at {endpoint}: HTTP {err.status_code}: {detail}; {hint}"


def _reask(spec: PromptSpec, raw: str, reason: str) -> Messages:
    """Show the judge its unreadable reply and ask again (deterministic: fixed words)."""
    what = f"one word: {spec.example}" if spec.plain else f"only the JSON object, of the form {spec.example}"
    return [
        {"role": "assistant", "content": raw},
        {"role": "user", "content": f"That reply could not be read ({reason}). Reply again with {what}."},
    ]


# ----------------------------------------------------------------------------------------------
# Caption scoring: the three judge modes, each turning captions into one 0-5 score per caption.

MODES = ("detail", "vcgpt", "vdc", "facts")
def score_captions(client: JudgeClient, items: list[CaptionItem], mode: str, caption_facts: str = "judge") -> list[dict]:
    """One result per item: {key, mode, score (0-5 or None), parts, errors}.

    `score` is None when any part is missing, so a caption is never scored on part of its
    criteria; the parts show what did come back. `caption_facts` (mode facts only): how captions
    are split into facts, see judges/facts.py.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; allowed: {', '.join(MODES)}")
    if mode == "facts":
        return score_facts(client, items, caption_facts)
    scorer = {"detail": _score_detail, "vcgpt": _score_vcgpt, "vdc": _score_vdc}[mode]
    return scorer(client, items)


def _result(item: CaptionItem, mode: str, parts: dict, errors: list[str], extra: dict | None = None) -> dict:
    scores = list(parts.values())
    score = sum(scores) / len(scores) if scores and None not in scores else None
    return {"key": item.key, "mode": mode, "score": score, "parts": parts, "errors": errors, **(extra or {})}


def _score_detail(client: JudgeClient, items: list[CaptionItem]) -> list[dict]:
    requests = [JudgeRequest(prompts.DETAIL, prompts.detail_messages(i.question, i.reference, i.caption))
                for i in items]
    judged = client.judge_many(requests, desc="judge detail")
    return [_result(i, "detail", {"detail": _field(j, "score")}, _errors(j)) for i, j in zip(items, judged)]


def _score_vcgpt(client: JudgeClient, items: list[CaptionItem]) -> list[dict]:
    # criterion-major: consecutive requests share the criterion's system prompt and, for captions of
    # one reference, the reference too, a prefix a local server (llama.cpp) evaluates only once
    criteria = list(prompts.VCGPT_CRITERIA)
    requests = [JudgeRequest(prompts.VCGPT[c], prompts.vcgpt_messages(c, i.question, i.reference, i.caption))
                for c in criteria for i in items]
    judged = client.judge_many(requests, desc="judge vcgpt")
    out = []
    for n, item in enumerate(items):
        mine = judged[n::len(items)]
        parts = {c: _field(j, "score") for c, j in zip(criteria, mine)}
        out.append(_result(item, "vcgpt", parts, _errors(*mine)))
    return out


def _score_vdc(client: JudgeClient, items: list[CaptionItem]) -> list[dict]:
    """VDCscore: answer each reference question from the caption, then mark each answer."""
    for item in items:
        if not item.qa:
            raise ValueError(f"item {item.key!r}: mode 'vdc' needs reference question-answer pairs (qa)")
    pairs = [(i, q, a) for i in items for q, a in i.qa]
    answers = client.judge_many(
        [JudgeRequest(prompts.VDC_ANSWER, prompts.vdc_answer_messages(i.caption, q)) for i, q, _ in pairs],
        desc="judge vdc answers")
    answered = [k for k, a in enumerate(answers) if a.value is not None]  # mark only what was answered
    marked = client.judge_many(
        [JudgeRequest(prompts.VDC_SCORE, prompts.vdc_score_messages(pairs[k][1], pairs[k][2],
                                                                    str(_field(answers[k], "answer"))))
         for k in answered],
        desc="judge vdc marks")
    marks: list[Judgment | None] = [None] * len(pairs)
    for k, judgment in zip(answered, marked):
        marks[k] = judgment
    out, n = [], 0
    for item in items:
        span = range(n, n + len(item.qa))
        n += len(item.qa)
        out.append(_vdc_result(item, [answers[k] for k in span], [marks[k] for k in span]))
    return out


def _vdc_result(item: CaptionItem, answers: list[Judgment], marks: list[Judgment | None]) -> dict:
    parts = {f"q{k}": (_field(m, "score") if m else None) for k, m in enumerate(marks)}
    yes = [_field(m, "pred") == "yes" for m in marks if m and m.value]
    acc = sum(yes) / len(yes) if len(yes) == len(marks) else None
    detail = [{"question": q, "reference": r, "answer": _field(a, "answer"), "pred": _field(m, "pred") if m else None}
              for (q, r), a, m in zip(item.qa, answers, marks)]
    errors = _errors(*answers, *[m for m in marks if m])
    return _result(item, "vdc", parts, errors, {"acc": acc, "answers": detail})


def _field(judgment: Judgment, name: str) -> object:
    return None if judgment.value is None else judgment.value.get(name)


def _errors(*judgments: Judgment) -> list[str]:
    return [j.error for j in judgments if j.error]
