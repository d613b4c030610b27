"""scripts/bench_policy_heldout.py: an interrupted run goes on from the first prompt not done, with
the rotation where it stopped; records from other settings are never mixed in."""
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

from lvspec_eval.measure import bench

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("bench_policy_heldout", ROOT / "scripts" / "bench_policy_heldout.py")
script = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(script)


class Recorder:
    """A runner that notes when it ran (warm-ups included) and answers with fixed tokens."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def generate(self, prompt, videos, max_new_tokens):
        self.log.append((self.name, prompt, max_new_tokens))
        stats = {"num_new_tokens": max_new_tokens, "e2e_s": 1.0, "tokens": [1] * max_new_tokens}
        return SimpleNamespace(stats=stats, text="x")


def samples(n):
    return [{"id": k, "scene": None, "prompt": f"p{k}", "video": None, "answer": None} for k in range(n)]


def test_each_sample_is_handed_over_when_done_and_a_resumed_run_rotates_on():
    log, handed = [], []
    runners = {n: Recorder(n, log) for n in ("a", "b", "c")}
    records = bench.run_methods(runners, samples(4)[2:], 12, first_index=2, on_sample=handed.append)
    timed = [(n, p) for n, p, t in log if t == 12]  # warm-ups: 8 tokens
    assert timed == [("c", "p2"), ("a", "p2"), ("b", "p2"), ("a", "p3"), ("b", "p3"), ("c", "p3")]
    assert [sorted(h) for h in handed] == [["a", "b", "c"]] * 2
    assert [r["sample"] for r in records["a"]] == [2, 3]
    assert handed[0]["b"]["sample"] == 2


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_resume_keeps_whole_prompts_and_moves_other_settings_aside(tmp_path):
    settings = {"draft_dtype": "int8", "depths": "3,6"}
    path = tmp_path / "records.jsonl"
    rows = [{"method": m, "settings": settings, "sample": k} for k in range(2) for m in ("vanilla", "adaptive")]
    write(path, rows + [{"method": "vanilla", "settings": settings, "sample": 2}])  # prompt 2 cut short
    got = script.resumed(path, settings, ["p0", "p1", "p2"])
    assert {m: [r["sample"] for r in v] for m, v in got.items()} == {"vanilla": [0, 1], "adaptive": [0, 1]}
    assert script.resumed(path, settings, ["p0"])["vanilla"][-1]["sample"] == 0  # a smaller set: its prefix

    assert script.resumed(path, {**settings, "draft_dtype": "bfloat16"}, ["p0", "p1"]) == {}
    assert not path.exists() and path.with_suffix(".other-settings.jsonl").exists()


def test_rows_are_saved_under_their_own_names_not_the_decoders(tmp_path):
    settings, path = {"depths": "3"}, tmp_path / "records.jsonl"
    for k in range(2):
        script.append_records(path, {"vanilla": {"method": "vanilla", "sample": k},
                                     "adaptive": {"method": "sd_tree", "sample": k},
                                     "chain3": {"method": "sd_tree", "sample": k}}, settings)
    got = script.resumed(path, settings, ["p0", "p1"])
    assert sorted(got) == ["adaptive", "chain3", "vanilla"]
    assert [r["sample"] for r in got["chain3"]] == [0, 1]


def test_a_later_slice_of_the_held_out_set_shares_no_prompt_with_the_first():
    first, later = script.heldout_prompts(1), script.heldout_prompts(1, start=1)
    assert len(first) == len(later) == 3 and not set(first) & set(later)
    assert script.heldout_prompts(2)[3:] == later  # kinds interleaved: the second of each kind
