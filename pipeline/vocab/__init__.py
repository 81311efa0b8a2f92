"""Stage 2, the vocab: a WordPiece vocabulary in Google's ``vocab.txt`` layout.

``job.run_vocab`` is the stage; ``wordpiece`` trains (deterministically), ``tokenizer`` builds
the BERT tokenizer every later stage uses. This file imports nothing.
"""
