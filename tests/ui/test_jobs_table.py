"""The jobs table (``%tune_jobs`` and the panel's): rows from records and summaries, refreshed in
place by one thread, new jobs shown, removed ones hidden. Built in the test process (no kernel).

Job records are written here by hand into a registry of the test's own; a "running" one names this
test process as its supervisor (FAKE: no job process runs), so the table follows it through its
summary file exactly as it follows a supervised job. Real jobs: tests/e2e/test_panel.py.
"""

from __future__ import annotations

import html
import re
import shutil
import threading
import time

import ipywidgets.widgets.widget as widget_mod
import psutil
import pytest

from tune_magic.registry import store as jobstore

from tune_magic.ui import views
from tune_magic.logs import summary as S
from tune_magic.registry.store import JobRecord, ProcessRef
from tune_magic.ui.views import JobsTable

from waiting import wait_for


@pytest.fixture
def root(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home))
    r = home / "jobs"
    r.mkdir(parents=True)
    return r


def make(root, job_id, *, status="succeeded", name="n", error=None, pending_reason=None, supervised=False,
         step=None, loss=None, started=None, **fields):
    """A job record (and a summary when ``step`` is given) written by hand; ``fields``: more record fields."""
    me = psutil.Process()
    rec = JobRecord(id=job_id, name=name, argv=["python", "x.py"], env={}, cwd=str(root), started_at=started or time.time() - 65,
                    log_path=str(root / job_id / "output.log"), status=status, error=error,
                    pending_reason=pending_reason,
                    ended_at=time.time() if status in ("succeeded", "failed", "stopped") else None,
                    returncode={"succeeded": 0, "failed": 1, "stopped": -15}.get(status),
                    # FAKE supervisor: this process (alive), so the record is never settled by a reader
                    supervisor=ProcessRef(me.pid, me.create_time()) if supervised else None,
                    agent=ProcessRef(me.pid, 0.0) if supervised else None,  # never matches: never signalled
                    **fields)
    d = root / job_id
    d.mkdir()
    jobstore.write_record(d, rec)
    (d / "output.log").write_text("")
    if step is not None:
        set_summary(root, job_id, step, loss)
    return rec


def set_summary(root, job_id, step, loss):
    S.write_summary(root / job_id, S.Summary(step=step, loss=loss, metric_step=step, metric_loss=loss,
                                              updated_at=time.time()))


def texts(table, job_id):
    return {k: w.value for k, w in table.rows[job_id].items() if k != "stop"}


def has_stop(table, job_id) -> bool:
    """The row shows a Stop button (it is in the row's cell, enabled)."""
    row = next(r for r in table._slots if r.job is not None and r.job.id == job_id)
    return row.stop_cell.children == (row.button,) and not row.button.disabled


def test_rows_show_status_step_loss_reasons_and_stop_only_on_live_jobs(root):
    make(root, "j1-ok", step=5, loss=2.0)
    make(root, "j2-failed", status="failed", step=1, loss=10.0,
         error="rank 1 (pid 42) failed: RuntimeError: toy recipe crashed on purpose <b>")
    make(root, "j3-pending", status="pending", pending_reason="Resources")
    make(root, "j4-running", status="running", supervised=True, step=3, loss=3.25)
    table = JobsTable(live=False)
    assert [j.id for j in table.jobs] == ["j4-running", "j3-pending", "j2-failed", "j1-ok"]  # newest first (ids break ties)
    assert table.summaries["j1-ok"][1:4] == ("succeeded", 5, 2.0)
    assert ">5<" in table.rows["j1-ok"]["step"].value and ">2<" in table.rows["j1-ok"]["loss"].value
    failed = table.rows["j2-failed"]
    assert "failed" in failed["status"].value
    assert "toy recipe crashed on purpose &lt;b&gt;" in failed["reason"].value  # escaped, not markup
    assert failed["reason"].layout.display is None
    assert "waiting for Resources" in table.rows["j3-pending"]["reason"].value
    assert table.rows["j1-ok"]["reason"].layout.display == "none"
    assert [has_stop(table, i) for i in ("j1-ok", "j2-failed", "j3-pending", "j4-running")] == [
        False, False, True, True]
    lines = table.text().splitlines()
    assert lines[0].split() == ["id", "name", "status", "step", "loss", "elapsed", "started", "reason"]
    row = {line.split()[0]: line.split() for line in lines[1:]}
    assert row["j2-failed"][1:6] == ["n", "failed", "1", "10", row["j2-failed"][5]]
    from tune_magic.ui.tablecols import started_text

    started = started_text(table.jobs[0].started_at)  # 14:03:27 (or 12-01 23:59 just after midnight)
    assert " ".join(row["j2-failed"][6:]).startswith(f"{started} rank 1 (pid 42) failed: RuntimeError")
    assert row["j3-pending"][-1] == "Resources"
    assert row["j4-running"][2:5] == ["running", "3", "3.25"]
    assert row["j4-running"][5] in ("1:05", "1:06", "1:07")


