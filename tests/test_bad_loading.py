"""Bad checkpoints and failed saves: a clear CheckpointError naming the file, field or tensor,
never a model that computes something else, and never a half-written folder."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT, CheckpointError, from_pretrained_no_processing, save_hf_checkpoint
from interp_gpt.files import atomic_path, write_atomic

GOOD_CONFIG = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "vocab_size": 100,
    "n_positions": 32,
    "layer_norm_epsilon": 1e-5,
}


@pytest.fixture
def folder(hf_checkpoint_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the random HF GPT-2 checkpoint (config.json + model.safetensors)."""
    out = tmp_path / "ckpt"
    out.mkdir()
    for f in ("config.json", "model.safetensors"):
        (out / f).write_bytes((hf_checkpoint_dir / f).read_bytes())
    return out


def _set_config(folder: Path, text: str) -> None:
    (folder / "config.json").write_text(text)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"n_head": 0}, "n_head"),
        ({"n_layer": "2"}, "n_layer"),
        ({"n_layer": 2.5}, "n_layer"),
        ({"n_embd": True}, "n_embd"),
        ({"n_positions": None}, "n_positions"),
        ({"layer_norm_epsilon": -1e-5}, "layer_norm_epsilon"),
        ({"layer_norm_epsilon": float("nan")}, "layer_norm_epsilon"),
        ({"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon"),
        ({"vocab_size": -3}, "vocab_size"),
        ({"n_inner": 0}, "n_inner"),
        ({"activation_function": "swish"}, "activation_function"),
        ({"n_head": 5}, "n_head"),  # 64 is not divisible by 5
    ],
)
def test_a_nonsense_config_field_is_refused_by_name(folder: Path, change: dict, field: str) -> None:
    cfg = {**json.loads((folder / "config.json").read_text()), **change}
    if change.get("n_positions", 0) is None:
        cfg.pop("n_ctx", None)  # no context length at all
    _set_config(folder, json.dumps(cfg))  # json writes NaN as NaN, which Python's reader takes back
    with pytest.raises(CheckpointError, match=field):
        from_pretrained_no_processing(folder, tokenizer=None)


@pytest.mark.parametrize("text, what", [("[1, 2]", "JSON object"), ("{not json", "not valid JSON"), ("", "JSON")])
def test_a_config_json_that_is_not_an_object_is_refused_naming_the_file(folder: Path, text: str, what: str) -> None:
    _set_config(folder, text)
    with pytest.raises(CheckpointError, match=what) as err:
        from_pretrained_no_processing(folder, tokenizer=None)
    assert "config.json" in str(err.value)


def test_a_config_that_lies_about_a_size_is_refused_before_anything_that_size_is_allocated(folder: Path) -> None:
    """10^9 positions of d_model 64 would be 256 GB: allocating it first fails with a RuntimeError
    (or takes the machine); checking first gives a CheckpointError naming the tensor."""
    cfg = json.loads((folder / "config.json").read_text())
    _set_config(folder, json.dumps({**cfg, "n_positions": 10**9, "vocab_size": 10**9}))
    with pytest.raises(CheckpointError, match=r"wpe\.weight.*expected \(1000000000, 64\)"):
        from_pretrained_no_processing(folder, tokenizer=None)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_weight_is_refused_naming_the_tensor(hf_gpt2_factory, tmp_path: Path, value: float) -> None:
    hf = hf_gpt2_factory(seed=3)
    with torch.no_grad():
        hf.transformer.h[1].mlp.c_fc.weight[3, 5] = value
    hf.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"blocks\.1\.mlp\.W_in.*non-finite"):
        GPT.from_pretrained(tmp_path, tokenizer=None)
    with pytest.warns(UserWarning, match=r"blocks\.1\.mlp\.W_in"):
        model = from_pretrained_no_processing(tmp_path, tokenizer=None, allow_non_finite=True)
    assert not math.isfinite(model.blocks[1].mlp.W_in[3, 5].item())


