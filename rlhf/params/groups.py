"""What each params group of params.yaml holds: a frozen dataclass per group (a stage's, or what
several share), every field documented and bounded (`schema.spec`). A check within one group
is its own `__post_init__`; checks across groups are `Params`' (`rlhf/params/__init__.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.errors import ParamsError
from rlhf.params.schema import MAX_SEED, spec

TASK_FAMILIES = ("greet", "add", "capital", "repeat", "refuse", "uppercase")
# by extractor of `check:EXTRACTOR`, the families whose reference it finds in a right answer
# (capitals, repeats and uppercase words carry references too, but no extractor reads them)
CHECKABLE_TASKS = {"last_number": ("add",)}
# RL algorithms, each with its own params group of the same name (rlhf/algorithms/rl/registry.py)
RL_ALGORITHMS = ("ppo", "reinforce", "rloo", "grpo")


@dataclass(frozen=True)
class TokenizerParams:
    kind: Literal["bpe", "bytes", "tiktoken", "pretrained"] = spec(
        "bpe",
        "`bpe`: byte-level BPE trained on the SFT training texts (tiktoken rank file); "
        "`bytes`: 256 byte tokens, no merges; `tiktoken`: a named tiktoken encoding, which needs "
        "tiktoken's file cache (TIKTOKEN_CACHE_DIR) or network access; `pretrained`: the "
        "tokenizer of the model folder in `model.init`, used as is (required with a folder).",
    )
    vocab_size: int = spec(
        2048,
        "Upper bound on mergeable tokens for `bpe` (256 bytes + merges). Training stops earlier "
        "when no pair occurs twice, so a small corpus yields a smaller vocabulary.",
        ge=257,
        le=200_000,
    )
    encoding: str = spec("gpt2", "Named tiktoken encoding for kind `tiktoken` (gpt2, cl100k_base).")
    chat_template: Literal["auto", "chatml", "llama3", "plain"] = spec(
        "auto",
        "How kind `pretrained` frames a prompt and its answer: `auto` renders the folder's own "
        "chat template (tokenizer_config.json), or `plain` when it has none; `chatml` (Qwen), "
        "`llama3` and `plain` (prompt, a blank line, the answer, <|endoftext|>; GPT-2) are "
        "built in.",
    )


@dataclass(frozen=True)
class ModelParams:
    init: str = spec(
        "scratch",
        "`scratch`: a GPT with the architecture below, randomly initialized; or the path of a "
        "Hugging Face model folder (config.json, safetensors weights, tokenizer files) of "
        "GPT-2, Llama-3.x, Qwen2/2.5 or Qwen3, whose architecture and weights the SFT stage "
        "starts from (the fields below but block_size are then unused). Run `rlhf dvc-yaml` "
        "after changing it, so that DVC tracks the folder.",
    )
    n_layer: int = spec(4, "Transformer blocks.", ge=1, le=96)
    n_head: int = spec(4, "Attention heads; must divide n_embd.", ge=1, le=128)
    n_embd: int = spec(128, "Residual stream width.", ge=8, le=16384)
    block_size: int = spec(
        96,
        "Context length in tokens (prompt + response). A pretrained model is cut to it: at "
        "most its own context, and what an export declares.",
        ge=8,
        le=32768,
    )
    mlp_width: int = spec(0, "Hidden units per MLP; 0 means 4 * n_embd as in GPT-2.", ge=0)
    dropout: float = spec(
        0.0, "Dropout in training. Keep 0 for RL: it makes PPO's ratios noisy.", ge=0.0, lt=1.0
    )
    bias: bool = spec(True, "Bias terms in Linear and LayerNorm layers.")


@dataclass(frozen=True)
class MemoryParams:
    activation_checkpointing: bool = spec(
        False,
        "Recompute each transformer block in the backward pass instead of keeping its "
        "activations (SFT, reward model, DPO, RL policy and critic): about a third more "
        "compute for a fraction of the activation memory, for long contexts and large models.",
    )
    frozen_bf16: bool = spec(
        False,
        "Hold the models that are not trained (RL's reference policy, the policies collection "
        "and evaluation sample from) in bfloat16 weights on CUDA: half their memory, at "
        "bfloat16's precision for the KL they give. Ignored on the CPU.",
    )


@dataclass(frozen=True)
class TrainParams:
    strategy: Literal["ddp", "fsdp2"] = spec(
        "ddp",
        "How the processes `RLHF_NPROC` starts hold the models the training stages train "
        "(SFT's, the reward model, DPO's, an RL policy and critic). `ddp`: each holds all of "
        "it and gradients are averaged; `fsdp2`: parameters, gradients and optimizer state "
        "are sharded across them (torch's `fully_shard`, per transformer block), bfloat16 "
        "compute with float32 gradient reduction under the stage's bf16 on CUDA, for models "
        "whose training does not fit one GPU; the whole model is gathered for sampling, the "
        "evaluation and the outputs, and RL's frozen reference stays whole on each. The same "
        "numbers either way on the CPU; on CUDA under bf16 the sharded model computes with "
        "bfloat16 weights where ddp autocasts float32 ones.",
    )
    compile: Literal["auto", "on", "off"] = spec(
        "auto",
        "Compile the training and scoring forwards of the stages in this group (SFT, reward "
        "model, DPO, RL: each transformer block, and the LM loss's chunks, with "
        "`torch.compile`). `auto`: where the device is CUDA; `on`: on the CPU too (compiling "
        "takes longer there than it saves on the default config). Not under `fsdp2` with "
        "several processes, whose blocks stay eager. The time spent compiling is logged once "
        "per stage. Sampling compiles its decoding step by `RLHF_DECODE` instead.",
    )


@dataclass(frozen=True)
class DataParams:
    source: Literal["synthetic", "files"] = spec(
        "synthetic",
        "`synthetic`: draw demonstrations from the built-in task suite (a gold judge scores "
        "answers); `files`: read data/raw/sft.parquet written by `rlhf import`.",
    )
    tasks: tuple[str, ...] = spec(TASK_FAMILIES, "Task families drawn by the synthetic source.")
    n_train: int = spec(4000, "Synthetic training demonstrations.", ge=1)
    n_val: int = spec(300, "Synthetic validation demonstrations.", ge=1)
    n_heldout: int = spec(240, "Held-out evaluation prompts, split evenly across families.", ge=1)
    n_prompts: int = spec(
        3000,
        "Training prompts for comparison collection and RL, in equal shares per family (a "
        "family with a small prompt space repeats its prompts).",
        ge=1,
    )
    demo_noise: float = spec(
        0.3,
        "Share of synthetic demonstrations that are deliberately flawed (wrong, rambling, "
        "missing refusal), so later stages have something real to fix.",
        ge=0.0,
        le=1.0,
    )
    val_fraction: float = spec(0.05, "Share of imported rows held for validation.", gt=0.0, lt=1.0)
    heldout_fraction: float = spec(
        0.05, "Share of imported prompts held out for evaluation.", gt=0.0, lt=1.0
    )


@dataclass(frozen=True)
class OptimParams:
    """Optimizer and schedule settings shared by every gradient-trained stage."""

    epochs: int = spec(4, "Passes over the training set.", ge=1)
    batch_size: int = spec(32, "Examples per optimizer step.", ge=1)
    lr: float = spec(2e-3, "Peak AdamW learning rate.", gt=0.0, le=1.0)
    min_lr_ratio: float = spec(0.1, "Cosine decay floor as a share of lr.", ge=0.0, le=1.0)
    warmup_steps: int = spec(30, "Linear warmup steps.", ge=0)
    weight_decay: float = spec(0.1, "AdamW decay on matrices (not biases, norms).", ge=0.0)
    beta1: float = spec(0.9, "AdamW beta1.", ge=0.0, lt=1.0)
    beta2: float = spec(0.95, "AdamW beta2.", ge=0.0, lt=1.0)
    grad_clip: float = spec(1.0, "Global gradient-norm clip; 0 disables.", ge=0.0)
    bf16: bool = spec(True, "bf16 autocast on CUDA (ignored on CPU).")
    save_every: int = spec(50, "Steps between resume checkpoints.", ge=1)


@dataclass(frozen=True)
class SFTParams(OptimParams):
    eval_max_new_tokens: int = spec(32, "Answer length cap when scoring held-out prompts.", ge=1)
    eval_batch_size: int = spec(256, "Prompts per batched generation in evaluation.", ge=1)


@dataclass(frozen=True)
class CollectParams:
    source: Literal["policy", "files"] = spec(
        "policy",
        "`policy`: sample K answers per training prompt from the SFT model and rank them with "
        "the gold judge plus labeler noise; `files`: comparisons imported with `rlhf import "
        "--kind pairwise|hh|ranked` into data/raw/comparisons.parquet.",
    )
    k: int = spec(4, "Responses sampled and ranked per prompt (InstructGPT used 4 to 9).", ge=2)
    include_demo: bool = spec(False, "Add the prompt's SFT demonstration to its K samples.")
    explore: int = spec(
        2,
        "Answers per training prompt sampled at `explore_temperature` and added to its "
        "ranking: the truncated, repetitive and off-topic answers that a policy under "
        "optimization finds, which a reward model must have seen to score low. Held-out "
        "comparisons never get them.",
        ge=0,
    )
    explore_temperature: float = spec(1.6, "Sampling temperature of the `explore` answers.", gt=0)
    mismatched: int = spec(
        3,
        "Answers sampled for other prompts of the same task added to each training prompt's "
        "ranking. Without them the RM can score how an answer looks and ignore what was asked "
        "(`Hello, Irene!` to `Greet Xavier.`), which PPO would exploit. `source: policy` only; "
        "held-out comparisons never get them.",
        ge=0,
    )
    temperature: float = spec(1.0, "Sampling temperature.", gt=0.0)
    top_p: float = spec(1.0, "Nucleus sampling mass.", gt=0.0, le=1.0)
    max_new_tokens: int = spec(32, "Answer length cap.", ge=1)
    batch_size: int = spec(256, "Prompts per batched generation.", ge=1)
    label_noise: float = spec(
        0.25,
        "Target share of comparisons whose label disagrees with the gold judge (labelers agreed "
        "about 73% of the time in InstructGPT). Noise is larger for close pairs, as for people.",
        ge=0.0,
        lt=0.5,
    )
    val_fraction: float = spec(0.1, "Share of prompts whose comparisons are held out.", gt=0, lt=1)
    labeler: str = spec(
        "gold",
        "Who ranks the sampled answers (`source: policy`): `gold`, simulated people (the task "
        "suite's gold judge plus `label_noise`; suite prompts only); `rm:PATH`, a reward-model "
        "checkpoint of an earlier run, and `hf:DIR`, a reward model folder trained elsewhere "
        "(AI feedback: its scores ranked as they are, equal scores tied; any prompts); "
        "`check:EXTRACTOR`, the answer checker (right final answers above wrong ones, each "
        "prompt needs a reference); `human`, people ranking in the terminal: collect writes "
        "labeling/queue.parquet and stops until `rlhf label` has ranked every item "
        "`labels_per_item` times, their labels in labeling/labels/. The checkpoint, folder or "
        "labels folder is a DVC dep of collect.",
    )
    labels_per_item: int = spec(
        1,
        "`labeler: human`: labelers who must rank each item before collect goes on. Two or "
        "more give the inter-labeler agreement InstructGPT reported (72-77%); every label "
        "becomes its own comparison.",
        ge=1,
    )

    def answers_per_item(self) -> int:
        """The most answers one prompt's ranking holds."""
        return self.k + int(self.include_demo) + self.explore + self.mismatched


