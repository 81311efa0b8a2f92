"""The Japanese sample: a jawiki-style export (its namespaces, {{読み仮名}}, {{lang}}, {{仮リンク}},
ruby, full-width punctuation, 「」 quotes), books, and the five JGLUE tasks in JGLUE's files
(``jglue/<task>-v1.1/{train,valid}-v1.x.json``: JSON lines, JSQuAD in SQuAD JSON).

Regenerate the committed sample: ``python -m synth.ja`` (writes ``data/sample-ja/``).
"""

from __future__ import annotations

import json
import os

from synth.cjk import SAMPLE_ROOT, CJKWorld, Language, jsonl, qa_article, split_rows, squad_json
from synth.cjk import write_language_sample as _write
from synth.world import derive_rng

SAMPLE_DIR = SAMPLE_ROOT / "sample-ja"

NAMESPACES = (
    (-2, "メディア"), (-1, "特別"), (0, ""), (1, "ノート"), (2, "利用者"), (3, "利用者‐会話"),
    (4, "Wikipedia"), (5, "Wikipedia‐ノート"), (6, "ファイル"), (7, "ファイル‐ノート"),
    (10, "Template"), (11, "Template‐ノート"), (14, "Category"), (15, "Category‐ノート"),
)  # fmt: skip
PARTS = (
    ("青", "あお"), ("白", "しら"), ("石", "いし"), ("山", "やま"), ("川", "かわ"), ("森", "もり"),
    ("松", "まつ"), ("竹", "たけ"), ("桜", "さくら"), ("鶴", "つる"), ("北", "きた"), ("南", "みなみ"),
    ("東", "ひがし"), ("西", "にし"), ("大", "おお"), ("高", "たか"), ("浜", "はま"), ("岡", "おか"),
    ("野", "の"), ("原", "はら"), ("沢", "さわ"), ("宮", "みや"), ("島", "しま"), ("谷", "たに"),
)  # fmt: skip
SURNAMES = (
    ("佐藤", "さとう"), ("鈴木", "すずき"), ("高橋", "たかはし"), ("田中", "たなか"), ("渡辺", "わたなべ"),
    ("伊藤", "いとう"), ("山本", "やまもと"), ("中村", "なかむら"), ("小林", "こばやし"), ("加藤", "かとう"),
    ("吉田", "よしだ"), ("山田", "やまだ"), ("松本", "まつもと"), ("井上", "いのうえ"), ("木村", "きむら"),
)  # fmt: skip
GIVEN = (
    ("花子", "はなこ"), ("太郎", "たろう"), ("健一", "けんいち"), ("美咲", "みさき"), ("翔太", "しょうた"),
    ("陽子", "ようこ"), ("誠", "まこと"), ("直樹", "なおき"), ("優子", "ゆうこ"), ("大輔", "だいすけ"),
    ("由美", "ゆみ"), ("拓也", "たくや"), ("明美", "あけみ"), ("修", "おさむ"),
)  # fmt: skip
KINDS = (("町", "まち"), ("市", "し"), ("村", "むら"))
REGIONS = ("青葉県", "北浜県", "白峰県", "東雲県", "若草県")
RIVERS = ("緑川", "霧川", "澄川", "鏡川", "白糸川", "朝日川")
PRODUCTS = ("りんご", "みかん", "緑茶", "日本酒", "陶器", "和紙", "漆器", "梨", "蕎麦", "昆布", "真珠", "桃")
FEATURES = ("城跡", "五重塔", "温泉", "灯台", "古い石橋", "植物園", "美術館")
OCCUPATIONS = ("小説家", "画家", "作曲家", "政治家", "建築家", "俳人", "陶芸家")
WORK_A = ("春", "海", "月", "風", "雪", "星", "道", "庭")
WORK_B = ("の記憶", "の詩", "を待つ人", "の向こう", "と少年", "の物語")
FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")


def _work_title(rng) -> str:
    return rng.choice(WORK_A) + rng.choice(WORK_B)


