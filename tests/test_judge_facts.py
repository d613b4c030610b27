"""Judge mode `facts` on recorded replies: fact splitting, yes/no parsing, F1 and its 0-5 scale,
request shapes (one-token yes/no, prefix-sharing order), reuse, cache and resume."""
from __future__ import annotations

import json
import re

import pytest
from test_judge_unit import FakeJudge, make_client

from judges import facts, oracle, prompts, validate
from judges.cache import JudgeCache
from judges.client import CaptionItem, score_captions
from lvspec_eval.demo import world

REFERENCE = "Two objects on a gray background. First a small red circle moves left. Then a big blue square falls."
WRONG_COLOUR = "Two objects on a gray background. First a small green circle moves left. Then a big blue square falls."
SPLITS = {
    REFERENCE: ["There are two objects.", "The background is gray.", "The circle is red.", "The circle is small.",
                "The circle moves left.", "The square is blue.", "The square is big.", "The square moves down."],
    WRONG_COLOUR: ["There are two objects.", "The background is gray.", "The circle is green.", "The circle is small.",
                   "The circle moves left.", "The square is blue.", "The square is big.", "The square moves down."],
}
# the words a statement must find in the description to be supported (a rule that is right here)
CONTENT = {"two", "gray", "red", "green", "blue", "circle", "square", "small", "big", "left"}


def rule_reply(splits: dict[str, list[str]] = SPLITS, junk_for: str | None = None):
    """A judge that splits from `splits` and answers a check by the content words of the statement."""
    def reply(body: dict) -> str:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("You split"):
            return json.dumps({"facts": splits[user.removeprefix("Description: ")]})
        match = re.match(r"Description: (.*)\nStatement: (.*)$", user, re.S)
        if match is None:  # a re-ask
            return "Perhaps"
        text, statement = match.groups()
        if statement == junk_for:
            return "Perhaps"
        words = set(re.findall(r"[a-z]+", text.lower())) | ({"down"} if "falls" in text else set())
        needed = [w for w in re.findall(r"[a-z]+", statement.lower()) if w in CONTENT | {"down"}]
        return "Yes" if all(w in words for w in needed) else "No"
    return reply


def checks(fake: FakeJudge) -> list[dict]:
    return [b for b in fake.bodies if b["messages"][0]["content"].startswith("You check")]


def splits_sent(fake: FakeJudge) -> list[str]:
    return [b["messages"][-1]["content"] for b in fake.bodies if b["messages"][0]["content"].startswith("You split")]


# ---------------------------------------------------------------------------------------------
# Pure pieces


def test_fact_f1_and_the_0_5_scale_known_values():
    got = facts.fact_f1([True, True, False, True], [True, False])
    assert got == {"recall": 0.75, "precision": 0.5, "f1": pytest.approx(0.6)}
    assert facts.fact_f1([True] * 3, [True] * 5)["f1"] == 1.0
    assert facts.fact_f1([False, False], [True])["f1"] == 0.0  # nothing of the reference: 0
    assert facts.fact_f1([True], [])["precision"] == 0.0  # a caption that states nothing checkable
    assert facts.fact_f1([], [])["f1"] == 0.0
    assert facts.f1_to_scale(1.0) == 5.0 and facts.f1_to_scale(0.6) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="f1=1.2"):
        facts.f1_to_scale(1.2)


@pytest.mark.parametrize("reply, answer", [
    ("Yes", "yes"), ("no", "no"), (" No.", "no"), ("**Yes**", "yes"), ("yes, it does", "yes"),
    ('{"answer": "No"}', "no"), ("True", "yes"),
])
def test_yes_no_replies_are_read_leniently(reply, answer):
    assert prompts.parse_reply(prompts.FACT_CHECK, reply) == {"answer": answer}


@pytest.mark.parametrize("reply", ["", "Perhaps", "The statement", "Yesterday"])
def test_a_reply_that_is_not_yes_or_no_does_not_parse(reply):
    with pytest.raises(ValueError, match="expected yes or no"):
        prompts.parse_reply(prompts.FACT_CHECK, reply)


def test_a_recorded_split_reply_parses_into_a_list_of_facts():
    raw = 'Here you go:\n```json\n{"facts": ["There are two objects.", "The circle is red."]}\n```'
    assert prompts.parse_reply(prompts.FACTS_SPLIT, raw) == {"facts": ["There are two objects.", "The circle is red."]}
    with pytest.raises(ValueError, match="expected a list"):
        prompts.parse_reply(prompts.FACTS_SPLIT, '{"facts": "The circle is red."}')
    with pytest.raises(ValueError, match=r"facts-split\.facts\[1\]: expected a string"):
        prompts.parse_reply(prompts.FACTS_SPLIT, '{"facts": ["ok", 3]}')


