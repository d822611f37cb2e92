"""Training the shipped tiny pair: a byte-level BPE tokenizer, a tiny Qwen3 target, an Eagle3
drafter and a small Qwen3 draft LM distilled from it, on local data only. Entry point:
`python -m lightspec_jax.train.cli`."""

from .corpus import Corpus, CorpusConfig, build_corpus
from .data import TokenStream
from .draft_lm import (DraftLMShape, DraftLMTrainConfig, distill_labels, draft_lm_loss,
                       train_draft_lm)
from .eagle3 import (DraftVocab, Eagle3TrainConfig, build_sequences, drafter_loss,
                     generate_greedy, new_drafter, select_draft_vocab, train_eagle3)
from .loop import OptimConfig, TrainLog
from .quality import distinct_ngram_ratio, evaluate_pair
from .target import TargetTrainConfig, next_token_loss, tiny_target_config, train_target
from .tokenizer import EOS_TOKEN, train_tokenizer

__all__ = ["Corpus", "CorpusConfig", "DraftLMShape", "DraftLMTrainConfig", "DraftVocab",
           "EOS_TOKEN", "Eagle3TrainConfig", "OptimConfig", "TargetTrainConfig", "TokenStream",
           "TrainLog", "build_corpus", "build_sequences", "distill_labels",
           "distinct_ngram_ratio", "draft_lm_loss", "drafter_loss", "evaluate_pair",
           "generate_greedy", "new_drafter", "next_token_loss", "select_draft_vocab",
           "tiny_target_config", "train_draft_lm", "train_eagle3", "train_target",
           "train_tokenizer"]
