"""The GPU measuring step, `bash benchmarks/gpu.sh measure`: every figure of the GPU speed
targets in one call that fits the device slot and loses nothing it measured.

Each part runs in a process of its own under a time limit of its own (its share of what is
left of `--seconds`), and appends each JSON row to `OUT/measure.jsonl` the moment it is
measured: a part that crashes, hangs or runs out of time loses only its rows still to come,
and the parts after it still run. The parts, at GPT-2 124M's shape (`gpt2_shape.py`, random
weights, loaded as a user's GPT-2 folder):

  probe    which SDPA kernel each of the models' attention calls gets (the SFT step's causal
           attention, the packed masked forward of scoring and updates, the sampler's prefill
           and decoding steps, the reward model over padded answers), in bf16 and fp32, read
           from the profiler; the LM head's three matrix products at the vocabulary and at
           it padded to a multiple of 64; a packed forward and backward at a PPO minibatch's
           shape under the bins' mask and through varlen attention
  rollout  the sampler on the bf16 weights collect and evaluate decode with: at batch 64, calls
           of 32 and 128 new tokens, whose difference over their 96 extra steps is the
           steady-state seconds of a decoding step, and what a call costs beyond its steps
           (prefill, capture, the steps outside a graph) the rest; at batch 256, 128 tokens;
           each shape's first call apart (its compile); Hugging Face `generate` on the same
           weights; compiled against eager tokens in fp32 (a reported field, never an exit
           code); the top kernels of a 32-token call
  ppo      one PPO iteration of 64 x 128 tokens, compiled as the RL stage compiles: the
           warm-up iteration's extra seconds (compiles, captures) apart from the steady phases;
           the top kernels of one iteration, and how busy host and device were in it
  sft      the SFT stage's step as `train.compile: auto` runs it: compile seconds apart from
           the steady-state step, tokens/s and MFU; the top kernels of one step

`OUT/measure.json` holds every row and the targets met or not; `OUT/kernels.txt` the profiler
tables. gpu.sh sets a persistent inductor cache, so a second call in the same slot reuses the
first one's compiles.

    python benchmarks/measure.py --device cuda --out-dir gpu-results [--seconds 450]
    python benchmarks/measure.py --device cpu --shape tiny --out-dir /tmp/m   # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from common import synchronize
from gpt2_shape import SHAPES, random_gpt2_folder
from rollout_vs_hf import median_seconds, random_prompts

PARTS = ("probe", "rollout", "ppo", "sft")  # never-measured figures first
# shares of the time left when a part starts: the ones that compile most get most
WEIGHTS = {"probe": 1, "sft": 2, "rollout": 3, "ppo": 3}
ROWS, SUMMARY, KERNELS = "measure.jsonl", "measure.json", "kernels.txt"
ROLLOUT_BATCHES, ROLLOUT_NEW_TOKENS = (64, 256), (32, 128)


@dataclass(frozen=True)
class Target:
    """A GPU speed target: the `field` of the last row of `part` that has `row`'s keys, at
    least (or, `at_most`, at most) `bound`."""

    text: str
    part: str
    row: tuple[tuple[str, Any], ...]
    field: str
    bound: float
    at_most: bool = False


ROLLOUT_64 = (("kind", "calls"), ("batch", 64))
TARGETS = (
    Target("rollout at batch 64, 128 new tokens: >= 64000 tokens/s", "rollout", ROLLOUT_64,
           "tokens_per_s", 64_000),
    Target("rollout at batch 256, 128 new tokens: >= 200000 tokens/s", "rollout",
           (("kind", "calls"), ("batch", 256)), "tokens_per_s", 200_000),
    Target("rollout at batch 64: >= 4.0x HF generate", "rollout",
           (("kind", "hf_generate"), ("batch", 64)), "speedup", 4.0),
    Target("a 32-token call within 1.3x 32 steady steps", "rollout", ROLLOUT_64,
           "call_over_steps", 1.3, at_most=True),
    Target("SFT step: >= 450000 tokens/s", "sft", (("kind", "step"),), "tokens_per_s", 450_000),
    Target("PPO iteration: <= 0.8 s", "ppo", (("kind", "iteration"),), "iteration_s", 0.8,
           at_most=True),
    Target("PPO update: >= 150000 tokens/s", "ppo", (("kind", "iteration"),),
           "update_tokens_per_s", 150_000),
)  # fmt: skip


# the driver ---------------------------------------------------------------------------------


def append_row(path: Path, row: dict[str, Any]) -> None:
    """One JSON line, on disk before the part goes on (a later kill keeps it)."""
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")
        out.flush()
        os.fsync(out.fileno())
    print(json.dumps(row), flush=True)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every complete row (a part killed mid-write leaves at most a partial last line)."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def run_part(part: str, command: list[str], seconds: float, rows: Path) -> bool:
    """Run one part's process for at most `seconds`; a failure or overrun becomes a row of
    its own, and the caller goes on with the next part."""
    started = time.monotonic()
    try:
        done = subprocess.run(command, timeout=seconds, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired as stopped:
        sys.stderr.write(stopped.stderr.decode(errors="replace") if stopped.stderr else "")
        append_row(rows, {"part": part, "error": f"stopped after its {seconds:.0f} s"})
        return False
    sys.stderr.write(done.stderr)
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        append_row(rows, {"part": part, "error": f"exit {done.returncode}", "tail": lines[-8:]})
        return False
    append_row(rows, {"part": part, "done_s": round(time.monotonic() - started, 1)})
    return True


def time_limit(parts: list[str], index: int, deadline: float) -> float:
    """Part `index`'s share of the time left before `deadline`, by the weights of the parts
    still to run: a part that finishes early leaves its time to those after it."""
    weight_left = sum(WEIGHTS[p] for p in parts[index:])
    return (deadline - time.monotonic()) * WEIGHTS[parts[index]] / weight_left


def drive(args: argparse.Namespace) -> int:
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    rows = out / ROWS
    rows.unlink(missing_ok=True)
    (out / KERNELS).unlink(missing_ok=True)
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"error: --parts: unknown {', '.join(unknown)}; expected {PARTS}")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        folder = Path(tmp) / "model"
        child = [sys.executable, __file__, "--device", args.device, "--shape", args.shape]
        child += ["--out-dir", str(out), "--threads", str(args.threads)]
        made = run_part("model", [*child, "--part", "model", "--folder", str(folder)], 120, rows)
        if not made:
            return 1
        deadline = started + args.seconds
        for index, part in enumerate(parts):
            command = [*child, "--part", part, "--folder", str(folder)]
            run_part(part, command, time_limit(parts, index, deadline), rows)
    measured = read_rows(rows)
    targets = judge(measured)
    for target in targets:
        print(f"{'met' if target['met'] else 'NOT met'}: {target['target']}")
    failed = [r["part"] for r in measured if "error" in r]
    summary = {"rows": measured, "targets": targets, "failed_parts": failed}
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / SUMMARY}; parts failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


def judge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPU issue's targets against whatever rows were measured (a target whose rows are
    missing is not met, and says so)."""
    judged = []
    for t in TARGETS:
        found = [r for r in rows if r.get("part") == t.part and set(t.row) <= r.items()]
        got = found[-1].get(t.field) if found else None
        met = got is not None and (got <= t.bound if t.at_most else got >= t.bound)
        judged.append({"target": t.text, "measured": got, "met": met})
    return judged


