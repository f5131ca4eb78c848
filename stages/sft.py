"""sft: supervised fine-tuning on demonstrations with prompt-masked cross-entropy.

Resumable: every `sft.save_every` steps the model, optimizer, step and history go to a resume
file outside the stage's outs (DVC deletes outs before a rerun). The batch order of each epoch is
a pure function of (seed, epoch), so a resumed run continues exactly where the killed one was and
ends with the same metrics as an uninterrupted run.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn.functional as F

from rlhf import checkpoint
from rlhf.atomic import write_csv, write_json
from rlhf.data import (
    IGNORE_INDEX,
    PROMPT_SCHEMA,
    SFT_SCHEMA,
    Example,
    collate,
    encode_example,
    read_rows,
)
from rlhf.evaluation import gold_summary
from rlhf.generation import SamplingConfig, generate_texts
from rlhf.model import GPT, GPTConfig
from rlhf.params import Params, group_hash
from rlhf.tokenizer import Tokenizer, load_tokenizer
from rlhf.training import adamw, autocast, lr_at, resolve_device, rng_state, set_rng_state
from stages import paths
from stages.common import console, file_digest, params, progress

RESUME_FILE = paths.RESUME / "sft.pt"
PARAM_GROUPS = ("seed", "device", "model", "sft")


def batch_order(n_examples: int, seed: int, epoch: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n_examples, generator=generator).tolist()


def masked_lm_loss(model: GPT, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)  # [B, T, V]
    return F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX
    )


@torch.no_grad()
def validation_loss(
    model: GPT, examples: list[Example], pad_id: int, batch_size: int, device: torch.device
) -> float:
    """Mean cross-entropy per response token over the whole set."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        inputs, targets = collate(examples[start : start + batch_size], pad_id)
        inputs, targets = inputs.to(device), targets.to(device)
        tokens = int((targets != IGNORE_INDEX).sum())
        total += float(masked_lm_loss(model, inputs, targets)) * tokens
        count += tokens
    model.train()
    return total / count


def gold_eval(
    model: GPT, tokenizer: Tokenizer, heldout: list[dict[str, Any]], p: Params, greedy: bool
) -> dict[str, object] | None:
    """Gold-judged answers on held-out prompts; None when the data has no gold judge."""
    if any(row["source"] != "synthetic" for row in heldout):
        return None
    model.eval()
    config = SamplingConfig(max_new_tokens=p.sft.eval_max_new_tokens, greedy=greedy)
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(p.seed)
    prompts = [row["prompt"] for row in heldout]
    answers = generate_texts(
        model, tokenizer, prompts, config, batch_size=p.sft.eval_batch_size, generator=generator
    )
    model.train()
    return gold_summary(prompts, [row["task"] for row in heldout], answers)


