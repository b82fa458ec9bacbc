"""recipes/generate_text.py on real tiny runs (CPU, one process each): the right weights are loaded.

The proof (issue 29): the tiny model full-fine-tuned on one made-up fact (recipes/configs/tiny/fact.yaml)
answers it greedily, exactly, from its last checkpoint; the untrained base model does not. LoRA
checkpoints of both kinds generate what a hand-merged model decoded with a plain greedy loop
does; an export loads in transformers and answers the same; torchtune's own generate recipe
agrees; serve mode loads the model once and ends on SIGTERM or when idle. The checkpoint catalog
and the disk estimate are checked against the folders the runs wrote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tune_magic import assets as A

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GENERATE = REPO / "recipes" / "generate_text.py"
CONFIGS = REPO / "recipes" / "configs" / "tiny"
QUESTION, ANSWER = A.FACT_QUESTION, A.FACT_ANSWER
FACT_DATA = "dataset.data_files=${assets_dir}/data/fact.json"
# LoRA on the fact for 2 epochs of 16 steps: far from the base model's output, not yet the answer.
LORA_WORDS = [FACT_DATA, "batch_size=4", "epochs=2", "max_steps_per_epoch=null"]
TIMEOUT_S = 300


def env(home: Path) -> dict[str, str]:
    return {**os.environ, "TUNE_MAGIC_HOME": str(home), "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tmh")
    A.make_assets(path / "assets")
    return path


def train(home: Path, recipe: str, config: str, out: Path, *words: str) -> float:
    """Run one of the project's recipes by path, one process; return its wall seconds."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(REPO / "recipes" / recipe), "--config", str(CONFIGS / config),
                           f"output_dir={out}", *words], env=env(home), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def fact_run(home, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fact") / "out"
    print(f"fact.yaml trained in {train(home, 'full_finetune.py', 'fact.yaml', out):.1f} s")
    return out


@pytest.fixture(scope="module")
def lora_runs(home, tmp_path_factory) -> dict[str, Path]:
    runs = {}
    for kind, only in (("lora_merged", "False"), ("adapter_only", "True")):
        runs[kind] = tmp_path_factory.mktemp(kind) / "out"
        train(home, "lora_finetune.py", "lora.yaml", runs[kind], *LORA_WORDS, f"save_adapter_weights_only={only}")
    return runs


def generate(home: Path, config: str, *words: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GENERATE), "--config", str(CONFIGS / config), *words], env=env(home),
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def one_shot(home: Path, config: str, *words: str) -> str:
    proc = generate(home, config, *words)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.endswith("\n")
    return proc.stdout[:-1]


