"""The activation store refuses what would give a wrong harvest, by name, and never leaves a half state.

Each case asserts the error type and that the message names the argument or the field that differs:
bad arguments; a finished harvest asked for with other text; a resume or a finished harvest with
another model (a spliced SAE, a user hook, edited weights or config); a rank and world size without a
process group (refused before any write); threads (none left after a harvest returns or raises, and
20 runs of `interp-gpt harvest` all exit 0); a harvest killed by SIGKILL inside a shard write, and a
two-process gloo harvest killed and resumed, each ending byte for byte as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from interp_gpt import GPT
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.store import ActivationStore, load_harvest, text

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "corpus"
HOOK = "blocks.1.hook_resid_pre"
EARLY = "blocks.0.hook_resid_pre"  # upstream of HOOK: an SAE or a hook here changes every harvested row
STORE_THREADS = ("store-tokenizer", "harvest-writer")


@pytest.fixture
def model() -> GPT:
    """A fresh tiny-gpt2 per test: the tests splice SAEs and attach hooks."""
    return GPT.from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "wp.txt"
    path.write_text((CORPUS / "warpeace_input.txt").read_text(encoding="utf-8")[:24_000], encoding="utf-8")
    return path


def _store(model: GPT, data: object, **kw: object) -> ActivationStore:
    args: dict = dict(context_size=32, batch_size=3) | kw
    return ActivationStore(model, HOOK, data, **args)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _stop_after(index: int):  # type: ignore[no-untyped-def]
    def stop(record: dict) -> None:
        if record["index"] == index:
            raise KeyboardInterrupt("stopped")

    return stop


def _sae(seed: int = 0) -> SAE:
    sae = SAE(SAEConfig(d_in=128, d_sae=256, metadata={"hook_name": EARLY, "model_name": "tiny-gpt2"}))
    sae.init_weights(seed=seed)
    with torch.no_grad():
        sae.b_enc.fill_(0.05)
    return sae


def _store_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(STORE_THREADS)]


# ----------------------------------------------------------------------------
# bad arguments
# ----------------------------------------------------------------------------
def test_bad_harvest_arguments_are_refused_by_name(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    store = _store(model, corpus_file)
    with pytest.raises(ValueError, match=r"n_tokens=10 is out of range: n_tokens \(at least one window of 32\)"):
        store.harvest(tmp_path / "a", n_tokens=10, progress=False)
    with pytest.raises(TypeError, match="n_tokens"):
        store.harvest(tmp_path / "a", n_tokens="640", progress=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"shard_tokens=16 is out of range"):
        store.harvest(tmp_path / "a", n_tokens=640, shard_tokens=16, progress=False)
    with pytest.raises(TypeError, match="harvest: on_shard: expected a function of a shard's record, got str"):
        store.harvest(tmp_path / "a", 640, 160, progress=False, on_shard="print")  # type: ignore[arg-type]
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"out_dir: '.*file' is a file"):
        store.harvest(tmp_path / "file", 640, 160, progress=False)
    assert not (tmp_path / "a").exists()  # refused before anything was written


# ----------------------------------------------------------------------------
# 9. a finished harvest is handed back only for the same text
# ----------------------------------------------------------------------------
def test_a_finished_harvest_is_not_handed_back_for_other_text(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    manifest = _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False)
    assert _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False) == manifest
    other = tmp_path / "wp.txt"  # same name and size (the recorded file description), other words
    other.write_text(corpus_file.read_text(encoding="utf-8").replace("the", "teh"), encoding="utf-8")
    assert other.stat().st_size == corpus_file.stat().st_size
    with pytest.raises(ValueError, match=r"data: the text differs from what the finished harvest .* \(data_sha256: "):
        _store(model, other).harvest(tmp_path / "a", 640, 160, progress=False)
    # text given as strings records only "iterable: list": the text's sha256 is what tells them apart
    docs = [corpus_file.read_text(encoding="utf-8")]
    _store(model, docs).harvest(tmp_path / "b", 640, 160, progress=False)
    with pytest.raises(ValueError, match="data: the text differs from what the finished harvest"):
        _store(model, [docs[0].upper()]).harvest(tmp_path / "b", 640, 160, progress=False)
    (tmp_path / "a" / "shard-r000-000002.safetensors").unlink()
    with pytest.raises(ValueError, match=r"shards shard-r000-000002.safetensors are missing"):
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False)


def test_a_resume_on_shorter_text_is_refused(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    docs = [corpus_file.read_text(encoding="utf-8")]
    with pytest.raises(KeyboardInterrupt):
        _store(model, docs).harvest(tmp_path / "a", 900, 160, progress=False, on_shard=_stop_after(2))
    with pytest.raises(ValueError, match=r"data: the text is shorter than what the interrupted harvest .* read"):
        _store(model, [docs[0][:1000]]).harvest(tmp_path / "a", 900, 160, progress=False)
    assert not (tmp_path / "a" / "manifest.json").exists()


# ----------------------------------------------------------------------------
# 10. the model is the whole model: spliced SAEs, user hooks, weights, config
# ----------------------------------------------------------------------------
def test_a_harvest_with_an_sae_spliced_is_the_spliced_model(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    sae = _sae()
    model.add_sae(sae)
    with pytest.raises(KeyboardInterrupt):
        _store(model, corpus_file, shuffle=False).harvest(
            tmp_path / "a", 640, 160, progress=False, on_shard=_stop_after(1)
        )
    _store(model, corpus_file, shuffle=False).harvest(tmp_path / "a", 640, 160, progress=False)  # same SAE: resumes
    got = load_harvest(tmp_path / "a")
    # the reference: the plain model with the SAE's reconstruction put in by a hook
    plain = GPT.from_pretrained("tiny-gpt2")
    tokens = got["tokens"].long().view(-1, 32)
    cache: dict[str, torch.Tensor] = {}
    plain.run_with_hooks(
        tokens,
        fwd_hooks=[(EARLY, lambda x, hook: sae(x)), (HOOK, lambda x, hook: cache.__setitem__("x", x))],
    )
    torch.testing.assert_close(got[HOOK], cache["x"].reshape(-1, 128), rtol=1e-5, atol=1e-5)
    assert (got[HOOK] - plain.run_with_cache(tokens, names_filter=HOOK)[1][HOOK].reshape(-1, 128)).abs().max() > 0.1


def test_a_resume_with_another_sae_is_refused_by_name(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    model.add_sae(_sae())
    with pytest.raises(KeyboardInterrupt):
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False, on_shard=_stop_after(1))
    model.reset_saes()  # interrupted with the SAE, resumed without: half the rows would be another model's
    with pytest.raises(ValueError, match=r"saes\.blocks\.0\.hook_resid_pre: \{.*\} there, \(none\) here"):
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False)
    model.add_sae(_sae(), use_error_term=True)
    with pytest.raises(ValueError, match=r"saes\.blocks\.0\.hook_resid_pre\.use_error_term: False there, True here"):
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False)
    model.add_sae(_sae(seed=1))
    with pytest.raises(ValueError, match=r"saes\.blocks\.0\.hook_resid_pre\.weights_sha256: '\w+' there"):
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False)
    model.reset_saes()
    _store(model, corpus_file).harvest(tmp_path / "b", 320, 160, progress=False)  # finished without an SAE
    model.add_sae(_sae())
    with pytest.raises(ValueError, match=r"saes\.blocks\.0\.hook_resid_pre: \(none\) there, \{"):
        _store(model, corpus_file).harvest(tmp_path / "b", 320, 160, progress=False)


def _halve(x: torch.Tensor, hook: object) -> torch.Tensor:
    return x * 0.5


def _double(x: torch.Tensor, hook: object) -> torch.Tensor:
    return x * 2


def test_a_resume_with_other_user_hooks_is_refused_by_name(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    model.add_perma_hook(EARLY, _halve)
    with pytest.raises(KeyboardInterrupt):
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False, on_shard=_stop_after(1))
    model.reset_hooks(including_permanent=True)
    with pytest.raises(
        ValueError, match=r"user_hooks\.blocks\.0\.hook_resid_pre: \[.*_halve .*\] there, \(none\) here"
    ):
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False)
    model.add_hook(EARLY, _double)  # another function at the same point
    with pytest.raises(ValueError, match=r"user_hooks\.blocks\.0\.hook_resid_pre: \[.*_halve.*\] there, \[.*_double"):
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, progress=False)
    model.reset_hooks()
    with model.hooks(fwd_hooks=[(EARLY, _halve)]):  # the caller's own context fires in the harvest too
        seen: list[int] = []
        _store(model, corpus_file).harvest(tmp_path / "a", 640, 160, on_shard=lambda r: seen.append(r["index"]))
    assert seen == [2, 3]  # the same hook: resumed


def test_edited_weights_or_config_are_another_model(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    _store(model, corpus_file).harvest(tmp_path / "a", 320, 160, progress=False)
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0, 0, 0] += 1e-3  # same name, one weight edited
    with pytest.raises(ValueError, match=r"model\.weights_sha256: '\w+' there, '\w+' here"):
        _store(model, corpus_file).harvest(tmp_path / "a", 320, 160, progress=False)
    other = GPT.from_pretrained("tiny-gpt2")
    other.cfg.act_fn = "gelu"  # same weights, another forward
    with pytest.raises(ValueError, match=r"model\.config\.act_fn: 'gelu_new' there, 'gelu' here"):
        _store(other, corpus_file).harvest(tmp_path / "a", 320, 160, progress=False)


# ----------------------------------------------------------------------------
# 14. ranks without a process group: refused before any write
# ----------------------------------------------------------------------------
def test_a_rank_and_world_size_without_a_process_group_are_refused_first(
    model: GPT, corpus_file: Path, tmp_path: Path
) -> None:
    for _ in range(2):  # and again on a rerun: nothing was left behind
        with pytest.raises(ValueError, match=r"rank=0, world_size=2 but no torch.distributed process group"):
            _store(model, corpus_file, rank=0, world_size=2).harvest(tmp_path / "a", 640, 160, progress=False)
        assert not (tmp_path / "a").exists()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"rank=0, world_size=2 but the process group has rank 0 of 1"):
            _store(model, corpus_file, rank=0, world_size=2).harvest(tmp_path / "a", 640, 160, progress=False)
        assert not (tmp_path / "a").exists()
        assert _store(model, corpus_file).harvest(tmp_path / "a", 320, 160, progress=False)["n_tokens"] == 320
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------
# 15. threads: joined on success, error and early stop
# ----------------------------------------------------------------------------
def test_no_store_thread_outlives_a_harvest_or_a_store(model: GPT, corpus_file: Path, tmp_path: Path) -> None:
    assert _store_threads() == []
    _store(model, corpus_file).harvest(tmp_path / "a", 320, 160)  # with its progress bar
    assert _store_threads() == []  # the reader was ahead of the last window it needed
    with pytest.raises(KeyboardInterrupt):
        _store(model, corpus_file).harvest(tmp_path / "b", 640, 160, progress=False, on_shard=_stop_after(0))
    assert _store_threads() == []

    def docs() -> Iterator[object]:
        yield corpus_file.read_text(encoding="utf-8")
        yield 3  # an error in the reading thread, raised in the harvest's

    with pytest.raises(TypeError, match="data: item 1 is a int"):
        _store(model, docs()).harvest(tmp_path / "c", 1 << 20, 160, progress=False)
    assert _store_threads() == []
    with _store(model, corpus_file, out_batch_size=64) as store:  # an in-memory store left half-read
        store.next_batch()
        assert _store_threads() == ["store-tokenizer"]
    assert _store_threads() == []
    windows = iter(text.TokenWindows(model.tokenizer, corpus_file, 32))
    next(windows)
    windows.close()  # a consumer that stops early
    assert _store_threads() == []


def test_twenty_runs_of_the_harvest_command_all_exit_0(tmp_path: Path) -> None:
    data = tmp_path / "small.txt"
    data.write_text((CORPUS / "tinyshakespeare_input.txt").read_text(encoding="utf-8")[:6000], encoding="utf-8")
    script = Path(sys.executable).parent / "interp-gpt"
    cmd = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import sys; from interp_gpt.cli import main; sys.exit(main())"]
    )
    cmd += ["harvest", "--hook", HOOK, "--data", str(data), "--n-tokens", "96", "--shard-tokens", "64"]
    cmd += ["--context-size", "32", "--batch-size", "2"]  # the reader is still ahead when the harvest ends
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    runs: list[tuple[int, str, str]] = []
    for batch in range(5):  # four at a time
        procs = [
            subprocess.Popen(
                cmd + ["--out", str(tmp_path / f"out{batch}{j}")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for j in range(4)
        ]
        for p in procs:
            out, err = p.communicate(timeout=120)
            runs.append((p.returncode, out, err))
    for i, (code, out, err) in enumerate(runs):
        assert code == 0 and "96 tokens in 2 shards" in out, f"run {i}: exit {code}: {err[-2000:]}"
    assert [code for code, _, _ in runs] == [0] * 20


# ----------------------------------------------------------------------------
# kills: SIGKILL inside a shard write; a two-process gloo harvest killed and resumed
# ----------------------------------------------------------------------------
KILL_IN_A_SHARD_WRITE = """
import importlib, os, signal, sys
from contextlib import contextmanager
from pathlib import Path
from interp_gpt import GPT
from interp_gpt.store import ActivationStore
H = importlib.import_module("interp_gpt.store.harvest")
real = H.atomic_path
@contextmanager
def killing(path):
    with real(path) as tmp:
        yield tmp  # the shard's bytes are in the temporary file now, not yet under its name
        if Path(path).name == os.environ["KILL_AT"]:
            os.truncate(tmp, os.path.getsize(tmp) // 2)  # as if the disk had taken half of it
            os.kill(os.getpid(), signal.SIGKILL)
H.atomic_path = killing
model = GPT.from_pretrained("tiny-gpt2")
store = ActivationStore(model, "blocks.1.hook_resid_pre", Path(sys.argv[1]), context_size=32, batch_size=3)
store.harvest(sys.argv[2], n_tokens=900, shard_tokens=160, progress=False)
"""


def test_a_harvest_killed_inside_a_shard_write_resumes_to_the_same_bytes(
    model: GPT, corpus_file: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KILL_AT": "shard-r000-000002.safetensors", "OMP_NUM_THREADS": "1"}
    cut = tmp_path / "cut"
    r = subprocess.run([sys.executable, "-c", KILL_IN_A_SHARD_WRITE, str(corpus_file), str(cut)], env=env, timeout=120)
    assert r.returncode == -signal.SIGKILL
    left = sorted(p.name for p in cut.iterdir())
    assert [n for n in left if not n.endswith(".tmp")] == [
        "progress-r000.json",
        "shard-r000-000000.safetensors",
        "shard-r000-000001.safetensors",
    ]
    assert any(n.startswith(".shard-r000-000002.safetensors.") for n in left)  # killed mid-write
    assert [s["index"] for s in json.loads((cut / "progress-r000.json").read_text())["shards"]] == [0, 1]
    seen: list[int] = []
    _store(model, corpus_file).harvest(cut, 900, 160, progress=False, on_shard=lambda r: seen.append(r["index"]))
    assert seen == [2, 3, 4, 5]
    _store(model, corpus_file).harvest(tmp_path / "whole", 900, 160, progress=False)
    assert _files(cut) == _files(tmp_path / "whole")  # the half shard gone, every file the same bytes


GLOO_DRIVER = """
import importlib, os, signal, sys
from contextlib import contextmanager
from pathlib import Path
import torch.distributed as dist
from interp_gpt import GPT
from interp_gpt.store import ActivationStore
H = importlib.import_module("interp_gpt.store.harvest")
mode, corpus, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
model = GPT.from_pretrained("tiny-gpt2")
def harvest(folder, **kw):
    store = ActivationStore(model, "blocks.1.hook_resid_pre", corpus, context_size=32, batch_size=3, **kw)
    return store.harvest(folder, n_tokens=1100, shard_tokens=160, progress=False)
if mode == "kill":
    harvest(out / "whole")  # uninterrupted
    real = H.atomic_path
    @contextmanager
    def killing(path):
        with real(path) as tmp:
            yield tmp
            if rank == 1 and Path(path).name == "shard-r001-000001.safetensors":
                os.truncate(tmp, os.path.getsize(tmp) // 2)
                os.kill(os.getpid(), signal.SIGKILL)
    H.atomic_path = killing
    harvest(out / "cut")
elif mode == "resume":
    harvest(out / "cut")
elif mode == "misuse":
    for name, kw, folder in [("folders", {}, out / f"rank{rank}"), ("seeds", {"seed": rank}, out / "seeds")]:
        try:
            harvest(folder, **kw)
        except ValueError as e:
            print(f"{name} rank{rank}: {e}", flush=True)
dist.destroy_process_group()
"""


def _torchrun(driver: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(driver), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}  # loopback only
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_a_two_process_gloo_harvest_killed_and_resumed_equals_an_uninterrupted_one(
    corpus_file: Path, tmp_path: Path
) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(GLOO_DRIVER)
    r = _torchrun(driver, "kill", str(corpus_file), str(tmp_path))
    assert r.returncode != 0, r.stderr[-3000:]
    cut = tmp_path / "cut"
    assert not (cut / "manifest.json").exists()
    assert any(p.name.startswith(".shard-r001-000001.safetensors.") for p in cut.iterdir())  # killed mid-write
    assert [s["index"] for s in json.loads((cut / "progress-r001.json").read_text())["shards"]] == [0]
    r = _torchrun(driver, "resume", str(corpus_file), str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    whole = _files(tmp_path / "whole")
    assert sorted(whole) == ["manifest.json"] + [
        f"shard-r{r:03d}-{k:06d}.safetensors" for r in (0, 1) for k in range(4)
    ]
    assert _files(cut) == whole


def test_ranks_that_differ_or_do_not_share_the_folder_are_refused_first(corpus_file: Path, tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(GLOO_DRIVER)
    r = _torchrun(driver, "misuse", str(corpus_file), str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        assert f"folders rank{rank}: out_dir: rank 1 does not see the files rank 0 writes" in r.stdout
        assert (
            f"seeds rank{rank}: harvest: rank 1's settings differ from rank 0's (seed: 0 on rank 0, 1 on rank 1)"
            in r.stdout
        )
    assert sorted(p.name for p in (tmp_path / "rank0").iterdir()) == []  # nothing written
    assert not (tmp_path / "seeds").exists()
