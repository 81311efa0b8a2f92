"""The Chinese sample: a zhwiki-style export (its namespaces and their Chinese aliases in links,
{{lang}}, {{le}}, {{NoteTA}}, ``-{...}-`` variant markup, full-width punctuation), books, and the
CLUE classification tasks and CMRC 2018 in CLUE's files (``clue/<task>_public/{train,dev}.json``:
JSON lines; CMRC 2018 in SQuAD JSON).

Regenerate the committed sample: ``python -m synth.zh`` (writes ``data/sample-zh/``).
"""

from __future__ import annotations

import json
import os

from synth.cjk import SAMPLE_ROOT, CJKWorld, Language, jsonl, qa_article, split_rows, squad_json
from synth.cjk import write_language_sample as _write
from synth.world import derive_rng

SAMPLE_DIR = SAMPLE_ROOT / "sample-zh"

NAMESPACES = (
    (-2, "Media"), (-1, "Special"), (0, ""), (1, "Talk"), (2, "User"), (3, "User talk"), (4, "Wikipedia"),
    (5, "Wikipedia talk"), (6, "File"), (7, "File talk"), (10, "Template"), (11, "Template talk"),
    (14, "Category"), (15, "Category talk"),
)  # fmt: skip
PARTS = (
    ("青", "qing"), ("白", "bai"), ("石", "shi"), ("山", "shan"), ("河", "he"), ("林", "lin"), ("松", "song"),
    ("竹", "zhu"), ("桃", "tao"), ("鹤", "he"), ("北", "bei"), ("南", "nan"), ("东", "dong"), ("西", "xi"),
    ("大", "da"), ("高", "gao"), ("海", "hai"), ("安", "an"), ("平", "ping"), ("宁", "ning"), ("龙", "long"),
    ("凤", "feng"), ("金", "jin"), ("云", "yun"),
)  # fmt: skip
SURNAMES = (
    ("王", "wang"), ("李", "li"), ("张", "zhang"), ("刘", "liu"), ("陈", "chen"), ("杨", "yang"), ("赵", "zhao"),
    ("黄", "huang"), ("周", "zhou"), ("吴", "wu"), ("徐", "xu"), ("孙", "sun"),
)  # fmt: skip
GIVEN = (
    ("明", "ming"), ("华", "hua"), ("丽", "li"), ("强", "qiang"), ("伟", "wei"), ("芳", "fang"), ("军", "jun"),
    ("静", "jing"), ("小明", "xiaoming"), ("建国", "jianguo"), ("秀英", "xiuying"), ("志强", "zhiqiang"),
    ("海燕", "haiyan"), ("国栋", "guodong"), ("晓红", "xiaohong"), ("文博", "wenbo"), ("雪梅", "xuemei"),
)  # fmt: skip
KINDS = (("镇", "zhen"), ("县", "xian"), ("市", "shi"))
REGIONS = ("青州省", "云岭省", "东海省", "北原省", "南川省")
RIVERS = ("清河", "白水河", "碧江", "云江", "金沙河", "玉带河")
PRODUCTS = ("茶叶", "丝绸", "瓷器", "柑橘", "荔枝", "白酒", "竹器", "剪纸", "黄酒", "蜂蜜", "桂花糕", "豆腐")
FEATURES = ("古塔", "石桥", "温泉", "博物馆", "古城墙", "植物园", "书院")
OCCUPATIONS = ("作家", "画家", "作曲家", "政治家", "建筑师", "诗人", "书法家")
WORK_A = ("春", "江", "月", "风", "雪", "山", "路", "园")
WORK_B = ("之歌", "的记忆", "夜话", "纪事", "与少年", "故事")
TNEWS = (("101", "news_culture"), ("103", "news_sports"), ("104", "news_finance"), ("112", "news_travel"),
         ("115", "news_agriculture"))  # fmt: skip
