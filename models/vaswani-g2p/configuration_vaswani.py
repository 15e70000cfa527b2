"""VaswaniConfig: the one source of truth for the sizes, rates and switches of the model."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

ACTIVATIONS = ("relu", "gelu", "gelu_new", "silu", "swish")
POSITION_ENCODINGS = ("sinusoidal_interleaved", "sinusoidal_split")
# Self-attention patterns, per stack (cross-attention is always full): attention_patterns_vaswani.py.
ATTENTION_PATTERNS = ("full", "local", "block_sparse", "linear")

# Named sizes, one call away: `VaswaniConfig.from_preset("big", vocab_size=32000)`.
PRESETS = {
    # The paper's base model (Table 3): these are also the field defaults.
    "base": {},
    # The paper's big model: d_model 1024, 16 heads, FFN 4096, dropout 0.3.
    "big": dict(
        d_model=1024,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
        dropout=0.3,
    ),
    # A grapheme-to-phoneme size (3+3 layers of 256), which trains on a laptop CPU.
    "g2p": dict(
        vocab_size=128,
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        max_position_embeddings=64,
    ),
    # The default G2P model of scripts/train.py and scripts/main_job.sh: the g2p layers at half the width, pre-LN
    # (it learns faster per update at the same cost), no dropout (a run within a short CPU budget sees too few epochs
    # to overfit), label smoothing 0.1.
    "g2p-small": dict(
        vocab_size=128,
        d_model=128,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=512,
        decoder_ffn_dim=512,
        max_position_embeddings=64,
        normalize_before=True,
        dropout=0.0,
        label_smoothing=0.1,
    ),
    # For tests: runs in milliseconds.
    "tiny": dict(
        vocab_size=100,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
    ),
}

# Paragraph-level G2P (lines of 32-128 words, sources up to ~1,300 tokens): the g2p-small layers, so a word-level
# model warm-starts it; max_position_embeddings says the lengths it is meant for (exports size tables from it).
PRESETS["g2p-paragraph"] = {**PRESETS["g2p-small"], "max_position_embeddings": 2048}


@strict
class VaswaniConfig(PreTrainedConfig):
    r"""
    Configuration of a [`VaswaniModel`] / [`VaswaniForConditionalGeneration`]. Defaults are the base model of
    "Attention Is All You Need": d_model 512, 6+6 layers, 8 heads, FFN 2048, dropout 0.1, ReLU, post-LN, scaled
    embeddings shared by encoder, decoder and output projection, and the paper's interleaved sinusoids.

    Field names follow transformers' encoder-decoders (Marian, BART). The ones of our own:
    - `normalize_before`: pre-LN (norm at the start of each sub-layer, and a final norm per stack) instead of the
      paper's post-LN.
    - `position_encoding`: `"sinusoidal_interleaved"` (the paper: sin and cos alternate) or `"sinusoidal_split"`
      (tensor2tensor and Marian: all sines, then all cosines). Computed, never learned or saved; no length cap.
    - `final_logits_bias`: a fixed bias added to the logits (Marian checkpoints carry one).
    - `label_smoothing`: applied by the model's loss when `labels` are given.
    - `init_std`: standard deviation of the embedding init; `None` means d_model ** -0.5.
    - `encoder_attention_pattern`, `decoder_attention_pattern`: the self-attention of each stack, one of
      `"full"` (the paper), `"local"` (an encoder query sees the keys within `attention_window` positions on either
      side; a decoder query the last `attention_window` positions, itself included), `"block_sparse"` (a block of
      `sparse_block_size` queries sees its own and the neighbouring blocks, and the first `sparse_global_tokens`
      positions see all and are seen by all; causal in the decoder) or `"linear"` (phi(x) = elu(x) + 1 feature
      maps, Katharopoulos et al. 2020; causal by prefix sums in the decoder). Cross-attention is full unless
      `cross_attention_words` is set.
    - `word_boundary_token_id`, `word_position_stride`: when the id is set, both stacks place each token at
      `word_position_stride` x (its word's index) + (its offset in the word) instead of its index in the sequence,
      where every `word_boundary_token_id` token opens a word (`positions_vaswani.word_position_ids`): the n-th
      word of a source and of its target then share a stretch of positions at any line length.
      `word_position_shift` (training only): each training example's words are moved by the same random number of
      words, 0 .. word_position_shift, in both stacks, so that positions far into long lines are trained too.
      `word_position_period`: word indices count modulo this many words (positions modulo period x stride), so that
      the positions of a line of any length are those of the first `word_position_period` words; train with
      `word_position_shift` = period - 1 to see every phase.
    - `cross_attention_words`: when set (with `word_boundary_token_id`), a target token of word i attends only to the
      source words i - n .. i + n (a window of words; a target word past the source's last reads the last one):
      cross-attention that moves along the source with the output, at any line length.

    Presets: `VaswaniConfig.from_preset("base" | "big" | "g2p" | "g2p-small" | "g2p-paragraph" | "tiny", **overrides)`.
    """

    model_type = "vaswani"
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    normalize_before: bool = False
    layer_norm_eps: float = 1e-5
    scale_embedding: bool = True
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 1024
    position_encoding: str = "sinusoidal_interleaved"
    final_logits_bias: bool = False
    label_smoothing: float | int = 0.0
    init_std: float | None = None
    encoder_attention_pattern: str = "full"
    decoder_attention_pattern: str = "full"
    attention_window: int = 128
    sparse_block_size: int = 64
    sparse_global_tokens: int = 0
    word_boundary_token_id: int | None = None
    word_position_stride: int = 64
    word_position_shift: int = 0
    word_position_period: int | None = None
    cross_attention_words: int | None = None
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | None = 3
    decoder_start_token_id: int | None = 2
    use_cache: bool = True
    is_encoder_decoder: bool = True

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VaswaniConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def __post_init__(self, **kwargs):
        # Checked here, before the base class, so that a bad config raises a plain ValueError at once.
        self._check_architecture()
        self._check_token_ids()
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        # strict dataclasses run every `validate_*` again on save (wrapping our ValueError).
        self._check_architecture()

    def validate_token_ids(self):
        self._check_token_ids()

    def _check_architecture(self):
        """Raises ValueError naming the field and the fix."""
        for name in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                     "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if self.d_model % heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by {side}_attention_heads={heads}; "
                    f"choose a head count that divides d_model"
                )
        if self.position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"position_encoding={self.position_encoding!r} is unknown; choose one of {POSITION_ENCODINGS}"
            )
        if self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} is odd; sinusoidal positions pair sin and cos, use an even d_model")
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(
                f"activation_function={self.activation_function!r} is unknown; choose one of {ACTIVATIONS}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name}={value} is outside [0, 1); use a probability such as 0.1")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps={self.layer_norm_eps} must be positive, e.g. 1e-5")
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"init_std={self.init_std} must be positive, or None for d_model ** -0.5")
        for side in ("encoder", "decoder"):
            pattern = getattr(self, f"{side}_attention_pattern")
            if pattern not in ATTENTION_PATTERNS:
                raise ValueError(f"{side}_attention_pattern={pattern!r} is unknown; choose one of {ATTENTION_PATTERNS}")
        for name in ("attention_window", "sparse_block_size", "word_position_stride"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer (a number of positions)")
        if self.word_position_shift < 0:
            raise ValueError(f"word_position_shift={self.word_position_shift} must be 0 or more (a number of words)")
        for name in ("word_position_period", "cross_attention_words"):
            value = getattr(self, name)
            if value is None:
                continue
            least = 1 if name == "word_position_period" else 0
            if value < least:
                raise ValueError(f"{name}={value} must be a number of words ({least} or more), or None")
            if self.word_boundary_token_id is None:
                raise ValueError(f"{name}={value} counts words, which word_boundary_token_id marks: set it to the "
                                 f"boundary token's id (vaswani-train --word_positions), or {name}=None")
        if self.sparse_global_tokens < 0:
            raise ValueError(f"sparse_global_tokens={self.sparse_global_tokens} must be 0 or more (a number of "
                             f"positions at the start)")

    def _check_token_ids(self):
        # The base class only warns for ids outside the vocabulary; an embedding lookup would fail much later.
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                     "word_boundary_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"{name}={value} is outside the vocabulary [0, {self.vocab_size}); "
                    f"set it to an id below vocab_size or enlarge vocab_size"
                )


__all__ = ["VaswaniConfig", "PRESETS", "ATTENTION_PATTERNS"]
