"""Pretrained tokenizers through tiktoken, held to the `tokenizers` library itself.

Byte-level BPE tokenizers are trained here on a generated multilingual corpus in the styles of
GPT-2, Qwen2 and Llama-3, saved as the files a Hugging Face model folder holds, read back with
`read_vocabulary`, and must give `tokenizers`' ids exactly. The chat templates are the real ones
of Qwen2.5, Qwen3 and Llama-3.1, rendered by `transformers` as the reference.
"""

from __future__ import annotations

import base64
import json
import pickle
import random
import shutil
import time
import unicodedata
from datetime import date
from pathlib import Path

import pytest
import tiktoken

from rlhf.errors import CheckpointError
from rlhf.tokenizer.chat_template import BUILTIN_FRAMES, ChatFrame, frame_from_template
from rlhf.tokenizer.hf_vocab import encoding_of, read_vocabulary

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen/Qwen2.5-7B-Instruct, tokenizer_config.json "chat_template"
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501

# Qwen/Qwen3-0.6B, tokenizer_config.json "chat_template" (as in llama.cpp's models/templates)
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501

# meta-llama/Llama-3.1-8B-Instruct, tokenizer_config.json "chat_template" (the revision that
# sets `tools = none`; Llama-3.3-70B-Instruct ships the same text, as in llama.cpp's templates)
LLAMA31_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""  # noqa: E501

LLAMA3_CHAT_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
]  # fmt: skip

# --- a varied corpus ---------------------------------------------------------------------------

COMMON_WORDS = (
    "the of and to in is was that for it with as on be at by this had not are but from or have "
    "an they which one you were her all she there would their we him been has when who will more "
    "no if out so said what up its about into than them can only other new some could time these "
    "two may then do first any my now such like our over man me even most made after also did "
    "many before must through back years where much your way well down should because each just"
)
WORDS = COMMON_WORDS.split()
SCRIPTS = (
    "你好世界，中文分词测试数据。", "こんにちは世界、カタカナとひらがな。", "안녕하세요 세계",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир", "Γειά σου Κόσμε",
    "café naïve Ærøskøbing façade jalapeño Größe", "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ", "x² ≤ ∑ ∞ → ½ €",
)  # fmt: skip
EMOJI = ("😀", "👍🏽", "👩‍👩‍👧‍👦", "🇫🇷", "❤️", "🧑‍💻", "🎉", "🏳️‍🌈")
CODE = (
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "if x != None: print('ok')  # comment\n",
    '<div class="a">&nbsp;</div>',
    "SELECT * FROM t WHERE id=42;",
    "    \n\t\t  \n",
)
CONTRACTIONS = ("don't", "I'm", "we'll", "they've", "she'd", "it's", "YOU'RE", "He'S", "o'clock")
PUNCTUATION = (",", ".", "!", "?", "...", "--", "(", ")", ":", "'", '"', "«", "»")
SEPARATORS = (" ",) * 8 + ("  ", "\t", "\n", " \n", "\r\n", "\n\n", "   ")


