"""Batched sampling with a KV cache over left-padded prompts, one static step at a time.

Left padding puts every prompt's last token in the same column, so one forward per step serves
the whole batch and each row's cache grows by one token. Finished rows keep emitting the pad id.
The pipeline's own tokenizers pad with a token of their own (a model trained with pad == end
learns never to stop); a pretrained one without a pad token (GPT-2's) pads with its end token.

After the prompt's forward (the prefill), every decoding step is one function of tensors with
fixed shapes (`decode_step`): the cache is preallocated for the whole answer, positions, masks
and finished flags stay on the device, and the uniforms of every step are drawn up front. No
step reads a value back to the host, so a GPU runs the steps back to back; whether every row
has ended is checked every `CHECK_EVERY` steps there. How the steps run (`RLHF_DECODE`):
- `eager`: op by op, the reference (the CPU's default: compiling costs more than it saves),
  attending over the cache's columns written so far;
- `compiled`: `torch.compile(fullgraph=True)`;
- `graph` (CUDA's default): compiled, and `CHECK_EVERY` steps captured once as one CUDA graph
  and replayed, so a step costs no kernel launches from Python.
All three give the same tokens from the same uniforms, the compiled steps log-probs within float
rounding of the eager ones (their attention sums over the whole buffer); a model sharded across
processes (FSDP2, whose hooks cannot be captured) decodes eagerly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule

from rlhf.data.batching import left_pad
from rlhf.models.backbone import Backbone
from rlhf.models.cache import KVCache
from rlhf.sampling.sampler import SamplingConfig, choose_from_probs, draws_per_step
from rlhf.sampling.streams import (
    RandomSource,
    RowStreams,
    settle,
    shared_generator,
    uniform_table,
)
from rlhf.tokenizer.chat import decode_response, prompt_ids
from rlhf.tokenizer.tokenizer import Tokenizer

# Steps between checks whether every row has ended on a GPU, where a check makes the host
# wait for the queue: the steps of one CUDA graph. On the CPU a check costs nothing and runs
# after every step.
CHECK_EVERY = 8
# Compiled decoding rounds the cache's length up to a multiple of this, so batches whose
# prompts differ in length share one compiled step (and one captured graph shape).
CACHE_BUCKET = 64
DECODE_MODES = ("auto", "eager", "compiled", "graph")
COMPILE_BACKEND = "inductor"  # the tests check capture alone with "eager"


@dataclass
class Generation:
    prompt: Tensor  # [B, P] left-padded prompt ids
    prompt_mask: Tensor  # [B, P] True for real prompt tokens
    tokens: Tensor  # [B, N] response ids; pad after the end token
    mask: Tensor  # [B, N] True for response tokens, the end token included
    logprobs: Tensor  # [B, N] log-prob of each token under the temperature-scaled logits
    ended: Tensor  # [B] True where the row emitted the end token


@dataclass
class DecodeState:
    """What the decoding steps read and write, all on the model's device."""

    uniforms: Tensor  # [B, N, R] each step's uniforms (R = draws_per_step)
    step: Tensor  # [1] the step being taken
    tokens: Tensor  # [B, N]
    mask: Tensor  # [B, N]
    logprobs: Tensor  # [B, N]
    finished: Tensor  # [B] True once the row emitted the end token


@dataclass(frozen=True)
class Sampling:
    """The constants of a generation's steps (compiled into them)."""

    config: SamplingConfig
    eos_id: int
    pad_id: int
    static: bool  # fixed shapes throughout (compiled and captured steps)


def choose_next(state: DecodeState, logits: Tensor, s: Sampling) -> None:
    """Sample step `state.step`'s token from logits [B, V], record it, and move to the next
    step."""
    # log-probs under the policy itself (what a full forward pass recomputes)
    logp = (logits.float() / s.config.temperature).log_softmax(dim=-1)  # [B, V]
    probs = logp.exp()
    if s.pad_id != s.eos_id:  # padding is no answer token; unless it is the end token itself
        probs[:, s.pad_id] = 0.0
    u = state.uniforms.index_select(1, state.step).squeeze(1)  # [B, R]
    next_token = choose_from_probs(probs, s.config, u, static=s.static)
    token_logprob = logp.gather(-1, next_token[:, None])  # [B, 1]
    active = ~state.finished
    padded = torch.where(active, next_token, s.pad_id)
    state.tokens.index_copy_(1, state.step, padded[:, None])
    state.mask.index_copy_(1, state.step, active[:, None])
    state.logprobs.index_copy_(1, state.step, torch.where(active[:, None], token_logprob, 0.0))
    state.finished.logical_or_(next_token == s.eos_id)
    state.step.add_(1)


def decode_step(model: Backbone, cache: KVCache, state: DecodeState, s: Sampling) -> None:
    """One step: forward the previous step's token of every row (padding where it had
    ended) through the cache, then sample this step's."""
    previous = state.step - 1
    token, active = state.tokens.index_select(1, previous), state.mask.index_select(1, previous)
    choose_next(state, model(token, active, cache)[:, -1], s)