# the parts ----------------------------------------------------------------------------------


class Part:
    """What every part reads and writes: the device, the model folder, the rows file."""

    def __init__(self, args: argparse.Namespace):
        self.device = torch.device(args.device)
        self.folder: Path = args.folder
        self.out: Path = args.out_dir
        self.shape = SHAPES[args.shape]
        self.name: str = args.part

    def emit(self, **row: Any) -> None:
        append_row(self.out / ROWS, {"part": self.name, **row})

    def kernels(self, title: str, profile: torch.profiler.profile) -> None:
        """The top kernels by device time (CPU time on a CPU) into kernels.txt."""
        sort = "cuda_time_total" if self.device.type == "cuda" else "cpu_time_total"
        table = profile.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=70)
        with (self.out / KERNELS).open("a") as out:
            out.write(f"## {title} ({self.device})\n{table}\n")

    def timed(self, fn: Callable[[], object]) -> float:
        """Seconds of one call, the device's queue drained before and after."""
        synchronize(self.device)
        started = time.perf_counter()
        fn()
        synchronize(self.device)
        return time.perf_counter() - started


def profiled(device: torch.device) -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def part_model(part: Part) -> None:
    started = time.perf_counter()
    random_gpt2_folder(part.folder, part.shape)
    part.emit(
        kind="folder", shape=asdict(part.shape), seconds=round(time.perf_counter() - started, 1)
    )


