"""The committed texts a speech run synthesizes: fixed sets of several lengths, each text chosen per repetition by
a seed that every arm of a pass shares (so the arms of a pass speak the same texts, paired).

`short`: one sentence, one chunk when the engine streams by sentence (time to first audio is the whole synthesis).
`long`: four or five sentences, several chunks (the playback model's stalls and gaps have something to measure).
`ja-short`, `ja-long`: the same two shapes in Japanese, for a voice that speaks Japanese (Kokoro's, harness/voices.py);
a set is spoken only by a voice of its language (LANGUAGE), refused at plan otherwise.
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
    "ja-short": (
        "海辺の町へ行く電車は朝七時に出発します。",
        "留守の間、植木に水をやるのを忘れないでください。",
        "小さな船が静かな港をゆっくりと横切っていきました。",
        "彼女は窓を開けて、雨の音に耳を澄ませました。",
        "図書館は毎月第一月曜日には早く閉まります。",
        "台所の引き出しの中から古い地図が見つかりました。",
        "彼の自転車は庭の垣根に立てかけてありました。",
        "このスープは出す前に塩をもう少し足したほうがいいです。",
    ),
    "ja-long": (
        "嵐は真夜中を少し過ぎた頃にやって来ました。朝になると、川の水は古い石段の上まで上がっていました。"
        "近所の人たちは橋の上に集まり、枝が流されていくのを眺めていました。"
        "これほどの洪水は二十年間誰も覚えていませんでした。",
        "最初に立ち寄ったのは駅の近くのパン屋でした。店主は夜明け前からそこでパンを焼いていました。"
        "秘訣は辛抱強さと、とても熱いオーブンだと教えてくれました。"
        "私たちは食パンを二斤と、温かいロールパンを一袋買って店を出ました。ロールパンは家に着く前になくなりました。",
        "会議は予算についての短い報告から始まりました。修理にかかる費用は去年の春から倍になっていました。"
        "何人かの委員は、屋根の修理をもう一年待てないかと尋ねました。"
        "結局、冬が来る前に一番ひどいところだけを直すことに決まりました。",
        "丘の上には、谷全体を見渡せるベンチがあります。晴れた日には湖とその向こうの山々が見えます。"
        "夕方になると、光が畑を金色に染めます。町で夕日を眺めるには一番の場所です。",
        "博物館は三年間の工事を終えて再開しました。展示室は明るくなり、部屋も見つけやすくなりました。"
        "新しい展示室では、百年前の村の道具や衣服が紹介されています。"
        "週末は子どもの入場が無料です。",
        "祖父は人生のほとんどを通して蜂を飼っていました。蜂のおかげで、ゆっくり動いて静かに話すことを覚えたと言っていました。"
        "毎年夏になると、通りの家々すべてに蜂蜜の瓶を配っていました。"
        "祖父の帽子と網は、今も裏口のそばに掛けてあります。",
    ),
}
LANGUAGE = {"short": "en", "long": "en", "ja-short": "ja", "ja-long": "ja"}  # what a voice must speak


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
