"""The demo world: deterministic by seed, captions parse back to the scene, MC answers are right."""
import numpy as np

from judges.oracle import score_caption
from lvspec_eval.demo import world
from lvspec_eval.demo.train import aux_labels


def test_scene_and_frames_deterministic():
    a, b = world.make_scene(123), world.make_scene(123)
    assert a == b and a != world.make_scene(124)
    assert np.array_equal(world.render(a, 8, 112, 112), world.render(b, 8, 112, 112))
    assert world.make_caption(a) == world.make_caption(b)
    assert world.make_questions(a) == world.make_questions(b)


def test_reference_caption_scores_perfectly():
    for seed in range(50):
        scene = world.make_scene(seed)
        s = score_caption(world.make_caption(scene, seed=seed + 1), scene)
        assert s["precision"] == 1.0 and s["recall"] == 1.0


def test_wrong_colour_lowers_precision():
    scene = world.make_scene(5)
    cap = world.make_caption(scene)
    wrong = next(c for c in world.COLOURS if c != scene.objects[0].colour)
    s = score_caption(cap.replace(scene.objects[0].colour, wrong, 1), scene)
    assert s["precision"] < 1.0


def test_paraphrases_are_skewed():
    caps = [world.make_caption(world.make_scene(1), seed=s) for s in range(300)]
    top = max(set(caps), key=caps.count)
    assert caps.count(top) / len(caps) > 0.2  # a favourite phrasing exists
    assert len(set(caps)) > 3  # but not only one


def test_mcq_answers_name_the_scene():
    for seed in range(30):
        scene = world.make_scene(seed)
        for q in world.make_questions(scene):
            answer = q["options"][world.LETTERS.index(q["answer"])]
            if q["kind"] == "colour":
                assert answer in {o.colour for o in scene.objects}
            if q["kind"] == "background":
                assert answer == scene.background


def test_objects_stay_in_frame_and_are_drawn():
    scene = world.make_scene(9)
    frames = world.render(scene, 8, 112, 112)
    bg = np.array(world.BACKGROUNDS[scene.background])
    assert (np.abs(frames[-1].astype(int) - bg).sum(-1) > 0).sum() > 100


def test_aux_labels_mark_object_tokens():
    scene = world.make_scene(2)
    labels = aux_labels(scene, 8, 112)
    assert labels.shape == (4 * 4 * 4, 4)
    assert (labels[:16, 0] > 0).sum() >= 1  # the first object is visible in the first frames