def compiled(function: Callable[..., None]) -> Callable[..., None]:
    """`function` compiled whole (a graph break is an error), for fixed shapes: a new batch
    shape compiles anew, each position and row content reuses it (torch keeps what it
    compiled with the function's code, across calls)."""
    return torch.compile(function, fullgraph=True, dynamic=False, backend=COMPILE_BACKEND)


# Compiled steps one process may keep per function: batch shapes, cache buckets, sampling
# settings and architectures (dynamo's default, 8, would fail a stage that samples in more).
RECOMPILE_LIMIT = 64


def decode_mode(model: Backbone, device: torch.device) -> str:
    """How the steps run: `RLHF_DECODE` (auto: graph on CUDA, else eager), eager wherever
    the model is sharded across processes, compiled for graph off CUDA."""
    mode = os.environ.get("RLHF_DECODE", "auto")
    if mode not in DECODE_MODES:
        raise ValueError(f"RLHF_DECODE={mode!r}: expected one of {', '.join(DECODE_MODES)}")
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        return "eager"
    if mode == "auto":
        return "graph" if device.type == "cuda" else "eager"
    if mode == "graph" and device.type != "cuda":
        return "compiled"
    return mode


def run_steps(step: Callable[[], None], count: int, finished: Tensor, graph: bool) -> None:
    """Call `step` up to `count` times, stopping once every row has ended (checked every
    `CHECK_EVERY` steps on a GPU, every step elsewhere). `graph`: after one warm-up step,
    CHECK_EVERY steps are captured as one CUDA graph and replayed while that many remain."""
    every = CHECK_EVERY if finished.is_cuda else 1
    done = 0
    if graph and count >= 1 + every:
        side = torch.cuda.Stream()  # warm up off the capturing stream, as CUDA graphs need
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        done = 1
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            for _ in range(every):
                step()
        while count - done >= every and not bool(finished.all()):
            captured.replay()
            done += every
    while done < count and (done % every or not bool(finished.all())):
        step()
        done += 1


@torch.no_grad()
def generate(
    model: Backbone,
    prompts: Sequence[Sequence[int]],
    *,
    eos_id: int,
    pad_id: int,
    config: SamplingConfig,
    generator: RandomSource = None,
) -> Generation:
    """Sample responses for token-id prompts; prompts longer than the context keep their end.
    `generator`: a torch generator, or `RowStreams` with a stream for each prompt."""
    device = next(model.parameters()).device
    budget = model.max_seq_len - config.max_new_tokens
    if budget < 1:
        raise ValueError(
            f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in "
            f"a context of {model.max_seq_len} tokens"
        )
    mode = decode_mode(model, device)
    prompt, prompt_mask = left_pad([list(p)[-budget:] for p in prompts], pad_id)
    prompt, prompt_mask = prompt.to(device), prompt_mask.to(device)
    batch, steps = prompt.shape[0], config.max_new_tokens
    length = prompt.shape[1] + steps
    if mode != "eager":
        length = min(-(-length // CACHE_BUCKET) * CACHE_BUCKET, model.max_seq_len)
    cache = model.new_cache(batch, length, device)

    draws = draws_per_step(config, model.config.vocab_size)
    shared = None if isinstance(generator, RowStreams) else shared_generator(generator, device)
    before = shared.get_state() if shared is not None else None
    state = DecodeState(
        uniforms=uniform_table(generator, batch, steps, draws, device),
        step=torch.zeros(1, dtype=torch.long, device=device),
        tokens=torch.full((batch, steps), pad_id, dtype=torch.long, device=device),
        mask=torch.zeros((batch, steps), dtype=torch.bool, device=device),
        logprobs=torch.zeros((batch, steps), device=device),
        finished=torch.zeros(batch, dtype=torch.bool, device=device),
    )
    constants = Sampling(config, eos_id, pad_id, static=mode != "eager")
    first, step = choose_next, decode_step
    if mode != "eager":
        first, step = compiled(choose_next), compiled(decode_step)
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        last_logits = model(prompt, prompt_mask, cache, last_only=True)[:, -1]  # [B, V]
        first(state, last_logits, constants)
        if mode != "eager":  # eager steps attend over the columns written so far, as ever
            cache.start_decoding()
        run_steps(
            lambda: step(model, cache, state, constants), steps - 1, state.finished, mode == "graph"
        )
    if shared is not None and before is not None:  # as stopping at once leaves it
        settle(shared, before, int(state.mask.sum(-1).max()) * draws * batch)
    return Generation(
        prompt=prompt,
        prompt_mask=prompt_mask,
        tokens=state.tokens,
        mask=state.mask,
        logprobs=state.logprobs,
        ended=((state.tokens == eos_id) & state.mask).any(dim=-1),
    )


def generate_texts(
    model: Backbone,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: SamplingConfig,
    *,
    batch_size: int = 64,
    generator: torch.Generator | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[str]:
    """Answer text prompts in batches of similar length; results keep the input order."""
    encoded = [prompt_ids(tokenizer, p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    answers = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        out = generate(
            model,
            [encoded[i] for i in rows],
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
            config=config,
            generator=generator,
        )
        for row, ids in zip(rows, out.tokens.tolist(), strict=True):
            answers[row] = decode_response(tokenizer, ids)
        if on_batch:
            on_batch(len(rows))
    return answers
