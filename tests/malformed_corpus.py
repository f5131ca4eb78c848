"""Malformed inputs through every entry point that accepts them.

    python tests/malformed_corpus.py [--entries python-m,rlhf,dvc,prefect] [--only NAME ...]
                                     [--json PATH]

Builds a tiny DVC project once (`dvc repro rm` on the test suite's tiny config), then for each
case and each entry point that accepts its input: copies the project, plants the bad input,
runs the command and checks what a user would see and what is left on disk:

- a refused case exits non-zero with exactly one error line holding what the case names
  (file, row and field, or params key), and no traceback anywhere in the output;
- an accepted case (`1e-3` in params, a corrupt resume file, `--out` to a folder) exits 0;
- no file changes outside the command's own outputs (DVC deletes a stage's outs before
  running it: under `dvc repro` those and DVC's own files are the command's outputs);
- a case with a time bound (what used to hang) ends within it, counted from when its entry
  point's module has imported (for a command not forked, as long as `python -c "import
  MODULE"` takes, timed here: 5 s for a stage unloaded, more on a busy machine).

A `python -m` command (a stage, the CLI) runs as a process of its own forked from one that
imported its module already (`forked_module.py`): the corpus pays torch's import once, not
once a command.

Entry points: `python -m rlhf.stages.X` (what dvc.yaml runs), `rlhf X` (the CLI), `dvc repro
--single-item X`, and the Prefect `rlhf-stage` flow on a temporary Prefect server, whose task
run must fail with the error as its state message. Prints a table; `--json` writes the rows.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from rlhf import dvcfile
from rlhf.dvcfile import declared_stages

import forked_module
from conftest import (
    clean_env,
    import_seconds,
    init_dvc_repo,
    make_project,
    safetensors_parts,
    write_safetensors,
)

ENTRIES = ("python-m", "rlhf", "dvc", "prefect")
IGNORED = (".dvc/tmp", ".dvc/cache", "__pycache__", ".git/", ".rlhf/locks")  # tool state


class RunsCode:
    """What a malicious checkpoint holds: unpickling it would run a shell command."""

    def __reduce__(self) -> tuple:
        return (os.system, ("touch pwned",))


@dataclass
class Case:
    name: str
    plant: Callable[[Path], None]  # writes the bad input into a copy of the project
    expect: str  # what the error line must hold; "" for a case that must be accepted
    stage: str | None = None  # run through every stage entry point
    commands: dict[str, list[str]] = field(default_factory=dict)  # entry -> `rlhf` args
    outputs: tuple[str, ...] = ()  # what the command may write besides a stage's outputs
    file_size_limit: int | None = None  # bytes: a disk that fills up
    entries: tuple[str, ...] = ENTRIES  # the entry points that can take this input
    # a bound on the command's wall time beyond importing its entry point
    # (`conftest.import_seconds`): it must not hang
    seconds: float | None = None


# -- planting helpers -------------------------------------------------------------------------


def edit_params(changes: dict) -> Callable[[Path], None]:
    def plant(project: Path) -> None:
        params = yaml.safe_load((project / "params.yaml").read_text())
        for key, value in changes.items():
            group, _, name = key.partition(".")
            if name:
                params.setdefault(group, {})[name] = value
            else:
                params[group] = value
        (project / "params.yaml").write_text(yaml.safe_dump(params))

    return plant


def params_text(old: str, new: str) -> Callable[[Path], None]:
    """Edit params.yaml as text, as a user types it (`.inf`, `1e-3`, a syntax error)."""

    def plant(project: Path) -> None:
        path = project / "params.yaml"
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))

    return plant


def write_bytes(relative: str, content: bytes) -> Callable[[Path], None]:
    def plant(project: Path) -> None:
        path = project / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)

    return plant


def jsonl(*records: object) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def parquet(rows: list[dict], schema: pa.Schema | None = None) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        return path.read_bytes()


def both(*plants: Callable[[Path], None]) -> Callable[[Path], None]:
    def plant(project: Path) -> None:
        for p in plants:
            p(project)

    return plant


def checkpoint_with(transform: Callable[[dict], object]) -> Callable[[Path], None]:
    """Rewrite artifacts/sft/model.pt as `transform(its payload)` (saved with torch.save)."""

    def plant(project: Path) -> None:
        path = project / "artifacts" / "sft" / "model.pt"
        payload = torch.load(path, weights_only=True)
        torch.save(transform(payload), path)

    return plant


def truncate(relative: str, keep: int) -> Callable[[Path], None]:
    def plant(project: Path) -> None:
        path = project / relative
        path.write_bytes(path.read_bytes()[:keep])

    return plant


def remove(relative: str) -> Callable[[Path], None]:
    def plant(project: Path) -> None:
        path = project / relative
        shutil.rmtree(path) if path.is_dir() else path.unlink()

    return plant


DEMO = {"prompt": "Say hi.", "response": "Hi!"}
HH_OK = "\n\nHuman: Say hi.\n\nAssistant: Hi!"
SFT = "artifacts/sft/model.pt"
IMPORT = ["import", "in.jsonl", "--out", "out.parquet"]


def imported(kind: str = "sft", name: str = "in.jsonl") -> dict[str, list[str]]:
    return {"rlhf": ["import", name, "--kind", kind, "--out", "out.parquet"]}


MODEL = "models/hostile"  # a model folder of the user's (`model.init`), as downloaded
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN3_CONFIG = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 404,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}  # fmt: skip  # 404 tokens: the base project's tokenizer's (sft checks, samples them)
INIT = {"model.init": MODEL, "tokenizer.kind": "pretrained"}  # the folder as the policy's start
WEIGHTS = f"{MODEL}/model.safetensors"
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
Q_NORM, K_NORM = (f"model.layers.0.self_attn.{x}_norm.weight" for x in "qk")  # 32 bytes each


@contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Run a project's command in this process, its working directory `folder` meanwhile."""
    previous = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def model_folder(
    template: str = CHATML,
    damage: Callable[[Path], None] = lambda folder: None,
    params: dict | None = None,
    **config: object,
) -> Callable[[Path], None]:
    """A pretrained model folder whose chat template, config.json or weights are hostile,
    named by `params` (`model.init` by default), and dvc.yaml regenerated to track it, as a
    user would: a tokenizer.json of a tiny byte-level BPE, the weights of QWEN3_CONFIG's model
    (random, written by our own export) as model.safetensors, then `damage(folder)`."""

    def plant(project: Path) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        from rlhf.models import registry
        from rlhf.models.hf import save_folder

        folder = project / MODEL
        folder.mkdir(parents=True)
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        trainer = trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        bpe.train_from_iterator(["Say hi. Hi! How are you?"] * 4, trainer)
        bpe.save(str(folder / "tokenizer.json"))
        roles = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        (folder / "tokenizer_config.json").write_text(json.dumps(roles))
        (folder / "chat_template.jinja").write_text(template)
        (folder / "config.json").write_text(json.dumps({**QWEN3_CONFIG, **config}))
        torch.manual_seed(0)
        llama = registry.family("llama")
        with tempfile.TemporaryDirectory() as tmp:
            model = registry.build("llama", llama.config_from_hf(QWEN3_CONFIG))
            shutil.move(save_folder(model, Path(tmp) / "m") / "model.safetensors", folder)
        damage(folder)
        edit_params(INIT if params is None else params)(project)
        # `rlhf dvc-yaml`, in this process: its stages are imported already
        with inside(project), redirect_stdout(io.StringIO()):
            assert dvcfile.main([]) == 0

    return plant


