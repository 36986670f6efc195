"""Evaluation and calibration pairs: the built-in multilingual set, JSONL loading, length-bucket balancing."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class EvalDataError(ValueError):
    """Bad evaluation or calibration pairs (reported as InvalidInput)."""


@dataclass(frozen=True)
class Pair:
    query: str
    text: str
    label: float | None = None


# --- the built-in set ------------------------------------------------------------------------------------------------
# Written for this project. Each query has relevant, partly relevant and unrelated texts, short and long, so that the
# FP32 ranking has structure the INT8 model must keep. Languages: en, de, fr, es, zh, ja, ru, pt, ar, it.

_LONG_EN_RAFT = (
    "Raft is a consensus algorithm designed to be easy to understand. A cluster elects a leader, and the leader "
    "accepts log entries from clients, replicates them on the other servers, and tells servers when it is safe to "
    "apply log entries to their state machines. Leader election uses randomized timeouts so that split votes are "
    "rare and resolved quickly. A server that has not heard from a leader within its election timeout becomes a "
    "candidate, increments its term and requests votes from the other servers; it wins if a majority grants their "
    "vote. Log replication works by the leader sending AppendEntries messages that carry the index and term of the "
    "entry that precedes the new ones, so a follower can reject entries that do not match its log, and the leader "
    "then backs up until the logs agree. An entry is committed once it is stored on a majority of servers, and the "
    "safety property guarantees that committed entries are never lost, because a candidate cannot win an election "
    "unless its log is at least as up to date as the logs of a majority of the cluster. Membership changes use joint "
    "consensus or single-server changes, and snapshots keep the log from growing without bound."
)
_LONG_EN_BREAD = (
    "To bake a sourdough loaf, start the evening before by feeding your starter so that it is active and bubbly in "
    "the morning. Mix flour and water and let them rest for an hour; this autolyse makes the dough extensible. Add "
    "the starter and salt, then perform a series of stretch and folds every half hour for the first two hours of "
    "bulk fermentation. When the dough has grown by about half and shows bubbles on the sides of the container, "
    "shape it gently into a tight ball, place it in a floured basket and let it proof in the refrigerator overnight. "
    "Bake it in a preheated Dutch oven at a high temperature with the lid on for twenty minutes, then remove the lid "
    "and bake until the crust is deeply browned. Let the bread cool completely before cutting it, or the crumb will "
    "be gummy. The flavour depends on the temperature of fermentation, the hydration of the dough and the flour."
)
_LONG_DE_KLIMA = (
    "Der Klimawandel beschreibt die langfristige Veränderung der Temperaturen und Wettermuster auf der Erde. Seit "
    "dem neunzehnten Jahrhundert ist vor allem der Mensch die Ursache, hauptsächlich durch die Verbrennung fossiler "
    "Brennstoffe wie Kohle, Öl und Gas, die Treibhausgase freisetzt. Diese Gase wirken wie eine Decke um die Erde, "
    "halten die Wärme der Sonne zurück und erhöhen die Temperaturen. Die Folgen sind unter anderem schmelzende "
    "Gletscher, ein steigender Meeresspiegel, häufigere Hitzewellen und Dürren sowie stärkere Niederschläge. Um die "
    "Erwärmung zu begrenzen, müssen die Emissionen rasch sinken: durch erneuerbare Energien, effizientere Gebäude, "
    "einen anderen Verkehr und den Schutz von Wäldern und Mooren, die Kohlenstoff speichern."
)
_LONG_ZH_TEA = (
    "中国茶的历史可以追溯到几千年以前。传说神农尝百草时发现了茶叶的解毒作用，此后茶逐渐从药用变成日常饮品。"
    "唐代陆羽写成《茶经》，系统地记录了茶的种植、采摘、制作和饮用方法，被后人尊为茶圣。宋代流行点茶和斗茶，"
    "人们把茶叶碾成细末，用沸水冲点并搅拌出沫饽。明代以后，散茶冲泡逐渐取代了团茶，形成了今天常见的泡茶方式。"
    "按照加工工艺的不同，中国茶通常分为绿茶、白茶、黄茶、青茶、红茶和黑茶六大类，每一类都有独特的香气和滋味。"
    "例如龙井属于绿茶，不经发酵，保留了清新的豆香；而普洱熟茶经过渥堆发酵，口感醇厚。"
)
_LONG_JA_SHINKANSEN = (
    "新幹線は日本の高速鉄道で、一九六四年の東京オリンピックに合わせて東京と新大阪の間で開業した。専用の線路を走り、"
    "踏切がないため、高い安全性と定時性を誇る。開業以来、乗客の死亡事故は一度も起きていない。車両は何度も改良され、"
    "現在の営業最高速度は時速三百キロを超える区間もある。地震の多い国であるため、早期地震検知システムが導入されており、"
    "大きな揺れが来る前に自動的に列車を減速させる。新幹線の成功は、世界各国の高速鉄道計画に大きな影響を与えた。"
)
_LONG_RU_SPACE = (
    "Двенадцатого апреля тысяча девятьсот шестьдесят первого года Юрий Гагарин на корабле «Восток» совершил первый "
    "в истории полёт человека в космическое пространство. Полёт продолжался сто восемь минут: корабль сделал один "
    "виток вокруг Земли и приземлился в Саратовской области. Гагарин катапультировался на высоте около семи "
    "километров и спустился на парашюте отдельно от спускаемого аппарата. Этот полёт стал важнейшим событием "
    "космической гонки между Советским Союзом и Соединёнными Штатами и сделал Гагарина всемирно известным."
)
_LONG_FR_VIN = (
    "La fermentation alcoolique est l'étape au cours de laquelle les levures transforment les sucres du raisin en "
    "alcool et en gaz carbonique. Pour les vins rouges, les peaux restent en contact avec le jus pendant la "
    "fermentation, ce qui permet d'extraire la couleur et les tanins; c'est la macération. Le vigneron contrôle la "
    "température de la cuve, car une fermentation trop chaude fait perdre des arômes et une fermentation trop froide "
    "peut s'arrêter. Ensuite, beaucoup de vins subissent une fermentation malolactique qui adoucit l'acidité, puis un "
    "élevage en cuve ou en fût de chêne avant la mise en bouteille."
)

_BUILTIN: list[tuple[str, list[tuple[str, float]]]] = [
    ("how does the raft consensus algorithm elect a leader", [
        (_LONG_EN_RAFT, 3.0),
        ("Raft servers start elections after a randomized timeout and the candidate with a majority of votes becomes leader.", 3.0),
        ("Paxos is another consensus protocol; Multi-Paxos also relies on a distinguished proposer.", 1.0),
        ("A river raft trip requires helmets, life jackets and an experienced guide.", 0.0),
        (_LONG_EN_BREAD, 0.0),
        ("Leader election in Kubernetes controllers uses a Lease object that replicas try to acquire.", 1.0),
        ("The stock market closed higher today.", 0.0),
    ]),
    ("best way to bake sourdough bread at home", [
        (_LONG_EN_BREAD, 3.0),
        ("Feed the starter, let the dough ferment slowly and bake it in a hot Dutch oven for a crisp crust.", 3.0),
        ("Bread machines knead and bake yeast bread automatically.", 1.0),
        ("Sourdough starter is a culture of wild yeast and lactic acid bacteria.", 2.0),
        (_LONG_EN_RAFT, 0.0),
        ("Der Hund schläft im Garten.", 0.0),
    ]),
    ("Was sind die Ursachen des Klimawandels?", [
        (_LONG_DE_KLIMA, 3.0),
        ("Hauptursache der Erderwärmung ist der Ausstoß von Treibhausgasen durch fossile Brennstoffe.", 3.0),
        ("Das Wetter morgen: sonnig mit einzelnen Wolken, bis zu 24 Grad.", 0.0),
        ("Climate change is mainly caused by burning coal, oil and gas.", 2.0),
        ("Die Bahn kündigt neue Fahrpläne für den Winter an.", 0.0),
        ("Wälder und Moore speichern Kohlenstoff und bremsen so die Erwärmung.", 1.0),
    ]),
    ("Comment fait-on la fermentation du vin rouge ?", [
        (_LONG_FR_VIN, 3.0),
        ("Les levures transforment le sucre du raisin en alcool; la macération donne la couleur au vin rouge.", 3.0),
        ("La bière est fabriquée à partir de malt d'orge et de houblon.", 1.0),
        ("Le musée du Louvre est le musée le plus visité au monde.", 0.0),
        ("Red wine gets its colour from the grape skins during fermentation.", 2.0),
        ("Il pleuvra demain sur la Bretagne.", 0.0),
    ]),
    ("¿Cuál es la capital de Argentina?", [
        ("Buenos Aires es la capital y la ciudad más poblada de la República Argentina.", 3.0),
        ("La capital de Chile es Santiago.", 1.0),
        ("Argentina es famosa por el tango, la carne asada y el fútbol.", 1.0),
        ("El río de la Plata separa Argentina de Uruguay.", 1.0),
        ("La fotosíntesis convierte la luz en energía química.", 0.0),
        ("Buenos Aires is the capital of Argentina.", 3.0),
    ]),
    ("中国茶有哪些种类？", [
        (_LONG_ZH_TEA, 3.0),
        ("中国茶按工艺分为绿茶、白茶、黄茶、青茶、红茶和黑茶六大类。", 3.0),
        ("咖啡起源于埃塞俄比亚，后来传到阿拉伯半岛。", 0.0),
        ("龙井是一种著名的绿茶，产于杭州西湖。", 2.0),
        ("今天北京的天气晴朗，气温二十五度。", 0.0),
        ("Green tea, oolong and black tea differ in how much the leaves are oxidised.", 2.0),
        (_LONG_JA_SHINKANSEN, 0.0),
    ]),
    ("新幹線はいつ開業しましたか", [
        (_LONG_JA_SHINKANSEN, 3.0),
        ("東海道新幹線は一九六四年十月一日に開業した。", 3.0),
        ("富士山は日本で一番高い山である。", 0.0),
        ("The Shinkansen opened in 1964, just before the Tokyo Olympics.", 3.0),
        ("寿司は酢飯と魚介類を組み合わせた料理だ。", 0.0),
        ("リニア中央新幹線は品川と名古屋を結ぶ計画である。", 1.0),
    ]),
    ("Кто первым полетел в космос?", [
        (_LONG_RU_SPACE, 3.0),
        ("Юрий Гагарин стал первым человеком в космосе в 1961 году.", 3.0),
        ("Нил Армстронг первым ступил на Луну в 1969 году.", 1.0),
        ("Москва — столица России.", 0.0),
        ("Рецепт борща: свёкла, капуста, картофель и мясо.", 0.0),
        ("Yuri Gagarin orbited the Earth aboard Vostok 1.", 3.0),
    ]),
    ("como funciona a fotossíntese", [
        ("A fotossíntese é o processo pelo qual as plantas usam a luz do sol, a água e o gás carbônico para produzir glicose e oxigênio.", 3.0),
        ("A clorofila absorve a luz vermelha e azul e reflete a verde.", 2.0),
        ("O futebol é o esporte mais popular do Brasil.", 0.0),
        ("As mitocôndrias produzem energia por respiração celular.", 1.0),
        ("Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.", 3.0),
        ("O Rio Amazonas é o maior rio do mundo em volume de água.", 0.0),
    ]),
    ("ما هي عاصمة مصر؟", [
        ("القاهرة هي عاصمة جمهورية مصر العربية وأكبر مدنها.", 3.0),
        ("الإسكندرية مدينة ساحلية على البحر الأبيض المتوسط.", 1.0),
        ("نهر النيل أطول نهر في العالم.", 1.0),
        ("Cairo is the capital of Egypt.", 3.0),
        ("كرة القدم رياضة شعبية في العالم العربي.", 0.0),
    ]),
    ("ricetta della pizza margherita", [
        ("La pizza margherita si prepara con impasto lievitato, pomodoro, mozzarella, basilico e olio d'oliva, cotta in forno molto caldo.", 3.0),
        ("La pizza napoletana ha un cornicione alto e morbido.", 2.0),
        ("Il Colosseo è un anfiteatro romano.", 0.0),
        ("Pasta alla carbonara: uova, guanciale, pecorino e pepe.", 1.0),
        ("Margherita pizza is topped with tomato, mozzarella and basil.", 3.0),
        ("Domani sciopero dei treni in tutta Italia.", 0.0),
    ]),
    ("what is the boiling point of water at sea level", [
        ("Water boils at 100 degrees Celsius (212 degrees Fahrenheit) at sea level.", 3.0),
        ("At high altitude water boils at a lower temperature because air pressure is lower.", 2.0),
        ("Ice melts at 0 degrees Celsius.", 1.0),
        ("Das Wasser kocht auf Meereshöhe bei 100 Grad Celsius.", 3.0),
        (_LONG_DE_KLIMA, 0.0),
        ("The Pacific is the largest ocean.", 0.0),
        ("水在标准大气压下的沸点是一百摄氏度。", 3.0),
    ]),
]


def builtin_pairs() -> list[Pair]:
    """The built-in evaluation set (several languages, short and long texts, graded labels)."""
    return [Pair(q, t, lab) for q, texts in _BUILTIN for (t, lab) in texts]


def default_pairs(seed: int = 0) -> list[Pair]:
    """The default evaluation set: the built-in pairs first, then every query against every other query's texts
    (label 0), in a seeded shuffle. 74 pairs cannot tell Spearman 0.99 from 0.995 (the 95 % interval is wider than
    the difference); the cross pairs (840 in all) narrow it, and their order lets the Job stop where its time budget
    says (any prefix is a balanced sample)."""
    base = builtin_pairs()
    by_query: dict[str, set[str]] = {}
    for p in base:
        by_query.setdefault(p.query, set()).add(p.text)
    texts = list(dict.fromkeys(p.text for p in base))
    cross = [Pair(q, t, 0.0) for q in by_query for t in texts if t not in by_query[q]]
    random.Random(seed).shuffle(cross)
    return base + cross


# --- JSONL ------------------------------------------------------------------------------------------------------------
def parse_jsonl(lines: Iterable[str], source: str = "<input>") -> list[Pair]:
    """Read pairs: one JSON object per line, ``{"query": str, "text": str, "label"?: number}``.

    ``{"query": str, "texts": [str, ...]}`` is accepted as shorthand for several pairs. Blank lines are skipped.
    """
    pairs: list[Pair] = []
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalDataError(f"{source}:{n}: not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise EvalDataError(f"{source}:{n}: expected an object")
        q = obj.get("query")
        if not isinstance(q, str) or not q.strip():
            raise EvalDataError(f"{source}:{n}: 'query' must be a non-empty string")
        label = obj.get("label")
        if label is not None and (isinstance(label, bool) or not isinstance(label, (int, float))):
            raise EvalDataError(f"{source}:{n}: 'label' must be a number")
        if "texts" in obj:
            texts = obj["texts"]
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
                raise EvalDataError(f"{source}:{n}: 'texts' must be a non-empty list of strings")
            pairs.extend(Pair(q, t, None) for t in texts)
            continue
        t = obj.get("text")
        if not isinstance(t, str) or not t:
            raise EvalDataError(f"{source}:{n}: 'text' must be a non-empty string")
        pairs.append(Pair(q, t, None if label is None else float(label)))
    return pairs


def load_jsonl(path: str, min_pairs: int = 2) -> list[Pair]:
    try:
        with open(path, encoding="utf-8") as f:
            pairs = parse_jsonl(f, source=path)
    except OSError as exc:
        raise EvalDataError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise EvalDataError(f"{path}: not UTF-8") from None
    if len(pairs) < min_pairs:
        raise EvalDataError(f"{path}: {len(pairs)} pairs, need at least {min_pairs}")
    return pairs


# --- balancing ----------------------------------------------------------------------------------------------------
DEFAULT_BUCKET_EDGES = (32, 64, 128, 256)


def bucket_of(length: int, edges: Sequence[int] = DEFAULT_BUCKET_EDGES) -> int:
    """Index of the length bucket: ``[0, e0)`` is 0, ``[e0, e1)`` is 1, ..., ``>= e_last`` is ``len(edges)``."""
    for i, e in enumerate(edges):
        if length < e:
            return i
    return len(edges)


def balance_by_length(lengths: Sequence[int], n: int, edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
                      seed: int = 0) -> list[int]:
    """Pick up to ``n`` indices so every non-empty length bucket is represented as equally as its size allows.

    Round-robin over buckets (each shuffled with ``seed``); a bucket that runs out leaves its share to the others.
    A calibration set that is all short queries (or all long documents) sets activation ranges that do not fit the
    traffic; this keeps short and long inputs in proportion.
    """
    rng = random.Random(seed)
    buckets: dict[int, list[int]] = {}
    for i, ln in enumerate(lengths):
        buckets.setdefault(bucket_of(int(ln), edges), []).append(i)
    queues = []
    for b in sorted(buckets):
        idx = buckets[b][:]
        rng.shuffle(idx)
        queues.append(idx)
    out: list[int] = []
    n = max(0, int(n))
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop())
    return sorted(out)
