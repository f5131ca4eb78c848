"""`rlhf label` through a pseudo-terminal: rankings with ties, bad input, skip, undo and quit,
a kill that loses nothing, a second session under the same name refused, a small terminal
with arrow keys and a redraw, and a second labeler told how far they agree with the first."""

from __future__ import annotations

import signal
from pathlib import Path

import pexpect
import pytest

from rlhf.labeling.queue import labels_file, queue_items, read_labels, write_queue
from rlhf.project import paths

from label_terminal import PROMPT, answer, start_labeling


@pytest.fixture
def project(tmp_path) -> Path:
    """A project whose collect stage wrote a queue of four items with three answers each."""
    rows = [
        {"prompt": f"Human: Write a line about {topic}.", "task": "files", "source": "sft",
         "responses": [f"{topic} falls softly", f"I like {topic}", "I cannot help with that."]}
        for topic in ("rain", "snow", "wind", "fog")
    ]  # fmt: skip
    queue = queue_items(rows[:3], rows[3:], "round-1", seed=0)
    write_queue(tmp_path / paths.LABEL_QUEUE, queue)
    return tmp_path


def labels(project: Path, labeler: str) -> list[dict]:
    return read_labels(labels_file(project / paths.LABELS, labeler))


def test_rankings_with_ties_skip_undo_and_quit(project):
    session = start_labeling(project, "alice")
    session.expect_exact("item 1 of 4 (train)")
    session.expect_exact("alice: 0 ranked · 0 skipped · 4 to go")
    session.expect_exact(PROMPT)
    answer(session, "B A D", "'D' is not one of the answers A, B, C")
    answer(session, "b a=c", "item 2 of 4")
    session.sendline("s")
    session.expect_exact("item 3 of 4")
    session.expect_exact("skipped; it comes back once the others are done")
    session.sendline("u")
    session.expect_exact("item 2 of 4")
    session.expect_exact("undone: your label of this item was skipped")
    session.expect_exact(PROMPT)
    answer(session, "C B A", "saved C B A")
    session.sendline("q")
    session.expect_exact("2 of 4 items ranked by alice, saved in labeling/labels/alice.parquet")
    session.expect(pexpect.EOF)
    session.close()
    assert session.exitstatus == 0
    assert [label["ranking"] for label in labels(project, "alice")] == [[1, 0, 1], [2, 1, 0]]


def test_a_killed_session_resumes_at_the_next_unlabeled_item_with_nothing_lost(project):
    session = start_labeling(project, "alice")
    session.expect_exact(PROMPT)
    answer(session, "A B C", "item 2 of 4")
    answer(session, "s", "item 3 of 4")  # skipped: it comes back last
    answer(session, "C A B", "item 4 of 4")
    session.kill(signal.SIGKILL)  # mid-session, at the fourth item's prompt
    session.close()
    assert [label["ranking"] for label in labels(project, "alice")] == [[0, 1, 2], [], [1, 2, 0]]

    session = start_labeling(project, "alice")
    session.expect_exact("item 4 of 4 (val)")
    session.expect_exact("alice: 2 ranked · 1 skipped · 2 to go")
    session.expect_exact(PROMPT)
    answer(session, "A=B C", "item 2 of 4")  # then the skipped item
    session.sendline("B C A")
    session.expect_exact("all 4 items are labeled by alice")
    session.expect(pexpect.EOF)
    assert len(labels(project, "alice")) == 4


def test_a_second_session_under_the_same_name_is_refused_and_the_first_loses_nothing(project):
    first = start_labeling(project, "alice")
    first.expect_exact(PROMPT)
    answer(first, "A B C", "item 2 of 4")
    second = start_labeling(project, "alice")  # another terminal, the same person
    refused = second.expect([pexpect.EOF, PROMPT])
    second.close()
    assert refused == 0 and second.exitstatus == 2
    assert second.before.count("error:") == 1 and "Traceback" not in second.before
    assert "labeling/labels/alice.parquet: another `rlhf label` session holds it" in second.before
    answer(first, "C B A", "item 3 of 4")
    first.sendline("q")
    first.expect(pexpect.EOF)
    assert [label["ranking"] for label in labels(project, "alice")] == [[0, 1, 2], [2, 1, 0]]


def test_a_small_terminal_keeps_the_progress_beside_the_prompt_and_explains_arrow_keys(project):
    session = start_labeling(project, "alice", dimensions=(15, 60))
    session.expect_exact("0 of 4 ranked · 0 skipped · rank> ")
    answer(session, "\x1b[A", "arrow, function and Ctrl keys do nothing here")  # the up arrow
    session.sendline("A B C")
    session.expect_exact("item 2 of 4")
    session.expect_exact("1 of 4 ranked · 0 skipped · rank> ")
    session.sendline("r")  # after a resize: the item again, drawn at the new size
    session.expect_exact("item 2 of 4")
    session.expect_exact("1 of 4 ranked · 0 skipped · rank> ")
    session.sendline("u")
    session.expect_exact("item 1 of 4")
    session.expect_exact("0 of 4 ranked · 0 skipped · rank> ")
    session.sendline("q")
    session.expect_exact("0 of 4 items ranked by alice; nothing saved")
    session.expect(pexpect.EOF)
    assert "saved in" not in session.before


def test_a_second_labeler_sees_how_far_they_agree_with_the_first(project):
    first = start_labeling(project, "alice")
    first.expect_exact(PROMPT)
    answer(first, "A B C", "item 2 of 4")
    first.sendline("q")
    first.expect(pexpect.EOF)

    second = start_labeling(project, "bob")
    second.expect_exact(PROMPT)
    answer(second, "A C B", "agrees with alice on 2 of 3 ordered pairs")
    second.sendline("q")
    second.expect(pexpect.EOF)
    assert [label["labeler"] for label in labels(project, "bob")] == ["bob"]


def test_without_a_queue_rlhf_label_says_how_to_make_one(tmp_path):
    session = start_labeling(tmp_path, "alice")
    session.expect(pexpect.EOF)
    session.close()
    assert session.exitstatus == 2
    assert "set collect.labeler: human in params.yaml" in session.before
