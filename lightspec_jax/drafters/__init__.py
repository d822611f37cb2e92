"""Drafters for speculative decoding, behind one interface (`Drafter`)."""

from .base import Drafter, DraftRows, Proposal
from .dflash import DFlashDrafter
from .draft_lm import DraftLMDrafter
from .dspark import DSparkDrafter
from .eagle3 import Eagle3Drafter
from .ngram import NgramDrafter

__all__ = ["DFlashDrafter", "Drafter", "DraftLMDrafter", "DraftRows", "DSparkDrafter",
           "Eagle3Drafter", "NgramDrafter", "Proposal"]
