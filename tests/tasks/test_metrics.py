"""Metrics against values computed by hand (and against the official SQuAD definitions)."""

import math

import pytest

from tasks import metrics as m


def test_accuracy_f1_mcc_binary():
    preds, labels = [1, 0, 1, 1], [1, 1, 1, 0]
    assert m.accuracy(preds, labels) == 0.5
    # tp=2 fp=1 fn=1 -> 2*2 / (4+1+1)
    assert m.f1_binary(preds, labels) == pytest.approx(4 / 6)
    # tn=0: (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = -1/3
    assert m.matthews_corrcoef(preds, labels) == pytest.approx(-1 / 3)
    # tp=2 fp=1 tn=2 fn=1 -> (4-1)/9
    assert m.matthews_corrcoef([1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 1, 1]) == pytest.approx(1 / 3)
    assert m.matthews_corrcoef([1, 0, 1], [1, 0, 1]) == pytest.approx(1.0)


def test_degenerate_denominators_are_zero():
    assert m.matthews_corrcoef([1, 1, 1], [1, 0, 1]) == 0.0  # a constant predictor
    assert m.f1_binary([0, 0], [0, 0]) == 0.0
    assert m.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == 0.0
    with pytest.raises(ValueError, match="differ in length"):
        m.accuracy([1], [1, 0])


def test_mcc_multiclass_matches_confusion_formula():
    # 3 classes, sklearn's multi-class form: c=4 correct of s=6, every class count 2
    preds = [0, 1, 2, 0, 1, 2]
    labels = [0, 1, 2, 0, 2, 1]
    # c*s - sum(p_k t_k) = 4*6 - (2*2+2*2+2*2) = 12 ; s^2 - sum p_k^2 = 36-12 = 24 (both)
    assert m.matthews_corrcoef(preds, labels) == pytest.approx(12 / 24)


def test_pearson_and_spearman():
    assert m.pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert m.pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert m.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert m.spearman([1, 2, 3], [1, 4, 9]) == pytest.approx(1.0)  # monotonic, not linear
    assert m.average_ranks([1, 2, 2, 3]) == [1.0, 2.5, 2.5, 4.0]
    assert m.average_ranks([5, 5, 5]) == [2.0, 2.0, 2.0]
    # ranks [1, 2.5, 2.5, 4] vs [1, 2, 3, 4]: 4.5 / sqrt(4.5 * 5)
    assert m.spearman([1, 2, 2, 3], [10, 20, 30, 40]) == pytest.approx(4.5 / math.sqrt(22.5))


def test_normalize_answer_official_rules():
    assert m.normalize_answer("The  Cat, sat!") == "cat sat"
    assert m.normalize_answer("An apple a day") == "apple day"
    assert m.normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert m.normalize_answer("  ") == ""


def test_token_f1_and_exact():
    # pred [cat sat on mat] vs gold [cat on mat]: p=3/4, r=1
    assert m.f1_score("the cat sat on the mat", "cat on mat") == pytest.approx(2 * 0.75 / 1.75)
    assert m.f1_score("", "cat") == 0.0
    assert m.exact_match_score("The Denver Broncos.", "denver broncos") == 1.0
    assert m.f1_score_v2("", "") == 1.0
    assert m.f1_score_v2("x", "") == 0.0


def test_squad_v1_evaluate_max_over_ground_truths_and_missing():
    gold = {
        "q1": ["Denver Broncos", "The Denver Broncos"],
        "q2": ["Santa Clara"],
        "q3": ["1990"],
    }
    preds = {"q1": "the denver broncos!", "q2": "Santa Clara, California"}  # q3 unanswered
    out = m.squad_v1_evaluate(gold, preds)
    # q1: EM 1 F1 1; q2: EM 0, F1 p=2/3 r=1 -> 0.8; q3: 0
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(180 / 3)
    assert out["total"] == 3


def test_squad_v2_evaluate_no_answer_handling():
    gold = {"a": ["x y"], "b": [], "c": [], "d": ["z"]}
    preds = {"a": "x", "b": "", "c": "something", "d": ""}
    out = m.squad_v2_evaluate(gold, preds)
    # a: EM 0, F1 2/3; b: 1/1 (empty is right); c: 0/0; d: empty prediction for an answer -> 0/0
    assert out["exact"] == pytest.approx(25.0)
    assert out["f1"] == pytest.approx(100 * (2 / 3 + 1) / 4)
    assert out["HasAns_exact"] == 0.0
    assert out["HasAns_f1"] == pytest.approx(100 * (2 / 3) / 2)
    assert out["HasAns_total"] == 2
    assert out["NoAns_exact"] == pytest.approx(50.0)
    assert out["NoAns_f1"] == pytest.approx(50.0)
    assert out["NoAns_total"] == 2
    assert m.squad_evaluate(gold, preds, "2.0") == out
    with pytest.raises(ValueError, match="version"):
        m.squad_evaluate(gold, preds, "3")


def test_empty_and_constant_predictions():
    assert m.accuracy([], []) == 0.0 and m.f1_binary([], []) == 0.0 and m.matthews_corrcoef([], []) == 0.0
    assert m.pearson([], []) == 0.0 and m.spearman([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0  # all tied
    # every prediction empty: v1.1 scores 0; v2.0 scores the unanswerable questions right
    gold = {"q1": ["paris"], "q2": []}
    assert m.squad_v1_evaluate({"q1": ["paris"]}, {"q1": ""}) == {"exact_match": 0.0, "f1": 0.0, "total": 1.0}
    v2 = m.squad_v2_evaluate(gold, {"q1": "", "q2": ""})
    assert v2["exact"] == 50.0 and v2["HasAns_f1"] == 0.0 and v2["NoAns_f1"] == 100.0


def test_agrees_with_sklearn_and_scipy_on_random_data():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    stats = pytest.importorskip("scipy.stats")
    import random

    rng = random.Random(0)
    for _ in range(20):
        y = [rng.randrange(3) for _ in range(40)]
        p = [rng.randrange(3) for _ in range(40)]
        assert m.matthews_corrcoef(p, y) == pytest.approx(sklearn_metrics.matthews_corrcoef(y, p), abs=1e-12)
        yb, pb = [v % 2 for v in y], [v % 2 for v in p]
        assert m.f1_binary(pb, yb) == pytest.approx(sklearn_metrics.f1_score(yb, pb), abs=1e-12)
        xs = [rng.choice([0.0, 0.5, 1.0, 2.5, 3.0]) for _ in range(40)]  # many ties
        ys = [x + rng.random() for x in xs]
        assert m.spearman(xs, ys) == pytest.approx(stats.spearmanr(xs, ys)[0], abs=1e-12)
        assert m.pearson(xs, ys) == pytest.approx(stats.pearsonr(xs, ys)[0], abs=1e-12)