def fact_sentences(t) -> dict[str, str]:
    """The facts of a town as plain sentences: the corpus and the tasks say the same things."""
    return {
        "region": f"{t.name}は{t.region}にある{t.name[-1]}である。",
        "founded": f"{t.name}は{t.founded}年に成立した。",
        "population": f"{t.name}の人口は約{t.population}人である。",
        "product": f"{t.name}の名産は{t.product}である。",
        "river": f"{t.name}は{t.river}の流域に位置する。",
        "mayor": f"{t.name}の首長は{t.mayor}である。",
        "feature": f"{t.name}には{t.feature}がある。",
    }


EVENTS = (
    "{y}年には大きな洪水があり、{r}の堤防が築かれた。", "{y}年に鉄道が開通し、{n}駅が開業した。",
    "{y}年に{w}と姉妹都市の提携を結んだ。", "{y}年、町の中心部で大火があった。", "{y}年に{n}立図書館が開館した。",
    "{y}年の合併により、現在の{n}が成立した。", "{y}年に{f}が国の文化財に指定された。",
    "{y}年から{p}の栽培が盛んになった。", "{y}年に新しい橋が{r}に架けられた。",
    "{y}年、{n}出身の力士が横綱に昇進した。",
)  # fmt: skip
CLIMATE = ("冬は雪が多く、夏は比較的涼しい。", "一年を通して温暖で、雨が多い。", "夏は暑く、冬は乾燥した晴天が続く。",
           "山に囲まれているため、霧の出る日が多い。")  # fmt: skip
TRAFFIC = ("町内には{r}に沿って国道が通っている。", "最寄りの空港からはバスで約一時間かかる。",
           "{w}との間には定期バスが運行されている。", "{n}駅からは特急列車が発着する。")  # fmt: skip


def _pool(rng, pool, k: int, **names) -> str:
    return "".join(p.format(y=rng.randrange(1700, 2020), **names) for p in rng.sample(pool, k))


def town_article(world: CJKWorld, t, rng) -> str:
    names = {"n": t.name, "r": t.river, "w": t.twin, "f": t.feature, "p": t.product}
    events = _pool(rng, EVENTS, 4, **names)
    climate = rng.choice(CLIMATE) + _pool(rng, TRAFFIC, 2, **names)
    pop = str(t.population).translate(FULLWIDTH) if rng.random() < 0.3 else str(t.population)
    lead = (
        f"'''{{{{読み仮名|{t.name}|{t.reading}}}}}'''は、{t.region}の北部にある{t.name[-1]}。"
        f"{t.river}の流域に位置する。<ref>{{{{Cite web|url=http://example.org/{t.key}|title={t.name}の概要}}}}</ref>"
    )
    history = (
        f"{t.name}は{t.founded}年に成立した。古くは<ruby>{t.name}<rp>（</rp><rt>{t.reading}</rt><rp>）</rp></ruby>"
        f"村と呼ばれていた{{{{要出典|date=2020年1月}}}}。地元では「{t.product}の{t.name[-1]}。{t.river}の{t.name[-1]}。」"
        f"と呼ばれている。人口は約{pop}人である。"
    )
    economy = (
        f"名産は{t.product}で、毎年秋には{t.product}の祭りが開かれる。"
        f"{t.name}の{t.product}は{{{{lang|en|{t.reading}}}}}の名で海外にも知られる！"
        f"現在の首長は[[{t.mayor}]]である。[[{t.twin}]]と姉妹都市の関係にある。"
    )
    sights = (
        f"町の中心には{t.feature}があり、多くの観光客が訪れる。"
        f"{t.feature}は{{{{仮リンク|{t.name}文化財保存会|en|Cultural Society}}}}が管理している。"
        f"[[ファイル:{t.name}.jpg|thumb|{t.name}の{t.feature}]]"
    )
    return (
        "{{基礎情報 日本の市町村\n"
        f"|画像 = {t.name}.jpg\n|名称 = {t.name}\n|人口 = {t.population}\n|県 = {t.region}\n}}}}\n"
        f"{lead}\n\n== 歴史 ==\n{history}\n\n{events}\n\n== 地理 ==\n{climate}\n\n"
        f"== 産業 ==\n{economy}\n\n== 観光 ==\n{sights}\n\n"
        '{| class="wikitable"\n! 年 !! 人口\n|-\n| 2000 || ' + str(t.population - 100) + "\n|}\n\n"
        f"== 脚注 ==\n{{{{Reflist}}}}\n\n== 関連項目 ==\n* [[{t.region}]]\n* [[{t.river}]]\n\n"
        f"== 外部リンク ==\n* [http://example.org/{t.key} {t.name}公式サイト]\n\n"
        f"[[Category:{t.region}の市町村]]\n[[カテゴリ:{t.product}の産地]]\n"
    )


