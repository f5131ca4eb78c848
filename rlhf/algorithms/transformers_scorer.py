"""Reward models of any family transformers knows (DeBERTa-v3, RoBERTa, Mistral, ...), read
through transformers itself: the `[hf]` extra.

Our own backbones cover GPT-2, Llama and Qwen, and `ExternalRewardScorer` reads those folders
without transformers. Popular reward models come in other families, e.g. OpenAssistant's
DeBERTa-v3 models, encoder classifiers scoring (question, answer) text pairs; re-implementing
each family would buy nothing, since such a model only scores and never trains here. So this
one path imports transformers, and only when `rl.reward: hf:DIR` names such a folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlhf.errors import CheckpointError, PipelineError
from rlhf.models.hf_weights import check_files
from rlhf.tokenizer.template_sandbox import TemplateFailure, render

HF_EXTRA = "pip install -c constraints.txt -e '.[hf]'"
UNBOUNDED_LENGTH = 10**9  # tokenizers without a length limit report a huge sentinel


def import_transformers(folder: Path, model_type: str) -> Any:
    """transformers, or one error saying which extra brings it."""
    try:
        import transformers
    except ImportError as exc:
        raise PipelineError(
            f"{folder}: its {model_type!r} reward model is read through transformers, which is "
            f"not installed; install the project's hf extra: {HF_EXTRA}"
        ) from exc
    return transformers


def check_template(tokenizer: Any, folder: Path) -> None:
    """transformers renders a chat template in this process, on every batch, bounded by
    nothing: render a sample conversation once in the bounded sandbox first, so that a template
    that loops for hours, exhausts memory or fails is refused here, naming the folder. (One
    whose cost grows with the conversation's content could still be slow later.)"""
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: apply_chat_template uses "default"
        template = template.get("default")
    if not isinstance(template, str):
        return
    sample = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    tokens = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    context = {"messages": sample, "add_generation_prompt": False, **tokens}
    try:
        render(template, [context], date.today())
    except TemplateFailure as exc:
        raise CheckpointError(f"{folder}: its chat template cannot be used: {exc}") from None


@dataclass
class TransformersRewardScorer:
    """A one-label `AutoModelForSequenceClassification` and its own tokenizer.

    A tokenizer with a chat template reads (user: prompt, assistant: response) through it, as
    chat reward models expect; one without reads the pair as two segments, the way
    OpenAssistant's DeBERTa models were trained. The raw logit is the reward."""

    model: Any  # transformers.PreTrainedModel
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    max_length: int
    batch_size: int = 64

    @classmethod
    def load(
        cls, folder: str | Path, model_type: str, device: torch.device, bf16: bool = False
    ) -> TransformersRewardScorer:
        folder = Path(folder)
        transformers = import_transformers(folder, model_type)
        check_files(folder)  # transformers would read a hostile header with a traceback
        dtype = torch.bfloat16 if bf16 and device.type == "cuda" else torch.float32
        model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, dtype=dtype)
        if model.config.num_labels != 1:
            raise CheckpointError(
                f"{folder}: a reward model has one output, this classifier has "
                f"{model.config.num_labels} (config.json num_labels)"
            )
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        check_template(tokenizer, folder)
        if tokenizer.pad_token is None:  # decoder classifiers find each row's end by the pad id
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        positions = getattr(model.config, "max_position_embeddings", UNBOUNDED_LENGTH)
        max_length = min(tokenizer.model_max_length, positions, UNBOUNDED_LENGTH)
        return cls(model.to(device).eval().requires_grad_(False), tokenizer, max_length)

    def encode(self, prompts: Sequence[str], responses: Sequence[str]) -> dict[str, Tensor]:
        """One padded batch: chat-templated conversations, or (prompt, response) pairs."""
        common = {"padding": True, "truncation": True, "max_length": self.max_length}
        if self.tokenizer.chat_template:
            texts = [
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}, {"role": "assistant", "content": r}],
                    tokenize=False,
                )
                for p, r in zip(prompts, responses, strict=True)
            ]
            return self.tokenizer(texts, add_special_tokens=False, return_tensors="pt", **common)
        return self.tokenizer(list(prompts), list(responses), return_tensors="pt", **common)

    @torch.inference_mode()
    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> Tensor:
        scores = []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            batch = self.encode(prompts[start:stop], responses[start:stop])
            logits = self.model(**batch.to(self.model.device)).logits  # [B, 1]
            scores.append(logits[:, 0].float().cpu())
        return torch.cat(scores) if scores else torch.zeros(0)