@pytest.mark.parametrize("size", [0, 7, "half"])
def test_an_empty_or_truncated_safetensors_file_is_refused_naming_it(folder: Path, size: int | str) -> None:
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if size == "half" else data[: int(size)])
    with pytest.raises(CheckpointError, match="model.safetensors") as err:
        from_pretrained_no_processing(folder, tokenizer=None)
    assert "truncated" in str(err.value)


# ----------------------------------------------------------------------------
# Saving: whole or not at all
# ----------------------------------------------------------------------------
def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_save_whose_weights_write_fails_leaves_the_old_folder_as_it_was(
    folder: Path, tiny_model: GPT, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors.torch

    before = _snapshot(folder)

    def half_then_disk_full(tensors, filename, metadata=None):  # type: ignore[no-untyped-def]
        Path(filename).write_bytes(b"\0" * 1000)  # part of a file, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_disk_full)
    with torch.no_grad():
        tiny_model.unembed.b_U.zero_()
    with pytest.raises(OSError, match="No space"):
        save_hf_checkpoint(tiny_model, folder)
    assert _snapshot(folder) == before  # same files, same bytes, no temporary left behind
    from_pretrained_no_processing(folder, tokenizer=None)  # and it still loads


def test_a_save_cut_off_between_its_two_files_is_refused_at_load(
    folder: Path, tiny_model: GPT, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New weights in place, the config's write fails: the folder must not load as a mix."""
    import interp_gpt.loading as loading

    with torch.no_grad():
        tiny_model.unembed.b_U.zero_()
    tiny_model.cfg.layer_norm_eps = 1e-3  # the new config differs from the old one
    old_config = (folder / "config.json").read_bytes()

    def fail(path, data, encoding="utf-8"):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(loading, "write_atomic", fail)
    with pytest.raises(OSError):
        save_hf_checkpoint(tiny_model, folder)
    assert (folder / "config.json").read_bytes() == old_config
    with pytest.raises(CheckpointError, match="interrupted save"):
        from_pretrained_no_processing(folder, tokenizer=None)
    monkeypatch.undo()
    save_hf_checkpoint(tiny_model, folder)  # saving again mends it
    assert from_pretrained_no_processing(folder, tokenizer=None).cfg.layer_norm_eps == 1e-3


def test_a_full_disk_in_another_process_leaves_the_old_checkpoint_loadable(folder: Path, tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes every write past 4 KiB fail (EFBIG), as a full disk would, in a child process."""
    before = _snapshot(folder)
    script = textwrap.dedent(
        f"""
        import resource, signal, sys, torch
        from interp_gpt import GPT, Config, save_hf_checkpoint
        model = GPT(Config(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            save_hf_checkpoint(model, {str(folder)!r})
        except OSError as e:
            print("failed:", e)
            sys.exit(0)
        sys.exit("the save did not fail")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "model.safetensors: could not be written" in done.stdout, done.stdout + done.stderr
    assert _snapshot(folder) == before
    from_pretrained_no_processing(folder, tokenizer=None)


def test_atomic_path_replaces_only_on_success_and_keeps_permissions(tmp_path: Path) -> None:
    target = tmp_path / "page.html"
    write_atomic(target, "old")
    target.chmod(0o640)
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("the writer broke")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o640
    with pytest.raises(TypeError, match="data"):
        write_atomic(target, 3)  # type: ignore[arg-type]
    with pytest.raises(IsADirectoryError, match="folder"):
        write_atomic(tmp_path, "x")
    with pytest.raises(OSError, match=r"page\.html: could not be written \(No space left on device\)") as err:
        with atomic_path(target) as tmp:
            raise OSError(28, "No space left on device", str(tmp))  # a writer that names only its temporary
    assert err.value.errno == 28 and target.read_bytes() == b"new"


def test_warnings_filter_is_quiet_on_a_good_checkpoint(folder: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_pretrained_no_processing(folder, tokenizer=None)


@pytest.mark.parametrize("dtype", [torch.int64, "float8", "int32"])
def test_a_dtype_that_is_not_a_float_dtype_is_refused_by_name(folder: Path, dtype: object) -> None:
    with pytest.raises(TypeError, match="dtype="):
        from_pretrained_no_processing(folder, tokenizer=None, dtype=dtype)
