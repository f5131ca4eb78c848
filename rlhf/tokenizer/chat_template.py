"""A pretrained model's chat template, as a frame around one user turn and one answer.

The pipeline tokenizes each (prompt, response) as `prefix + prompt + infix + response + end`,
encoding the frame's texts with their special tokens and the user's texts as plain text, so that
user text can never become a special token. A Hugging Face chat template is a Jinja program over
a whole conversation; rendering it the way `transformers`' `apply_chat_template` does, with
placeholder contents, shows where the prompt and the answer land and so gives the frame:

- prefix: everything before the prompt (a default system message, Llama-3's bos and date header);
- infix: everything after the prompt when the template is asked for a generation prompt, i.e.
  exactly what the model sees before it starts answering (Qwen3's empty think block included);
- end: the special token that closes the answer when a finished conversation is rendered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime

from rlhf.errors import CheckpointError
from rlhf.tokenizer.template_sandbox import TemplateFailure, render

# Placeholders without whitespace or markup, so that templates that trim or inspect the content
# (Llama-3's `| trim`, Qwen3's `<think>` and `<tool_response>` checks) leave them as they are.
PROMPT_PLACEHOLDER = "PROMPTf4d1c9"
ANSWER_PLACEHOLDER = "ANSWERf4d1c9"


@dataclass(frozen=True)
class ChatFrame:
    """The template text around one user prompt and its answer."""

    prefix: str  # before the user's prompt, e.g. "<|im_start|>user\n"
    infix: str  # between the prompt and the answer, the generation prompt included
    end: str  # right after the answer: exactly one special token, e.g. "<|im_end|>"


BUILTIN_FRAMES: dict[str, ChatFrame] = {
    "chatml": ChatFrame(
        prefix="<|im_start|>user\n",
        infix="<|im_end|>\n<|im_start|>assistant\n",
        end="<|im_end|>",
    ),
    "llama3": ChatFrame(
        prefix="<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n",
        infix="<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        end="<|eot_id|>",
    ),
    "plain": ChatFrame(prefix="", infix="\n\n", end="<|endoftext|>"),
}


def frame_from_template(
    template: str,
    *,
    bos: str | None,
    eos: str | None,
    special_tokens: Iterable[str],
    today: date | None = None,
    source: str = "chat template",
) -> ChatFrame:
    """Frame one user turn and one answer as `template` renders them.

    `today` is the date the template's `strftime_now` reports (Llama-3.2 puts it in the system
    header); pin it to keep the frame, and so every tokenized row, reproducible. It defaults to
    the current date, as in transformers. The template is untrusted: it renders in a bounded
    sandbox (`template_sandbox`). One that cannot render a lone user turn, that does not close
    the answer with a special token, or that passes the sandbox's bounds raises a
    CheckpointError naming `source`, the file it came from.
    """
    user = {"role": "user", "content": PROMPT_PLACEHOLDER}
    answer = {"role": "assistant", "content": ANSWER_PLACEHOLDER}
    try:
        generation, finished = render(
            template,
            [
                _context([user], add_generation_prompt=True, bos=bos, eos=eos),
                _context([user, answer], add_generation_prompt=False, bos=bos, eos=eos),
            ],
            today or datetime.now().date(),
        )
        prefix, infix = _split_at_placeholder(generation, PROMPT_PLACEHOLDER)
        if not finished.startswith(prefix + PROMPT_PLACEHOLDER):
            raise TemplateFailure("it renders the user turn differently once an answer follows")
        _, after_answer = _split_at_placeholder(finished, ANSWER_PLACEHOLDER)
        end = _closing_token(after_answer, special_tokens)
    except TemplateFailure as exc:
        raise CheckpointError(
            f"{source}: the chat template cannot frame one prompt and its answer: {exc}; set "
            f"tokenizer.chat_template to a built-in frame instead ({', '.join(BUILTIN_FRAMES)})"
        ) from None
    return ChatFrame(prefix=prefix, infix=infix, end=end)


def _context(
    messages: list[dict[str, str]], *, add_generation_prompt: bool, bos: str | None, eos: str | None
) -> dict[str, object]:
    """What apply_chat_template renders with: no tools or documents, thinking off (Qwen3), and
    only the special tokens the tokenizer has (an unset one is undefined, not None)."""
    tokens = {"bos_token": bos, "eos_token": eos}
    return {
        "messages": messages,
        "tools": None,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
        "enable_thinking": False,
        **{name: token for name, token in tokens.items() if token is not None},
    }


def _split_at_placeholder(text: str, placeholder: str) -> tuple[str, str]:
    if text.count(placeholder) != 1:
        raise TemplateFailure(
            f"it renders a message's content {text.count(placeholder)} times instead of once"
        )
    before, after = text.split(placeholder)
    return before, after


def _closing_token(after_answer: str, special_tokens: Iterable[str]) -> str:
    """The special token the answer ends with; the longest, should one be a prefix of another."""
    closing = [token for token in special_tokens if token and after_answer.startswith(token)]
    if not closing:
        raise TemplateFailure(
            f"no special token closes the answer (it is followed by {after_answer[:20]!r})"
        )
    return max(closing, key=len)