TNEWS_HEADLINES = {
    "101": ("{t}举办{p}文化节，书法展吸引众多市民", "{t}书院修复完成，古籍展览今日开幕"),
    "103": ("{t}马拉松鸣枪开跑，万名选手参赛", "{t}足球队夺得省联赛冠军"),
    "104": ("{t}{p}出口额创新高，企业利润增长", "{t}发行债券，融资用于基础设施建设"),
    "112": ("{t}{f}成网红打卡地，游客络绎不绝", "五一假期去哪玩？{t}{f}值得一游"),
    "115": ("{t}{p}迎来丰收，农民喜笑颜开", "{t}推广{p}种植新技术，亩产提高两成"),
}
IFLYTEK = (("0", "打车"), ("1", "地图导航"), ("2", "免费WIFI"), ("3", "租车"), ("4", "同城服务"))
IFLYTEK_TEXT = {
    "0": "一款在{t}叫车出行的应用，司机接单快，价格透明，支持在线支付。",
    "1": "提供{t}及周边的实时路况和导航，帮你找到去{f}的最佳路线。",
    "2": "自动连接{t}的免费无线网络，一键上网，安全省流量。",
    "3": "在{t}租车自驾，多种车型可选，门店取车还车方便。",
    "4": "{t}本地生活服务平台，家政、跑腿、维修一站搞定。",
}


def _join_reading(parts) -> str:
    return " ".join(p.capitalize() for p in ("".join(parts[:-1]), parts[-1]))


def _work_title(rng) -> str:
    return rng.choice(WORK_A) + rng.choice(WORK_B)


EVENTS = (
    "{y}年发生大洪水，随后在{r}修筑了堤坝。", "{y}年铁路通车，{n}站正式启用。", "{y}年与{w}缔结友好关系。",
    "{y}年城中心发生大火。", "{y}年{n}图书馆建成开放。", "{y}年经过合并，形成了今天的{n}。",
    "{y}年{f}被列为重点文物保护单位。", "{y}年起{p}的种植逐渐兴盛。", "{y}年{r}上建起了一座新桥。",
    "{y}年{n}举办了第一届{p}博览会。",
)  # fmt: skip
CLIMATE = ("冬季多雪，夏季凉爽。", "全年气候温和，雨水充沛。", "夏季炎热，冬季干燥少雨。", "四面环山，常年多雾。")
TRAFFIC = (
    "国道沿{r}穿过境内。",
    "从最近的机场乘大巴约需一小时。",
    "与{w}之间有定期班车。",
    "{n}站每天有多趟特快列车停靠。",
)


def _pool(rng, pool, k: int, **names) -> str:
    return "".join(p.format(y=rng.randrange(1700, 2020), **names) for p in rng.sample(pool, k))


def town_article(world: CJKWorld, t, rng) -> str:
    kind = t.name[-1]
    names = {"n": t.name, "r": t.river, "w": t.twin, "f": t.feature, "p": t.product}
    events = _pool(rng, EVENTS, 4, **names)
    climate = rng.choice(CLIMATE) + _pool(rng, TRAFFIC, 2, **names)
    return (
        "{{NoteTA|G1=地名|1=zh-hans:" + t.name + ";zh-hant:" + t.name + ";}}\n"
        "{{Infobox settlement\n|name = " + t.name + "\n|population = " + str(t.population) + "\n}}\n"
        f"'''{t.name}'''（{{{{lang|en|{t.reading}}}}}）是{t.region}下辖的一个{kind}，位于{t.river}流域。"
        f"<ref>{{{{cite web|url=http://example.org/zh/{t.key}|title={t.name}概况}}}}</ref>\n\n"
        f"== 历史 ==\n{t.name}始建于{t.founded}年。当地人称之为「{t.product}之乡。{t.river}之畔。」"
        f"{{{{来源请求|time=2020-01-01}}}}，-{{{t.name}}}-之名由此而来。{events}\n\n== 地理 ==\n{climate}\n\n"
        f"== 经济 ==\n{t.name}的特产是{t.product}，每年秋天都会举办{t.product}节。"
        f"当地的-{{zh-hans:计算机;zh-hant:電腦;}}-产业也在发展。现任{kind}长为[[{t.mayor}]]。"
        f"{t.name}与[[{t.twin}]]结为{{{{le|友好城市|Sister city}}}}。\n\n"
        f"== 人口 ==\n{t.name}人口约为{t.population}人！[[File:{t.name}.jpg|thumb|{t.name}的{t.feature}]]"
        f"[[文件:{t.name}2.png|缩略图|{t.name}全景]]\n\n"
        f"== 名胜 ==\n{t.name}中心有一座{t.feature}，吸引了许多游客。\n\n"
        '{| class="wikitable"\n! 年份 !! 人口\n|-\n| 2000 || ' + str(t.population - 100) + "\n|}\n\n"
        "== 参考文献 ==\n{{reflist}}\n\n== 参见 ==\n* [[" + t.region + "]]\n\n"
        f"== 外部链接 ==\n* [http://example.org/zh/{t.key} {t.name}官方网站]\n\n"
        f"[[Category:{t.region}行政区划]]\n[[分类:{t.product}产地]]\n"
    )