def test_a_running_row_updates_in_place_from_its_summary(root):
    make(root, "r1", status="running", supervised=True, step=1, loss=5.0)
    table = JobsTable(live=False)
    step_widget, grid = table.rows["r1"]["step"], table.grid.children
    widgets_before = len(widget_mod._instances)
    for step in (2, 3):
        set_summary(root, "r1", step, 10 / step)
        table.refresh_once()
        assert table.summaries["r1"][2:4] == (step, 10 / step)
        assert f">{step}<" in step_widget.value and f"{10 / step:.5g}" in table.rows["r1"]["loss"].value
    # the job fails: status, reason and no Stop button, in the same widgets
    jobstore.update(root / "r1", status="failed", returncode=1, ended_at=time.time(),
                    error="rank 0 (pid 7) failed: ValueError: bad\x1b[31m")
    table.refresh_once()
    assert "failed" in table.rows["r1"]["status"].value and not has_stop(table, "r1")
    assert "ValueError: bad\\x1b[31m" in table.rows["r1"]["reason"].value  # the control character escaped
    assert table.rows["r1"]["step"] is step_widget and table.grid.children == grid
    assert len(widget_mod._instances) == widgets_before  # refreshing created no widget
    done = next(r for r in table._slots if r.job is not None and r.job.id == "r1")
    assert done.done  # ended: never read again


def test_new_jobs_fill_spare_rows_without_creating_widgets_and_removed_jobs_hide(root):
    make(root, "a0")
    table = JobsTable(live=False)
    widgets_before = len(widget_mod._instances)
    make(root, "b1", status="running", supervised=True, step=2, loss=1.5, started=time.time() - 5)
    make(root, "b0", status="pending", pending_reason="Priority", started=time.time() - 10)
    (root / ".staging-zz").mkdir()  # a launch in progress is not a job yet
    (root / "no-record").mkdir()  # nor a directory without a record: skipped, the others still shown
    table.refresh_once()
    assert [j.id for j in table.jobs] == ["b1", "b0", "a0"]  # the new ones on top, newest first
    assert shown_ids(table) == ["b1", "b0", "a0"]  # and so in the grid
    assert table.summaries["b1"][1:4] == ("running", 2, 1.5) and has_stop(table, "b1")
    assert table.rows["b1"]["name"].layout.display is None
    assert len(widget_mod._instances) == widgets_before
    shutil.rmtree(root / "a0")  # tune-magic rm
    table.refresh_once()
    buttons = (table.rows["a0"]["stop"], table.rows["a0"]["resume"])  # inside the hidden button cell
    assert all(w.layout.display == "none" for w in table.rows["a0"].values() if w not in buttons)
    assert "a0" not in table.text() and [j.id for j in table.jobs] == ["b1", "b0"]
    # more new jobs than free rows (the spares and the removed job's): the oldest rows shown go behind
    # "show all", still without a widget made by the refresher; add() (the kernel's thread) shows a
    # job at once and refills the spares
    free = sum(1 for r in table._slots if r.job is None) + 1
    for i in range(free + 2):
        make(root, f"c{i:02d}", started=time.time() - 60 + i)
    table.refresh_once()
    assert len(widget_mod._instances) == widgets_before
    assert [j.id for j in table.jobs] == ["b1", "b0"] + [f"c{i:02d}" for i in range(free + 1, 1, -1)]
    assert [j.id for j in table._hidden] == ["c01", "c00"] and table.more.layout.display is None
    assert table.more.description == "show all (2 more)" and table.text().endswith("(2 more: show all)")
    from tune_magic.job import get_job

    table.add(get_job("c03"))  # already shown: no second row
    assert [j.id for j in table.jobs].count("c03") == 1
    table.add(get_job("c00"))
    assert "c00" in table.rows and [j.id for j in table._hidden] == ["c01"]
    assert sum(1 for r in table._slots if r.job is None) == views.SPARE_ROWS
    assert [j.id for j in table.jobs][-1] == "c00"  # in its place by age


