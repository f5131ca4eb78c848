"""tokenizer: build the tokenizer from the training texts (prompts and responses), or take a
pretrained model's own (`model.init`) with its chat template."""

from __future__ import annotations

import time

from rlhf.data.schemas import SFT_SCHEMA, read_rows
from rlhf.project import paths
from rlhf.project.folders import init_folder, require_tracked
from rlhf.project.specs import StageSpec
from rlhf.stages.support.common import console, params
from rlhf.stages.support.entry import main
from rlhf.stages.support.outputs import begin, published
from rlhf.tokenizer.tokenizer import save_tokenizer

SPEC = StageSpec(
    "tokenizer",
    "rlhf.stages.tokenizer",
    params=("tokenizer", "model.init"),
    inputs=(paths.SFT_TRAIN,),
    outs=(paths.TOKENIZER,),
)


def run() -> dict[str, object]:
    begin(SPEC)
    all_params = params()
    p, source = all_params.tokenizer, init_folder(all_params)
    if source is not None:
        require_tracked(SPEC.name, source, "model.init")
    started = time.perf_counter()
    texts = [
        text
        for row in read_rows(paths.SFT_TRAIN, SFT_SCHEMA)
        for text in (row["prompt"], row["response"])
    ] if p.kind == "bpe" else []  # fmt: skip
    with published(SPEC) as out:
        tokenizer = save_tokenizer(
            out[paths.TOKENIZER], p.kind, texts=texts, vocab_size=p.vocab_size,
            encoding=p.encoding, source=source, chat_template=p.chat_template,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    console.print(
        f"tokenizer ({p.kind}): vocabulary {tokenizer.vocab_size} tokens, "
        f"identity {tokenizer.identity}, {seconds:.1f}s"
    )
    return {"vocab_size": tokenizer.vocab_size, "identity": tokenizer.identity}


if __name__ == "__main__":
    main(run)
