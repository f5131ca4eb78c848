"""The algorithms: SFT, the reward model, DPO, reward sources (scorers and rules), and RL
(`rl/`: losses, advantage estimators, one trainer, and the registry of algorithms)."""