LIFE = (
    "{y}年进京求学，开始了{o}生涯。", "{y}年结婚，育有两个孩子。", "{y}年被授予{t}荣誉市民称号。",
    "晚年回到{t}，致力于培养后辈。", "{y}年获得重要奖项。", "他的许多作品收藏在{t}博物馆。",
    "{y}年在海外举办个人展览。",
)  # fmt: skip


def person_article(world: CJKWorld, p, rng) -> str:
    town = world.town(p.town)
    life = "".join(
        x.format(y=rng.randrange(p.born + 18, p.born + 80), o=p.occupation, t=p.town) for x in rng.sample(LIFE, 3)
    )
    return (
        f"'''{p.name}'''（{{{{lang|en|{p.reading}}}}}，{p.born}年—），中国{p.occupation}，[[{p.town}]]人。"
        f"代表作为《{p.work}》。\n\n== 生平 ==\n{p.born + 20}年发表《{p.work}》，广为人知。"
        f"他的许多作品以家乡的{town.feature}为题材。他曾说：「《{p.work}》是写给家乡的歌。」{life}\n\n"
        f"[[Category:中国{p.occupation}]]\n"
    )


def extra_pages(world: CJKWorld, rng):
    t = world.towns[0]
    yield f"Talk:{t.name}", 1, "== 人口数据 ==\n请补充来源。--[[User:Synth|Synth]] 2020年1月1日\n"
    yield "Template:Infobox settlement", 10, "{{{name}}}\n<noinclude>[[Category:信息框]]</noinclude>\n"
    yield f"Category:{t.region}行政区划", 14, f"{t.region}的行政区划。\n"
    for k in range(3):
        a = world.towns[k]
        yield (
            f"{a.name[:-1]} (消歧义)",
            0,
            f"'''{a.name[:-1]}'''可以指：\n* [[{a.name}]]\n* [[{a.river}]]\n{{{{disambig}}}}\n",
        )


def book(world: CJKWorld, index: int, rng) -> tuple[str, str]:
    towns = [world.towns[(index * 17 + k * 5) % len(world.towns)] for k in range(30)]
    paras = [f"{towns[0].region}游记 第{index + 1}卷", ""]
    for k, t in enumerate(towns):
        year = 1950 + (index * 7 + k) % 60
        paras.append(
            f"第{k + 1}章　{t.name}\n\n"
            f"　　{year}年春天，我来到了{t.name}。沿着{t.river}走，远远就能看见{t.feature}。"
            f"客栈老板笑着说：「我们这里的{t.product}是全省最好的。您一定要尝一尝。」"
            f"{t.name}大约有{t.population}人，这里的人都很热情。\n\n"
            f"　　第二天，我见到了{t.mayor}。{t.mayor}是{t.name}的{t.name[-1]}长，正在推动与{t.twin}的交流。"
            f"「我们和{t.twin}是老朋友了。」他说。我买了一些{t.product}，便动身前往下一个地方。"
        )
    return f"{towns[0].reading.replace(' ', '-').lower()}-youji-{index + 1}", "\n\n".join(paras) + "\n"


LANG = Language(
    code="zh", dbname="zhwiki", sitename="维基百科", namespaces=NAMESPACES, name_parts=PARTS,
    surnames=SURNAMES, given=GIVEN, town_kinds=KINDS, regions=REGIONS, rivers=RIVERS, products=PRODUCTS,
    features=FEATURES, occupations=OCCUPATIONS, article=town_article, person_article=person_article,
    extra_pages=extra_pages, book=book, redirect="#重定向",
    extra={"work_title": _work_title, "join_reading": _join_reading},
)  # fmt: skip


