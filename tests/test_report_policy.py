"""The report's draft-policy section, from records of a real adaptive run and of a fixed shape."""
from lvspec_eval.reporting import policy as report_policy
from lvspec_eval.measure.bench import make_samples
from lvspec_eval.decoding.runner import Runner


def test_policy_section_from_a_real_adaptive_run():
    target = Runner("demo", "vanilla").target
    sample = make_samples("synthvid_caption", 1)[0]
    adaptive = Runner("demo", "sd_tree", draft="demo-draft", target_backend=target)
    fixed = Runner("demo", "sd_tree", draft="demo-draft", target_backend=target, options={"tree": "dynamic"})
    records = [adaptive.generate(sample["prompt"], [sample["video"]], 32).stats for _ in range(2)]
    fields = report_policy.policy_fields(records)
    assert fields["steps"] == sum(len(r["plan_depth"]) for r in records)
    assert sum(fields["depth_counts"].values()) == fields["steps"]
    assert fields["depth_counts"].get(0, 0) >= 1  # the run's first step measures a plain step
    assert fields["depth_counts"].get(1, 0) >= 1  # its second is the one-token probe
    # drafting steps verify what they drafted (how often it drafts depends on the measured costs,
    # so on this machine's load: not asserted here; tests/test_policy.py checks choices on set costs)
    assert fields["mean_nodes"] >= 1
    assert set(fields["estimates"]["accept_by_width"]) == {"1", "2", "4", "8"}
    assert report_policy.policy_fields([fixed.generate(sample["prompt"], [sample["video"]], 32).stats]) is None
    rows = [{"task": "t", "method": "sd_tree", "policy": fields}, {"task": "t", "method": "vanilla", "policy": None}]
    text = report_policy.markdown_section(rows)
    assert "| t | sd_tree |" in text and "vanilla" not in text


def test_policy_section_reads_rows_after_a_json_round_trip():
    import json
    fields = {"steps": 4, "no_draft_share": 0.25, "depth_counts": {0: 1, 3: 2, 10: 1}, "mean_width": 1.0,
              "mean_nodes": 3.0, "estimates": None}
    rows = json.loads(json.dumps([{"task": "t", "method": "sd_tree", "policy": fields}]))
    assert "0: 25%, 3: 50%, 10: 25%" in report_policy.markdown_section(rows)
