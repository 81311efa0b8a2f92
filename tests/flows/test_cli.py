"""The command line's quick paths: synthetic corpora, config printing, early config errors."""

import bz2
import json

from flows.cli import main


def test_synth_corpus_writes_both_formats_and_downstream_sets(tmp_path, capsys):
    out = tmp_path / "corpus"
    assert main(["synth-corpus", "--out", str(out), "--size", "300KB", "--seed", "3"]) == 0
    counts = json.loads(capsys.readouterr().out.split("\nwrote ")[0])
    assert counts["articles"] > 0 and counts["books"] > 0
    dumps = list((out / "wiki").glob("*.xml.bz2"))
    assert len(dumps) == 1
    assert b"<mediawiki" in bz2.decompress(dumps[0].read_bytes())[:500]
    assert list((out / "books").glob("*.txt"))
    assert (out / "glue" / "SST-2" / "train.tsv").read_text().startswith("sentence\tlabel\n")
    assert json.loads((out / "squad" / "dev-v1.1.json").read_text())["version"] == "1.1"
    total = sum(f.stat().st_size for f in (out / "books").glob("*.txt"))
    assert 0.15 * 300_000 < total < 0.35 * 300_000  # a quarter of the text is books


def test_config_prints_resolved_json(capsys):
    assert main(["config", "--preset", "base", "--set", "pretrain.phases.0.steps=10"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["model"]["hidden_size"] == 768 and cfg["pretrain"]["phases"][0]["steps"] == 10


def test_bad_config_fails_before_any_work(tmp_path, capsys):
    code = main(["run", "--root", str(tmp_path / "r"), "--set", "model.num_attention_heads=3"])
    assert code == 2
    assert "model.hidden_size" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing started: no folder, no server, no MLflow db