# -- CLUE and CMRC 2018 --------------------------------------------------------------------------
def afqmc(world: CJKWorld) -> list[dict]:
    rng = derive_rng(world.seed, "zh", "afqmc")
    asks = (("{t}的特产是什么", "{t}有什么特产"), ("{t}在哪条河边", "{t}位于哪条河流域"),
            ("{t}是哪一年建立的", "{t}始建于哪一年"), ("{t}的{k}长是谁", "谁是{t}的{k}长"))  # fmt: skip
    rows = []
    for i in range(800):
        t = rng.choice(world.towns)
        a, b = rng.choice(asks)
        if i % 2:
            s2, label = b, "1"
        else:
            s2, label = rng.choice([x for x in asks if x[0] != a])[1], "0"
        rows.append({"sentence1": a.format(t=t.name, k=t.name[-1]), "sentence2": s2.format(t=t.name, k=t.name[-1]),
                     "label": label})  # fmt: skip
    return rows


def tnews(world: CJKWorld) -> list[dict]:
    rng = derive_rng(world.seed, "zh", "tnews")
    rows = []
    for i in range(800):
        t = rng.choice(world.towns)
        code, desc = TNEWS[i % len(TNEWS)]
        text = rng.choice(TNEWS_HEADLINES[code]).format(t=t.name, p=t.product, f=t.feature)
        rows.append({"label": code, "label_desc": desc, "sentence": text, "keywords": f"{t.name},{t.product}"})
    return rows


def iflytek(world: CJKWorld) -> list[dict]:
    rng = derive_rng(world.seed, "zh", "iflytek")
    rows = []
    for i in range(600):
        t = rng.choice(world.towns)
        code, desc = IFLYTEK[i % len(IFLYTEK)]
        rows.append({"label": code, "label_des": desc, "sentence": IFLYTEK_TEXT[code].format(t=t.name, f=t.feature)})
    return rows


def _nli(world: CJKWorld, salt: str, n: int) -> list[tuple[str, str, str]]:
    rng = derive_rng(world.seed, "zh", salt)
    out = []
    for i in range(n):
        t = rng.choice(world.towns)
        premise = f"{t.name}始建于{t.founded}年，特产是{t.product}。"
        label = ("entailment", "contradiction", "neutral")[i % 3]
        if label == "entailment":
            hyp = rng.choice((f"{t.name}的特产是{t.product}。", f"{t.name}建于{t.founded}年。"))
        elif label == "contradiction":
            wrong = rng.choice([p for p in PRODUCTS if p != t.product])
            hyp = rng.choice((f"{t.name}的特产是{wrong}。", f"{t.name}建于{t.founded + 21}年。"))
        else:
            hyp = rng.choice((f"{t.name}有一座{t.feature}。", f"{t.name}的{t.name[-1]}长是{t.mayor}。"))
        out.append((premise, hyp, label))
    return out


def cmnli(world: CJKWorld) -> list[dict]:
    return [{"sentence1": p, "sentence2": h, "label": y} for p, h, y in _nli(world, "cmnli", 900)]


def ocnli(world: CJKWorld) -> list[dict]:
    rows = []
    for i, (p, h, y) in enumerate(_nli(world, "ocnli", 900)):
        rows.append(
            {
                "level": "medium",
                "sentence1": p,
                "sentence2": h,
                "label": y,
                **{f"label{k}": y for k in range(5)},
                "genre": "news",
                "prem_id": f"news_{i // 3}",
                "id": i,
            }
        )
    rows[7]["label"] = "-"  # no majority among the annotators: OCNLI keeps such rows, scorers drop them
    return rows