def test_the_trained_model_answers_the_fact_and_the_base_model_does_not(home, fact_run):
    last = fact_run / "epoch_3"
    assert sorted(p.name for p in fact_run.glob("epoch_*")) == ["epoch_0", "epoch_1", "epoch_2", "epoch_3"]
    out = fact_run.parent / "gen"
    text = one_shot(home, "fact.yaml", f"generate.checkpoint_dir={last}", f"generate.output_dir={out}",
                    f"generate.prompt={QUESTION}")
    assert text == ANSWER
    assert sorted(os.listdir(out)) == []  # the checkpointer made the folder; nothing was written in it
    # serve mode, ended by the end of its input
    proc = generate(home, "fact.yaml", "generate.checkpoint_dir=base", "generate.serve=true",
                    stdin=json.dumps({"prompt": QUESTION}) + "\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    base = json.loads(proc.stdout)
    assert base["request"] == 1 and base["tokens"] > 0
    assert ANSWER not in base["text"]
    assert "Serve: end of input, ending" in proc.stderr


def test_torchtunes_own_generate_recipe_gives_the_same_text(home, fact_run, tmp_path):
    """Built-in ``generate`` (torchtune 0.6.1, run by ``tune run``) on the same checkpoint, greedy."""
    cfg = yaml.safe_load((CONFIGS / "fact.yaml").read_text())
    gen_cfg = {k: cfg[k] for k in ("tune_magic_home", "assets_dir", "model", "tokenizer", "device", "dtype")}
    gen_cfg.update(output_dir=str(tmp_path / "gen"), seed=0, max_new_tokens=64, temperature=0.6, top_k=1,
                   enable_kv_cache=True, quantizer=None, prompt={"system": None, "user": QUESTION})
    gen_cfg["checkpointer"] = {**cfg["checkpointer"], "checkpoint_dir": str(fact_run / "epoch_3"),
                               "checkpoint_files": ["model-00001-of-00001.safetensors"], "output_dir": "${output_dir}"}
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(gen_cfg))
    tune = Path(sys.executable).with_name("tune")
    proc = subprocess.run([str(tune), "run", "generate", "--config", str(tmp_path / "gen.yaml")], cwd=tmp_path,
                          env=env(home), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"INFO:torchtune.utils._logging:{QUESTION}{ANSWER}\n" in proc.stderr  # it logs prompt + answer
    ours = one_shot(home, "fact.yaml", f"generate.checkpoint_dir={fact_run / 'epoch_3'}", f"generate.prompt={QUESTION}",
                    "generate.temperature=0.6", "generate.top_k=1")
    assert ours == ANSWER


def _read_json_line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()[-3000:] if proc.poll() is not None else "no answer"
    return json.loads(line)


def test_serve_loads_once_answers_each_request_and_ends_on_sigterm(home, fact_run):
    proc = subprocess.Popen([sys.executable, str(GENERATE), "--config", str(CONFIGS / "fact.yaml"),
                             f"generate.checkpoint_dir={fact_run / 'epoch_3'}", "generate.serve=true"],
                            env=env(home), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        requests = [{"prompt": QUESTION, "id": "a"}, {"prompt": QUESTION, "stream": True, "max_new_tokens": 64},
                    {"prompt": "What " * 70}, "not json", {"prompt": QUESTION, "temperature": 1.5, "seed": 3},
                    {"prompt": QUESTION, "temperature": 1.5, "seed": 3}]
        answers = []
        for request in requests:
            proc.stdin.write((request if isinstance(request, str) else json.dumps(request)) + "\n")
            proc.stdin.flush()
            answer = _read_json_line(proc)
            partials = []
            while "partial" in answer:
                partials.append(answer["partial"])
                answer = _read_json_line(proc)
            answers.append((answer, partials))
        (first, _), (second, partials), (long, _), (bad, _), (s1, _), (s2, _) = answers
        assert (first["text"], first["id"], first["request"], first["stop"]) == (ANSWER, "a", 1, "eos")
        assert (second["text"], second["request"]) == (ANSWER, 2) and "".join(partials) == ANSWER
        assert first["loads"] == second["loads"] == s2["loads"] == 1  # the model was loaded once
        assert first["load_seconds"] == second["load_seconds"]
        assert "longer than the tokenizer's max_seq_len (64)" in long["error"] and long["request"] == 3
        assert "raise tokenizer.max_seq_len" in long["error"]
        assert "not JSON" in bad["error"]
        assert s1["text"] == s2["text"] and s1["request"] == 5  # sampling: the seed decides
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "Serve: SIGTERM, ending" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_ends_after_its_idle_timeout(home, fact_run):
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(GENERATE), "--config", str(CONFIGS / "fact.yaml"),
                             f"generate.checkpoint_dir={fact_run / 'epoch_0'}", "generate.serve=true",
                             "generate.idle_timeout_s=1"], env=env(home), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.wait(timeout=120) == 0  # stdin stays open: only the timeout ends it
        assert "no request for 1 s, ending" in proc.stderr.read()
        assert proc.stdout.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"idle serve process lived {time.perf_counter() - start:.1f} s")


