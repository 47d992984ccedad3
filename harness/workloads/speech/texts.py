"""The committed texts a speech run synthesizes: fixed sets of several lengths, each text chosen per repetition by
a seed that every arm of a pass shares (so the arms of a pass speak the same texts, paired).

`short`: one sentence, one chunk when the engine streams by sentence (time to first audio is the whole synthesis).
`long`: four or five sentences, several chunks (the playback model's stalls and gaps have something to measure).
Written for this harness (no licence question); changing one changes the set's sha256, which every artifact
records (workload.prompt_token_hash), so series before and after are not paired by accident.
"""

from __future__ import annotations

import hashlib
import json
import random

TEXTS: dict[str, tuple[str, ...]] = {
    "short": (
        "The train to the coast leaves at seven in the morning.",
        "Please remember to water the plants while I am away.",
        "A small boat drifted slowly across the quiet harbour.",
        "She opened the window and listened to the rain.",
        "The library closes early on the first Monday of the month.",
        "We found an old map folded inside the kitchen drawer.",
        "His bicycle was leaning against the garden fence.",
        "The soup needs another pinch of salt before it is served.",
    ),
    "long": (
        "The storm arrived a little after midnight. By morning the river had risen above the old stone steps. "
        "Neighbours gathered on the bridge to watch the water carry branches downstream. "
        "Nobody could remember a flood like it in twenty years.",
        "Our first stop was a bakery near the station. The owner had been baking bread there since before dawn. "
        "She told us the secret was patience and a very hot oven. "
        "We left with two loaves and a bag of warm rolls. The rolls did not survive the walk home.",
        "The meeting began with a short report on the budget. Spending on repairs had doubled since last spring. "
        "Several members asked whether the roof could wait another year. "
        "In the end they agreed to fix the worst of it before winter.",
        "At the top of the hill there is a bench with a view of the whole valley. "
        "On clear days you can see the lake and the mountains beyond it. "
        "In the evening the light turns the fields gold. It is the best place in town to watch the sun go down.",
        "The museum reopened after three years of work. The halls are brighter and the rooms are easier to find. "
        "A new gallery shows tools and clothes from the village as it was a century ago. "
        "Entry is free for children on weekends.",
        "My grandfather kept bees for most of his life. He said they taught him to move slowly and speak softly. "
        "Every summer he gave jars of honey to the whole street. "
        "We still have his hat and veil hanging by the back door.",
    ),
}


def names() -> tuple[str, ...]:
    return tuple(TEXTS)


def set_sha256(name: str) -> str:
    """The sha256 of a set's texts (UTF-8 JSON list, in order)."""
    return hashlib.sha256(json.dumps(list(TEXTS[name]), ensure_ascii=False).encode()).hexdigest()


def chosen(name: str, seed: int, cell: str, pass_index: int, n: int) -> list[int]:
    """The indices of the n texts one run speaks (its warm-ups first), the same for every arm of a pass of a cell."""
    rng = random.Random(f"{seed}|{cell}|{pass_index}")
    k = len(TEXTS[name])
    return [rng.randrange(k) for _ in range(n)]
