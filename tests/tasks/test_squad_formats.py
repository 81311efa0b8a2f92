"""SQuAD readers on the flat (Hugging Face) layout, JSON Lines, whitespace-mapped answers and
bad layouts; the official v2.0 best-threshold search on a hand-worked case."""

import json

import pytest

from tasks.metrics import find_best_thresh, squad_v2_evaluate
from tasks.squad import SquadDataError, locate_answer, read_squad

CONTEXT = "He lived in New\nYork for years."
FLAT = [
    {
        "id": "a1",
        "title": "T",
        "context": CONTEXT,
        "question": "where ?",
        "answers": {"text": ["New York"], "answer_start": [12]},
    },
    {"id": "a2", "title": "T", "context": CONTEXT, "question": "who ?", "answers": {"text": [], "answer_start": []}},
]


def test_flat_layout_list_and_json_lines(tmp_path):
    (tmp_path / "list.json").write_text(json.dumps(FLAT))
    (tmp_path / "lines.jsonl").write_text("\n".join(json.dumps(r) for r in FLAT) + "\n")
    for name in ("list.json", "lines.jsonl"):
        v2 = read_squad(str(tmp_path / name), "2.0")
        assert [e.qid for e in v2] == ["a1", "a2"]
        assert v2[0].answers == [("New York", 12)] and v2[1].is_impossible and v2[1].answers == []
    with pytest.raises(SquadDataError, match="question a2: no answers"):
        read_squad(str(tmp_path / "list.json"), "1.1")  # v1.1 has no unanswerable questions


def test_bad_layouts_name_the_file(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"data": [{"text": "x"}]}))
    with pytest.raises(SquadDataError, match=r"other.json: expected the official SQuAD JSON"):
        read_squad(str(tmp_path / "other.json"))
    (tmp_path / "empty.json").write_text(json.dumps({"data": []}))
    with pytest.raises(SquadDataError, match=r"empty.json: expected .* found an empty list"):
        read_squad(str(tmp_path / "empty.json"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(SquadDataError, match="broken.json: not valid JSON"):
        read_squad(str(tmp_path / "broken.json"))


def test_answers_needing_whitespace_mapping():
    assert locate_answer(CONTEXT, "New York", 12) == (12, 20)  # a newline in the context
    assert locate_answer(CONTEXT, " New York ", 11) == (12, 20)  # blanks around the answer text
    assert locate_answer("in New  York", "New York", 3) == (3, 12)  # two spaces
    assert locate_answer(CONTEXT, "Boston", 12) is None
    assert locate_answer(CONTEXT, "   ", 0) is None


def test_find_best_thresh_hand_worked():
    # q1 answered right (na 0.1), q2 unanswerable but answered (na 0.5), q3 answered wrong (na 0.9).
    # Start: all null -> 1 right (q2). Walk by na: +1 (q1) -> 2 best at 0.1; -1 (q2) -> 1; +0 (q3).
    gold = {"q1": ["a b"], "q2": [], "q3": ["c"]}
    preds = {"q1": "a b", "q2": "x", "q3": "d"}
    na = {"q1": 0.1, "q2": 0.5, "q3": 0.9}
    best, thresh = find_best_thresh(preds, {"q1": 1.0, "q2": 0.0, "q3": 0.0}, na, {"q1": True, "q2": False, "q3": True})
    assert best == pytest.approx(200 / 3) and thresh == 0.1
    out = squad_v2_evaluate(gold, preds, na)
    assert out["best_exact"] == pytest.approx(200 / 3) and out["best_exact_thresh"] == 0.1
    assert out["exact"] == pytest.approx(100 / 3)  # without a threshold only q1 is right
    assert out["HasAns_total"] == 2 and out["NoAns_total"] == 1
