"""SentencePiece tokenizer for vaswani: one piece model shared by source and target.

This file travels into checkpoints as remote code (copied flat next to config.json), so it
imports nothing of ours: only the standard library, sentencepiece, transformers and, for the
optional fast tokenizer, tokenizers and protobuf.
"""

import os
import re

from transformers.tokenization_utils_sentencepiece import SentencePieceBackend


# Fixed ids: VaswaniConfig's pad/bos/eos defaults and the embedding rows rely on them.
SPECIAL_TOKENS = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3}
SPIECE_UNDERLINE = "\u2581"

# SentencePiece ModelProto.trainer_spec.model_type values
_UNIGRAM, _BPE, _WORD, _CHAR = 1, 2, 3, 4


def spell_out(text: str) -> str:
    """"PHOENIX" -> "P H O E N I X": one whitespace-separated symbol per character.

    With a `word` piece model every character becomes one piece; whitespace in the input is
    dropped (a G2P source is a single word).
    """
    return " ".join(ch for ch in text if not ch.isspace())


class VaswaniTokenizer(SentencePieceBackend):
    """A SentencePiece model shared by source and target, with fixed special ids.

    `<pad>`=0, `<unk>`=1, `<s>`=2, `</s>`=3. Every encoded sequence ends with `</s>` (no `<s>`:
    the decoder start token is the model's business). `tok(src, text_target=tgt)` returns
    `labels`; padding is on the right; truncation keeps the final `</s>`.

    `spell_source=True` (grapheme-to-phoneme) spells source texts out into space-separated
    characters before encoding (see `spell_out`); targets are encoded as written.
    """

    vocab_files_names = {"vocab_file": "spm.model"}
    model_input_names = ["input_ids", "attention_mask"]
    padding_side = "right"
    truncation_side = "right"

    def __init__(
        self,
        vocab_file=None,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        spell_source=False,
        **kwargs,
    ):
        if vocab_file is None or not os.path.isfile(vocab_file):
            raise FileNotFoundError(
                f"SentencePiece model file not found: {vocab_file!r} "
                f"(expected {self.vocab_files_names['vocab_file']} in the tokenizer folder)"
            )
        self.spell_source = spell_source
        self._target_mode = False
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        kwargs["special_tokens_pattern"] = "eos"  # seq </s>, the only pattern we support
        super().__init__(
            vocab_file=vocab_file,
            pad_token=pad_token,
            unk_token=unk_token,
            bos_token=bos_token,
            eos_token=eos_token,
            spell_source=spell_source,
            **kwargs,
        )
        for piece, expected in SPECIAL_TOKENS.items():
            found = self.sp_model.piece_to_id(piece)
            if found != expected or self.sp_model.id_to_piece(expected) != piece:
                raise ValueError(
                    f"{vocab_file}: {piece!r} must have id {expected} (got {found}); train the piece model "
                    f"with vaswani.tokenizer.train_tokenizer, which fixes pad=0 unk=1 bos=2 eos=3"
                )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        # transformers turns a missing vocab file into a vague "Unable to load vocabulary" OSError
        folder, name = os.fspath(pretrained_model_name_or_path), cls.vocab_files_names["vocab_file"]
        if os.path.isdir(folder) and not os.path.isfile(os.path.join(folder, name)):
            raise FileNotFoundError(f"{folder} has no {name}: not a saved VaswaniTokenizer (train one with "
                                    f"vaswani-train-tokenizer or vaswani.tokenizer.train_tokenizer)")
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    # `__call__(text_target=...)` switches modes around encoding the targets.
    def _switch_to_input_mode(self):
        self._target_mode = False

    def _switch_to_target_mode(self):
        self._target_mode = True

    def prepare_for_tokenization(self, text, is_split_into_words=False, **kwargs):
        if self.spell_source and not self._target_mode:
            text = spell_out(text)
        return text, kwargs

    def _tokenize(self, text, **kwargs):
        return self.sp_model.encode(text, out_type=str)

    def convert_tokens_to_string(self, tokens):
        # sentencepiece decodes each run of ordinary pieces (so byte-fallback pieces such as
        # <0xF0> become characters again); special and added tokens are written as they are.
        parts, run = [], []
        for token in tokens:
            if token in self._added_tokens_encoder:
                parts += [self.sp_model.decode_pieces(run), token]
                run = []
            else:
                run.append(token)
        parts.append(self.sp_model.decode_pieces(run))
        return "".join(parts)

    def to_fast(self):
        """A `tokenizers`-backed copy (unigram and bpe piece models trained with "identity").

        Same ids as this tokenizer for bpe; for unigram except where two segmentations score
        exactly the same (see `_build_fast_tokenizer`). This class stays the reference.
        Needs `tokenizers` and `protobuf`. Raises `ValueError` for `word`/`char` piece models.
        """
        from transformers import PreTrainedTokenizerFast

        tokenizer_object = _build_fast_tokenizer(self.vocab_file, self.eos_token, self.eos_token_id)
        return PreTrainedTokenizerFast(
            tokenizer_object=tokenizer_object,
            pad_token=self.pad_token,
            unk_token=self.unk_token,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            padding_side="right",
            truncation_side="right",
            model_input_names=list(self.model_input_names),
            clean_up_tokenization_spaces=False,
        )