@dataclass(frozen=True)
class RMParams(OptimParams):
    epochs: int = spec(3, "Passes over the comparisons.", ge=1)
    batch_size: int = spec(16, "Prompts per step; each brings all its C(K,2) pairs.", ge=1)
    lr: float = spec(
        3e-4, "Peak AdamW learning rate; higher rates erode the SFT features.", gt=0.0, le=1.0
    )
    warmup_steps: int = spec(20, "Linear warmup steps.", ge=0)
    pooling: Literal["last", "mean"] = spec(
        "last", "`last`: reward read at the end token; `mean`: averaged over response tokens."
    )
    norm_samples: int = spec(
        1000, "SFT demonstrations scored to set the reward's zero mean and record its std.", ge=1
    )
    eval_batch_size: int = spec(256, "Sequences per batch when scoring.", ge=1)


@dataclass(frozen=True)
class DPOParams(OptimParams):
    """DPO on the SFT policy with the reward model's comparisons (Rafailov et al. 2023)."""

    epochs: int = spec(2, "Passes over the comparisons.", ge=1)
    batch_size: int = spec(8, "Prompts per step; each brings all its ranked pairs.", ge=1)
    lr: float = spec(
        3e-4,
        "Peak AdamW learning rate. Higher rates (1e-3 here) drive the KL to SFT past 4 nats, "
        "answers grow longer and stop ending, and the gold score falls below SFT's.",
        gt=0.0,
        le=1.0,
    )
    warmup_steps: int = spec(20, "Linear warmup steps.", ge=0)
    weight_decay: float = spec(0.0, "AdamW decay on matrices.", ge=0.0)
    beta: float = spec(
        0.5,
        "Strength of the implicit KL constraint: the implicit reward is beta times the "
        "log-ratio to the SFT reference; smaller beta lets the policy move further.",
        gt=0.0,
    )
    loss: Literal["sigmoid", "ipo"] = spec(
        "sigmoid",
        "`sigmoid`: the DPO loss -log sigmoid(beta h); `ipo`: (h - 1/(2 beta))^2, which stops "
        "at a margin instead of pushing pairs apart forever.",
    )
    label_smoothing: float = spec(
        0.0,
        "Conservative DPO (sigmoid only): the assumed share of flipped labels; the collected "
        "labels disagree with the gold order about collect.label_noise of the time.",
        ge=0.0,
        lt=0.5,
    )
    eval_batch_size: int = spec(64, "Prompts per forward when measuring validation pairs.", ge=1)