def cluewsc(world: CJKWorld) -> list[dict]:
    rng = derive_rng(world.seed, "zh", "wsc")
    rows = []
    for i in range(500):
        a, b = rng.sample(world.people, 2)
        text = f"{a.name}把《{a.work}》送给了{b.name}，因为他很喜欢这本书。"
        pron = text.index("他")
        right = b if i % 2 else a
        span1 = text.index(right.name, text.index("给了") if right is b else 0)
        rows.append({"target": {"span2_index": pron, "span1_index": span1, "span1_text": right.name,
                                "span2_text": "他"}, "idx": i, "label": "true" if right is b else "false",
                     "text": text})  # fmt: skip
    return rows


def csl(world: CJKWorld) -> list[dict]:
    rng = derive_rng(world.seed, "zh", "csl")
    rows = []
    for i in range(600):
        t = rng.choice(world.towns)
        abst = (f"本文以{t.name}为例，研究了{t.river}流域{t.product}产业的发展，"
                f"分析了{t.feature}旅游对当地经济的影响，并提出了相应的建议。")  # fmt: skip
        keywords = [t.name, t.product, t.river]
        label = "1" if i % 2 else "0"
        if label == "0":
            keywords[rng.randrange(3)] = rng.choice([p for p in PRODUCTS if p != t.product]) + "贸易"
        rows.append({"id": i, "abst": abst, "keyword": keywords, "label": label})
    return rows


def cmrc2018(world: CJKWorld, split: str) -> list[dict]:
    articles = []
    for t in world.towns:
        pid = f"{split.upper()}_{t.key}"
        context = (
            f"{t.name}是{t.region}下辖的一个{t.name[-1]}，位于{t.river}流域，始建于{t.founded}年。"
            f"{t.name}的特产是{t.product}，中心有一座{t.feature}。现任{t.name[-1]}长为{t.mayor}。"
        )
        qas = [
            (f"{pid}_QUERY_0", f"{t.name}的特产是什么？", t.product),
            (f"{pid}_QUERY_1", f"{t.name}位于哪条河的流域？", t.river),
            (f"{pid}_QUERY_2", f"{t.name}始建于哪一年？", f"{t.founded}年"),
            (f"{pid}_QUERY_3", f"{t.name}的{t.name[-1]}长是谁？", t.mayor),
        ]
        art = qa_article(t.name, [(context, qas)], lambda qid, q, ans: {"question": q, "id": qid, "answers": ans})
        art["paragraphs"][0]["id"] = pid
        art["id"] = pid
        articles.append(art)
    return articles


def downstream(world: CJKWorld) -> dict[str, bytes]:
    """CLUE's classification tasks and CMRC 2018, named as the CLUE distribution names them."""
    rng = derive_rng(world.seed, "zh", "splits")
    files = {}
    for folder, rows, dev in (
        ("afqmc_public", afqmc(world), 150),
        ("tnews_public", tnews(world), 150),
        ("iflytek_public", iflytek(world), 120),
        ("cmnli_public", cmnli(world), 150),
        ("ocnli_public", ocnli(world), 150),
        ("cluewsc2020_public", cluewsc(world), 100),
        ("csl_public", csl(world), 120),
    ):
        train, dev_rows = split_rows(rows, dev, rng)
        files[f"clue/{folder}/train.json"] = jsonl(train)
        files[f"clue/{folder}/dev.json"] = jsonl(dev_rows)
    articles = cmrc2018(world, "train")
    train, dev = split_rows(articles, len(articles) // 5, rng)
    for art in dev:  # the official dev set has three answers a question
        for q in art["paragraphs"][0]["qas"]:
            text = q["answers"][0]["text"]
            q["answers"] = q["answers"] * 2 + ([{"text": text[:-1], "answer_start": q["answers"][0]["answer_start"]}]
                                               if text.endswith("年") else q["answers"][:1])  # fmt: skip
    files["clue/cmrc2018_public/train.json"] = squad_json(train, "v1.0")
    files["clue/cmrc2018_public/dev.json"] = squad_json(dev, "v1.0")
    return files


def write_sample(out_dir: str = str(SAMPLE_DIR)) -> dict:
    return _write(LANG, downstream, out_dir, seed=0, towns=200, people=160, books=6)


if __name__ == "__main__":  # regenerate the committed sample: python -m synth.zh
    print(json.dumps(write_sample(os.fspath(SAMPLE_DIR)), indent=2, ensure_ascii=False))
