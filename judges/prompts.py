"""Judge prompts: pure functions from texts to chat messages, each with a version and a reply schema.

Why fixed and versioned: a decoding method and its vanilla baseline must be judged by the same
words, or a score difference could come from the prompt. Every prompt's text is constant apart
from the slots it fills, and its `version` is part of the judge cache key, so editing a prompt
means bumping its version (old cached judgments then no longer match).

The reply format is always described in the prompt itself, whatever the server supports, so the
messages (and with them the cache key) do not depend on which response_format the server took.

Prompts follow the published judges in spirit (our own wording):
- `detail`: VideoDetailCaption / Video Detail Description's detail-orientation score, 0-5.
- `vcgpt-*`: Video-ChatGPT's five criteria, one request each, 0-5 each.
- `vdc-answer` + `vdc-score`: VDCscore. The judge answers each reference question from the
  caption alone, then marks the answer against the reference answer: yes/no plus 0-5.
- `facts-split` + `fact-check`: fact-level fidelity (judges/facts.py; after DREAM-1K's AutoDQ and
  FactScore): a description is split into atomic facts, and each fact is checked against the other
  description with a one-word yes/no question, the form a small judge answers best.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

Messages = list[dict[str, str]]

SCORE_0_5 = {"type": "integer", "enum": [0, 1, 2, 3, 4, 5]}


def _object_schema(properties: dict) -> dict:
    # additionalProperties false + every key required: what strict json_schema mode demands.
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


@dataclass(frozen=True)
class PromptSpec:
    """Identity of a prompt: its name, version (bump on any wording change) and reply schema."""

    name: str
    version: str
    schema: dict
    example: str  # the reply format as shown to the judge
    # A bare word reply (yes/no), asked in plain text whatever format the server negotiated: one
    # generated token is the whole answer, where a JSON object costs about six.
    plain: bool = False
    max_tokens: int | None = None  # None: the client's max_tokens

    @property
    def key(self) -> str:
        return f"{self.name}/{self.version}"


# Examples show the form with placeholders, never a concrete score: weak judges copy a number
# given as an example (SmolLM2-135M answered {"score": 4}, the old example, to every caption).
SCORE_EXAMPLE = '{"score": <integer from 0 to 5>}'
DETAIL = PromptSpec("detail", "v3", _object_schema({"score": SCORE_0_5}), SCORE_EXAMPLE)
VDC_ANSWER = PromptSpec("vdc-answer", "v3", _object_schema({"answer": {"type": "string"}}),
                        '{"answer": "<a short phrase>"}')
VDC_SCORE = PromptSpec(
    "vdc-score", "v3",
    _object_schema({"pred": {"type": "string", "enum": ["yes", "no"]}, "score": SCORE_0_5}),
    '{"pred": <"yes" or "no">, "score": <integer from 0 to 5>}',
)

FACTS_SPLIT = PromptSpec(
    "facts-split", "v1",
    _object_schema({"facts": {"type": "array", "items": {"type": "string"}}}),
    '{"facts": ["<one short fact>", "<another fact>", ...]}', max_tokens=400,
)
FACT_CHECK = PromptSpec("fact-check", "v1", _object_schema({"answer": {"type": "string", "enum": ["yes", "no"]}}),
                        "yes or no", plain=True, max_tokens=1)

# Video-ChatGPT criterion -> what the judge is told to look at.
VCGPT_CRITERIA = {
    "correctness": "Correctness of information: is every statement in the prediction true according to "
    "the reference? Check each object's colour, shape, size and motion, the number of objects and the "
    "setting: every one that differs from the reference is an error.",
    "detail": "Detail orientation: does the prediction cover all the main points of the reference, "
    "with specific details rather than generic ones?",
    "context": "Contextual understanding: does the prediction fit the overall context of the video as "
    "the reference describes it, without irrelevant or out-of-place content?",
    "temporal": "Temporal understanding: does the prediction describe the events in the same order and "
    "with the same timing as the reference?",
    "consistency": "Consistency: is the prediction consistent with itself and with the reference, never "
    "stating two facts that contradict each other or the reference?",
}
VCGPT = {c: PromptSpec(f"vcgpt-{c}", "v3", _object_schema({"score": SCORE_0_5}), SCORE_EXAMPLE) for c in VCGPT_CRITERIA}

_EVALUATOR = (
    "You are a careful evaluator of video descriptions. You never see the video: you compare a "
    "predicted description with a reference description written by a person who watched it."
)
# The rubric: compare fact by fact (the facts a video description states: objects and their number,
# colour, shape, size, motion, the setting, the order of events) and score by the count of errors.
_FACTS = (
    "Compare the two fact by fact: the number of objects, the setting or background, the order in "
    "which things happen, and for every object its colour, shape, size and motion (what it does, "
    "which way it moves). A fact said in other words (a synonym, another word order) matches; a fact "
    "with another value (another colour, shape, size or motion) is wrong, however small the word."
)
_ERROR_SCALE = (
    "Score by the facts that are wrong or left out: none: 5; one: 4; two: 3; three: 2; four or more: 1; "
    "0 if it describes a different video. A prediction saying the same as the reference scores 5."
)


def _reply_instruction(spec: PromptSpec) -> str:
    schema = json.dumps(spec.schema, sort_keys=True)
    return (
        f"Reply with only a JSON object of the form {spec.example}, following this JSON schema: "
        f"{schema}. Do not write anything else."
    )


def detail_messages(question: str, reference: str, caption: str) -> Messages:
    """Detail orientation of `caption` against `reference`, 0-5 (VideoDetailCaption / VDD)."""
    system = (
        f"{_EVALUATOR} Judge the detail orientation of the prediction: does it give every detail of the "
        f"reference, each one right?\n{_FACTS}\n{_ERROR_SCALE}\n{_reply_instruction(DETAIL)}"
    )
    user = f"Question: {question}\nReference answer: {reference}\nPredicted answer: {caption}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def vcgpt_messages(criterion: str, question: str, reference: str, caption: str) -> Messages:
    """One of Video-ChatGPT's five criteria for `caption` against `reference`, 0-5."""
    if criterion not in VCGPT_CRITERIA:
        raise ValueError(f"criterion={criterion!r}; allowed: {', '.join(VCGPT_CRITERIA)}")
    system = (
        f"{_EVALUATOR} Judge one criterion only.\n{VCGPT_CRITERIA[criterion]}\n{_FACTS}\n"
        f"Count only the wrong or left-out facts that bear on this criterion. {_ERROR_SCALE}\n"
        f"{_reply_instruction(VCGPT[criterion])}"
    )
    user = f"Question: {question}\nReference answer: {reference}\nPredicted answer: {caption}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def vdc_answer_messages(caption: str, question: str) -> Messages:
    """VDCscore stage 1: answer a reference question from the caption alone."""
    system = (
        "You answer questions about a video using only a written description of it. Answer from the "
        "description alone; if it does not say, answer that it is not mentioned. Keep answers to a "
        f"short phrase.\n{_reply_instruction(VDC_ANSWER)}"
    )
    user = f"Description: {caption}\nQuestion: {question}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def vdc_score_messages(question: str, answer: str, predicted: str) -> Messages:
    """VDCscore stage 2: does the predicted answer match the reference answer? yes/no and 0-5."""
    system = (
        "You check answers to questions about a video. Compare the predicted answer with the correct "
        "answer: synonyms and paraphrases match; a different fact or 'not mentioned' does not. Say "
        "'yes' if they match and 'no' otherwise, and give an integer score from 0 (no match) to 5 "
        f"(exact match in meaning).\n{_reply_instruction(VDC_SCORE)}"
    )
    user = f"Question: {question}\nCorrect answer: {answer}\nPredicted answer: {predicted}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# Fact splitting: what an atomic fact is, with the demo world's kind of example (any video works).
