"""`rlhf label`: a person ranks the queue's items in the terminal.

Each item shows the prompt and its answers under letters; the labeler types a ranking (`B A=C
D`, see `ranking.py`) or a command. Every ranking or skip is saved at once, atomically, to
the labeler's own file, so a session killed at any moment loses nothing and the next one
starts at the first item this labeler has neither ranked nor skipped; skipped items come
back once the rest are done. Several people label the same queue, each under their own name;
after each ranking the screen says how far it agrees with the others' rankings of the item.

No label is lost to a second session under the same name: one session at a time holds a
labeler's file (`hold_labels`), and each save is made to the file as it is on disk, not to
the session's copy, so even a writer the lock cannot stop (a lock lost on a network file
system, a `git pull` mid-session) keeps its labels. The progress is part of the prompt, the
one line a small terminal always shows, and `r` draws the item again after a resize.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from rlhf.atomic import remove_stale
from rlhf.labeling.queue import (
    Rows,
    all_labels,
    hold_labels,
    labels_file,
    new_label,
    read_labels,
    write_labels,
)
from rlhf.labeling.ranking import (
    Agreement,
    RankingError,
    agreement,
    format_ranking,
    letters,
    parse_ranking,
)

SKIP, UNDO, QUIT, HELP = "s", "u", "q", "?"
REDRAW = ("r", "\x0c")  # r, or Ctrl-L as shells have it (here it takes an Enter too)
PROMPT = "rank> "
HELP_TEXT = (
    "Type the answers best first, '=' between answers you find equally good: "
    "'B A=C D'. s: skip for now · u: undo your last label · r or Ctrl-L: draw the item again "
    "· q: quit (everything is saved) · ?: this help"
)


@dataclass
class Session:
    """One labeler working through the queue; `mine` is their labels file, in order, as read
    at the start and again at each save."""

    queue: Rows
    path: Path
    labeler: str
    console: Console
    mine: Rows = field(default_factory=list)
    others: Rows = field(default_factory=list)
    redo: str | None = None  # the item an undo brought back
    notices: list[str] = field(default_factory=list)  # what the last command did, shown next

    def queued(self) -> dict[str, dict[str, Any]]:
        return {item["item"]: item for item in self.queue}

    def labels_here(self) -> Rows:
        """This labeler's labels of this queue's items, oldest first (the file may also hold
        labels of an earlier round's items, which stay as they are)."""
        queued = self.queued()
        return [label for label in self.mine if label["item"] in queued]

    def next_item(self) -> dict[str, Any] | None:
        """The item an undo brought back, else the first item neither ranked nor skipped,
        else the item skipped longest ago (skipping it again sends it to the back)."""
        queued = self.queued()
        if self.redo is not None:
            return queued[self.redo]
        handled = {label["item"] for label in self.mine}
        fresh = [item for item in self.queue if item["item"] not in handled]
        skipped = [queued[label["item"]] for label in self.labels_here() if not label["ranking"]]
        return (fresh or skipped or [None])[0]

    def reload(self) -> None:
        """Read the labels file again before changing it, so a save keeps what another writer
        saved since this session last read it, and the counts shown are the file's."""
        self.mine = read_labels(self.path)

    def save(self, item: str, ranking: list[int]) -> None:
        self.reload()
        self.mine = [label for label in self.mine if label["item"] != item]
        self.mine.append(new_label(item, self.labeler, ranking))
        write_labels(self.path, self.mine)
        self.redo = None

    def undo(self) -> None:
        """Take back this labeler's last label of this queue."""
        self.reload()
        here = self.labels_here()
        if not here:
            self.notices.append("nothing to undo")
            return
        last = here[-1]
        self.mine = [label for label in self.mine if label is not last]
        write_labels(self.path, self.mine)
        self.redo = last["item"]
        was = format_ranking(last["ranking"]) if last["ranking"] else "skipped"
        self.notices.append(f"undone: your label of this item was {was}")

    def counts(self) -> tuple[int, int]:
        """(ranked, skipped) of this queue's items by this labeler."""
        here = self.labels_here()
        ranked = sum(bool(label["ranking"]) for label in here)
        return ranked, len(here) - ranked

    def prompt(self) -> str:
        """The prompt with the progress before it: on a terminal too small for the item, the
        status line above scrolls away, the line being typed on never does."""
        ranked, skipped = self.counts()
        return f"{ranked} of {len(self.queue)} ranked · {skipped} skipped · {PROMPT}"

    def agreement_so_far(self) -> Agreement:
        """This labeler's rankings against the others', over every item both ranked."""
        mine = {label["item"]: label["ranking"] for label in self.labels_here() if label["ranking"]}
        return sum(
            (agreement(mine[o["item"]], o["ranking"]) for o in self.others if o["item"] in mine),
            Agreement(),
        )

    def show(self, item: dict[str, Any]) -> None:
        ranked, skipped = self.counts()
        position = next(i for i, it in enumerate(self.queue) if it["item"] == item["item"]) + 1
        status = f"{self.labeler}: {ranked} ranked · {skipped} skipped · "
        status += f"{len(self.queue) - ranked} to go"
        agreed = self.agreement_so_far()
        if agreed.decisive:
            status += f" · agreement with others {agreed.rate:.0%} of {agreed.decisive} pairs"
        answers = [
            Panel(Text(answer if answer.strip() else "(empty answer)"), title=letter,
                  title_align="left")
            for letter, answer in zip(letters(len(item["responses"])), item["responses"],
                                      strict=True)
        ]  # fmt: skip
        self.console.clear()
        self.console.rule(f"item {position} of {len(self.queue)} ({item['split']})")
        self.console.print(status)
        for notice in self.notices:
            self.console.print(notice, style="green")
        self.notices.clear()
        self.console.print(
            Group(Panel(Text(item["prompt"]), title="prompt", title_align="left"), *answers)
        )
        self.console.print(HELP_TEXT)

    def report_agreement(self, item: str, ranking: list[int]) -> None:
        for label in self.others:
            if label["item"] != item:
                continue
            result = agreement(ranking, label["ranking"])
            self.notices.append(
                f"agrees with {label['labeler']} on {result.agreed} of {result.decisive} "
                "ordered pairs"
            )

    def run(self) -> int:
        """Label until the queue is done or the labeler quits; returns the items ranked."""
        while (item := self.next_item()) is not None:
            self.show(item)
            if not self.answer(item):
                return self.finish()
        self.notices.append(f"all {len(self.queue)} items are labeled by {self.labeler}")
        return self.finish()

    def answer(self, item: dict[str, Any]) -> bool:
        """Read lines until one ranks, skips or undoes; False when the labeler quits."""
        while True:
            try:  # spaces only: a Ctrl-L is whitespace to str.strip
                typed = self.console.input(self.prompt()).strip(" \t")
            except EOFError:
                typed = QUIT
            command = typed.lower()
            if command == QUIT:
                return False
            if command == HELP:
                self.console.print(HELP_TEXT)
            elif command in REDRAW:
                self.show(item)
            elif command == SKIP:
                self.save(item["item"], [])
                self.notices.append("skipped; it comes back once the others are done")
                return True
            elif command == UNDO:
                self.undo()
                return True
            elif self.rank(item, typed):
                return True

    def rank(self, item: dict[str, Any], typed: str) -> bool:
        """Save `typed` as the ranking of `item`, or say why it is none; whether it was."""
        try:
            ranking = parse_ranking(typed, len(item["responses"]))
        except RankingError as exc:
            self.console.print(str(exc), style="red", markup=False)
            return False
        self.save(item["item"], ranking)
        self.notices.append(f"saved {format_ranking(ranking)}")
        self.report_agreement(item["item"], ranking)
        return True

    def finish(self) -> int:
        """Print the last notices and what is saved where: nothing, when nothing is."""
        for notice in self.notices:
            self.console.print(notice, style="green")
        ranked, skipped = self.counts()
        done = f"{ranked} of {len(self.queue)} items ranked by {self.labeler}"
        if not ranked + skipped:
            self.console.print(f"{done}; nothing saved")
            return ranked
        skips = f", {skipped} skipped" if skipped else ""
        self.console.print(f"{done}{skips}, saved in {self.path}", soft_wrap=True)
        return ranked


def label_queue(queue: Rows, folder: Path, labeler: str, console: Console) -> int:
    """Run a labeling session on `queue`, `labeler`'s labels kept in `folder`."""
    path = labels_file(folder, labeler)
    with hold_labels(path):
        remove_stale([path])  # a save the last session was killed in (none is live: we hold it)
        others = [label for label in all_labels(folder, queue) if label["labeler"] != labeler]
        session = Session(queue, path, labeler, console, read_labels(path), others)
        return session.run()
