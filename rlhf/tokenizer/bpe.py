"""Byte-level BPE training that produces tiktoken merge ranks.

tiktoken encodes but does not train. Its rank table is exactly a BPE merge order (rank = the
merge's position, single bytes first), so training means: count adjacent pairs inside the
pre-tokenized words, merge the most frequent, repeat. A heap with lazy invalidation keeps each
merge proportional to the words that contain the pair rather than to the whole corpus.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable
from itertools import pairwise

import regex

Pair = tuple[int, int]


def _merge_word(word: list[int], pair: Pair, new_id: int) -> list[int]:
    merged: list[int] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            merged.append(new_id)
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged


def train_bpe(texts: Iterable[str], vocab_size: int, pat_str: str) -> dict[bytes, int]:
    """Return mergeable ranks (token bytes -> rank) with at most `vocab_size` entries.

    Deterministic: ties between equally frequent pairs go to the lexicographically smallest
    merged bytes. Stops early when no pair occurs at least twice.
    """
    pattern = regex.compile(pat_str)
    word_counts = Counter(piece for text in texts for piece in pattern.findall(text))
    words = [list(piece.encode("utf-8")) for piece in word_counts]
    freqs = list(word_counts.values())

    token_bytes = [bytes([i]) for i in range(256)]
    ranks = {b: i for i, b in enumerate(token_bytes)}

    pair_counts: Counter[Pair] = Counter()
    pair_words: defaultdict[Pair, set[int]] = defaultdict(set)
    for index, (word, freq) in enumerate(zip(words, freqs, strict=True)):
        for pair in pairwise(word):
            pair_counts[pair] += freq
            pair_words[pair].add(index)

    def heap_entry(pair: Pair) -> tuple[int, bytes, Pair]:
        return (-pair_counts[pair], token_bytes[pair[0]] + token_bytes[pair[1]], pair)

    heap = [heap_entry(pair) for pair in pair_counts]
    heapq.heapify(heap)

    while len(ranks) < vocab_size and heap:
        neg_count, merged, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg_count:
            continue  # stale entry: the count changed after it was pushed
        if -neg_count < 2:
            break
        if merged in ranks:  # (a, bc) after (ab, c): same bytes, reuse the token
            new_id = ranks[merged]
        else:
            new_id = len(token_bytes)
            token_bytes.append(merged)
            ranks[merged] = new_id

        touched: set[Pair] = set()
        for index in pair_words.pop(pair):
            word, freq = words[index], freqs[index]
            for old in pairwise(word):
                pair_counts[old] -= freq
                touched.add(old)
            word = _merge_word(word, pair, new_id)
            words[index] = word
            for new in pairwise(word):
                pair_counts[new] += freq
                pair_words[new].add(index)
                touched.add(new)
        for changed in touched:
            if pair_counts[changed] > 0:
                heapq.heappush(heap, heap_entry(changed))
            else:
                del pair_counts[changed]
    return ranks