LIFE = (
    "{y}年に上京し、大学で{o}としての修業を積んだ。", "{y}年に結婚し、二人の子どもをもうけた。",
    "{y}年に{t}の名誉町民に選ばれた。", "晩年は{t}に戻り、後進の指導にあたった。", "{y}年に大きな賞を受賞した。",
    "作品の多くは{t}の美術館に収められている。", "{y}年には海外で個展を開いた。",
)  # fmt: skip


def person_article(world: CJKWorld, p, rng) -> str:
    town = world.town(p.town)
    life = "".join(
        x.format(y=rng.randrange(p.born + 18, p.born + 80), o=p.occupation, t=p.town) for x in rng.sample(LIFE, 3)
    )
    return (
        f"'''{{{{読み仮名|{p.name}|{p.reading}}}}}'''（{p.born}年 - ）は、日本の{p.occupation}。"
        f"[[{p.town}]]出身。代表作は『{p.work}』。\n\n== 経歴 ==\n"
        f"{p.born + 20}年に『{p.work}』を発表し、広く知られるようになった。"
        f"故郷の{town.feature}を題材にした作品も多い。「{p.work}は故郷の歌だ。」と語っている。{life}\n\n"
        f"== 作品 ==\n* 『{p.work}』\n\n[[Category:日本の{p.occupation}]]\n"
    )


def extra_pages(world: CJKWorld, rng):
    t = world.towns[0]
    yield f"ノート:{t.name}", 1, "== 人口について ==\n出典が必要です。--[[利用者:Synth|Synth]] 2020年1月1日\n"
    yield "Template:基礎情報 日本の市町村", 10, "{{{名称}}}の基礎情報\n<noinclude>[[Category:基礎情報]]</noinclude>\n"
    yield f"Category:{t.region}の市町村", 14, f"{t.region}にある市町村の一覧。\n"
    yield "ファイル:Sample.jpg", 6, "== 概要 ==\n{{Information|description=風景}}\n"
    for k in range(3):
        a = world.towns[k]
        yield (
            f"{a.name[:-1]} (曖昧さ回避)",
            0,
            f"'''{a.name[:-1]}'''\n* [[{a.name}]] - {a.region}の{a.name[-1]}\n* [[{a.river}]]\n{{{{Aimai}}}}\n",
        )


def book(world: CJKWorld, index: int, rng) -> tuple[str, str]:
    towns = [world.towns[(index * 17 + k * 5) % len(world.towns)] for k in range(30)]
    title = f"{towns[0].region}紀行 第{index + 1}巻"
    paras = [title, ""]
    for k, t in enumerate(towns):
        year = 1950 + (index * 7 + k) % 60
        paras.append(
            f"　第{k + 1}章　{t.name}\n\n"
            f"　{t.name}を訪れたのは{year}年の春だった。{t.river}に沿って歩くと、{t.feature}が見えてくる。"
            f"宿の主人は「ここの{t.product}は日本一です。ぜひ食べていってください。」と笑った。"
            f"{t.name}の人口は約{t.population}人で、町の人々はみな親切であった。\n\n"
            f"　翌朝、{t.mayor}という人に会った。{t.mayor}は{t.name}の首長で、{t.twin}との交流に力を入れているという。"
            f"「{t.twin}とは古い付き合いです。」と彼は言った。私は{t.product}を土産に買い、次の町へ向かった。"
        )
    return f"{towns[0].reading}-kikou-{index + 1}", "\n\n".join(paras) + "\n"