@dataclass(frozen=True)
class RLParams:
    """What every RL algorithm shares: the reward, how rollouts are sampled, the bookkeeping.
    Every RL stage depends on this group, so the algorithms are always compared on the same
    task; how each one optimizes is its own group (`ppo`, `grpo`, ...)."""

    reward: str = spec(
        "rm",
        "`rm`: the reward model's score at the end token, divided by its recorded std; "
        "`rule:NAME`: a reward function registered in rlhf/algorithms/rules.py "
        "(`rule:contains_number`, `rule:gold`); `hf:DIR`: a reward model trained elsewhere, a "
        "one-label *ForSequenceClassification folder scoring through its own tokenizer, its raw "
        "score as the reward (GPT-2, Llama, Qwen natively; other families such as DeBERTa-v3 "
        "through transformers, the `[hf]` extra); `ensemble`: the reward model plus the "
        "sources in `ensemble`, combined by `ensemble_reduce` (min resists reward hacking); "
        "`check:EXTRACTOR`: 1 where the answer's final answer (`last_number`, GSM8K's `gsm8k` "
        "`#### N`, MATH's `boxed`) is the prompt's reference, else 0 (every prompt needs one).",
    )
    ensemble: tuple[str, ...] = spec(
        (),
        "`reward: ensemble`: what scores beside the trained reward model, each spelled as a "
        "reward source: `rm:PATH` (a reward-model checkpoint of an earlier run), `hf:DIR`, "
        "`rule:NAME` or `check:EXTRACTOR` (the answer checker: every prompt needs a reference). "
        "Files and folders named here are DVC deps of the RL stages.",
    )
    ensemble_reduce: Literal["mean", "min", "weighted_sum"] = spec(
        "min",
        "How the ensemble's scores combine: `min` (a policy gets no credit one member denies: "
        "against reward hacking), `mean`, or `weighted_sum` by `ensemble_weights` (the reward "
        "model's score plus an answer checker's 0 or 1, for one).",
    )
    ensemble_weights: tuple[float, ...] = spec(
        (),
        "`ensemble_reduce: weighted_sum`: the trained reward model's weight, then one per "
        "`ensemble` entry, in its order; empty for the other reductions.",
    )
    format_reward: float = spec(
        0.0,
        "`reward: check:EXTRACTOR`: the reward of a wrong final answer the extractor found (the "
        "answer kept the format); a right one gets 1, one without a final answer 0.",
        ge=0.0,
        le=1.0,
    )
    missing_eos_penalty: float = spec(
        1.0, "Subtracted from the score of a response that never emitted the end token.", ge=0.0
    )
    length_penalty: float = spec(0.0, "Subtracted from the score per response token.", ge=0.0)
    reward_clip: float = spec(5.0, "Scores are clipped to [-reward_clip, reward_clip].", gt=0.0)
    overlong_buffer: int = spec(
        0,
        "DAPO's overlong shaping: an answer within this many tokens of max_new_tokens loses "
        "up to `overlong_penalty`, linearly in how far into the buffer it runs (an answer "
        "max_new_tokens long loses all of it); 0 turns it off. It adds to missing_eos_penalty "
        "(set that to 0 to shape cut answers by their length alone); below max_new_tokens.",
        ge=0,
    )
    overlong_penalty: float = spec(
        1.0, "The most `overlong_buffer` subtracts from an answer's score.", ge=0.0
    )
    temperature: float = spec(1.0, "Rollout sampling temperature.", gt=0.0)
    top_k: int = spec(0, "Rollout top-k; 0 keeps every token.", ge=0)
    top_p: float = spec(1.0, "Rollout nucleus mass.", gt=0.0, le=1.0)
    max_new_tokens: int = spec(32, "Response length cap.", ge=1)
    kl_estimator: Literal["k1", "k3"] = spec(
        "k1",
        "KL estimator of the logged `kl`: k1 = log p - log p_ref per sampled token, k3 = "
        "(r - 1) - log r with r = p_ref / p. What the algorithms optimize is their own: the "
        "penalty in the reward is k1, GRPO's loss term k3.",
    )
    lora_rank: int = spec(
        0,
        "0 trains every weight of the policy (and of a separate critic). A rank r > 0 freezes "
        "them and trains a rank-r LoRA adapter on each linear layer of their blocks instead "
        "(plus the value head): the reference is then the policy with its adapters off, so "
        "one copy of the base weights serves both; the policy written has the adapters "
        "merged. LoRA wants a larger learning rate than full fine-tuning (about 10x).",
        ge=0,
        le=1024,
    )
    lora_alpha: float = spec(
        16.0, "LoRA scaling: an adapter's update is multiplied by lora_alpha / lora_rank.", gt=0.0
    )
    microbatch_tokens: int = spec(
        16384,
        "Most tokens (prompts and answers) one forward and backward pass of an update, or one "
        "scoring forward, takes. A minibatch with more runs as several such passes whose "
        "gradients add up before its one optimizer step (gradient accumulation): the "
        "minibatch is the algorithm's choice, this budget the device's memory's. A row longer "
        "than the budget runs alone.",
        ge=1,
    )
    save_every: int = spec(10, "Iterations between resume checkpoints.", ge=1)
    snapshot_every: int = spec(
        20,
        "Iterations between policy snapshots, which the evaluation scores for its "
        "over-optimization curve (reward-model and gold score against KL to SFT); 0 keeps none.",
        ge=0,
    )
    log_samples_every: int = spec(10, "Iterations between logged sample answers.", ge=1)
    eval_batch_size: int = spec(256, "Prompts per batched generation in evaluation.", ge=1)
    eval_samples: int = spec(
        4, "Answers sampled per held-out prompt, per policy, for the gold evaluation.", ge=1
    )


