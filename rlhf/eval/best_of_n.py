"""Best-of-n: SFT samples n answers to a prompt and the reward model keeps its favourite.

The cheapest way to spend a reward model, and the baseline RL must beat at the same distance
from SFT (Gao et al. 2022, "Scaling laws for reward model overoptimization"). Its KL to SFT is
at most log n - (n - 1)/n, exactly that when no two answers tie in reward; a small model says
the same answer often, and repeats tie, so the KL is measured too.

Both come from one pool of `m` SFT answers per prompt: best-of-n draws n of them (with
replacement) and keeps the highest reward, which is best-of-n from the pool's empirical
distribution. Its KL to that distribution is computed exactly, answers of equal reward being
one outcome; it tends to the true KL as the pool grows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from rlhf.eval.answers import ScoredAnswers


def kl_bound(n: int) -> float:
    """KL(best-of-n || sampler) when no two answers tie: log n - (n - 1)/n nats."""
    return math.log(n) - (n - 1) / n


def outcome_probabilities(rewards: Sequence[float], n: int) -> dict[float, tuple[float, float]]:
    """Per distinct reward r of the pool: (the share of the pool at r, the chance that the
    best of n draws from the pool has reward r). With F the share at or below r, the best of
    n is at r with chance F(r)^n - F(below r)^n."""
    counts, size, below = Counter(rewards), len(rewards), 0
    probabilities = {}
    for reward in sorted(counts):
        share = counts[reward] / size
        probabilities[reward] = (
            share,
            ((below + counts[reward]) / size) ** n - (below / size) ** n,
        )
        below += counts[reward]
    return probabilities


def pool_kl(rewards: Sequence[float], n: int) -> float:
    """KL(best-of-n || the pool), exact: at most kl_bound(n), lower where rewards tie."""
    return sum(
        best * math.log(best / share)
        for share, best in outcome_probabilities(rewards, n).values()
        if best > 0
    )


def best_of_n(pool: ScoredAnswers, n: int, samples: int, seed: int) -> ScoredAnswers:
    """`samples` best-of-n answers per prompt, each the highest-reward of n answers drawn from
    the prompt's pool (every prompt's answers consecutive, as `score_policy` gives them), so
    they pair with a policy's `samples` answers as another policy's would. `kl` holds the
    prompt's exact pool KL on each of its answers (their mean is best-of-n's KL), `kl_sampled`
    the log-ratio of the answer's reward outcome (its sampled estimate)."""
    rng = np.random.default_rng([seed, n])
    picked: list[int] = []
    kl: list[float] = []
    kl_sampled: list[float] = []
    starts = [i for i, p in enumerate(pool.prompt_index) if i == 0 or pool.prompt_index[i - 1] != p]
    for start, end in zip(starts, [*starts[1:], len(pool.prompt_index)], strict=True):
        rewards = pool.reward[start:end]
        outcomes = outcome_probabilities(rewards, n)
        prompt_kl = pool_kl(rewards, n)
        for _ in range(samples):
            draws = rng.integers(0, end - start, size=n)
            best = int(draws[np.argmax([rewards[d] for d in draws])])
            share, chance = outcomes[rewards[best]]
            picked.append(start + best)
            kl.append(prompt_kl)
            kl_sampled.append(math.log(chance / share))
    return replace(pool.take(picked), kl=kl, kl_sampled=kl_sampled)