LANG = Language(
    code="ja", dbname="jawiki", sitename="ウィキペディア", namespaces=NAMESPACES, name_parts=PARTS,
    surnames=SURNAMES, given=GIVEN, town_kinds=KINDS, regions=REGIONS, rivers=RIVERS, products=PRODUCTS,
    features=FEATURES, occupations=OCCUPATIONS, article=town_article, person_article=person_article,
    extra_pages=extra_pages, book=book, redirect="#転送", extra={"work_title": _work_title},
)  # fmt: skip


# -- JGLUE ---------------------------------------------------------------------------------------
POSITIVE = ("とても美味しくて、また買いたいと思いました。", "品質が良く、家族にも好評でした。", "値段の割に満足です。",
            "香りが素晴らしく、贈り物に最適です。")  # fmt: skip
NEGATIVE = ("期待外れで、二度と買いません。", "届いた時には傷んでいました。", "味が薄く、がっかりしました。",
            "値段が高すぎて、満足できませんでした。")  # fmt: skip


def marc_ja(world: CJKWorld) -> list[dict]:
    rng = derive_rng(world.seed, "ja", "marc")
    rows = []
    for i in range(700):
        t = rng.choice(world.towns)
        positive = rng.random() < 0.5
        phrase = rng.choice(POSITIVE if positive else NEGATIVE)
        rows.append({"sentence": f"{t.name}の{t.product}を買いました。{phrase}",
                     "label": "positive" if positive else "negative", "review_id": f"R{i:06d}"})  # fmt: skip
    return rows


def jsts(world: CJKWorld) -> list[dict]:
    rng = derive_rng(world.seed, "ja", "jsts")
    rows = []
    for i in range(700):
        t = rng.choice(world.towns)
        facts = fact_sentences(t)
        key = rng.choice(sorted(facts))
        kind = rng.random()
        if kind < 0.34:
            s2, score = _paraphrase(t, key), rng.choice((4.2, 4.6, 5.0))
        elif kind < 0.67:
            s2, score = facts[rng.choice([k for k in sorted(facts) if k != key])], rng.choice((1.4, 2.0, 2.4))
        else:
            other = rng.choice([o for o in world.towns if o.name != t.name])
            s2, score = fact_sentences(other)[key], rng.choice((0.0, 0.4, 0.8))
        rows.append({"sentence_pair_id": str(i), "yjcaptions_id": f"{i}-{i + 1}",
                     "sentence1": facts[key], "sentence2": s2, "label": score})  # fmt: skip
    return rows


def _paraphrase(t, key: str) -> str:
    return {
        "region": f"{t.region}には{t.name}という{t.name[-1]}がある。",
        "founded": f"{t.founded}年、{t.name}が成立した。",
        "population": f"約{t.population}人が{t.name}に住んでいる。",
        "product": f"{t.product}は{t.name}の名産品だ。",
        "river": f"{t.river}の流域に{t.name}がある。",
        "mayor": f"{t.mayor}が{t.name}の首長を務めている。",
        "feature": f"{t.feature}は{t.name}にある。",
    }[key]


def jnli(world: CJKWorld) -> list[dict]:
    rng = derive_rng(world.seed, "ja", "jnli")
    rows = []
    for i in range(900):
        t = rng.choice(world.towns)
        premise = f"{t.name}は{t.founded}年に成立した{t.name[-1]}で、名産は{t.product}である。"
        label = ("entailment", "contradiction", "neutral")[i % 3]
        if label == "entailment":
            hyp = rng.choice((f"{t.name}の名産は{t.product}である。", f"{t.name}は{t.founded}年に成立した。"))
        elif label == "contradiction":
            wrong = rng.choice([p for p in PRODUCTS if p != t.product])
            hyp = rng.choice((f"{t.name}の名産は{wrong}である。", f"{t.name}は{t.founded + 13}年に成立した。"))
        else:
            hyp = rng.choice((f"{t.name}には{t.feature}がある。", f"{t.name}の首長は{t.mayor}である。"))
        rows.append({"sentence_pair_id": str(i), "yjcaptions_id": f"{i}-{i}",
                     "sentence1": premise, "sentence2": hyp, "label": label})  # fmt: skip
    return rows


