"""Backbones and their checkpoints.

Every backbone implements `Backbone` (`backbone.py`): hidden states, LM logits, the value and
reward heads, a KV cache for decoding and optimizer parameter groups. RL, reward-model, DPO and
sampling code talk to models only through that interface; `registry.py` maps the name stored in
a checkpoint to the family that rebuilds it, and a Hugging Face folder's `model_type` to the
family that reads it. Each family is a folder (`gpt/`, `llama/`): its module, its conversion
to and from Hugging Face folders, its `FAMILY` entry.
"""