def shown_ids(table) -> list[str]:
    """The job ids in the grid's id cells that are shown, top to bottom."""
    ids = [w for w in table.grid.children if "tm-cell-id" in w._dom_classes and w.layout.display is None]
    return [re.search(r"tm-job-id'>([^<]+)<", w.value).group(1) for w in ids]


def test_names_with_control_characters_are_escaped_in_cells_and_text(root):
    make(root, "x1", name="evil\nname\x1b[2J\u202e" + "y" * 60)
    table = JobsTable(live=False)
    cell = table.rows["x1"]["name"].value
    assert "\n" not in cell and "\x1b" not in cell and "\u202e" not in cell
    assert "evil\\nname\\x1b[2J\\u202e" in cell and "…" in cell
    line = table.text().splitlines()[1]
    assert "evil\\nname\\x1b[2J\\u202e" in line and "\x1b" not in line


def test_the_refresher_is_one_named_daemon_thread_at_most_once_a_second(root):
    make(root, "r1", status="running", supervised=True, step=1, loss=5.0)
    ticks = []
    real = JobsTable.refresh_once

    def counted(self):
        ticks.append(time.monotonic())
        real(self)

    table = JobsTable(live=False)
    table.refresh_once = counted.__get__(table)  # instrument this table only
    before = {t.name for t in threading.enumerate()}
    table.start()
    (thread,) = [t for t in threading.enumerate() if t.name not in before]
    assert thread.name.startswith("tune_magic-jobs-table-") and thread.daemon
    set_summary(root, "r1", 2, 2.5)
    wait_for(lambda: ">2<" in table.rows["r1"]["step"].value, timeout=10, interval=0.1,
             what="step 2 in r1's row")
    assert ">2<" in table.rows["r1"]["step"].value  # updated without a call from here
    time.sleep(2.2)
    table.close()
    assert not thread.is_alive()
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) >= 2 and min(gaps) >= views.TABLE_INTERVAL_S - 0.01, gaps
    n = len(ticks)
    time.sleep(1.5)
    assert len(ticks) == n  # stopped


def test_refresher_never_prints(root, capfd):
    """The real refresh (no instrumentation) over a row that changes: nothing on stdout/stderr."""
    make(root, "r1", status="running", supervised=True, step=1, loss=5.0)
    table = JobsTable()
    capfd.readouterr()
    for step in (2, 3):
        set_summary(root, "r1", step, 1.0)
        time.sleep(1.3)
    jobstore.update(root / "r1", status="failed", returncode=1, ended_at=time.time(), error="boom")
    time.sleep(1.3)
    table.close()
    assert "failed" in table.rows["r1"]["status"].value
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


# -- newest first, bounded, narrowed; the optional columns ------------------------------------------


def test_a_long_lived_table_shows_the_newest_jobs_and_the_rest_behind_show_all(root):
    t0 = time.time() - 3600
    for i in range(views.TABLE_ROWS + 5):
        make(root, f"old{i:02d}", started=t0 + i)
    table = JobsTable(live=False)
    assert [j.id for j in table.jobs] == [f"old{i:02d}" for i in range(24, 4, -1)]  # the newest 20, newest first
    assert len(table.rows) == views.TABLE_ROWS and table.more.layout.display is None
    assert table.more.description == "show all (5 more)"
    widgets_before = len(widget_mod._instances)
    for i in range(3):  # jobs launched later take the top rows; the table does not grow
        make(root, f"new{i}", started=time.time() - 10 + i)
    table.refresh_once()
    assert [j.id for j in table.jobs][:4] == ["new2", "new1", "new0", "old24"]
    assert len(table.jobs) == views.TABLE_ROWS and table.more.description == "show all (8 more)"
    assert len(widget_mod._instances) == widgets_before  # the refresher made no widget
    assert shown_ids(table) == [j.id for j in table.jobs]
    table.more.click()  # (on the kernel's thread, as a click is)
    assert len(table.jobs) == views.TABLE_ROWS + 8 and [j.id for j in table.jobs][-1] == "old00"
    assert table.more.layout.display == "none" and table.limit is None
    assert shown_ids(table) == [j.id for j in table.jobs]


