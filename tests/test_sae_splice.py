"""Splicing SAEs into the model: the error term, plain substitution, hook names, removal, bad input.

The comparison with sae-lens' HookedSAETransformer needs sae-lens (transformer-lens < 4): CI's
transformer-lens 3.9 venv (.venv-tl3) runs it; elsewhere it skips and says so.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch
from conftest import TINY

from interp_gpt import GPT, Config
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.splice import SplicedHookPoint

try:
    import sae_lens
except ImportError:  # sae-lens needs transformer-lens < 4
    sae_lens = None

HOOK = "blocks.1.hook_resid_pre"
FEATS = HOOK + ".hook_sae_acts_post"
SAE_HOOKS = ["hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_output"]


def make_sae(hook: str = HOOK, d_in: int = 64, d_sae: int = 96, seed: int = 0, **kw: object) -> SAE:
    sae = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, metadata={"hook_name": hook}, **kw))  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.2 if name.startswith("W") else 0.05))
    return sae


def downstream(name: str) -> bool:
    """Hooks the SAE at blocks.1.hook_resid_pre can change: layer 1's and everything after the blocks."""
    return name.startswith("blocks.1.") or not name.startswith(("blocks.0.", "hook_"))


@pytest.mark.parametrize("arch", ["standard", "topk", "jumprelu"])
def test_with_error_term_every_downstream_hook_and_the_logits_are_unchanged(
    tiny_model: GPT, tiny_tokens: torch.Tensor, arch: str
) -> None:
    sae = make_sae(architecture=arch, **({"k": 8} if arch == "topk" else {}))  # type: ignore[arg-type]
    logits, cache = tiny_model.run_with_cache(tiny_tokens)
    with tiny_model.saes([sae], use_error_term=True):
        spliced_logits, spliced = tiny_model.run_with_cache(tiny_tokens)
        plain_logits = tiny_model(tiny_tokens)  # no hooks on the SAE: the clean pass is reused
    assert any(downstream(n) for n in cache.keys())
    for name in cache.keys():
        torch.testing.assert_close(spliced[name], cache[name], atol=1e-5, rtol=1e-5, msg=name)
    torch.testing.assert_close(spliced_logits, logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(plain_logits, tiny_model(tiny_tokens))  # bit for bit while nothing touches the features
    # ... while the features are computed, and they are the SAE's.
    with torch.no_grad():
        torch.testing.assert_close(spliced[FEATS], sae.encode(cache[HOOK]))
    assert spliced[FEATS].shape == (*tiny_tokens.shape, 96) and (spliced[FEATS] > 0).any()
    recons = spliced[HOOK + ".hook_sae_recons"]
    torch.testing.assert_close(spliced[HOOK + ".hook_sae_error"], cache[HOOK] - recons, atol=1e-6, rtol=1e-6)
    assert (recons - cache[HOOK]).abs().max() > 0.1  # a bad reconstruction: the error term does the work


def test_without_error_term_output_equals_a_manual_substitution(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    sae = make_sae()
    with torch.no_grad():
        manual = tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[(HOOK, lambda x, hook: sae.decode(sae.encode(x)))])
        tiny_model.add_sae(sae)
        try:
            spliced = tiny_model(tiny_tokens)
        finally:
            tiny_model.reset_saes()
        assert torch.equal(spliced, manual)
        assert (spliced - tiny_model(tiny_tokens)).abs().max() > 1e-2  # the SAE did change the output


def test_ablating_a_feature_with_the_error_term_changes_the_output_by_its_decoder_row(
    tiny_model: GPT, tiny_tokens: torch.Tensor
) -> None:
    sae = make_sae()
    with torch.no_grad():
        _, cache = tiny_model.run_with_cache_with_saes(tiny_tokens, saes=[sae], use_error_term=True)
        feature = int(cache[FEATS].sum((0, 1)).argmax())

        def ablate(acts: torch.Tensor, hook: object) -> None:
            acts[..., feature] = 0.0

        def capture(x: torch.Tensor, hook: object) -> None:
            seen.append(x.clone())

        seen: list[torch.Tensor] = []
        tiny_model.run_with_hooks_with_saes(
            tiny_tokens,
            saes=[sae],
            use_error_term=True,
            fwd_hooks=[(FEATS, ablate), (HOOK + ".hook_sae_output", capture)],
        )
    want = cache[HOOK] - cache[FEATS][..., feature, None] * sae.W_dec[feature]
    torch.testing.assert_close(seen[0], want, atol=1e-5, rtol=1e-5)


def test_hook_names_appear_while_spliced_and_go_after(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    names_before = list(tiny_model.hook_dict)
    state_before = set(tiny_model.state_dict())
    sae = make_sae()
    with tiny_model.saes(sae, use_error_term=True):
        spliced_names = [n for n in tiny_model.hook_dict if n.startswith(HOOK + ".")]
        assert spliced_names == [HOOK + "." + n for n in SAE_HOOKS[:4] + ["hook_sae_error", "hook_sae_output"]]
        assert tiny_model.acts_to_saes == {HOOK: sae}
        assert set(tiny_model.state_dict()) == state_before  # the SAE's parameters are not the model's
        assert tiny_model.hook_dict[FEATS].name == FEATS
        _, cache = tiny_model.run_with_cache(tiny_tokens, names_filter=lambda n: "hook_sae" in n)
        assert list(cache.keys()) == spliced_names  # in the order of the pass
    with tiny_model.saes([sae]):  # no error term: no error hook
        assert HOOK + ".hook_sae_error" not in tiny_model.hook_dict
    assert list(tiny_model.hook_dict) == names_before and tiny_model.acts_to_saes == {}
    assert not isinstance(tiny_model.hook_dict[HOOK], SplicedHookPoint)
    assert sae.hook_sae_acts_post.name == "hook_sae_acts_post"


def test_hooks_on_the_spliced_point_survive_and_run_first(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    seen: list[str] = []
    tiny_model.add_hook(HOOK, lambda x, hook: seen.append("model") or None)
    sae = make_sae()
    try:
        with tiny_model.saes([sae]):
            with tiny_model.hooks(fwd_hooks=[(HOOK + ".hook_sae_input", lambda x, hook: seen.append("sae") or None)]):
                tiny_model(tiny_tokens)
        assert seen == ["model", "sae"]
        tiny_model(tiny_tokens)
        assert seen[-1] == "model"  # the model's hook is still there after the SAE went
    finally:
        tiny_model.reset_hooks()


def test_saes_are_removed_even_when_the_forward_raises(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    old, new = make_sae(seed=1), make_sae(seed=2)
    tiny_model.add_sae(old)

    def boom(x: torch.Tensor, hook: object) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with tiny_model.saes([new, make_sae("blocks.0.hook_mlp_out")], use_error_term=True):
            assert tiny_model.acts_to_saes[HOOK] is new
            tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[(FEATS, boom)])
    assert tiny_model.acts_to_saes == {HOOK: old}  # the displaced SAE is back, the other gone
    assert not tiny_model.hook_dict[HOOK].use_error_term  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="boom"):
        tiny_model.run_with_hooks_with_saes(
            tiny_tokens, saes=[make_sae("blocks.0.hook_resid_post")], fwd_hooks=[(FEATS, boom)]
        )
    assert list(tiny_model.acts_to_saes) == [HOOK]
    tiny_model.reset_saes()
    assert tiny_model.acts_to_saes == {}
    assert all(not hp.fwd_hooks for hp in tiny_model.hook_dict.values())


def test_patching_sweeps_and_gradients_reach_the_features(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    pd = pytest.importorskip("pandas")
    from interp_gpt.patching import generic_activation_patch

    sae = make_sae()
    clean, corrupted = tiny_tokens[:1], tiny_tokens[1:]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, 3] - logits[0, -1, 5]

    def setter(acts: torch.Tensor, index: list[int], clean_acts: torch.Tensor) -> torch.Tensor:
        acts[:, index[1], index[2]] = clean_acts[:, index[1], index[2]]
        return acts

    with tiny_model.saes([sae], use_error_term=True), torch.no_grad():
        _, clean_cache = tiny_model.run_with_cache(clean)
        rows = [(1, pos, f) for pos in (2, 6) for f in (0, 7, 40)]
        swept = generic_activation_patch(
            tiny_model, corrupted, clean_cache, metric, setter, FEATS,
            index_df=pd.DataFrame(rows, columns=["layer", "pos", "feature"]), progress=False,
        )  # fmt: skip
        one_by_one = [
            float(metric(tiny_model.run_with_hooks(corrupted, fwd_hooks=[(FEATS, lambda a, hook, r=r: setter(a, list(r), clean_cache[FEATS]))])))
            for r in rows
        ]  # fmt: skip
    torch.testing.assert_close(swept, torch.tensor(one_by_one), atol=1e-5, rtol=1e-5)
    assert swept.abs().max() > 0

    # Attribution patching's gradients: d metric / d features = d metric / d output @ W_dec.T, and the
    # error node has the output's gradient.
    with tiny_model.saes([sae], use_error_term=True):
        _, cache = tiny_model.run_with_cache(corrupted, return_type="loss", incl_bwd=True)
    g_out = cache[HOOK + ".hook_sae_output_grad"]
    torch.testing.assert_close(cache[FEATS + "_grad"], g_out @ sae.W_dec.detach().T, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(cache[HOOK + ".hook_sae_error_grad"], g_out)


def test_spliced_saes_act_in_every_thread(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    sae = make_sae()
    with torch.no_grad():
        want = tiny_model.run_with_saes(tiny_tokens, saes=[sae])
        got: list[torch.Tensor] = []
        with tiny_model.saes([sae]):
            t = threading.Thread(target=lambda: got.append(tiny_model(tiny_tokens)))
            t.start()
            t.join()
    assert torch.equal(got[0], want)


# ----------------------------------------------------------------------------
# Bad input: refused when added, by name
# ----------------------------------------------------------------------------
def test_bad_saes_are_refused_when_added(tiny_model: GPT) -> None:
    names = list(tiny_model.hook_dict)
    with pytest.raises(ValueError, match=r"d_in=32 does not fit 'blocks.1.hook_resid_pre', whose activations are 64"):
        tiny_model.add_sae(make_sae(d_in=32))
    with pytest.raises(ValueError, match=r"d_in=64 does not fit 'blocks.0.mlp.hook_post', whose activations are 256"):
        tiny_model.add_sae(make_sae("blocks.0.mlp.hook_post"))
    with pytest.raises(KeyError, match="did you mean 'blocks.1.hook_resid_pre'"):
        tiny_model.add_sae(make_sae("blocks.1.hook_resid_pr"))
    with pytest.raises(KeyError, match="layer 5 is out of range, layers are 0..1"):
        tiny_model.add_sae(make_sae("blocks.5.hook_resid_pre"))
    with pytest.raises(KeyError, match="opt-in and off: set cfg.use_hook_mlp_in=True"):
        tiny_model.add_sae(make_sae("blocks.0.hook_mlp_in"))
    with pytest.raises(ValueError, match="float64 on cpu but the model is torch.float32"):
        tiny_model.add_sae(make_sae(dtype="float64"))
    with pytest.raises(ValueError, match="no fixed width"):
        tiny_model.add_sae(make_sae("blocks.0.attn.hook_pattern"))
    with pytest.raises(ValueError, match="metadata.hook_name is not set"):
        tiny_model.add_sae(SAE(SAEConfig(d_in=64, d_sae=8)))
    with pytest.raises(TypeError, match="sae: expected an interp_gpt.sae.SAE, got dict"):
        tiny_model.add_sae({"d_in": 64})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="use_error_term: expected True or False, got 'yes'"):
        tiny_model.add_sae(make_sae(), use_error_term="yes")  # type: ignore[arg-type]
    assert list(tiny_model.hook_dict) == names  # nothing was spliced half

    sae = make_sae()
    tiny_model.add_sae(sae)
    with pytest.raises(ValueError, match="an SAE's own hook point"):
        tiny_model.add_sae(make_sae(FEATS, d_in=96))
    other = GPT(Config(**TINY))
    with pytest.raises(ValueError, match="already spliced in at 'blocks.1.hook_resid_pre'"):
        other.add_sae(sae)
    with pytest.raises(KeyError, match="no SAE is spliced in at 'blocks.0.hook_resid_pre'"):
        tiny_model.reset_saes("blocks.0.hook_resid_pre")
    tiny_model.add_sae(sae, use_error_term=True)  # the same SAE again, in place: allowed
    tiny_model.reset_saes([HOOK])
    other.add_sae(sae)  # free again once taken out
    assert other.acts_to_saes == {HOOK: sae}


def test_hook_z_and_mlp_saes_fit_their_widths(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    z_sae = make_sae("blocks.0.attn.hook_z", d_in=64, reshape_activations="hook_z")
    mlp_sae = make_sae("blocks.1.mlp.hook_post", d_in=256)
    with torch.no_grad(), tiny_model.saes([z_sae, mlp_sae], use_error_term=True):
        _, cache = tiny_model.run_with_cache(tiny_tokens)
    assert cache["blocks.0.attn.hook_z.hook_sae_acts_post"].shape == (2, 7, 96)
    assert cache["blocks.1.mlp.hook_post.hook_sae_output"].shape == (2, 7, 256)
    with pytest.raises(ValueError, match="d_in=16 does not fit 'blocks.0.attn.hook_z', whose activations are 64"):
        tiny_model.add_sae(make_sae("blocks.0.attn.hook_z", d_in=16, reshape_activations="hook_z"))


# ----------------------------------------------------------------------------
# Equal to sae-lens' own splicing
# ----------------------------------------------------------------------------
@pytest.mark.skipif(
    sae_lens is None, reason="sae-lens is not installed here; CI's transformer-lens 3.9 venv (.venv-tl3) has it"
)
@pytest.mark.parametrize("use_error_term", [False, True])
def test_splicing_equals_hooked_sae_transformer(
    tiny_model: GPT, tiny_tokens: torch.Tensor, use_error_term: bool
) -> None:
    from transformer_lens import HookedTransformerConfig

    assert sae_lens is not None
    c = tiny_model.cfg
    tl_cfg = HookedTransformerConfig(
        n_layers=c.n_layers, d_model=c.d_model, n_heads=c.n_heads, d_head=c.d_head, d_mlp=c.d_mlp,
        d_vocab=c.d_vocab, n_ctx=c.n_ctx, act_fn=c.act_fn, eps=c.eps, normalization_type="LN",
    )  # fmt: skip
    hst = sae_lens.HookedSAETransformer(tl_cfg)
    missing, unexpected = hst.load_state_dict(tiny_model.state_dict(), strict=False)
    assert not unexpected and all(k.endswith(("mask", "IGNORE")) for k in missing), (missing, unexpected)
    sae = make_sae(architecture="topk", k=10)
    twin = sae_lens.SAE.from_dict(sae.cfg.to_dict())
    twin.load_state_dict(sae.state_dict())
    with torch.no_grad():
        theirs, their_cache = hst.run_with_cache_with_saes(tiny_tokens, saes=[twin], use_error_term=use_error_term)
        ours, our_cache = tiny_model.run_with_cache_with_saes(tiny_tokens, saes=[sae], use_error_term=use_error_term)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    shared = [n for n in their_cache.keys() if "hook_sae" in n]
    assert FEATS in shared and (HOOK + ".hook_sae_error" in shared) == use_error_term
    for name in shared:
        torch.testing.assert_close(our_cache[name], their_cache[name], atol=1e-4, rtol=1e-4, msg=name)


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    body = text.split("\n## Sparse autoencoders\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", body, flags=re.S)[0].replace("/tmp/my_sae", str(tmp_path / "my_sae"))
    ns: dict = {}
    exec(compile(block, "README.md (Sparse autoencoders)", "exec"), ns)
    model, cache = ns["model"], ns["cache"]
    assert cache[ns["feats"]].shape[-1] == 1024 and ns["model"].acts_to_saes == {}
    torch.testing.assert_close(ns["logits"], model("The cat sat on the mat"), atol=1e-5, rtol=1e-5)
    assert ns["ablated"].shape == ns["logits"].shape