def test_split_facts_are_cleaned_once_each():
    assert facts.clean_facts([" The circle is red. ", "", "The circle is red.", "It moves."]) == (
        "The circle is red.", "It moves.")


def test_scene_facts_are_the_oracles_facts_named_by_order_of_appearance():
    scene = world.make_scene(10_000)
    got = oracle.scene_facts(scene)
    assert len(got) == 2 + 4 * len(scene.objects)  # the oracle's recall denominator
    first = scene.objects[0]
    assert got[:3] == (f"There are {world.COUNT_WORDS[len(scene.objects)]} objects.",
                       f"The background is {scene.background}.", f"The first object to appear is {first.colour}.")
    ids = oracle.scene_fact_ids(scene)  # each fact's id as correct_facts names it, in the same order
    assert len(ids) == len(got) and ids[:3] == ("count", "background", "object0.colour")
    last = len(scene.objects) - 1
    assert ids[-1] == f"object{last}.motion" and got[-1].startswith(f"The {world.ORDINALS[last]} object")
    single = world.Scene(seed=0, background="black", objects=scene.objects[:1])
    assert oracle.scene_facts(single)[0] == "There is one object." and oracle.scene_facts(single)[2].startswith("The object is")


# ---------------------------------------------------------------------------------------------
# Scoring through the client


def test_identical_caption_scores_5_and_one_wrong_colour_loses_a_fact_each_way():
    fake = FakeJudge(rule_reply())
    items = [CaptionItem("same", REFERENCE, REFERENCE), CaptionItem("wrong", WRONG_COLOUR, REFERENCE)]
    same, wrong = score_captions(make_client(fake), items, "facts")
    assert same["score"] == 5.0 and same["f1"] == 1.0 and same["errors"] == []
    assert wrong["recall"] == 7 / 8 and wrong["precision"] == 7 / 8 and wrong["score"] == pytest.approx(5 * 7 / 8)
    assert [r["fact"] for r in wrong["reference_facts"] if not r["supported"]] == ["The circle is red."]
    assert [r["fact"] for r in wrong["caption_facts"] if not r["supported"]] == ["The circle is green."]
    assert wrong["reference_facts_from"] == "judge" and wrong["mode"] == "facts"


def test_yes_no_is_one_plain_token_and_the_split_is_json_whatever_the_server_negotiated():
    fake = FakeJudge(rule_reply())
    score_captions(make_client(fake), [CaptionItem("k", WRONG_COLOUR, REFERENCE)], "facts")
    for body in checks(fake):
        assert body["max_tokens"] == 1 and "response_format" not in body and body["temperature"] == 0
    split = [b for b in fake.bodies if b not in checks(fake)]
    assert split and all(b["max_tokens"] == prompts.FACTS_SPLIT.max_tokens for b in split)
    assert split[0]["response_format"]["type"] == "json_schema"  # the best format, as for the other modes


def test_questions_about_one_description_are_sent_together_so_they_share_its_prefix():
    fake = FakeJudge(rule_reply())
    items = [CaptionItem("a", REFERENCE, REFERENCE), CaptionItem("b", WRONG_COLOUR, REFERENCE)]
    score_captions(make_client(fake, max_concurrency=1), items, "facts")  # one at a time, as with --serve
    described = [b["messages"][-1]["content"].split("\nStatement:")[0] for b in checks(fake)]
    runs = [d for n, d in enumerate(described) if n == 0 or described[n - 1] != d]
    assert len(runs) == len(set(runs))  # each description's questions form one run


def test_a_reference_is_split_once_and_a_question_asked_once_however_many_captions_share_it():
    fake = FakeJudge(rule_reply())
    items = [CaptionItem(str(n), cap, REFERENCE) for n, cap in enumerate([REFERENCE, WRONG_COLOUR, WRONG_COLOUR])]
    results = score_captions(make_client(fake), items, "facts")
    assert sorted(splits_sent(fake)) == sorted(f"Description: {t}" for t in (REFERENCE, WRONG_COLOUR))
    questions = [b["messages"][-1]["content"] for b in checks(fake)]
    assert len(questions) == len(set(questions))
    assert results[1]["score"] == results[2]["score"]


def test_the_tasks_own_facts_replace_the_split_of_the_reference():
    fake = FakeJudge(rule_reply())
    own = ("The circle is red.", "The square is blue.")
    (result,) = score_captions(make_client(fake), [CaptionItem("k", WRONG_COLOUR, REFERENCE, reference_facts=own)],
                               "facts")
    assert splits_sent(fake) == [f"Description: {WRONG_COLOUR}"]  # the caption only
    assert result["reference_facts_from"] == "task" and [r["fact"] for r in result["reference_facts"]] == list(own)
    assert result["recall"] == 0.5