def test_filters_narrow_the_table_and_a_job_that_fails_later_joins_a_failed_listing(root):
    from tune_magic.ui.listing import JobFilter

    t0 = time.time() - 600
    make(root, "a-ok", name="lr-1", started=t0)
    make(root, "b-failed", name="lr-2", status="failed", error="rank 0: boom", started=t0 + 1)
    make(root, "c-pending", name="lr-3", status="pending", pending_reason="Priority", started=t0 + 2)
    make(root, "d-running", name="other", status="running", supervised=True, step=1, loss=1.0, started=t0 + 3)

    def listed(**kw):
        return [j.id for j in JobsTable(live=False, filter=JobFilter(**kw)).jobs]

    assert listed(running=True) == ["d-running", "c-pending"]  # live: running or pending
    assert listed(failed=True) == ["b-failed"]
    assert listed(running=True, failed=True) == ["d-running", "c-pending", "b-failed"]
    assert listed(name="lr-*") == ["c-pending", "b-failed", "a-ok"]
    assert listed(name="LR-*") == []
    last = JobsTable(live=False, filter=JobFilter(last=2))
    assert [j.id for j in last.jobs] == ["d-running", "c-pending"] and last.more.description == "show all (2 more)"
    failed = JobsTable(live=False, filter=JobFilter(failed=True))
    jobstore.update(root / "d-running", status="failed", returncode=1, ended_at=time.time(), error="rank 1: late")
    failed.refresh_once()
    assert [j.id for j in failed.jobs] == ["d-running", "b-failed"]  # it failed after the table was shown
    none = JobsTable(live=False, filter=JobFilter(failed=True, name="nothing*"))
    assert none.jobs == [] and "no failed jobs named 'nothing*'" in html.unescape(none.note.value)
    make(root, "e-failed", name="nothing-at-all", status="failed", error="rank 0: x")
    none.refresh_once()
    assert [j.id for j in none.jobs] == ["e-failed"] and none.note.layout.display == "none"


def test_tune_jobs_magic_takes_the_filters(root, ip, capsys):
    from IPython.core.error import UsageError

    make(root, "a-ok", name="lr-1")
    make(root, "b-failed", name="lr-2", status="failed", error="rank 0: boom")
    capsys.readouterr()
    ip.run_line_magic("tune_jobs", "--failed --name 'lr-*'")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["b-failed"], lines
    for bad in ("--last 0", "--last x", "--wat"):
        with pytest.raises(UsageError):
            ip.run_line_magic("tune_jobs", bad)


def optional_heads(table) -> list:
    """The headers of the optional columns started, scheduler and engine id, in order."""
    return [table._heads[k] for k in ("started", "scheduler", "engine")]


def test_the_engine_id_column_with_nodes_and_the_scheduler_column_appear_when_needed(root):
    make(root, "a-local", started=time.time() - 50)
    table = JobsTable(live=False)
    assert [h.layout.display for h in optional_heads(table)] == [None, "none", "none"]  # started only
    assert table.grid.layout.grid_template_columns == "auto auto repeat(5, max-content) minmax(76px, max-content)"
    make(root, "b-slurm", scheduler="slurm", backend={"job_id": "4242"}, nodes=["n1", "n2"], num_nodes=2,
         started=time.time() - 10)
    table.refresh_once()
    heads = [re.sub(r"<br>", " / ", h.value) for h in optional_heads(table)]
    assert [re.sub(r"<[^>]+>", "", h) for h in heads] == ["started", "scheduler", "SLURM ID / nodes"]
    assert [h.layout.display for h in optional_heads(table)] == [None] * 3
    # the scheduler, engine id and nodes wrap in a narrow notebook (auto), the others keep their width
    assert table.grid.layout.grid_template_columns == "auto auto repeat(5, max-content) auto auto minmax(76px, max-content)"
    row = table.rows["b-slurm"]
    assert re.sub(r"<[^>]+>", "", row["scheduler"].value) == "slurm"
    # the nodes under the engine's id, in one column: the table fits a narrow notebook
    engine = re.fullmatch(r"<span class='tm-engine'[^>]*>([^<]*)</span><div class='tm-nodes'[^>]*>([^<]*)</div>",
                          row["engine"].value)
    assert engine.groups() == ("4242", "n1, n2")
    assert all(row[k].layout.display is None for k in ("scheduler", "engine"))
    assert re.sub(r"<[^>]+>", "", table.rows["a-local"]["engine"].value) == ""
    lines = table.text().splitlines()
    assert lines[0].split()[6:11] == ["started", "scheduler", "SLURM", "ID", "nodes"]
    assert lines[1].split()[-3:] == ["slurm", "4242", "n1,n2"]