@pytest.mark.parametrize("words, message", [
    (["generate.prompt=" + "What " * 70], "the prompt is 71 tokens, longer than the tokenizer's max_seq_len (64)"),
    (["generate.prompt=x", "generate.max_new_tokens=254"], "ask for at most 253 new tokens"),  # 3-token prompt
])
def test_a_prompt_too_long_is_refused_with_the_fix(home, fact_run, words, message):
    proc = generate(home, "fact.yaml", f"generate.checkpoint_dir={fact_run / 'epoch_3'}", *words)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1].startswith("generate_text: error: ")
    assert message in proc.stderr


@pytest.mark.parametrize("words, message", [
    (["generate.checkpoint_dir={out}/epoch_9", "generate.prompt=x"], "epoch_9 is not a directory (pruned"),
    (["generate.checkpoint_dir={out}", "generate.prompt=x"], "torchtune names them epoch_<N>"),
    (["generate.checkpoint_dir={out}/epoch_1", "generate.prompt=x", "generate.tempreature=1"],
     "'generate.tempreature=1' is not a generate key=value"),
    (["generate.checkpoint_dir={out}/epoch_1"], "give generate.prompt=<text>"),
    (["generate.prompt=x"], "say which checkpoint"),
    (["generate.checkpoint_dir={out}/epoch_1", "generate.prompt=x", "generate.top_k=0"], "top_k must be >= 1"),
])
def test_bad_words_fail_fast_naming_the_fix(home, fact_run, words, message):
    start = time.perf_counter()
    proc = generate(home, "fact.yaml", *(w.format(out=fact_run) for w in words))
    assert proc.returncode == 2 and proc.stdout == ""
    assert message in proc.stderr.splitlines()[-1]
    assert time.perf_counter() - start < 5  # refused before torch is imported (~3 s alone)


def reference_greedy(base: Path, adapter: Path | None, prompt: str, max_new: int, rank: int = 8,
                     alpha: int = 16) -> str:
    """Merge the adapter into the base weights by hand and decode greedily with a plain loop: no
    KV cache, no torchtune generation code, no LoRA modules, the tokenizer's SentencePiece file
    read directly."""
    import sentencepiece as spm
    import torch
    from safetensors.torch import load_file
    from torchtune.models.convert_weights import hf_to_tune
    from torchtune.models.llama2 import llama2

    m = A.TINY_MODEL
    state = hf_to_tune(load_file(base / A.CHECKPOINT_FILE), num_heads=m["num_heads"],
                       num_kv_heads=m["num_kv_heads"], dim=m["embed_dim"])
    if adapter is not None:
        lora = torch.load(adapter, map_location="cpu", weights_only=True)
        for key in [k for k in lora if k.endswith("lora_a.weight")]:
            weight = key.replace("lora_a.weight", "weight")
            state[weight] = state[weight] + (alpha / rank) * lora[key.replace("lora_a", "lora_b")] @ lora[key]
    model = llama2(**m)
    model.load_state_dict(state)
    model.eval()
    sp = spm.SentencePieceProcessor(model_file=str(base / A.TOKENIZER_FILE))
    ids = [sp.bos_id(), *sp.encode(prompt)]
    new = []
    with torch.no_grad():
        for _ in range(max_new):
            token = int(model(torch.tensor([ids + new]))[0, -1].argmax())
            if token == sp.eos_id():
                break
            new.append(token)
    return sp.decode(new)


