"""The launch panel driven in a real Jupyter kernel, through its public child widgets."""

from __future__ import annotations

import pytest

import tune_magic.job as J

from kernelhelpers import Kernel
from waiting import wait_for

TIMEOUT = 240


@pytest.fixture
def kernel(tmp_path, tiny_assets):
    k = Kernel(cwd=str(tmp_path))
    yield k
    k.shutdown()


def test_panel_preview_launch_twice_compare_and_invalid_endpoint(kernel):
    kernel.run("import tune_magic\npanel = tune_magic.Panel()\npanel")
    kernel.run("panel.recipe.value = 'lora_finetune'")
    assert "tiny/lora" in kernel.value("list(panel.config.options)")
    kernel.run("panel.config.value = 'tiny/lora'\npanel.nproc.value = 2\n"
               "panel.overrides.value = 'max_steps_per_epoch=4\\n# a comment\\nseed=3'")
    preview, expected = kernel.value(
        "[panel.command_preview.value, tune_magic.build_plan("
        "'--nproc_per_node 2 lora_finetune --config tiny/lora max_steps_per_epoch=4 seed=3').command_line()]")
    assert preview == expected
    assert "--standalone --nproc_per_node 2" in preview and "<job-id>" in preview
    assert kernel.value("panel.launch_button.disabled") is False

    # an invalid endpoint: the builder's reason inline, Launch disabled, nothing launched
    kernel.run("panel.endpoint.value = 'node0:99999'")
    assert kernel.value("panel.launch_button.disabled") is True
    assert "port 99999 is outside 0-65535" in kernel.value("panel.error.value")
    kernel.run("panel.endpoint.value = '[fe80::1]:29400'")
    assert kernel.value("panel.launch_button.disabled") is False
    assert "--rdzv-endpoint '[fe80::1]:29400'" in kernel.value("panel.command_preview.value")
    kernel.run("panel.endpoint.value = ''")

    kernel.run("panel.launch_button.click()\npanel.launch_button.click()")
    ids = kernel.value("[j.id for j in panel.launched]")
    assert len(ids) == 2 and ids[0] != ids[1]
    # the panel's own table shows both at once (no Refresh), live ones with their Stop button
    shown = kernel.value("{i: [panel.jobs_table.summaries[i][1], panel.jobs_table.rows[i]['stop'] in "
                         "next(r.stop_cell.children for r in panel.jobs_table._slots if r.job and r.job.id == i)] "
                         f"for i in {ids!r}}}")
    assert all(status in ("running", "succeeded") for status, _ in shown.values()), shown
    assert all(has_stop == (status == "running") for status, has_stop in shown.values()), shown
    jobs = [J.get_job(i) for i in ids]
    assert [j.wait(TIMEOUT) for j in jobs] == ["succeeded", "succeeded"], [j.tail(20) for j in jobs]
    ports = {j.rendezvous_endpoint.rsplit(":", 1)[1] for j in jobs}
    assert len(ports) == 2

    points = "{k: [list(p) for p in v] for k, v in panel.series.items()}"

    def all_four_points() -> dict | None:
        series = kernel.value(points)
        return series if all(len(series.get(i, [])) == 4 for i in ids) else None

    series = wait_for(all_four_points, timeout=60, interval=0.5, what="4 points of each job in the panel's series",
                      describe=lambda: kernel.value(points))
    assert sorted(series) == sorted(ids)
    for i in ids:
        assert [s for s, _ in series[i]] == [1, 2, 3, 4]
    marks = kernel.value("[len(m.y) for m in panel.chart.marks]")
    assert marks == [4, 4]
    # the same table, never refreshed by hand, reads succeeded once its refresher has run
    summaries = f"{{i: panel.jobs_table.summaries[i][1:3] for i in {ids!r}}}"

    def both_succeeded() -> bool:
        table = kernel.value(summaries)
        return all(table[i] == ["succeeded", 4] for i in ids)

    wait_for(both_succeeded, timeout=10, interval=0.5, what="succeeded at step 4 in the panel's table",
             describe=lambda: kernel.value(summaries))
    lines = {line.split()[0]: line.split()[1:4] for line in kernel.value("panel.jobs_table.text()").splitlines()}
    assert all(lines[i] == ["lora_finetune", "succeeded", "4"] for i in ids), lines
