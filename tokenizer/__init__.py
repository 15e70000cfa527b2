"""`vaswani.tokenizer`: the shared SentencePiece tokenizer and its training."""

from .tokenization_vaswani import VaswaniTokenizer, spell_out
from .train_vaswani_tokenizer import MODEL_TYPES, TokenizerTrainingError, read_corpus, train_tokenizer


__all__ = ["MODEL_TYPES", "TokenizerTrainingError", "VaswaniTokenizer", "read_corpus", "spell_out", "train_tokenizer"]