_SPLIT = (
    "You split a description of a video into atomic facts. An atomic fact is one short sentence that "
    "states one thing only: how many objects there are; the setting or background; one attribute of "
    "one object (its colour, shape, size, or what it does and which way it moves); or the order in "
    "which two things happen. Name the object in every fact so that the fact stands alone, as in "
    "'The first object is a circle.', 'The first object is red.', 'The red circle moves to the left.', "
    "'The blue square appears after the red circle.'. List every fact the description states, each "
    "once, and add none."
)
_CHECK = (
    "You check one statement about a video against a description of that video. Answer yes if the "
    "description states the statement or says the same in other words. Answer no if the description "
    "says something different (another colour, shape, size, motion, number or order) or does not say "
    "it. Objects are counted in the order the description mentions them: the first object is the one "
    "it mentions first (\"First, a ...\", \"At the start, a ...\"), the second the one it mentions next "
    "(\"Then a ...\", \"Next, a ...\"), and so on. Does the description support the statement? Answer "
    "with one word: yes or no."
)


def facts_split_messages(text: str) -> Messages:
    """Split a description (a reference or a prediction) into atomic facts."""
    system = f"{_SPLIT}\n{_reply_instruction(FACTS_SPLIT)}"
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Description: {text}"}]


def fact_check_messages(text: str, fact: str) -> Messages:
    """Does `text` support `fact`? yes/no. The description comes before the statement, so the
    questions about one description share everything up to the statement (llama.cpp evaluates that
    prefix once)."""
    # the question and the reply instruction are in the system prompt: each question adds only its
    # statement (a dozen tokens) to the shared prefix
    user = f"Description: {text}\nStatement: {fact}"
    return [{"role": "system", "content": _CHECK}, {"role": "user", "content": user}]