def test_a_table_built_with_an_engine_id_job_shows_its_column_from_the_start(root):
    make(root, "s-slurm", scheduler="slurm", backend={"job_id": "99"}, nodes=["n1"])
    table = JobsTable(live=False)
    assert [re.sub(r"<[^>]+>", "", h.value.replace("<br>", " / ")) for h in optional_heads(table)
            if h.layout.display is None] == ["started", "SLURM ID / nodes"]  # one scheduler listed: no scheduler column
    assert re.sub(r"<[^>]+>", " ", table.rows["s-slurm"]["engine"].value).split() == ["99", "n1"]


def test_a_running_listing_keeps_its_filter_as_its_jobs_end(root):
    # issue 26: a `%tune_jobs --running` table listed every job's end in place, and "show all"
    # brought back ended jobs; it lists live jobs only, as its jobs end and new ones start
    from tune_magic.ui.listing import JobFilter

    t0 = time.time() - 600
    make(root, "a-ok", name="lr-1", started=t0)
    make(root, "b-failed", name="lr-2", status="failed", error="rank 0: boom", started=t0 + 1)
    for i in range(4):
        make(root, f"r{i}", name=f"run-{i}", status="running", supervised=True, step=1, loss=1.0, started=t0 + 10 + i)
    table = JobsTable(filter=JobFilter(running=True, last=2))  # live: its refresher thread runs
    try:
        assert [j.id for j in table.jobs] == ["r3", "r2"] and table.more.description == "show all (2 more)"
        jobstore.update(root / "r3", status="succeeded", returncode=0, ended_at=time.time())
        jobstore.update(root / "r1", status="failed", returncode=1, ended_at=time.time(), error="rank 0: late")
        # r3 leaves; r0, the newest live job behind "show all", takes its place (r1 ended meanwhile)
        wait_for(lambda: [j.id for j in table.jobs] == ["r2", "r0"], 10, what="the ended jobs to leave",
                 describe=lambda: table.text())
        assert [line.split()[0] for line in table.text().splitlines()[1:]] == ["r2", "r0"]
        assert "r3" not in table.rows and "succeeded" not in table.text() and "failed" not in table.text()
        make(root, "r4", name="run-4", status="running", supervised=True, step=1, loss=1.0)
        wait_for(lambda: [j.id for j in table.jobs] == ["r4", "r2"], 10, what="a new live job to be listed",
                 describe=lambda: table.text())
        table.more.click()  # every live job: the ended ones stay out
        assert [j.id for j in table.jobs] == ["r4", "r2", "r0"]
        for job_id in ("r4", "r2", "r0"):
            jobstore.update(root / job_id, status="stopped", returncode=-15, ended_at=time.time())
        wait_for(lambda: table.jobs == [], 10, what="every row to leave", describe=lambda: table.text())
        assert table.note.layout.display is None and "no live jobs (yet)" in html.unescape(table.note.value)
    finally:
        table.close()
    # --running --failed: a live job that fails stays, one that succeeds leaves
    make(root, "s1", status="running", supervised=True, step=1, loss=1.0)
    make(root, "s2", status="running", supervised=True, step=1, loss=1.0)
    both = JobsTable(live=False, filter=JobFilter(running=True, failed=True))
    jobstore.update(root / "s1", status="failed", returncode=1, ended_at=time.time(), error="rank 0: x")
    jobstore.update(root / "s2", status="succeeded", returncode=0, ended_at=time.time())
    both.refresh_once()
    assert "s1" in [j.id for j in both.jobs] and "s2" not in [j.id for j in both.jobs]
    assert both.summaries["s1"][1] == "failed"
