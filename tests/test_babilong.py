"""BABILong: the official scoring rule on hand-made cases; the generator against bAbI's semantics, checked by an
independent solver that reads only the prompt's <context> (it must score 100 on every task, and a solver that ignores
qa4's direction must not); story lengths; the official file layout."""
import json
import re
import statistics

import pytest

from swax_lightning.evals import babilong
from swax_lightning.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
NAMES = "Mary|John|Daniel|Sandra|Fred|Jeff|Bill"
FACT = re.compile(rf"(?P<who>{NAMES}) (?:(?P<move>moved|went back|went|journeyed|travelled) to the (?P<room>\w+)"
                  rf"|(?P<pick>picked up|got|grabbed|took) the (?P<picked>\w+)"
                  rf"|(?P<drop>dropped|discarded|put down|left) the (?P<dropped>\w+)"
                  rf"|(?:gave|passed|handed) the (?P<given>\w+) to (?P<to>{NAMES}))(?: there)?\."
                  rf"|The (?P<a>\w+) is (?P<dir>north|south|east|west) of the (?P<b>\w+)\.")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


def context_of(prompt: str) -> str:
    return prompt.split("<context>\n")[-1].split("\n</context>")[0]


def solve(prompt: str, question: str, use_direction: bool = True) -> str:
    """Replays the facts of the context, then answers the question as bAbI defines it."""
    where, holder, place, history, gives, relations = {}, {}, {}, {}, [], []

    def locate(obj):
        room = where.get(holder[obj]) if holder.get(obj) else place.get(obj)
        if room and history.setdefault(obj, [])[-1:] != [room]:
            history[obj].append(room)

    for fact in FACT.finditer(context_of(prompt)):
        who = fact["who"]
        if fact["move"]:
            where[who] = fact["room"]
        elif fact["pick"]:
            holder[fact["picked"]] = who
        elif fact["drop"]:
            place[fact["dropped"]], holder[fact["dropped"]] = where[who], None
        elif fact["given"]:
            holder[fact["given"]] = fact["to"]
            gives.append((who, fact["given"], fact["to"]))
        elif fact["a"]:
            relations += [(fact["a"], fact["dir"], fact["b"]), (fact["b"], OPPOSITE[fact["dir"]], fact["a"])]
        for obj in list(holder):
            locate(obj)
    if m := re.fullmatch(rf"Where is ({NAMES})\?", question):
        return where[m[1]]
    if m := re.fullmatch(r"Where is the (\w+)\?", question):
        return history[m[1]][-1]
    if m := re.fullmatch(r"Where was the (\w+) before the (\w+)\?", question):
        rooms = history[m[1]]
        return rooms[max(i for i, r in enumerate(rooms) if r == m[2]) - 1]
    if m := re.fullmatch(r"What is (\w+) of the (\w+)\?", question):
        return next(x for x, d, y in relations if y == m[2] and (d == m[1] or not use_direction))
    if m := re.fullmatch(r"What is the (\w+) (\w+) of\?", question):
        return next(y for x, d, y in relations if x == m[1] and (d == m[2] or not use_direction))
    last = lambda ok: [g for g in gives if ok(*g)][-1]  # noqa: E731
    if m := re.fullmatch(rf"Who gave the (\w+) to ({NAMES})\?", question):
        return last(lambda g, o, r: (o, r) == (m[1], m[2]))[0]
    if m := re.fullmatch(r"Who received the (\w+)\?", question):
        return last(lambda g, o, r: o == m[1])[2]
    if m := re.fullmatch(rf"What did ({NAMES}) give to ({NAMES})\?", question):
        return last(lambda g, o, r: (g, r) == (m[1], m[2]))[1]
    if m := re.fullmatch(rf"Who did ({NAMES}) give the (\w+) to\?", question):
        return last(lambda g, o, r: (g, o) == (m[1], m[2]))[2]
    if m := re.fullmatch(r"Who gave the (\w+)\?", question):
        return last(lambda g, o, r: o == m[1])[0]
    raise AssertionError(f"not a bAbI question of qa1-qa5: {question}")