@contextmanager
def recorded_attention(calls: dict[str, tuple], label: Callable[[Any], str]) -> Iterator[None]:
    """Keep the first SDPA call of each label (its tensors cloned) while the models run."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    def record(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **options):
        name = label(q)
        if name not in calls:
            mask = None if attn_mask is None else attn_mask.clone()
            calls[name] = (q.clone(), k.clone(), v.clone(), mask, is_causal)
        return original(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **options
        )

    functional.scaled_dot_product_attention = record
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def attention_calls(part: Part) -> dict[str, tuple]:
    """One SDPA call of each kind the pipeline makes, run through the pipeline's own code."""
    from rlhf.algorithms import sft
    from rlhf.algorithms.scorers import RewardModelScorer
    from rlhf.models.hf import load_folder
    from rlhf.models.packing import packed_hidden_states
    from rlhf.sampling import generate as sampling
    from rlhf.sampling.sampler import SamplingConfig
    from rlhf.tokenizer.chat import Example
    from rlhf.tokenizer.tokenizer import pretrained_tokenizer

    model = load_folder(part.folder, part.device)
    end = part.shape.end_id
    prompts = random_prompts(8, part.shape.vocab_size, seed=3)
    calls: dict[str, tuple] = {}
    current = ["sft step, causal"]

    def label(q: torch.Tensor) -> str:  # [B, H, T, D]: one new token a row while decoding
        if current[0] != "sampling":
            return current[0]
        return "prefill" if q.shape[2] > 1 else "decode step"

    with recorded_attention(calls, label):
        rows = torch.randint(0, end, (2, part.shape.n_positions + 1)).tolist()
        loss, _ = sft.batch_loss(model, [Example(ids=r, response_start=1) for r in rows], end)
        loss.backward()
        with torch.no_grad():
            # the static decoding step as the compiled one runs it, op by op
            os.environ["RLHF_DECODE"] = "compiled"
            compile_step = sampling.compiled
            sampling.compiled = lambda function: function
            current[0] = "sampling"
            try:
                out = sampling.generate(
                    model, prompts, eos_id=end, pad_id=end, config=SamplingConfig(max_new_tokens=4)
                )
            finally:
                sampling.compiled = compile_step
            ids = torch.cat([out.prompt, out.tokens], 1)
            real = torch.cat([out.prompt_mask, out.mask], 1)
            current[0] = "packed forward, masked"
            packed_hidden_states(model, ids, real)
            current[0] = "reward model, padded answers"
            scorer = RewardModelScorer(
                model, pretrained_tokenizer(part.folder), pooling="last", std=1.0
            )
            scorer(["What is 1 plus 2?"] * 3, ["3", "It is three.", "The answer is 3, of course."])
    return calls


