"""CoNLL-2003: the column reader (DOCSTART, blank lines, CRLF, IOB1), first-sub-token labels, and
conlleval's counts on hand-made cases whose figures are worked out in each test."""

import pytest

from tasks.finetune import IGNORE_INDEX
from tasks.metrics import conlleval
from tasks.ner import NerDataError, encode_sentences, iob1_to_iob2, label_list, read_conll, word_predictions


def test_conlleval_iob2_wrong_type():
    # gold chunks PER(0-1), LOC(3); guessed PER(0-1), ORG(3): 1 correct of 2 guessed, 2 real
    out = conlleval([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]])
    assert (out["correct_chunks"], out["found_guessed"], out["found_correct"]) == (1, 2, 2)
    assert out["precision"] == 50.0 and out["recall"] == 50.0 and out["f1"] == 50.0
    assert out["accuracy"] == 75.0  # 3 of 4 tags equal
    assert out["PER_f1"] == 100.0 and out["LOC_recall"] == 0.0 and out["ORG_precision"] == 0.0


def test_conlleval_iob1_and_chunks_starting_with_i():
    # gold (IOB1): I-PER I-PER starts a PER chunk after O; I-LOC then B-LOC are two LOC chunks.
    # guessed: B-PER I-PER (same PER chunk), I-LOC I-LOC (one LOC chunk over both tokens).
    # PER is correct; the guessed LOC ends later than the first gold LOC: wrong. 1 correct,
    # 2 guessed, 3 real -> P 50, R 33.33, F 2*50*33.33/83.33 = 40. Tags equal at 1, 2, 3: 60%.
    out = conlleval([["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]], [["B-PER", "I-PER", "O", "I-LOC", "I-LOC"]])
    assert (out["correct_chunks"], out["found_guessed"], out["found_correct"]) == (1, 2, 3)
    assert out["precision"] == 50.0 and out["recall"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(40.0) and out["accuracy"] == pytest.approx(60.0)
    # the same chunks in IOB2 give the same figures
    gold2 = iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC"])
    assert gold2 == ["B-PER", "I-PER", "O", "B-LOC", "B-LOC"]
    again = conlleval([gold2], [iob1_to_iob2(["B-PER", "I-PER", "O", "I-LOC", "I-LOC"])])
    assert again["f1"] == pytest.approx(40.0)


def test_conlleval_type_change_inside_a_chunk_and_boundaries():
    # guessed I-PER after B-ORG starts a new PER chunk: ORG(0) and PER(1) against gold ORG(0-1)
    out = conlleval([["B-ORG", "I-ORG"]], [["B-ORG", "I-PER"]])
    assert (out["correct_chunks"], out["found_guessed"], out["found_correct"]) == (0, 2, 1)
    assert out["f1"] == 0.0 and out["accuracy"] == 50.0
    # a sentence boundary ends a chunk: I-PER at the start of the next sentence is a new one
    out = conlleval([["B-PER"], ["I-PER"]], [["B-PER"], ["I-PER"]])
    assert out["found_correct"] == 2 and out["f1"] == 100.0


def test_conlleval_empty_and_constant_predictions():
    out = conlleval([["B-PER", "O"]], [["O", "O"]])  # nothing guessed: P 0 (no division), R 0, F 0
    assert out["precision"] == out["recall"] == out["f1"] == 0.0 and out["accuracy"] == 50.0
    empty = conlleval([], [])
    assert empty["f1"] == 0.0 and empty["accuracy"] == 0.0
    with pytest.raises(ValueError, match="sentence 0"):
        conlleval([["O", "O"]], [["O"]])


def test_reader_docstart_blank_lines_crlf_and_errors(tmp_path):
    text = (
        "-DOCSTART- -X- -X- O\r\n\r\nEU NNP I-NP I-ORG\r\nrejects VBZ I-VP O\r\n"
        "German JJ I-NP I-MISC\r\n\r\nPeter NNP I-NP I-PER\r\nBlackburn NNP I-NP I-PER\r\n"
        "Paris NNP I-NP I-LOC\r\nRome NNP I-NP B-LOC\r\n"
    )
    (tmp_path / "eng.train").write_bytes(text.encode())
    sents = read_conll(str(tmp_path / "eng.train"))
    assert [s.words for s in sents] == [["EU", "rejects", "German"], ["Peter", "Blackburn", "Paris", "Rome"]]
    assert sents[1].tags == ["I-PER", "I-PER", "I-LOC", "B-LOC"]
    assert label_list(sents) == ["O", "B-LOC", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
    (tmp_path / "bad").write_text("EU NNP I-NP I-ORG\nrejects VBZ I-VP X-BAD\n")
    with pytest.raises(NerDataError, match=r"bad:2: tag 'X-BAD'"):
        read_conll(str(tmp_path / "bad"))
    (tmp_path / "empty").write_text("-DOCSTART- -X- -X- O\n\n")
    with pytest.raises(NerDataError, match="no sentences"):
        read_conll(str(tmp_path / "empty"))


def test_first_sub_token_labelling(tiny_tokenizer):
    from tasks.ner import NerSentence

    # "parisrome" is not a vocabulary word: it splits into several pieces
    sent = NerSentence(["the", "parisrome", "river"], ["O", "B-LOC", "O"])
    labels = ["O", "B-LOC", "I-LOC"]
    pieces = tiny_tokenizer.encode("parisrome", add_special_tokens=False).ids
    assert len(pieces) > 1
    features, positions, extra = encode_sentences(tiny_tokenizer, [sent], labels, 64)
    f = features[0]
    assert extra == 0 and len(f["input_ids"]) == 1 + 1 + len(pieces) + 1 + 1
    assert positions == [[(0, 1), (0, 2), (0, 2 + len(pieces))]]
    expected = [IGNORE_INDEX, 0, 1] + [IGNORE_INDEX] * (len(pieces) - 1) + [0, IGNORE_INDEX]
    assert f["labels"] == expected
    # a word's prediction is its first sub-token's; later sub-tokens are not read
    logits = [[[0.0, 0.0, 0.0] for _ in f["input_ids"]]]
    logits[0][2] = [0.0, 5.0, 0.0]
    logits[0][3] = [0.0, 0.0, 9.0]
    assert word_predictions(logits, positions, labels) == [["O", "B-LOC", "O"]]


def test_long_sentences_are_split_into_windows_and_no_word_is_lost(tiny_tokenizer):
    from tasks.ner import NerSentence

    sent = NerSentence(["the", "parisrome", "river", "paris"], ["O", "B-LOC", "O", "B-LOC"])
    labels = ["O", "B-LOC", "I-LOC"]
    n_pieces = len(tiny_tokenizer.encode("parisrome", add_special_tokens=False).ids)
    assert n_pieces >= 2
    # room for 2 pieces per window: [the] [parisrome cut to 2 pieces] [river paris]
    features, positions, extra = encode_sentences(tiny_tokenizer, [sent], labels, 4)
    assert extra == 2 and len(features) == 3
    assert positions == [[(0, 1), (1, 1), (2, 1), (2, 2)]]
    assert all(len(f["input_ids"]) <= 4 for f in features)
    assert [f["labels"] for f in features] == [
        [IGNORE_INDEX, 0, IGNORE_INDEX],
        [IGNORE_INDEX, 1, IGNORE_INDEX, IGNORE_INDEX],
        [IGNORE_INDEX, 0, 1, IGNORE_INDEX],
    ]
    # every word is predicted from its own window
    logits = [[[0.0, 0.0, 0.0] for _ in f["input_ids"]] for f in features]
    logits[1][1] = [0.0, 3.0, 0.0]
    logits[2][2] = [0.0, 0.0, 4.0]
    assert word_predictions(logits, positions, labels) == [["O", "B-LOC", "O", "I-LOC"]]
    # with room, one window holds it all
    features, positions, extra = encode_sentences(tiny_tokenizer, [sent], labels, 64)
    assert extra == 0 and len(features) == 1 and [f for f, _ in positions[0]] == [0, 0, 0, 0]
