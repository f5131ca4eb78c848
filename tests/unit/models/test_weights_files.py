"""A model folder's weights are untrusted input (issue 46): each way a safetensors file, a
shard index or config.json's float settings can be damaged or hostile is one CheckpointError
naming the file, the tensor and what was expected, before any model is built, in time and
memory bounded by the file's real size; what transformers writes still loads, as the
backbone tests check against transformers itself."""

from __future__ import annotations

import json
import pickle
import shutil
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rlhf.errors import CheckpointError
from rlhf.models.hf import load_folder
from rlhf.models.safetensors_header import MAX_HEADER_BYTES, read_header

from conftest import write_safetensors
from hf_families import FAMILIES
from malformed_corpus import (
    LFS,
    Q_PROJ,
    SHARDS,
    duplicated_key,
    sharded,
    weights_header,
    weights_tensors,
    with_tensor,
)

# Q_PROJ is [128, 64] here: 4 heads of 32 over a width of 64
C_ATTN = "transformer.h.0.attn.c_attn.weight"  # GPT-2's Conv1D: [in 64, out 192]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Callable[[str], Path]:
    """The save_pretrained folder of a small random model of a family, made once."""
    folders: dict[str, Path] = {}

    def folder(family: str) -> Path:
        if family not in folders:
            torch.manual_seed(0)
            folders[family] = tmp_path_factory.mktemp(family)
            FAMILIES[family]().save_pretrained(folders[family])
        return folders[family]

    return folder


@pytest.fixture
def qwen3(saved, tmp_path) -> Path:
    """A copy of the Qwen3 folder, to damage."""
    return Path(shutil.copytree(saved("qwen3"), tmp_path / "qwen3"))


def refused(folder: Path, expected: str) -> str:
    """The error loading `folder` gives, which must hold `expected` (a literal)."""
    with pytest.raises(CheckpointError) as caught:
        load_folder(folder)
    message = str(caught.value)
    assert expected in message and "\n" not in message
    return message


# -- the file against its own bytes ----------------------------------------------------------


def offsets_of(header: dict, name: str) -> list[int]:
    return header[name]["data_offsets"]


HEADERS: dict[str, tuple[Callable[[dict], object], str]] = {
    "a shape its bytes do not fill": (
        lambda h: h[Q_PROJ].update(shape=[64, 64]),
        f"tensor '{Q_PROJ}': dtype F32 and shape [64, 64] need 16,384 bytes, its data_offsets",
    ),
    "a dtype wider than its bytes": (
        lambda h: h[Q_PROJ].update(dtype="F64"),
        "dtype F64 and shape [128, 64] need 65,536 bytes",
    ),
    "a dtype safetensors has no width for here": (
        lambda h: h[Q_PROJ].update(dtype="F4"),
        f"tensor '{Q_PROJ}': dtype 'F4' is not one of",
    ),
    "a negative dimension": (
        lambda h: h[Q_PROJ].update(shape=[-128, -64]),
        "shape [-128, -64] is not a list of at most 64 whole numbers",
    ),
    "a fractional dimension": (
        lambda h: h[Q_PROJ].update(shape=[128.0, 64]),
        "shape [128.0, 64] is not a list",
    ),
    "offsets backwards": (
        lambda h: h[Q_PROJ].update(data_offsets=offsets_of(h, Q_PROJ)[::-1]),
        "are not [begin, end]",
    ),
    "a tensor claiming 4 TiB": (
        lambda h: h[Q_PROJ].update(
            shape=[2**20, 2**20],
            data_offsets=[offsets_of(h, Q_PROJ)[0], offsets_of(h, Q_PROJ)[0] + 4 * 2**40],
        ),
        f"tensor '{Q_PROJ}' ends at byte 4,398,0",
    ),
    "two tensors on the same bytes": (
        lambda h: h["model.norm.weight"].update(
            data_offsets=offsets_of(h, "model.layers.0.input_layernorm.weight")
        ),
        "overlaps tensor",
    ),
    "a tensor without offsets": (
        lambda h: h[Q_PROJ].pop("data_offsets"),
        f"tensor '{Q_PROJ}': expected an object of dtype, shape, data_offsets",
    ),
    "metadata that is not strings": (
        lambda h: h.update(__metadata__={"format": 1}),
        "__metadata__ is not a map of strings to strings",
    ),
}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_a_header_that_disagrees_with_its_bytes_is_one_line_naming_the_tensor(case, qwen3):
    edit, expected = HEADERS[case]
    weights_header(edit)(qwen3)
    assert refused(qwen3, expected).startswith(f"{qwen3 / 'model.safetensors'}: ")