def sdpa_kernel(call: tuple, dtype: torch.dtype, device: torch.device) -> tuple[str, str]:
    """The ATen SDPA op the call dispatches to at `dtype`, and its top device kernel."""
    q, k, v, mask, causal = call
    q, k, v = (t.to(dtype) for t in (q, k, v))
    mask = mask.to(dtype) if mask is not None and mask.is_floating_point() else mask
    attend = torch.nn.functional.scaled_dot_product_attention
    attend(q, k, v, attn_mask=mask, is_causal=causal)
    with profiled(device) as profile:
        attend(q, k, v, attn_mask=mask, is_causal=causal)
        synchronize(device)
    events = profile.key_averages()
    ops = [e.key for e in events if e.key.startswith("aten::_scaled_dot_product")]
    device_events = [
        e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
    ]
    top = max(device_events, key=lambda e: e.device_time_total, default=None)
    return (ops[0] if ops else "math (unfused ops)"), (top.key[:90] if top else "-")


def lm_head_ms(device: torch.device, tokens: int, width: int, vocab: int) -> dict[str, float]:
    """Milliseconds of the LM head's forward and its two backward products, bf16 on CUDA."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(tokens, width, device=device, dtype=dtype)
    weight = torch.randn(vocab, width, device=device, dtype=dtype)
    grad = torch.randn(tokens, vocab, device=device, dtype=dtype)
    products = {
        "forward": lambda: x @ weight.T,
        "grad_input": lambda: grad @ weight,
        "grad_weight": lambda: grad.T @ x,
    }
    result = {}
    for name, product in products.items():
        product()
        seconds = median_seconds(product, device, repeats=10)
        result[f"{name}_ms"] = round(1e3 * seconds, 3)
        result[f"{name}_tflops"] = round(2 * tokens * width * vocab / seconds / 1e12, 2)
    return result


def packed_update_ms(part: Part) -> Iterator[dict[str, Any]]:
    """Milliseconds of one packed forward and backward at a PPO minibatch's shape (16 rows of
    a prompt and an answer of up to 128 tokens, ragged), under bf16 autocast on CUDA, eager:
    the bins under their block-diagonal mask against the one stream through varlen
    attention; and how busy the device was in one of them, which the host's launches hide
    from the wall-clock time at this size."""
    from rlhf.models import attention, backbone
    from rlhf.models.hf import load_folder
    from rlhf.models.packing import packed_hidden_states
    from rlhf.train.device import autocast

    model = load_folder(part.folder, part.device)
    rows, prompt, answer = (16, 24, 128) if part.device.type == "cuda" else (4, 8, 16)
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, part.shape.end_id, (rows, prompt + answer), generator=generator)
    prompts = torch.randint(4, prompt + 1, (rows,), generator=generator)
    answers = torch.randint(answer // 4, answer + 1, (rows,), generator=generator)
    columns = torch.arange(prompt + answer)
    real = (columns >= prompt - prompts[:, None]) & (columns < prompt + answers[:, None])
    ids, real = ids.to(part.device), real.to(part.device)
    head_dim = part.shape.n_embd // part.shape.n_head
    varlen = attention.runs_varlen(part.device, torch.bfloat16, 0.0, head_dim)
    runs_varlen = backbone.runs_varlen
    try:
        for name, through_varlen in (("masked bins", False), ("varlen", True)):
            if through_varlen and not varlen:
                continue
            backbone.runs_varlen = lambda *args, through=through_varlen: through

            def step() -> None:
                with autocast(part.device, bf16=True):
                    hidden = packed_hidden_states(model, ids, real)
                    loss = torch.where(real, model.values(hidden).float(), 0.0).sum()
                loss.backward()

            seconds = median_seconds(step, part.device, repeats=10)
            with profiled(part.device) as profile:  # eager: the host's launches bound the ms
                step()
                synchronize(part.device)
            yield {
                "attention": name,
                "tokens": int(real.sum()),
                "ms": round(1e3 * seconds, 3),
                **busy_ms(profile),
            }
    finally:
        backbone.runs_varlen = runs_varlen


def part_probe(part: Part) -> None:
    calls = attention_calls(part)
    dtypes = (torch.bfloat16, torch.float32) if part.device.type == "cuda" else (torch.float32,)
    for name, call in calls.items():
        for dtype in dtypes:
            op, kernel = sdpa_kernel(call, dtype, part.device)
            q, k = call[0], call[1]
            part.emit(
                kind="attention",
                call=name,
                dtype=str(dtype).removeprefix("torch."),
                q=list(q.shape),
                k=list(k.shape),
                mask=call[3] is not None,
                is_causal=call[4],
                aten_op=op,
                kernel=kernel,
            )
    tokens = 16 * part.shape.n_positions if part.device.type == "cuda" else 1024
    padded = -(-part.shape.vocab_size // 64) * 64
    for vocab in dict.fromkeys((part.shape.vocab_size, padded)):
        times = lm_head_ms(part.device, tokens, part.shape.n_embd, vocab)
        part.emit(kind="lm_head", vocab=vocab, tokens=tokens, **times)
    for row in packed_update_ms(part):
        part.emit(kind="packed_forward_backward", **row)


def part_sft(part: Part) -> None:
    from sft_mfu import matmul_peak, step_seconds

    compiled = part.device.type == "cuda"
    batch, steps, warmup = (16, 20, 8) if part.device.type == "cuda" else (2, 4, 1)
    profile = profiled(part.device)

    def profile_one(step: int) -> None:  # the step after warm-up, exactly
        if step == warmup:
            profile.__enter__()
        elif step == warmup + 1:
            synchronize(part.device)
            profile.__exit__(None, None, None)

    seconds, tokens = step_seconds(
        part.folder, part.shape, part.device, batch, steps, compiled, after_step=profile_one
    )
    steady = statistics.median(seconds[warmup + 2 :] or seconds[-1:])
    peak, peak_kind = matmul_peak(part.device)
    flops = part.shape.flops_per_token(part.shape.n_positions) * tokens / steady
    part.emit(
        kind="step",
        compiled=compiled,
        batch=batch,
        tokens_per_step=tokens,
        compile_s=round(sum(s - steady for s in seconds[:warmup]), 2),
        step_s=round(steady, 4),
        tokens_per_s=round(tokens / steady),
        mfu=round(flops / peak, 4),
        peak=peak_kind,
    )
    part.kernels("one SFT step", profile)


def part_rollout(part: Part) -> None:
    from rollout_vs_hf import compiled_against_eager, compiled_mode, hf_sampler, pipeline_sampler
    from transformers import GPT2LMHeadModel

    from rlhf.models.backbone import freeze
    from rlhf.models.hf import load_folder

    device, end, vocab = part.device, part.shape.end_id, part.shape.vocab_size
    mode = compiled_mode(device) if device.type == "cuda" else "eager"  # a CPU run: plumbing
    model = load_folder(part.folder, device).eval()
    tokens = 32 if device.type == "cuda" else 8
    part.emit(
        kind="compiled_vs_eager",
        dtype="float32",
        new_tokens=tokens,
        **compiled_against_eager(model, vocab, end, tokens),
    )
    model = freeze(model, bf16=device.type == "cuda")
    (batch, *more), (short, long) = ROLLOUT_BATCHES, ROLLOUT_NEW_TOKENS
    if device.type != "cuda":
        (batch, *more), (short, long) = (8,), (8, 24)
    prompts = random_prompts(batch, vocab, seed=batch)
    call, compile_s = {}, {}
    for n in (short, long):
        sample = pipeline_sampler(model, prompts, end, n, mode=mode)
        first = part.timed(sample)
        call[n] = median_seconds(sample, device, 3)
        compile_s[n] = round(first - call[n], 2)
    step = (call[long] - call[short]) / (long - short)
    part.emit(
        kind="calls",
        batch=batch,
        mode=mode,
        dtype=str(next(model.parameters()).dtype),
        step_ms=round(1e3 * step, 3),
        steady_tokens_per_s=round(batch / step),
        call_short_s=round(call[short], 4),
        call_long_s=round(call[long], 4),
        compile_short_s=compile_s[short],
        compile_long_s=compile_s[long],
        short_new_tokens=short,
        new_tokens=long,
        call_over_steps=round(call[short] / (short * step), 2),
        per_call_ms=round(1e3 * (call[short] - short * step), 2),
        tokens_per_s=round(batch * long / call[long]),
    )
    for wide in more:  # the long call only: one compile more, no steady step of its own
        sample = pipeline_sampler(
            model, random_prompts(wide, vocab, seed=wide), end, long, mode=mode
        )
        first = part.timed(sample)
        seconds = median_seconds(sample, device, 3)
        part.emit(
            kind="calls",
            batch=wide,
            mode=mode,
            new_tokens=long,
            call_long_s=round(seconds, 4),
            compile_long_s=round(first - seconds, 2),
            tokens_per_s=round(wide * long / seconds),
        )
    theirs = GPT2LMHeadModel.from_pretrained(part.folder).to(device).eval()
    theirs.to(next(model.parameters()).dtype)
    hf = median_seconds(hf_sampler(theirs, prompts, end, long), device, 2)
    ours = median_seconds(pipeline_sampler(model, prompts, end, long, mode=mode), device, 2)
    part.emit(
        kind="hf_generate",
        batch=batch,
        new_tokens=long,
        hf_tokens_per_s=round(batch * long / hf),
        speedup=round(hf / ours, 2),
    )
    with profiled(device) as profile:  # a shape compiled above: no compile in the table
        pipeline_sampler(model, prompts, end, short, mode=mode)()
        synchronize(device)
    part.kernels(
        f"one {short}-token call at batch {batch}: its prefill and decoding steps", profile
    )


def part_ppo(part: Part) -> None:
    from common import iteration_summary
    from ppo_iteration import ppo_trainer

    compiled = part.device.type == "cuda"
    new_tokens, iterations = (128, 2) if compiled else (16, 2)
    trainer = ppo_trainer(part.folder, part.device, new_tokens, iterations, compiled)
    started = time.perf_counter()
    warm = trainer.iteration()[0]
    first_s = time.perf_counter() - started
    part.emit(kind="warm_up", compiled=compiled, seconds=round(first_s, 2))
    runs = [trainer.iteration()[0] for _ in range(iterations)]
    summary = iteration_summary(runs)
    part.emit(
        kind="iteration",
        compiled=compiled,
        new_tokens=new_tokens,
        **summary,
        compile_s=round(first_s - summary["iteration_s"], 2),
        logprob_mismatch=max(r["logprob_mismatch"] for r in runs),
        warm_up_rollout_s=round(warm["rollout_s"], 2),
    )
    with profiled(part.device) as profile:
        trainer.iteration()
        synchronize(part.device)
    part.kernels("one PPO iteration", profile)
    part.emit(kind="profiled_iteration", **busy_ms(profile))


def busy_ms(profile: torch.profiler.profile) -> dict[str, float]:
    """Milliseconds the host spent in ops (the profiler's own cost included) and the device
    in kernels over a profiled stretch: a device far less busy than the stretch is long
    waits on the host."""
    events = profile.key_averages()
    cuda = torch.autograd.DeviceType.CUDA
    on_device = [e for e in events if getattr(e, "device_type", None) == cuda]
    on_host = [e for e in events if getattr(e, "device_type", None) != cuda]
    return {
        "host_busy_ms": round(sum(e.self_cpu_time_total for e in on_host) / 1e3, 1),
        "device_busy_ms": round(sum(e.self_device_time_total for e in on_device) / 1e3, 1),
    }


RUN = {
    "model": part_model,
    "probe": part_probe,
    "sft": part_sft,
    "rollout": part_rollout,
    "ppo": part_ppo,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default="gpt2", choices=sorted(SHAPES))
    parser.add_argument("--out-dir", type=Path, default=Path("gpu-results"))
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--seconds", type=float, default=450.0, help="all parts together")
    parser.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
    parser.add_argument("--part", choices=sorted(RUN), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part is None:
        return drive(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    RUN[args.part](Part(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
