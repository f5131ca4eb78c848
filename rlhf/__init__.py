"""rlhf: the library behind the pipeline (tokenizer, model, data, losses, rollout, checkpoints).

It knows nothing of where files live; the stages in `stages/` decide that.
"""