@dataclass(frozen=True)
class PolicyOptimParams:
    """How an RL algorithm optimizes the policy: what every algorithm's group holds."""

    steps: int = spec(80, "Iterations, each one rollout batch and its updates.", ge=1)
    batch_size: int = spec(64, "Prompts per rollout.", ge=1)
    group_size: int = spec(1, "Answers sampled per prompt in a rollout.", ge=1)
    minibatch_size: int = spec(16, "Answers per gradient step in the update.", ge=1)
    lr: float = spec(1e-4, "Policy peak AdamW learning rate.", gt=0.0, le=1.0)
    min_lr_ratio: float = spec(
        1.0, "Cosine decay floor as a share of lr (1 = constant).", ge=0.0, le=1.0
    )
    warmup_steps: int = spec(0, "Linear warmup iterations.", ge=0)
    weight_decay: float = spec(0.0, "AdamW decay on matrices.", ge=0.0)
    beta1: float = spec(0.9, "AdamW beta1.", ge=0.0, lt=1.0)
    beta2: float = spec(0.95, "AdamW beta2.", ge=0.0, lt=1.0)
    grad_clip: float = spec(1.0, "Global gradient-norm clip per model; 0 disables.", ge=0.0)
    bf16: bool = spec(True, "bf16 autocast on CUDA (ignored on CPU).")
    kl_coef: float = spec(0.2, "Initial coefficient beta of the KL to the SFT policy.", ge=0.0)
    kl_target: float = spec(
        0.0, "Adaptive KL: target KL per response (nats); 0 keeps beta fixed.", ge=0.0
    )
    kl_horizon: int = spec(10_000, "Adaptive KL horizon in samples (Ziegler et al.).", ge=1)
    entropy_coef: float = spec(0.0, "Entropy bonus weight.", ge=0.0)
    loss_aggregation: Literal["token_mean", "answer_mean", "fixed_length"] = spec(
        "token_mean",
        "How the per-token losses of a minibatch add up: `token_mean`, the mean over all its "
        "answer tokens (DAPO's token-level loss: a long answer weighs as much per token as a "
        "short one); `answer_mean`, each answer's token mean, then the mean over answers (the "
        "GRPO paper's; a long answer's tokens count less); `fixed_length`, each answer's token "
        "sum over rl.max_new_tokens, then the mean over answers (Dr. GRPO: no length bias).",
    )
    ptx_coef: float = spec(
        0.0, "PPO-ptx: weight of the SFT language-model loss mixed into each update.", ge=0.0
    )
    ptx_batch_size: int = spec(16, "SFT demonstrations per PPO-ptx term.", ge=1)


