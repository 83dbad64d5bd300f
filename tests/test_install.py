"""A core install (`pip install interp-gpt`, no extras) is complete and quiet.

The core dependencies hold what importing the package needs (numpy included: torch imports
it and warns "Failed to initialize NumPy" without it), and the core path - import, load the
shipped model, run it - never touches the heavy `compare` extra. CI also builds a real
core-only venv and runs the same line there (`.ci/run`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("transformers", "transformer_lens")


def _core_dependencies() -> list[str]:
    """`[project] dependencies` of pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # 3.10: the list is simple enough to read by hand
        project = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
        block = project.split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
        lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
        return [line.strip(",").strip().strip("\"'") for line in lines if line]
    return list(tomllib.loads(text)["project"]["dependencies"])


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement ("NumPy>=1.24" -> "numpy")."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def test_core_dependencies_include_numpy_and_leave_out_the_references():
    deps = {_name(req): req for req in _core_dependencies()}
    assert "numpy" in deps, sorted(deps)
    assert re.fullmatch(r"numpy\s*>=\s*1\.24", deps["numpy"]), deps["numpy"]
    assert {"torch", "tokenizers", "safetensors"} <= set(deps)
    assert not {"transformer-lens", "transformers"} & set(deps), sorted(deps)


# Runs before anything else in the child: a finder that refuses the heavy extras and notes
# every attempt, so a core-path import of them shows even if the caller caught the error.
_PRELUDE = f"""
import sys
tried = []
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            tried.append(name)
            raise ImportError(name + " is not part of a core install")
        return None
sys.meta_path.insert(0, Refuse())
import interp_gpt
logits = interp_gpt.GPT.from_pretrained("tiny-gpt2")("hi")
assert not tried, "the core path tried to import " + repr(tried)
print("logits", logits.ndim, logits.shape[-1], bool(logits.isfinite().all()))
"""


def test_the_core_path_is_quiet_under_warnings_as_errors_and_never_imports_the_references():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _PRELUDE], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    # [batch, pos, d_vocab] logits over the shipped model's 2048-token vocabulary, all finite
    assert done.stdout.split() == ["logits", "3", "2048", "True"], done.stdout
