"""The demo world: deterministic by seed, captions parse back to the scene, MC answers are right."""
import numpy as np

from judges.oracle import score_caption
from lvspec_eval.demo import world
from lvspec_eval.demo import data
from lvspec_eval.training.demo import _long_step, _step_plan, coverage_labels, coverage_owners, text_labels


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


def test_other_style_keeps_the_phrasings_and_the_facts_but_not_the_favourite():
    """favourite=1 (the restyled draft's corpus) swaps which phrasing of each slot is the most
    likely: the same phrasings, the same facts, another favourite caption."""
    scene = world.make_scene(1)
    own = [world.make_caption(scene, seed=s) for s in range(400)]
    other = [world.make_caption(scene, seed=s, favourite=1) for s in range(400)]
    assert world.make_caption(scene, seed=3, favourite=0) == own[3]  # the default style is style 0
    assert len(set(other) & set(own)) > 3  # the same phrasings
    top_own, top_other = max(set(own), key=own.count), max(set(other), key=other.count)
    assert top_own != top_other
    assert other.count(top_own) < own.count(top_own) / 3
    assert sum(c.startswith("The video shows") for c in other) > sum(c.startswith("The video shows") for c in own) * 2
    for cap in other[:50]:
        s = score_caption(cap, scene)
        assert s["precision"] == 1.0 and s["recall"] == 1.0


def test_restyle_mix_draws_captions_in_the_other_style():
    rng = np.random.default_rng(0)
    tasks = [data.sample_task(world.make_scene(seed), rng, data.RESTYLE_MIX) for seed in range(400)]
    captions = [answer for _, answer, q in tasks if q is None]
    assert 0.65 < len(captions) / len(tasks) < 0.85
    assert sum(c.startswith("The video shows") for c in captions) / len(captions) > 0.5


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