@dataclass(frozen=True)
class CriticParams(PolicyOptimParams):
    """An algorithm that learns a value function."""

    critic: Literal["separate", "shared"] = spec(
        "separate",
        "`separate`: a critic initialized from the reward model (InstructGPT's choice); "
        "`shared`: a value head on the policy trunk (half the compute, coupled updates).",
    )
    critic_lr: float = spec(1e-3, "Critic peak AdamW learning rate.", gt=0.0, le=1.0)
    vf_coef: float = spec(0.5, "Value-loss weight (shared critic only).", ge=0.0)
    cliprange_value: float = spec(0.2, "Value clip around the rollout values.", gt=0.0)


@dataclass(frozen=True)
class ClipParams(PolicyOptimParams):
    """An algorithm with PPO's clipped importance ratio, which makes several passes over each
    rollout sound."""

    update_epochs: int = spec(4, "Passes over each rollout batch.", ge=1)
    cliprange: float = spec(0.2, "Clip of the ratio pi / pi_rollout.", gt=0.0)
    cliprange_high: float = spec(
        0.0,
        "The upper clip of the ratio where it differs from `cliprange` (DAPO's clip-higher, "
        "0.28 with cliprange 0.2: room for unlikely tokens to gain); 0 clips symmetrically.",
        ge=0.0,
    )
    importance_ratio: Literal["token", "sequence"] = spec(
        "token",
        "`token`: each token's own ratio pi / pi_rollout (PPO, GRPO); `sequence`: every token "
        "of an answer takes the answer's ratio, the geometric mean of its tokens' (GSPO, "
        "Zheng et al. 2025, which clips it far tighter: cliprange 3e-4, cliprange_high 4e-4, "
        "and pairs it with loss_aggregation: answer_mean; under token_mean a long answer's "
        "ratio gradient counts once per token).",
    )
    target_approx_kl: float = spec(
        0.0,
        "Stop an iteration's passes once the mean approx-KL of the last pass exceeds this; "
        "approx-KL is the k3 estimate of KL(rollout policy || current policy) over the "
        "sampled tokens, (r - 1) - log r with r = pi / pi_rollout. 0 never stops early.",
        ge=0.0,
    )