def all_specs() -> dict[str, PromptSpec]:
    """Every prompt by name, for reports (which versions judged a run)."""
    specs = [DETAIL, VDC_ANSWER, VDC_SCORE, *VCGPT.values(), FACTS_SPLIT, FACT_CHECK]
    return {s.name: s for s in specs}


# ----------------------------------------------------------------------------------------------
# Reading replies. Weak or older judges wrap JSON in prose or code fences, use Python-dict quotes
# ({'score': 4}, as lmms-eval's own prompts ask for) or give numbers as strings; all of that is
# accepted. Anything else is a parse failure, which the caller records as missing, never as 0.


def extract_json(text: str) -> object | None:
    """The reply as JSON, else the first {...} in it that parses (JSON or a Python literal)."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    start = text.find("{")
    while start != -1:
        end = text.find("}", start)
        while end != -1:  # shortest candidate first: the first complete object wins
            found = _loads_lenient(text[start : end + 1])
            if found is not None:
                return found
            end = text.find("}", end + 1)
        start = text.find("{", start + 1)
    return None


def _loads_lenient(candidate: str) -> dict | None:
    try:
        value = json.loads(candidate)
    except json.JSONDecodeError:
        try:
            value = ast.literal_eval(candidate)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return value if isinstance(value, dict) else None


def coerce(schema: dict, value: object, where: str = "reply") -> object:
    """`value` checked against our (small) schema subset and normalised; ValueError if it fails."""
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            raise ValueError(f"{where}: missing key(s) {missing}")
        return {k: coerce(sub, value[k], f"{where}.{k}") for k, sub in schema["properties"].items() if k in value}
    if kind == "array":
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        return [coerce(schema["items"], v, f"{where}[{n}]") for n, v in enumerate(value)]
    if kind == "integer":
        number = _as_integer(value, where)
        if "enum" in schema and number not in schema["enum"]:
            raise ValueError(f"{where}: {number} not in {schema['enum']}")
        return number
    if kind == "string":
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {type(value).__name__}")
        text = value.strip()
        if "enum" in schema:
            text = text.lower()
            if text not in schema["enum"]:
                raise ValueError(f"{where}: {value!r} not in {schema['enum']}")
        return text
    raise ValueError(f"schema type {kind!r} is not supported; use object, array, integer or string")


def _as_integer(value: object, where: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise ValueError(f"{where}: expected an integer, got {value!r}")


_YES_NO = {"yes": "yes", "no": "no", "true": "yes", "false": "no"}


def parse_yes_no(text: str) -> str:
    """'yes' or 'no' from a one-word reply ("Yes", " no.", "**Yes**", '{"answer": "no"}'); ValueError else."""
    found = extract_json(text)
    if isinstance(found, dict) and len(found) == 1:
        text = str(next(iter(found.values())))
    words = re.findall(r"[a-z]+", text.lower())
    if not words or words[0] not in _YES_NO:
        raise ValueError(f"expected yes or no, got {text.strip()[:40]!r}")
    return _YES_NO[words[0]]


def parse_reply(spec: PromptSpec, text: str) -> dict:
    """The validated reply of prompt `spec`; ValueError saying why it does not parse."""
    if spec.plain:
        return {"answer": parse_yes_no(text)}
    found = extract_json(text)
    if found is None:
        raise ValueError(f"{spec.key}: no JSON object in the reply")
    return coerce(spec.schema, found, spec.name)  # type: ignore[return-value]
