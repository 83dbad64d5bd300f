"""The activation store: windows, activations equal to run_with_cache, the mixing buffer, shards on disk
(resumable after an exception or SIGKILL, equal under a 2-process torchrun), and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save

from interp_gpt import GPT
from interp_gpt.cli import main as cli_main
from interp_gpt.store import ActivationStore, load_harvest, text
from interp_gpt.store.buffer import MixingBuffer
from interp_gpt.store.shardfile import ShardBuffer

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "corpus"
HOOK = "blocks.1.hook_resid_pre"


@pytest.fixture(scope="module")
def model() -> GPT:
    return GPT.from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def docs() -> list[str]:
    """Three documents of different lengths cut from the shipped corpus."""
    t = (CORPUS / "tinyshakespeare_input.txt").read_text(encoding="utf-8")
    return [t[:1500], t[3000:3300], t[5000:7000]]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 24 KB of War and Peace as one file: enough for a few dozen 32-token windows."""
    path = tmp_path_factory.mktemp("corpus") / "wp.txt"
    path.write_text((CORPUS / "warpeace_input.txt").read_text(encoding="utf-8")[:24_000], encoding="utf-8")
    return path


def expected_windows(model: GPT, docs: list[str], ctx: int) -> torch.Tensor:
    """The spec, written out plainly: documents joined with BOS between them; each window is BOS and
    the next ctx - 1 tokens (a separator BOS right at a window's start is not repeated)."""
    bos = model.tokenizer.bos_token_id
    stream: list[int] = []
    for i, d in enumerate(docs):
        stream += ([bos] if i else []) + model.tokenizer.encode(d)
    windows, at = [], 0
    while True:
        if at < len(stream) and stream[at] == bos:
            at += 1
        if len(stream) - at < ctx - 1:
            break
        windows.append([bos] + stream[at : at + ctx - 1])
        at += ctx - 1
    return torch.tensor(windows)


def rows_sorted(x: torch.Tensor) -> np.ndarray:
    a = x.numpy()
    return a[np.lexsort(a.T[::-1])]


# ----------------------------------------------------------------------------
# text -> windows
# ----------------------------------------------------------------------------
def test_chunked_file_tokenization_equals_the_whole_file(model: GPT, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text, "CHUNK_CHARS", 4096)
    for name in ("warpeace_input.txt", "tinyshakespeare_input.txt"):
        path = CORPUS / name
        chunks = list(text._file_chunks(path))
        whole = path.read_text(encoding="utf-8")
        assert len(chunks) > 100 and max(len(c) for c in chunks) > 4 and "".join(p for c in chunks for p in c) == whole
        head = "".join(p for c in chunks[:30] for p in c)
        windows = text.TokenWindows(model.tokenizer, [head], 16, prepend_bos=False)
        pieces = [ids for c in chunks[:30] for ids in windows._encode(c)]  # the fast path, piece by piece
        assert [i for ids in pieces for i in ids] == model.tokenizer.encode(head)


def test_windows_follow_the_documented_layout(model: GPT, docs: list[str]) -> None:
    got = torch.stack(list(text.TokenWindows(model.tokenizer, docs, 32)))
    want = expected_windows(model, docs, 32)
    assert got.shape == want.shape and torch.equal(got, want)
    assert (got[:, 0] == model.tokenizer.bos_token_id).all()
    # A document of exactly 31 tokens fills window 0; the separator BOS after it is window 1's own BOS.
    text_ = docs[0]
    doc0 = next(text_[:i] for i in range(1, len(text_)) if len(model.tokenizer.encode(text_[:i])) == 31)
    got = torch.stack(list(text.TokenWindows(model.tokenizer, [doc0, docs[1]], 32)))
    bos = model.tokenizer.bos_token_id
    assert got[0].tolist() == [bos] + model.tokenizer.encode(doc0)
    assert got[1].tolist() == [bos] + model.tokenizer.encode(docs[1])[:31]
    no_bos = torch.stack(list(text.TokenWindows(model.tokenizer, docs[:1], 16, prepend_bos=False)))
    assert torch.equal(no_bos.flatten(), torch.tensor(model.tokenizer.encode(docs[0])[: no_bos.numel()]))


