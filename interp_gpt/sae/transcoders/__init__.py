"""Transcoders: per-layer (`Transcoder`: reads an MLP's input, predicts its output) and cross-layer
(`CrossLayerTranscoder`: layer l's features write into every MLP output from l on).

    transcoder.py  Transcoder, load_transcoders / save_transcoders, check_transcoder_fits
    clt.py         CrossLayerTranscoder, CLTConfig, load_clt / save_clt
    config.py      TranscoderConfig: every field checked once
    io.py          sae-lens' folders and circuit-tracer's transcoder sets, read and written whole
    processing.py  a transcoder made for raw weights used on processed ones (and back): converted exactly
    evaluation.py  evaluate_transcoders (the SAE's metrics per output layer)
    splice.py      a CLT spliced into a model as one unit
"""

from .clt import CLTConfig, CrossLayerTranscoder, load_clt, save_clt
from .config import TranscoderConfig
from .evaluation import evaluate_transcoders
from .processing import model_processing
from .transcoder import Transcoder, check_transcoder_fits, load_transcoders, save_transcoders

__all__ = [
    "Transcoder", "TranscoderConfig", "load_transcoders", "save_transcoders", "check_transcoder_fits",
    "model_processing", "CrossLayerTranscoder", "CLTConfig", "load_clt", "save_clt", "evaluate_transcoders",
]  # fmt: skip
