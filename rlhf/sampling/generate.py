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

The static modes keep each shape's buffers (cache and decoding state) and its captured graph
with the model (`Decoder`), so a later call of the same shape copies its prompts and uniforms
in and replays, without compiling or capturing again; the batch is padded up to `batch_to`
rows and the steps up to whole graphs, so the last, smaller batch of a prompt set and any
answer length reuse them too. Replacing or moving the model's parameters drops them; training
updates them in place and keeps them.
"""

from __future__ import annotations

import functools
import os
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

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

    @classmethod
    def empty(cls, batch: int, steps: int, draws: int, device: torch.device) -> DecodeState:
        return cls(
            uniforms=torch.zeros((batch, steps, draws), device=device),
            step=torch.zeros(1, dtype=torch.long, device=device),
            tokens=torch.zeros((batch, steps), dtype=torch.long, device=device),
            mask=torch.zeros((batch, steps), dtype=torch.bool, device=device),
            logprobs=torch.zeros((batch, steps), device=device),
            finished=torch.zeros(batch, dtype=torch.bool, device=device),
        )

    def reset(self, uniforms: Tensor, pad_id: int) -> None:
        """Start a generation in place (a captured graph reads these very tensors): this
        call's uniforms [b, n, R] in the first rows and steps, zeros after them."""
        self.uniforms.zero_()
        self.uniforms[: uniforms.shape[0], : uniforms.shape[1]] = uniforms
        self.step.zero_()
        self.tokens.fill_(pad_id)
        self.mask.zero_()
        self.logprobs.zero_()
        self.finished.zero_()


@dataclass(frozen=True)
class Sampling:
    """The constants of a generation's steps (compiled into them)."""

    config: SamplingConfig
    eos_id: int
    pad_id: int
    static: bool  # fixed shapes throughout (compiled and captured steps)
    # the ids the tokenizer can decode: a pretrained embedding padded past its tokenizer (as
    # Qwen's is, 151,936 rows for 151,665 tokens) must never have the rest drawn
    decodable: int


def choose_next(state: DecodeState, logits: Tensor, s: Sampling) -> None:
    """Sample step `state.step`'s token from logits [B, V], record it, and move to the next
    step."""
    # log-probs under the policy itself (what a full forward pass recomputes)
    logp = (logits.float() / s.config.temperature).log_softmax(dim=-1)  # [B, V]
    probs = logp.exp()
    if s.pad_id != s.eos_id:  # padding is no answer token; unless it is the end token itself
        probs[:, s.pad_id] = 0.0
    if s.decodable < probs.shape[-1]:
        probs[:, s.decodable :] = 0.0
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
    shape compiles anew, each position and row content reuses it. One wrapper per function
    and backend for the process, so calls do not wrap it again."""
    return _compiled(function, COMPILE_BACKEND)


@functools.cache
def _compiled(function: Callable[..., None], backend: str) -> Callable[..., None]:
    return torch.compile(function, fullgraph=True, dynamic=False, backend=backend)


@dataclass
class Decoder:
    """One shape's static buffers, kept with the model between calls: the cache and the
    decoding state, and on CUDA the graph of `CHECK_EVERY` steps captured over them."""

    cache: KVCache
    state: DecodeState
    graph: torch.cuda.CUDAGraph | None = None


# Shapes whose buffers a model keeps (the least recently used goes first): a stage's sampling
# settings and batch shapes, without holding every evaluation's caches at once.
KEPT_DECODERS = 4


@dataclass
class Decoders:
    parameters: tuple[int, ...]  # where the model's parameters lived when these were made
    by_shape: OrderedDict[tuple, Decoder]


_decoders: weakref.WeakKeyDictionary[Backbone, Decoders] = weakref.WeakKeyDictionary()


def parameter_places(model: Backbone) -> tuple[int, ...]:
    """The parameters' storage addresses: replaced or moved parameters change them, in-place
    updates keep them."""
    return tuple(p.data_ptr() for p in model.parameters())


def kept_decoder(model: Backbone, shape: tuple, make: Callable[[], Decoder]) -> Decoder:
    """The model's decoder for `shape`, made (and the oldest dropped) when it has none; all
    of them dropped when the model's parameters moved since they were made."""
    places = parameter_places(model)
    kept = _decoders.get(model)
    if kept is None or kept.parameters != places:
        kept = _decoders[model] = Decoders(places, OrderedDict())
    if shape not in kept.by_shape:
        kept.by_shape[shape] = make()
        while len(kept.by_shape) > KEPT_DECODERS:
            kept.by_shape.popitem(last=False)
    kept.by_shape.move_to_end(shape)
    return kept.by_shape[shape]


