"""Stage processes: what runs outside the flow's process, and how the two sides talk.

``protocol`` is all the parent and the child share (the spec file, progress lines, exit codes,
the parent-death signal, stopping a process tree); ``launch`` is the parent side (a stage
process, the training process or a torchrun tree); ``stage_entry`` and ``train_entry`` are the
children's entry points (``python -m flows.proc.stage_entry``); ``cluster`` runs the pretrain
stage on every host of a GPU cluster or TPU pod. The parent never imports an entry point and an
entry point never imports the launcher. This file imports nothing.
"""
