"""Training sparse autoencoders: `SAETrainer`, the evaluation metrics, and the command line.

    python -m interp_gpt.sae.training --model tiny-gpt2 --hook blocks.1.hook_resid_pre \\
        --architecture topk --d-sae 1024 --k 32 --n-tokens 4000000 --out saes/resid1

The losses (sae-lens 6's) and the rule for NaN are in `trainer.py`'s docstring.

Metrics (`evaluate_sae`, and the training log), with sae-lens' definitions:
  * L0: mean number of active features per token;
  * MSE: mean over tokens of the summed squared error;
  * explained variance: `1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2`;
  * CE loss recovered: `(CE_zero_ablation - CE_spliced) / (CE_zero_ablation - CE_clean)`, where the
    hook's activation is replaced by zeros (zero ablation) or by the SAE's reconstruction (spliced).

The code lives in modules by job; this module keeps every name importable from one place:
  * `data.py`: split_corpus, token_windows, activation_batches, shipped_sae / _transcoders / _clt;
  * `evaluation.py`: explained_variance, evaluate_sae;
  * `trainer.py`: SAETrainingConfig, SAETrainer (the losses), NonFiniteTrainingError;
  * `multi.py`: MultiSAETrainer, train_saes (many SAEs from one forward), MultiTrainingError, sae_name;
  * `train_command.py`: the command's options and run (add_arguments, run, run_command, main);
  * transcoders: `transcoder_trainer.py` (TranscoderTrainingConfig, TranscoderTrainer),
    `transcoder_evaluation.py` (evaluate_transcoders), `train_transcoder_command.py` (train-transcoder).
"""

from __future__ import annotations

from ..saes.evaluation import evaluate_sae, explained_variance
from ..transcoders.evaluation import evaluate_transcoders
from . import data
from .data import *  # noqa: F403 (every name of data.py, listed once there)
from .multi import MultiSAETrainer, MultiTrainingError, sae_name, train_saes
from .sae_command import add_arguments as add_arguments
from .sae_command import main
from .sae_command import run as run
from .sae_command import run_command as run_command
from .sae_trainer import NonFiniteTrainingError, SAETrainer, SAETrainingConfig
from .transcoder_trainer import TranscoderTrainer, TranscoderTrainingConfig

__all__ = [
    "SAETrainingConfig",
    "SAETrainer",
    "NonFiniteTrainingError",
    "MultiSAETrainer",
    "MultiTrainingError",
    "train_saes",
    "sae_name",
    "TranscoderTrainingConfig",
    "TranscoderTrainer",
    "evaluate_transcoders",
    "evaluate_sae",
    "explained_variance",
    *data.__all__,
    "main",
]