def framed(header: bytes, data: bytes = b"") -> bytes:
    """A safetensors file's bytes: the header's length, the header, the data."""
    return len(header).to_bytes(8, "little") + header + data


SCALAR = b'{"dtype": "F32", "shape": [], "data_offsets": [0, 4]}'
RAW: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "a pickle (pytorch_model.bin renamed)": (
        lambda raw: pickle.dumps({"w": list(range(64))}),
        "not a safetensors file (or a truncated one): its first 8 bytes give a header of",
    ),
    "an empty file": (lambda raw: b"", "not a safetensors file: 0 bytes, fewer than the 8"),
    "a Git LFS pointer": (
        lambda raw: LFS,
        "a Git LFS pointer, not the weights; fetch them with `git lfs pull`",
    ),
    "a header length of 2^63": (
        lambda raw: (2**63).to_bytes(8, "little") + raw[8:],
        "its first 8 bytes give a header of 9,223,372,036,854,775,808 bytes",
    ),
    "cut short": (lambda raw: raw[: len(raw) // 2], "of the data, which has"),
    "bytes after the last tensor": (lambda raw: raw + b"\0" * 4, "the rest belong to no tensor"),
    "a header that is not JSON": (lambda raw: framed(b"{oops"), "header is not valid JSON"),
    "a header that is a JSON list": (lambda raw: framed(b"[]"), "header is not a JSON object"),
    "a header nested 100,000 deep": (
        lambda raw: framed(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "header is not valid JSON (nested too deeply)",
    ),
    "NaN in the header": (
        lambda raw: framed(b'{"a": NaN}'),
        "header is not valid JSON (NaN is not JSON)",
    ),
    "a name that is no Unicode": (
        lambda raw: framed(b'{"\\ud800": ' + SCALAR + b"}", b"\0" * 4),
        "header is not valid JSON (a string escapes a lone surrogate",
    ),
    "invalid UTF-8": (lambda raw: framed(b'{"\xff'), "header is not valid JSON ('utf-8' codec"),
}


@pytest.mark.parametrize("case", sorted(RAW))
def test_a_file_that_is_not_a_well_formed_safetensors_file_is_one_line(case, qwen3):
    transform, expected = RAW[case]
    path = qwen3 / "model.safetensors"
    path.write_bytes(transform(path.read_bytes()))
    assert refused(qwen3, expected).startswith(f"{path}: ")


def test_a_tensor_named_twice_in_the_header_is_refused(qwen3):
    """The safetensors library keeps one of the two silently: which one is meant?"""
    duplicated_key(qwen3)
    refused(qwen3, f"header is not valid JSON (key '{Q_PROJ}' appears twice)")


def test_huge_claims_cost_neither_time_nor_memory(tmp_path):
    """A header length beyond the limit in a file that long (sparse), and a tensor claiming
    4 TiB in a file of bytes: refused before reading, within milliseconds and a few KB."""
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes((MAX_HEADER_BYTES + 1).to_bytes(8, "little"))
    with huge.open("r+b") as handle:
        handle.truncate(8 + MAX_HEADER_BYTES + 1)
    claim = tmp_path / "claim.safetensors"
    entry = {"dtype": "F32", "shape": [2**20, 2**20], "data_offsets": [0, 4 * 2**40]}
    write_safetensors(claim, {"w": entry}, b"\0" * 16)
    for path, expected in ((huge, f"more than the {MAX_HEADER_BYTES:,}"), (claim, "ends at")):
        tracemalloc.start()
        started = time.perf_counter()
        with pytest.raises(CheckpointError, match=expected):
            read_header(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert time.perf_counter() - started < 1 and peak < 1 << 20


@pytest.mark.parametrize(
    "header",
    [
        b'  {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',  # leading space
        b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": 1}}   ',
        b'{"__metadata__": {"format": "pt"}, "w": {"dtype": "BF16", "shape": [2, 2], '
        b'"data_offsets": [0, 8]}, "z": {"dtype": "I64", "shape": [0], "data_offsets": [8, 8]}}',
    ],
)
def test_what_the_check_passes_safetensors_loads(header, tmp_path):
    """The check is no stricter than the library where real files differ (padding, extra
    keys, empty tensors): what it passes, safetensors reads, with the same tensors."""
    path = tmp_path / "w.safetensors"
    write_safetensors(path, header, b"\0" * 8)
    entries = read_header(path)
    with safe_open(path, framework="pt") as handle:
        assert {n: list(handle.get_tensor(n).shape) for n in handle.keys()} == {  # noqa: SIM118
            n: list(e.shape) for n, e in entries.items()
        }


# -- the tensors against config.json -------------------------------------------------------


def test_a_projection_cut_in_half_names_the_shape_config_json_implies(qwen3):
    with_tensor(Q_PROJ, lambda t: t[Q_PROJ][:64])(qwen3)
    refused(qwen3, f"tensor '{Q_PROJ}' has shape [64, 64]; config.json implies [128, 64]")


def test_gpt2_shapes_are_named_in_the_files_own_layout(saved, tmp_path):
    """GPT-2's Conv1D weights are stored transposed: the error gives the file's shapes."""
    folder = Path(shutil.copytree(saved("gpt2"), tmp_path / "gpt2"))
    with_tensor(C_ATTN, lambda t: t[C_ATTN][:, :96])(folder)
    refused(folder, f"tensor '{C_ATTN}' has shape [64, 96]; config.json implies [64, 192]")


def test_a_float_weight_stored_as_integers_is_refused(qwen3):
    """Same size, so safetensors would load the bits as integers and `.float()` them."""
    weights_header(lambda h: h[Q_PROJ].update(dtype="I32"))(qwen3)
    refused(qwen3, f"tensor '{Q_PROJ}' is stored as I32; weights are F16, BF16, F32, F64")


def test_a_missing_tensor_is_named_as_the_file_would_name_it(qwen3):
    weights_tensors(lambda t: {k: v for k, v in t.items() if ".1.mlp.up_proj" not in k})(qwen3)
    refused(qwen3, "no weights file holds model.layers.1.mlp.up_proj.weight (shape [96, 64])")


def test_a_tensor_the_model_has_no_place_for_is_refused_but_old_buffers_are_ignored(qwen3):
    with_tensor("model.layers.0.rotary_emb.inv_freq", lambda t: torch.ones(16))(qwen3)
    load_folder(qwen3)  # a buffer old checkpoints saved: recomputed, so ignored
    extra = "model.layers.2.self_attn.q_proj.weight"
    with_tensor(extra, lambda t: t[Q_PROJ])(qwen3)
    refused(qwen3, f"tensor '{extra}' has no place in the model config.json describes")


def test_one_weight_under_two_names_is_refused(saved, tmp_path):
    """GPT-2 folders name tensors with or without `transformer.`: both at once is ambiguous."""
    folder = Path(shutil.copytree(saved("gpt2"), tmp_path / "gpt2"))
    with_tensor("wte.weight", lambda t: t["transformer.wte.weight"])(folder)
    refused(folder, "are one weight under two names")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e300])
def test_a_weight_that_is_not_finite_in_float32_is_refused(value, qwen3):
    def poison(tensors: dict) -> torch.Tensor:
        weight = tensors[Q_PROJ].double()
        weight[5, 7] = value  # 1e300 is a float64, infinite as a float32
        return weight

    with_tensor(Q_PROJ, poison)(qwen3)
    refused(qwen3, f"tensor '{Q_PROJ}' holds 1 NaN or infinite values (in float32) of 8,192")


def test_a_classifier_of_several_labels_is_refused_before_loading(saved, tmp_path):
    folder = Path(shutil.copytree(saved("qwen3"), tmp_path / "cls"))
    with_tensor("score.weight", lambda t: torch.zeros(3, 64))(folder)
    refused(folder, "tensor 'score.weight': a sequence classifier with 3 labels")


# -- shards --------------------------------------------------------------------------------


def test_a_sharded_folder_loads_as_the_single_file_does(saved, qwen3):
    sharded()(qwen3)
    ids = torch.randint(0, 150, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(load_folder(qwen3).eval()(ids), load_folder(saved("qwen3")).eval()(ids))


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ("../../etc/passwd", "names shard '../../etc/passwd', which is not a file inside"),
        ("/etc/passwd", "names shard '/etc/passwd', which is not a file inside"),
        ("sub/model.safetensors", "names shard 'sub/model.safetensors', which is not a file"),
        ("..", "names shard '..', which is not a file inside"),
        ("model-00003-of-00003.safetensors", "shard 'model-00003-of-00003.safetensors' named"),
        (SHARDS[1], f"{SHARDS[0]}: holds tensor '{Q_PROJ}'; model.safetensors.index.json lists "
                    f"it in '{SHARDS[1]}'"),
    ],
)  # fmt: skip
def test_an_index_naming_a_file_outside_the_folder_or_elsewhere_is_refused(listed, expected, qwen3):
    sharded({Q_PROJ: listed})(qwen3)
    refused(qwen3, expected)