@dataclass(frozen=True)
class PPOParams(CriticParams, ClipParams):
    """PPO against the reward model (InstructGPT section 3.5): the KL penalty in every token's
    reward, per-token GAE advantages, the clipped surrogate."""

    gamma: float = spec(1.0, "Discount.", ge=0.0, le=1.0)
    lam: float = spec(0.95, "GAE lambda.", ge=0.0, le=1.0)


@dataclass(frozen=True)
class ReinforceParams(CriticParams):
    """REINFORCE with the critic as baseline: one advantage per answer (its whole return minus
    the value before its first token), one pass, no ratio and no clipping."""


@dataclass(frozen=True)
class RLOOParams(PolicyOptimParams):
    """REINFORCE leave-one-out (Ahmadian et al. 2024): `group_size` answers per prompt, each
    answer's baseline the mean return of the others; no critic, one pass, no clipping."""

    batch_size: int = spec(16, "Prompts per rollout.", ge=1)
    group_size: int = spec(4, "Answers sampled per prompt; the baseline needs two.", ge=2)


@dataclass(frozen=True)
class GRPOParams(ClipParams):
    """GRPO (Shao et al. 2024): `group_size` answers per prompt, advantages normalized within
    the group, the clipped surrogate, and the KL to the SFT policy as a loss term (k3 estimator,
    weight `kl_coef`) instead of a penalty in the reward; no critic."""

    batch_size: int = spec(16, "Prompts per rollout.", ge=1)
    group_size: int = spec(4, "Answers sampled per prompt; normalizing needs two.", ge=2)
    update_epochs: int = spec(2, "Passes over each rollout batch.", ge=1)
    kl_coef: float = spec(0.05, "Weight beta of the KL loss term.", ge=0.0)
    max_sampling_rounds: int = spec(
        1,
        "DAPO's dynamic sampling: above 1, an iteration keeps only the groups whose answers' "
        "rewards differ (a group rewarded alike has no advantage) and samples further "
        "prompts, up to this many rollouts, until batch_size such groups are in hand; 1 keeps "
        "every group.",
        ge=1,
    )
    std_normalize: bool = spec(
        True,
        "Divide each answer's advantage by its group's standard deviation (GRPO); false "
        "leaves it the score minus the group mean (Dr. GRPO: the std favours groups of "
        "nearly equal scores, too easy or too hard).",
    )