def _fragment(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.55:
        word = rng.choice(WORDS)
        return rng.choice((word, word, word, word.capitalize(), word.upper()))
    if kind < 0.67:
        text = rng.choice(SCRIPTS)
        start = rng.randrange(len(text))
        return text[start : start + rng.randint(1, 8)]
    if kind < 0.75:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    return rng.choice(rng.choice((EMOJI, CONTRACTIONS, CODE, PUNCTUATION)))


def _sentence(rng: random.Random) -> str:
    separator = rng.choice(SEPARATORS)
    text = separator.join(_fragment(rng) for _ in range(rng.randint(1, 14)))
    return rng.choice(("", "", " ", "  ")) + text + rng.choice(("", "", "\n", "\n\n", "  ", " \n"))


def _corpus(seed: int, size: int) -> list[str]:
    rng = random.Random(seed)
    return [_sentence(rng) for _ in range(size)]


EDGE_CASES = [
    "", " ", "  ", "\n", "\t", "\r\n", "   \n\n  ", "a  ", "  a", "a \n b", "hello\n\n\nworld",
    "trailing spaces   ", "\t\ttabbed\tline\t", "x\u00a0y", "line\u2028sep", "don't DON'T Don'T",
    "I'M we'LL they'Ve", "'s's's", "1", "12", "123", "1234", "12345678901234567890", "3.14159",
    "1,000,000", "٣٤٥ ١٢", "①②③", "Ⅻ", "0x1F600", "你好，世界！", "こんにちは世界", "안녕하세요",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते", "สวัสดีครับ", "café naïve Ærø", "cafe\u0301",
    "\u212b ngström", "\uf900 compatibility ideograph", "ﬁ ligature", "👩‍👩‍👧‍👦 family",
    "👍🏽👍🏿", "🇫🇷🇯🇵", "🏳️‍🌈", "a😀b", "😀😀😀", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>",
    "text<|im_end|>more", "<|endoftext|><|endoftext|>", "< |im_end| >",
    "<|eot_id|><|begin_of_text|>",
    "def f(x):\n    return x\n", "if (a && b) { c(); }", "#include <stdio.h>", "~!@#$%^&*()_+",
    "\x00\x01\x7f", "\ufeffBOM", "Zalgo: z̷̢̛a̶l̵g̸o̴", "Ǆǅǆ", "İstanbul ıi", "ß ẞ", "ŉ",
]  # fmt: skip


def _test_texts() -> list[str]:
    whitespace = [
        left + space * count + right
        for space in (" ", "\t", "\n", "\r\n", " \n", "\n ")
        for count in (1, 2, 3, 5)
        for left, right in (("", ""), ("a", ""), ("", "b"), ("a", "b"), ("1", "2"))
    ]
    return EDGE_CASES + whitespace + _corpus(seed=1, size=1000)


TEXTS = _test_texts()


# --- tokenizers trained in the styles of GPT-2, Qwen2 and Llama-3 -----------------------------


def _byte_of() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted, written out independently of the module under test."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table = {byte: chr(byte) for byte in printable}
    table |= {
        byte: chr(256 + n) for n, byte in enumerate(b for b in range(256) if b not in printable)
    }
    return {character: byte for byte, character in table.items()}


BYTE_OF = _byte_of()


def _train(pre_tokenizer, *, specials=(), normalizer=None, vocab_size=2500) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed=0, size=6000), trainer)
    return tokenizer


def _split_then_bytes(pattern: str):
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ]
    )


