"""Training tokens per second of the data-parallel stages at 1, 2, ... processes.

Each stage (sft, rm, dpo) trains for `--epochs` epochs, and PPO for `--rl-steps` iterations,
on the repository's own prepared data, tokenizer, SFT and reward models and comparisons (run
`dvc repro rm` or `dvc pull` first), in a scratch copy, as `RLHF_NPROC=N python -m
rlhf.stages.STAGE`: on CPU N gloo processes share the `--threads` cores (threads // N each),
on GPUs (`--device cuda`) one process per GPU. The figure is the stage's own throughput
(timings/STAGE.json: tokens forwarded in the training steps, all ranks, over their wall time;
for PPO the tokens trained on in its updates, beside the tokens its rollouts generated), so
evaluation and loading do not count.

    python benchmarks/scaling.py [--nprocs 1,2] [--stages sft,rm,dpo,ppo] [--epochs 1]
        [--rl-steps 10] [--device cpu] [--threads 2] [--out benchmarks/results/scaling.json]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import setup, write_result

from rlhf.project.metric_files import read_metrics

REPOSITORY = Path(__file__).resolve().parent.parent
INPUTS = ("data/prepared", "data/collected", "artifacts/tokenizer", "artifacts/sft", "artifacts/rm")
RL_STAGES = ("ppo",)  # run as `python -m rlhf.stages.rl ppo`
NEVER = 10**9  # save_every: no resume state in a timed run


def scratch_project(directory: Path, stage: str, length: int, device: str) -> Path:
    """A copy of the repository's code, params and the stage's inputs, training `length`
    epochs (iterations of an RL stage)."""
    shutil.copytree(
        REPOSITORY / "rlhf", directory / "rlhf", ignore=shutil.ignore_patterns("__pycache__")
    )
    for part in INPUTS:
        shutil.copytree(REPOSITORY / part, directory / part)
    params = yaml.safe_load((REPOSITORY / "params.yaml").read_text())
    params["device"] = device
    if stage in RL_STAGES:
        params[stage]["steps"] = length
        params["rl"] |= {"save_every": NEVER, "snapshot_every": 0}
    else:
        params[stage] |= {"epochs": length, "save_every": NEVER}
    (directory / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return directory


def timed_run(project: Path, stage: str, nproc: int, threads: int) -> dict:
    env = os.environ | {"RLHF_NPROC": str(nproc), "OMP_NUM_THREADS": str(max(1, threads // nproc))}
    started = time.perf_counter()
    command = ["rlhf.stages.rl", stage] if stage in RL_STAGES else [f"rlhf.stages.{stage}"]
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=project, env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"{stage} at {nproc} processes failed:\n{done.stderr[-2000:]}")
    timings = json.loads((project / "timings" / f"{stage}.json").read_text())
    steps = read_metrics(stage, project)["steps"]
    throughput = (
        {"tokens_per_s": timings["update_tokens_per_s"],
         "rollout_tokens_per_s": timings["rollout_tokens_per_s"]}
        if stage in RL_STAGES else {"tokens_per_s": timings["tokens_per_s"]}
    )  # fmt: skip
    return throughput | {"steps": steps, "wall_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    args = setup(
        __doc__, "scaling",
        ("--nprocs", {"default": "1,2"}), ("--stages", {"default": "sft,rm,dpo,ppo"}),
        ("--epochs", {"type": int, "default": 1}), ("--rl-steps", {"type": int, "default": 10}),
        ("--device", {"default": "cpu"}),
    )  # fmt: skip
    missing = [part for part in INPUTS if not (REPOSITORY / part).exists()]
    if missing:
        raise SystemExit(f"no {', '.join(missing)}: run `dvc repro rm` or `dvc pull` first")
    rows = []
    print(f"{'stage':<6}{'processes':>10}{'steps':>7}{'tokens/s':>10}{'speedup':>9}{'wall s':>8}"
          f"{'rollout tokens/s':>18}")  # fmt: skip
    for stage in args.stages.split(","):
        single = None
        for nproc in (int(n) for n in args.nprocs.split(",")):
            with tempfile.TemporaryDirectory() as scratch:
                length = args.rl_steps if stage in RL_STAGES else args.epochs
                project = scratch_project(Path(scratch), stage, length, args.device)
                run = timed_run(project, stage, nproc, args.threads)
            single = single or run["tokens_per_s"]
            speedup = round(run["tokens_per_s"] / single, 2)
            rows.append({"stage": stage, "processes": nproc, **run, "speedup": speedup})
            print(f"{stage:<6}{nproc:>10}{run['steps']:>7}{run['tokens_per_s']:>10}"
                  f"{speedup:>9.2f}{run['wall_s']:>8.1f}"
                  f"{run.get('rollout_tokens_per_s', ''):>18}")  # fmt: skip
    write_result(args.out, {"device": args.device, "threads": args.threads,
                            "epochs": args.epochs, "rl_steps": args.rl_steps,
                            "runs": rows})  # fmt: skip


if __name__ == "__main__":
    main()
