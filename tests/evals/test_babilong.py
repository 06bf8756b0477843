"""BABILong: the official scoring rule on hand-made cases; the official prompts and separators; the generator against
bAbI's semantics, checked by an independent solver that reads only the prompt's <context> (it must score 100 on every
task, while rules that ignore qa4's direction or answer qa3 by recency score near chance); story lengths against the
official 0k split; the official file layout and split names."""
import json
import re
import statistics

import pytest

from swax_lightning.data.tokenizer import ByteTokenizer
from swax_lightning.evals import babilong

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
        elif fact["drop"]:  # qa5's people may drop things in rooms no fact names
            place[fact["dropped"]], holder[fact["dropped"]] = where.get(who), None
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


AXIS = {"north": "north-south", "south": "north-south", "east": "east-west", "west": "east-west"}


def related_rooms(sample, axis: str | None = None) -> list[str]:
    """The rooms the facts of a qa4 sample relate to the question's room (on one axis, when given), in the order the
    facts name them."""
    asked = re.search(r"the (\w+)(?: \w+ of)?\?$", sample.question)[1]
    pairs = [(m["a"], m["b"]) for m in FACT.finditer(context_of(sample.input_text))
             if m["a"] and axis in (None, AXIS[m["dir"]])]
    return [a if b == asked else b for a, b in pairs if asked in (a, b)]


def test_qa4_needs_the_direction():
    """As in bAbI, the three rooms lie on one line and both facts concern the asked (middle) room, so rules blind to
    the direction are right about half of the time: its first-named or last-named neighbour, or the first neighbour
    on the question's axis (north-south or east-west), which scored 71% on the earlier generator (its second fact
    could lie across the axis)."""
    gen = babilong.BabiLongGenerator(TOK)
    samples = [gen.sample("qa4", 0, index=i) for i in range(400)]
    assert all(len(related_rooms(s)) == 2 for s in samples)
    on_axis = lambda s: related_rooms(s, AXIS[next(w for w in AXIS if w in s.question)])  # noqa: E731
    for rule in (lambda s: related_rooms(s)[0], lambda s: related_rooms(s)[-1], lambda s: on_axis(s)[0]):
        blind = sum(rule(s) == s.target for s in samples) / len(samples)
        assert 0.4 < blind < 0.6, blind
    assert {s.question.split()[2] for s in samples} >= {"north", "south", "east", "west", "the"}  # both forms


def object_rooms(sample, obj: str) -> list[str]:
    """The rooms an object has been in, in order, replayed from the facts of a sample (as the solver does)."""
    where, holder, place, rooms = {}, {}, {}, []
    for fact in FACT.finditer(context_of(sample.input_text)):
        if fact["move"]:
            where[fact["who"]] = fact["room"]
        elif fact["pick"] and fact["picked"] == obj:
            holder[obj] = fact["who"]
        elif fact["drop"] and fact["dropped"] == obj:
            place[obj], holder[obj] = where[fact["who"]], None
        room = where.get(holder[obj]) if holder.get(obj) else place.get(obj)
        if room and rooms[-1:] != [room]:
            rooms.append(room)
    return rooms


# Measured on bAbI's own files (tasks_1-20_v1-2, en/qa3 test: 1,000 questions; en-10k/qa5 train: 10,000): in qa3 the
# asked room is the object's current room in 80.6%, the object has been in 4.96 rooms (consecutive repeats merged) and
# its first room is the answer in 18.3%; qa5 asks "What did X give to Y?" in 33.6% and each other form in 16.3-17.0%.
BABI_QA3 = {"current room": 0.806, "rooms": 4.96, "first room": 0.183}
BABI_QA5_WHAT_DID = 0.336


def test_qa3_asks_as_babi_asks_and_the_first_room_rule_stays_near_its_rate():
    """The earlier generator never asked about the object's current room (bAbI: 4 times in 5) and asked about objects
    that had been in 3.3 rooms, so "the object's first room" answered 54-70% of its questions (bAbI: 18%)."""
    gen = babilong.BabiLongGenerator(TOK)
    samples = [gen.sample("qa3", 0, index=i) for i in range(1000)]
    current = first = 0
    rooms_seen = []
    for s in samples:
        obj, room = re.fullmatch(r"Where was the (\w+) before the (\w+)\?", s.question).groups()
        rooms = object_rooms(s, obj)
        rooms_seen.append(len(rooms))
        current += room == rooms[-1]
        first += rooms[0] == s.target
    assert abs(current / len(samples) - BABI_QA3["current room"]) < 0.05, current
    assert abs(statistics.mean(rooms_seen) - BABI_QA3["rooms"]) < 0.5, statistics.mean(rooms_seen)
    assert first / len(samples) < BABI_QA3["first room"] + 0.07, first  # near bAbI's rate: 23.9% measured