@dataclass(frozen=True)
class EvaluateParams:
    """Every policy on the held-out prompts, judged by the gold judge and the reward model."""

    judges: tuple[str, ...] = spec(
        ("gold", "rm"),
        "Who decides the win rates, each under its own name (`win_rate.<judge>.<a>_vs_<b>`): "
        "`gold`, the task suite's programmatic judge (skipped on prompts from outside the "
        "suite); `rm`, the trained reward model (any prompts, but the proxy the RL policies "
        "optimized, so it flatters them); `hf:DIR`, a reward model trained elsewhere; "
        "`rule:NAME`, a reward function in rlhf/algorithms/rules.py; `check:EXTRACTOR`, the "
        "answer checker against each prompt's reference (accuracy and pass@k besides its win "
        "rates). Pairwise judges compare "
        "two policies' answers to a prompt: `pairwise:rm`, the trained reward model shown both "
        "(its Bradley-Terry preference; the same numbers as `rm`, through the pairwise path), "
        "and `pairwise:rule:NAME`, a pairwise rule (`pairwise:rule:shorter`: the shorter "
        "answer wins, a probe of length bias). The kinds are registered in "
        "rlhf/reward_sources.py.",
    )

    samples: int = spec(
        8,
        "Answers sampled per held-out prompt and policy. Win rates pair the i-th answers of two "
        "policies to the same prompt; more answers narrow the intervals less than more prompts.",
        ge=1,
    )
    curve_samples: int = spec(
        2,
        "Answers sampled per held-out prompt at each RL snapshot of the over-optimization "
        "curve. The curve's ends (SFT and the final policy) come from the `samples` answers; "
        "the points between need only their mean gold score and KL, and evaluating every "
        "snapshot with `samples` answers took most of the stage's time.",
        ge=1,
    )
    temperature: float = spec(1.0, "Sampling temperature of the sampled answers.", gt=0.0)
    max_new_tokens: int = spec(32, "Answer length cap, greedy and sampled.", ge=1)
    batch_size: int = spec(256, "Answers generated per batch.", ge=1)
    bootstrap_resamples: int = spec(
        2000,
        "Bootstrap resamples for the 95% intervals of win rates. Prompts are resampled, not "
        "answers: answers to one prompt are correlated, and resampling them would understate "
        "the uncertainty.",
        ge=100,
    )
    examples_per_task: int = spec(
        2, "Held-out prompts per task family whose answers the report shows side by side.", ge=0
    )
    temperatures: tuple[float, ...] = spec(
        (0.3, 0.5, 0.7, 1.0),
        "The sampling temperatures swept for every policy, SFT included: each policy's best "
        "(`best_temperature.<policy>`) is the one whose answers the primary judge (the first "
        "of `judges` that scores single answers, else the reward model) scores best on the "
        "validation prompts, never the held-out ones; then `win_rate_best_temperature` sets "
        "each policy at its best against SFT at its best on the held-out prompts, the baseline "
        "a lower temperature alone gives.",
        gt=0.0,
    )
    sweep_samples: int = spec(
        4, "Answers sampled per validation prompt, policy and temperature of the sweep.", ge=1
    )
    bon_n: tuple[int, ...] = spec(
        (2, 4, 8, 16),
        "Best-of-n baselines: SFT samples n answers per held-out prompt and the reward model "
        "keeps its favourite, `samples` times per prompt. Each is scored like a policy, with "
        "its KL to SFT (at most log n - (n - 1)/n), and each policy is set against the one "
        "whose KL is nearest its own (`win_rate_vs_best_of_n`). Empty: none.",
        ge=1,
    )
    bon_pool: int = spec(
        32,
        "SFT answers sampled per held-out prompt that best-of-n draws from (with replacement): "
        "at least the largest n; a larger pool brings best-of-n's KL and score nearer those of "
        "fresh samples.",
        ge=1,
    )

    def __post_init__(self) -> None:
        if not self.temperatures:
            raise ParamsError("evaluate.temperatures = []: list at least one temperature")
        if self.bon_n and self.bon_pool < max(self.bon_n):
            raise ParamsError(
                f"evaluate.bon_pool = {self.bon_pool} must be at least the largest of "
                f"evaluate.bon_n = {list(self.bon_n)!r}"
            )


@dataclass(frozen=True)
class TrackingParams:
    """Where a stage's run goes besides dvclive. No stage depends on this group: tracking
    changes no output, so setting it reruns nothing (`dvc repro --force` logs a run again)."""

    mlflow: str = spec(
        "",
        "An MLflow tracking URI (`http://host:5000`): each stage that runs logs its params, "
        "headline metrics, curves and the report to an MLflow run, under one parent run per "
        "pipeline run; the environment's RLHF_MLFLOW_TRACKING_URI overrides it. Empty: off "
        "(MLflow is not imported). Needs the `[mlflow]` extra.",
    )
    experiment: str = spec("rlhf-pipeline", "The MLflow experiment the runs go to.")


