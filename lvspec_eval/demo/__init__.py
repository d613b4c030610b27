"""The offline demo world: procedurally generated scenes and videos (world.py), the samples built
from them (data.py, tasks_data.py), the tokenizer, the demo models' shapes (models.py) and their
committed checkpoints. Data and models only: their training is in lvspec_eval/training/."""
