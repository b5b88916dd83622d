"""XCodec2 (xcodec2 0.1.5, HKUSTAudio/xcodec2; Llasa) decoder reference.

The same decoder as NeuCodec at hop 320 / 16 kHz. The ground truth is the
xcodec2 package's own ``xcodec2.vq.codec_decoder_vocos.CodecDecoderVocos``
with ``XCodec2Model.decode_code`` run on a holder module with the released
key names (``generator.*``, ``fc_post_a.*``); ``XCodec2Model(config)``
cannot be built offline (it downloads w2v-bert-2.0). The holder, the
perturbation, the torchtune shim and NeuTTS' windowed streaming are shared
with :mod:`references.neucodec`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from . import neucodec as _nc

#: HKUSTAudio/xcodec2: 50 Hz FSQ codes (65536) -> 16 kHz, hop 320, n_fft 1280
XCODEC2_16KHZ = {"hidden_dim": 1024, "depth": 12, "heads": 16, "pos_meb_dim": 64,
                 "hop_length": 320, "vq_dim": 2048, "sample_rate": 16000}
XCODEC2_TINY = {"hidden_dim": 64, "depth": 2, "heads": 4, "pos_meb_dim": 16,
                "hop_length": 320, "vq_dim": 32, "sample_rate": 16000}
CONFIGS: dict[str, dict[str, Any]] = {"16khz": XCODEC2_16KHZ, "tiny": XCODEC2_TINY}

random_codes = _nc.random_codes
reference_decode = _nc.reference_decode
reference_windowed_decode = _nc.reference_windowed_decode
fsq_vectors = _nc.fsq_vectors


def build_reference(config: Mapping[str, Any], seed: int):
    """XCodec2's decoder in eval mode with seeded random weights perturbed away from their init.

    ``generator`` is ``xcodec2.vq.codec_decoder_vocos.CodecDecoderVocos``,
    ``fc_post_a`` a ``Linear(vq_dim, hidden_dim)``; ``decode_code`` is
    ``xcodec2.modeling_xcodec2.XCodec2Model.decode_code`` itself.
    """
    import torch

    _nc.import_torchtune_rope()
    from xcodec2.modeling_xcodec2 import XCodec2Model
    from xcodec2.vq.codec_decoder_vocos import CodecDecoderVocos

    torch.manual_seed(seed)
    model = _nc._holder_class(XCodec2Model.decode_code, "XCodec2Decoder")()
    model.sample_rate = config["sample_rate"]
    model.hop_length = config["hop_length"]
    model.generator = CodecDecoderVocos(hidden_dim=config["hidden_dim"], depth=config["depth"],
                                        heads=config["heads"], pos_meb_dim=config["pos_meb_dim"],
                                        hop_length=config["hop_length"], vq_dim=config["vq_dim"])
    model.fc_post_a = torch.nn.Linear(config["vq_dim"], config["hidden_dim"])
    _nc.perturb_vocos_decoder_(model, seed + 1)
    model.eval()
    return model


def save_released_layout(model, folder, decoys: bool = True) -> Path:
    """Write ``model.safetensors`` + ``config.json`` as HKUSTAudio/xcodec2 has them; returns the folder.

    ``XCodec2Model.from_pretrained`` reads these: the state dict keys are the
    module paths (``generator.*``, ``fc_post_a.*``; the real file also holds
    ``semantic_model.*``, ``SemanticEncoder_module.*``, ``CodecEnc.*`` and
    ``fc_prior.*``, of which ``decoys`` adds ``fc_prior``); config.json is
    xcodec2's ``BigCodecConfig`` (``model_type`` "xcodec",
    ``codec_decoder_hidden_size``), as ``PretrainedConfig.to_dict`` writes it.
    """
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if decoys:
        vq = model.fc_post_a.in_features
        g = torch.Generator().manual_seed(7)
        sd["fc_prior.weight"] = torch.randn(vq, vq, generator=g) * 0.02
        sd["fc_prior.bias"] = torch.zeros(vq)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    hid = model.fc_post_a.out_features
    cfg = {"architectures": ["XCodec2Model"], "model_type": "xcodec",
           "semantic_hidden_size": 1024, "codec_encoder_hidden_size": 1024,
           "codec_decoder_hidden_size": hid, "use_vocos": True, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder
