"""sft: supervised fine-tuning on demonstrations with prompt-masked cross-entropy.

Resumable: the resume file sits outside the stage's outs, which DVC deletes before a rerun,
and a resumed run ends with the same metrics as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

from rlhf.algorithms import sft
from rlhf.data.schemas import PROMPT_SCHEMA, SFT_SCHEMA, read_rows
from rlhf.errors import CheckpointError
from rlhf.eval.gold import gold_eval
from rlhf.models import hf
from rlhf.models.backbone import Backbone
from rlhf.models.registry import SCRATCH, build
from rlhf.project import paths
from rlhf.project.folders import init_folder, require_tracked
from rlhf.project.specs import StageSpec, trained_outputs
from rlhf.stages.support import fitting
from rlhf.stages.support.context import StageRun
from rlhf.stages.support.entry import main
from rlhf.tokenizer.chat import encode_example
from rlhf.train.loop import Objective
from rlhf.train.memory import preflight

SPEC = StageSpec(
    "sft",
    "rlhf.stages.sft",
    params=("seed", "device", "threads", "cpu_kernels", "model", "memory", "train", "sft"),
    inputs=(paths.SFT_TRAIN, paths.SFT_VAL, paths.PROMPTS_HELDOUT, paths.TOKENIZER),
    **trained_outputs("sft", {"loss": "val_loss"}),
)


def initial_model(stage: StageRun) -> Backbone:
    """The policy SFT starts from: a fresh GPT of `model`'s shape, or the pretrained folder
    `model.init`, its context cut to `model.block_size`; refused before anything is
    allocated when the device cannot hold its training."""
    p, folder = stage.params, init_folder(stage.params)
    work = stage.workload(sequences=p.sft.batch_size, sampled=p.sft.eval_batch_size)
    if folder is None:
        shape = {k: v for k, v in dataclasses.asdict(p.model).items() if k != "init"}
        config = {"vocab_size": stage.tokenizer.vocab_size, **shape}
        preflight(stage.spec.address, SCRATCH, config, work, stage.device)
        model = build(SCRATCH, config)
    else:
        require_tracked(SPEC.name, folder, "model.init")
        _, backbone, config = hf.config_of(folder, p.model.block_size)
        if stage.tokenizer.vocab_size > config["vocab_size"]:
            raise CheckpointError(
                f"{folder}: the tokenizer has {stage.tokenizer.vocab_size} tokens, the model's "
                f"embedding only {config['vocab_size']}"
            )
        preflight(stage.spec.address, backbone, config, work, stage.device)
        started = time.perf_counter()
        model = hf.load_folder(folder, block_size=p.model.block_size)
        stage.log(f"loaded {folder} ({backbone}) in {time.perf_counter() - started:.1f}s")
    return stage.trainable(model)


def run() -> dict[str, Any]:
    stage = StageRun.start(SPEC)
    p, tokenizer, pad = stage.params, stage.tokenizer, stage.tokenizer.pad_id
    train, val = (
        [encode_example(tokenizer, r["prompt"], r["response"], p.model.block_size) for r in rows]
        for rows in (read_rows(paths.SFT_TRAIN, SFT_SCHEMA), read_rows(paths.SFT_VAL, SFT_SCHEMA))
    )
    heldout = read_rows(paths.PROMPTS_HELDOUT, PROMPT_SCHEMA)
    model = initial_model(stage)
    truncated = sum(e.truncated for e in train)
    stage.log(
        f"{model.num_params() / 1e6:.2f}M parameters, {len(train)} demonstrations on "
        f"{stage.device}, {truncated} of them cut to model.block_size = "
        f"{p.model.block_size} tokens"
    )
    judge = functools.partial(
        gold_eval, tokenizer=tokenizer, heldout=heldout, max_new_tokens=p.sft.eval_max_new_tokens,
        seed=p.seed, batch_size=p.sft.eval_batch_size,
    )  # fmt: skip
    objective = Objective(
        batch_loss=lambda rows: sft.batch_loss(model, [train[i] for i in rows], pad),
        units=lambda rows: sum(train[i].target_count for i in rows),  # a token-mean loss
        evaluate=lambda: {"val_loss": sft.validation_loss(model, val, pad, p.sft.batch_size)},
        fresh_extra=lambda: {"untrained": judge(model, greedy=True)},
    )
    history, model = fitting.fit(stage, model, p.sft, objective, n_examples=len(train))
    greedy, sampled = judge(model, greedy=True), judge(model, greedy=False)
    untrained = history.extra["untrained"]
    metrics = {
        "val_loss": round(history.epochs[-1]["val_loss"], 6),
        "train_loss": round(history.epochs[-1]["train_loss"], 6),
        "gold_greedy": greedy and greedy["mean"],
        "gold_sampled": sampled and sampled["mean"],
        "gold_greedy_untrained": untrained and untrained["mean"],
        "gold_greedy_by_task": greedy and greedy["by_task"],
        "gold_sampled_by_task": sampled and sampled["by_task"],
        "steps": len(history.steps),
        "params": model.num_params(),
        "truncated": truncated,
    }
    fitting.publish(stage, stage.payload(model, kind="policy"), history, metrics)
    stage.log(
        f"val loss {metrics['val_loss']}, gold greedy {metrics['gold_greedy']} (untrained "
        f"{metrics['gold_greedy_untrained']}), sampled {metrics['gold_sampled']}, "
        f"{history.tokens_per_s} tokens/s"
    )
    return metrics


if __name__ == "__main__":
    main(run, data_parallel=True)
