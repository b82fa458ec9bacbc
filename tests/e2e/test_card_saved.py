"""A saved card whose kernel is gone says so (issue 26): a notebook with a live card, executed in a
real kernel (nbclient, a real toy job), saved, then read back and reopened in a real JupyterLab in
headless Chromium with its kernel gone.

What a saved card holds and which form a frontend shows is described in
:mod:`tune_magic.ui.cardlines` (its "kernel is gone" section): the widget view (drawn from the
saved widget state, every view then marked ``jupyter-widgets-disconnected``) or the bundle's
text/html fallback (an untrusted notebook in JupyterLab 4, nbconvert, GitHub).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tune_magic.job import get_job
from tune_magic.ui.cardlines import gone_hint, gone_text

from test_browser import ARTIFACTS as LAB_ARTIFACTS, CHROMIUM_ARGS, Lab, chromium_exe  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "card-saved"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
TOY = f"{REPO / 'tests' / 'recipes' / 'toy_recipe.py'} --config {REPO / 'tests' / 'recipes' / 'toy.yaml'}"
CELLS = [
    ("setup", "%load_ext tune_magic"),
    # long, so the card is live (running) when the notebook is saved and its kernel shut down
    ("card", f"%%tune_run --name saved-card {TOY}\nsteps=2000\nstep_s=0.2"),
    ("wait", "import time\ntime.sleep(4)"),
]


def _notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src, id=cid) for cid, src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    return nb


def _card_output(nb) -> dict:
    cell = next(c for c in nb.cells if c.id == "card")
    (out,) = [o for o in cell.outputs if o.output_type == "display_data" and WIDGET_VIEW in o.data]
    return out.data


@pytest.fixture
def saved(tmp_path):
    """The executed notebook, saved to disk and read back: (path, notebook, job id)."""
    nb = _notebook()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    job = None
    try:
        # nbclient keeps the widgets' state in the notebook's metadata (store_widget_state, its default)
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
        path = tmp_path / "saved_card.ipynb"
        nbformat.write(nb, path)
        nbformat.write(nb, ARTIFACTS / "saved_card.ipynb")
        back = nbformat.read(path, as_version=4)
        result = next(o for o in next(c for c in back.cells if c.id == "card").outputs
                      if o.output_type == "execute_result")
        job = get_job(re.match(r"<Job (\S+) ", result.data["text/plain"])[1])
        yield path, back, job.id
    finally:
        if job is not None and job.status.is_live:
            job.stop(grace_s=2)


def test_a_saved_cards_bundle_and_widget_state_say_its_kernel_is_gone(saved):
    path, nb, job_id = saved
    data = _card_output(nb)
    # the fallback forms (what a frontend that does not draw the widget shows) name the real job
    assert gone_text(job_id) in data["text/html"]
    assert f"%tune_logs {job_id}" in data["text/html"] and f"tune-magic logs {job_id} --follow" in data["text/html"]
    assert data["text/plain"].splitlines()[0].startswith(f"job {job_id} (saved-card): ")
    assert data["text/plain"].splitlines()[-1] == gone_hint(job_id)
    # the saved widget state: the card's header holds the line, hidden unless the card is disconnected
    state = nb.metadata["widgets"][WIDGET_STATE]["state"]
    card = state[data[WIDGET_VIEW]["model_id"]]["state"]
    assert "tune-magic-card" in card["_dom_classes"]
    children = [state[c.removeprefix("IPY_MODEL_")]["state"] for c in card["children"]]
    header = next(c["value"] for c in children if "tm-header" in c.get("value", ""))
    assert "<div class='tm-gone'" in header and f"white-space:nowrap'>%tune_logs {job_id}</span>" in header
    assert "<code" not in header.split("tm-header")[0]  # the header's first <code> is the job id
    assert ".tune-magic-card .tm-gone{display:none}" in header
    assert ".tune-magic-card.jupyter-widgets-disconnected .tm-gone{display:block}" in header


def _shown(page, nb_name: str, selector: str):
    """Open ``nb_name`` in JupyterLab and return the first element matching ``selector`` once drawn."""
    page.goto(page.tm_lab.url(f"/lab/tree/{nb_name}?reset"), timeout=120 * 1000)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120 * 1000)
    found = page.locator(selector).first
    found.wait_for(state="attached", timeout=60 * 1000)
    return found


@pytest.mark.timeout(420)
def test_a_reopened_card_says_its_kernel_is_gone_in_jupyterlab(saved, tmp_path, chromium_exe, monkeypatch):
    from playwright.sync_api import sync_playwright

    path, nb, job_id = saved
    root = tmp_path / "root"
    root.mkdir()
    # as nbclient saved it: untrusted, so JupyterLab draws no widget (not a safe renderer) but the
    # bundle's text/html; the same notebook trusted (signed here): drawn from its saved widget state
    # (trust is by content: the untrusted copy differs by a metadata key, so signing the other
    # leaves it untrusted; the signatures go to a data dir of the test's own, not the user's)
    untrusted = nbformat.read(path, as_version=4)
    untrusted.metadata["tune_magic_test"] = "untrusted copy"
    nbformat.write(untrusted, root / "untrusted.ipynb")
    (root / "trusted.ipynb").write_text(path.read_text())
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    LAB_ARTIFACTS.mkdir(parents=True, exist_ok=True)  # where Lab writes its log
    lab = Lab(root, tmp_path)
    try:
        subprocess.run([sys.executable, "-m", "jupyter", "trust", str(root / "trusted.ipynb")], check=True,
                       capture_output=True, env={**os.environ,
                                                 "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config")})
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_exe, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.tm_lab = lab
                fallback = _shown(page, "untrusted.ipynb", ".tm-card-gone")
                text = fallback.inner_text()
                assert gone_text(job_id) in " ".join(text.split()), text
                assert page.locator(".tune-magic-card").count() == 0  # no widget drawn
                page.screenshot(path=str(ARTIFACTS / "untrusted.png"))

                card = _shown(page, "trusted.ipynb", ".tune-magic-card")
                gone = card.locator(".tm-gone")
                # drawn from the saved state with no comm behind it: disconnected, the line shown
                wait_for_visible = time.monotonic() + 60
                while not gone.is_visible() and time.monotonic() < wait_for_visible:
                    time.sleep(0.5)
                assert "jupyter-widgets-disconnected" in (card.get_attribute("class") or "")
                assert gone.is_visible(), card.inner_text()
                assert " ".join(gone.inner_text().split()) == gone_text(job_id)
                assert card.locator("button", has_text="Stop").is_hidden()  # it cannot stop anything
                page.screenshot(path=str(ARTIFACTS / "trusted.png"))
            finally:
                browser.close()
    finally:
        lab.shutdown()


@pytest.mark.timeout(420)
def test_a_live_card_says_its_kernel_is_gone_when_its_kernel_dies(tmp_path, chromium_exe, monkeypatch):
    # the same line on a card drawn live, once its kernel died: the server restarts it, and
    # ipywidgets marks every view of the old kernel's models disconnected
    import json

    import psutil

    from playwright.sync_api import sync_playwright
    from test_browser import _notebook

    from waiting import wait_for

    root = tmp_path / "root"
    root.mkdir()
    (root / "live.ipynb").write_text(json.dumps(_notebook([("code", src) for _, src in CELLS[:2]])))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    LAB_ARTIFACTS.mkdir(parents=True, exist_ok=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    lab = Lab(root, tmp_path)
    job_id = None
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_exe, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(lab.url("/lab/tree/live.ipynb?reset"), timeout=120 * 1000)
                page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\|\s*Idle")).first.wait_for(
                    timeout=120 * 1000)
                page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
                page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
                card = page.locator(".tune-magic-card").first
                card.locator(".tm-status", has_text="running").wait_for(timeout=120 * 1000)
                job_id = card.locator(".tm-header code").first.inner_text().strip()
                gone = card.locator(".tm-gone")
                assert gone.is_hidden() and card.locator("button", has_text="Stop").is_visible()  # live
                # the kernel dies (SIGKILL); the server restarts it and tells the page
                (kernel,) = lab.api("GET", "/api/kernels")
                (proc,) = [pr for pr in psutil.process_iter(["cmdline"])
                           if any(f"kernel-{kernel['id']}.json" in a for a in pr.info["cmdline"] or ())]
                proc.kill()
                wait_for(gone.is_visible, 60, interval=0.5, what="the card to say its kernel is gone",
                         describe=card.inner_text)
                assert " ".join(gone.inner_text().split()) == gone_text(job_id)
                assert card.locator("button", has_text="Stop").is_hidden()
                page.screenshot(path=str(ARTIFACTS / "restarted.png"))
            finally:
                browser.close()
    finally:
        lab.shutdown()
        if job_id:
            job = get_job(job_id)
            if job.status.is_live:
                job.stop(grace_s=2)
