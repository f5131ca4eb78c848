"""Seconds for one RL iteration of every algorithm at the same budget, split into phases.

Each iteration samples 16 answers of up to 64 new tokens: PPO and REINFORCE one answer to
each of 16 prompts, RLOO and GRPO four to each of 4. PPO makes 4 passes over the rollout in
minibatches of 8 with a separate critic (the seed notebook's setting, whose target is under
1.5 s on two CPU cores), GRPO its default 2, REINFORCE and RLOO one. Random weights and the
`contains_number` rule as reward: the timing does not depend on what the models know, but
answer lengths drift as each policy learns, so throughput (tokens per second sampled, and
trained) is what compares across algorithms.

The model is the seed notebook's (4 layers, width 128, MLP 2048, the byte-level vocabulary of
260 tokens). PPO at GPT-2 124M's shape on a GPU is `ppo_iteration.py`.

    python benchmarks/rl_step.py [--threads 2] [--out ...]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from common import iteration_summary, setup, write_result

from rlhf.algorithms.rl.registry import ALGORITHMS
from rlhf.algorithms.rl.trainer import RLTrainer
from rlhf.algorithms.rules import contains_number
from rlhf.algorithms.scorers import RuleScorer
from rlhf.models.gpt import GPT, GPTConfig
from rlhf.params.groups import CriticParams, RLParams
from rlhf.tokenizer.tokenizer import save_tokenizer

ITERATIONS = 5
TARGET_S = 1.5  # PPO on 2 threads: the seed notebook's target
# A peer this benchmark does not run (TRL is no dependency of this project): TRL's PPOTrainer at
# this setting, as measured once outside it. Reported as external, never as a check.
EXTERNAL_PEER = {"peer": "TRL PPOTrainer", "iteration_s": 2.4, "run_here": False}
MODEL = {"n_layer": 4, "n_embd": 128, "mlp_width": 2048, "block_size": 96}
ANSWERS, NEW_TOKENS = 16, 64
GROUP = {"ppo": 1, "reinforce": 1, "rloo": 4, "grpo": 4}
PASSES = {"ppo": {"update_epochs": 4}, "grpo": {"update_epochs": 2}}


def iteration_seconds(algorithm: str, vocab: int, tokenizer) -> dict:
    config = GPTConfig(vocab_size=vocab, **MODEL)
    policy = GPT(config)
    reference = GPT(config)
    reference.load_state_dict(policy.state_dict())
    entry = ALGORITHMS[algorithm]
    group = GROUP[algorithm]
    cfg = entry.params(
        steps=ITERATIONS + 1, batch_size=ANSWERS // group, group_size=group, minibatch_size=8,
        **PASSES.get(algorithm, {}),
    )  # fmt: skip
    critic = GPT(config) if isinstance(cfg, CriticParams) else None
    prompts = [f"What is {a} plus {a + 1}?" for a in range(cfg.batch_size)]
    trainer = RLTrainer(
        entry, cfg, RLParams(max_new_tokens=NEW_TOKENS), policy=policy, reference=reference,
        critic=critic, scorer=RuleScorer(contains_number), tokenizer=tokenizer, prompts=prompts,
        seed=0,
    )  # fmt: skip
    trainer.iteration()  # warm-up
    runs = [trainer.iteration()[0] for _ in range(ITERATIONS)]
    return {
        "algorithm": algorithm,
        "answers": ANSWERS,
        "new_tokens": NEW_TOKENS,
        **iteration_summary(runs),
    }


def main() -> None:
    args = setup(__doc__, "rl_step")
    tokenizer = save_tokenizer(Path(tempfile.mkdtemp()), "bytes")
    rows = [iteration_seconds(a, tokenizer.vocab_size, tokenizer) for a in ALGORITHMS]
    columns = ("rollout", "scoring", "update", "total s", "tokens", "sample/s", "train/s")
    print(f"{'algorithm':10} " + " ".join(f"{c:>8}" for c in columns))
    for r in rows:
        print(
            f"{r['algorithm']:10} {r['rollout_s']:>8.3f} {r['scoring_s']:>8.3f} "
            f"{r['update_s']:>8.3f} {r['iteration_s']:>8.3f} {r['mean_response_tokens']:>8} "
            f"{r['rollout_tokens_per_s']:>8} {r['update_tokens_per_s']:>8}"
        )
    ppo = next(r for r in rows if r["algorithm"] == "ppo")["iteration_s"]
    met = ppo < TARGET_S
    result = {
        "threads": args.threads, "rows": rows, "target_s": TARGET_S, "target_met": met,
        "external_peer": EXTERNAL_PEER,
    }  # fmt: skip
    print(f"{'met' if met else 'NOT met'}: one PPO iteration under {TARGET_S} s")
    print(
        f"external, not run here: {EXTERNAL_PEER['peer']} took {EXTERNAL_PEER['iteration_s']} s "
        "per iteration at this setting, measured once outside this benchmark"
    )
    write_result(args.out, result)


if __name__ == "__main__":
    main()
