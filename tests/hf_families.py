"""Tiny random Hugging Face models of each family the pipeline reads, as transformers builds
them (`tests/unit/models/test_hf_backbones.py`, `test_weights_files.py`)."""

import pytest

transformers = pytest.importorskip("transformers")

VOCAB = 160
SHAPE = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 128}  # fmt: skip
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
FAMILIES = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128)
    ),
    "llama3": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**SHAPE, rope_scaling=LLAMA3_ROPE, rope_theta=500000.0)
    ),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**SHAPE, head_dim=32, tie_word_embeddings=True)
    ),
}