def _build_fast_tokenizer(vocab_file, eos_token, eos_token_id):
    """The piece model as a `tokenizers.Tokenizer` that encodes like sentencepiece.

    Reads the model proto (needs protobuf) and follows its normalizer spec: no character map
    (only the "identity" rule is supported), spaces escaped to "▁", the dummy "▁" prefix;
    user-defined symbols are kept whole; byte and control pieces kept away from text.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    with open(vocab_file, "rb") as f:
        proto.ParseFromString(f.read())
    trainer, spec = proto.trainer_spec, proto.normalizer_spec
    if trainer.model_type not in (_UNIGRAM, _BPE):
        raise ValueError("a fast tokenizer is only built for unigram and bpe piece models (tokenizers has no "
                         "equivalent of sentencepiece's char and word models)")
    if spec.precompiled_charsmap or spec.remove_extra_whitespaces or not spec.add_dummy_prefix:
        raise ValueError(f"a fast tokenizer needs the piece model trained with normalization='identity' "
                         f"(this one uses {spec.name!r})")

    # piece types (sentencepiece_model.proto): 1 normal, 2 unknown, 3 control, 4 user defined, 6 byte
    normal, user_defined = 1, 4
    symbols = [p.piece for p in proto.pieces if p.type == user_defined]
    if trainer.model_type == _UNIGRAM:
        # Control and byte pieces have score 0 (the best) in the proto; sentencepiece never
        # matches them against text, tokenizers would: push them out of reach. Known residue:
        # literal text "<0x41>" whose "<" and ">" are out of vocabulary (each costs an <unk>
        # penalty) still becomes the byte piece. Segmentations of exactly equal score are
        # broken differently (float32 sums in sentencepiece, float64 here).
        vocab = [(p.piece, p.score if p.type in (normal, user_defined) else -1e9) for p in proto.pieces]
        model = models.Unigram(vocab, unk_id=trainer.unk_id, byte_fallback=trainer.byte_fallback)
    else:
        # sentencepiece BPE merges the adjacent pair whose union is the highest-scoring piece:
        # rank every split of each normal piece by that piece's score.
        ids = {p.piece: i for i, p in enumerate(proto.pieces)}
        mergeable = {p.piece for p in proto.pieces if p.type in (normal, user_defined)}
        ranked = sorted(
            (-p.score, i, piece[:k], piece[k:])
            for i, p in enumerate(proto.pieces) if p.type == normal
            for piece in [p.piece] for k in range(1, len(piece))
            if piece[:k] in mergeable and piece[k:] in mergeable
        )
        model = models.BPE(ids, [(left, right) for _, _, left, right in ranked], unk_token=trainer.unk_piece,
                           fuse_unk=True, byte_fallback=trainer.byte_fallback,
                           # a user-defined symbol, isolated below, is one piece that no merge builds
                           ignore_merges=bool(symbols))
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Replace(" ", SPIECE_UNDERLINE),
                                                 normalizers.Prepend(SPIECE_UNDERLINE)])
    if symbols:
        pattern = "|".join(re.escape(s) for s in sorted(symbols, key=len, reverse=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPIECE_UNDERLINE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos_token}", pair=f"$A {eos_token} $B {eos_token}", special_tokens=[(eos_token, eos_token_id)]
    )
    return tokenizer


# save_pretrained then copies this file next to the tokenizer files and writes `auto_map`, so
# AutoTokenizer.from_pretrained(folder, trust_remote_code=True) works without vaswani installed.
VaswaniTokenizer.register_for_auto_class("AutoTokenizer")
