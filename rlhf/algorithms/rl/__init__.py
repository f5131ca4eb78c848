"""Reinforcement learning on language models: one trainer, parameterized by an advantage
estimator and a policy loss (`registry.py` names the combinations: PPO, REINFORCE, RLOO,
GRPO)."""
