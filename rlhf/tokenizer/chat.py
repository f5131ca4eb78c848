"""The chat frame applied: how a prompt and a response become one token sequence.

`prefix prompt infix response end`, where the tokenizer holds the frame: the pipeline's own
`<|prompt|> p <|response|> r <|endoftext|>`, or a pretrained model's chat template (ChatML,
Llama-3, ...). Every model sees this one layout: SFT trains on it, sampling answers from its
prompt part, the reward model and DPO score it. User text is encoded as ordinary text, so it
can never produce a special token. Changing this module changes every stage that imports it,
and DVC reruns them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlhf.tokenizer.tokenizer import Tokenizer


def _framed_prompt(tokenizer: Tokenizer, prompt_tokens: Sequence[int]) -> list[int]:
    return [*tokenizer.prefix, *prompt_tokens, *tokenizer.infix]


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """`prefix prompt infix`: the context a policy answers from."""
    return _framed_prompt(tokenizer, tokenizer.encode(prompt))


def decode_response(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """Decode generated ids up to (not including) the first end or pad token."""
    out = []
    for token in ids:
        if token in (tokenizer.eos_id, tokenizer.pad_id):
            break
        out.append(token)
    return tokenizer.decode(out)


@dataclass(frozen=True)
class Example:
    """One chat-formatted sequence: `prefix p infix r end`."""

    ids: list[int]
    response_start: int  # index of the first response token in `ids`
    truncated: bool = False  # prompt or response was cut to fit the context

    @property
    def target_count(self) -> int:
        """The tokens the LM loss is taken over: the response and the end token."""
        return len(self.ids) - self.response_start


def encode_example(tokenizer: Tokenizer, prompt: str, response: str, block_size: int) -> Example:
    """Tokenize and fit into `block_size` tokens.

    Truncation cuts the prompt from the left (the question sits at its end) and the response
    from the right, always keeps the frame and the end token, and gives the response at least
    half the budget, so an overlong prompt never crowds the response out.
    """
    prompt_tokens = tokenizer.encode(prompt)
    response_tokens = tokenizer.encode(response)
    budget = block_size - len(tokenizer.prefix) - len(tokenizer.infix) - 1
    if budget < 2:
        raise ValueError(f"block_size={block_size} is too small for the chat template")
    response_len = min(len(response_tokens), max(budget - len(prompt_tokens), budget // 2))
    prompt_len = min(len(prompt_tokens), budget - response_len)
    framed = _framed_prompt(tokenizer, prompt_tokens[len(prompt_tokens) - prompt_len :])
    ids = [*framed, *response_tokens[:response_len], tokenizer.eos_id]
    truncated = prompt_len < len(prompt_tokens) or response_len < len(response_tokens)
    return Example(ids=ids, response_start=len(framed), truncated=truncated)