def run() -> dict[str, Any]:
    p = params()
    torch.manual_seed(p.seed)
    device = resolve_device(p.device)
    tokenizer = load_tokenizer(paths.TOKENIZER)
    block = p.model.block_size

    def encode(rows: list[dict[str, Any]]) -> list[Example]:
        return [encode_example(tokenizer, r["prompt"], r["response"], block) for r in rows]

    train = encode(read_rows(paths.SFT_TRAIN, SFT_SCHEMA))
    val = encode(read_rows(paths.SFT_VAL, SFT_SCHEMA))
    heldout = read_rows(paths.PROMPTS_HELDOUT, PROMPT_SCHEMA)

    config = GPTConfig(
        vocab_size=tokenizer.vocab_size,
        block_size=block,
        n_layer=p.model.n_layer,
        n_head=p.model.n_head,
        n_embd=p.model.n_embd,
        dropout=p.model.dropout,
        bias=p.model.bias,
    )
    model = GPT(config).to(device)
    optimizer = adamw(model, p.sft.lr, p.sft.weight_decay, (p.sft.beta1, p.sft.beta2))
    steps_per_epoch = math.ceil(len(train) / p.sft.batch_size)
    total_steps = p.sft.epochs * steps_per_epoch

    fingerprint = group_hash(p, *PARAM_GROUPS) + file_digest(
        paths.SFT_TRAIN, paths.SFT_VAL, paths.PROMPTS_HELDOUT, paths.TOKENIZER / "tokenizer.json"
    )
    state = checkpoint.load_resume(RESUME_FILE, fingerprint)
    if state is None:
        start_step, step_rows, epoch_rows = 0, [], []
        untrained = gold_eval(model, tokenizer, heldout, p, greedy=True)
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        start_step, step_rows, epoch_rows = state["step"], state["steps"], state["epochs"]
        untrained = state["untrained"]
        console.print(f"sft: resuming from step {start_step} of {total_steps}")
    console.print(
        f"sft: {model.num_params() / 1e6:.2f}M parameters, {len(train)} demonstrations, "
        f"{total_steps} steps on {device}"
    )

    model.train()
    trained_tokens, train_seconds = 0, 0.0
    order: list[int] = []
    with progress() as bar:
        task = bar.add_task("sft", total=total_steps, completed=start_step, extra="")
        for step in range(start_step, total_steps):
            epoch, index = divmod(step, steps_per_epoch)
            if index == 0 or not order:
                order = batch_order(len(train), p.seed, epoch)
            started = time.perf_counter()
            batch = [train[i] for i in order[index * p.sft.batch_size :][: p.sft.batch_size]]
            inputs, targets = (t.to(device) for t in collate(batch, tokenizer.pad_id))
            lr = lr_at(step, p.sft.lr, p.sft.warmup_steps, total_steps, p.sft.min_lr_ratio)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with autocast(device, p.sft.bf16):
                loss = masked_lm_loss(model, inputs, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if p.sft.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), p.sft.grad_clip)
            optimizer.step()
            train_seconds += time.perf_counter() - started
            trained_tokens += int((inputs != tokenizer.pad_id).sum())
            step_rows.append(
                {"step": step + 1, "epoch": epoch + 1, "lr": lr, "train_loss": loss.item()}
            )

            if index == steps_per_epoch - 1:
                epoch_loss = [r["train_loss"] for r in step_rows if r["epoch"] == epoch + 1]
                val_loss = validation_loss(model, val, tokenizer.pad_id, p.sft.batch_size, device)
                epoch_rows.append(
                    {
                        "epoch": epoch + 1,
                        "train_loss": sum(epoch_loss) / len(epoch_loss),
                        "val_loss": val_loss,
                    }
                )
                console.print(
                    f"epoch {epoch + 1}/{p.sft.epochs}: train loss "
                    f"{epoch_rows[-1]['train_loss']:.4f}, val loss {val_loss:.4f}"
                )
            if (step + 1) % p.sft.save_every == 0 and step + 1 < total_steps:
                checkpoint.save_resume(
                    RESUME_FILE,
                    fingerprint,
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "rng": rng_state(),
                        "step": step + 1,
                        "steps": step_rows,
                        "epochs": epoch_rows,
                        "untrained": untrained,
                    },
                )
            bar.update(task, advance=1, extra=f"loss {loss.item():.3f}")

    greedy = gold_eval(model, tokenizer, heldout, p, greedy=True)
    sampled = gold_eval(model, tokenizer, heldout, p, greedy=False)
    metrics = {
        "val_loss": round(epoch_rows[-1]["val_loss"], 6),
        "train_loss": round(epoch_rows[-1]["train_loss"], 6),
        "gold_greedy": greedy and greedy["mean"],
        "gold_sampled": sampled and sampled["mean"],
        "gold_greedy_untrained": untrained and untrained["mean"],
        "gold_greedy_by_task": greedy and greedy["by_task"],
        "gold_sampled_by_task": sampled and sampled["by_task"],
        "tokens_per_s": round(trained_tokens / train_seconds) if train_seconds else None,
        "steps": total_steps,
        "params": model.num_params(),
    }
    checkpoint.save(
        paths.SFT_MODEL,
        checkpoint.model_payload(model, tokenizer, group_hash(p, *PARAM_GROUPS), kind="policy"),
    )
    write_csv(paths.SFT_STEPS, step_rows)
    write_csv(paths.SFT_EPOCHS, epoch_rows)
    write_json(paths.SFT_METRICS, metrics)
    RESUME_FILE.unlink(missing_ok=True)
    console.print(
        f"sft: val loss {metrics['val_loss']}, gold greedy {metrics['gold_greedy']} "
        f"(untrained {metrics['gold_greedy_untrained']}), sampled {metrics['gold_sampled']}, "
        f"{metrics['tokens_per_s']} tokens/s"
    )
    return metrics


if __name__ == "__main__":
    run()
