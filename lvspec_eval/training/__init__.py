"""Training, apart from the engine: what makes the checkpoints the engine runs.

- sparrow.py: `lvspec-eval train-sparrow` (a Sparrow draft head for any target, from the demo
  world's scenes or a folder of videos);
- demo.py: the demo world's target and draft models' training (probes, length fine-tune,
  distillation, restyling); build_demo.py: `lvspec-eval build-demo`, which runs it stage by stage;
- common.py: what both trainers share (learning-rate schedule, JSON-lines logs, atomic saves).

It imports the engine (decoding/, backends/) and the demo world (demo/); nothing in decoding/ or
backends/ imports it.
"""