def jsquad(world: CJKWorld) -> list[dict]:
    articles = []
    for t in world.towns:
        body = (
            f"{t.name}は{t.region}にある{t.name[-1]}で、{t.river}の流域に位置する。{t.founded}年に成立した。"
            f"名産は{t.product}で、町の中心には{t.feature}がある。現在の首長は{t.mayor}である。"
        )
        context = f"{t.name} [SEP] {body}"
        qas = [
            (f"a{t.key}p0q0", f"{t.name}の名産は何か。", t.product),
            (f"a{t.key}p0q1", f"{t.name}はどの川の流域にあるか？", t.river),
            (f"a{t.key}p0q2", f"{t.name}が成立したのは何年か。", f"{t.founded}年"),
            (f"a{t.key}p0q3", f"{t.name}の首長は誰か。", t.mayor),
            (f"a{t.key}p0q4", f"{t.name}の中心には何があるか？", t.feature),
        ]
        articles.append(
            qa_article(t.name, [(context, qas)],
                       lambda qid, q, ans: {"question": q, "id": qid, "answers": ans * 2, "is_impossible": False})
        )  # fmt: skip
    return articles


def jcommonsenseqa(world: CJKWorld) -> list[dict]:
    rng = derive_rng(world.seed, "ja", "jcqa")
    rows = []
    for i in range(600):
        t = rng.choice(world.towns)
        if i % 2:
            question, answer = f"{t.name}の名産として知られるものは？", t.product
            wrong = [p for p in PRODUCTS if p != t.product]
        else:
            question, answer = f"{t.name}が流域に位置する川は？", t.river
            wrong = [r for r in RIVERS if r != t.river]
        choices = rng.sample(wrong, 4) + [answer]
        rng.shuffle(choices)
        rows.append({"q_id": i, "question": question, **{f"choice{k}": c for k, c in enumerate(choices)},
                     "label": choices.index(answer)})  # fmt: skip
    return rows


def downstream(world: CJKWorld) -> dict[str, bytes]:
    """JGLUE's five tasks, file names as the JGLUE repository has them (``datasets/``)."""
    rng = derive_rng(world.seed, "ja", "splits")
    files = {}
    for folder, rows, dev, version in (
        ("marc_ja-v1.1", marc_ja(world), 150, "1.0"),
        ("jsts-v1.1", jsts(world), 150, "1.1"),
        ("jnli-v1.1", jnli(world), 150, "1.1"),
        ("jcommonsenseqa-v1.1", jcommonsenseqa(world), 120, "1.1"),
    ):
        train, valid = split_rows(rows, dev, rng)
        files[f"jglue/{folder}/train-v{version}.json"] = jsonl(train)
        files[f"jglue/{folder}/valid-v{version}.json"] = jsonl(valid)
    train, valid = split_rows(jsquad(world), len(world.towns) // 5, rng)
    files["jglue/jsquad-v1.1/train-v1.1.json"] = squad_json(train, "v1.1")
    files["jglue/jsquad-v1.1/valid-v1.1.json"] = squad_json(valid, "v1.1")
    return files


def write_sample(out_dir: str = str(SAMPLE_DIR)) -> dict:
    return _write(LANG, downstream, out_dir, seed=0, towns=200, people=160, books=6)


if __name__ == "__main__":  # regenerate the committed sample: python -m synth.ja
    print(json.dumps(write_sample(os.fspath(SAMPLE_DIR)), indent=2, ensure_ascii=False))