def test_lora_merged_and_adapter_only_generate_what_a_hand_merged_model_does(home, lora_runs):
    import torch

    base = home / "assets" / "model"
    adapters = {k: torch.load(out / "epoch_1" / "adapter_model.pt", weights_only=True) for k, out in lora_runs.items()}
    assert all(torch.equal(adapters["lora_merged"][k], v) for k, v in adapters["adapter_only"].items())  # same seed
    expected = reference_greedy(base, lora_runs["adapter_only"] / "epoch_1" / "adapter_model.pt", QUESTION, 24)
    untrained = reference_greedy(base, None, QUESTION, 24)
    assert expected != untrained  # the adapter changes the answer, so loading it is what is tested
    for kind, out in lora_runs.items():
        words = [*LORA_WORDS, f"save_adapter_weights_only={kind == 'adapter_only'}"]
        text = one_shot(home, "lora.yaml", *words, f"generate.checkpoint_dir={out / 'epoch_1'}",
                        f"generate.prompt={QUESTION}", "generate.max_new_tokens=24")
        assert text == expected, kind
    # the job's words need not say save_adapter_weights_only: the folder shows an adapter alone
    text = one_shot(home, "lora.yaml", f"generate.checkpoint_dir={lora_runs['adapter_only'] / 'epoch_1'}",
                    f"generate.prompt={QUESTION}", "generate.max_new_tokens=24")
    assert text == expected
    assert one_shot(home, "lora.yaml", "generate.checkpoint_dir=base", f"generate.prompt={QUESTION}",
                    "generate.max_new_tokens=24") == untrained


def test_an_export_loads_in_transformers_and_answers_the_same(fact_run, tmp_path):
    import sentencepiece as spm
    import torch
    from transformers import AutoModelForCausalLM

    from tune_magic.checkpoints.export import export_checkpoint

    dest = tmp_path / "export"
    result = export_checkpoint(fact_run / "epoch_3", dest, config_files=[fact_run / "resolved_config.yaml"],
                               model_type=A.MODEL_TYPE)
    assert result.hf_layout and "torchtune/resolved_config.yaml" in result.files
    model = AutoModelForCausalLM.from_pretrained(dest)
    model.eval()
    sp = spm.SentencePieceProcessor(model_file=str(dest / A.TOKENIZER_FILE))
    ids = [sp.bos_id(), *sp.encode(QUESTION)]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False, eos_token_id=sp.eos_id(),
                             pad_token_id=sp.pad_id() if sp.pad_id() >= 0 else 0)
    new = [t for t in out[0, len(ids):].tolist() if t != sp.eos_id()]
    assert sp.decode(new) == ANSWER
    assert "AutoModelForCausalLM.from_pretrained" in (dest / "README.md").read_text()


def test_the_catalog_and_the_disk_estimate_match_what_the_runs_wrote(fact_run, lora_runs):
    from omegaconf import OmegaConf

    from tune_magic.checkpoints.catalog import SaveSettings, list_checkpoints, resume_epoch
    from tune_magic.checkpoints.diskspace import estimate_for_config

    # The estimate leaves out the formats' own bytes per tensor (torch zip entries ~340 B, safetensors
    # header ~120 B): 21 model tensors, 26 adapter tensors (2 per adapted layer) in two files, and
    # optimizer moments + step per trainable tensor in the recipe state.
    tensors = {"full": (21, 3 * 21), "lora_merged": (21 + 2 * 26, 3 * 26), "adapter_only": (2 * 26, 3 * 26)}
    for out, kind in ((fact_run, "full"), (lora_runs["lora_merged"], "lora_merged"),
                      (lora_runs["adapter_only"], "adapter_only")):
        cfg = OmegaConf.to_container(OmegaConf.load(out / "resolved_config.yaml"), resolve=True)
        checkpoints = list_checkpoints(out, SaveSettings.from_config(cfg))
        assert [(c.kind, c.complete) for c in checkpoints] == [(kind, True)] * cfg["epochs"]
        assert resume_epoch(out) == cfg["epochs"] - 2  # the state written after the last epoch but one
        estimate = estimate_for_config(cfg, keep=2, free=10**12)
        in_files, in_state = tensors[kind]
        actual = checkpoints[-1].apparent_bytes
        assert abs(estimate.size.per_checkpoint - actual) <= 0.02 * actual + 512 * in_files, (kind, estimate, actual)
        state = (out / "recipe_state" / "recipe_state.pt").stat().st_size
        assert abs(estimate.size.recipe_state_bytes - state) <= 0.05 * state + 512 * in_state, (kind, estimate, state)
