"""Using a trained checkpoint: `rlhf generate` (answers), `rlhf score` (rewards) and `rlhf
export` (a model folder other tools load)."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rlhf.cli.app import command, results
from rlhf.errors import CheckpointError, OptionError, OutputError
from rlhf.project import paths
from rlhf.stages.support.common import console, progress


@command()
def generate(
    checkpoint_path: Annotated[Path, typer.Argument(help="Policy checkpoint (.pt).")] = (
        paths.SFT_MODEL
    ),
    prompt: Annotated[list[str] | None, typer.Option("--prompt", "-p", help="A prompt.")] = None,
    file: Annotated[Path | None, typer.Option(help="A file of prompts, one per line.")] = None,
    greedy: Annotated[bool, typer.Option(help="Pick the most likely token.")] = False,
    temperature: Annotated[float, typer.Option(min=1e-3)] = 1.0,
    top_k: Annotated[int, typer.Option(min=0, help="0 keeps every token.")] = 0,
    top_p: Annotated[float, typer.Option(min=1e-6, max=1.0)] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 48,
    batch_size: Annotated[int, typer.Option(min=1)] = 64,
    seed: int = 0,
    tokenizer_dir: Annotated[Path, typer.Option("--tokenizer")] = paths.TOKENIZER,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """Answer prompts with a policy checkpoint: batched, with the KV cache."""
    import torch

    from rlhf.data.importers import read_prompts
    from rlhf.models import checkpoint
    from rlhf.sampling.generate import generate_texts
    from rlhf.sampling.sampler import SamplingConfig
    from rlhf.tokenizer.tokenizer import load_tokenizer
    from rlhf.train.device import resolve_device

    prompts = list(prompt or [])
    if file is not None:
        prompts += read_prompts(file)
    if not prompts:
        raise OptionError("give prompts with --prompt or --file")
    target = resolve_device(device)
    tok = load_tokenizer(tokenizer_dir)
    model, payload = checkpoint.load_model(checkpoint_path, tok, target)
    if payload["kind"] == "reward":
        raise CheckpointError(
            f"{checkpoint_path} is a reward model, which scores answers rather than writing "
            "them; generate with a policy (artifacts/sft/model.pt, or an RL or DPO stage's), "
            "or score answers with `rlhf score`"
        )
    if max_new_tokens >= model.max_seq_len:
        raise OptionError(
            f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the model's "
            f"context of {model.max_seq_len} tokens"
        )
    config = SamplingConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        greedy=greedy,
    )
    generator = torch.Generator(target).manual_seed(seed)
    with progress() as bar:
        task = bar.add_task("generate", total=len(prompts), extra="")
        answers = generate_texts(
            model,
            tok,
            prompts,
            config,
            batch_size=batch_size,
            generator=generator,
            on_batch=lambda n: bar.update(task, advance=n),
        )
    if as_json:
        for p, a in zip(prompts, answers, strict=True):
            typer.echo(json.dumps({"prompt": p, "response": a}))
        return
    table = Table("prompt", "response", show_lines=True)
    for p, a in zip(prompts, answers, strict=True):
        table.add_row(p, a)
    results.print(table)


@command()
def score(
    checkpoint_path: Annotated[Path, typer.Argument(help="Reward checkpoint (.pt).")] = (
        paths.RM_MODEL
    ),
    prompt: Annotated[list[str] | None, typer.Option("--prompt", "-p")] = None,
    response: Annotated[
        list[str] | None, typer.Option("--response", "-r", help="One per --prompt, in order.")
    ] = None,
    file: Annotated[
        Path | None, typer.Option(help="JSONL or Parquet with prompt, response columns.")
    ] = None,
    tokenizer_dir: Annotated[Path, typer.Option("--tokenizer")] = paths.TOKENIZER,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """Score prompt/response pairs with a reward model (0 = the average SFT demonstration)."""
    from rlhf.algorithms.reward_model import score as score_responses
    from rlhf.data.importers import import_file
    from rlhf.models import checkpoint
    from rlhf.tokenizer.tokenizer import load_tokenizer
    from rlhf.train.device import resolve_device

    prompts, responses = list(prompt or []), list(response or [])
    if len(prompts) != len(responses):
        raise OptionError(f"{len(prompts)} --prompt but {len(responses)} --response")
    if file is not None:
        rows = import_file(file, "sft").rows
        prompts += [r["prompt"] for r in rows]
        responses += [r["response"] for r in rows]
    if not prompts:
        raise OptionError("give --prompt/--response pairs or --file")
    tok = load_tokenizer(tokenizer_dir)
    model, payload = checkpoint.load_model(checkpoint_path, tok, resolve_device(device))
    if payload["kind"] != "reward":
        raise CheckpointError(
            f"{checkpoint_path} is a {payload['kind']} checkpoint, not a reward model"
        )
    rewards = score_responses(model, tok, prompts, responses, pooling=payload["pooling"]).tolist()
    std = payload["reward_std"] or 1.0
    if as_json:
        for p, r, value in zip(prompts, responses, rewards, strict=True):
            record = {"prompt": p, "response": r, "reward": value, "z": value / std}
            typer.echo(json.dumps(record))
        return
    table = Table("prompt", "response", "reward", "z (reward / std)", show_lines=True)
    for p, r, value in zip(prompts, responses, rewards, strict=True):
        table.add_row(p, r, f"{value:+.3f}", f"{value / std:+.2f}")
    results.print(table)


class ExportFormat(str, Enum):
    hf = "hf"


@command()
def export(
    model: Annotated[
        str,
        typer.Argument(
            help="A trained stage (sft, rm, dpo, ppo, grpo, reinforce, rloo) or a checkpoint (.pt)."
        ),
    ],
    out: Annotated[Path, typer.Argument(help="The folder to write; it must not exist.")],
    export_format: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="hf: a Hugging Face folder (config.json, model.safetensors, tokenizer files "
            "and chat template) that transformers and vLLM load.",
        ),
    ] = ExportFormat.hf,
    tokenizer_dir: Annotated[Path, typer.Option("--tokenizer")] = paths.TOKENIZER,
) -> None:
    """Write a trained policy (as a causal LM) or reward model (as a sequence classifier) as
    a model folder other tools load."""
    import torch

    from rlhf.models import checkpoint
    from rlhf.models.hf import save_folder
    from rlhf.tokenizer.tokenizer import load_tokenizer

    source = Path(model) if model.endswith(".pt") else paths.model_file(model)
    if out.exists():
        raise OutputError(f"{out} exists; export writes a new folder")
    tok = load_tokenizer(tokenizer_dir)
    policy, payload = checkpoint.load_model(source, tok, torch.device("cpu"))
    save_folder(policy, out, tok, reward_model=payload["kind"] == "reward")
    console.print(
        f"exported {source} ({payload['kind']}, {policy.num_params() / 1e6:.2f}M parameters) "
        f"to {out} as a Hugging Face {policy.name} folder"
    )
