"""The judge hook of the caption and open-QA tasks: this project's judges/ client, not sglang.

Why in process_results: lmms-eval's VDC, VDD and MovieChat score each sample there, and the
results table then carries the judged metric. The judge is configured as lmms-eval's judges are
(OPENAI_API_KEY, OPENAI_BASE_URL or OPENAI_API_URL, API_TYPE, MODEL_VERSION; judges/config.py).
When no judge is configured, or LVSPEC_JUDGE=off, or a judgment fails, the sample's judged score
is missing (None, with the reason), never 0: a judge that did not answer says nothing about the
caption. Missing scores can be filled in later from the samples file with `lvspec-eval judge`.

Per-sample values follow lmms-eval's convention for dicts: "score" holds the number and is left
out when the judgment is missing (lmms-eval's standard errors read every "score" as a number);
"judge_score" is the number or None and "judge_error" says why it is None.
"""
from __future__ import annotations

import os

from loguru import logger

JUDGE_SWITCH = "LVSPEC_JUDGE"  # "off": do not judge during the run
JUDGE_CACHE = "LVSPEC_JUDGE_CACHE"  # sqlite reply cache; default .cache/judge_cache.sqlite
ENDPOINT_VARS = ("OPENAI_BASE_URL", "OPENAI_API_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "AZURE_ENDPOINT",
                 "AZURE_OPENAI_ENDPOINT")

_state: dict = {}  # the process's one client, built on first use


def unavailable_reason() -> str | None:
    """Why no judge will be asked in this process, or None when one is configured."""
    if os.environ.get(JUDGE_SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return f"judging is off ({JUDGE_SWITCH}); score later with `lvspec-eval judge`"
    if not any(os.environ.get(v, "").strip() for v in ENDPOINT_VARS):
        return ("no judge configured: set OPENAI_BASE_URL (or OPENAI_API_URL) and MODEL_VERSION, or "
                "score later with `lvspec-eval judge`")
    return None


def client():
    """The judges.client.JudgeClient of this process (imported and built lazily, once)."""
    if "client" not in _state:
        from judges.cache import JudgeCache
        from judges.client import JudgeClient

        cache = JudgeCache(os.environ.get(JUDGE_CACHE, ".cache/judge_cache.sqlite"))
        _state["client"] = JudgeClient(cache=cache, progress=False)
        logger.info(f"lvspec tasks: judging with {_state['client']!r}")
    return _state["client"]


def judged(score, error: str | None, **extra) -> dict:
    """One per-sample value: "score" only when judged (see the module docstring)."""
    out = {"judge_score": score, "judge_error": None if score is not None else (error or "missing"), **extra}
    if score is not None:
        out["score"] = float(score)
    return out


def _missing(reason: str, key: str) -> dict:
    if _state.get("warned") != reason:
        logger.warning(f"lvspec tasks: judged scores are missing ({reason})")
        _state["warned"] = reason
    return {"score": None, "acc": None, "error": reason, "key": key}


def _ask(ask):
    """Run `ask()` (a judge call); a setup error (key, model, URL) disables judging for the run.

    Raising would end the run after all the generation was done and lose it; instead every later
    sample is recorded as missing with the reason, and `lvspec-eval judge` can score the logged
    samples once the judge is fixed. Returns None when the judgment is missing (see _state).
    """
    import openai

    from judges.client import JudgeSetupError

    try:
        return ask()
    except JudgeSetupError as err:
        _state["disabled"] = f"judge setup failed: {err}"
        logger.error(f"lvspec tasks: {_state['disabled']}; judging stops for this run")
    except openai.OpenAIError as err:
        _state["last_error"] = f"judge request failed: {type(err).__name__}: {err}"
    return None


def _blocked() -> str | None:
    return _state.get("disabled") or unavailable_reason()


def score_caption(mode: str, key: str, caption: str, reference: str, question: str,
                  qa: tuple[tuple[str, str], ...] = ()) -> dict:
    """judges.client.score_captions for one caption: {"score", "acc" (vdc), "error", "key"}."""
    if _blocked():
        return _missing(_blocked(), key)
    from judges.client import CaptionItem, score_captions

    item = CaptionItem(key=key, caption=caption, reference=reference, question=question, qa=qa)
    result = _ask(lambda: score_captions(client(), [item], mode)[0])
    if result is None:
        return _missing(_state.get("disabled") or _state.pop("last_error", "judge request failed"), key)
    error = "; ".join(result.get("errors") or []) or None
    return {"score": result["score"], "acc": result.get("acc"), "error": error, "key": key}


def score_answer(key: str, question: str, answer: str, predicted: str) -> dict:
    """Open-ended QA (MovieChat): does `predicted` match `answer`? {"score" 0-5, "acc" 0/1, ...}.

    The judge is asked with the VDCscore marking prompt, which is the Video-ChatGPT QA judge's
    question (yes/no plus a 0-5 score for one question, its correct and its predicted answer).
    """
    if _blocked():
        return _missing(_blocked(), key)
    from judges import prompts
    from judges.client import JudgeRequest

    request = JudgeRequest(prompts.VDC_SCORE, prompts.vdc_score_messages(question, answer, predicted))
    judgment = _ask(lambda: client().judge(request))
    if judgment is None:
        return _missing(_state.get("disabled") or _state.pop("last_error", "judge request failed"), key)
    if judgment.value is None:
        return {"score": None, "acc": None, "error": judgment.error, "key": key}
    acc = 1.0 if judgment.value["pred"] == "yes" else 0.0
    return {"score": judgment.value["score"], "acc": acc, "error": None, "key": key}
