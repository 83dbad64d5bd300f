"""Failed saves: every file interp_gpt writes goes through files.py, whole or not at all, so a
save that fails part-way (an exception, a full disk) leaves the old files byte-identical and
loadable with no temporary file behind, and a two-file save cut off between its files is
refused when loaded, never read as a mix of old and new.

Checkpoints have their own cases in test_bad_loading.py; here: pages (`save_html`, and
`interp-gpt attention --out`) and tokenizers (`Tokenizer.save`)."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import plotly.graph_objects as go
import pytest

from interp_gpt.cli import main
from interp_gpt.plots import save_html
from interp_gpt.tokenizer import Tokenizer, char_tokenizer

SHIPPED = Path(__file__).resolve().parents[1] / "interp_gpt" / "weights" / "tiny-gpt2"


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in `folder` (temporaries included: their names start with a dot) and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _disk_full_after(monkeypatch: pytest.MonkeyPatch, n_ok: int) -> list[str]:
    """Let the first `n_ok` file writes through; each later one writes half its data and then
    fails as a full disk does. Returns the names of the files it was asked to write."""
    asked: list[str] = []
    write_text, write_bytes = Path.write_text, Path.write_bytes

    def half_then_full(self: Path, data, *args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(self.name)
        write = write_text if isinstance(data, str) else write_bytes
        if len(asked) <= n_ok:
            return write(self, data, *args, **kwargs)
        write(self, data[: len(data) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full)
    monkeypatch.setattr(Path, "write_bytes", half_then_full)
    return asked


def _full_disk_in_a_child(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `command` with writes past 4 KiB failing (RLIMIT_FSIZE, SIGXFSZ ignored: EFBIG), as on a full disk."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited through exec: a write fails, no signal kills
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, preexec_fn=limit, env=env)


def _figure(title: str) -> go.Figure:
    return go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]), layout={"title": title})


# ----------------------------------------------------------------------------
# Pages
# ----------------------------------------------------------------------------
def test_a_failed_page_write_leaves_the_old_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = save_html(_figure("old"), tmp_path / "page.html")
    before = _snapshot(tmp_path)
    asked = _disk_full_after(monkeypatch, 0)
    with pytest.raises(
        OSError, match=r"page\.html: could not be written \(No space left on device\); it is as it was"
    ) as err:
        save_html(_figure("new"), page)
    assert err.value.errno == errno.ENOSPC
    assert asked and asked[0].startswith(".page.html.")  # it wrote a temporary, never the page itself
    assert _snapshot(tmp_path) == before  # the old page, byte for byte, and nothing else
    assert '"text":"old"' in page.read_text(encoding="utf-8") and page.read_text().rstrip().endswith("</html>")


def test_a_failed_write_of_a_new_page_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _disk_full_after(monkeypatch, 0)
    with pytest.raises(OSError, match="No space"):
        save_html(_figure("new"), tmp_path / "sub" / "page.html")
    assert list((tmp_path / "sub").iterdir()) == []


def test_attention_out_on_a_full_disk_is_one_line_and_status_2(tmp_path: Path) -> None:
    """The real command in a child process whose writes fail past 4 KiB (the page is ~4 MB)."""
    page = tmp_path / "attention.html"
    page.write_text("<html>the old page</html>\n")
    before = _snapshot(tmp_path)
    cmd = [sys.executable, "-m", "interp_gpt.cli", "attention", "tiny-gpt2", "hi there", "--out", str(page)]
    done = _full_disk_in_a_child(cmd)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert f"{page}: could not be written" in lines[0] and "File too large" in lines[0]
    assert _snapshot(tmp_path) == before


def test_attention_out_failing_in_process_is_one_line_and_status_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "attention.html"
    page.write_text("<html>the old page</html>\n")
    before = _snapshot(tmp_path)
    _disk_full_after(monkeypatch, 0)
    assert main(["attention", "tiny-gpt2", "hi there", "--out", str(page)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"{page}: could not be written" in err, err
    assert _snapshot(tmp_path) == before


# ----------------------------------------------------------------------------
# Tokenizers: two files, pinned together by the sha256 of tokenizer.json
# ----------------------------------------------------------------------------
@pytest.fixture
def old_and_new(tmp_path: Path) -> tuple[Path, Tokenizer, Tokenizer]:
    """A folder holding a saved tokenizer, the old one, and another to save over it."""
    old, new = char_tokenizer("abcdefgh", name="old"), char_tokenizer("hgfedcba", name="new")
    return old.save(tmp_path / "tok"), old, new


def _assert_is(folder: Path, tok: Tokenizer) -> None:
    loaded = Tokenizer.load(folder)
    assert loaded.name == tok.name and loaded.encode("abch") == tok.encode("abch")


def test_a_save_failing_in_its_first_file_leaves_the_old_tokenizer(
    old_and_new: tuple[Path, Tokenizer, Tokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, old, new = old_and_new
    before = _snapshot(folder)
    asked = _disk_full_after(monkeypatch, 0)
    with pytest.raises(OSError, match="No space"):
        new.save(folder)
    assert asked[0].startswith(".tokenizer.json.")  # tokenizer.json goes first
    assert _snapshot(folder) == before
    monkeypatch.undo()
    _assert_is(folder, old)


def test_a_save_cut_off_between_its_two_files_is_refused_at_load(
    old_and_new: tuple[Path, Tokenizer, Tokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new tokenizer.json is in place and the sidecar's write fails: the old sidecar's
    bos/eos/pad ids and alphabet must not load with the new vocabulary."""
    folder, old, new = old_and_new
    old_sidecar = (folder / "interp_gpt_tokenizer.json").read_bytes()
    _disk_full_after(monkeypatch, 1)
    with pytest.raises(OSError, match="No space"):
        new.save(folder)
    monkeypatch.undo()
    assert sorted(_snapshot(folder)) == ["interp_gpt_tokenizer.json", "tokenizer.json"]  # no temporary
    assert (folder / "interp_gpt_tokenizer.json").read_bytes() == old_sidecar
    with pytest.raises(ValueError, match=r"tokenizer\.json' is not the tokenizer\.json that .*interrupted save"):
        Tokenizer.load(folder)
    new.save(folder)  # saving again mends it
    _assert_is(folder, new)