# ----------------------------------------------------------------------------
# in memory
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "hooks",
    [
        [HOOK, "blocks.0.attn.hook_z", "ln_final.hook_normalized", "blocks.0.hook_mlp_out"],  # to the end
        ["blocks.0.hook_mlp_out", HOOK],  # stops at layer 1: resid_pre 1 is the forward's output
        ["hook_embed"],  # no block at all
    ],
)
def test_unshuffled_store_equals_run_with_cache(model: GPT, docs: list[str], hooks: list[str]) -> None:
    store = ActivationStore(model, hooks, docs, context_size=32, batch_size=4, out_batch_size=50, shuffle=False)
    batches = list(store)
    got = {h: torch.cat([b[h] for b in batches]) for h in hooks}
    tokens = expected_windows(model, docs, 32)
    _, cache = model.run_with_cache(tokens, names_filter=hooks)  # the whole forward, no early stop
    for h in hooks:
        want = cache[h].reshape(tokens.numel(), -1)
        assert got[h].shape == want.shape, h
        torch.testing.assert_close(got[h], want, rtol=1e-6, atol=1e-6)
    if "blocks.0.attn.hook_z" in hooks:
        assert (
            store.stop_at_layer is None and store.d_in["blocks.0.attn.hook_z"] == model.cfg.n_heads * model.cfg.d_head
        )
    assert ActivationStore(model, HOOK, docs).stop_at_layer == 1  # resid_pre 1: what stop_at_layer=1 returns
    assert ActivationStore(model, [HOOK, "blocks.0.hook_mlp_out"], docs).stop_at_layer == 1
    assert ActivationStore(model, [HOOK, "blocks.1.hook_mlp_out"], docs).stop_at_layer == 2


def test_shuffled_store_is_a_permutation_of_the_same_rows(model: GPT, docs: list[str]) -> None:
    kw = dict(context_size=32, batch_size=2, out_batch_size=40, buffer_rows=256)
    plain = torch.cat(list(ActivationStore(model, HOOK, docs, shuffle=False, **kw)))  # type: ignore[arg-type]
    mixed = torch.cat(list(ActivationStore(model, HOOK, docs, shuffle=True, **kw)))  # type: ignore[arg-type]
    assert mixed.shape == plain.shape
    assert not torch.equal(mixed, plain)
    assert np.array_equal(rows_sorted(mixed), rows_sorted(plain))
    again = torch.cat(list(ActivationStore(model, HOOK, docs, shuffle=True, **kw)))  # type: ignore[arg-type]
    assert torch.equal(again, mixed)  # seeded


def test_the_buffer_never_holds_more_than_its_row_limit(model: GPT, docs: list[str]) -> None:
    store = ActivationStore(model, HOOK, docs, context_size=32, batch_size=2, buffer_rows=160, out_batch_size=24)
    sizes: list[int] = []
    put = store.buffer.put

    def watched(acts: dict[str, torch.Tensor]) -> None:
        put(acts)
        sizes.append(len(store.buffer))

    store.buffer.put = watched  # type: ignore[method-assign]
    n = sum(b.shape[0] for b in store)  # type: ignore[union-attr]
    assert n == expected_windows(model, docs, 32).numel() and len(sizes) > 3
    assert max(sizes) <= 160 and store.buffer.rows[HOOK].shape[0] == 160
    buf = MixingBuffer(8, {"x": 2}, torch.float32)
    buf.put({"x": torch.zeros(8, 2)})
    with pytest.raises(ValueError, match="do not fit"):
        buf.put({"x": torch.zeros(1, 2)})


