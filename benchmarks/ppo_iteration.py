"""One PPO iteration at GPT-2 124M's shape, split into rollout, scoring and update.

The models are those the RL stage holds, each loaded from one GPT-2 folder with random weights
(`gpt2_shape.py`) as the pipeline loads a user's GPT-2: the trained policy and the separate
critic (its value head from the reward model's, as `critic: separate` starts it) in float32
master weights, the frozen reference and the reward model in bfloat16 on CUDA
(`memory.frozen_bf16`). One iteration is the stage's: 64 prompts, one answer of up to 128 new
tokens each; scoring by policy, reference, critic and reward model; 4 epochs of minibatches of
16 for policy and critic in bf16 autocast (`ppo` defaults otherwise). Phases are medians over
`--iterations` after one warm-up iteration (which compiles). The variants are the stage's
`train.compile` settings: `off`, and `auto` (on CUDA, the blocks of all four models compiled
as the stage compiles them; decoding runs as `RLHF_DECODE` says, CUDA graphs by default).
Targets on an H100/H200: an iteration in 0.8 s, the update at 150k tokens/s or more; and the
sampler's log-probs within float rounding of the scoring pass's (`logprob_mismatch`).

    python benchmarks/ppo_iteration.py --device cuda [--iterations 3] [--variants off,auto]
    python benchmarks/ppo_iteration.py --shape tiny --new-tokens 16   # CPU smoke run
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from common import DEVICE_OPTION, device_name, iteration_summary, setup, write_result
from gpt2_shape import SHAPE_OPTION, SHAPES, random_gpt2_folder

from rlhf.algorithms.rl.registry import ALGORITHMS
from rlhf.algorithms.rl.trainer import RLTrainer
from rlhf.algorithms.scorers import RewardModelScorer
from rlhf.models.backbone import Backbone, freeze
from rlhf.models.hf import load_folder
from rlhf.params.groups import PPOParams, RLParams
from rlhf.tokenizer.tokenizer import pretrained_tokenizer

PROMPTS, MINIBATCH, EPOCHS = 64, 16, 4
TARGET_ITERATION_S, TARGET_UPDATE_TOKENS_PER_S = 0.8, 150_000


def ppo_trainer(
    folder: Path, device: torch.device, new_tokens: int, iterations: int, compiled: bool
) -> RLTrainer:
    frozen_bf16 = device.type == "cuda"
    tokenizer = pretrained_tokenizer(folder)

    def model(frozen: bool = False) -> Backbone:
        loaded = load_folder(folder, device)
        loaded = freeze(loaded, frozen_bf16) if frozen else loaded
        if compiled:  # as `StageRun.compiled` does for every model the RL stage holds
            loaded.compile_blocks()
        return loaded

    critic = model()
    critic.init_value_head_from_reward_head()
    reward = RewardModelScorer(model(frozen=True), tokenizer, pooling="last", std=1.0)
    cfg = PPOParams(
        steps=iterations + 1, batch_size=PROMPTS, minibatch_size=MINIBATCH, update_epochs=EPOCHS
    )
    return RLTrainer(
        ALGORITHMS["ppo"],
        cfg,
        RLParams(max_new_tokens=new_tokens),
        policy=model(),
        reference=model(frozen=True),
        critic=critic,
        scorer=reward,
        tokenizer=tokenizer,
        prompts=[f"What is {a} plus {a + 1}?" for a in range(PROMPTS)],
        seed=0,
    )


def main() -> None:
    args = setup(
        __doc__,
        "ppo_iteration",
        DEVICE_OPTION,
        SHAPE_OPTION,
        ("--new-tokens", {"type": int, "default": 128}),
        ("--iterations", {"type": int, "default": 3}),
        ("--variants", {"default": "off,auto"}),
    )
    device = torch.device(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = random_gpt2_folder(Path(tmp), SHAPES[args.shape])
        for variant in args.variants.split(","):
            compiled = variant == "on" or (variant == "auto" and device.type == "cuda")
            trainer = ppo_trainer(folder, device, args.new_tokens, args.iterations, compiled)
            trainer.iteration()  # warm-up
            runs = [trainer.iteration()[0] for _ in range(args.iterations)]
            rows.append(
                {
                    "variant": variant,
                    **iteration_summary(runs),
                    "logprob_mismatch": max(r["logprob_mismatch"] for r in runs),
                    "logprob_mismatch_max": max(r["logprob_mismatch_max"] for r in runs),
                }
            )
    print(
        f"{'variant':8} {'rollout s':>10} {'scoring s':>10} {'update s':>10} {'total s':>8} "
        f"{'update tok/s':>13} {'tokens':>7} {'logprob mismatch (max)':>23}"
    )
    for row in rows:
        print(
            f"{row['variant']:8} {row['rollout_s']:>10.3f} {row['scoring_s']:>10.3f} "
            f"{row['update_s']:>10.3f} {row['iteration_s']:>8.3f} "
            f"{row['update_tokens_per_s']:>13} {row['mean_response_tokens']:>7} "
            f"{row['logprob_mismatch']:>10.2e} ({row['logprob_mismatch_max']:.2e})"
        )
    staged = rows[-1]
    met = (
        staged["iteration_s"] <= TARGET_ITERATION_S
        and staged["update_tokens_per_s"] >= TARGET_UPDATE_TOKENS_PER_S
    )
    print(
        f"{'met' if met else 'NOT met'}: {staged['variant']}, iteration "
        f"{staged['iteration_s']} s (target {TARGET_ITERATION_S}), update "
        f"{staged['update_tokens_per_s']} tokens/s (target {TARGET_UPDATE_TOKENS_PER_S})"
    )
    write_result(
        args.out,
        {
            "device": device_name(device),
            "torch": torch.__version__,
            "shape": args.shape,
            "prompts": PROMPTS,
            "new_tokens": args.new_tokens,
            "update_epochs": EPOCHS,
            "minibatch_size": MINIBATCH,
            "rows": rows,
            "target_iteration_s": TARGET_ITERATION_S,
            "target_update_tokens_per_s": TARGET_UPDATE_TOKENS_PER_S,
            "target_met": met,
        },
    )


if __name__ == "__main__":
    main()
