"""The CUDA path: bf16 autocast rollouts and updates of every RL algorithm on a GPU, and a model
trained there loading on a CPU. Skipped where torch sees no CUDA device; run them on a GPU host
(`pytest tests/gpu/test_cuda.py`, or `bash benchmarks/gpu.sh setup cuda`)."""

import math

import pytest
import torch

from rlhf.algorithms import sft
from rlhf.algorithms.rl.registry import ALGORITHMS
from rlhf.algorithms.rl.trainer import RLTrainer
from rlhf.algorithms.rules import contains_number
from rlhf.algorithms.scorers import RuleScorer
from rlhf.models import attention, backbone, checkpoint
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.models.llama import Llama, LlamaConfig
from rlhf.models.lora import adapters, add_adapters, merged_model
from rlhf.models.packing import packed_hidden_states
from rlhf.params.groups import CriticParams, RLParams, SFTParams
from rlhf.sampling import token_head as token_head_module
from rlhf.sampling.forward import response_forward
from rlhf.sampling.rollout import sample_rollout
from rlhf.sampling.sampler import SamplingConfig
from rlhf.sampling.token_head import entropy, token_head
from rlhf.tokenizer.chat import encode_example
from rlhf.tokenizer.tokenizer import save_tokenizer
from rlhf.train.device import autocast
from rlhf.train.loop import Callbacks, Objective, ResumeFile, fit
from rlhf.train.optim import adamw

from decoding_cases import MODELS, SAMPLINGS, decode
from decoding_cases import PROMPTS as PROMPTS_IDS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")
PROMPTS = [f"What is {a} plus {a + 2}?" for a in range(8)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tok"), "bytes")


def model(tokenizer) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=2, n_embd=64)
    return GPT(config).to(CUDA).eval()