def test_an_unreadable_yes_no_is_asked_again_then_left_missing_never_counted_as_no():
    fake = FakeJudge(rule_reply(junk_for="The circle is red."))
    (result,) = score_captions(make_client(fake), [CaptionItem("k", WRONG_COLOUR, REFERENCE)], "facts")
    assert result["score"] is None and result["f1"] is None
    assert any("expected yes or no" in e for e in result["errors"])
    reasks = [b for b in checks(fake) if len(b["messages"]) > 2]
    assert reasks and "Reply again with one word: yes or no." in reasks[-1]["messages"][-1]["content"]


def test_a_reference_that_splits_into_nothing_is_missing_with_a_reason():
    fake = FakeJudge(rule_reply({**SPLITS, REFERENCE: []}))
    (result,) = score_captions(make_client(fake), [CaptionItem("k", WRONG_COLOUR, REFERENCE)], "facts")
    assert result["score"] is None and result["errors"] == ["the reference split into no facts"]


def test_second_run_asks_nothing_and_an_interrupted_run_resumes_with_what_it_has(tmp_path):
    items = [CaptionItem("a", REFERENCE, REFERENCE), CaptionItem("b", WRONG_COLOUR, REFERENCE)]
    with JudgeCache(tmp_path / "c.sqlite") as cache:
        first = FakeJudge(rule_reply())
        part = score_captions(make_client(first, cache), items[:1], "facts")  # "interrupted" after one caption
        full_fake = FakeJudge(rule_reply())
        full = score_captions(make_client(full_fake, cache), items, "facts")
        again = FakeJudge(rule_reply())
        client = make_client(again, cache)
        rerun = score_captions(client, items, "facts")
    assert part[0]["score"] == full[0]["score"] == 5.0
    resent = {json.dumps(b["messages"]) for b in full_fake.bodies} & {json.dumps(b["messages"]) for b in first.bodies}
    assert not resent  # the resumed run asked only what the first had not
    assert again.bodies == [] and client.stats.requests_sent == 0 and client.stats.cache_hits > 0
    assert [r["score"] for r in rerun] == [r["score"] for r in full]


def test_the_client_counts_tokens_and_seconds_of_the_requests_it_sent():
    fake = FakeJudge(rule_reply())
    client = make_client(fake)
    score_captions(client, [CaptionItem("k", WRONG_COLOUR, REFERENCE)], "facts")
    stats = client.stats.as_dict()
    assert stats["prompt_tokens"] == stats["completion_tokens"] == len(fake.bodies)  # the fake's usage: 1 and 1
    assert stats["request_seconds"] > 0


def test_judge_check_facts_uses_the_scene_facts_or_the_judges_split():
    cands = validate.make_candidates(1, 10_000)[:2]
    assert cands[0].reference_facts == oracle.scene_facts(world.make_scene(10_000))
    for source, from_ in (("scene", "task"), ("judge", "judge")):
        fake = FakeJudge(lambda body: ('{"facts": ["x."]}' if body["messages"][0]["content"].startswith("You split")
                                       else "yes"))
        details: list = []
        scores = validate.llm_judge(make_client(fake), "facts", source, details)(cands)
        assert scores == [5.0, 5.0] and [d["reference_facts_from"] for d in details] == [from_, from_]
        # identity's caption is the reference: one split serves both, whichever path
        assert len(splits_sent(fake)) == 2
    with pytest.raises(ValueError, match="reference_facts='both'"):
        validate.llm_judge(make_client(FakeJudge()), "facts", "both")


def test_judge_command_annotates_samples_with_judge_facts_for_the_report(tmp_path, monkeypatch, capsys):
    import functools

    from test_judge_unit import _main

    from judges import cli as judge_cli
    from judges.client import JudgeClient
    from lvspec_eval.reporting.report import score_value

    fake = FakeJudge(rule_reply())
    monkeypatch.setattr(judge_cli, "JudgeClient", functools.partial(JudgeClient, http_client=fake.http_client()))
    path = tmp_path / "run" / "m" / "20250101_120000_samples_demo_caption.jsonl"
    path.parent.mkdir(parents=True)
    lines = [{"doc_id": n, "target": REFERENCE, "filtered_resps": [cap], "input": "Describe."}
             for n, cap in enumerate([REFERENCE, WRONG_COLOUR])]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    argv = ["judge", str(tmp_path / "run"), "--mode", "facts", "--annotate", "--out", str(tmp_path / "j.jsonl"),
            "--base-url", "http://judge.test/v1", "--model", "judge-x", "--max-retries", "0",
            "--cache", str(tmp_path / "c.sqlite"), "--no-progress"]
    assert _main(argv) == 0
    annotated = [json.loads(line) for line in path.read_text().splitlines()]
    assert [a["doc_id"] for a in annotated] == [0, 1] and annotated[0]["filtered_resps"] == [REFERENCE]
    scores = [score_value(a["judge_facts"], "judge_facts", "here") for a in annotated]
    assert scores == [5.0, pytest.approx(5 * 7 / 8)] and annotated[1]["judge_facts"]["judge_model"] == "judge-x"
    assert json.loads(capsys.readouterr().out)["mode"] == "facts"


