"""Training the shipped tiny pair: a byte-level BPE tokenizer, a tiny Qwen3 target and an Eagle3
drafter distilled from it, on local data only. Entry point: `python -m lightspec_jax.train.cli`."""

from .corpus import Corpus, CorpusConfig, build_corpus
from .data import TokenStream
from .eagle3 import (DraftVocab, Eagle3TrainConfig, build_sequences, drafter_loss,
                     generate_greedy, new_drafter, select_draft_vocab, train_eagle3)
from .loop import OptimConfig, TrainLog
from .quality import distinct_ngram_ratio, evaluate_pair
from .target import TargetTrainConfig, next_token_loss, tiny_target_config, train_target
from .tokenizer import EOS_TOKEN, train_tokenizer

__all__ = ["Corpus", "CorpusConfig", "DraftVocab", "EOS_TOKEN", "Eagle3TrainConfig",
           "OptimConfig", "TargetTrainConfig", "TokenStream", "TrainLog", "build_corpus",
           "build_sequences", "distinct_ngram_ratio", "drafter_loss", "evaluate_pair",
           "generate_greedy", "new_drafter", "next_token_loss", "select_draft_vocab",
           "tiny_target_config", "train_eagle3", "train_target", "train_tokenizer"]