def test_sampled_logprobs_match_the_bf16_training_forward(tokenizer):
    """The log-probs the sampler records (incremental, KV cache) and those a full forward
    recomputes under the same bf16 autocast agree to bf16 precision."""
    policy = model(tokenizer)
    with torch.no_grad(), autocast(CUDA, bf16=True):
        rollout = sample_rollout(
            policy, tokenizer, PROMPTS, SamplingConfig(max_new_tokens=16),
            torch.Generator(CUDA).manual_seed(0),
        )  # fmt: skip
        out = response_forward(
            policy, rollout.sequences, rollout.attention_mask, rollout.prompt_width
        )
    gap = (out.logprobs - rollout.logprobs)[rollout.response_mask].abs().max().item()
    print(f"max |sampled - recomputed log-prob| under bf16: {gap:.2e}")
    assert gap < 0.1


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_iterates_on_cuda_in_bf16(tokenizer, algorithm):
    entry = ALGORITHMS[algorithm]
    group = 1 if algorithm in ("ppo", "reinforce") else 4
    cfg = entry.params(steps=3, batch_size=8 // group, group_size=group, minibatch_size=4)
    policy = model(tokenizer)
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    trainer = RLTrainer(
        entry, cfg, RLParams(max_new_tokens=12), policy=policy, reference=model(tokenizer),
        critic=model(tokenizer) if isinstance(cfg, CriticParams) else None,
        scorer=RuleScorer(contains_number), tokenizer=tokenizer, prompts=PROMPTS, seed=0,
    )  # fmt: skip
    for _ in range(3):
        stats, experience = trainer.iteration()
        assert all(math.isfinite(v) for k, v in stats.items() if k != "explained_variance"), stats
    assert experience.old_logprobs.device.type == "cuda"
    print(f"{algorithm}: approx-KL of the last update {stats['approx_kl']:.2e}")
    moved = any(not torch.equal(start[k], v) for k, v in policy.state_dict().items())
    assert moved


def test_lora_ppo_iterates_on_cuda_in_bf16_and_merges_to_its_logits(tokenizer):
    """Adapters under bf16 autocast: the update moves them alone, the reference is the
    policy with them off, and the merged model gives the adapted logits (in float32)."""
    cfg = ALGORITHMS["ppo"].params(steps=3, batch_size=8, minibatch_size=4, lr=1e-2)
    policy, critic = (add_adapters(model(tokenizer), rank=8, alpha=16.0) for _ in range(2))
    base = {k: v.clone() for k, v in policy.state_dict().items() if "lora_" not in k}
    trainer = RLTrainer(
        ALGORITHMS["ppo"], cfg, RLParams(max_new_tokens=12), policy=policy, reference=None,
        critic=critic, scorer=RuleScorer(contains_number), tokenizer=tokenizer,
        prompts=PROMPTS, seed=0,
    )  # fmt: skip
    for _ in range(3):
        stats, _ = trainer.iteration()
        assert all(math.isfinite(v) for k, v in stats.items() if k != "explained_variance"), stats
    assert all(torch.equal(v, base[k]) for k, v in policy.state_dict().items() if k in base)
    assert any(layer.lora_b.abs().max() > 0 for layer in adapters(policy))
    ids = torch.randint(0, tokenizer.vocab_size, (2, 16), device=CUDA)
    with torch.no_grad():
        gap = (merged_model(policy)(ids) - policy(ids)).abs().max().item()
    print(f"merged vs adapted logits on CUDA: {gap:.2e}")
    assert gap < 1e-4  # float32 matmuls on a GPU (TF32 off by default)


def test_a_model_trained_on_cuda_in_bf16_loads_on_a_cpu_with_its_logits(tokenizer, tmp_path):
    """SFT's loop under bf16 autocast on the GPU learns (the loss falls), and the checkpoint a
    stage writes from the trained model loads on a CPU with the GPU's float32 logits."""
    policy = model(tokenizer)
    examples = [encode_example(tokenizer, p, str(2 * i + 2), 64) for i, p in enumerate(PROMPTS)]
    pad = tokenizer.pad_id
    objective = Objective(lambda rows: sft.batch_loss(policy, [examples[i] for i in rows], pad))
    history, trained = fit(
        policy, SFTParams(epochs=30, batch_size=8, lr=1e-2, warmup_steps=0, save_every=10**6),
        objective, seed=0, n_examples=len(examples), device=CUDA,
        resume=ResumeFile(tmp_path / "resume.pt", "cuda"), callbacks=Callbacks(log=lambda _: None),
    )  # fmt: skip
    losses = [row["train_loss"] for row in history.steps]
    print(f"bf16 SFT on CUDA: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < 0.5 * losses[0]
    path = tmp_path / "policy.pt"
    checkpoint.save(path, checkpoint.model_payload(trained, tokenizer, "cuda", "policy"))
    on_cpu, _ = checkpoint.load_model(path, tokenizer, "cpu")
    ids = torch.randint(0, tokenizer.vocab_size, (2, 16))
    with torch.no_grad():
        cpu_logits, cuda_logits = on_cpu(ids), trained(ids.to(CUDA)).cpu()
    print(f"CPU vs CUDA logits of one checkpoint: {(cpu_logits - cuda_logits).abs().max():.2e}")
    torch.testing.assert_close(cpu_logits, cuda_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt", "qwen3", "gpt+lora"])
def test_graph_decoding_samples_what_eager_decoding_samples(name, monkeypatch):
    """The decoding step compiled and replayed as CUDA graphs (`RLHF_DECODE=graph`, the CUDA
    default) against eager steps, float32, the same row streams: the same tokens (rows ending
    at different steps, top-p's static draws included), log-probs within float rounding."""
    model = MODELS[name]().to(CUDA)
    for config in SAMPLINGS.values():
        eager = decode(model, "eager", config, monkeypatch)
        graphed = decode(model, "graph", config, monkeypatch)
        assert torch.equal(graphed.tokens, eager.tokens)
        torch.testing.assert_close(graphed.logprobs, eager.logprobs, atol=1e-5, rtol=0)


def test_a_shapes_captured_graph_is_replayed_by_later_calls_as_fresh_ones_decode(monkeypatch):
    """Two calls of one shape: the second replays the graph the first captured (the same
    graph object, kept with the model) and gives exactly what a fresh capture gives; answers
    of 40 tokens run as 5 replays of 8 steps (39 rounded up), their extra step dropped."""
    from rlhf.sampling import generate as decoding

    model, config = MODELS["gpt"]().to(CUDA), SAMPLINGS["top-p"]
    other = [[*p[::-1], 30] for p in PROMPTS_IDS[::-1]]
    first = decode(model, "graph", config, monkeypatch, prompts=PROMPTS_IDS)
    (decoder,) = decoding._decoders[model].by_shape.values()
    graph = decoder.graph
    assert graph is not None and decoder.state.tokens.shape[1] == 41
    second = decode(model, "graph", config, monkeypatch, prompts=other)
    (kept,) = decoding._decoders[model].by_shape.values()
    assert kept is decoder and kept.graph is graph
    decoding._decoders.pop(model)
    fresh = decode(model, "graph", config, monkeypatch, prompts=other)
    assert torch.equal(second.tokens, fresh.tokens) and torch.equal(second.logprobs, fresh.logprobs)
    assert first.tokens.shape[1] == 40


def test_graph_decoding_at_gpt2s_vocabulary_and_context(monkeypatch):
    """At GPT-2's 50257 tokens, with a prompt filling most of a 1024-token context (long
    running sums, which CUDA's inductor would split into kernels torch 2.11 fails to
    generate): every sampling rule decodes as graphs the tokens the compiled steps decode
    launched one by one, their log-probs within float rounding (a captured graph's matmuls
    may take other cuBLAS kernels). (Against the eager steps near-uniform logits over 50k
    tokens flip a draw at a float boundary; test_decoding compares the choice itself.)"""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50257, block_size=1024, n_layer=1, n_head=2, n_embd=32)
    model = GPT(config).to(CUDA).eval()
    ids = torch.randint(3, 50257, (16, 900), generator=torch.Generator().manual_seed(1))
    prompts = [row[: 900 if i == 0 else 5 + i].tolist() for i, row in enumerate(ids)]
    for sampling in SAMPLINGS.values():
        compiled = decode(model, "compiled", sampling, monkeypatch, prompts=prompts)
        graphed = decode(model, "graph", sampling, monkeypatch, prompts=prompts)
        assert torch.equal(graphed.tokens, compiled.tokens)
        torch.testing.assert_close(graphed.logprobs, compiled.logprobs, atol=1e-5, rtol=0)


def test_a_compiled_training_step_on_cuda_is_the_eager_step():
    """`train.compile` on CUDA (blocks and the LM loss's chunks compiled) under bf16 autocast:
    three AdamW steps give the eager steps' losses to bf16 precision."""
    losses = []
    for compiled in (False, True):
        torch.manual_seed(0)
        net = GPT(GPTConfig(vocab_size=97, block_size=64, n_layer=2, n_embd=64, bias=False))
        net = net.to(CUDA)
        if compiled:
            net.compile_blocks()
        optimizer = adamw(net, 1e-3, 0.1, (0.9, 0.95))
        ids = torch.randint(0, 97, (8, 64), generator=torch.Generator().manual_seed(1)).to(CUDA)
        for _ in range(3):
            optimizer.zero_grad()
            with autocast(CUDA, bf16=True):
                loss = sft.masked_lm_loss(net, ids[:, :-1], ids[:, 1:])
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    torch.testing.assert_close(losses[3:], losses[:3], atol=2e-2, rtol=0)


def test_the_lm_head_pads_itself_on_cuda_and_computes_the_unpadded_logits(tokenizer):
    """On CUDA the head's matmuls run at a vocabulary padded to a multiple of 64 (GPT-2's
    50,257 to 50,304) with no setting; the logits, sliced to the real vocabulary, are the
    unpadded head's, and the parameters keep the real shape."""
    policy = model(tokenizer)
    weight, vocab = policy.head_weight(16 * 64)
    assert vocab == tokenizer.vocab_size and weight.shape[0] % 64 == 0 and weight.shape[0] > vocab
    assert policy.lm_head.weight.shape[0] == vocab
    ids = torch.randint(0, vocab, (16, 64), device=CUDA)
    with torch.no_grad():
        padded = policy(ids)
        policy.vocab_multiple = 1
        plain = policy(ids)
    assert padded.shape == plain.shape == (16, 64, vocab)
    torch.testing.assert_close(padded, plain, atol=1e-5, rtol=0)


def test_rl_samples_a_float32_policy_through_its_bf16_copy_refreshed_by_each_update(tokenizer):
    """Under bf16 on CUDA the rollouts come from the bf16 sampling copy, which follows every
    update; the sampler's log-probs stay within bf16 rounding of the scoring pass's."""
    cfg = ALGORITHMS["ppo"].params(steps=2, batch_size=8, minibatch_size=4, lr=1e-2)
    trainer = RLTrainer(
        ALGORITHMS["ppo"], cfg, RLParams(max_new_tokens=12), policy=model(tokenizer),
        reference=model(tokenizer), critic=model(tokenizer), scorer=RuleScorer(contains_number),
        tokenizer=tokenizer, prompts=PROMPTS, seed=0,
    )  # fmt: skip
    copy = trainer.experience.sampling_copy
    assert copy is not None and copy.model.lm_head.weight.dtype == torch.bfloat16
    for _ in range(2):
        stats, _ = trainer.iteration()
        print(f"logprob_mismatch through the bf16 copy: {stats['logprob_mismatch']:.2e}")
        assert stats["logprob_mismatch"] < 0.05
    source = trainer.experience.policy.lm_head.weight
    assert torch.equal(copy.refresh().lm_head.weight, source.to(torch.bfloat16))


@pytest.mark.parametrize("family", ["gpt", "llama-gqa"])
def test_packed_forwards_through_varlen_attention_give_the_masked_bins_numbers(family, monkeypatch):
    """Under bf16 autocast a packed forward runs as one stream through varlen attention:
    hidden states and every parameter's gradient within bf16 rounding of the masked bins',
    eager and with the blocks compiled."""
    torch.manual_seed(0)
    if family == "gpt":
        net = GPT(GPTConfig(vocab_size=512, block_size=256, n_layer=2, n_head=4, n_embd=128))
    else:
        net = Llama(LlamaConfig(vocab_size=512, block_size=256, n_head=4, n_kv_head=2,
                                n_embd=128, qk_norm=True))  # fmt: skip
    net = net.to(CUDA)
    lengths = [(5, 60), (17, 3), (30, 41), (2, 90), (11, 11), (25, 70)]
    ids = torch.randint(3, 512, (len(lengths), 30 + 90), device=CUDA)
    real = torch.zeros_like(ids, dtype=torch.bool)
    for row, (p, r) in enumerate(lengths):
        real[row, 30 - p : 30 + r] = True
    assert attention.varlen_available()
    (varlen,), calls = attention.VARLEN, []

    def counted(*args, **options):
        calls.append(1)
        return varlen.kernel(*args, **options)

    monkeypatch.setattr(attention, "VARLEN", [attention.Varlen(counted, varlen.causal)])

    def forward(through_varlen: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        monkeypatch.setattr(backbone, "runs_varlen", lambda *args: through_varlen)
        net.zero_grad()
        with autocast(CUDA, bf16=True):
            hidden = packed_hidden_states(net, ids, real)
            loss = torch.where(real, net.values(hidden).float(), 0.0).square().sum()
        loss.backward()
        return hidden.float(), [p.grad.clone() for p in net.parameters() if p.grad is not None]

    masked, masked_grads = forward(False)
    assert not calls
    for compiled in (False, True):
        if compiled:
            net.compile_blocks()
        segmented, grads = forward(True)
        assert calls
        torch.testing.assert_close(segmented, masked, atol=5e-2, rtol=5e-2)
        for got, want in zip(grads, masked_grads, strict=True):
            assert (got - want).norm() <= 0.05 * want.norm() + 1e-6


def test_the_compiled_token_head_under_bf16_autocast_is_the_plain_head(monkeypatch):
    """RL's chunked, compiled head (the vocabulary padded from 1,000 to 1,024 rows; chunks of
    64 of the 200 tokens) under bf16 autocast: the plain head's log-probs and entropies, and
    gradients within bf16 rounding of autograd's through the plain head (the backward runs
    outside autocast, in the forward's matmul dtype)."""
    monkeypatch.setattr(token_head_module, "CHUNK_TOKENS", 64)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(4, 50, 64, generator=generator).to(CUDA).requires_grad_()
    weight = torch.randn(1000, 64, generator=generator) / 8
    weight = torch.nn.functional.pad(weight, (0, 0, 0, 24)).to(CUDA).requires_grad_()
    tokens = torch.randint(0, 1000, (4, 50), generator=generator).to(CUDA)
    mix = torch.randn(2, 4, 50, generator=generator).to(CUDA)
    results = []
    for chunked in (False, True):
        with autocast(CUDA, bf16=True):
            if chunked:
                logprobs, entropies = token_head(hidden, weight, tokens, 0.8, 1000, True)
            else:
                logits = torch.nn.functional.linear(hidden, weight)[..., :1000].float() / 0.8
                logprobs = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
                entropies = entropy(logits)
        loss = (logprobs * mix[0]).sum() + (entropies * mix[1]).sum()
        results.append((logprobs, entropies, *torch.autograd.grad(loss, (hidden, weight))))
    (*values, grad_hidden, grad_weight), (*chunk_values, chunk_hidden, chunk_weight) = results
    for got, want in zip(chunk_values, values, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for got, want in ((chunk_hidden, grad_hidden), (chunk_weight, grad_weight)):
        assert (got - want).norm() <= 0.02 * want.norm()
