"""Tiny offline assets: deterministic, loadable by torchtune, idempotent and safe to race."""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tune_magic import assets as A
from tune_magic.assets import AssetPaths, make_assets, read_manifest

EXPECTED_FILES = {
    "manifest.json",
    "model/config.json",
    "model/model.safetensors",
    "model/tokenizer.model",
    "data/tiny_instruct.json",
    "data/fact.json",
}

#: sha256 of each file of a version-1 build with seed 0 (numpy 2.4.6, sentencepiece 0.2.3 of
#: constraints.txt): the bytes the other tests' pinned losses come from.
VERSION_1_SEED_0 = {
    "data/tiny_instruct.json": "9f85bad3482f91a4136f8e61ff086d2b77010a24c66087af185019c302f790d8",
    "model/config.json": "91542a43e743aac9287e4097a2b74bcaa63710fd0238edb05920ddacd10d7dc7",
    "model/model.safetensors": "babe9eb93512357af79189fabc3c1b6e86ab6add03065d9ba8f43359387ae26e",
    "model/tokenizer.model": "90bcc04cec447ac1f7090e8fc2dee5b7e6feb63115533688d1b2bbc226393323",
}


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def tree_stats(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> AssetPaths:
    return make_assets(tmp_path_factory.mktemp("assets") / "tiny", seed=0)


def test_layout_and_manifest(built: AssetPaths):
    assert set(tree_bytes(built.root)) == EXPECTED_FILES
    assert built.checkpoint_file == built.model_dir / "model.safetensors"
    assert built.tokenizer_path == built.model_dir / "tokenizer.model"
    manifest = read_manifest(built.root)
    assert manifest["seed"] == 0
    assert manifest["version"] == A.ASSETS_VERSION
    assert manifest["model"] == A.TINY_MODEL
    assert manifest["num_examples"] == 128
    assert set(manifest["files"]) == EXPECTED_FILES - {"manifest.json"}
    # A shared cache must be readable by others (mkdtemp alone would leave 0700).
    assert built.root.stat().st_mode & 0o777 == 0o755
    assert built.checkpoint_file.stat().st_mode & 0o777 == 0o644


def test_same_seed_gives_same_bytes(built: AssetPaths, tmp_path: Path):
    again = make_assets(tmp_path / "again", seed=0)
    assert tree_bytes(again.root) == tree_bytes(built.root)


def test_different_seed_differs(built: AssetPaths, tmp_path: Path):
    other = make_assets(tmp_path / "other", seed=1)
    a, b = tree_bytes(built.root), tree_bytes(other.root)
    assert a.keys() == b.keys()
    for name in ("model/model.safetensors", "data/tiny_instruct.json", "manifest.json"):
        assert a[name] != b[name], name
    assert read_manifest(other.root)["seed"] == 1


def test_checkpoint_loads_with_torchtune_checkpointer(built: AssetPaths, tmp_path: Path):
    import torch
    from safetensors.torch import load_file
    from torchtune.models.llama2 import llama2
    from torchtune.training import MODEL_KEY, FullModelHFCheckpointer

    ckpt = FullModelHFCheckpointer(
        checkpoint_dir=str(built.model_dir),
        checkpoint_files=[A.CHECKPOINT_FILE],
        model_type=A.MODEL_TYPE,
        output_dir=str(tmp_path / "out"),
    )
    state = ckpt.load_checkpoint()[MODEL_KEY]
    model = llama2(**A.TINY_MODEL)
    result = model.load_state_dict(state, strict=True)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    # Per layer: q,o 64x64; k,v 64x32 (GQA 4/2 heads); MLP 3 x 64x128; 2 norms -> 36_992.
    # Plus embedding and output 512x64 each and the final norm: 2 * 36_992 + 65_536 + 64.
    assert sum(p.numel() for p in model.parameters()) == 139_584
    tokens = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (1, 4, A.TINY_MODEL["vocab_size"])
    assert torch.isfinite(logits).all()

    # Saving converts back to HF names; the round trip reproduces the input tensors exactly,
    # which checks the q/k permutation that config.json's head counts drive.
    ckpt.save_checkpoint({MODEL_KEY: state}, epoch=0)
    saved = load_file(tmp_path / "out" / "epoch_0" / "model-00001-of-00001.safetensors")
    original = load_file(built.checkpoint_file)
    assert saved.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(saved[name], tensor), name


def test_tokenizer_round_trips(built: AssetPaths):
    from torchtune.models.llama2 import llama2_tokenizer

    tok = llama2_tokenizer(str(built.tokenizer_path), prompt_template=None)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
    assert tok.vocab_size == read_manifest(built.root)["tokenizer_vocab_size"]
    assert tok.vocab_size <= A.TINY_MODEL["vocab_size"]
    records = json.loads(built.dataset_path.read_text())
    # Corpus text, and text the tokenizer never saw (byte fallback).
    texts = [records[0]["instruction"], records[0]["output"], "Zürich, 42 °C ✓"]
    for text in texts:
        ids = tok.encode(text, add_bos=True, add_eos=True)
        assert ids[0] == 1 and ids[-1] == 2
        assert max(ids) < A.TINY_MODEL["vocab_size"]
        assert tok.decode(ids) == text
    # The corpus is tokenised compactly (whole words), which keeps sequences and steps short.
    assert len(tok.encode("The apple is red.", add_bos=False, add_eos=False)) <= 6


def test_dataset_loads_with_torchtune_builders(built: AssetPaths, tmp_path: Path):
    from torchtune.datasets import alpaca_dataset, instruct_dataset
    from torchtune.models.llama2 import llama2_tokenizer

    tok = llama2_tokenizer(str(built.tokenizer_path), max_seq_len=64, prompt_template=None)
    records = json.loads(built.dataset_path.read_text())
    assert len(records) == 128
    assert all(set(r) == {"instruction", "input", "output"} for r in records)

    ds = instruct_dataset(
        tok,
        source="json",
        data_files=str(built.dataset_path),
        column_map={"input": "instruction", "output": "output"},
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    assert len(ds) == 128
    sample = ds[0]
    text = tok.decode(sample["tokens"])
    assert text == records[0]["instruction"] + records[0]["output"]
    # train_on_input=False: the instruction is masked out of the labels, the answer is not.
    n_prompt = len(tok.encode(records[0]["instruction"], add_bos=True, add_eos=False))
    assert all(label == -100 for label in sample["labels"][:n_prompt])
    assert sample["labels"][-1] == tok.eos_id

    alpaca = alpaca_dataset(
        tok, source="json", data_files=str(built.dataset_path), cache_dir=str(tmp_path / "hf")
    )
    assert len(alpaca) == 128


def test_fact_dataset_repeats_one_fact(built: AssetPaths, tmp_path: Path):
    """data/fact.json: 64 copies of one made-up pair, readable by instruct_dataset as the tiny
    configs read it; the tokenizer never saw it but spells it (byte fallback) and decodes it back."""
    from torchtune.datasets import instruct_dataset
    from torchtune.models.llama2 import llama2_tokenizer

    records = json.loads(built.fact_path.read_text())
    assert built.fact_path == built.root / "data" / "fact.json"
    assert records == [{"instruction": A.FACT_QUESTION, "input": "", "output": A.FACT_ANSWER}] * A.FACT_COPIES
    assert (A.FACT_QUESTION, A.FACT_ANSWER, A.FACT_COPIES) == (
        "What is the capital of Xyzzy?", "Plugh is the capital of Xyzzy.", 64)
    tok = llama2_tokenizer(str(built.tokenizer_path), max_seq_len=64, prompt_template=None)
    ds = instruct_dataset(tok, source="json", data_files=str(built.fact_path), split="train",
                          column_map={"input": "instruction", "output": "output"}, cache_dir=str(tmp_path / "hf"))
    assert len(ds) == 64
    assert tok.decode(ds[0]["tokens"]) == A.FACT_QUESTION + A.FACT_ANSWER
    assert len(ds[0]["tokens"]) < 64  # never truncated by the configs' max_seq_len


def test_the_fact_file_leaves_the_other_files_as_version_1_built_them(built: AssetPaths):
    """Other tests pin losses of runs on these files: adding the fact file (version 2) changed none.
    The digests are version 1's build with seed 0."""
    manifest = read_manifest(built.root)
    for name, digest in VERSION_1_SEED_0.items():
        assert manifest["files"][name] == digest, name


def test_idempotent_second_call_touches_nothing(tmp_path: Path):
    first = make_assets(tmp_path / "a", seed=3)
    before = tree_stats(first.root)
    second = make_assets(tmp_path / "a", seed=3)
    assert second == first
    assert tree_stats(first.root) == before


def test_force_rewrites_same_bytes(tmp_path: Path):
    first = make_assets(tmp_path / "a", seed=3)
    content, stats = tree_bytes(first.root), tree_stats(first.root)
    make_assets(tmp_path / "a", seed=3, force=True)
    assert tree_bytes(first.root) == content
    assert tree_stats(first.root) != stats  # new files (new inodes), same bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.lock", "a"]  # no temp dirs left


def test_other_seed_replaces_build(tmp_path: Path):
    make_assets(tmp_path / "a", seed=0)
    make_assets(tmp_path / "a", seed=5)
    assert read_manifest(tmp_path / "a")["seed"] == 5
    assert tree_bytes(tmp_path / "a") == tree_bytes(make_assets(tmp_path / "b", seed=5).root)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.lock", ".b.lock", "a", "b"]


def test_damaged_file_is_rebuilt(tmp_path: Path):
    built = make_assets(tmp_path / "a")
    good = built.dataset_path.read_bytes()
    built.dataset_path.write_text("[]")
    make_assets(tmp_path / "a")
    assert built.dataset_path.read_bytes() == good


def test_existing_empty_directory_is_used(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    built = make_assets(tmp_path / "empty")
    assert set(tree_bytes(built.root)) == EXPECTED_FILES


def test_refuses_foreign_directory(tmp_path: Path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="no tune_magic manifest.json"):
        make_assets(foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        make_assets(tmp_path / "file")


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_rejects_bad_seed(seed, tmp_path: Path):
    with pytest.raises(ValueError, match="non-negative int"):
        make_assets(tmp_path / "a", seed=seed)
    assert not (tmp_path / "a").exists()


def test_default_directory_is_home_assets(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path / "home"))
    built = make_assets()
    assert built.root == tmp_path / "home" / "assets"
    assert built.manifest_path.is_file()


def _build_in_child(directory: str) -> tuple[str, int]:
    result = make_assets(directory, seed=2)
    return str(result.root), result.manifest_path.stat().st_ino


def test_concurrent_callers_all_see_one_complete_build(tmp_path: Path):
    target = tmp_path / "shared"
    # spawn: the pytest process may hold torch threads, which fork does not copy safely.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=4, mp_context=ctx) as pool:
        results = list(pool.map(_build_in_child, [str(target)] * 4))
    assert {root for root, _ in results} == {str(target)}
    # The lock lets exactly one build happen; the others return the same manifest file.
    assert len({ino for _, ino in results}) == 1
    assert tree_bytes(target) == tree_bytes(make_assets(tmp_path / "serial", seed=2).root)
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".shared."))
    assert leftovers == [".shared.lock"]


def test_assets_paths_are_absolute(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    built = make_assets("rel")
    assert built.root == tmp_path / "rel"
    assert all(Path(v).is_absolute() for v in vars(built).values())
    assert os.path.isfile(built.tokenizer_path)