@pytest.mark.parametrize("output,target,question,task,correct", [
    ("kitchen", "kitchen", "Where is Mary?", "qa1", 1.0),
    ("The kitchen. Then the garden.", "kitchen", "Where is Mary?", "qa1", 1.0),    # only the first sentence counts
    ("kitchen or garden", "kitchen", "Where is Mary?", "qa1", 0.0),                 # another label: wrong
    ("Garden.", "kitchen", "Where is Mary?", "qa1", 0.0),
    ("the hallway, not the office", "hallway", "What is north of the office?", "qa4", 1.0),  # label in the question
    ("Mary", "Mary", "Who gave the milk to Fred?", "qa5", 1.0),
    ("Mary gave it to Fred", "Mary", "Who gave the milk to Fred?", "qa5", 1.0),     # fred is in the question
    ("Mary and Bill", "Mary", "Who gave the milk to Fred?", "qa5", 0.0),
    ("Answer: kitchen <example> garden", "kitchen", "Where is Mary?", "qa1", 1.0),  # the rule cuts at <example>
    ("kitchen", "kitchen", "Where was the apple before the kitchen?", "qa3", 0.0),  # a label of the question never is
    ("", "kitchen", "Where is Mary?", "qa1", 0.0),
])
def test_babilong_official_rule(output, target, question, task, correct):
    assert babilong.babilong_score(output, target, question, task) == correct


@pytest.mark.parametrize("task", babilong.TASKS)
def test_an_oracle_solver_scores_100(task):
    """Every generated answer follows from the facts under bAbI's semantics: an independent solver that reads only
    the <context> of the prompt (facts hidden in filler) answers every sample right, by the official rule."""
    gen = babilong.BabiLongGenerator(TOK)
    for i in range(40):
        sample = gen.sample(task, 0 if i % 2 else 6000, index=i)
        answer = solve(sample.input_text, sample.question)
        assert answer == sample.target, (sample.question, answer, sample.target)
        assert babilong.babilong_score(answer, sample.target, sample.question, task) == 1.0


def test_qa4_needs_the_direction():
    """A solver that takes the room the question's room is related to, ignoring the direction, is right about half
    of the time, not always: both facts relate to the asked room."""
    gen = babilong.BabiLongGenerator(TOK)
    samples = [gen.sample("qa4", 0, index=i) for i in range(200)]
    blind = sum(solve(s.input_text, s.question, use_direction=False) == s.target for s in samples) / len(samples)
    assert 0.3 < blind < 0.7
    assert {s.question.split()[2] for s in samples} >= {"north", "south", "east", "west", "the"}  # both forms


def test_question_forms_and_name_sets_are_babis():
    gen = babilong.BabiLongGenerator(TOK)
    qa3 = [gen.sample("qa3", 0, index=i) for i in range(30)]
    assert all(re.fullmatch(r"Where was the (football|apple|milk) before the \w+\?", s.question) for s in qa3)
    qa5 = [gen.sample("qa5", 0, index=i) for i in range(150)]
    forms = {re.sub(r"\b(Fred|Mary|Jeff|Bill|football|apple|milk)\b", "_", s.question) for s in qa5}
    assert forms == {"Who gave the _ to _?", "Who received the _?", "What did _ give to _?", "Who did _ give the _ to?",
                     "Who gave the _?"}
    names = set(re.findall(r"\b[A-Z][a-z]+\b", " ".join(context_of(s.input_text) for s in qa5)))
    assert names == {"Fred", "Mary", "Jeff", "Bill"}
    assert all(s.target in babilong.LABELS["qa5"] for s in qa5)  # every answer can be scored correct


def test_story_lengths_are_near_the_official_ones():
    """The facts alone (the 0k split): qa3 about 1,500 characters as in the official set, qa4 two facts."""
    gen = babilong.BabiLongGenerator(TOK)
    mean = {t: statistics.mean(len(context_of(gen.sample(t, 0, index=i).input_text)) for i in range(60))
            for t in babilong.TASKS}
    assert 1200 < mean["qa3"] < 1800 and mean["qa4"] < 90 and mean["qa1"] < mean["qa2"] < mean["qa3"]


