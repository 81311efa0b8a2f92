"""Hermetic fixtures for the downstream tests: a WordPiece tokenizer trained here on a few lines,
in Google's vocab.txt layout, and a tiny random BERT exported with it in Hugging Face layout."""

from __future__ import annotations

import random

import pytest
from tiny_bert import tiny_bert_config
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from model.bert import BertModel
from model.export import save_pretrained

WORDS = (
    "movie film plot actor scene story music the was and really quite a very long short dark "
    "bright excellent city capital river mountain country what is of which who where named "
    "paris france rome italy berlin germany madrid spain lisbon portugal oslo norway largest "
    "tallest everest nile amazon amazing café naïve 1990s 1990 , . ? ' s"
).split()
SPECIALS = ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_tokenizer(vocab_dir) -> Tokenizer:
    """Train WordPiece on lines of WORDS; re-lay the vocabulary as Google's ([PAD]=0, ...)."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)] + [" ".join(WORDS)]
    trainer_tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    trainer_tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    trainer_tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=400, min_frequency=1, special_tokens=SPECIALS)
    trainer_tok.train_from_iterator(lines, trainer)
    # The trainer breaks ties between equal-count merges differently run to run: keep only its
    # alphabet and the whole words (all of them are learned), in sorted order, so ids are stable.
    words = {
        w
        for line in lines
        for w, _ in trainer_tok.pre_tokenizer.pre_tokenize_str(trainer_tok.normalizer.normalize_str(line))
    }
    learned = sorted(
        t for t in set(trainer_tok.get_vocab()) - set(SPECIALS) if len(t.removeprefix("##")) == 1 or t in words
    )
    assert words <= set(learned), sorted(words - set(learned))
    vocab = SPECIALS + learned
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab.index("[SEP]")), ("[CLS]", vocab.index("[CLS]")))
    tok.decoder = decoders.WordPiece()
    vocab_dir.mkdir(parents=True, exist_ok=True)
    (vocab_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok.save(str(vocab_dir / "tokenizer.json"))
    return tok


@pytest.fixture(scope="session")
def tiny_model_url(tmp_path_factory) -> str:
    """A tiny random BERT (hidden 32, 2 layers, 4 heads, FFN 37) exported with its tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    tok = build_tokenizer(root / "vocab")
    config = tiny_bert_config(vocab_size=tok.get_vocab_size(), max_position_embeddings=128)
    import torch

    torch.manual_seed(0)
    save_pretrained(BertModel(config), str(root / "model"), vocab_url=str(root / "vocab"))
    return str(root / "model")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_url):
    from tasks.finetune import load_tokenizer

    return load_tokenizer(tiny_model_url)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every downstream test on one torch thread (``one_torch_thread``, tests/conftest.py)."""
