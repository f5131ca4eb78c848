"""Backbones and their checkpoints.

Every backbone implements `Backbone` (`backbone.py`): hidden states, LM logits, the value and
reward heads, a KV cache for decoding and optimizer parameter groups. RL, reward-model, DPO and
sampling code talk to models only through that interface; `registry.py` maps the name stored in
a checkpoint to the class that rebuilds it.
"""