def test_a_tensor_in_two_shards_or_in_none_is_refused(saved, qwen3, tmp_path):
    sharded(twice=Q_PROJ)(qwen3)
    refused(qwen3, f"{SHARDS[1]}: tensor '{Q_PROJ}' is also in {SHARDS[0]}")
    other = Path(shutil.copytree(saved("qwen3"), tmp_path / "other"))
    sharded({"ghost": SHARDS[0]})(other)
    refused(other, f"{SHARDS[0]}: lacks tensor 'ghost', which")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"{", "model.safetensors.index.json: not valid JSON"),
        (b'{"weight_map": {"a": "x"}, "weight_map": {}}', "key 'weight_map' appears twice"),
        (b'{"weight_map": ["model.safetensors"]}', "weight_map is not a map"),
        (b"[]", "weight_map is not a map"),
    ],
)
def test_an_index_that_is_not_a_map_of_tensors_to_files_is_refused(content, expected, qwen3):
    (qwen3 / "model.safetensors").unlink()
    (qwen3 / "model.safetensors.index.json").write_bytes(content)
    refused(qwen3, expected)


def test_a_link_into_a_cache_loads_and_a_link_to_a_device_is_refused(saved, qwen3, tmp_path):
    """The Hugging Face cache's snapshot folders are links into its blob store; a link to
    /dev/zero would be read forever."""
    weights = qwen3 / "model.safetensors"
    blob = tmp_path / "blobs" / "0123abcd"
    blob.parent.mkdir()
    weights.replace(blob)
    weights.symlink_to(blob)
    load_folder(qwen3)
    weights.unlink()
    weights.symlink_to("/dev/zero")
    refused(qwen3, "model.safetensors: not a regular file")


