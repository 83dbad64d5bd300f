"""scripts/port_rate.py's pieces: the import rewrite a user makes, the cell split, the output comparison.

(The measurement itself needs transformer-lens 3.9 and the notebooks' sources: see the script.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("port_rate", ROOT / "scripts" / "port_rate.py")
assert _spec is not None and _spec.loader is not None
port_rate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(port_rate)


def _bound(code: str) -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(code, namespace)
    return {k: v for k, v in namespace.items() if k != "__builtins__"}


def test_the_import_rewrite_binds_every_name_from_interp_gpt() -> None:
    import interp_gpt
    import interp_gpt.hooks
    import interp_gpt.utils

    cell = (
        "import os\n"
        "import transformer_lens.utils as utils\n"
        "from transformer_lens.hook_points import (\n"
        "    HookPoint,\n"
        ")  # Hooking utilities\n"
        "from transformer_lens import HookedTransformer, HookedTransformerConfig, FactoredMatrix, ActivationCache\n"
        "if True:\n"
        "    from transformer_lens import evals\n"
        "x = 1\n"
    )
    ported = port_rate.port_imports(cell)
    assert "transformer_lens" not in ported.replace("as transformer_lens", "")
    assert ported.splitlines()[-1] == "x = 1" and ported.splitlines()[0] == "import os"
    names = _bound(ported)
    assert names["HookedTransformer"] is interp_gpt.GPT and names["HookedTransformerConfig"] is interp_gpt.Config
    assert names["utils"] is interp_gpt.utils and names["evals"] is interp_gpt.evals
    assert names["HookPoint"] is interp_gpt.hooks.HookPoint
    assert names["FactoredMatrix"] is interp_gpt.FactoredMatrix
    assert names["ActivationCache"] is interp_gpt.ActivationCache


def test_the_import_rewrite_leaves_other_imports_and_names_alone() -> None:
    cell = "import json, transformer_lens\nfrom json import dumps as transformer_lens_dumps\n"
    assert (
        port_rate.port_imports(cell)
        == "import json, interp_gpt as transformer_lens\nfrom json import dumps as transformer_lens_dumps\n"
    )


def test_the_hub_loads_become_the_offline_stand_in_on_both_sides() -> None:
    code = 'model = HookedTransformer.from_pretrained("gpt2-small", device=device)\ncfg = Cfg(tokenizer_name="EleutherAI/gpt-neox-20b")'
    assert port_rate.offline(code) == (
        'model = _offline_model(HookedTransformer, True, "gpt2-small", device=device)\n'
        "cfg = Cfg(tokenizer_name=_OFFLINE_TOKENIZER)"
    )


def test_a_percent_script_splits_at_its_markers() -> None:
    text = "# %%\nimport os\n\n# %% 1 INTRO\nx = 1\n# %%\n\n# %%\ny = 2\n"
    assert port_rate.percent_cells(text) == ["\nimport os\n\n", "\nx = 1\n", "\ny = 2\n"]


def test_outputs_match_to_the_last_digits_and_no_further() -> None:
    same = port_rate.same_output
    assert same("Model loss: tensor(10.9241)\n", "Out[3]: Model loss: tensor(10.9243)\n")
    assert same("<object at 0x7f00aa>", "<object at 0x7f11bb>")
    assert not same("Model loss: tensor(10.9241)", "Model loss: tensor(10.9841)")
    assert not same("blocks.0.ln1.hook_scale", "blocks.0.attn.hook_q")
    assert not same("a 1 b", "a 1 b 2")
    assert "10.9841" in port_rate.first_difference("x\nloss 10.9241", "x\nloss 10.9841")
