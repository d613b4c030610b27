"""The demo world: procedural scenes, their videos, captions and multiple-choice questions.

Everything is a pure function of a seed. A scene is a background colour and 1-3 objects, each
with a shape, colour, size and motion, appearing one after another; in a clip longer than 8 frames
objects keep moving at the same speed per frame and wrap around the frame. Because the scene is known,
captions can be scored exactly (see `caption_facts` and `judges/oracle.py`).

Captions come from a small grammar whose visual words follow the scene and whose filler words
(connectives, verbs, phrasings) are drawn from a skewed distribution: each slot has a favourite,
as real language does, so that a draft model can agree with the target on most fillers.
"""
from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field

import numpy as np

SHAPES = ("square", "circle", "triangle", "cross")
COLOURS = {
    "red": (225, 40, 40),
    "green": (40, 190, 70),
    "blue": (50, 90, 235),
    "yellow": (240, 220, 40),
    "white": (245, 245, 245),
    "purple": (165, 60, 205),
}
BACKGROUNDS = {"black": (12, 12, 12), "gray": (110, 110, 110), "brown": (105, 62, 28)}
SIZES = {"small": 0.17, "big": 0.27}  # side length as a fraction of the frame side
MOTIONS = ("left", "right", "up", "down", "still")
COUNT_WORDS = ("zero", "one", "two", "three", "four")
ORDINALS = ("first", "second", "third")
TRAVEL = 0.42  # distance an object travels over a clip of up to SPEED_FRAMES frames, as a fraction of the frame side
# Motions last: a clip longer than SPEED_FRAMES frames keeps the speed per frame of a SPEED_FRAMES-frame
# clip (at 4 fps an object moves 0.06 of the frame side per frame, about 7 px at 112 px, so the two
# frames of one temporal patch show it moving at any length), and an object that leaves the frame on
# one side comes back in on the other (its direction never changes, so "moves left" stays true).
# Clips of up to SPEED_FRAMES frames never wrap: objects start where their travel keeps them inside.
SPEED_FRAMES = 8
# Later objects appear inside one of two windows of the clip (one in each when there are three). At
# the trained 8 frames (t = i/7) an object appearing in the first window is first seen in frame 2 and
# one in the second in frame 4, the first frames of two different temporal patches, so the order of
# appearance can always be read from the video. (Uniform
# appearance times let two objects first show in the same temporal patch in about a third of the
# three-object scenes, where their order cannot be told.)
APPEAR_WINDOWS = ((0.2, 0.27), (0.45, 0.55))
_DIRECTION = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "still": (0, 0)}

CAPTION_PROMPT = "Describe the video in detail."
MCQ_SUFFIX = "Answer with the option's letter from the given choices directly."


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str
    motion: str
    appear: float  # fraction of the clip at which it appears (0 for the first object)
    start: tuple[float, float]  # centre (x, y) when it appears, as fractions of the frame

    def position(self, t: float, num_frames: int = SPEED_FRAMES) -> tuple[float, float]:
        """Centre at clip time t in [0, 1] of a clip of `num_frames` frames (only meaningful for
        t >= appear), wrapped so that an object leaving one side enters from the other."""
        dx, dy = _DIRECTION[self.motion]
        travelled = TRAVEL * max(0.0, t - self.appear) * max(1.0, (num_frames - 1) / (SPEED_FRAMES - 1))
        half, period = SIZES[self.size] / 2, 1 + SIZES[self.size]  # fully out on one side = just in on the other
        return tuple((c + d * travelled + half) % period - half for c, d in zip(self.start, (dx, dy)))


