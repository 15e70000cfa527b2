"""vaswani: the encoder-decoder Transformer of "Attention Is All You Need" as a Hugging Face model package.

`import vaswani` registers the config, the models (and the tokenizer) with transformers' Auto classes, and marks
them for remote code, so that `save_pretrained` writes the code beside the weights.
"""

from importlib.metadata import PackageNotFoundError, version

from . import _import_noise  # noqa: F401  before transformers, which imports torchao where it is installed
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer

from .configuration_vaswani import PRESETS, VaswaniConfig
from .modeling_vaswani import (
    VaswaniDecoder,
    VaswaniEncoder,
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    shift_tokens_right,
)
from .tokenizer import VaswaniTokenizer

AutoConfig.register("vaswani", VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
AutoTokenizer.register(VaswaniConfig, tokenizer_class=VaswaniTokenizer, exist_ok=True)

# Hub remote code: save_pretrained copies the defining files and writes `auto_map` into config.json.
VaswaniConfig.register_for_auto_class()
VaswaniModel.register_for_auto_class("AutoModel")
VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

try:  # the installed distribution's version (pyproject.toml), so the two cannot disagree
    __version__ = version("vaswani")
except PackageNotFoundError:  # imported without being installed (e.g. the folders put on sys.path by hand)
    __version__ = "0+unknown"
__all__ = [
    "PRESETS",
    "VaswaniConfig",
    "VaswaniDecoder",
    "VaswaniEncoder",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTokenizer",
    "shift_tokens_right",
]