# ----------------------------------------------------------------------------
# to disk
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_shard_filled_in_place_is_the_file_safetensors_writes(dtype: torch.dtype) -> None:
    rows, perm = 12, torch.randperm(12, generator=torch.Generator().manual_seed(1))
    cols = {
        "blocks.0.hook_resid_pre": torch.randn(rows, 5).to(dtype),
        "blocks.1.attn.hook_z": torch.randn(rows, 3).to(dtype),
        "tokens": torch.arange(rows, dtype=torch.int32),
        "token_index": torch.arange(rows) * 7,
    }
    shard = ShardBuffer({k: (v.dtype, tuple(v.shape[1:])) for k, v in cols.items()}, rows, perm, {"format": "x"})
    shard.add({k: v[:5] for k, v in cols.items()})
    shard.add({k: v[5:] for k, v in cols.items()})
    assert bytes(shard.view()) == save({k: v[perm] for k, v in cols.items()}, metadata={"format": "x"})
    assert all(torch.equal(shard.in_data_order()[k], v) for k, v in cols.items())


def _store(model: GPT, data: object, **kw: object) -> ActivationStore:
    args: dict = dict(context_size=32, batch_size=3) | kw
    return ActivationStore(model, HOOK, data, **args)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_harvest_writes_shards_and_a_manifest(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    m = _store(model, corpus_file, shuffle=False).harvest(
        tmp_path / "a", n_tokens=700, shard_tokens=200, progress=False
    )
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["manifest.json"] + [
        f"shard-r000-{k:06d}.safetensors" for k in range(4)
    ]
    assert [s["n_tokens"] for s in m["shards"]] == [192, 192, 192, 96] and m["n_tokens"] == 672
    assert m["d_in"] == {HOOK: 128} and m["config"]["model"]["name"] == "tiny-gpt2"
    acts = load_harvest(tmp_path / "a")
    tokens = torch.stack(list(text.TokenWindows(model.tokenizer, corpus_file, 32)))[:21]
    cache: dict[str, torch.Tensor] = {}  # a hook as the store's (a cache computes on the explicit path: hooks.py)
    model.run_with_hooks(tokens, fwd_hooks=[(HOOK, lambda x, hook: cache.update({HOOK: x.detach().clone()}))])
    torch.testing.assert_close(acts[HOOK], cache[HOOK].reshape(-1, 128), rtol=1e-6, atol=1e-6)
    assert torch.equal(acts["tokens"], tokens.flatten().int()) and torch.equal(acts["token_index"], torch.arange(672))
    mtimes = [p.stat().st_mtime_ns for p in (tmp_path / "a").iterdir()]
    assert _store(model, corpus_file, shuffle=False).harvest(tmp_path / "a", 700, 200, progress=False) == m
    assert [p.stat().st_mtime_ns for p in (tmp_path / "a").iterdir()] == mtimes  # complete: nothing rewritten


def test_harvest_killed_by_an_exception_resumes_to_the_same_bytes(
    model: GPT, corpus_file: Path, tmp_path: Path
) -> None:
    _store(model, corpus_file).harvest(tmp_path / "whole", n_tokens=900, shard_tokens=160, progress=False)

    def stop_after_two(record: dict) -> None:
        if record["index"] == 1:
            raise KeyboardInterrupt("stopped")

    with pytest.raises(KeyboardInterrupt):
        _store(model, corpus_file).harvest(tmp_path / "cut", 900, 160, progress=False, on_shard=stop_after_two)
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [
        "progress-r000.json",
        "shard-r000-000000.safetensors",
        "shard-r000-000001.safetensors",
    ]
    seen: list[int] = []
    _store(model, corpus_file).harvest(
        tmp_path / "cut", 900, 160, progress=False, on_shard=lambda r: seen.append(r["index"])
    )
    assert seen == [2, 3, 4, 5]  # only the missing shards were made
    assert _files(tmp_path / "cut") == _files(tmp_path / "whole")


KILLED = """
import os, signal, sys
from pathlib import Path
from interp_gpt import GPT
from interp_gpt.store import ActivationStore
model = GPT.from_pretrained("tiny-gpt2")
store = ActivationStore(model, "blocks.1.hook_resid_pre", Path(sys.argv[1]), context_size=32, batch_size=3)
calls = []  # 2 forwards a shard: the 8th is mid-way through shard 3 (a hook would be part of the identity)
forward = store.activations
def kill_on_the_eighth_forward(tokens):
    calls.append(1)
    if len(calls) == 8:
        os.kill(os.getpid(), signal.SIGKILL)
    return forward(tokens)
store.activations = kill_on_the_eighth_forward
store.harvest(sys.argv[2], n_tokens=900, shard_tokens=160, progress=False)
"""


def test_harvest_killed_by_sigkill_resumes_to_the_same_bytes(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", KILLED, str(corpus_file), str(tmp_path / "cut")], env=env, timeout=120)
    assert r.returncode == -signal.SIGKILL
    left = json.loads((tmp_path / "cut" / "progress-r000.json").read_text())
    done = [s["index"] for s in left["shards"]]  # shard 3 was half made; 2 may still have been on its way to disk
    assert done in ([0, 1], [0, 1, 2]) and not (tmp_path / "cut" / "manifest.json").exists()
    (tmp_path / "cut" / ".progress-r000.json.x1y2.tmp").write_text("{")  # as a kill mid-write leaves it
    _store(model, corpus_file).harvest(tmp_path / "cut", 900, 160, progress=False)
    _store(model, corpus_file).harvest(tmp_path / "whole", 900, 160, progress=False)
    assert _files(tmp_path / "cut") == _files(tmp_path / "whole")  # temporaries gone too


def test_two_process_torchrun_harvest_equals_one_process(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "interp_gpt.activation_store", "harvest", "--hook", HOOK, "--data", str(corpus_file)]
    cmd += ["--out", str(tmp_path / "two"), "--n-tokens", "1100", "--shard-tokens", "160", "--context-size", "32"]
    cmd += ["--batch-size", "3", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    names = sorted(p.name for p in (tmp_path / "two").iterdir())
    assert names == ["manifest.json"] + [f"shard-r{r:03d}-{k:06d}.safetensors" for r in (0, 1) for k in range(4)]
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert manifest["config"]["world_size"] == 2 and manifest["n_tokens"] == 34 * 32
    _store(model, corpus_file).harvest(tmp_path / "one", 1100, 160, progress=False)
    two, one = load_harvest(tmp_path / "two", sort=True), load_harvest(tmp_path / "one", sort=True)
    assert set(two) == set(one) == {HOOK, "tokens", "token_index"}
    for k in one:
        assert torch.equal(two[k], one[k]), k
    assert torch.equal(one["token_index"], torch.arange(34 * 32))


def test_cli_harvest_subcommand(corpus_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["harvest", "--hook", HOOK, "--data", str(corpus_file), "--out", str(tmp_path / "c")]
    assert cli_main(argv + ["--n-tokens", "256", "--context-size", "64", "--no-progress"]) == 0
    assert "256 tokens in 1 shards" in capsys.readouterr().out
    assert cli_main(argv + ["--n-tokens", "256", "--context-size", "32", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "context_size: 64 there, 32 here" in err


# ----------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------
def test_unknown_hook_names_suggest_close_ones(model: GPT, docs: list[str]) -> None:
    with pytest.raises(KeyError, match=r"hooks: no hook point named 'blocks.1.hook_resid_pr'.*did you mean"):
        ActivationStore(model, "blocks.1.hook_resid_pr", docs)
    with pytest.raises(KeyError, match="layers are 0..1"):
        ActivationStore(model, ["blocks.7.hook_resid_pre"], docs)
    with pytest.raises(ValueError, match="not one vector per token"):
        ActivationStore(model, "blocks.0.attn.hook_pattern", docs)
    with pytest.raises(ValueError, match=r"hooks: expected a hook name or a non-empty list"):
        ActivationStore(model, [], docs)


def test_empty_or_missing_data_is_refused(model: GPT, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data: no window of context_size=32"):
        _store(model, []).next_batch()
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="data: no window"):
        _store(model, tmp_path / "empty.txt").harvest(tmp_path / "out", 64, 64, progress=False)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="holds no .txt file"):
        _store(model, tmp_path / "folder")
    with pytest.raises(FileNotFoundError, match="neither a file nor a folder"):
        _store(model, tmp_path / "nope.txt")
    with pytest.raises(TypeError, match="data: item 1 is a int"):
        _store(model, ["text", 3]).next_batch()


def test_context_size_over_n_ctx_is_refused(model: GPT, docs: list[str]) -> None:
    with pytest.raises(ValueError, match=r"context_size=129 is out of range: contexts of tiny-gpt2 are 2..128"):
        ActivationStore(model, HOOK, docs, context_size=129)
    with pytest.raises(ValueError, match=r"buffer_rows=10 is out of range"):
        ActivationStore(model, HOOK, docs, context_size=32, batch_size=2, buffer_rows=10)
    with pytest.raises(ValueError, match="dtype='int8'"):
        ActivationStore(model, HOOK, docs, dtype="int8")


def test_an_out_dir_with_another_harvest_or_other_files_is_refused(
    model: GPT, corpus_file: Path, tmp_path: Path
) -> None:
    _store(model, corpus_file).harvest(tmp_path / "a", 320, 160, progress=False)
    with pytest.raises(ValueError, match=r"different configuration \(seed: 0 there, 1 here\)"):
        _store(model, corpus_file, seed=1).harvest(tmp_path / "a", 320, 160, progress=False)
    with pytest.raises(ValueError, match="n_tokens: 320 there, 640 here"):
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"not empty and holds no harvest \(found notes.txt\)"):
        _store(model, corpus_file).harvest(tmp_path / "b", 320, 160, progress=False)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["notes.txt"]


def test_resuming_with_other_text_is_refused(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    def stop(record: dict) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _store(model, corpus_file).harvest(tmp_path / "a", 900, 160, progress=False, on_shard=stop)
    other = tmp_path / "wp.txt"  # same name and size, other words
    other.write_text(corpus_file.read_text().replace("the", "teh"))
    with pytest.raises(ValueError, match="data: the text differs"):
        _store(model, other).harvest(tmp_path / "a", 900, 160, progress=False)


def test_ranks_of_the_in_memory_store_split_the_windows(model: GPT, docs: list[str]) -> None:
    kw: dict = dict(context_size=32, batch_size=2, out_batch_size=32, shuffle=False)
    whole = torch.cat(list(ActivationStore(model, HOOK, docs, **kw))).view(-1, 32, 128)  # [window, pos, d]
    parts = [torch.cat(list(ActivationStore(model, HOOK, docs, rank=r, world_size=2, **kw))) for r in (0, 1)]
    assert torch.equal(parts[0].view(-1, 32, 128), whole[0::2]) and torch.equal(parts[1].view(-1, 32, 128), whole[1::2])
    with pytest.raises(ValueError, match="rank=2 is out of range"):
        ActivationStore(model, HOOK, docs, rank=2, world_size=2)


def test_the_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    body = readme.split("\n## Activation store\n", 1)[1].split("\n## ", 1)[0]
    code = body.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "data").symlink_to(ROOT / "data")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md (Activation store)", "exec"), namespace)
    assert namespace["x"].shape == (1024, 128)
    assert namespace["manifest"]["n_tokens"] == 8192 and len(namespace["manifest"]["shards"]) == 2
    assert namespace["acts"][HOOK].shape == (8192, 128)
    assert torch.equal(namespace["acts"]["token_index"], torch.arange(8192))