@pytest.mark.parametrize("task", babilong.TASKS)
def test_generated_samples(task):
    gen = babilong.BabiLongGenerator(TOK, seed=1)
    a = gen.sample(task, 4096, index=4)
    assert a == gen.sample(task, 4096, index=4)
    assert 4096 - gen.max_new_tokens - 200 <= a.n_tokens <= 4096 - gen.max_new_tokens
    facts = [a.input_text[p:].split(".")[0] for p in a.fact_positions]
    assert facts and all(f.split()[0] in ("The", *babilong.PEOPLE.get(task, ())) for f in facts)
    assert a.input_text.startswith(babilong.PROMPTS[task][0])  # the official prompt
    assert a.input_text.endswith(f"</context>\nQuestion: {a.question}")
    assert a.source == "generated" and a.gpt2_tokens_estimate == round(len(a.input_text) / 4)


def test_official_files(tmp_path):
    """The layout of the downloaded dataset: data/<task>/<split>.json, the 1M split named 1M."""
    rows = [{"input": "Mary went to the office.", "question": "Where is Mary?", "target": "office"}]
    (tmp_path / "qa1").mkdir()
    (tmp_path / "qa1" / "4k.json").write_text(json.dumps(rows))
    (tmp_path / "qa1" / "1M.json").write_text("\n".join(json.dumps(r) for r in rows))  # JSON lines work too
    samples = babilong.load_official(tmp_path, "qa1", "4k", TOK)
    assert samples[0].target == "office" and "<context>\nMary went to the office.\n</context>" in samples[0].input_text
    assert samples[0].split == "4k" and samples[0].source.endswith("qa1/4k.json") and samples[0].n_tokens > 0
    assert babilong.load_official(tmp_path, "qa1", babilong.split_name(1 << 20))[0].split == "1M"
    assert [babilong.split_name(n) for n in (0, 4096, 131072)] == ["0k", "4k", "128k"]
    with pytest.raises(FileNotFoundError, match="qa2/4k.json"):
        babilong.load_official(tmp_path, "qa2", "4k")
    (tmp_path / "qa1" / "8k.json").write_text(json.dumps([{"input": "x"}]))
    with pytest.raises(ValueError, match="8k.json row 0"):
        babilong.load_official(tmp_path, "qa1", "8k")


@pytest.mark.parametrize("length,split", [(0, "0k"), (1000, "1k"), (1024, "1k"), (2000, "2k"), (2048, "2k"),
                                          (4000, "4k"), (4096, "4k"), (128000, "128k"), (131072, "128k"),
                                          (512000, "512k"), (1_000_000, "1M"), (1 << 20, "1M")])
def test_split_names_are_the_official_ones(length, split):
    """BABILong names its splits after 1000, 2000, 4000 ... tokens (its create_tasks.py); powers of two name the same
    splits. split_name(1000) was '0k' and split_name(2000) '1k': the wrong file, read silently."""
    assert babilong.split_name(length) == split


@pytest.mark.parametrize("length", [1, 1500, 3000, 5000, 100_000, 1 << 21])
def test_a_length_that_names_no_split_is_refused(length, tmp_path):
    with pytest.raises(ValueError, match=f"length {length} names no official split"):
        babilong.split_name(length)
    from swax_lightning.evals.suite import EvalSuite

    with pytest.raises(ValueError, match="EvalSuite.babilong_lengths: BABILong length"):  # at start-up, not after NIAH
        EvalSuite(babilong_tasks=["qa1"], babilong_lengths=[4096, length], babilong_data_dir=str(tmp_path))


@pytest.mark.parametrize("make,match", [
    (lambda: babilong.BabiLongGenerator(TOK).sample("qa9", 0), "unknown BABILong task"),
    (lambda: babilong.BabiLongGenerator(TOK).sample("qa2", 200), "too short"),
])
def test_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()
