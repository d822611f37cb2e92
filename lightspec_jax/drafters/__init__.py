"""Drafters for speculative decoding, behind one interface (`Drafter`)."""

from .base import Drafter, DraftRows, Proposal
from .draft_lm import DraftLMDrafter

__all__ = ["Drafter", "DraftLMDrafter", "DraftRows", "Proposal"]