@dataclass(frozen=True)
class ParamsFile:
    """params.yaml's top level, declared: the keys every stage shares and every group, in the
    file's order. `Params` (`rlhf/params/__init__.py`) is this with the checks across groups;
    a new group (an RL algorithm's) is a field here and its class above."""

    seed: int = spec(
        1234, "Seed for data generation, initialization and sampling.", ge=0, le=MAX_SEED
    )
    device: Literal["auto", "cpu", "cuda"] = spec(
        "auto", "`auto` picks CUDA when available, else CPU."
    )
    threads: int = spec(
        2,
        "torch's CPU threads in each model stage's process. The order floats are summed in "
        "depends on it: the committed results are what any machine reproduces at this count "
        "(and `cpu_kernels`), with at least this many cores for full speed. 0: torch's "
        "default, the cores (shared out among the processes of an RLHF_NPROC run; fastest, "
        "reproducible only at the same core count). CUDA kernels are unaffected.",
        ge=0,
        le=1024,
    )
    cpu_kernels: Literal["avx2", "portable", "native"] = spec(
        "avx2",
        "Which CPU kernels each model stage's process may use; like `threads`, they decide the "
        "order floats are summed in (x86-64 only; CUDA kernels are unaffected). `avx2`: "
        "torch's and oneDNN's kernels capped at AVX2, MKL's matrix products on its AVX2 branch "
        "on Intel CPUs (AMD ones run MKL's own pick): the same bytes on any Intel CPU with "
        "AVX2 whatever its generation, at full speed on AVX2 CPUs. `portable`: MKL's "
        "COMPATIBLE branch instead, the one MKL promises computes the same on Intel and AMD; "
        "measured, it does not give an AVX-512 Intel Xeon an AMD EPYC's bytes, and it is twice "
        "as slow on the default run (docs/concepts.md, reproducibility guarantees). "
        "`native`: each library picks the CPU's fastest (AVX-512, AMX): the same bytes only "
        "on the same CPU model.",
    )
    tokenizer: TokenizerParams = field(
        default_factory=TokenizerParams, metadata={"doc": "Tokenizer stage."}
    )
    model: ModelParams = field(
        default_factory=ModelParams, metadata={"doc": "The policy's starting point and context."}
    )
    memory: MemoryParams = field(
        default_factory=MemoryParams, metadata={"doc": "Memory savers for large models."}
    )
    train: TrainParams = field(
        default_factory=TrainParams, metadata={"doc": "Data-parallel training."}
    )
    data: DataParams = field(default_factory=DataParams, metadata={"doc": "Prepare stage."})
    sft: SFTParams = field(default_factory=SFTParams, metadata={"doc": "SFT stage."})
    collect: CollectParams = field(
        default_factory=CollectParams, metadata={"doc": "Comparison collection stage."}
    )
    rm: RMParams = field(default_factory=RMParams, metadata={"doc": "Reward model stage."})
    rl_algorithms: tuple[str, ...] = spec(
        ("ppo", "grpo"),
        "RL algorithms the pipeline trains, each as its own stage (`rl@NAME` in dvc.yaml) with "
        "its own outputs; the evaluation compares every one. Choices: " + ", ".join(RL_ALGORITHMS),
    )
    rl: RLParams = field(default_factory=RLParams, metadata={"doc": "What every RL stage shares."})
    ppo: PPOParams = field(default_factory=PPOParams, metadata={"doc": "RL stage `rl@ppo`."})
    reinforce: ReinforceParams = field(
        default_factory=ReinforceParams, metadata={"doc": "RL stage `rl@reinforce`."}
    )
    rloo: RLOOParams = field(default_factory=RLOOParams, metadata={"doc": "RL stage `rl@rloo`."})
    grpo: GRPOParams = field(default_factory=GRPOParams, metadata={"doc": "RL stage `rl@grpo`."})
    dpo: DPOParams = field(default_factory=DPOParams, metadata={"doc": "DPO stage."})
    evaluate: EvaluateParams = field(
        default_factory=EvaluateParams, metadata={"doc": "Evaluate stage."}
    )
    tracking: TrackingParams = field(
        default_factory=TrackingParams, metadata={"doc": "Experiment tracking (MLflow)."}
    )
