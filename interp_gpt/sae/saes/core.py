"""`SAE`: a sparse autoencoder with SAELens' parameter names, architectures and numerics.

    encode:  f = act(( x - b_dec * apply_b_dec_to_input ) @ W_enc + b_enc)     # [..., d_sae]
    decode:  x_hat = f @ W_dec + b_dec                                          # [..., d_in]

for the standard SAE (act = ReLU); each other architecture (TopK, JumpReLU, ...: one small module
each in `architectures/`) changes the activation or the encode / decode. Each step passes through a hook point with sae-lens'
name: `hook_sae_input`, `hook_sae_acts_pre`, `hook_sae_acts_post`, `hook_sae_recons`,
`hook_sae_output` (and `hook_sae_error` when spliced with the error term). `splice_hooks` and
`splice_forward` are what the splicing mechanism (interp_gpt.model.splicing) asks of a module it splices in.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, cast

import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..common import NO_HOOKS, CoderHookPoints, add_hook_points, cast_state, dtype_name, hooks_of, load_built
from ..names import set_model_name
from .config import SAEConfig
from .fit import fit_hook
from .io import expected_shapes, find_release, read_sae_folder, write_sae_folder

__all__ = ["SAE"]


class SAE(CoderHookPoints, nn.Module):
    """A sparse autoencoder as sae-lens 6 builds it (StandardSAE / TopKSAE / JumpReLUSAE in one class).

    Example:
        >>> sae = SAE(SAEConfig(d_in=64, d_sae=512, metadata={"hook_name": "blocks.1.hook_resid_pre"}))
        >>> feats = sae.encode(torch.randn(2, 5, 64))      # [2, 5, 512]
        >>> sae.decode(feats).shape
        torch.Size([2, 5, 64])
        >>> paths = sae.save_model("my-sae")               # cfg.json + sae_weights.safetensors
        >>> sae = SAE.from_pretrained("my-sae")
    """

    def __init__(self, cfg: SAEConfig | dict[str, Any]):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = SAEConfig.from_dict(cfg)
        if not isinstance(cfg, SAEConfig):
            raise TypeError(f"cfg: expected an SAEConfig (or its dict), got {type(cfg).__name__}")
        if cfg.normalize_activations == "covariance_whitening":
            raise NotImplementedError(
                "normalize_activations='covariance_whitening' is not supported: fold the whitening into the "
                "weights (sae-lens' SAE.fold_activation_whitening) and save with normalize_activations='none'"
            )
        self.cfg = cfg
        self.arch = cfg.architecture_module  # the architecture's own code (interp_gpt.sae.saes.architectures)
        dtype, device = cfg.torch_dtype, torch.device(cfg.device)
        shapes = self.arch.shapes(cfg)  # the parameters (io.expected_shapes: these and the buffers)
        kept_float32 = self.arch.float32_params(cfg)
        for name, shape in shapes.items():
            if "." in name:  # a submodule's: the architecture's build registers it
                continue
            param_dtype = torch.promote_types(dtype, torch.float32) if name in kept_float32 else dtype
            self.register_parameter(name, nn.Parameter(torch.zeros(shape, dtype=param_dtype, device=device)))
        for name, (shape, buffer_dtype) in self.arch.buffers(cfg).items():  # e.g. BatchTopK's topk_threshold
            self.register_buffer(name, torch.zeros(shape, dtype=buffer_dtype, device=device))
        self.arch.build(self)
        built = {name: tuple(p.shape) for name, p in self.named_parameters()}
        if built != shapes:  # the file checks (io.expected_shapes) and the module must agree
            raise RuntimeError(f"architecture {cfg.architecture!r} built {built}, its shapes say {shapes}")
        if device.type != "meta":
            self.init_weights()
        # hook_sae_input, _output, _recons [..., d_in]; _acts_pre, _acts_post [..., d_sae]; hook_sae_error
        # [..., d_in], only spliced with use_error_term=True
        add_hook_points(self)
        self._last_state: dict[str, Any] = {}

    W_enc: nn.Parameter  # [d_in, d_sae]
    W_dec: nn.Parameter  # [d_sae, d_in]
    b_enc: nn.Parameter  # [d_sae]
    b_dec: nn.Parameter  # [d_in]

    def __getattr__(self, name: str) -> Any:
        """A tensor the architecture derives rather than holds (matching pursuit's `W_enc` = `W_dec.T`)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            arch = self.__dict__.get("arch")
            derived = arch.derived_tensor(self, name) if arch is not None else None
            if derived is None:
                raise
            return derived

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """sae-lens' inference initialisation: W_dec Kaiming-uniform, W_enc = W_dec.T, biases (and threshold) 0."""
        gen = torch.Generator(device=self.W_dec.device).manual_seed(seed) if seed is not None else None
        bound = math.sqrt(6.0 / self.cfg.d_in)  # kaiming_uniform_ with its defaults (fan_in = d_in)
        w = torch.rand(self.W_dec.shape, generator=gen, device=self.W_dec.device, dtype=torch.float32)
        self.W_dec.copy_((w * 2 - 1) * bound)
        if "W_enc" in self._parameters:  # (a tied SAE has none: W_dec.T, derived or not)
            self.W_enc.copy_(self.W_dec.T)
        for name in ("b_enc", "b_dec", "threshold", *self.arch.buffers(self.cfg)):
            if hasattr(self, name):
                getattr(self, name).zero_()
        self.arch.init_extra(self, gen)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of its weights (read from `W_dec`, which every architecture holds)."""
        return self.W_dec.dtype

    @property
    def device(self) -> torch.device:
        """The device its weights are on."""
        return self.W_dec.device

    def _apply(self, fn: Any, recurse: bool = True) -> SAE:
        """`nn.Module`'s casts (`to`, `bfloat16`, `half`), keeping the architecture's float32 parameters
        (a JumpReLU threshold) at least float32, with their values from before the cast (sae-lens' #728)."""
        kept = {
            n: p.detach().clone()
            for n in self.arch.float32_params(self.cfg)
            if (p := self._parameters.get(n)) is not None
        }
        super()._apply(fn, recurse)
        for name, before in kept.items():
            p = self._parameters[name]
            assert p is not None
            wide = torch.promote_types(p.dtype, torch.float32)
            if p.dtype != wide:
                p.data = before.to(device=p.device, dtype=wide)
        return self

    # ----- the two halves (dtype, device, hook_names: CoderHookPoints') ---------------
    def _encode(self, x: Tensor, hooked: bool = True) -> tuple[Tensor, dict[str, Any]]:
        """Feature activations and what decode needs to undo the input's normalisation / reshape.
        `hooked=False` runs past the hook points (the clean pass of the error term)."""
        hp = hooks_of(self) if hooked else NO_HOOKS
        state: dict[str, Any] = {}
        x = x.to(self.dtype)
        if self.cfg.reshape_activations == "hook_z":
            state["d_head"] = x.shape[-1]
            x = x.flatten(-2)  # [..., n_heads, d_head] -> [..., n_heads * d_head]
        x = hp["hook_sae_input"](x)
        norm = self.cfg.normalize_activations
        if norm == "constant_norm_rescale":
            state["coeff"] = (self.cfg.d_in**0.5) / x.norm(dim=-1, keepdim=True)
            x = x * state["coeff"]
        elif norm == "layer_norm":
            state["mu"] = x.mean(dim=-1, keepdim=True)
            x = x - state["mu"]
            state["std"] = x.std(dim=-1, keepdim=True)
            x = x / (state["std"] + 1e-5)
        elif norm == "constant_scalar_rescale":  # a temporal SAE's fixed factor (its cfg's)
            x = x * cast(float, self.cfg.activation_normalization_factor)
        # "expected_average_only_in": identity here, as in sae-lens' inference SAE (its factor is
        # folded into the weights when a release is loaded, or the file says "none").
        acts = self.arch.encode_with_state(self, x, hp, state)
        return hp["hook_sae_acts_post"](acts), state

    def _decode(
        self, feature_acts: Tensor, state: dict[str, Any], hooked: bool = True, forward: bool = False
    ) -> Tensor:
        """The reconstruction, normalisation and reshape undone; `forward`: forward's (the architecture's
        `forward_decode`, e.g. a temporal SAE adds its predicted code), else `decode`'s."""
        hp = hooks_of(self) if hooked else NO_HOOKS
        if forward:
            out = self.arch.forward_decode(self, feature_acts, state, hp)
        else:
            out = hp["hook_sae_recons"](self.arch.decode(self, feature_acts))
        if "coeff" in state:
            out = out / state["coeff"]
        elif "mu" in state:
            out = out * state["std"] + state["mu"]
        elif self.cfg.normalize_activations == "constant_scalar_rescale":
            out = out / cast(float, self.cfg.activation_normalization_factor)
        if "d_head" in state:
            out = out.unflatten(-1, (-1, state["d_head"]))
        return out

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """Feature activations of `x` (cast to the SAE's dtype). Example: `sae.encode(resid)[..., 42]`."""
        acts, self._last_state = self._encode(x)
        return acts

    def decode(self, feature_acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        """The reconstruction of feature activations. Example: `sae.decode(sae.encode(x))`.
        (With a normalisation or the hook_z reshape it undoes those of the last `encode`, as sae-lens.)"""
        state, self._last_state = self._last_state, {}
        return self._decode(feature_acts, state)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        """decode(encode(x)) through `hook_sae_output` (a temporal SAE adds its predicted code and skips
        `hook_sae_recons`, as sae-lens'; the error term is the splice's job: see
        `model.add_sae(sae, use_error_term=True)`). Example: `x_hat = sae(x)`."""
        acts, state = self._encode(x)
        return self.hook_sae_output(self._decode(acts, state, forward=True))

    # ----- splicing (the protocol of interp_gpt.model.splicing) -------------------------
    def splice_hooks(self, model: Any, arg: str = "sae") -> tuple[str, str]:
        """(read, write): the SAE reads and replaces `cfg.metadata.hook_name`, once it fits `model`
        (refused by name otherwise: see `check_sae_fits`)."""
        name = fit_hook(model, self, arg)
        return name, name

    def splice_forward(self, x: Tensor, hooked: bool = True) -> Tensor:
        """forward's reconstruction, not through `hook_sae_output` (the splice runs that, after the error term);
        `hooked=False` past every hook point: the clean pass of the error term."""
        return self._decode(*self._encode(x, hooked=hooked), hooked=hooked, forward=True)

    @torch.no_grad()
    def encode_and_reconstruct(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(feature activations, forward's reconstruction) of `x` in one pass, past the hook points (what an
        evaluation reads; a temporal SAE's reconstruction includes its predicted code, as its forward's).

        Example:
            >>> feats, x_hat = sae.encode_and_reconstruct(torch.randn(2, 5, sae.cfg.d_in))
            >>> feats.shape[:2], x_hat.shape[:2]
            (torch.Size([2, 5]), torch.Size([2, 5]))
        """
        acts, state = self._encode(x, hooked=False)
        return acts, self._decode(acts, state, hooked=False, forward=True)

    # (reset_hooks: CoderHookPoints')

    # ----- loading and saving ---------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        release: str | Path,
        sae_id: str | None = None,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
        *,
        model_name: str | None = None,
    ) -> SAE:
        """Load an SAE saved in sae-lens' format: a folder with cfg.json and sae_weights.safetensors
        (`release` the folder, or a folder and `sae_id` a subfolder), or a release in the local
        Hugging Face cache (`release` a repo id "owner/name" or a known sae-lens release name, `sae_id`
        the SAE's folder in it). Offline: nothing is downloaded. `model_name` (e.g. "my-gpt2", a local
        copy of GPT-2) records the model it is for in its cfg.metadata.model_name, in place of the file's
        (None: the file's own).

        Example:
            >>> sae = SAE.from_pretrained("tiny-gpt2-res")      # the shipped SAE; or a folder

        GPT-2 small's, once in the Hugging Face cache: `SAE.from_pretrained("gpt2-small-res-jb",
        "blocks.8.hook_resid_pre")`.
        """
        if not isinstance(release, (str, Path)):
            raise TypeError(f"release: expected a folder or a release id (str), got {type(release).__name__}")
        if sae_id is not None and not isinstance(sae_id, str):
            raise TypeError(f"sae_id: expected a str (the SAE's folder in the release), got {type(sae_id).__name__}")
        folder = Path(release).expanduser()
        if folder.is_dir():
            folder = folder / sae_id if sae_id else folder
        else:
            folder = find_release(str(release), sae_id)
        cfg, state = read_sae_folder(folder, device=device)
        set_model_name(cfg.metadata, model_name, "SAE.from_pretrained")
        kept = {k: state.pop(k) for k in cfg.architecture_module.float32_params(cfg) if k in state}
        state, name = cast_state(state, dtype)
        if name is not None:
            cfg.dtype = name
        wide = torch.promote_types(cfg.torch_dtype, torch.float32)  # (a JumpReLU threshold: never below float32)
        state.update({k: v.to(wide) for k, v in kept.items()})
        return load_built(cls, cfg, state, device)  # type: ignore[no-any-return]

    load_from_disk = from_pretrained  # sae-lens' name for a local folder

    def save_model(self, path: str | Path) -> tuple[Path, Path]:
        """Write `cfg.json` and `sae_weights.safetensors` into the folder `path` (sae-lens' name and
        format; it loads with sae-lens' `SAE.load_from_disk`). Each file is written whole or not at all.
        Returns (weights path, cfg path), as sae-lens does.

        A trained SAE is written in sae-lens' inference form (its `TrainingSAE.save_inference_model`):
        a TopK SAE with `rescale_acts_by_decoder_norm` has the decoder norms folded into the encoder
        (same outputs, unit-norm decoder rows), and a BatchTopK or Matryoshka BatchTopK SAE is written as
        the JumpReLU SAE whose threshold is its learned `topk_threshold` (it loads as a "jumprelu" SAE).

        Example:
            >>> sae.save_model("saes/resid1")
        """
        if not isinstance(path, (str, Path)):
            raise TypeError(f"path: expected a folder path, got {type(path).__name__}")
        self.cfg.dtype = dtype_name(self.dtype)
        self.cfg.device = str(self.device)
        state = {k: v for k, v in self.state_dict().items() if k in expected_shapes(self.cfg)}
        changes, state = self.arch.inference_state(self, state)
        cfg = dataclasses.replace(self.cfg, **changes) if changes else self.cfg
        return write_sae_folder(Path(path), cfg, state)

    def extra_repr(self) -> str:
        """Its shape and hook, in `repr`."""
        c = self.cfg
        return f"{c.architecture}, d_in={c.d_in}, d_sae={c.d_sae}{self.arch.extra_repr(c)}, hook_name={c.hook_name!r}"