def test_a_sidecar_from_before_digests_loads_and_goes_first_when_saved_over(
    old_and_new: tuple[Path, Tokenizer, Tokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder saved before sidecars carried the digest still loads. Saving over it writes the
    (new, digest-carrying) sidecar first, so a save cut off after it is refused, never a mix."""
    folder, old, new = old_and_new
    sidecar = folder / "interp_gpt_tokenizer.json"
    legacy = {k: v for k, v in json.loads(sidecar.read_text()).items() if k != "tokenizer_json_sha256"}
    sidecar.write_text(json.dumps(legacy, indent=2))
    _assert_is(folder, old)
    before = _snapshot(folder)

    asked = _disk_full_after(monkeypatch, 0)  # the first write fails: nothing changed
    with pytest.raises(OSError):
        new.save(folder)
    assert asked[0].startswith(".interp_gpt_tokenizer.json.")
    assert _snapshot(folder) == before
    monkeypatch.undo()
    _assert_is(folder, old)

    _disk_full_after(monkeypatch, 1)  # the second (tokenizer.json) fails: refused
    with pytest.raises(OSError):
        new.save(folder)
    monkeypatch.undo()
    assert (folder / "tokenizer.json").read_bytes() == before["tokenizer.json"]
    with pytest.raises(ValueError, match="interrupted save"):
        Tokenizer.load(folder)


def test_a_tokenizer_json_edited_after_the_save_is_refused_naming_it(
    old_and_new: tuple[Path, Tokenizer, Tokenizer],
) -> None:
    folder, _, new = old_and_new
    (folder / "tokenizer.json").write_bytes(new.backend.to_str(pretty=True).encode())
    with pytest.raises(ValueError, match=rf"{str(folder / 'tokenizer.json')!r} is not the tokenizer\.json that"):
        Tokenizer.load(folder)


def test_a_full_disk_in_another_process_leaves_the_old_tokenizer(
    old_and_new: tuple[Path, Tokenizer, Tokenizer],
) -> None:
    """The shipped tokenizer's tokenizer.json (~120 KB) saved over a char tokenizer with writes past 4 KiB failing."""
    folder, old, _ = old_and_new
    before = _snapshot(folder)
    script = textwrap.dedent(
        f"""
        import sys
        from interp_gpt.tokenizer import Tokenizer
        try:
            Tokenizer.load({str(SHIPPED)!r}).save({str(folder)!r})
        except OSError as e:
            print("failed:", e)
            sys.exit(0)
        sys.exit("the save did not fail")
        """
    )
    done = _full_disk_in_a_child([sys.executable, "-c", script])
    assert done.returncode == 0 and "File too large" in done.stdout, done.stdout + done.stderr
    assert _snapshot(folder) == before
    _assert_is(folder, old)
