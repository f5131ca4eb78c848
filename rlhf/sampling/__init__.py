"""Sampling: token choice (top-k, exact top-p), batched KV-cache generation, RL rollouts, and
the one forward that gives response tokens' log-probs."""
