"""The card of SLURM jobs on the real two-node test cluster (tests/slurmcluster.py): a pending job
shows squeue's reason and a Stop button, a running two-node job its nodes, and the launch's
"no --cpus-per-node" warning is shown once, small. Asserted on the widgets' traits."""

from __future__ import annotations

import re

import pytest

import tune_magic
from tune_magic.ui.cards import JobCard

from jobhelpers import toy_args
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 240


def shown(widget) -> str:
    return re.sub(r"<[^>]+>", "", widget.value.replace("<br>", "\n")).replace("&#x27;", "'").replace("&amp;", "&")


def test_pending_reason_nodes_and_the_cpus_warning_on_cards(cluster):
    blocker = tune_magic.launch(toy_args("steps=100000", "step_s=0.2", nproc=1), scheduler="slurm", nodes=2,
                                cpus_per_node=4)
    cluster.started.append(blocker)
    # no --cpus-per-node: the record keeps the plan's warning for the card
    waiting = tune_magic.launch(toy_args("steps=2", nproc=1), scheduler="slurm", nodes=2)
    cluster.started.append(waiting)
    warning = next(w for w in waiting.record.warnings if w.startswith("no --cpus-per-node"))

    running_card = JobCard(blocker, watch=False)
    wait_for(lambda: running_card.watcher.poll_once().status == "running" and running_card.snapshot.nodes,
             timeout=TIMEOUT, interval=0.5, what="the blocker running on its nodes")
    nodes = blocker.nodes
    assert len(nodes) == 2 and running_card.snapshot.nodes == tuple(nodes)
    assert shown(running_card.notes).splitlines()[0] == "nodes " + ", ".join(nodes)
    assert running_card.stop_button.layout.display is None

    card = JobCard(waiting, watch=False)
    wait_for(lambda: card.watcher.poll_once().status == "pending" and card.snapshot.pending_reason,
             timeout=TIMEOUT, interval=0.5, what="a pending reason")
    reason = card.snapshot.pending_reason
    assert reason in ("Resources", "Priority"), reason
    assert shown(card.progress).startswith(f"waiting in the queue: {reason} · ")
    assert card.stop_button.layout.display is None and not card.stop_button.disabled
    notes = shown(card.notes)
    assert notes.count(warning) == 1 and "font-size:11px" in card.notes.value
    assert card.text().count(warning) == 1 and f"waiting in the queue: {reason}" in card.text()
    assert card.snapshot.nodes == ()  # pending: no nodes yet

    assert waiting.stop(grace_s=1) == "stopped"
    assert blocker.stop(grace_s=1) == "stopped"
    card.watcher.poll_once()
    running_card.watcher.poll_once()
    for c in (card, running_card):
        assert c.stop_button.layout.display == "none" and not c.snapshot.nodes
    assert "waiting in the queue" not in card.progress.value
