"""cactus-gguf: Cactus speculative decoding (Hao & Mou, ICLR 2026, arXiv:2604.04987) over llama.cpp."""
from .decoding import (DecoderConfig, GenerationResult, GenerationStats, SpeculativeDecoder,
                       VocabMismatchError)
from .native import AcceptanceParams, SamplingParams

__all__ = ["SpeculativeDecoder", "DecoderConfig", "GenerationResult", "GenerationStats",
           "VocabMismatchError", "AcceptanceParams", "SamplingParams"]
