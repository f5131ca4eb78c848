"""Data: the one row rule, Parquet schemas, the tokenizer, the one chat template, batching,
importers, splits and the comparisons the reward model and DPO train on."""
