"""The shared loop: padding, shuffling, the heads' losses, and best-epoch keeping."""

import pytest
import torch
from tiny_bert import tiny_bert_config

from model.bert import BertModel
from tasks.config import FinetuneConfig
from tasks.finetune import collate, epoch_order, prepare_output, train
from tasks.heads import BertForQuestionAnswering, BertForSequenceClassification

CONFIG = tiny_bert_config()


def test_collate_pads_to_the_longest_row():
    rows = [
        {"input_ids": [5, 6, 7], "token_type_ids": [0, 0, 1], "labels": 1},
        {"input_ids": [5], "token_type_ids": [0], "labels": 0},
    ]
    batch = collate(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 1], [0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].dtype == torch.long
    floats = collate([{"input_ids": [1], "token_type_ids": [0], "labels": 2.5}])
    assert floats["labels"].dtype == torch.float and floats["labels"].tolist() == [2.5]


def test_epoch_order_is_a_seeded_permutation():
    assert sorted(epoch_order(50, 1, 1)) == list(range(50))
    assert epoch_order(50, 1, 1) == epoch_order(50, 1, 1)
    assert epoch_order(50, 1, 1) != epoch_order(50, 1, 2) != epoch_order(50, 2, 2)


def test_heads_losses():
    torch.manual_seed(0)
    ids = torch.randint(1, 99, (3, 7))
    reg = BertForSequenceClassification(BertModel(CONFIG), num_labels=1).eval()
    out = reg(ids, labels=torch.tensor([0.5, 1.0, 4.0]))
    assert out.logits.shape == (3, 1)
    mse = ((out.logits.squeeze(-1) - torch.tensor([0.5, 1.0, 4.0])) ** 2).mean()
    assert out.loss.item() == pytest.approx(mse.item())
    qa = BertForQuestionAnswering(BertModel(CONFIG)).eval()
    out = qa(ids, start_positions=torch.tensor([1, 2, 99]), end_positions=torch.tensor([3, 2, 99]))
    assert out.start_logits.shape == (3, 7) and out.end_logits.shape == (3, 7)
    # the third row's positions lie outside the sequence: ignored
    expected = (
        torch.nn.functional.cross_entropy(out.start_logits[:2], torch.tensor([1, 2]))
        + torch.nn.functional.cross_entropy(out.end_logits[:2], torch.tensor([3, 2]))
    ) / 2
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_train_keeps_the_best_epochs_weights():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertModel(CONFIG), num_labels=2)
    features = [{"input_ids": [2, i % 90 + 5, 3], "token_type_ids": [0, 0, 0], "labels": i % 2} for i in range(12)]
    snapshots, scores = [], iter([0.3, 0.9, 0.5])

    def evaluate(m):
        snapshots.append({k: v.clone() for k, v in m.state_dict().items()})
        return {"eval_accuracy": next(scores)}

    config = FinetuneConfig(learning_rate=1e-2, batch_size=4, epochs=3, warmup_proportion=0.0)
    result = train(model, features, config, evaluate, "eval_accuracy", device=torch.device("cpu"))
    assert result.best_epoch == 2 and result.steps == 9 and len(result.history) == 3
    assert result.best_metrics["eval_accuracy"] == 0.9
    state = model.state_dict()
    assert all(torch.equal(state[k], snapshots[1][k]) for k in state)
    assert not torch.equal(snapshots[1]["classifier.weight"], snapshots[2]["classifier.weight"])
    with pytest.raises(KeyError, match="no 'eval_f1'"):
        train(model, features, config, lambda m: {"eval_accuracy": 1.0}, "eval_f1")


def test_prepare_output_refuses_an_input_folder(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "stale.txt").write_text("x")
    prepare_output(str(tmp_path / "out"), str(tmp_path / "data"))
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="would overwrite the input"):
        prepare_output(str(tmp_path), str(tmp_path / "data" / "SST-2"))