@dataclass(frozen=True)
class Scene:
    seed: int
    background: str
    objects: tuple[SceneObject, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Scene":
        objs = tuple(SceneObject(**{**o, "start": tuple(o["start"])}) for o in d["objects"])
        return Scene(seed=d["seed"], background=d["background"], objects=objs)


def _weighted(rng: random.Random, options: list[tuple[str, float]], favourite: int = 0) -> str:
    """One option drawn by weight; `favourite` > 0 swaps the first option's weight (the world's
    favourite) with that option's: the same phrasings, another preference."""
    words, weights = zip(*options)
    weights = list(weights)
    weights[0], weights[favourite] = weights[favourite], weights[0]
    return rng.choices(words, weights=weights, k=1)[0]


def _overlaps(objs: list[SceneObject], cand: SceneObject) -> bool:
    for o in objs:
        min_gap = 0.55 * (SIZES[o.size] + SIZES[cand.size]) + 0.04
        for t in np.linspace(max(o.appear, cand.appear), 1.0, 6):
            (ax, ay), (bx, by) = o.position(t), cand.position(t)
            if max(abs(ax - bx), abs(ay - by)) < min_gap:
                return True
    return False


def make_scene(seed: int, max_objects: int = 3) -> Scene:
    """A random scene; distinct (colour, shape) pairs so every object can be named unambiguously."""
    rng = random.Random(seed)
    for _ in range(200):
        n = rng.randint(1, max_objects)
        objs: list[SceneObject] = []
        used: set[tuple[str, str]] = set()
        windows = APPEAR_WINDOWS if n == 3 else [rng.choice(APPEAR_WINDOWS)] * (n - 1)
        appear_times = [0.0] + [rng.uniform(*w) for w in windows[:n - 1]]
        for k in range(n):
            for _ in range(60):
                shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
                if (colour, shape) in used:
                    continue
                size, motion = rng.choice(list(SIZES)), rng.choice(MOTIONS)
                half = SIZES[size] / 2 + 0.02
                travel = TRAVEL * (1 - appear_times[k])
                dx, dy = _DIRECTION[motion]
                lo_x, hi_x = half + max(0.0, -dx * travel), 1 - half - max(0.0, dx * travel)
                lo_y, hi_y = half + max(0.0, -dy * travel), 1 - half - max(0.0, dy * travel)
                start = (round(rng.uniform(lo_x, hi_x), 4), round(rng.uniform(lo_y, hi_y), 4))
                cand = SceneObject(shape, colour, size, motion, round(appear_times[k], 4), start)
                if not _overlaps(objs, cand):
                    objs.append(cand)
                    used.add((colour, shape))
                    break
            else:
                break
        if len(objs) == n:
            return Scene(seed=seed, background=rng.choice(list(BACKGROUNDS)), objects=tuple(objs))
    raise RuntimeError(f"could not place objects for seed {seed}")


# ----------------------------------------------------------------------------------------------
# Rendering


def shape_mask(shape: str, dx: np.ndarray, dy: np.ndarray, r: float) -> np.ndarray:
    if shape == "square":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "triangle":  # apex up, base at the bottom
        return (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
    if shape == "cross":
        bar = r / 2.6
        return ((np.abs(dx) <= bar) & (np.abs(dy) <= r)) | ((np.abs(dy) <= bar) & (np.abs(dx) <= r))
    raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def render(scene: Scene, num_frames: int = 8, height: int = 112, width: int = 112) -> np.ndarray:
    """Frames as uint8 [num_frames, height, width, 3]."""
    if num_frames < 1 or height < 8 or width < 8:
        raise ValueError(f"need num_frames >= 1 and a frame of at least 8x8, got {num_frames}x{height}x{width}")
    side = min(height, width)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    frames = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    for i in range(num_frames):
        t = i / max(1, num_frames - 1)
        frame = frames[i]
        frame[:] = BACKGROUNDS[scene.background]
        for obj in scene.objects:
            if t + 1e-9 < obj.appear:
                continue
            cx, cy = obj.position(t, num_frames)
            mask = shape_mask(obj.shape, xs - cx * width, ys - cy * height, SIZES[obj.size] * side / 2)
            frame[mask] = COLOURS[obj.colour]
    return frames


# ----------------------------------------------------------------------------------------------
# Captions

_MOTION_PHRASES = {
    "left": [("moves to the left", 0.7), ("moves left", 0.2), ("slides to the left", 0.1)],
    "right": [("moves to the right", 0.7), ("moves right", 0.2), ("slides to the right", 0.1)],
    "up": [("moves up", 0.7), ("moves upward", 0.2), ("rises", 0.1)],
    "down": [("moves down", 0.7), ("moves downward", 0.2), ("falls", 0.1)],
    "still": [("stays still", 0.7), ("does not move", 0.2), ("stays in place", 0.1)],
}
_MOTION_WORDS = {  # caption word -> motion, used by the parser
    "left": "left", "right": "right", "up": "up", "upward": "up", "rises": "up",
    "down": "down", "downward": "down", "falls": "down", "still": "still", "not": "still", "place": "still",
}


def _count_phrase(n: int) -> str:
    return f"is {COUNT_WORDS[n]} object" if n == 1 else f"are {COUNT_WORDS[n]} objects"


def make_caption(scene: Scene, seed: int | None = None, favourite: int = 0) -> str:
    """A reference caption; the paraphrase is drawn with `seed` (default: the scene's seed).
    `favourite` picks which listed phrasing of every slot is the most likely one: 0 is the world's
    own style (what the target learns and the tasks' references use); 1 is another style of the
    same phrasings, which the restyled demo draft learns (train.restyle_draft, in `build-demo`)."""
    rng = random.Random(scene.seed * 7919 + 17 if seed is None else seed)
    n, bg = len(scene.objects), scene.background
    count_obj = f"{COUNT_WORDS[n]} object" + ("s" if n > 1 else "")
    intro = _weighted(rng, favourite=favourite, options=[
        (f"There {_count_phrase(n)} on a {bg} background.", 0.7),
        (f"The video shows {count_obj} on a {bg} background.", 0.2),
        (f"On a {bg} background, there {_count_phrase(n)}.", 0.1),
    ])
    sentences = [intro]
    for k, obj in enumerate(scene.objects):
        np_ = f"{obj.size} {obj.colour} {obj.shape}"
        motion = _weighted(rng, _MOTION_PHRASES[obj.motion], favourite)
        if k == 0:
            lead = _weighted(rng, [("First, a", 0.7), ("At the start, a", 0.2), ("A", 0.1)], favourite)
            sentences.append(f"{lead} {np_} {motion}.")
        else:
            lead = _weighted(rng, [("Then a", 0.7), ("Next, a", 0.2), ("After that, a", 0.1)], favourite)
            enter = _weighted(rng, [("appears and", 0.75), ("comes in and", 0.25)], favourite)
            sentences.append(f"{lead} {np_} {enter} {motion}.")
    return " ".join(sentences)


@dataclass
class CaptionFacts:
    """What a caption states: count, background and per-object attributes in order of mention."""

    count: str | None
    background: str | None
    objects: list[dict]


def caption_facts(text: str) -> CaptionFacts:
    """Parse a caption of the demo grammar (tolerant of other wording) into stated facts."""
    words = re.findall(r"[a-z]+", text.lower())
    count = next((w for w in words if w in COUNT_WORDS[1:]), None)
    background = None
    for i, w in enumerate(words):
        if w == "background" and i > 0 and words[i - 1] in BACKGROUNDS:
            background = words[i - 1]
    objects = []
    for sentence in re.split(r"[.!?;]", text.lower()):
        sw = re.findall(r"[a-z]+", sentence)
        shape = next((w for w in sw if w in SHAPES), None)
        if shape is None:
            continue
        objects.append({
            "shape": shape,
            "colour": next((w for w in sw if w in COLOURS), None),
            "size": next((w for w in sw if w in SIZES), None),
            "motion": next((_MOTION_WORDS[w] for w in sw if w in _MOTION_WORDS), None),
        })
    return CaptionFacts(count=count, background=background, objects=objects)


# ----------------------------------------------------------------------------------------------
# Multiple-choice questions

LETTERS = "ABCDEF"


def _fixed_options(answer: str, pool: list[str]) -> tuple[list[str], str]:
    """All values of the attribute, in their canonical order: the letter names the value."""
    return list(pool), LETTERS[pool.index(answer)]


def _shuffled_options(rng: random.Random, answer: str, pool: list[str]) -> tuple[list[str], str]:
    others = [p for p in pool if p != answer]
    opts = rng.sample(others, 3) + [answer]
    rng.shuffle(opts)
    return opts, LETTERS[opts.index(answer)]


def make_questions(scene: Scene) -> list[dict]:
    """All multiple-choice questions for a scene: {kind, question, options, answer}.

    Attribute questions list every value of the attribute in a fixed order (as a form would);
    the temporal-order question lists four object names in random order.
    """
    rng = random.Random(scene.seed * 104729 + 3)
    qs: list[tuple[str, str, str, list[str]]] = [
        ("count", "How many objects are in the video?", COUNT_WORDS[len(scene.objects)], list(COUNT_WORDS[1:5])),
        ("background", "What colour is the background?", scene.background, list(BACKGROUNDS)),
    ]
    for k, obj in enumerate(scene.objects):
        ordinal = ORDINALS[k]
        qs.append(("colour", f"What colour is the {ordinal} object?", obj.colour, list(COLOURS)))
        qs.append(("shape", f"What shape is the {ordinal} object?", obj.shape, list(SHAPES)))
        qs.append(("motion", f"Which way does the {obj.colour} {obj.shape} move?", obj.motion, list(MOTIONS)))
    out = [{"kind": kind, "question": question, **dict(zip(("options", "answer"), _fixed_options(answer, pool)))}
           for kind, question, answer, pool in qs]
    if len(scene.objects) > 1:
        names = [f"the {o.colour} {o.shape}" for o in scene.objects]
        distract = [f"the {c} {s}" for c in COLOURS for s in SHAPES if f"the {c} {s}" not in names]
        pool = names[1:] + rng.sample(distract, 3 - min(3, len(names) - 1)) + [names[0]]
        opts, letter = _shuffled_options(rng, names[0], pool)
        out.append({"kind": "order", "question": "Which object appears first?", "options": opts, "answer": letter})
    return out


def format_mcq(q: dict) -> str:
    lines = [q["question"]] + [f"{LETTERS[i]}. {o}" for i, o in enumerate(q["options"])]
    return "\n".join(lines + [MCQ_SUFFIX])