def template_case(name: str, template: str, expect: str) -> Case:
    """A hostile chat template, refused by the tokenizer stage in one line within 10 s."""
    return Case(f"model folder: chat template {name}", model_folder(template),
                f"{MODEL}/chat_template.jinja: the chat template cannot frame one prompt and "
                f"its answer: {expect}", stage="tokenizer", seconds=10,
                entries=("python-m", "rlhf"))  # fmt: skip


def weights_header(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    """model.safetensors with its header changed by `edit` (in place), the bytes after it as
    they were."""

    def damage(folder: Path) -> None:
        header, data = safetensors_parts(folder / "model.safetensors")
        edit(header)
        write_safetensors(folder / "model.safetensors", header, data)

    return damage


def claim_4_tib(header: dict) -> None:
    """Q_PROJ's entry claiming 4 TiB of float32 from where its bytes begin."""
    begin = header[Q_PROJ]["data_offsets"][0]
    header[Q_PROJ] |= {"shape": [2**20, 2**20], "data_offsets": [begin, begin + 4 * 2**40]}


def weights_bytes(transform: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    """model.safetensors replaced by `transform` of its bytes."""

    def damage(folder: Path) -> None:
        path = folder / "model.safetensors"
        path.write_bytes(transform(path.read_bytes()))

    return damage


def weights_tensors(transform: Callable[[dict], dict]) -> Callable[[Path], None]:
    """model.safetensors, a well-formed file, holding `transform` of its tensors."""

    def damage(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        path = folder / "model.safetensors"
        save_file(transform(load_file(path)), path, metadata={"format": "pt"})

    return damage


def with_tensor(name: str, make: Callable[[dict], torch.Tensor]) -> Callable[[Path], None]:
    """The weights with tensor `name` set to `make(tensors)`."""

    def put(tensors: dict) -> dict:
        return {**tensors, name: make(tensors).clone(memory_format=torch.contiguous_format)}

    return weights_tensors(put)


SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def sharded(listed: dict[str, str] | None = None, twice: str | None = None) -> Callable:
    """The weights as the two shards and index save_pretrained writes for a larger model (the
    first layer in the first shard), then the index listing tensors where `listed` says, and
    the tensor `twice` in both shards."""

    def damage(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        (folder / "model.safetensors").unlink()
        weight_map = {n: SHARDS[0 if ".layers.0." in n else 1] for n in tensors}
        for shard in SHARDS:
            held = {n: t for n, t in tensors.items() if weight_map[n] == shard or n == twice}
            save_file(held, folder / shard, metadata={"format": "pt"})
        index = {"metadata": {}, "weight_map": weight_map | (listed or {})}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    return damage


def linked_to(target: str | Callable[[Path], Path]) -> Callable[[Path], None]:
    """model.safetensors as a symlink to `target`, or to where `target(folder)` moved it."""

    def damage(folder: Path) -> None:
        path = folder / "model.safetensors"
        if callable(target):
            path.replace(moved := target(folder))
            path.symlink_to(moved)
        else:
            path.unlink()
            path.symlink_to(target)

    return damage


def outside(folder: Path) -> Path:
    """Where a Hugging Face cache keeps the bytes its snapshot folders link to."""
    blobs = folder.parent.parent / "hf-cache" / "blobs"
    blobs.mkdir(parents=True)
    return blobs / "0123abcd"


def huge_header(folder: Path) -> None:
    """A header length of 150 MB, and the file that long (sparse: no disk used)."""
    path = folder / "model.safetensors"
    path.write_bytes((150_000_000).to_bytes(8, "little") + b"{")
    os.truncate(path, 8 + 150_000_000)


def duplicated_key(folder: Path) -> None:
    """The header's JSON naming one tensor twice, with different offsets."""
    header, data = safetensors_parts(folder / "model.safetensors")
    text = json.dumps(header)[:-1] + f', "{Q_PROJ}": ' + json.dumps(header[Q_PROJ]) + "}"
    write_safetensors(folder / "model.safetensors", text.encode(), data)


def weights_case(name: str, damage: Callable[[Path], None], expect: str, **case: object) -> Case:
    """A model folder whose weights are damaged or hostile, refused (or, with `expect` "",
    accepted) by the SFT stage, which loads `model.init`, in one line within 10 s."""
    defaults = {"stage": "sft", "seconds": 10, "entries": ("python-m", "rlhf")}
    return Case(f"model folder: weights {name}", model_folder(damage=damage), expect,
                **defaults | case)  # fmt: skip


LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 9000\n"


CASES = [
    # params.yaml
    Case("params: lr written 1e-2 (text to PyYAML)", params_text("  lr: 0.01\n", "  lr: 1e-2\n"),
         "", stage="sft"),
    Case("params: seed 2**64", edit_params({"seed": 2**64}), "seed = 18446744073709551616",
         stage="prepare"),
    Case("params: eval_max_new_tokens 100000", edit_params({"sft.eval_max_new_tokens": 100000}),
         "sft.eval_max_new_tokens = 100000", stage="sft"),
    Case("params: dpo.beta .inf", params_text("dpo:\n", "dpo:\n  beta: .inf\n"),
         "dpo.beta = inf", stage="dpo"),
    Case("params: ppo.kl_coef .inf", params_text("  kl_coef: 0.2\n", "  kl_coef: .inf\n"),
         "ppo.kl_coef = inf", stage="rl@ppo"),
    Case("params: model too big for memory",
         edit_params({"model": {"n_layer": 96, "n_head": 128, "n_embd": 16384}}),
         "sft needs about", stage="sft"),
    Case("params: unknown key", edit_params({"sft.learning_rate": 0.1}),
         "unknown key 'sft.learning_rate'", stage="sft"),
    Case("params: wrong type", edit_params({"sft.batch_size": "big"}),
         "sft.batch_size = 'big' has the wrong type", stage="sft"),
    Case("params: not YAML", params_text("seed: 7\n", "seed: [7\n"), "params.yaml",
         stage="prepare"),
    Case("params: unknown RL algorithm", edit_params({"rl_algorithms": ["ppo", "sac"]}),
         "'sac'", stage="rl@sac"),
    Case("params: n_head does not divide n_embd", edit_params({"model.n_head": 5}),
         "model.n_head = 5 must divide", stage="sft"),
    Case("params: device cuda without a GPU", edit_params({"device": "cuda"}),
         "device: cuda", stage="sft"),
    # the user's data files
    Case("jsonl: invalid UTF-8", write_bytes("in.jsonl", jsonl(DEMO) + b'{"prompt": "\xff"}\n'),
         "in.jsonl: line 2: invalid UTF-8 at byte offset",
         commands={**imported(), "rlhf score": ["score", "artifacts/rm/model.pt", "--file",
                                                "in.jsonl"]}),
    Case("jsonl: a 2 MB row", write_bytes("in.jsonl", jsonl(DEMO, {"prompt": "x" * 2_000_000,
                                                                   "response": "y"})),
         "in.jsonl: row 2, field 'prompt': the row is 2,000,0",
         commands={**imported(), "rlhf score": ["score", "artifacts/rm/model.pt", "--file",
                                                "in.jsonl"]}),
    Case("jsonl: a line that is not JSON", write_bytes("in.jsonl", jsonl(DEMO) + b"{oops\n"),
         "in.jsonl: row 2: not valid JSON", commands=imported()),
    Case("jsonl: a row that is not an object", write_bytes("in.jsonl", jsonl(DEMO, [1, 2])),
         "in.jsonl: row 2: expected a JSON object", commands=imported()),
    Case("jsonl: missing response", write_bytes("in.jsonl", jsonl({"prompt": "a"})),
         "in.jsonl: row 1, field 'response': missing", commands=imported()),
    Case("jsonl: empty response", write_bytes("in.jsonl", jsonl({"prompt": "a", "response": " "})),
         "in.jsonl: row 1, field 'response': is empty", commands=imported()),
    Case("hh: transcript ends with a Human turn",
         write_bytes("in.jsonl", jsonl({"chosen": HH_OK + "\n\nHuman: thanks",
                                        "rejected": HH_OK.replace("Hi!", "No.")})),
         "in.jsonl: row 1, field 'chosen': ends with a Human turn", commands=imported("hh")),
    Case("hh: no Assistant turn", write_bytes("in.jsonl", jsonl({"chosen": "\n\nHuman: hi",
                                                                 "rejected": HH_OK})),
         "in.jsonl: row 1, field 'chosen': has no", commands=imported("hh")),
    Case("pairwise: identical chosen and rejected",
         write_bytes("in.jsonl", jsonl({"prompt": "q", "chosen": "a", "rejected": "a"})),
         "in.jsonl: row 1, field 'rejected': the same text", commands=imported("pairwise")),
    Case("ranked: one response", write_bytes("in.jsonl", jsonl(
        {"prompt": "q", "responses": [{"text": "a", "rank": 0}]})),
         "in.jsonl: row 1, field 'responses': needs at least 2", commands=imported("ranked")),
    Case("ranked: every rank equal", write_bytes("in.jsonl", jsonl(
        {"prompt": "q", "responses": [{"text": "a", "rank": 0}, {"text": "b", "rank": 0}]})),
         "in.jsonl: row 1, field 'ranks': all responses share one rank",
         commands=imported("ranked")),
    Case("ranked: negative rank", write_bytes("in.jsonl", jsonl(
        {"prompt": "q", "responses": [{"text": "a", "rank": -1}, {"text": "b", "rank": 0}]})),
         "in.jsonl: row 1, field 'ranks': expected non-negative", commands=imported("ranked")),
    Case("ranked: the pipeline's flat shape, a rank short", write_bytes("in.jsonl", jsonl(
        {"prompt": "q", "responses": ["a", "b", "c"], "ranks": [0, 1]})),
         "in.jsonl: row 1, field 'ranks': has 2 ranks for 3 responses",
         commands=imported("ranked")),
    Case("ranked: the flat shape without ranks", write_bytes("in.jsonl", jsonl(
        {"prompt": "q", "responses": ["a", "b"]})),
         "in.jsonl: row 1, field 'ranks': missing", commands=imported("ranked")),
    Case("ultrafeedback: a NaN score", write_bytes("in.jsonl", jsonl({"prompt": "q",
        "completions": [{"response": "a", "overall_score": float("nan")},
                        {"response": "b", "overall_score": 1}]})),
         "in.jsonl: row 1, field 'completions[0]': 'overall_score' is NaN",
         commands=imported("ultrafeedback")),
    Case("import --skip-bad-rows: HH rows: identical answers, another dialogue, a last Human turn",
         write_bytes("in.jsonl", jsonl(
             {"chosen": HH_OK, "rejected": HH_OK.replace("Hi!", "No.")},
             {"chosen": HH_OK, "rejected": HH_OK},
             {"chosen": HH_OK, "rejected": "\n\nHuman: Bye.\n\nAssistant: No."},
             {"chosen": HH_OK + "\n\nHuman: thanks", "rejected": HH_OK})),
         "", commands={"rlhf": [*imported("hh")["rlhf"], "--skip-bad-rows"]},
         outputs=("out.parquet", "out.rejected.jsonl")),
    Case("generate: a prompts file with no prompt", write_bytes("in.txt", b"\n  \n"),
         "in.txt: holds no prompts", commands={"rlhf generate": ["generate", SFT, "--file",
                                                                "in.txt"]}),
    Case("parquet: response column of integers",
         write_bytes("in.parquet", parquet([{"prompt": "a", "response": 1}])),
         "in.parquet: row 1, field 'response': expected text",
         commands=imported(name="in.parquet")),
    Case("parquet: truncated file", both(write_bytes("in.parquet", parquet([DEMO])),
                                         truncate("in.parquet", 20)),
         "in.parquet: not a readable Parquet file", commands=imported(name="in.parquet")),
    Case("import: a .csv file", write_bytes("in.csv", b"prompt,response\na,b\n"),
         "in.csv: expected a .jsonl, .json or .parquet file", commands=imported(name="in.csv")),
    Case("import: missing file", lambda project: None, "in.jsonl: no such file",
         commands=imported()),
    Case("import: --out an existing folder (data/raw)", write_bytes("in.jsonl", jsonl(DEMO)),
         "", commands={"rlhf": ["import", "in.jsonl", "--out", "data/raw"]},
         outputs=("data/raw/sft.parquet",)),
    Case("import: --out an existing file", both(write_bytes("in.jsonl", jsonl(DEMO)),
                                                write_bytes("out.parquet", b"mine")),
         "out.parquet exists; pass --force", commands=imported()),
    Case("data/raw/sft.parquet: a null response",
         both(write_bytes("data/raw/sft.parquet", parquet(
             [{**DEMO, "task": "user", "source": "s"}] * 30
             + [{"prompt": "a", "response": None, "task": "user", "source": "s"}])),
              edit_params({"data.source": "files", "collect.labeler": "human"})),
         "data/raw/sft.parquet: row 31, field 'response': is null", stage="prepare"),
    Case("data/raw/sft.parquet: a 2 MB row",
         both(write_bytes("data/raw/sft.parquet", parquet(
             [{**DEMO, "task": "user", "source": "s"}] * 30
             + [{"prompt": "a", "response": "y" * 2_000_000, "task": "user", "source": "s"}])),
              edit_params({"data.source": "files", "collect.labeler": "human"})),
         "data/raw/sft.parquet: row 31, field 'response': the row is 2,000,0", stage="prepare"),
    Case("data.source files without data/raw/sft.parquet",
         edit_params({"data.source": "files", "collect.labeler": "human"}),
         "data/raw/sft.parquet does not exist", stage="prepare"),
    # model folders: untrusted code and sizes, refused in bounded time
    template_case("reaching Python through ''.__class__",
                  "{{ ''.__class__.__mro__[1].__subclasses__() }}", "it fails to render"),
    template_case("reaching os through cycler", "{{ cycler.__init__.__globals__.os }}",
                  "it fails to render"),
    template_case("reaching builtins through joiner",
                  "{{ joiner.__init__.__globals__.__builtins__ }}", "it fails to render"),
    template_case("reaching os through namespace", "{{ namespace.__init__.__globals__.os }}",
                  "it fails to render"),
    template_case("reaching the context through self",
                  "{{ self._TemplateReference__context.cycler.__init__ }}", "it fails to render"),
    template_case("formatting its way to a class", "{{ '{0.__class__.__base__}'.format('') }}",
                  "it fails to render"),
    template_case("reaching a class through attr()", "{{ ''|attr('__class__') }}",
                  "it renders a message's content 0 times"),
    template_case("with a syntax error", "{% for m in messages %}", "it is not valid Jinja"),
    template_case("closing the answer with no special token",
                  "{% for m in messages %}{{ m.content }}{% endfor %}", "no special token"),
    template_case("looping 10^10 times",
                  "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                  "{% endfor %}", "rendering it takes longer than 5 s"),
    template_case("building a 10 GB string", "{{ 'x' * 10**10 }}",
                  "rendering it needs more than 1024 MiB"),
    Case("model folder: config.json with a billion layers",
         model_folder(num_hidden_layers=10**9),
         f"{MODEL}/config.json: num_hidden_layers = 1000000000; expected a whole number",
         stage="sft", seconds=10, entries=("python-m", "rlhf")),
    Case("model folder: config.json with a negative width", model_folder(hidden_size=-64),
         f"{MODEL}/config.json: hidden_size = -64", stage="sft", seconds=10,
         entries=("python-m", "rlhf")),
    # model folders: weights, untrusted as templates are (issue 46)
    weights_case("a header shape that disagrees with its bytes",
                 weights_header(lambda header: header[Q_PROJ].update(shape=[32, 33])),
                 f"{WEIGHTS}: tensor '{Q_PROJ}': dtype F32 and shape [32, 33] need 4,224 bytes, "
                 "its data_offsets"),
    weights_case("not a safetensors file (a pickle)",
                 weights_bytes(lambda raw: pickle.dumps({"weight": list(range(100))})),
                 f"{WEIGHTS}: not a safetensors file"),
    weights_case("with a projection cut in half",
                 with_tensor(Q_PROJ, lambda t: t[Q_PROJ][:16]),
                 f"{WEIGHTS}: tensor '{Q_PROJ}' has shape [16, 32]; config.json implies [32, 32]"),
    weights_case("with a float weight stored as integers",
                 weights_header(lambda header: header[Q_PROJ].update(dtype="I32")),
                 f"{WEIGHTS}: tensor '{Q_PROJ}' is stored as I32; weights are F16, BF16, F32, F64"),
    Case("model folder: config.json with rms_norm_eps NaN",
         model_folder(rms_norm_eps=float("nan")),
         f"{MODEL}/config.json: rms_norm_eps = nan; expected a number from 1e-30 to 0.1",
         stage="sft", seconds=10, entries=("python-m", "rlhf")),
    Case("model folder: config.json with rope_theta -inf", model_folder(rope_theta=float("-inf")),
         f"{MODEL}/config.json: rope_theta = -inf; expected a number", stage="sft", seconds=10,
         entries=("python-m", "rlhf")),
    weights_case("as a Git LFS pointer (cloned without git-lfs)", weights_bytes(lambda raw: LFS),
                 f"{WEIGHTS}: a Git LFS pointer, not the weights; fetch them with `git lfs pull`"),
    weights_case("truncated (a download cut short)", weights_bytes(lambda raw: raw[:len(raw) // 2]),
                 f"{WEIGHTS}: tensor"),
    weights_case("with a header length of 2^63",
                 weights_bytes(lambda raw: (2**63).to_bytes(8, "little") + raw[8:]),
                 f"{WEIGHTS}: not a safetensors file (or a truncated one): its first 8 bytes give "
                 "a header of 9,223,372,036,854,775,808 bytes"),
    weights_case("with a 150 MB header", huge_header,
                 f"{WEIGHTS}: its header claims 150,000,000 bytes, more than the 16,000,000"),
    weights_case("with a header of JSON nested 100,000 deep",
                 weights_bytes(lambda raw: (200_007).to_bytes(8, "little") + b'{"a": '
                               + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                 f"{WEIGHTS}: header is not valid JSON (nested too deeply)"),
    weights_case("with a tensor twice in its header", duplicated_key,
                 f"{WEIGHTS}: header is not valid JSON (key '{Q_PROJ}' appears twice)"),
    weights_case("with two tensors on the same bytes",
                 weights_header(lambda header: header[Q_NORM].update(
                     data_offsets=header[K_NORM]["data_offsets"])),
                 f"{WEIGHTS}: tensor 'model.layers.0.self_attn.q_norm.weight' overlaps tensor "
                 "'model.layers.0.self_attn.k_norm.weight'"),
    weights_case("with a tensor claiming 4 TiB",
                 weights_header(claim_4_tib),
                 f"{WEIGHTS}: tensor '{Q_PROJ}' ends at byte 4,398,046,"),
    weights_case("with a NaN in a weight",
                 with_tensor(Q_PROJ, lambda t: t[Q_PROJ].fill_diagonal_(torch.nan)),
                 f"{WEIGHTS}: tensor '{Q_PROJ}' holds 32 NaN or infinite values (in float32) of "
                 "1,024"),
    weights_case("with a layer config.json does not have",
                 with_tensor(Q_PROJ.replace(".0.", ".2."), lambda t: t[Q_PROJ]),
                 f"{WEIGHTS}: tensor 'model.layers.2.self_attn.q_proj.weight' has no place in "
                 "the model config.json describes (loading would drop it"),
    weights_case("lacking a layer's tensor",
                 weights_tensors(lambda t: {k: v for k, v in t.items() if ".1.mlp.up" not in k}),
                 f"{MODEL}: no weights file holds model.layers.1.mlp.up_proj.weight (shape "
                 "[64, 32]), which config.json's model needs"),
    weights_case("as a symlink to /dev/zero", linked_to("/dev/zero"),
                 f"{WEIGHTS}: not a regular file"),
    weights_case("as a symlink into a cache outside the folder (accepted)", linked_to(outside),
                 "", seconds=None),
    weights_case("sharded, the index naming ../../etc/passwd",
                 sharded({Q_PROJ: "../../etc/passwd"}),
                 f"{MODEL}/model.safetensors.index.json: names shard '../../etc/passwd', which "
                 f"is not a file inside {MODEL}"),
    weights_case("sharded, the index naming /etc/passwd", sharded({Q_PROJ: "/etc/passwd"}),
                 f"{MODEL}/model.safetensors.index.json: names shard '/etc/passwd', which is not "
                 "a file inside"),
    weights_case("sharded, the index naming a missing shard",
                 sharded({Q_PROJ: "model-00003-of-00003.safetensors"}),
                 f"{MODEL}: shard 'model-00003-of-00003.safetensors' named in "
                 "model.safetensors.index.json is missing"),
    weights_case("sharded, a tensor in both shards", sharded(twice=Q_PROJ),
                 f"{MODEL}/{SHARDS[1]}: tensor '{Q_PROJ}' is also in {SHARDS[0]}"),
    Case("model folder: weights of a reward model (collect.labeler hf:DIR) cut in half",
         model_folder(damage=with_tensor(Q_PROJ, lambda t: t[Q_PROJ][:16]),
                      params={"collect.labeler": f"hf:{MODEL}"}),
         f"{WEIGHTS}: tensor '{Q_PROJ}' has shape [16, 32]; config.json implies [32, 32]",
         stage="collect", seconds=10, entries=("python-m", "rlhf")),
    # the gold judge on your own prompts: refused before anything trains
    Case("demonstrations of your own with the default labeler (gold)",
         both(write_bytes("data/raw/sft.parquet", parquet(
             [{"prompt": f"How many centimeters are in {i} meters?", "response": f"{100 * i}.",
               "task": "user", "source": "mine"} for i in range(58)])),
              edit_params({"data.source": "files"})),
         "collect.labeler: 'gold' needs the task suite's gold judge", stage="prepare",
         seconds=10, entries=("python-m", "rlhf")),
    Case("rl.reward rule:gold on your own prompts",
         edit_params({"data.source": "files", "collect.labeler": "human",
                      "rl.reward": "rule:gold"}),
         "rl.reward: 'rule:gold' needs the task suite's gold judge", stage="sft",
         seconds=10, entries=("python-m", "rlhf")),
    # the CLI's own errors
    Case("generate: --max-new-tokens beyond the context", lambda project: None,
         "--max-new-tokens 100000 leaves no room for a prompt",
         commands={"rlhf generate": ["generate", SFT, "-p", "hi", "--max-new-tokens", "100000"]}),
    Case("import: --out / (a folder outside the project)", write_bytes("in.jsonl", jsonl(DEMO)),
         "--out / is a folder outside the project", commands={"rlhf": ["import", "in.jsonl",
                                                                        "--out", "/"]}),
    Case("import: --out into a folder that does not exist outside the project",
         write_bytes("in.jsonl", jsonl(DEMO)), "import creates no folders outside the project",
         commands={"rlhf": ["import", "in.jsonl", "--out", "../../no-such-folder/x.parquet"]}),
    # checkpoints
    Case("checkpoint: runs code when unpickled", checkpoint_with(lambda p: {**p, "x": RunsCode()}),
         f"{SFT}: refused", stage="collect",
         commands={"rlhf generate": ["generate", SFT, "-p", "hi"]}),
    Case("checkpoint: truncated", truncate(SFT, 4096), f"{SFT}: not a readable checkpoint",
         stage="collect", commands={"rlhf generate": ["generate", SFT, "-p", "hi"]}),
    Case("checkpoint: empty file", write_bytes(SFT, b""), f"{SFT}: an empty file",
         stage="collect", commands={"rlhf generate": ["generate", SFT, "-p", "hi"]}),
    Case("checkpoint: lacks its weights",
         checkpoint_with(lambda p: {k: v for k, v in p.items() if k != "model"}),
         f"{SFT}: checkpoint lacks 'model'", stage="collect",
         commands={"rlhf generate": ["generate", SFT, "-p", "hi"]}),
    Case("checkpoint: a policy given as reward model", lambda project: None,
         f"{SFT} is a policy checkpoint, not a reward model",
         commands={"rlhf score": ["score", SFT, "-p", "hi", "-r", "x"]}),
    Case("checkpoint: missing file", lambda project: None, "nope.pt: no such checkpoint",
         commands={"rlhf generate": ["generate", "nope.pt", "-p", "hi"]}),
    Case("input: prompts file deleted", remove("data/prepared/prompts_train.parquet"),
         "data/prepared/prompts_train.parquet", stage="collect"),
    Case("input: tokenizer deleted", remove("artifacts/tokenizer"), "artifacts/tokenizer",
         stage="sft"),
    # resume state and the disk
    Case("resume: garbage .rlhf/resume/sft.pt (and params changed, so DVC reruns sft)",
         both(write_bytes(".rlhf/resume/sft.pt", b"\x00garbage"),
              write_bytes(".rlhf/resume/.sft.pt.k1ll3d.tmp/half", b"half"),
              edit_params({"sft.epochs": 3})), "", stage="sft"),
    Case("disk: full while writing outputs", lambda project: None, "could not write",
         stage="prepare", file_size_limit=2048, entries=("python-m", "rlhf")),
]  # fmt: skip


# -- running -----------------------------------------------------------------------------------


def stage_commands(stage: str) -> dict[str, list[str]]:
    name, _, item = stage.partition("@")
    module = [sys.executable, "-m", f"rlhf.stages.{name}", *([item] if item else [])]
    cli = [sys.executable, "-m", "rlhf.cli", name, *([item] if item else [])]
    return {"python-m": module, "rlhf": cli, "dvc": ["dvc", "repro", "--single-item", stage],
            "prefect": ["prefect", stage]}  # fmt: skip


def allowed_outputs(case: Case, entry: str) -> tuple[str, ...]:
    """Paths (prefixes) the command may change."""
    allowed = list(case.outputs)
    if case.stage:
        name, _, item = case.stage.partition("@")
        spec = declared_stages()[name].filled(item or None)
        allowed += [str(p) for p in spec.outputs]
        allowed += [".rlhf/", "timings/"]  # resume state and speed, the stage's own
        if entry in ("dvc", "prefect"):
            allowed += ["dvc.lock"]
    return tuple(allowed)


def snapshot(project: Path) -> dict[str, str]:
    files = {}
    for path in project.rglob("*"):
        relative = str(path.relative_to(project))
        if path.is_file() and not any(part in relative for part in IGNORED):
            files[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def changed_outside(before: dict, after: dict, allowed: tuple[str, ...], entry: str) -> list[str]:
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    if entry in ("dvc", "prefect"):  # DVC lists a stage's outs in .gitignore files
        changed = {k for k in changed if not k.endswith(".gitignore")}
    return sorted(k for k in changed if not k.startswith(allowed))


def forked(argv: list[str], limit: int | None) -> bool:
    """Whether the command runs forked with its module imported (a stage or the CLI): not
    under a file-size limit, which would cap its output file too."""
    return argv[:2] == [sys.executable, "-m"] and not limit


def run_command(argv: list[str], cwd: Path, limit: int | None) -> tuple[int, str]:
    env = clean_env() | {"COLUMNS": "80"}
    if forked(argv, limit):
        return forked_module.run(argv, cwd, env, timeout_s=600)

    def cap_file_size() -> None:
        if limit:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, preexec_fn=cap_file_size,
        timeout=600,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def run_prefect(stage: str, cwd: Path) -> tuple[int, str]:
    """The `rlhf-stage` flow in this process (the Prefect server is already up): the task
    run's final state message is what a user sees in the Prefect UI."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from rlhf.flows.pipeline import stage_flow

    with inside(cwd):
        state = stage_flow(stage=stage, retries=0, return_state=True)
    if state.is_completed():
        return 0, ""
    runs_of = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=runs_of)
    messages = [f"error: {r.state.message}" for r in runs if r.state and r.state.is_failed()]
    return 1, "\n".join(messages) or f"flow failed: {state.message}"


def error_line(output: str) -> str | None:
    """Our one `error:` line, or DVC's `ERROR:` line when DVC refused before the stage ran."""
    ours = [line for line in output.splitlines() if line.startswith("error: ")]
    if len(ours) == 1:
        return ours[0]
    theirs = [line for line in output.splitlines() if line.startswith("ERROR: ")]
    return theirs[0] if not ours and theirs else None


def entry_module(case: Case) -> str:
    """The module whose import starts a case's commands: its stage's, else the CLI's."""
    return f"rlhf.stages.{case.stage.partition('@')[0]}" if case.stage else "rlhf.cli"


def startup_within(case: Case, seconds: float, command: list[str]) -> float:
    """What importing the case's entry point took, measured only when the run overran its
    bound (a run within the bound passes whatever the import took, and skipping the measure
    halves the corpus's time); nothing for a forked command, which imported nothing."""
    if case.seconds is None or seconds <= case.seconds or forked(command, case.file_size_limit):
        return 0.0
    return import_seconds(entry_module(case))


def verdict(
    case: Case, status: int, output: str, changed: list[str], seconds: float, startup: float
) -> dict:
    line = error_line(output)
    traceback = "Traceback" in output
    if case.expect:
        ok = status != 0 and line is not None and case.expect in line and not traceback
    else:
        ok = status == 0 and not traceback
    ok = ok and not changed and (case.seconds is None or seconds - startup <= case.seconds)
    return {"ok": ok, "status": status, "traceback": traceback, "changed": changed,
            "line": line if case.expect else None, "seconds": round(seconds, 1)}  # fmt: skip


def entries_of(case: Case, wanted: set[str]) -> dict[str, list[str]]:
    commands = {}
    if case.stage:
        commands |= stage_commands(case.stage)
    for entry, args in case.commands.items():
        commands[entry] = [sys.executable, "-m", "rlhf.cli", *args]
    usable = wanted & set(case.entries)
    return {e: argv for e, argv in commands.items() if e.split()[0] in usable}


def build_base(root: Path) -> Path:
    project = init_dvc_repo(make_project(root / "base"))
    done = subprocess.run(
        ["dvc", "repro", "rm"], cwd=project, env=clean_env(), capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(done.stdout + done.stderr)
    return project


def main(argv: list[str] | None = None, base: Path | None = None) -> int:
    """Run the corpus; `base`, a project already trained up to the reward model, saves
    building one (the `rlhf` and `python-m` entry points need no DVC repository)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", default=",".join(ENTRIES))
    parser.add_argument("--only", nargs="*", help="Case names (substrings) to run.")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    wanted = set(args.entries.split(","))
    cases = [c for c in CASES if not args.only or any(o in c.name for o in args.only)]
    forked_module.preload([*(entry_module(c) for c in cases), "rlhf.cli"])
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        if base is None:
            started = time.perf_counter()
            base = build_base(Path(tmp))
            print(f"base project built in {time.perf_counter() - started:.0f}s", file=sys.stderr)
        harness = None
        if "prefect" in wanted:
            from prefect.testing.utilities import prefect_test_harness

            harness = prefect_test_harness(server_startup_timeout=60)
            harness.__enter__()
        try:
            for case in cases:
                for entry, command in entries_of(case, wanted).items():
                    project = Path(tmp) / "case"
                    shutil.rmtree(project, ignore_errors=True)
                    shutil.copytree(base, project, symlinks=True)
                    case.plant(project)
                    before = snapshot(project)
                    started = time.monotonic()
                    if entry == "prefect":
                        status, output = run_prefect(case.stage or "", project)
                    else:
                        status, output = run_command(command, project, case.file_size_limit)
                    seconds = time.monotonic() - started
                    allowed = allowed_outputs(case, entry)
                    changed = changed_outside(before, snapshot(project), allowed, entry)
                    startup = startup_within(case, seconds, command)
                    row = {"case": case.name, "entry": entry} | verdict(
                        case, status, output, changed, seconds, startup
                    )
                    if not row["ok"]:
                        row["output"] = output[-2000:]
                    rows.append(row)
                    print(("ok  " if row["ok"] else "FAIL") + f" {case.name} [{entry}]",
                          file=sys.stderr)  # fmt: skip
        finally:
            if harness is not None:
                harness.__exit__(None, None, None)
    print_table(rows, len(cases))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


def print_table(rows: list[dict], n_cases: int) -> None:
    print("| case | entry point | exit | one-line error naming the input | traceback | "
          "files changed outside outputs | seconds |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        line = "(accepted)" if r["line"] is None and r["ok"] else (r["line"] or "-")
        traceback = "yes" if r["traceback"] else "no"
        print(f"| {r['case']} | {r['entry']} | {r['status']} | {line} | {traceback} | "
              f"{len(r['changed'])} | {r['seconds']} |")  # fmt: skip
    good = sum(r["ok"] for r in rows)
    tracebacks = sum(r["traceback"] for r in rows)
    changed = sum(len(r["changed"]) for r in rows)
    print(f"\n{n_cases} cases, {len(rows)} runs: {good}/{len(rows)} as expected "
          f"({100 * good / len(rows):.0f}%), {tracebacks} tracebacks, {changed} files changed "
          "outside the commands' outputs")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
