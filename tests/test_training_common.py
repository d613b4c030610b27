"""What the trainers share (lvspec_eval/training/common.py): JSON-lines logs and atomic saves."""
from __future__ import annotations

import json

import pytest
import torch

from lvspec_eval.training import common


def test_log_appends_one_json_record_a_line(tmp_path):
    path = tmp_path / "train.log"
    common.log_jsonl(path, {"step": 1, "loss": 0.5})
    common.log_jsonl(path, {"step": 2, "loss": 0.25})
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 1, "loss": 0.5},
                                                                              {"step": 2, "loss": 0.25}]


def test_a_save_killed_midway_leaves_the_previous_state_whole(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    common.save_atomic({"step": 3}, path)
    real_save = torch.save

    def dies_midway(obj, f):
        real_save({"step": "half"}, f)  # something reached the disk, then the process died
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        common.save_atomic({"step": 4}, path)
    monkeypatch.undo()
    assert torch.load(path) == {"step": 3}
    common.save_atomic({"step": 4}, path)
    assert torch.load(path) == {"step": 4} and not path.with_suffix(".tmp").exists()
