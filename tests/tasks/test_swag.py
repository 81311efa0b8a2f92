"""SWAG: the CSV reader (quoted fields, CRLF, an unlabelled test file) and its errors."""

import pytest

from tasks.swag import SwagDataError, encode_swag, read_swag, softmax

HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"


def test_reader_and_features(tmp_path, tiny_tokenizer):
    rows = [
        HEADER,
        '0,v1,5,"the movie, the plot",the movie was long .,the actor,gold,is dark .,'
        '"was, ""quite"" short",is bright .,was named paris .,2',
        "1,v2,6,x,the city is old .,the river,gold,a,b,c,d,0",
    ]
    (tmp_path / "train.csv").write_bytes("\r\n".join(rows).encode() + b"\r\n")
    ex = read_swag(str(tmp_path / "train.csv"))
    assert [e.label for e in ex] == [2, 0] and ex[0].row_id == "0"
    assert ex[0].endings[1] == 'was, "quite" short' and ex[0].context == "the movie was long ."
    features = encode_swag(tiny_tokenizer, ex, 32)
    assert len(features[0]["input_ids"]) == 4 and features[0]["labels"] == 2
    assert all(ids[0] == tiny_tokenizer.token_to_id("[CLS]") for ids in features[0]["input_ids"])
    (tmp_path / "test.csv").write_text(HEADER.rsplit(",", 1)[0] + "\n0,v,1,s,a .,b,gold,e0,e1,e2,e3\n")
    test = read_swag(str(tmp_path / "test.csv"), labelled=False)
    assert test[0].label is None and test[0].endings == ["e0", "e1", "e2", "e3"]


def test_reader_errors(tmp_path):
    (tmp_path / "bad.csv").write_text(HEADER + "\n0,v,1,s,a,b,gold,e0,e1,e2,e3,7\n")
    with pytest.raises(SwagDataError, match=r"bad.csv:2: column 'label': '7'"):
        read_swag(str(tmp_path / "bad.csv"))
    (tmp_path / "extra.csv").write_text(HEADER + "\n0,v,1,s,a,b,gold,e0,e,1,e2,e3,0\n")  # unquoted comma
    with pytest.raises(SwagDataError, match=r"extra.csv:2: 13 fields, the header has 12"):
        read_swag(str(tmp_path / "extra.csv"))
    (tmp_path / "cols.csv").write_text("sent1,sent2,label\na,b,0\n")
    with pytest.raises(SwagDataError, match=r"cols.csv:1: columns \['ending0'"):
        read_swag(str(tmp_path / "cols.csv"))


def test_softmax_over_four():
    p = softmax([1.0, 1.0, 1.0, 1.0])
    assert p == [0.25] * 4
    q = softmax([1000.0, 0.0, 0.0, 0.0])  # no overflow
    assert q[0] == pytest.approx(1.0) and sum(q) == pytest.approx(1.0)


def test_rows_with_an_empty_ending_stop_the_run(tmp_path):
    """Issue 19 point 5: 200 of the bundled sample's 600 train rows given an empty ending were
    accepted (scored as a choice of nothing); they stop the run with file:line, as documented."""
    import csv
    import pathlib

    sample = pathlib.Path(__file__).resolve().parents[2] / "data" / "sample" / "swag" / "train.csv"
    rows = list(csv.reader(sample.open(newline="", encoding="utf-8")))
    header, body = rows[0], rows[1:]
    assert len(body) == 600
    for row in body[::3]:  # 200 rows
        row[header.index("ending2")] = " "
    path = tmp_path / "train.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, *body])
    with pytest.raises(SwagDataError, match=r"train.csv:2: column\(s\) \['ending2'\] empty"):
        read_swag(str(path))