def test_order_of_appearance_is_visible_at_the_trained_length():
    """Every object first shows in its own temporal patch (frames 2t, 2t+1) at 8 frames."""
    for seed in range(300):
        scene = world.make_scene(seed)
        first_patch = [min(i for i in range(8) if i / 7 + 1e-9 >= o.appear) // 2 for o in scene.objects]
        assert first_patch == sorted(set(first_patch)), (seed, first_patch)


def test_coverage_labels_cover_every_visible_object():
    for seed in range(20):
        scene = world.make_scene(seed)
        owners = coverage_owners(scene, 8, 112)
        cover = coverage_labels(owners, scene)
        assert owners.shape == (4 * 4 * 4,) and cover.shape == (4 * 4 * 4, 4)
        # every object gets at least one token in each temporal patch where it is visible
        for t in range(4):
            visible = {o.colour for o in scene.objects if o.appear <= 2 * t / 7 + 1e-9}
            names = list(world.COLOURS)
            labelled = {names[c - 1] for c in cover[16 * t:16 * (t + 1), 0].tolist() if c > 0}
            assert visible <= labelled, (seed, t, visible, labelled)
            # the owner ids are the objects' order of appearance, and agree with the attributes
            for k in set(owners[16 * t:16 * (t + 1)].tolist()) - {0}:
                assert scene.objects[k - 1].appear <= (2 * t + 1) / 7 + 1e-9
        assert (cover[:, 0] > 0).equal(owners > 0)


def test_long_steps_keep_the_visual_token_budget():
    rng = np.random.default_rng(0)
    steps = [_long_step(step, 16, rng) for step in range(40)]
    assert steps.count((8, 16)) == 36
    assert all(frames * n == 8 * 16 for frames, n in steps)


def test_question_phase_ends_the_run_on_its_own_schedule_and_mix():
    rng = np.random.default_rng(0)
    plan = [_step_plan(step, 3600, 400, 16, 1.5e-3, 3e-4, rng) for step in range(3600)]
    assert all(mix == data.TaskMix() for _, _, _, mix in plan[:3200])
    assert any(frames != 8 for _, frames, _, _ in plan[:3200])  # the main phase has its long steps
    assert all(p[1:] == (8, 16, data.QUESTION_MIX) for p in plan[3200:])
    lrs = [lr for lr, *_ in plan]
    assert max(lrs[:3200]) == 1.5e-3 and lrs[3199] < 1e-4  # the main schedule ends within the main phase
    peak = max(range(3200, 3600), key=lrs.__getitem__)
    assert peak < 3230 and 2.9e-4 < lrs[peak] <= 3e-4 and lrs[3200] < lrs[peak] / 10  # a fresh warm-up,
    assert lrs[3300] > lrs[3500] > lrs[-1] and lrs[-1] < 1e-8  # then a decay to zero


def test_question_mix_favours_motion_and_order_questions():
    rng = np.random.default_rng(0)
    kinds = {"caption": 0, "hard": 0, "other": 0}
    for seed in range(400):
        _, answer, q = data.sample_task(world.make_scene(seed), rng, data.QUESTION_MIX)
        kinds["caption" if q is None else "hard" if q["kind"] in data.HARD_KINDS else "other"] += 1
        assert q is None or answer == q["answer"]
    assert 70 <= kinds["caption"] <= 130  # 25%
    assert kinds["hard"] > 1.5 * kinds["other"]  # 60% of questions plus their share of the rest


def test_text_labels_name_the_object_at_its_mention():
    from transformers import AutoTokenizer

    from lvspec_eval.training.build_demo import CHECKPOINTS

    demo_tokenizer = AutoTokenizer.from_pretrained(CHECKPOINTS / "tokenizer")
    colour_ids = {demo_tokenizer(" " + c).input_ids[0] for c in world.COLOURS}
    vid = demo_tokenizer.convert_tokens_to_ids("<|video_pad|>")
    seen = {"caption": 0, "question": 0}
    for seed in range(40):
        s = data.make_sample(demo_tokenizer, vid, seed)
        labels = text_labels(s, colour_ids)
        marked = (labels[:, 0] > 0).nonzero().flatten().tolist()
        if s.question is None:
            seen["caption"] += 1
            assert len(marked) == 2 * len(s.scene.objects)
            for k, obj in enumerate(s.scene.objects):
                i = marked[2 * k]  # the position predicting object k's colour word
                assert demo_tokenizer.decode([s.input_ids[i + 1]]).strip() == obj.colour
                assert labels[i, 1] - 1 == world.SHAPES.index(obj.shape)
        else:
            seen["question"] += 1
            assert all(i == s.num_prompt - 1 for i in marked)
    assert min(seen.values()) > 5


def test_per_sample_loss_weighs_each_answer_equally():
    import torch
    import torch.nn.functional as F

    from lvspec_eval.training.demo import per_sample_loss

    torch.manual_seed(0)
    logits = torch.randn(2, 6, 9)
    labels = torch.tensor([[-100, -100, 3, 4, 1, 7], [-100, -100, -100, -100, 2, -100]])
    long_answer = F.cross_entropy(logits[0, 1:5], labels[0, 2:6])
    one_letter = F.cross_entropy(logits[1, 3:4], labels[1, 4:5])
    assert torch.allclose(per_sample_loss(logits, labels), (long_answer + one_letter) / 2)


def _centroid(frame: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray | None:
    ys, xs = np.nonzero((np.abs(frame.astype(int) - colour).sum(-1) == 0))
    return None if len(xs) == 0 else np.array([xs.mean(), ys.mean()])


def test_clips_up_to_eight_frames_keep_objects_inside():
    """Up to world.SPEED_FRAMES frames an object's whole travel stays inside the frame (no wrap)."""
    for seed in range(60):
        scene = world.make_scene(seed)
        for obj in scene.objects:
            half = world.SIZES[obj.size] / 2
            for t in np.linspace(obj.appear, 1.0, 8):
                x, y = obj.position(float(t), world.SPEED_FRAMES)
                assert half <= x <= 1 - half and half <= y <= 1 - half


def test_long_clips_keep_the_speed_per_frame_and_wrap_in_the_direction_of_motion():
    """Motions last: at 512 frames an object moves as far between two frames as at 8 frames (so one
    temporal patch shows it moving), and when it leaves the frame it comes back on the other side,
    still moving the same way."""
    scene = next(s for s in map(world.make_scene, range(200))
                 if len(s.objects) == 1 and s.objects[0].motion == "left")
    obj, colour = scene.objects[0], world.COLOURS[scene.objects[0].colour]
    short, long = world.render(scene, 8, 112, 112), world.render(scene, 512, 112, 112)
    step_short = _centroid(short[1], colour)[0] - _centroid(short[0], colour)[0]
    step_long = _centroid(long[1], colour)[0] - _centroid(long[0], colour)[0]
    assert step_short < -5 and abs(step_long - step_short) < 1.0
    xs = [c[0] for c in (_centroid(f, colour) for f in long) if c is not None]
    moves = np.diff(xs)
    assert (moves < 0).mean() > 0.9  # left nearly always...
    assert (moves > 50).sum() >= 10  # ...except the jumps back to the right edge (about 25 crossings)
    assert all(_centroid(f, colour) is not None for f in long[::7])  # never gone for long
