"""Probe: what a pretrained model knows about the synthetic world, by masked-word prediction.

Three probes, each printed against its chance level, on a model folder in Hugging Face layout
(``bertflow``'s export, or a checkpoint's ``model.safetensors`` with ``--config-from`` an
export or random-init folder for the config and tokenizer):

- *first name -> pronoun*: "<first name> looked at the river for a long time, and then [MASK]
  went home.", "she" vs "he" (chance 50%): single facts, one per first name;
- *animal -> diet*: "The Kesh <animal> feeds on [MASK].", the right diet among the 14 (its first
  word piece; chance about 1 in 14): single facts, one per kind of animal;
- *food or not*: at the same slot, a diet beats a colour, an occupation or a ship type (chance
  50%): the kind of word, which the WNLI and SWAG samples rest on (``synth/glue_sets.py``).

    python benchmarks/probe_knowledge.py /tmp/transfer31/run/export
    python benchmarks/probe_knowledge.py /tmp/transfer31/run/pretrain/phase1/step-00001000/model.safetensors \\
        --config-from /tmp/transfer31/run/random-init
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import torch
from transformers import BertForMaskedLM, BertTokenizerFast
from transformers import logging as hf_logging

from synth.tagging import word_split
from synth.world import ANIMALS, World


def load(path: str, config_from: str | None) -> tuple[BertTokenizerFast, BertForMaskedLM]:
    folder = path
    if path.endswith(".safetensors"):
        if not config_from:
            raise SystemExit("--config-from: a folder with config.json and the tokenizer, for a bare weights file")
        folder = tempfile.mkdtemp(prefix="probe-")
        for name in os.listdir(config_from):
            if name != "model.safetensors" and os.path.isfile(os.path.join(config_from, name)):
                shutil.copy(os.path.join(config_from, name), folder)
        shutil.copy(path, os.path.join(folder, "model.safetensors"))
    return BertTokenizerFast.from_pretrained(folder), BertForMaskedLM.from_pretrained(folder).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model folder, or a model.safetensors with --config-from")
    parser.add_argument("--config-from", default=None)
    parser.add_argument("--people", type=int, default=80, help="people probed (the first blocks' people)")
    args = parser.parse_args()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    tok, model = load(args.model, args.config_from)

    def at_mask(sentence: str) -> torch.Tensor:
        enc = tok(sentence, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0]
        return logits[(enc.input_ids[0] == tok.mask_token_id).nonzero()[0, 0]]

    def piece(word: str) -> int:
        return tok(word, add_special_tokens=False).input_ids[0]

    world = World(0)
    people = [p for b in range(40) for p in world.block(b).people][: args.people]
    she, he = piece("she"), piece("he")
    right = 0
    for p in people:
        logits = at_mask(f"{p.name.split(' ')[0]} looked at the river for a long time, and then [MASK] went home.")
        right += ("she" if logits[she] > logits[he] else "he") == p["pronoun"]
    print(f"first name -> pronoun: {right}/{len(people)} right ({100 * right / len(people):.1f}%; chance 50%)")

    diets = sorted(set(ANIMALS.values()))
    others = sorted(word_split(0))
    right = wins = pairs = 0
    for animal, diet in ANIMALS.items():
        logits = at_mask(f"The Kesh {animal} feeds on [MASK].")
        scores = {d: logits[piece(d)].item() for d in diets}
        right += max(scores, key=scores.get) == diet
        wins += sum(scores[diet] > logits[piece(w)].item() for w in others)
        pairs += len(others)
    print(f"animal -> diet: {right}/{len(ANIMALS)} right (chance: 1 in {len(diets)} diets)")
    print(
        f"food or not: the diet beats another kind of word in {wins}/{pairs} pairs "
        f"({100 * wins / pairs:.1f}%; chance 50%)"
    )


if __name__ == "__main__":
    main()