def test_qa5_question_forms_in_babis_proportions():
    gen = babilong.BabiLongGenerator(TOK)
    questions = [gen.sample("qa5", 0, index=i).question for i in range(1000)]
    what_did = sum(q.startswith("What did") for q in questions) / len(questions)
    assert abs(what_did - BABI_QA5_WHAT_DID) < 0.05, what_did
    for form in ("Who received", "Who did", r"Who gave the \w+ to", r"Who gave the \w+\?"):
        share = sum(bool(re.match(form, q)) for q in questions) / len(questions)
        assert abs(share - (1 - BABI_QA5_WHAT_DID) / 4) < 0.05, (form, share)


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


# Mean characters of the facts alone in the official 0k split (RMT-team/babilong-1k-samples, 999-1,000 rows a task):
# bytes per row from its dataset card (qa1 214,511 / 1,000; qa2 497,258 / 999; qa3 1,515,195 / 999; qa4 118,279 / 999;
# qa5 617,596 / 999) less the mean question and target of the same rows (booydar/babilong's evaluation CSVs: qa1 16.1 +
# 6.8, qa2 20.7 + 6.8, qa3 40.4 + 6.8, qa4 28.3 + 6.9, qa5 27.0 + 4.5) and Arrow's three 4-byte offsets. The qa4 figure
# is also what two bAbI facts of mean room and direction lengths make (71.3), which checks the arithmetic.
OFFICIAL_0K_CHARS = {"qa1": 179.6, "qa2": 458.2, "qa3": 1457.5, "qa4": 71.3, "qa5": 574.7}


@pytest.mark.parametrize("task", babilong.TASKS)
def test_story_lengths_are_within_10_percent_of_the_official_0k_split(task):
    """qa2 and qa5 stories were about 1.5 times the official length (823 and 906 characters)."""
    gen = babilong.BabiLongGenerator(TOK)
    mean = statistics.mean(len(context_of(gen.sample(task, 0, index=i).input_text)) for i in range(400))
    assert abs(mean / OFFICIAL_0K_CHARS[task] - 1) < 0.10, (task, mean)


def test_prompts_are_the_official_ones_with_their_blank_lines():
    """booydar/babilong's current template: blank lines between instruction, examples, post-prompt, context and
    question (the first draft had single newlines), and qa3's second example answers its own question."""
    prompt = babilong.format_prompt("qa3", " Mary went to the office. ", "Where was the apple before the office? ")
    instruction, examples, post_prompt = babilong.PROMPTS["qa3"]
    assert prompt == (f"{instruction}\n\n{examples}\n\n{post_prompt}\n\n<context>\nMary went to the office.\n"
                      "</context>\n\nQuestion: Where was the apple before the office?")
    assert "before the bedroom?\nAnswer: Before the bedroom the football was in the garden." in examples
    assert post_prompt.startswith("Always return your answer in the following format: Before the $location_1$ the")


@pytest.mark.parametrize("task", babilong.TASKS)
def test_generated_samples(task):
    gen = babilong.BabiLongGenerator(TOK, seed=1)
    a = gen.sample(task, 4096, index=4)
    assert a == gen.sample(task, 4096, index=4)
    assert 4096 - gen.answer_tokens(task) - 200 <= a.n_tokens <= 4096 - gen.answer_tokens(task)
    facts = [a.input_text[p:].split(".")[0] for p in a.fact_positions]
    assert facts and all(f.split()[0] in ("The", *babilong.PEOPLE.get(task, ())) for f in facts)
    assert a.input_text.startswith(babilong.PROMPTS[task][0])  # the official prompt
    assert a.input_text.endswith(f"</context>\n\nQuestion: {a.question}")
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

    with pytest.raises(ValueError, match="eval.babilong.lengths: BABILong length"):  # at start-up, not after NIAH
        EvalSuite(babilong=dict(tasks=["qa1"], lengths=[4096, length], data_dir=str(tmp_path)))


