"""The labeling queue's pieces: typed rankings, agreement between labelers, queue items, the
comparisons people's labels become, and a labeler's labels file kept whole: one session per
name, each save merged with the file on disk."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from rlhf.data.schemas import DataError
from rlhf.errors import PipelineError
from rlhf.labeling.queue import (
    all_labels,
    comparisons_from_labels,
    hold_labels,
    item_id,
    labeling_stats,
    labels_file,
    new_label,
    queue_items,
    read_labels,
    waiting_items,
    write_labels,
)
from rlhf.labeling.ranking import RankingError, agreement, format_ranking, parse_ranking
from rlhf.labeling.terminal import Session, label_queue


@pytest.mark.parametrize(
    ("typed", "n", "ranks"),
    [
        ("B A=C D", 4, [1, 0, 1, 2]),
        ("ba=cd", 4, [1, 0, 1, 2]),
        ("A B", 2, [0, 1]),
        ("C = B = A", 3, [0, 0, 0]),
        ("D C B A", 4, [3, 2, 1, 0]),
    ],
)
def test_a_typed_ranking_gives_dense_ranks_best_first(typed, n, ranks):
    assert parse_ranking(typed, n) == ranks
    assert parse_ranking(format_ranking(ranks), n) == ranks


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("", "type every answer"),
        ("A B", "C missing"),
        ("A B C E", "'E' is not one of the answers A, B, C"),
        ("A B A C", "A is ranked twice"),
        ("=A B C", "'=' must join two answers"),
        ("A B==C", "'=' must join two answers"),
    ],
)
def test_a_typed_text_that_is_not_a_full_ranking_says_why(typed, message):
    with pytest.raises(RankingError, match=message):
        parse_ranking(typed, 3)


@pytest.mark.parametrize("typed", ["\x1b[A", "\x1b[D", "B \x1bOP A C", "\x01"])
def test_arrow_function_and_ctrl_keys_get_a_readable_answer(typed):
    with pytest.raises(RankingError, match=r"^arrow, function and Ctrl keys do nothing here: type"):
        parse_ranking(typed, 3)


def test_agreement_counts_pairs_both_labelers_ordered():
    # A > B > C against A > C > B: pairs AB, AC agree, BC is flipped
    result = agreement([0, 1, 2], [0, 2, 1])
    assert (result.decisive, result.agreed, result.rate) == (3, 2, 0.6667)
    tied = agreement([0, 0, 1], [0, 1, 2])  # AB tied by one labeler: not decisive
    assert (tied.decisive, tied.agreed, tied.pairs, tied.matched) == (2, 2, 3, 2)
    assert agreement([0, 0], [0, 0]).rate is None and agreement([0, 0], [0, 0]).rate_with_ties == 1


def rows(*prompts: str) -> list[dict]:
    return [
        {"prompt": p, "responses": [f"{p} one", f"{p} two", f"{p} one"], "task": "t", "source": "s"}
        for p in prompts
    ]


def test_queue_items_have_distinct_shuffled_answers_and_content_ids():
    queue = queue_items(rows("p1", "p2", "p3"), rows("p4"), "round", seed=0)
    assert [item["split"] for item in queue] == ["train", "train", "train", "val"]
    for item in queue:
        assert sorted(item["responses"]) == [f"{item['prompt']} one", f"{item['prompt']} two"]
    assert all(item["item"] == item_id(item["prompt"], item["responses"]) for item in queue)
    assert queue == queue_items(rows("p1", "p2", "p3"), rows("p4"), "round", seed=0)
    single = [{"prompt": "p", "responses": ["same", "same"], "task": "t", "source": "s"}]
    assert queue_items(single, [], "round", seed=0) == []  # nothing to rank


def test_labels_become_one_comparison_each_and_agreement_is_reported(tmp_path):
    queue = queue_items(rows("p1", "p2"), rows("p3"), "round", seed=0)
    a, b, c = (item["item"] for item in queue)
    write_labels(labels_file(tmp_path, "alice"), [
        new_label(a, "alice", [0, 1]), new_label(b, "alice", [1, 0]), new_label(c, "alice", [0, 0]),
    ])  # fmt: skip
    write_labels(labels_file(tmp_path, "bob"), [
        new_label(a, "bob", [0, 1]), new_label(b, "bob", [0, 1]), new_label(c, "bob", []),
    ])  # fmt: skip
    labels = all_labels(tmp_path, queue)
    assert len(labels) == 5  # bob's skip is no label
    assert [item["item"] for item in waiting_items(queue, labels, 2)] == [c]
    train, heldout = comparisons_from_labels(queue, labels)
    assert [r["source"] for r in train] == ["human:alice", "human:alice", "human:bob", "human:bob"]
    assert heldout == []  # alice tied the held-out item's answers: no preference
    stats = labeling_stats(queue, labels)
    assert stats["inter_labeler_agreement"] == 0.5  # same on item a, opposite on item b
    assert stats["inter_labeler_pairs"] == 2 and stats["items_labeled_twice"] == 2
    assert stats["labeler_tie_share"] == 0.2 and stats["labelers"] == 2


def test_a_label_that_does_not_fit_its_item_names_file_row_and_field(tmp_path):
    queue = queue_items(rows("p1"), [], "round", seed=0)
    path = labels_file(tmp_path, "carol")
    write_labels(path, [new_label(queue[0]["item"], "carol", [0, 2])])
    with pytest.raises(DataError, match=r"carol.parquet: row 1, field 'ranking': \[0, 2\] is not"):
        all_labels(tmp_path, queue)
    with pytest.raises(DataError, match=r"labeler name '\.\./x'"):
        labels_file(tmp_path, "../x")


def session(monkeypatch, folder, queue, typed: list[str], labeler: str = "alice") -> str:
    """A labeling session in-process: `typed` are the lines the labeler enters."""
    lines = iter(typed)
    monkeypatch.setattr("builtins.input", lambda *_: next(lines))
    screen = Console(file=io.StringIO(), force_terminal=False, width=100)
    label_queue(queue, folder, labeler, screen)
    return screen.file.getvalue()


def shown(screen: str) -> list[int]:
    return [int(n) for n in re.findall(r"item (\d+) of", screen)]


def test_skipping_a_skipped_item_again_sends_it_to_the_back(tmp_path, monkeypatch):
    queue = queue_items(rows("p1", "p2", "p3"), [], "round", seed=0)
    screen = session(monkeypatch, tmp_path, queue, ["s", "s", "A B", "s", "q"])
    assert shown(screen) == [1, 2, 3, 1, 2]


def test_undo_takes_back_only_labels_of_this_queue(tmp_path, monkeypatch):
    old = new_label("an-earlier-round", "alice", [0, 1])
    write_labels(labels_file(tmp_path, "alice"), [old])
    queue = queue_items(rows("p1", "p2"), [], "round", seed=0)
    screen = session(monkeypatch, tmp_path, queue, ["u", "A B", "u", "B A", "q"])
    assert "nothing to undo" in screen and shown(screen) == [1, 1, 2, 1, 2]
    kept = read_labels(labels_file(tmp_path, "alice"))
    assert [label["item"] for label in kept] == ["an-earlier-round", queue[0]["item"]]
    assert kept[1]["ranking"] == [1, 0]


def test_agreement_shown_counts_each_item_once_after_an_undo(tmp_path, monkeypatch):
    queue = queue_items(rows("p1", "p2"), [], "round", seed=0)
    write_labels(labels_file(tmp_path, "bob"), [new_label(queue[0]["item"], "bob", [0, 1])])
    screen = session(monkeypatch, tmp_path, queue, ["A B", "u", "A B", "q"])
    assert "agrees with bob on 1 of 1 ordered pairs" in screen
    assert screen.count("agreement with others 100% of 1 pairs") == 2  # item 2, twice
    assert "of 2 pairs" not in screen  # the undone ranking no longer counts


def test_r_or_ctrl_l_draws_the_item_again_and_the_progress_sits_beside_the_prompt(
    tmp_path, monkeypatch
):
    queue = queue_items(rows("p1", "p2"), [], "round", seed=0)
    screen = session(monkeypatch, tmp_path, queue, ["A B", "r", "\x0c", "q"])
    assert shown(screen) == [1, 2, 2, 2]
    assert screen.count("0 of 2 ranked · 0 skipped · rank> ") == 1
    assert screen.count("1 of 2 ranked · 0 skipped · rank> ") == 3


def test_quitting_says_what_was_saved_and_nothing_when_nothing_was(tmp_path, monkeypatch):
    queue = queue_items(rows("p1", "p2"), [], "round", seed=0)
    path = labels_file(tmp_path, "alice")
    screen = session(monkeypatch, tmp_path, queue, ["q"])
    assert "0 of 2 items ranked by alice; nothing saved" in screen and "saved in" not in screen
    assert not path.exists()
    screen = session(monkeypatch, tmp_path, queue, ["s", "q"])
    assert f"0 of 2 items ranked by alice, 1 skipped, saved in {path}" in screen


def test_a_second_session_under_the_same_name_is_refused_naming_the_file(tmp_path, monkeypatch):
    queue = queue_items(rows("p1", "p2"), [], "round", seed=0)
    path = labels_file(tmp_path, "alice")
    with hold_labels(path):  # a session in another terminal
        with pytest.raises(
            PipelineError, match=f"^{re.escape(str(path))}: another `rlhf label` session holds it"
        ):
            session(monkeypatch, tmp_path, queue, ["A B", "q"])
        assert not path.exists()
        session(monkeypatch, tmp_path, queue, ["A B", "q"], labeler="bob")  # a file of its own
    session(monkeypatch, tmp_path, queue, ["A B", "q"])  # the other session ended
    assert [label["labeler"] for label in read_labels(path)] == ["alice"]


def test_each_save_keeps_the_labels_another_writer_saved_meanwhile(tmp_path):
    queue = queue_items(rows("p1", "p2", "p3"), [], "round", seed=0)
    a, b, c = (item["item"] for item in queue)
    path = labels_file(tmp_path, "alice")
    stale = Session(queue, path, "alice", Console(file=io.StringIO()))
    stale.save(a, [0, 1])
    # a writer the lock did not stop (a network file system, a `git pull`) adds a label
    write_labels(path, [*read_labels(path), new_label(b, "alice", [1, 0])])
    stale.save(c, [])
    assert [(label["item"], label["ranking"]) for label in read_labels(path)] == [
        (a, [0, 1]),
        (b, [1, 0]),
        (c, []),
    ]
    assert stale.counts() == (2, 1)
    stale.undo()  # takes back the last label in the file: the skip of c
    assert [label["item"] for label in read_labels(path)] == [a, b]
    assert stale.next_item() == queue[2] and stale.counts() == (2, 0)
