"""Data rows: the one row rule, Parquet schemas, importers, splits, batching and the
comparisons the reward model and DPO train on. Text becomes ids through `rlhf/tokenizer/`."""