# Compiled steps one process may keep per function: batch shapes, cache buckets, sampling
# settings and architectures (dynamo's default, 8, would fail a stage that samples in more).
RECOMPILE_LIMIT = 64


def sharded(model: Backbone) -> bool:
    """Whether FSDP2 shards part of `model`. Only a process that imported FSDP can have
    sharded it, so one that never did answers without that import (over a second of DTensor
    and sympy at every stage's start)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and any(isinstance(m, fsdp.FSDPModule) for m in model.modules())


def decode_mode(model: Backbone, device: torch.device) -> str:
    """How the steps run: `RLHF_DECODE` (auto: graph on CUDA, else eager), eager wherever
    the model is sharded across processes, compiled for graph off CUDA."""
    mode = os.environ.get("RLHF_DECODE", "auto")
    if mode not in DECODE_MODES:
        raise ValueError(f"RLHF_DECODE={mode!r}: expected one of {', '.join(DECODE_MODES)}")
    if sharded(model):
        return "eager"
    if mode == "auto":
        return "graph" if device.type == "cuda" else "eager"
    if mode == "graph" and device.type != "cuda":
        return "compiled"
    return mode


def run_steps(step: Callable[[], None], count: int, finished: Tensor, every: int) -> None:
    """Call `step` `count` times, stopping early once every row has ended, checked every
    `every` steps (a check makes a GPU's host wait for its queue)."""
    for done in range(count):
        if done % every == 0 and bool(finished.all()):
            return
        step()


def replay(graph: torch.cuda.CUDAGraph, count: int, finished: Tensor) -> None:
    """Replay the graph of CHECK_EVERY steps `count` times, stopping early once every row has
    ended (checked between replays)."""
    for _ in range(count):
        if bool(finished.all()):
            return
        graph.replay()


def capture(step: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """CHECK_EVERY steps captured as one CUDA graph, after one step on a side stream (as CUDA
    graphs need: it compiles and allocates) over whatever the buffers hold; the caller
    resets them after."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CHECK_EVERY):
            step()
    return graph


@torch.no_grad()
def generate(
    model: Backbone,
    prompts: Sequence[Sequence[int]],
    *,
    eos_id: int,
    pad_id: int,
    config: SamplingConfig,
    generator: RandomSource = None,
    batch_to: int = 0,
    decodable: int | None = None,
) -> Generation:
    """Sample responses for token-id prompts; prompts longer than the context keep their end.
    `generator`: a torch generator, or `RowStreams` with a stream for each prompt.
    `batch_to`: the static modes decode at least this many rows, padding the batch with
    copies of its first prompt that draw no randomness and whose answers are dropped, so a
    smaller last batch reuses the full batches' compiled step and graph.
    `decodable`: only ids below it are drawn (the tokenizer's size; the whole vocabulary by
    default); the recorded log-probs stay the model's own, over the whole vocabulary."""
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
    draws = draws_per_step(config, model.config.vocab_size)
    shared = None if isinstance(generator, RowStreams) else shared_generator(generator, device)
    before = shared.get_state() if shared is not None else None
    uniforms = uniform_table(generator, batch, steps, draws, device)  # [B, N, R]
    vocab = model.config.vocab_size
    decodable = vocab if decodable is None else min(decodable, vocab)
    constants = Sampling(config, eos_id, pad_id, static=mode != "eager", decodable=decodable)
    if mode == "eager":
        state = eager_generation(model, prompt, prompt_mask, uniforms, constants)
    else:
        graphs = mode == "graph"
        state = static_generation(model, prompt, prompt_mask, uniforms, constants, batch_to, graphs)
    tokens, mask = state.tokens[:batch, :steps].clone(), state.mask[:batch, :steps].clone()
    if shared is not None and before is not None:  # as stopping at once leaves it
        settle(shared, before, int(mask.sum(-1).max()) * draws * batch)
    return Generation(
        prompt=prompt,
        prompt_mask=prompt_mask,
        tokens=tokens,
        mask=mask,
        logprobs=state.logprobs[:batch, :steps].clone(),
        ended=((tokens == eos_id) & mask).any(dim=-1),
    )


def eager_generation(
    model: Backbone, prompt: Tensor, prompt_mask: Tensor, uniforms: Tensor, s: Sampling
) -> DecodeState:
    """The reference: op by op, each step attending over the cache's columns written so far."""
    (batch, steps, draws), device = uniforms.shape, prompt.device
    cache = model.new_cache(batch, prompt.shape[1] + steps, device)
    state = DecodeState.empty(batch, steps, draws, device)
    state.reset(uniforms, s.pad_id)
    choose_next(state, model(prompt, prompt_mask, cache, last_only=True)[:, -1], s)
    every = CHECK_EVERY if device.type == "cuda" else 1
    run_steps(lambda: decode_step(model, cache, state, s), steps - 1, state.finished, every)
    return state


def static_generation(
    model: Backbone,
    prompt: Tensor,
    prompt_mask: Tensor,
    uniforms: Tensor,
    s: Sampling,
    batch_to: int,
    graphs: bool,
) -> DecodeState:
    """The compiled steps over the model's kept buffers for this shape: on CUDA replays of
    CHECK_EVERY captured steps only, the answer's steps rounded up to whole graphs (the steps
    past the answer's length are dropped), every row's end checked between replays."""
    (batch, steps, draws), device = uniforms.shape, prompt.device
    every = CHECK_EVERY if graphs else 1
    rows = max(batch, batch_to)
    if rows > batch:  # [rows, P]: copies of the first prompt
        prompt = torch.cat([prompt, prompt[:1].expand(rows - batch, -1)])
        prompt_mask = torch.cat([prompt_mask, prompt_mask[:1].expand(rows - batch, -1)])
    decode_steps = -(-(steps - 1) // every) * every  # whole graphs
    needed = prompt.shape[1] + decode_steps + 1
    length = min(-(-needed // CACHE_BUCKET) * CACHE_BUCKET, model.max_seq_len)
    if needed > length:  # the rounding would pass the context: the answer's steps only
        decode_steps = steps - 1
    whole, single = divmod(decode_steps, every) if graphs else (0, decode_steps)
    shape = (rows, length, 1 + decode_steps, draws, s, torch.is_autocast_enabled(device.type))
    decoder = kept_decoder(
        model,
        shape,
        lambda: Decoder(
            model.new_cache(rows, length, device),
            DecodeState.empty(rows, 1 + decode_steps, draws, device),
        ),
    )
    cache, state = decoder.cache, decoder.state
    step = functools.partial(compiled(decode_step), model, cache, state, s)

    def start() -> None:  # in place: the prefill and the first token (its choice eager)
        cache.reset()
        state.reset(uniforms, s.pad_id)
        choose_next(state, model(prompt, prompt_mask, cache, last_only=True)[:, -1], s)
        cache.start_decoding()

    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        start()
        if graphs and whole and decoder.graph is None:
            decoder.graph = capture(step)
            start()  # the capture's warm-up step moved the buffers on
        if decoder.graph is not None:
            replay(decoder.graph, whole, state.finished)
        run_steps(step, single, state.finished, every)
    return state


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
            batch_to=batch_size,
            decodable=tokenizer.vocab_size,
        )
        for row, ids in zip(rows, out.tokens.tolist(), strict=True):
            answers[row] = decode_response(tokenizer, ids)
        if on_batch:
            on_batch(len(rows))
    return answers
