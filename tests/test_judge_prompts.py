"""Judge prompts are pure and versioned; replies are read leniently but validated strictly."""
from __future__ import annotations

import pytest

from judges import prompts


def test_prompts_are_pure_functions_of_their_inputs():
    a = prompts.detail_messages("Q?", "ref", "cap")
    assert a == prompts.detail_messages("Q?", "ref", "cap")
    assert a != prompts.detail_messages("Q?", "ref", "other cap")
    assert [m["role"] for m in a] == ["system", "user"]
    assert "Predicted answer: cap" in a[1]["content"] and "Reference answer: ref" in a[1]["content"]


def test_every_prompt_has_a_version_and_describes_its_reply_schema():
    specs = prompts.all_specs()
    assert set(specs) >= {"detail", "vdc-answer", "vdc-score"} | {f"vcgpt-{c}" for c in prompts.VCGPT_CRITERIA}
    assert all(s.version and s.key == f"{s.name}/{s.version}" for s in specs.values())
    system = prompts.vdc_score_messages("Q", "A", "P")[0]["content"]
    assert '"pred"' in system and '"enum": ["yes", "no"]' in system


@pytest.mark.parametrize("messages", [
    prompts.detail_messages("Q?", "ref", "CAPTION"),
    prompts.vcgpt_messages("temporal", "Q?", "ref", "CAPTION"),
    prompts.vdc_answer_messages("CAPTION", "Q?"),
])
def test_requests_share_a_prefix_and_end_with_what_varies(messages):
    # the reply instruction is in the system prompt and the varying text comes last, so a local
    # server evaluates the common prefix of consecutive requests once (llama.cpp's prefix match)
    assert "Reply with only a JSON object" in messages[0]["content"]
    assert "Reply with only" not in messages[-1]["content"]
    assert messages[-1]["content"].endswith(("CAPTION", "Q?"))


def test_the_rubric_names_the_facts_and_scores_by_errors():
    system = prompts.detail_messages("Q", "R", "C")[0]["content"]
    for word in ("colour", "shape", "motion", "number of objects"):
        assert word in system
    assert "none: 5; one: 4" in system


def test_vcgpt_has_five_criteria_each_in_its_own_prompt():
    assert list(prompts.VCGPT_CRITERIA) == ["correctness", "detail", "context", "temporal", "consistency"]
    systems = {c: prompts.vcgpt_messages(c, "Q", "R", "C")[0]["content"] for c in prompts.VCGPT_CRITERIA}
    assert len(set(systems.values())) == 5
    with pytest.raises(ValueError, match=r"criterion='speed'.*correctness"):
        prompts.vcgpt_messages("speed", "Q", "R", "C")


@pytest.mark.parametrize("text, expected", [
    ('{"score": 4}', {"score": 4}),
    ("{'score': 4}", {"score": 4}),  # the Python-dict style lmms-eval's prompts ask for
    ('Sure. ```json\n{"score": "3"}\n``` Done.', {"score": 3}),
    ('{"score": 5.0, "reason": "fine"}', {"score": 5}),
    ('text {not json} then {"score": 2}', {"score": 2}),
])
def test_detail_replies_that_parse(text, expected):
    assert prompts.parse_reply(prompts.DETAIL, text) == expected


@pytest.mark.parametrize("text, reason", [
    ("It deserves a four.", "no JSON object"),
    ('{"score": 4.5}', "expected an integer"),
    ('{"score": 6}', "not in"),
    ('{"score": true}', "boolean"),
    ('{"grade": 4}', "missing key"),
])
def test_detail_replies_that_do_not(text, reason):
    with pytest.raises(ValueError, match=reason):
        prompts.parse_reply(prompts.DETAIL, text)


def test_vdc_score_reply_normalises_yes_no():
    assert prompts.parse_reply(prompts.VDC_SCORE, '{"pred": " Yes", "score": 4}') == {"pred": "yes", "score": 4}
    with pytest.raises(ValueError, match="not in"):
        prompts.parse_reply(prompts.VDC_SCORE, '{"pred": "maybe", "score": 4}')
