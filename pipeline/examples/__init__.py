"""Stage 3, the examples: masked A/B pretraining examples (MLM + NSP) as Parquet shards per length.

``job.run_examples`` is the stage; ``tokens`` (documents to per-bucket token files),
``buckets`` (a bucket read back), ``masking`` (the one masking rule, after the reference
``create_pretraining_data.py``), ``segment`` (CJK word boundaries), ``view`` (shards decoded for
people). This file imports nothing.
"""
