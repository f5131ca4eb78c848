"""Tokenizers: the four kinds behind one identity (`tokenizer.py`), training a byte-level BPE
(`bpe.py`), a pretrained model's vocabulary and `tokenizer.json` (`hf_vocab.py`,
`hf_tokenizer_file.py`), its chat template rendered in a sandbox (`chat_template.py`,
`template_sandbox.py`), and how a prompt and answer are framed for the model (`chat.py`)."""