def test_demo_caption_tasks_give_their_scene_facts_other_tasks_none(monkeypatch):
    from judges import cli as judge_cli
    from lvspec_eval.demo import tasks_data

    scene = world.make_scene(10_003)
    monkeypatch.setattr(tasks_data, "load_docs", lambda task: [{"scene": scene.to_dict()}])
    assert judge_cli.task_reference_facts("synthvid_caption_f32") == {0: oracle.scene_facts(scene)}
    assert judge_cli.task_reference_facts("vdd") == {} and judge_cli.task_reference_facts("synthvid_mcq") == {}


def test_captions_split_into_sentences_ask_no_split_request():
    fake = FakeJudge(rule_reply())
    own = ("The circle is red.", "The square is blue.")
    item = CaptionItem("k", WRONG_COLOUR, REFERENCE, reference_facts=own)
    (result,) = score_captions(make_client(fake), [item], "facts", caption_facts="sentences")
    assert splits_sent(fake) == []
    assert [r["fact"] for r in result["caption_facts"]] == list(facts.sentence_facts(WRONG_COLOUR))
    assert [r["supported"] for r in result["caption_facts"]] == [True, False, True]  # the green circle's sentence
    assert result["precision"] == 2 / 3 and result["recall"] == 0.5
    assert facts.sentence_facts("A b. C d!  E f; g") == ("A b.", "C d!", "E f;", "g")
    with pytest.raises(ValueError, match="caption_facts='words'"):
        score_captions(make_client(fake), [item], "facts", caption_facts="words")


def _script(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _power_script():
    return _script("judge_power")


def test_fact_errors_script_knows_each_questions_truth():
    """scripts/judge_fact_errors.py: identity and paraphrase captions state every fact right; a
    single-swap caption states exactly the swapped fact wrong, and the oracle agrees."""
    tool = _script("judge_fact_errors")
    rows = tool.questions(3, 10_000, "appear")
    for seed in range(10_000, 10_003):
        scene = world.make_scene(seed)
        facts = oracle.scene_facts(scene)
        for kind, captions in (("identity", 1), ("paraphrase", 1), ("perturbed-1", 3)):
            recall = [r for r in rows if r["scene_seed"] == seed and r["kind"] == kind and r["side"] == "recall"]
            assert len(recall) == captions * len(facts)
            assert sum(not r["truth"] for r in recall) == (0 if captions == 1 else 3)  # one per swapped caption
            for r in recall:  # the truth is the oracle's: a fact is right iff the caption states it right
                fact_id = oracle.scene_fact_ids(scene)[facts.index(r["fact"])]
                assert (fact_id in oracle.correct_facts(r["text"], scene)) == r["truth"], r
    bare = tool.questions(1, 10_000, "bare")
    assert any(r["fact"].startswith("The first object is") for r in bare)
    assert not any("to appear" in r["fact"] for r in bare)


def test_power_script_swaps_one_word_of_the_first_kind_the_caption_has():
    import random

    power = _power_script()
    caption = "There are two objects on a gray background. First, a small red circle moves to the left."
    wrong, what = power.wrong_fact(caption, ["motion", "colour", "shape"], random.Random(0))
    assert what.startswith("motion: left -> ") and wrong != caption
    assert [a for a, b in zip(caption.split(), wrong.split()) if a != b] == ["left."]
    wrong, what = power.wrong_fact("A big circle.", ["colour", "shape", "motion"], random.Random(0))
    assert what.startswith("shape: circle -> ")  # no colour word: the next kind
    with pytest.raises(ValueError, match="no colour, shape or motion word"):
        power.wrong_fact("Nothing here.", ["colour"], random.Random(0))
    scene = world.make_scene(10_000)
    assert power.paraphrase(world.make_caption(scene), scene) != world.make_caption(scene)
