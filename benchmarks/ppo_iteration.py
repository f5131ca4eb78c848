"""One PPO iteration at GPT-2 124M's shape, split into rollout, scoring and update.

The models are those the RL stage holds, each loaded from one GPT-2 folder with random weights
(`gpt2_shape.py`) as the pipeline loads a user's GPT-2: the trained policy and the separate
critic (its value head from the reward model's, as `critic: separate` starts it) in float32
master weights, the frozen reference and the reward model in bfloat16 on CUDA
(`memory.frozen_bf16`). One iteration is the stage's: 64 prompts, one answer of up to 128 new
tokens each; scoring by policy, reference, critic and reward model; 4 epochs of minibatches of
16 for policy and critic in bf16 autocast (`ppo` defaults otherwise). Phases are medians over
`--iterations` after one warm-up iteration.

    python benchmarks/ppo_iteration.py --device cuda [--iterations 3]
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
from rlhf.data.tokenizer import pretrained_tokenizer
from rlhf.models.backbone import freeze
from rlhf.models.hf import load_folder
from rlhf.params import PPOParams, RLParams

PROMPTS, MINIBATCH, EPOCHS = 64, 16, 4


def ppo_trainer(folder: Path, device: torch.device, new_tokens: int, iterations: int):
    frozen_bf16 = device.type == "cuda"
    tokenizer = pretrained_tokenizer(folder)
    critic = load_folder(folder, device)
    critic.init_value_head_from_reward_head()
    reward = RewardModelScorer(
        freeze(load_folder(folder, device), frozen_bf16), tokenizer, pooling="last", std=1.0
    )
    cfg = PPOParams(
        steps=iterations + 1, batch_size=PROMPTS, minibatch_size=MINIBATCH, update_epochs=EPOCHS
    )
    return RLTrainer(
        ALGORITHMS["ppo"],
        cfg,
        RLParams(max_new_tokens=new_tokens),
        policy=load_folder(folder, device),
        reference=freeze(load_folder(folder, device), frozen_bf16),
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
    )
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        folder = random_gpt2_folder(Path(tmp), SHAPES[args.shape])
        trainer = ppo_trainer(folder, device, args.new_tokens, args.iterations)
    trainer.iteration()  # warm-up
    runs = [trainer.iteration()[0] for _ in range(args.iterations)]
    row = iteration_summary(runs)
    print(f"{'rollout s':>10} {'scoring s':>10} {'update s':>10} {'total s':>8} {'tokens':>7}")
    print(
        f"{row['rollout_s']:>10.3f} {row['scoring_s']:>10.3f} {row['update_s']:>10.3f} "
        f"{row['iteration_s']:>8.3f} {row['mean_response_tokens']:>7}"
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
            **row,
        },
    )


if __name__ == "__main__":
    main()
