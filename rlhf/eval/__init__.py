"""Evaluation: policies sampled and measured on held-out prompts, gold-judged win rates with
bootstrap intervals, reward-model accuracy, and the report with its figures."""