@pytest.mark.parametrize("make,match", [
    (lambda: babilong.BabiLongGenerator(TOK).sample("qa9", 0), "unknown BABILong task"),
    (lambda: babilong.BabiLongGenerator(TOK).sample("qa2", 200), "too short"),
])
def test_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def official_answer(task: str, question: str, target: str) -> str:
    """The answer in the format the task's post-prompt asks for, followed by more text (which the rule ignores)."""
    asked = re.fullmatch(r"Where is (?:the )?(\w+)\?", question)
    if task == "qa1":
        answer = f"The most recent location of {asked[1]} is {target}."
    elif task == "qa2":
        answer = f"The {asked[1]} is in the {target}."
    elif task == "qa3":
        item, before = re.fullmatch(r"Where was the (\w+) before the (\w+)\?", question).groups()
        answer = f"Before the {before} the {item} was in the {target}."
    else:
        answer = f"{target}."
    return answer + " Do not write anything else after that."


def suite_babilong(tokenizer) -> tuple[dict, list]:
    """The suite's own BABILong run: its samples, answer budgets, stopping rule, scoring and batching."""
    from types import SimpleNamespace

    from swax_lightning.evals.suite import EvalSuite

    suite = EvalSuite(babilong=dict(tasks=list(babilong.TASKS), lengths=[0, 6000], samples=4), batch_size=3)
    samples = []  # batches of 3 of 4 stories: a full one and a short one per task and length
    return suite.evaluation("babilong").run(None, SimpleNamespace(tokenizer=tokenizer), samples), samples


def reader(text: str) -> str:
    question = text.rsplit("Question: ", 1)[1]
    task = next(t for t, (instruction, _, _) in babilong.PROMPTS.items() if text.startswith(instruction)
                and (t != "qa3" or "before the" in question) and (t != "qa2" or "before the" not in question))
    return official_answer(task, question, solve(text, question))


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_a_model_answering_in_the_official_format_scores_100_with_any_tokenizer_and_a_blind_one_0(tokenizer,
                                                                                                  bpe_tokenizer,
                                                                                                  answering):
    """The answer budget is in characters, turned into the tokenizer's tokens: a byte-level model's answer in the
    official format is whole (a budget of 20 tokens cut it to 'The most recent loca' and scored 0 on qa1-qa3), and
    generation ends with the answer's first sentence, all the rule reads."""
    tok = TOK if tokenizer == "byte" else bpe_tokenizer
    answering(reader)
    reading, samples = suite_babilong(tok)
    assert all(reading["scores"][task][length] == {**reading["scores"][task][length], "mean": 100.0, "n": 4}
               for task in babilong.TASKS for length in ("0", "6000"))
    assert all(s["prediction"].endswith(".") and "Do not" not in s["prediction"] for s in samples)  # stopped there
    answering(lambda text: "The most recent location of the answer is nowhere.")
    blind, _ = suite_babilong(tok)
    assert all(cell["mean"] == 0.0 for row in blind["scores"].values() for cell in row.values())


def test_the_answer_budget_in_tokens_follows_the_tokenizer(bpe_tokenizer):
    byte, bpe = (babilong.BabiLongGenerator(tok, seed=0) for tok in (TOK, bpe_tokenizer))
    assert byte.answer_tokens("qa1") == babilong.ANSWER_CHARS  # one byte, one token
    assert 0 < bpe.answer_tokens("qa1") < babilong.ANSWER_CHARS
    assert bpe.sample("qa1", 1024).n_tokens <= 1024 - bpe.answer_tokens("qa1")


def test_the_suites_generation_ends_when_the_answer_is_complete_and_batches_change_no_answer():
    """The real path (EvalSuite.generate -> continue_texts -> generate): done(text so far) ends each generation, as
    BABILong's first-sentence rule uses it; without it the budget runs out. Prompts of different lengths decoded
    batch_size at a time (left-padded, prefilled chunk_len // batch tokens of each per call) get the answers they get
    one by one, and on_generation hears each batch."""
    import torch

    from swax_lightning.evals.suite import EvalSuite
    from swax_lightning.model.config import ModelConfig
    from swax_lightning.model.model import SWAXModel

    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, window=8)).eval()
    prompts = ["Where is Mary?", "Where was the apple before the kitchen?", "Who?"]
    whole = EvalSuite().generate(model, TOK, prompts, 12, "babilong", 0)
    batched, heard = EvalSuite(batch_size=2, chunk_len=5), []  # a batch of 2 prefills 2 tokens of each per call
    batched._on_generation = lambda evaluation, length, stats: heard.append(stats["batch"])
    assert batched.generate(model, TOK, iter(prompts), 12, "babilong", 0) == whole and heard == [2, 1]
    cut = batched.generate(model, TOK, prompts, 12, "babilong", 0, done=lambda text: len(text) >= 3)
    assert all(w.startswith(c) and 3 <= len(c) < len(w) for w, c in zip(whole, cut))  # the same tokens, ended early