def _write_rank_file(tokenizer: Tokenizer, path: Path) -> None:
    """A Llama-3 style tokenizer.model: `base64(token bytes) id` per line, by id."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    lines = (
        base64.b64encode(bytes(BYTE_OF[c] for c in text)).decode() + f" {rank}"
        for text, rank in vocab
    )
    path.write_text("\n".join(lines) + "\n")


CASES = ("gpt2-json", "gpt2-slow", "qwen", "llama-json", "llama-rank")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[Path, Tokenizer]]:
    """Each case: a model folder to read, and the `tokenizers` tokenizer it must agree with."""
    root = tmp_path_factory.mktemp("pretrained")
    gpt2 = _train(pre_tokenizers.ByteLevel(add_prefix_space=False), specials=["<|endoftext|>"])
    qwen = _train(
        _split_then_bytes(QWEN2_PATTERN), specials=QWEN_SPECIALS, normalizer=normalizers.NFC()
    )
    llama = _train(_split_then_bytes(LLAMA3_PATTERN))
    for tokenizer in (gpt2, qwen):
        tokenizer.encode_special_tokens = True  # special-token strings in user text stay text
    for name in CASES:
        (root / name).mkdir()
    gpt2.save(str(root / "gpt2-json" / "tokenizer.json"))
    gpt2.model.save(str(root / "gpt2-slow"))
    qwen.save(str(root / "qwen" / "tokenizer.json"))
    qwen_config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": {"content": "<|endoftext|>", "special": True},
        "chat_template": QWEN25_TEMPLATE,
    }
    (root / "qwen" / "tokenizer_config.json").write_text(json.dumps(qwen_config))
    llama.save(str(root / "llama-json" / "tokenizer.json"))
    _write_rank_file(llama, root / "llama-rank" / "tokenizer.model")
    oracles = {"gpt2-json": gpt2, "gpt2-slow": gpt2, "qwen": qwen}
    return {name: (root / name, oracles.get(name, llama)) for name in CASES}


@pytest.mark.parametrize("case", CASES)
def test_ids_match_the_model_tokenizer_exactly(folders, case):
    folder, oracle = folders[case]
    vocab = read_vocabulary(folder)
    encoding = encoding_of(vocab, f"test-{case}")
    expected = [encoded.ids for encoded in oracle.encode_batch(TEXTS, add_special_tokens=False)]
    ours = encoding.encode_ordinary_batch(TEXTS)
    mismatches = [(text, a, b) for text, a, b in zip(TEXTS, ours, expected, strict=True) if a != b]
    assert not mismatches, f"{len(mismatches)} of {len(TEXTS)} differ, first: {mismatches[0]}"
    assert len(TEXTS) >= 1000


@pytest.mark.parametrize("case", CASES)
def test_user_text_never_becomes_special_and_decodes_back(folders, case):
    folder, _ = folders[case]
    vocab = read_vocabulary(folder)
    encoding = encoding_of(vocab, f"test-{case}")
    special_ids = set(vocab.special_tokens.values())
    for text in TEXTS:
        ids = encoding.encode_ordinary(text)
        assert not special_ids & set(ids), text
        normal = unicodedata.normalize(vocab.normalization, text) if vocab.normalization else text
        assert encoding.decode(ids) == normal


def test_qwen_normalizes_to_nfc_as_its_tokenizer_does(folders):
    folder, oracle = folders["qwen"]
    encoding = encoding_of(read_vocabulary(folder), "qwen")
    for text in ("cafe\u0301", "\u212b", "\uf900", "e\u0301\u0327"):
        assert unicodedata.normalize("NFC", text) != text
        assert encoding.encode_ordinary(text) == oracle.encode(text, add_special_tokens=False).ids
        assert encoding.encode(text) == encoding.encode_ordinary(unicodedata.normalize("NFC", text))
    copied = pickle.loads(pickle.dumps(encoding))  # as worker processes receive it
    assert copied.encode_ordinary("cafe\u0301") == encoding.encode_ordinary("caf\u00e9")


def test_gpt2_files_give_the_same_vocabulary_and_the_eos_convention(folders):
    fast = read_vocabulary(folders["gpt2-json"][0])
    slow = read_vocabulary(folders["gpt2-slow"][0])
    assert fast.ranks == slow.ranks
    assert fast.special_tokens == slow.special_tokens == {"<|endoftext|>": 0}
    assert (fast.bos, fast.eos, fast.pad) == ("<|endoftext|>", "<|endoftext|>", None)
    assert fast.chat_template is None
    assert len(fast.ranks) == 2499 and b"<|endoftext|>" not in fast.ranks


def test_qwen_special_tokens_roles_and_template(folders):
    vocab = read_vocabulary(folders["qwen"][0])
    assert vocab.special_tokens == {token: i for i, token in enumerate(QWEN_SPECIALS)}
    assert (vocab.bos, vocab.eos, vocab.pad) == (None, "<|im_end|>", "<|endoftext|>")
    assert vocab.chat_template == QWEN25_TEMPLATE
    assert vocab.normalization == "NFC"
    assert vocab.pat_str == QWEN2_PATTERN


def test_llama_rank_file_uses_meta_conventions(folders):
    vocab = read_vocabulary(folders["llama-rank"][0])
    first = len(vocab.ranks)
    assert vocab.pat_str == LLAMA3_PATTERN
    assert len(vocab.special_tokens) == 256
    assert vocab.special_tokens["<|begin_of_text|>"] == first
    assert vocab.special_tokens["<|finetune_right_pad_id|>"] == first + 4
    assert vocab.special_tokens["<|eot_id|>"] == first + 9
    assert vocab.special_tokens["<|python_tag|>"] == first + 10
    assert vocab.special_tokens["<|reserved_special_token_2|>"] == first + 11
    assert vocab.special_tokens["<|reserved_special_token_246|>"] == first + 255
    assert (vocab.bos, vocab.eos, vocab.pad) == (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|finetune_right_pad_id|>",
    )
    assert encoding_of(vocab, "llama").n_vocab == first + 256


def test_llama_rank_file_takes_specials_roles_and_template_from_its_config(folders, tmp_path):
    shutil.copy(folders["llama-rank"][0] / "tokenizer.model", tmp_path)
    first = len(read_vocabulary(folders["llama-rank"][0]).ranks)
    decoder = {str(first + i): {"content": t} for i, t in enumerate(LLAMA3_CHAT_SPECIALS)}
    config = {
        "added_tokens_decoder": decoder,
        "bos_token": "<|begin_of_text|>",
        "eos_token": {"content": "<|eot_id|>"},
        "chat_template": [
            {"name": "tool_use", "template": "{{ tools }}"},
            {"name": "default", "template": LLAMA31_TEMPLATE},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    vocab = read_vocabulary(tmp_path)
    assert vocab.special_tokens == {t: first + i for i, t in enumerate(LLAMA3_CHAT_SPECIALS)}
    assert (vocab.bos, vocab.eos, vocab.pad) == ("<|begin_of_text|>", "<|eot_id|>", None)
    assert vocab.chat_template == LLAMA31_TEMPLATE
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert read_vocabulary(tmp_path).chat_template == "{{ messages }}"


# --- vocabularies tiktoken cannot encode exactly ------------------------------------------------


def _byte_level_bpe(extra: dict[str, int], merges: list[tuple[str, str]], **options) -> Tokenizer:
    """A hand-made byte-level BPE: the 256 bytes as ids 0-255 in byte order, then `extra`."""
    tokenizer = Tokenizer(models.BPE(BYTE_OF | extra, merges, **options))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tokenizer


def _tiktoken_ids(extra: dict[str, int], text: str) -> list[int]:
    """What tiktoken makes of `text` with the same ids as ranks."""
    ranks = {bytes([byte]): byte for byte in range(256)}
    ranks |= {token.encode(): rank for token, rank in extra.items()}
    encoding = tiktoken.Encoding(
        "by-rank", pat_str=r"\S+", mergeable_ranks=ranks, special_tokens={}
    )
    return encoding.encode_ordinary(text)


def test_ids_out_of_merge_order_are_refused(tmp_path):
    # tiktoken would merge "bc" (id 256) first, the merges list merges "ab" first
    extra = {"ab": 257, "bc": 256}
    tokenizer = _byte_level_bpe(extra, [("a", "b"), ("b", "c")])
    assert tokenizer.encode("abc").ids == [257, ord("c")]
    assert _tiktoken_ids(extra, "abc") == [ord("a"), 256]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(CheckpointError, match=r"tokenizer.json: merge #1 .* not in merge order"):
        read_vocabulary(tmp_path)


@pytest.mark.parametrize("ignore_merges", [False, True])
def test_a_token_the_merges_cannot_rebuild_is_refused(tmp_path, ignore_merges):
    # the merges list turns "abc" into a + bc and stops; tiktoken would merge a + bc into "abc"
    extra = {"bc": 256, "ab": 257, "abc": 258}
    merges = [("b", "c"), ("a", "b"), ("ab", "c")]
    tokenizer = _byte_level_bpe(extra, merges, ignore_merges=ignore_merges)
    assert tokenizer.encode("xabc").ids == [ord("x"), ord("a"), 256]
    assert _tiktoken_ids(extra, "xabc") == [ord("x"), 258]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(
        CheckpointError, match=r"tokenizer.json: the merges list splits token b'abc'"
    ):
        read_vocabulary(tmp_path)


def test_a_vocabulary_missing_bytes_is_refused(tmp_path):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator(["hello world"] * 10, trainers.BpeTrainer(show_progress=False))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(CheckpointError, match=r"no token for .* byte value"):
        read_vocabulary(tmp_path)


def _edited_tokenizer_json(source: Path, target: Path, edit) -> Path:
    spec = json.loads((source / "tokenizer.json").read_text())
    edit(spec)
    target.mkdir(exist_ok=True)
    (target / "tokenizer.json").write_text(json.dumps(spec))
    return target


def _unusable_split(spec: dict) -> None:
    """Oniguruma (Hugging Face) knows \\X, a grapheme cluster; fancy-regex (tiktoken) does not."""
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\X|\s+"


@pytest.mark.parametrize(
    ("case", "edit", "message"),
    [
        ("gpt2-json", lambda spec: spec.update(normalizer={"type": "Lowercase"}), "Lowercase"),
        ("gpt2-json", lambda spec: spec["model"].update(byte_fallback=True), "byte_fallback"),
        ("gpt2-json", lambda spec: spec["pre_tokenizer"].update(add_prefix_space=True), "prefix"),
        ("gpt2-json", lambda spec: spec.update(pre_tokenizer={"type": "Whitespace"}), "Whitesp"),
        ("qwen", _unusable_split, "tiktoken's regex engine rejects"),
    ],
)
def test_unsupported_tokenizer_json_features_are_named(folders, tmp_path, case, edit, message):
    folder = _edited_tokenizer_json(folders[case][0], tmp_path / "edited", edit)
    with pytest.raises(CheckpointError, match=message):
        read_vocabulary(folder)


@pytest.mark.parametrize(
    "model",
    [
        models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0, False),
        models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"),
    ],
    ids=["Unigram", "WordPiece"],
)
def test_non_bpe_models_are_refused(tmp_path, model):
    Tokenizer(model).save(str(tmp_path / "tokenizer.json"))
    kind = type(model).__name__
    with pytest.raises(CheckpointError, match=rf"tokenizer.json: a {kind} tokenizer model is not"):
        read_vocabulary(tmp_path)


def test_empty_or_missing_folder_names_the_files_it_looked_for(tmp_path):
    with pytest.raises(CheckpointError, match=r"holds no tokenizer: looked for tokenizer.json"):
        read_vocabulary(tmp_path)
    with pytest.raises(CheckpointError, match=r"nowhere does not exist: looked for"):
        read_vocabulary(tmp_path / "nowhere")


def test_sentencepiece_model_is_refused(tmp_path):
    # a protobuf ModelProto as Llama-2 ships it: field 1 (pieces) = {piece "<unk>", score 0}
    (tmp_path / "tokenizer.model").write_bytes(b"\n\x0b\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")
    with pytest.raises(
        CheckpointError, match=r"tokenizer.model: not a tiktoken rank file.*Sentence"
    ):
        read_vocabulary(tmp_path)


def test_a_role_that_is_not_a_special_token_is_refused(folders, tmp_path):
    shutil.copy(folders["qwen"][0] / "tokenizer.json", tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(CheckpointError, match=r"tokenizer_config.json: eos_token '</s>' is not"):
        read_vocabulary(tmp_path)


# --- chat templates as frames ------------------------------------------------------------------

QWEN25_FRAME = ChatFrame(
    prefix="<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\n<|im_start|>user\n",
    infix="<|im_end|>\n<|im_start|>assistant\n",
    end="<|im_end|>",
)
QWEN3_FRAME = ChatFrame(
    prefix="<|im_start|>user\n",
    infix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    end="<|im_end|>",
)
LLAMA31_FRAME = ChatFrame(
    prefix="<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
    "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user"
    "<|end_header_id|>\n\n",
    infix="<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    end="<|eot_id|>",
)
TEMPLATES = {
    "qwen2.5": (QWEN25_TEMPLATE, None, "<|im_end|>", QWEN_SPECIALS, QWEN25_FRAME),
    "qwen3": (QWEN3_TEMPLATE, None, "<|im_end|>", [*QWEN_SPECIALS, "<think>"], QWEN3_FRAME),
    "llama3.1": (
        LLAMA31_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>", LLAMA3_CHAT_SPECIALS, LLAMA31_FRAME
    ),
}  # fmt: skip
CONVERSATIONS = [
    ("What is 2 + 2?", "4."),
    ("Translate «bonjour» to English.\n\nThanks!", "Hello.\nAnything else?"),
    ("  spaced prompt  ", "日本語で答えます 😀"),
]


@pytest.mark.parametrize("name", TEMPLATES)
def test_real_templates_give_the_expected_frames(name):
    template, bos, eos, specials, expected = TEMPLATES[name]
    assert frame_from_template(template, bos=bos, eos=eos, special_tokens=specials) == expected


@pytest.mark.parametrize("name", TEMPLATES)
def test_frames_reproduce_transformers_rendering(folders, name):
    transformers = pytest.importorskip("transformers")
    template, bos, eos, _, frame = TEMPLATES[name]
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folders["qwen"][0] / "tokenizer.json"),
        **{key: value for key, value in (("bos_token", bos), ("eos_token", eos)) if value},
    )
    for prompt, answer in CONVERSATIONS:
        user = {"role": "user", "content": prompt}
        turns = [user, {"role": "assistant", "content": answer}]
        options = {"chat_template": template, "tokenize": False, "enable_thinking": False}
        generation = hf.apply_chat_template([user], add_generation_prompt=True, **options)
        finished = hf.apply_chat_template(turns, **options)
        if name == "llama3.1":  # its template trims message contents; a frame keeps them
            prompt, answer = prompt.strip(), answer.strip()
        assert generation == frame.prefix + prompt + frame.infix
        assert finished.rstrip() == frame.prefix + prompt + frame.infix + answer + frame.end


def test_framed_ids_match_transformers_tokenizing_the_rendered_chat(folders):
    transformers = pytest.importorskip("transformers")
    folder, _ = folders["qwen"]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    encoding = encoding_of(read_vocabulary(folder), "qwen")
    frame = frame_from_template(
        QWEN25_TEMPLATE, bos=None, eos="<|im_end|>", special_tokens=QWEN_SPECIALS
    )
    for prompt, answer in CONVERSATIONS:
        ids = [
            *encoding.encode(frame.prefix, allowed_special="all"),
            *encoding.encode_ordinary(prompt),
            *encoding.encode(frame.infix, allowed_special="all"),
            *encoding.encode_ordinary(answer),
            encoding.encode_single_token(frame.end),
        ]
        text = frame.prefix + prompt + frame.infix + answer + frame.end
        assert ids == hf(text, add_special_tokens=False)["input_ids"]


def test_builtin_frames():
    chatml = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    framed = frame_from_template(chatml, bos=None, eos=None, special_tokens=QWEN_SPECIALS)
    assert framed == BUILTIN_FRAMES["chatml"]
    assert BUILTIN_FRAMES["plain"] == ChatFrame(prefix="", infix="\n\n", end="<|endoftext|>")
    llama = BUILTIN_FRAMES["llama3"]
    assert llama.prefix.startswith("<|begin_of_text|>") and llama.infix.endswith("\n\n")
    assert llama.end == "<|eot_id|>"


def test_the_date_a_template_asks_for_can_be_pinned():
    template = (
        "{{ bos_token }}Today: {{ strftime_now('%d %b %Y') }}\n{% for m in messages %}"
        "{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    frame = frame_from_template(
        template, bos="<s>", eos="</s>", special_tokens=["<s>", "</s>"], today=date(2025, 3, 9)
    )
    expected = ChatFrame(
        prefix="<s>Today: 09 Mar 2025\nuser: ", infix="</s>assistant: ", end="</s>"
    )
    assert frame == expected


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (
            "{% if messages[0]['role'] != 'system' %}{{ raise_exception('System first!') }}"
            "{% endif %}",
            "raises an error: System first!",
        ),
        ("{% for m in messages %}{{ m.content }}\n{% endfor %}", "no special token closes"),
        ("{{ messages[0].content }}{{ messages[0].content }}", "2 times instead of once"),
        ("{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}{% if", "not valid Jinja"),
    ],
)
def test_unframeable_templates_point_to_the_builtin_frames(template, reason):
    expected = rf"^x/chat_template.jinja: .*{reason}.*a built-in frame instead \(chatml"
    with pytest.raises(CheckpointError, match=expected):
        frame_from_template(
            template, bos=None, eos=None, special_tokens=QWEN_SPECIALS,
            source="x/chat_template.jinja",
        )  # fmt: skip


HOSTILE_TEMPLATES = {
    "mro escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    "globals escape": ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "unsafe"),
    "format escape": ("{{ '{0.__class__.__base__}'.format('') }}", "unsafe"),
    "attr filter escape": ("{{ ''|attr('__class__') }}", "0 times instead of once"),
    "loader escape": ("{{ self._TemplateReference__context.cycler.__init__ }}", "unsafe"),
    "joiner escape": ("{{ joiner.__init__.__globals__.__builtins__ }}", "unsafe"),
    "namespace escape": ("{{ namespace.__init__.__globals__.os }}", "unsafe"),
    "syntax error": ("{% for m in messages %}", "not valid Jinja"),
    "no closing token": ("{% for m in messages %}{{ m.content }}{% endfor %}", "no special token"),
    "endless loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "takes longer than 5 s",
    ),
    "ten gigabytes": ("{{ 'x' * 10**10 }}", "needs more than 1024 MiB"),
    "ten megabytes": ("{{ 'x' * 10**7 }}", "renders more than 100,000 characters"),
    "endless recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recurses"),
}


@pytest.mark.parametrize("name", HOSTILE_TEMPLATES)
def test_a_hostile_template_is_one_error_naming_its_file_in_bounded_time(name, tmp_path):
    """Nothing escapes the sandbox, nothing hangs or exhausts memory: every case is one
    CheckpointError naming the file, within the sandbox's time limit."""
    template, reason = HOSTILE_TEMPLATES[name]
    start = time.monotonic()
    with pytest.raises(CheckpointError) as refused:
        frame_from_template(
            template, bos=None, eos="<|im_end|>", special_tokens=QWEN_SPECIALS,
            source="m/chat_template.jinja",
        )  # fmt: skip
    assert time.monotonic() - start < 10
    message = str(refused.value)
    assert message.startswith("m/chat_template.jinja: the chat template cannot frame")
    assert reason in message and "\n" not in message
    assert not (tmp_path / "pwned").exists()


def test_a_chat_template_that_is_no_template_is_named(folders, tmp_path):
    folder = shutil.copytree(folders["qwen"][0], tmp_path / "m")
    config = folder / "tokenizer_config.json"
    settings = json.loads(config.read_text()) if config.exists() else {}
    config.write_text(json.dumps({**settings, "chat_template": ["{{ messages }}"]}))
    with pytest.raises(CheckpointError, match=r"tokenizer_config.json: chat_template is a list, "):
        read_vocabulary(folder)
    (folder / "chat_template.jinja").write_text("x" * (2 << 20))
    with pytest.raises(CheckpointError, match=r"chat_template.jinja: 2,097,152 bytes, more than"):
        read_vocabulary(folder)