# -- config.json's float settings ----------------------------------------------------------


LLAMA3_SCALING = {"rope_type": "llama3", "factor": float("inf"), "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip


@pytest.mark.parametrize(
    ("family", "key", "value", "expected"),
    [
        ("qwen3", "rms_norm_eps", float("nan"), "rms_norm_eps = nan; expected a number"),
        ("qwen3", "rms_norm_eps", 0, "rms_norm_eps = 0; expected a number from 1e-30 to 0.1"),
        ("qwen3", "rms_norm_eps", "1e-6", "rms_norm_eps = '1e-6'; expected a number"),
        ("qwen2", "rope_parameters.rope_theta", float("inf"), "rope_parameters.rope_theta = inf"),
        ("qwen2", "rope_theta", -10000.0, "rope_theta = -10000.0; expected a number from 1 to"),
        ("llama3", "rope_parameters.factor", float("nan"), "rope_parameters.factor = nan"),
        ("llama3", "rope_parameters.low_freq_factor", 4.0,
         "rope_parameters.high_freq_factor = 4.0 must exceed low_freq_factor = 4.0"),
        ("llama3", "rope_parameters.original_max_position_embeddings", -16,
         "rope_parameters.original_max_position_embeddings = -16; expected a whole number"),
        # transformers 4 wrote rope_theta at the top and the scaling as rope_scaling
        ("llama3", "rope_scaling", LLAMA3_SCALING, "rope_scaling.factor = inf"),
    ],
)  # fmt: skip
def test_a_float_setting_out_of_range_is_refused_at_load(
    family, key, value, expected, saved, tmp_path
):
    """As sizes are: before the model is built, not as a NaN loss at its first step."""
    folder = Path(shutil.copytree(saved(family), tmp_path / family))
    config = json.loads((folder / "config.json").read_text())
    group, _, name = key.rpartition(".")
    (config[group] if group else config)[name] = value
    (folder / "config.json").write_text(json.dumps(config))
    refused(folder, expected)
